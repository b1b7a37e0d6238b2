//! The server settings every shell takes, and the per-connection settings derived from them.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use proto_core::backend::Backend;
use proto_core::comm::LinkVariant;
use proto_core::dispatch::{DispatcherConfig, TicketBoard};

use crate::transport::TransportMode;
use proto_core::driver::Connection;
use proto_core::graph::GraphLimits;
use proto_core::session::ServerSessionConfig;
use proto_core::tensor_cache::TensorCache;
use proto_core::wire::ProtocolVersion;

use crate::admission::{ClientSlots, Limits};
use crate::comm_link::{CommLinks, CommPeers, CommSettings, CommTransport};
use crate::remote_copy::PeerAllowList;
use crate::tls::ServerTls;

/// Default for [`ServerConfig::max_clients`].
pub const DEFAULT_MAX_CLIENTS: usize = 64;
/// Default for [`ServerConfig::max_clients_per_address`].
pub const DEFAULT_MAX_CLIENTS_PER_ADDRESS: usize = 32;
/// Default for [`ServerConfig::hello_timeout`].
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`ServerConfig::progress_window`].
pub const DEFAULT_PROGRESS_WINDOW: Duration = Duration::from_secs(30);
/// Default for [`ServerConfig::min_progress_rate`]: 4 KiB/s.
pub const DEFAULT_MIN_PROGRESS_RATE: u64 = 4096;
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
    /// Most clients served at once from one IP address (see [`crate::admission`]).
    pub max_clients_per_address: usize,
    /// How long a connection may take to complete HELLO (`None`: forever).
    pub hello_timeout: Option<Duration>,
    /// While a message arrives or a reply drains, at least `min_progress_rate` bytes a second
    /// must move, measured over each window of this length (`None`: no check).
    pub progress_window: Option<Duration>,
    /// Bytes a second a message in progress must move (see `progress_window`).
    pub min_progress_rate: u64,
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
    /// The comm link of protocol 8.0.1: the newest upstream's ranked link (default) or the
    /// pairwise one of plain 8.0.1. Two 8.0.1 servers with and without the newest change
    /// cannot tell each other apart on the wire, so the deployer chooses. Protocol 8.0.0
    /// always uses the 8.0.0 link.
    pub comm_link: LinkVariant,
    /// Whether to vote for the backend's own communicator where it offers one (the
    /// reference's `GGML_RPC_NO_BACKEND_COMMUNICATOR` clears it).
    pub backend_communicator: bool,
    /// Where comm links may connect to and accept from (`--comm-peers`; default: anywhere).
    pub comm_peers: CommPeers,
    /// How long a shutdown waits for open connections to finish their current command before
    /// they are dropped.
    pub shutdown_grace: Duration,
    /// Whether to offer our remote-copy extension (HELLO flags bit 7, EXTENSIONS; default on:
    /// as a destination it needs nothing else, as a source it needs [`peers`](Self::peers)).
    pub remote_copy: bool,
    /// Where REMOTE_COPY_TENSOR may push to (`--peer HOST:PORT`; default none: refused).
    pub peers: PeerAllowList,
    /// `--transport` (default TCP only: all-zero caps, as before the RDMA transport). Shells
    /// that can switch (tokio, uring, smol) answer HELLO's caps with `shell-rdma`.
    pub transport: TransportMode,
    /// TLS 1.3 with client certificates (`--tls-*`; default none: plain TCP). A shell that
    /// cannot do TLS refuses to start with it set.
    pub tls: Option<ServerTls>,
    /// Whether comm links offer RDMA caps (default: all-zero caps, TCP;
    /// `shell_rdma::comm::transport` for `--transport auto|rdma`).
    pub comm_transport: CommTransport,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("version", &self.version)
            .field("max_clients", &self.max_clients)
            .field("max_clients_per_address", &self.max_clients_per_address)
            .field("hello_timeout", &self.hello_timeout)
            .field("progress_window", &self.progress_window)
            .field("min_progress_rate", &self.min_progress_rate)
            .field("memory_quota", &self.memory_quota)
            .field("max_message_size", &self.max_message_size)
            .field("tensor_cache", &self.tensor_cache.is_some())
            .field("graph_limits", &self.graph_limits)
            .field("comm_timeout", &self.comm_timeout)
            .field("comm_link", &self.comm_link)
            .field("backend_communicator", &self.backend_communicator)
            .field("comm_peers", &self.comm_peers)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("remote_copy", &self.remote_copy)
            .field("peers", &self.peers)
            .field("transport", &self.transport)
            .field("tls", &self.tls)
            .field("comm_transport", &self.comm_transport)
            .finish()
    }
}

