//! The transport a comm socket moves to after its caps exchange (PROTOCOL.md §6.2 step 4,
//! §6.3 step 2: "apply peer caps (may switch to RDMA, §10)"). `shell-common` knows only the
//! traits; `shell-rdma` implements them ([`CommTransport`] is set from `--transport`), so the
//! link's bytes after the caps (ranks, bootstrap exchanges, pairwise all-reduce payloads) go
//! over an RDMA queue pair when both servers offered caps and activation succeeded, and over
//! the TCP socket otherwise, as in the reference.

use std::fmt;
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use proto_core::comm::{CommError, ConnCaps};

use super::secure::CommStream;

/// A comm socket's data path after the switch.
pub trait LinkTransport: Send + fmt::Debug {
    /// Writes one transport-level write (each part the reference writes on its own: a rank,
    /// a bootstrap block, an all-reduce payload), every wait bounded by the link's timeout.
    fn write(&mut self, data: &[u8]) -> Result<(), CommError>;
    /// Reads into `buf` (at least one byte; `buf` is not empty), waiting at most `within`;
    /// 0 when the peer went away.
    fn read_into(&mut self, buf: &mut [u8], within: Duration) -> Result<usize, CommError>;
}

/// Resources probed for one comm socket, activated with the peer's caps.
pub trait PendingLink: Send {
    /// Connects to the peer's caps; `None` to stay on TCP (the peer offered none, or
    /// activation failed: logged). `tcp` is the comm socket, watched for the peer's hang-up.
    fn activate(
        self: Box<Self>,
        peer: &ConnCaps,
        tcp: &TcpStream,
        timeout: Duration,
    ) -> Option<Box<dyn LinkTransport>>;
}

/// Offers caps on comm sockets.
pub trait LinkUpgrade: Send + Sync {
    /// This side's caps for a comm socket whose local address is `local`, and what they
    /// activate; `None`: all-zero caps (no device, or opted out).
    fn offer(&self, local: IpAddr) -> Option<(ConnCaps, Box<dyn PendingLink>)>;
}

/// How comm links offer caps: all-zero (TCP only, the default) or through a [`LinkUpgrade`].
#[derive(Clone, Default)]
pub struct CommTransport(Option<Arc<dyn LinkUpgrade>>);

impl CommTransport {
    /// All-zero caps: the link stays on TCP.
    pub fn tcp() -> CommTransport {
        CommTransport(None)
    }

    /// Caps offered through `upgrade`.
    pub fn with(upgrade: Arc<dyn LinkUpgrade>) -> CommTransport {
        CommTransport(Some(upgrade))
    }

    /// The caps to send on `tcp`, and the link stream that applies the peer's. A TLS link
    /// offers none: over RDMA its bytes would go unencrypted.
    pub(super) fn offer(&self, tcp: CommStream) -> (ConnCaps, LinkStream) {
        let pending = self
            .0
            .as_ref()
            .filter(|_| !tcp.is_tls())
            .and_then(|upgrade| {
                let local = tcp.socket().local_addr().ok()?;
                upgrade.offer(local.ip())
            });
        let (caps, pending) = match pending {
            Some((caps, pending)) => (caps, Some(pending)),
            None => ([0; 24], None),
        };
        (
            caps,
            LinkStream {
                tcp,
                pending,
                switched: None,
            },
        )
    }
}

impl fmt::Debug for CommTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "CommTransport(caps offered)"
        } else {
            "CommTransport(tcp)"
        })
    }
}

impl PartialEq for CommTransport {
    fn eq(&self, other: &CommTransport) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for CommTransport {}

/// One comm socket: TCP (or TLS over it), and after the caps exchange possibly another
/// transport.
pub(super) struct LinkStream {
    pub(super) tcp: CommStream,
    pending: Option<Box<dyn PendingLink>>,
    switched: Option<Box<dyn LinkTransport>>,
}

impl fmt::Debug for LinkStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkStream")
            .field("tcp", &self.tcp)
            .field("switched", &self.switched)
            .finish_non_exhaustive()
    }
}

impl LinkStream {
    /// Applies the peer's caps (the caps exchange is complete): switches when this side
    /// offered caps and activation with the peer's succeeds.
    pub(super) fn apply(&mut self, peer: &ConnCaps, timeout: Duration) {
        if let Some(pending) = self.pending.take() {
            self.switched = pending.activate(peer, self.tcp.socket(), timeout);
            if self.switched.is_some() {
                tracing::info!("comm link: switched to RDMA");
            }
        }
    }

    /// The TCP socket under it.
    pub(super) fn socket(&self) -> &TcpStream {
        self.tcp.socket()
    }

    /// Whether the link moved off TCP.
    pub(super) fn switched(&self) -> bool {
        self.switched.is_some()
    }

    /// The switched transport, if any.
    pub(super) fn transport(&mut self) -> Option<&mut Box<dyn LinkTransport>> {
        self.switched.as_mut()
    }
}
