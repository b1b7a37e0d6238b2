//! What every shell's connection loop shares around [`proto_core::driver::Connection`]: how a
//! connection ends, its read and write sizes, and the log lines of its start and end (the same
//! messages and fields in every shell, which the conformance suite reads).

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

/// Bytes read at once between messages.
pub const READ_SIZE: usize = 64 * 1024;
/// Bytes read at once while SET_TENSOR data streams into a buffer (each read is one session
/// chunk, within the core's 16 MiB bound); smaller pieces keep the server's peak memory close
/// to the tensor.
pub const STREAM_READ_SIZE: usize = 8 * 1024 * 1024;
/// Most buffers passed to one vectored write.
pub const MAX_IO_SLICES: usize = 64;
/// How long a failing connection may take to flush the responses it already owed.
pub const FINAL_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a connection ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The client closed its side between two messages.
    ByClient,
    /// The server is shutting down.
    Shutdown,
}

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The client broke the protocol or a command failed.
    #[error(transparent)]
    Protocol(#[from] proto_core::Error),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Bytes to read into a fresh buffer while `remaining` bytes of streamed data are owed.
pub fn stream_read_size(remaining: u64) -> usize {
    usize::try_from(remaining.min(STREAM_READ_SIZE as u64)).unwrap_or(STREAM_READ_SIZE)
}

/// Prepares an accepted client socket (`TCP_NODELAY`, the same-host tuning) and logs it.
pub fn accepted<S: AsFd>(socket: &S) {
    if let Err(error) = socket2::SockRef::from(socket).set_tcp_nodelay(true) {
        tracing::warn!(%error, kind = %error.kind(), "cannot set TCP_NODELAY");
    }
    crate::tune_or_log(socket);
    tracing::info!("Accepted client connection");
}

/// Logs how a connection ended.
pub fn log_end(result: &Result<Closed, ConnectionError>) {
    match result {
        Ok(Closed::ByClient) => tracing::info!("Client connection closed"),
        Ok(Closed::Shutdown) => {
            tracing::info!("Client connection closed: server shutting down")
        }
        Err(ConnectionError::Protocol(error)) => tracing::warn!(
            %error,
            kind = %error.kind(),
            "Client connection closed on error"
        ),
        Err(ConnectionError::Io(error)) => tracing::warn!(
            %error,
            kind = %error.kind(),
            "Client connection closed on I/O error"
        ),
    }
}
