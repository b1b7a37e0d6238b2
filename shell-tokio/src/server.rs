//! The TCP server: accept loop, server-wide limits and graceful shutdown.
//!
//! Unlike the reference (one client at a time, PROTOCOL.md §11.3), [`serve`] serves many
//! clients at once: every accepted socket gets its own task, its own
//! [`ServerSession`](proto_core::session::ServerSession) and its own
//! [`Dispatcher`](proto_core::dispatch::Dispatcher), so each client's buffers, graphs and
//! streams are private and are freed when that client goes. The backend is shared.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use proto_core::backend::Backend;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

pub use shell_common::config::{
    ServerConfig, DEFAULT_COMM_TIMEOUT, DEFAULT_MAX_CLIENTS, DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_SHUTDOWN_GRACE,
};

use crate::connection;

/// Serves clients accepted on `listener` until `shutdown` completes.
///
/// Each client runs in its own task with its own dispatcher; `TCP_NODELAY` is set on every
/// accepted socket. A connection beyond [`ServerConfig::max_clients`] is closed at once. Any
/// error on a connection (protocol violation, failed command, I/O error) closes that
/// connection only, with a `warn` log line naming the error and its kind.
///
/// When `shutdown` completes the listener is closed, every connection is asked to stop at its
/// next command boundary (a SET_TENSOR being received is finished first), and the function
/// returns once all of them have closed, or after [`ServerConfig::shutdown_grace`], when the
/// stragglers are dropped. Either way every buffer the clients held is freed.
///
/// Errors: only an unsupported [`ServerConfig::version`]; accept failures are logged and the
/// loop goes on.
pub async fn serve(
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let connection_config = Arc::new(config.connection_config()?);
    let slots = Arc::new(Semaphore::new(config.max_clients));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, kind = %error.kind(), "accept failed");
                        // Out of file descriptors and similar: give the system a moment.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(
                        %peer,
                        max_clients = config.max_clients,
                        "refusing client connection: too many clients"
                    );
                    drop(stream);
                    continue;
                };
                let span = tracing::info_span!("client", %peer);
                let task = connection::run(
                    stream,
                    backend.clone(),
                    connection_config.clone(),
                    stop_rx.clone(),
                );
                tasks.spawn(
                    async move {
                        task.await;
                        drop(permit);
                    }
                    .instrument(span),
                );
            }
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(error) = joined {
                    tracing::error!(%error, "client task failed");
                }
            }
        }
    }
    drop(listener);
    tracing::info!(
        open_connections = tasks.len(),
        "shutting down: no longer accepting clients"
    );
    // Receivers never all drop while `tasks` holds connections, and with none left the
    // message is moot, so a send error needs no handling.
    let _ = stop_tx.send(true);
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(config.shutdown_grace, drain)
        .await
        .is_err()
    {
        tracing::warn!(
            open_connections = tasks.len(),
            "grace period over: dropping the remaining connections"
        );
        tasks.shutdown().await;
    }
    Ok(())
}
