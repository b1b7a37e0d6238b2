//! The server settings every shell takes, and the per-connection settings derived from them.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use proto_core::backend::Backend;
use proto_core::comm::LinkVariant;
use proto_core::dispatch::{DispatcherConfig, TicketBoard};
use proto_core::driver::Connection;
use proto_core::graph::GraphLimits;
use proto_core::session::ServerSessionConfig;
use proto_core::tensor_cache::TensorCache;
use proto_core::wire::ProtocolVersion;

use crate::comm_link::{CommLinks, CommPeers, CommSettings};
use crate::remote_copy::PeerAllowList;

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
            .field("comm_timeout", &self.comm_timeout)
            .field("comm_link", &self.comm_link)
            .field("backend_communicator", &self.backend_communicator)
            .field("comm_peers", &self.comm_peers)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("remote_copy", &self.remote_copy)
            .field("peers", &self.peers)
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
        Ok(ConnectionConfig {
            session,
            dispatcher,
            comm: CommSettings {
                variant: self.link_variant(),
                backend_communicator: self.backend_communicator,
                timeout: self.comm_timeout,
                peers: self.comm_peers.clone(),
                copy_peers: Arc::new(self.peers.clone()),
            },
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
