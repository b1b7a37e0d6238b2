//! [`Transmit`], the one kind of output every comm-link state machine produces.

use bytes::Bytes;

/// One write the driver must perform, then flush.
///
/// Each `Transmit` is exactly one of the reference's `send_data` calls followed by its flush:
/// one caps block, one rank message, one bootstrap block (or gathered array), or one all-reduce
/// payload. Drivers must not merge two transmits into one transport write when the peer may be
/// a 7.0.0/8.0.0 RDMA receiver (PROTOCOL.md §10.3), and must flush after each one (Apple RDMA
/// posts the pending frame on flush, §10.4).
///
/// `data` may be empty (a bootstrap exchange with 0 bytes per rank): the write is then a no-op,
/// but the flush is still what the reference does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The connection to write to: `None` for the single connection the machine drives (a
    /// handshake, the pairwise all-reduce, rank 0's connection currently being set up);
    /// `Some(rank)` for the connection to that rank (bootstrap exchange).
    pub peer: Option<u32>,
    /// The bytes to write.
    pub data: Bytes,
}
