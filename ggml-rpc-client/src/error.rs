//! What the [`Client`](crate::Client) returns when a call fails.

use proto_core::ErrorKind;

/// A failed client call. The connection is unusable afterwards (the protocol has no error
/// replies: a server that rejects a request closes the connection).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket failed (connect, read or write).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The protocol core rejected a request or a response (version mismatch, a response of
    /// the wrong size, unsolicited bytes, a command the dialect lacks...).
    #[error(transparent)]
    Protocol(#[from] proto_core::Error),
    /// The server closed the connection, usually because it rejected the last request.
    #[error("the server closed the connection")]
    Closed,
    /// A remote copy (our extension) was refused with this status; unlike the other errors,
    /// both connections stay usable.
    #[error("remote copy refused: {0:?}")]
    RemoteCopy(proto_core::wire::RemoteCopyStatus),
    /// A direct copy was asked for, but a server does not offer the remote-copy extension.
    #[error("a server does not offer the remote-copy extension")]
    RemoteCopyUnavailable,
    /// The RDMA transport failed (the connection is unusable).
    #[error(transparent)]
    Rdma(#[from] shell_rdma::StreamError),
    /// `--transport rdma` could not switch.
    #[error(transparent)]
    Refused(#[from] shell_rdma::serve::RefusedError),
}

impl ClientError {
    /// The version the server announced, when the call failed because it is incompatible.
    pub fn version_mismatch(&self) -> Option<proto_core::wire::ProtocolVersion> {
        match self {
            ClientError::Protocol(proto_core::Error::VersionMismatch {
                major,
                minor,
                patch,
            }) => Some(proto_core::wire::ProtocolVersion {
                major: *major,
                minor: *minor,
                patch: *patch,
            }),
            _ => None,
        }
    }

    /// The core's error kind, for protocol errors.
    pub fn protocol_kind(&self) -> Option<ErrorKind> {
        match self {
            ClientError::Protocol(error) => Some(error.kind()),
            _ => None,
        }
    }
}
