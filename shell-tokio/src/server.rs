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
use proto_core::dispatch::DispatcherConfig;
use proto_core::graph::GraphLimits;
use proto_core::session::ServerSessionConfig;
use proto_core::tensor_cache::TensorCache;
use proto_core::wire::ProtocolVersion;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::connection::{self, ConnectionConfig};

/// Default for [`ServerConfig::max_clients`].
pub const DEFAULT_MAX_CLIENTS: usize = 64;
/// Default for [`ServerConfig::max_message_size`]: 256 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: u64 = 256 << 20;
/// Default for [`ServerConfig::comm_timeout`].
pub const DEFAULT_COMM_TIMEOUT: Duration = Duration::from_secs(60);
/// Default for [`ServerConfig::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Settings of a server (shared by all its connections).
#[derive(Clone)]
pub struct ServerConfig {
    /// The version announced in HELLO; its major selects the command table (7 or 8).
    pub version: ProtocolVersion,
    /// Most clients served at once; further connections are closed right after `accept`,
    /// with a log line.
    pub max_clients: usize,
    /// Most bytes of buffers one client may hold (`None`: unlimited). An ALLOC_BUFFER past it
    /// closes that client's connection.
    pub memory_quota: Option<u64>,
    /// Largest buffered request (GRAPH_COMPUTE and the fixed-size commands). SET_TENSOR and
    /// SET_TENSOR_2D data is streamed and checked against the destination instead.
    pub max_message_size: u64,
    /// The tensor cache (`-c`), announced in HELLO flag bit 0.
    pub tensor_cache: Option<Arc<dyn TensorCache>>,
    /// Graph size limits of GRAPH_COMPUTE.
    pub graph_limits: GraphLimits,
    /// Bound on setting up a comm link (COMM_INIT: rank 0 waiting for its peer) and on each
    /// all-reduce exchange; the reference waits forever.
    pub comm_timeout: Duration,
    /// How long a shutdown waits for open connections to finish their current command before
    /// they are dropped.
    pub shutdown_grace: Duration,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("version", &self.version)
            .field("max_clients", &self.max_clients)
            .field("memory_quota", &self.memory_quota)
            .field("max_message_size", &self.max_message_size)
            .field("tensor_cache", &self.tensor_cache.is_some())
            .field("graph_limits", &self.graph_limits)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("comm_timeout", &self.comm_timeout)
            .finish()
    }
}

impl ServerConfig {
    /// Defaults for a version: [`DEFAULT_MAX_CLIENTS`], no quota,
    /// [`DEFAULT_MAX_MESSAGE_SIZE`], no cache, default graph limits.
    pub fn new(version: ProtocolVersion) -> ServerConfig {
        ServerConfig {
            version,
            max_clients: DEFAULT_MAX_CLIENTS,
            memory_quota: None,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            tensor_cache: None,
            graph_limits: GraphLimits::default(),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            comm_timeout: DEFAULT_COMM_TIMEOUT,
        }
    }

    /// The per-connection settings derived from this configuration.
    pub fn connection_config(&self) -> io::Result<ConnectionConfig> {
        let dialect = self.version.dialect().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("protocol version {} is not supported", self.version),
            )
        })?;
        let mut session = ServerSessionConfig::new(dialect);
        session.max_message_size = self.max_message_size;
        let mut dispatcher = DispatcherConfig::new(self.version);
        dispatcher.memory_quota = self.memory_quota;
        dispatcher.graph_limits = self.graph_limits;
        dispatcher.tensor_cache = self.tensor_cache.clone();
        Ok(ConnectionConfig {
            session,
            dispatcher,
            comm_timeout: self.comm_timeout,
        })
    }
}

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
