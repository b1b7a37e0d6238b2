//! What every shell's connection loop shares around [`proto_core::driver::Connection`]: how a
//! connection ends, its read and write sizes, and the log lines of its start and end (the same
//! messages and fields in every shell, which the conformance suite reads).

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use proto_core::backend::Backend;
use proto_core::driver::Connection;

pub use crate::admission::{ClientSlot, ClientSlots, ServerClosed};

/// Bytes read at once between messages.
pub const READ_SIZE: usize = 64 * 1024;
/// Bytes read at once while SET_TENSOR data streams into a buffer (each read is one session
/// chunk, within the core's 16 MiB bound); smaller pieces keep the server's peak memory close
/// to the tensor.
pub const STREAM_READ_SIZE: usize = 8 * 1024 * 1024;
/// How long a failing connection may take to flush the responses it already owed.
pub const FINAL_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// How long an accept loop pauses after a failed accept (out of file descriptors and similar).
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

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
    /// The server closed the connection (admission control: a deadline, or making room).
    #[error(transparent)]
    Closed(ServerClosed),
}

/// The client closed its side: the end of the connection, an error if mid-frame.
pub fn end_of_input<B: Backend + ?Sized>(
    conn: &mut Connection<B>,
) -> Result<Closed, ConnectionError> {
    conn.handle_eof()?;
    Ok(Closed::ByClient)
}

/// Logs a failed accept (the loop pauses [`ACCEPT_PAUSE`] before the next).
pub fn accept_failed(error: &io::Error) {
    tracing::warn!(%error, kind = %error.kind(), "accept failed");
}

/// Logs the start of a shutdown.
pub fn stopping(open_connections: usize) {
    tracing::info!(
        open_connections,
        "shutting down: no longer accepting clients"
    );
}

/// Logs the end of the shutdown grace period with connections still open.
pub fn grace_over(open_connections: usize) {
    tracing::warn!(
        open_connections,
        "grace period over: dropping the remaining connections"
    );
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

/// Logs how a connection ended, and gives what it freed back to the system
/// ([`freed_memory`](crate::freed_memory)). Every shell calls it once the connection is dropped.
pub fn log_end(result: &Result<Closed, ConnectionError>) {
    crate::freed_memory::release();
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
        Err(ConnectionError::Closed(reason)) => tracing::warn!(
            %reason,
            kind = %reason.kind(),
            "Client connection closed by the server"
        ),
    }
}
