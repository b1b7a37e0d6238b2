//! The one error type of the protocol core.
//!
//! Every failure closes the offending connection (the protocol has no error replies), so the
//! variants exist to make the logged reason precise; [`ErrorKind`] gives each a stable name that
//! the test vectors refer to.

use crate::ggml::GgmlTable;
use crate::graph::GraphError;
use crate::wire::Command;

/// Everything that can go wrong while decoding, validating or executing a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The first command on a connection was not HELLO.
    #[error("expected HELLO as the first command, got command id {got}")]
    HelloExpected {
        /// The command id received instead.
        got: u8,
    },
    /// HELLO arrived a second time.
    #[error("HELLO received twice")]
    DuplicateHello,
    /// A command id that the negotiated protocol version does not define.
    #[error("unknown command id {id}")]
    UnknownCommand {
        /// The command id.
        id: u8,
    },
    /// One of our private extension ids on a connection that did not negotiate it
    /// (EXTENSIONS).
    #[error("extension command id {id:#04x} was not negotiated on this connection")]
    ExtensionNotNegotiated {
        /// The command id.
        id: u8,
    },
    /// A fixed-size request whose size field differs from the command's size.
    #[error("{command:?}: request size {got}, expected {expected}")]
    RequestSizeMismatch {
        /// The command.
        command: Command,
        /// Its exact size.
        expected: u64,
        /// The size field received.
        got: u64,
    },
    /// A variable-size request shorter than its fixed part.
    #[error("{command:?}: request size {got} below the minimum {min}")]
    RequestTooShort {
        /// The command.
        command: Command,
        /// Its minimum size.
        min: u64,
        /// The size field received.
        got: u64,
    },
    /// A buffered request larger than the configured limit.
    #[error("{command:?}: request size {got} above the limit {limit}")]
    MessageTooLarge {
        /// The command.
        command: Command,
        /// The configured limit.
        limit: u64,
        /// The size field received.
        got: u64,
    },
    /// A payload whose inner fields disagree with its length (counts, sizes, copies).
    #[error("malformed {command:?} payload: {reason}")]
    MalformedPayload {
        /// The command.
        command: Command,
        /// What disagreed.
        reason: &'static str,
    },
    /// A type id that is out of range or removed from ggml's table.
    #[error("invalid tensor type id {type_id}")]
    InvalidType {
        /// The type id.
        type_id: u32,
    },
    /// `ne[0]` is not a multiple of the type's block size.
    #[error("ne[0] = {ne0} is not a multiple of the block size {block_size}")]
    BlockMisaligned {
        /// `ne[0]`.
        ne0: u32,
        /// The type's block size.
        block_size: u32,
    },
    /// An element count or byte extent that does not fit in 64 bits (or `i64` for ggml).
    #[error("tensor size overflows: {0}")]
    SizeOverflow(&'static str),
    /// A device index at or above the device count.
    #[error("device {device} does not exist (device count {count})")]
    InvalidDevice {
        /// The index received.
        device: u32,
        /// The number of devices.
        count: u32,
    },
    /// A buffer handle this connection did not allocate.
    #[error("buffer {handle:#x} not found")]
    UnknownBuffer {
        /// The handle received.
        handle: u64,
    },
    /// A command that needs a tensor in a buffer got one without.
    #[error("tensor has no buffer")]
    MissingBuffer,
    /// A tensor or region that leaves its buffer or its tensor.
    #[error("out of bounds: {0}")]
    OutOfBounds(&'static str),
    /// A graph that fails structural validation.
    #[error("invalid graph: {0}")]
    InvalidGraph(#[from] GraphError),
    /// A graph op that the server refuses to run (custom ops, unsupported ops).
    #[error("op {op} refused: {reason}")]
    OpRefused {
        /// The op id.
        op: u32,
        /// Why.
        reason: &'static str,
    },
    /// A graph op id that the served protocol's op table does not have, or has as a custom op
    /// where a newer table has a real one: most likely a client of another protocol version
    /// (8.0.0 and 8.0.1 accept each other in HELLO but number ops differently).
    #[error("{}", outside_table(*.op, *.table, *.likely_client))]
    OpOutsideTable {
        /// The wire op id.
        op: u32,
        /// The table of the served protocol.
        table: GgmlTable,
        /// The table of a client that would have sent a real op with this id.
        likely_client: Option<GgmlTable>,
    },
    /// A graph op (newest numbering) that the server's op table lacks; nothing was sent.
    #[error(
        "op {} ({op}) does not exist in protocol {table}'s op table, which the server uses",
        crate::ggml::op_name(*.op).unwrap_or("unknown")
    )]
    OpNotInServerTable {
        /// The op, in the newest numbering.
        op: u32,
        /// The server's table.
        table: GgmlTable,
    },
    /// GRAPH_RECOMPUTE for a graph that is not stored.
    #[error("graph not found (device {device}, uid {uid})")]
    GraphNotFound {
        /// The device.
        device: u32,
        /// The uid (0 in protocol 7).
        uid: u64,
    },
    /// The client asked for more buffer memory than its quota (`--memory-quota`).
    #[error("quota exceeded: {requested} bytes of buffers requested, quota {quota}")]
    QuotaExceeded {
        /// Bytes the client would hold with the new buffer.
        requested: u64,
        /// The per-connection quota.
        quota: u64,
    },
    /// The server's HELLO reply announces a version we cannot talk to.
    #[error("server version {major}.{minor}.{patch} is incompatible with ours")]
    VersionMismatch {
        /// Server major.
        major: u8,
        /// Server minor.
        minor: u8,
        /// Server patch.
        patch: u8,
    },
    /// A response whose size differs from what the request implies.
    #[error("{command:?}: response size {got}, expected {expected}")]
    ResponseSizeMismatch {
        /// The command answered.
        command: Command,
        /// Expected payload size.
        expected: u64,
        /// Size received.
        got: u64,
    },
    /// Bytes arrived when no response was outstanding.
    #[error("unsolicited response bytes")]
    UnexpectedResponse,
    /// A request the caller tried to send or answer out of order.
    #[error("API misuse: {0}")]
    InvalidState(&'static str),
    /// The stream ended in the middle of a frame.
    #[error("connection closed mid-frame ({0} bytes of the frame missing)")]
    UnexpectedEof(u64),
    /// The session already failed or closed.
    #[error("session closed")]
    Closed,
    /// The server-to-server comm link failed.
    #[error("comm link: {0}")]
    Comm(crate::comm::CommError),
    /// The backend failed to execute a valid request.
    #[error("backend: {0}")]
    Backend(String),
}

/// The stable, payload-free name of an [`Error`], used by logs, metrics and test vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::HelloExpected`]
    HelloExpected,
    /// [`Error::DuplicateHello`]
    DuplicateHello,
    /// [`Error::UnknownCommand`]
    UnknownCommand,
    /// [`Error::ExtensionNotNegotiated`]
    ExtensionNotNegotiated,
    /// [`Error::RequestSizeMismatch`]
    RequestSizeMismatch,
    /// [`Error::RequestTooShort`]
    RequestTooShort,
    /// [`Error::MessageTooLarge`]
    MessageTooLarge,
    /// [`Error::MalformedPayload`]
    MalformedPayload,
    /// [`Error::InvalidType`]
    InvalidType,
    /// [`Error::BlockMisaligned`]
    BlockMisaligned,
    /// [`Error::SizeOverflow`]
    SizeOverflow,
    /// [`Error::InvalidDevice`]
    InvalidDevice,
    /// [`Error::UnknownBuffer`]
    UnknownBuffer,
    /// [`Error::MissingBuffer`]
    MissingBuffer,
    /// [`Error::OutOfBounds`]
    OutOfBounds,
    /// [`Error::InvalidGraph`]
    InvalidGraph,
    /// [`Error::OpRefused`]
    OpRefused,
    /// [`Error::GraphNotFound`]
    GraphNotFound,
    /// [`Error::QuotaExceeded`]
    QuotaExceeded,
    /// [`Error::VersionMismatch`]
    VersionMismatch,
    /// [`Error::ResponseSizeMismatch`]
    ResponseSizeMismatch,
    /// [`Error::UnexpectedResponse`]
    UnexpectedResponse,
    /// [`Error::InvalidState`]
    InvalidState,
    /// [`Error::UnexpectedEof`]
    UnexpectedEof,
    /// [`Error::Closed`]
    Closed,
    /// [`Error::Comm`]
    Comm,
    /// [`Error::Backend`]
    Backend,
}

