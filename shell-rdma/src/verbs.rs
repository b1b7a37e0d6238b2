//! What the data path needs from a connected RC queue pair: the [`Verbs`] trait (real:
//! `sys::IbvQueuePair`; tests: `mock::MockVerbs`) and the constants of §10.3.

use std::time::Duration;

/// The largest SEND, the size of every receive slot and of the send staging buffer.
pub const RDMA_CHUNK: usize = 256 * 1024;
/// Receive slots, all posted before the queue pair goes to RTR.
pub const RDMA_RX_DEPTH: usize = 24;
/// Idle time after which a poller arms the CQ and sleeps.
pub const RDMA_SPIN_TIME: Duration = Duration::from_millis(100);
/// Polls between two idle checks.
pub const IDLE_CHECK_POLLS: u64 = 1024;
/// Polls between two TCP liveness checks while spinning.
pub const LIVENESS_CHECK_POLLS: u64 = 1 << 20;

/// One of the two completion queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cq {
    /// SEND completions.
    Send,
    /// Receive completions (`wr_id` = slot).
    Recv,
}

/// One work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The work request id (the slot of a receive).
    pub wr_id: u64,
    /// `Ok(byte_len)` or the failed status, as `ibv_wc_status_str` names it.
    pub status: Result<u32, String>,
}

/// Why [`Verbs::sleep`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A CQ event arrived (fetched and acknowledged): poll again.
    Event,
    /// The TCP socket hung up or failed: the peer went away.
    HangUp,
    /// The timeout passed.
    Timeout,
}

/// A verbs call that failed.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed: {source}")]
pub struct VerbsError {
    /// The libibverbs function.
    pub call: &'static str,
    /// What it reported.
    pub source: std::io::Error,
}

impl VerbsError {
    /// A failed call with the OS error it left.
    pub fn last_os(call: &'static str) -> VerbsError {
        VerbsError {
            call,
            source: std::io::Error::last_os_error(),
        }
    }

    /// A failed call that returned an errno value.
    pub fn errno(call: &'static str, errno: i32) -> VerbsError {
        VerbsError {
            call,
            source: std::io::Error::from_raw_os_error(errno),
        }
    }
}

/// The data path of one activated queue pair (receive slots already posted).
pub trait Verbs: Send {
    /// The inline limit the device granted.
    fn inline_limit(&self) -> usize;
    /// Posts one signalled SEND of `data` (at most [`RDMA_CHUNK`] bytes): inline within the
    /// inline limit, else copied through the registered staging buffer.
    fn post_send(&mut self, data: &[u8]) -> Result<(), VerbsError>;
    /// Re-posts receive slot `slot`.
    fn post_recv(&mut self, slot: usize) -> Result<(), VerbsError>;
    /// Copies `dst.len()` received bytes of slot `slot` from `offset` (within the
    /// completion's length, so within [`RDMA_CHUNK`]).
    fn copy_from_slot(&self, slot: usize, offset: usize, dst: &mut [u8]);
    /// Polls one completion.
    fn poll(&mut self, cq: Cq) -> Result<Option<Completion>, VerbsError>;
    /// Arms `cq` for one event (`solicited_only` = 0).
    fn arm(&mut self, cq: Cq) -> Result<(), VerbsError>;
    /// Sleeps on the completion channel and the TCP socket for at most `timeout`.
    fn sleep(&mut self, timeout: Duration) -> Result<Wake, VerbsError>;
    /// Whether the TCP socket still looks connected (non-blocking).
    fn peer_alive(&mut self) -> Result<bool, VerbsError>;
}

impl<V: Verbs + ?Sized> Verbs for Box<V> {
    fn inline_limit(&self) -> usize {
        (**self).inline_limit()
    }
    fn post_send(&mut self, data: &[u8]) -> Result<(), VerbsError> {
        (**self).post_send(data)
    }
    fn post_recv(&mut self, slot: usize) -> Result<(), VerbsError> {
        (**self).post_recv(slot)
    }
    fn copy_from_slot(&self, slot: usize, offset: usize, dst: &mut [u8]) {
        (**self).copy_from_slot(slot, offset, dst)
    }
    fn poll(&mut self, cq: Cq) -> Result<Option<Completion>, VerbsError> {
        (**self).poll(cq)
    }
    fn arm(&mut self, cq: Cq) -> Result<(), VerbsError> {
        (**self).arm(cq)
    }
    fn sleep(&mut self, timeout: Duration) -> Result<Wake, VerbsError> {
        (**self).sleep(timeout)
    }
    fn peer_alive(&mut self) -> Result<bool, VerbsError> {
        (**self).peer_alive()
    }
}