impl ServerConfig {
    /// Defaults for a version: [`DEFAULT_MAX_CLIENTS`], no quota,
    /// [`DEFAULT_MAX_MESSAGE_SIZE`], no cache, default graph limits,
    /// [`DEFAULT_COMM_TIMEOUT`], the ranked comm link, the backend's communicator where it
    /// offers one, [`DEFAULT_SHUTDOWN_GRACE`].
    pub fn new(version: ProtocolVersion) -> ServerConfig {
        ServerConfig {
            version,
            max_clients: DEFAULT_MAX_CLIENTS,
            max_clients_per_address: DEFAULT_MAX_CLIENTS_PER_ADDRESS,
            hello_timeout: Some(DEFAULT_HELLO_TIMEOUT),
            progress_window: Some(DEFAULT_PROGRESS_WINDOW),
            min_progress_rate: DEFAULT_MIN_PROGRESS_RATE,
            memory_quota: None,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            tensor_cache: None,
            graph_limits: GraphLimits::default(),
            comm_timeout: DEFAULT_COMM_TIMEOUT,
            comm_link: LinkVariant::Ranked,
            backend_communicator: true,
            comm_peers: CommPeers::any(),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            remote_copy: true,
            peers: PeerAllowList::none(),
            transport: TransportMode::Tcp,
            tls: None,
            comm_transport: CommTransport::tcp(),
        }
    }

    /// The per-connection settings derived from this configuration.
    ///
    /// Errors: [`io::ErrorKind::InvalidInput`] for an unsupported [`ServerConfig::version`].
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
        // One ticket board per server: every connection of it shares this config.
        dispatcher.remote_copy = self.remote_copy.then(|| Arc::new(TicketBoard::new()));
        dispatcher.negotiate_transport = self.transport != TransportMode::Tcp;
        Ok(ConnectionConfig {
            session,
            dispatcher,
            transport: self.transport,
            comm: CommSettings {
                variant: self.link_variant(),
                backend_communicator: self.backend_communicator,
                timeout: self.comm_timeout,
                peers: self.comm_peers.clone(),
                copy_peers: Arc::new(self.peers.clone()),
                copy_tls: self.tls.as_ref().map(|tls| tls.client.clone()),
                tls: self.tls.as_ref().map(crate::comm_link::CommTls::new),
                transport: self.comm_transport.clone(),
            },
        })
    }

    /// The client places and deadlines of this server, for its accept loops.
    pub fn client_slots(&self) -> ClientSlots {
        ClientSlots::with_limits(Limits {
            max_clients: self.max_clients,
            max_per_address: self.max_clients_per_address,
            hello_timeout: self.hello_timeout,
            progress_window: self.progress_window,
            min_progress_rate: self.min_progress_rate,
        })
    }

    /// The comm link this server sets up: the 8.0.0 link below 8.0.1, else the chosen one.
    pub fn link_variant(&self) -> LinkVariant {
        if self.version < ProtocolVersion::V8_0_1 {
            LinkVariant::V8_0
        } else {
            self.comm_link
        }
    }
}

/// Per-connection settings, derived from a [`ServerConfig`].
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// Settings of the connection's session (dialect, message size limit).
    pub session: ServerSessionConfig,
    /// Settings of the connection's dispatcher (version, quota, cache, graph limits).
    pub dispatcher: DispatcherConfig,
    /// How comm links are set up, and the bound on every wait for a peer.
    pub comm: CommSettings,
    /// `--transport`: how the shell answers HELLO's transport caps.
    pub transport: TransportMode,
}

impl ConnectionConfig {
    /// The driver of a new connection. `direct_io`: whether its stream can move tensor data
    /// straight between the socket and backend memory (a TCP socket can).
    pub fn connect(
        &self,
        backend: Arc<dyn Backend>,
        direct_io: bool,
    ) -> proto_core::Result<Connection> {
        Connection::new(backend, &self.session, &self.dispatcher, direct_io)
    }

    /// The comm state of a new connection.
    pub fn comm_links(&self) -> CommLinks {
        CommLinks::new(self.comm.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_conversion() {
        let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
        assert_eq!(config.max_clients, DEFAULT_MAX_CLIENTS);
        assert_eq!(config.max_message_size, DEFAULT_MAX_MESSAGE_SIZE);
        config.max_message_size = 1234;
        config.memory_quota = Some(99);
        config.comm_timeout = Duration::from_secs(7);
        let connection = config.connection_config().unwrap();
        assert_eq!(connection.session.max_message_size, 1234);
        assert_eq!(connection.dispatcher.memory_quota, Some(99));
        assert_eq!(connection.comm.timeout, Duration::from_secs(7));
        assert_eq!(connection.comm.variant, LinkVariant::V8_0);
        let mut newest = ServerConfig::new(ProtocolVersion::V8_0_1);
        assert_eq!(newest.link_variant(), LinkVariant::Ranked);
        newest.comm_link = LinkVariant::V8_0;
        assert_eq!(
            newest.connection_config().unwrap().comm.variant,
            LinkVariant::V8_0
        );
    }
}