impl ErrorKind {
    /// All kinds, for tables and exhaustive tests.
    pub const ALL: [ErrorKind; 27] = [
        ErrorKind::HelloExpected,
        ErrorKind::DuplicateHello,
        ErrorKind::UnknownCommand,
        ErrorKind::RequestSizeMismatch,
        ErrorKind::RequestTooShort,
        ErrorKind::MessageTooLarge,
        ErrorKind::MalformedPayload,
        ErrorKind::InvalidType,
        ErrorKind::BlockMisaligned,
        ErrorKind::SizeOverflow,
        ErrorKind::InvalidDevice,
        ErrorKind::UnknownBuffer,
        ErrorKind::MissingBuffer,
        ErrorKind::OutOfBounds,
        ErrorKind::InvalidGraph,
        ErrorKind::OpRefused,
        ErrorKind::GraphNotFound,
        ErrorKind::QuotaExceeded,
        ErrorKind::VersionMismatch,
        ErrorKind::ResponseSizeMismatch,
        ErrorKind::UnexpectedResponse,
        ErrorKind::InvalidState,
        ErrorKind::UnexpectedEof,
        ErrorKind::Closed,
        ErrorKind::Comm,
        ErrorKind::Backend,
        ErrorKind::ExtensionNotNegotiated,
    ];

