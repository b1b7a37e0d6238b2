//! [`CommError`], the one error type of the comm-link state machines.
//!
//! Any error fails the whole stage it happened in: the reference drops every peer socket and
//! answers `COMM_INIT` with `ok = 0`, or closes the client connection during `COMM_ALLREDUCE`.
//! The variants exist to make the logged reason precise.

/// Everything that can go wrong while setting up or using the server-to-server link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// The world size is not allowed here (8.0.0 link: exactly 2; newest link: at least 2).
    #[error("world size {world} is not allowed here")]
    InvalidWorld {
        /// The world size given.
        world: u64,
    },
    /// This server's own rank does not fit the world (or the role: rank 0 accepts, ranks > 0
    /// connect).
    #[error("rank {rank} is not valid for world size {world} in this role")]
    InvalidRank {
        /// The rank given.
        rank: u32,
        /// The world size given.
        world: u32,
    },
    /// A peer announced a rank outside `1 ≤ rank < world`.
    #[error("peer announced rank {rank}, outside 1..{world}")]
    PeerRankOutOfRange {
        /// The rank the peer sent.
        rank: u32,
        /// The world size.
        world: u32,
    },
    /// Two peers announced the same rank.
    #[error("peer rank {rank} announced twice")]
    DuplicatePeerRank {
        /// The rank announced a second time.
        rank: u32,
    },
    /// Input or a close was attributed to a rank that is not a peer of this rank on this link.
    #[error("rank {peer} is not a peer of this rank")]
    UnknownPeer {
        /// The rank given by the caller.
        peer: u32,
    },
    /// A peer sent bytes that a conforming peer cannot have sent yet (in the bootstrap exchange:
    /// more than its block before rank 0 broadcast the gathered array to it).
    #[error("peer of rank {peer} sent data out of turn")]
    UnexpectedData {
        /// The rank of the offending peer.
        peer: u32,
    },
    /// A connection closed before this stage received everything it needs from it.
    #[error("comm connection closed early (peer {peer:?})")]
    ConnectionClosed {
        /// The peer's rank, when the connection is addressed by rank.
        peer: Option<u32>,
    },
    /// A size computed from the inputs does not fit in memory-sized integers.
    #[error("size overflow: {size} bytes per rank times {world} ranks")]
    SizeOverflow {
        /// Bytes per rank (or per element).
        size: usize,
        /// Number of ranks (or elements).
        world: u64,
    },
    /// A bootstrap exchange larger than the caller's limit.
    #[error("bootstrap exchange of {total} bytes exceeds the limit of {limit} bytes")]
    SizeLimit {
        /// `world · size`.
        total: usize,
        /// The caller's limit.
        limit: usize,
    },
    /// Negotiation picked the pairwise path, which only exists for two ranks.
    #[error(
        "pairwise path needs exactly 2 ranks, world is {world}; a backend communicator is required"
    )]
    PairwiseNeedsTwoRanks {
        /// The world size.
        world: u64,
    },
    /// An all-reduce payload whose length does not match the local element count.
    #[error("all-reduce payload of {got} bytes, expected {expected}")]
    WireLengthMismatch {
        /// `ne · element size`.
        expected: usize,
        /// The payload length given.
        got: usize,
    },
    /// `into_result` was called before the machine finished.
    #[error("the comm state machine has not finished")]
    NotDone,
    /// COMM_ALLREDUCE on a device without a communicator (no COMM_INIT, or it failed).
    #[error("no communicator for device {device}")]
    NoCommunicator {
        /// The device.
        device: u32,
    },
    /// COMM_ALLREDUCE of a tensor that is not F32.
    #[error("all-reduce needs an F32 tensor, got type {type_id}")]
    NotF32 {
        /// The tensor's ggml type id.
        type_id: u32,
    },
    /// COMM_INIT's port is not a TCP port.
    #[error("invalid port {port}")]
    InvalidPort {
        /// The port given.
        port: u32,
    },
    /// A rank above 0 was not told where rank 0 is.
    #[error("rank {rank} without a host to connect to")]
    NoHost {
        /// This server's rank.
        rank: u32,
    },
    /// A peer did not answer within the comm timeout.
    #[error("comm link timed out after {millis} ms")]
    Timeout {
        /// The timeout.
        millis: u64,
    },
    /// The link's socket failed.
    #[error("comm socket failed: {kind}")]
    Socket {
        /// What the operating system reported.
        kind: std::io::ErrorKind,
    },
    /// The deployer's comm peer list (`--comm-peers`) does not include this address.
    #[error("comm peer {ip} is not in the allowed comm peers")]
    PeerNotAllowed {
        /// The address refused.
        ip: core::net::IpAddr,
    },
    /// The TLS handshake of a comm connection failed: a certificate was refused (ours or the
    /// peer's), or the peer speaks no TLS.
    #[error("comm link TLS handshake failed: {reason}")]
    TlsHandshake {
        /// What the TLS library reported.
        reason: String,
    },
    /// The peer sent bytes the exchange in progress did not ask for.
    #[error("the peer sent data out of turn")]
    OutOfTurn,
    /// The transport the link moved to after its caps exchange (RDMA) failed.
    #[error("comm link transport failed: {reason}")]
    Transport {
        /// What the transport reported.
        reason: String,
    },
    /// The driver called an operation the machine cannot take in its current state.
    #[error("operation not allowed in the current state: {operation}")]
    InvalidState {
        /// What was attempted.
        operation: &'static str,
    },
}

impl From<std::io::Error> for CommError {
    fn from(error: std::io::Error) -> CommError {
        CommError::Socket { kind: error.kind() }
    }
}
