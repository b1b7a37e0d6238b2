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

use proto_core::backend::Backend;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

pub use shell_common::config::{
    ServerConfig, DEFAULT_COMM_TIMEOUT, DEFAULT_MAX_CLIENTS, DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_SHUTDOWN_GRACE,
};

use shell_common::shell;

use crate::connection::{self, Blocking};

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
    let here = Handle::current();
    accept_loop(listener, here, Blocking::InPlace, backend, config, shutdown).await
}

/// [`serve`], with the clients' tasks on the multi-threaded runtime `connections`, while this
/// accept loop runs where it is awaited, which must be another runtime (a current-thread
/// runtime on a thread of its own, as `ggml-rpc-server` runs it).
///
/// Accepting outside the connections' workers lets a connection that is the runtime's only
/// task run its heavy calls (a graph, a large write) inline instead of under
/// `block_in_place`: a client accepted meanwhile still reaches an idle worker (see
/// [`crate::connection`], "Blocking backend calls"). That saves about seven
/// context switches per graph of the common one-client case.
pub async fn serve_on(
    listener: TcpListener,
    connections: Handle,
    backend: Arc<dyn Backend>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    accept_loop(
        listener,
        connections,
        Blocking::InlineWhenAlone,
        backend,
        config,
        shutdown,
    )
    .await
}

async fn accept_loop(
    listener: TcpListener,
    connections: Handle,
    blocking: Blocking,
    backend: Arc<dyn Backend>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let connection_config = Arc::new(config.connection_config()?);
    let tls = crate::tls::acceptor(&config);
    let slots = config.client_slots();
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
                        shell::accept_failed(&error);
                        tokio::time::sleep(shell::ACCEPT_PAUSE).await;
                        continue;
                    }
                };
                let Some(slot) = slots.admit(peer, &stream) else {
                    continue;
                };
                let span = tracing::info_span!("client", %peer, shell = "tokio");
                // Registered anew with the connections' runtime, inside its task.
                let stream = match stream.into_std() {
                    Ok(stream) => stream,
                    Err(error) => {
                        shell::accept_failed(&error);
                        continue;
                    }
                };
                let (backend, config, stop, tls) =
                    (backend.clone(), connection_config.clone(), stop_rx.clone(), tls.clone());
                tasks.spawn_on(
                    async move {
                        match TcpStream::from_std(stream) {
                            Ok(stream) => match tls {
                                Some(tls) => {
                                    crate::tls::run(
                                        stream, tls, backend, config, stop, blocking, slot,
                                    )
                                    .await
                                }
                                None => {
                                    connection::run(stream, backend, config, stop, blocking, slot)
                                        .await
                                }
                            },
                            Err(error) => shell::accept_failed(&error),
                        }
                    }
                    .instrument(span),
                    &connections,
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
    shell::stopping(tasks.len());
    // Receivers never all drop while `tasks` holds connections, and with none left the
    // message is moot, so a send error needs no handling.
    let _ = stop_tx.send(true);
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(config.shutdown_grace, drain)
        .await
        .is_err()
    {
        shell::grace_over(tasks.len());
        tasks.shutdown().await;
    }
    Ok(())
}