    /// The snake_case name used in test vectors (`"request_size_mismatch"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::HelloExpected => "hello_expected",
            ErrorKind::DuplicateHello => "duplicate_hello",
            ErrorKind::UnknownCommand => "unknown_command",
            ErrorKind::ExtensionNotNegotiated => "extension_not_negotiated",
            ErrorKind::RequestSizeMismatch => "request_size_mismatch",
            ErrorKind::RequestTooShort => "request_too_short",
            ErrorKind::MessageTooLarge => "message_too_large",
            ErrorKind::MalformedPayload => "malformed_payload",
            ErrorKind::InvalidType => "invalid_type",
            ErrorKind::BlockMisaligned => "block_misaligned",
            ErrorKind::SizeOverflow => "size_overflow",
            ErrorKind::InvalidDevice => "invalid_device",
            ErrorKind::UnknownBuffer => "unknown_buffer",
            ErrorKind::MissingBuffer => "missing_buffer",
            ErrorKind::OutOfBounds => "out_of_bounds",
            ErrorKind::InvalidGraph => "invalid_graph",
            ErrorKind::OpRefused => "op_refused",
            ErrorKind::GraphNotFound => "graph_not_found",
            ErrorKind::QuotaExceeded => "quota_exceeded",
            ErrorKind::VersionMismatch => "version_mismatch",
            ErrorKind::ResponseSizeMismatch => "response_size_mismatch",
            ErrorKind::UnexpectedResponse => "unexpected_response",
            ErrorKind::InvalidState => "invalid_state",
            ErrorKind::UnexpectedEof => "unexpected_eof",
            ErrorKind::Closed => "closed",
            ErrorKind::Comm => "comm",
            ErrorKind::Backend => "backend",
        }
    }

    /// Parses a name produced by [`ErrorKind::as_str`].
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Error {
    /// The payload-free kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::HelloExpected { .. } => ErrorKind::HelloExpected,
            Error::DuplicateHello => ErrorKind::DuplicateHello,
            Error::UnknownCommand { .. } => ErrorKind::UnknownCommand,
            Error::ExtensionNotNegotiated { .. } => ErrorKind::ExtensionNotNegotiated,
            Error::RequestSizeMismatch { .. } => ErrorKind::RequestSizeMismatch,
            Error::RequestTooShort { .. } => ErrorKind::RequestTooShort,
            Error::MessageTooLarge { .. } => ErrorKind::MessageTooLarge,
            Error::MalformedPayload { .. } => ErrorKind::MalformedPayload,
            Error::InvalidType { .. } => ErrorKind::InvalidType,
            Error::BlockMisaligned { .. } => ErrorKind::BlockMisaligned,
            Error::SizeOverflow(_) => ErrorKind::SizeOverflow,
            Error::InvalidDevice { .. } => ErrorKind::InvalidDevice,
            Error::UnknownBuffer { .. } => ErrorKind::UnknownBuffer,
            Error::MissingBuffer => ErrorKind::MissingBuffer,
            Error::OutOfBounds(_) => ErrorKind::OutOfBounds,
            Error::InvalidGraph(_) => ErrorKind::InvalidGraph,
            Error::OpRefused { .. }
            | Error::OpOutsideTable { .. }
            | Error::OpNotInServerTable { .. } => ErrorKind::OpRefused,
            Error::GraphNotFound { .. } => ErrorKind::GraphNotFound,
            Error::QuotaExceeded { .. } => ErrorKind::QuotaExceeded,
            Error::VersionMismatch { .. } => ErrorKind::VersionMismatch,
            Error::ResponseSizeMismatch { .. } => ErrorKind::ResponseSizeMismatch,
            Error::UnexpectedResponse => ErrorKind::UnexpectedResponse,
            Error::InvalidState(_) => ErrorKind::InvalidState,
            Error::UnexpectedEof(_) => ErrorKind::UnexpectedEof,
            Error::Closed => ErrorKind::Closed,
            Error::Comm(_) => ErrorKind::Comm,
            Error::Backend(_) => ErrorKind::Backend,
        }
    }
}

impl From<crate::comm::CommError> for Error {
    fn from(error: crate::comm::CommError) -> Error {
        Error::Comm(error)
    }
}

/// Result alias of the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn outside_table(op: u32, table: GgmlTable, likely_client: Option<GgmlTable>) -> String {
    let place = match table.op_name(op) {
        Some(name) => format!("op {op} is {name}, a custom op, in protocol {table}'s op table"),
        None => format!(
            "op {op} is past protocol {table}'s op table ({} ops)",
            table.op_count()
        ),
    };
    match likely_client.and_then(|client| Some((client, client.op_name(op)?))) {
        Some((client, name)) => format!(
            "{place}; is the client {client} (where op {op} is {name})? \
             Serve protocol {client} to its clients"
        ),
        None => place,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for kind in ErrorKind::ALL {
            assert!(seen.insert(kind.as_str()));
            assert_eq!(ErrorKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("nope"), None);
    }
}
