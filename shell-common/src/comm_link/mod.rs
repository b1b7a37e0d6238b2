//! The server-to-server link (PROTOCOL.md §6) on blocking TCP: the one comm link of every shell.
//!
//! The byte-level work is done by the sans-IO machines of [`proto_core::comm`]; this module
//! opens the sockets and moves bytes on blocking `std::net` sockets, every wait bounded by the
//! comm timeout. Shells run it where blocking stalls no other client (the driver announces it
//! as [`Action::Comm`](proto_core::driver::Action::Comm)).
//!
//! * [`pairwise`]: the 8.0.0 set-up (world 2) and the pairwise all-reduce.
//! * `ranked`: the newest upstream set-up (any world): rank messages, the vote, the backend
//!   communicator or the pairwise fallback.
//! * `io`: the bounded socket steps both share.

mod io;
pub mod pairwise;
pub mod peers;
mod ranked;
mod secure;
pub mod transport;
#[cfg(test)]
mod transport_tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proto_core::backend::Communicator;
use proto_core::comm::{CommError, LinkVariant};
use proto_core::driver::{CommWork, Connection};
use proto_core::wire::CommInitRequest;

pub use pairwise::CommLink;
pub use peers::CommPeers;
pub use secure::CommTls;
pub use transport::{CommTransport, LinkTransport, LinkUpgrade, PendingLink};

use crate::remote_copy::{self, PeerAllowList};
use crate::tls::ClientTls;

/// How a connection's comm links are set up (and where remote copies may go).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommSettings {
    /// The link's wire form: the 8.0.0 link, or the newest upstream's ranked link.
    pub variant: LinkVariant,
    /// Whether this server votes for its backend's communicator where the backend offers one
    /// (`GGML_RPC_NO_BACKEND_COMMUNICATOR` turns it off, as in the reference).
    pub backend_communicator: bool,
    /// Bound on every wait for a peer: set-up, each bootstrap exchange, each all-reduce,
    /// each step of a remote copy.
    pub timeout: Duration,
    /// Where comm links may connect to and accept from.
    pub peers: CommPeers,
    /// The servers REMOTE_COPY_TENSOR may push to (`--peer`).
    pub copy_peers: Arc<PeerAllowList>,
    /// TLS for those pushes when this server runs with TLS (its own certificate as the
    /// client's; the peer's verified against its `--tls-client-ca`).
    pub copy_tls: Option<ClientTls>,
    /// TLS for every comm-link connection when this server runs with TLS (the same
    /// certificate, key and CA; both ends verify the other).
    pub tls: Option<CommTls>,
    /// Whether comm sockets offer RDMA caps (`--transport auto|rdma`) and switch when the
    /// peer offers them too, as the reference's comm link does.
    pub transport: CommTransport,
}

/// One device's comm state.
#[derive(Debug)]
enum Link {
    /// A socket to the one other rank.
    Pairwise(CommLink),
    /// The backend's own communicator.
    Communicator(Box<dyn Communicator>),
}

/// The comm links of one client connection, one per device, and the work the driver asks of
/// them. Blocks: run it off the event loop. Dropping it closes every link.
#[derive(Debug)]
pub struct CommLinks {
    links: HashMap<u32, Link>,
    settings: CommSettings,
}

impl CommLinks {
    /// No links yet.
    pub fn new(settings: CommSettings) -> CommLinks {
        CommLinks {
            links: HashMap::new(),
            settings,
        }
    }

    /// Runs [`Action::Comm`](proto_core::driver::Action::Comm) work for `conn`. COMM_INIT's
    /// failure is the soft answer `ok = 0`; COMM_ALLREDUCE's closes the connection, as in the
    /// reference.
    pub fn run(&mut self, work: CommWork, conn: &mut Connection) -> proto_core::Result<()> {
        match work {
            CommWork::Init(request) => {
                let device = request.device;
                let ok = match self.establish(&request, conn) {
                    Ok(link) => {
                        tracing::info!(
                            device,
                            rank = request.rank,
                            world = request.world,
                            "comm link ready"
                        );
                        self.links.insert(device, link);
                        true
                    }
                    Err(error) => {
                        tracing::warn!(%error, device, rank = request.rank, world = request.world, "COMM_INIT failed");
                        false
                    }
                };
                conn.comm_init_done(device, ok)
            }
            CommWork::Allreduce {
                device,
                at,
                elements,
            } => {
                tracing::debug!(device, elements, "COMM_ALLREDUCE");
                let backend = conn.backend().clone();
                let result = match self.links.get_mut(&device) {
                    None => Err(CommError::NoCommunicator { device }.into()),
                    Some(Link::Communicator(communicator)) => {
                        communicator.allreduce(&*backend, at, elements)
                    }
                    Some(Link::Pairwise(link)) => {
                        let len = usize::try_from(elements)
                            .ok()
                            .and_then(|n| n.checked_mul(4))
                            .ok_or(proto_core::Error::SizeOverflow("all-reduce tensor"))?;
                        let mut bytes = vec![0u8; len];
                        backend.read(at, &mut bytes)?;
                        let local: Vec<f32> = bytes
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect();
                        link.allreduce(local).map_err(Into::into).and_then(|sums| {
                            for (out, value) in bytes.chunks_exact_mut(4).zip(&sums) {
                                out.copy_from_slice(&value.to_le_bytes());
                            }
                            backend.write(at, &bytes)
                        })
                    }
                };
                if result.is_err() {
                    // A failed exchange leaves the peers out of step: the link is gone.
                    self.links.remove(&device);
                }
                result
            }
            CommWork::Free { device } => {
                if self.links.remove(&device).is_some() {
                    tracing::info!(device, "comm link closed");
                }
                Ok(())
            }
            CommWork::RemoteCopy(work) => {
                let backend = conn.backend().clone();
                let endpoint = work.request.endpoint_str().unwrap_or("?").to_owned();
                let bytes = work.request.size;
                let status = match remote_copy::push(
                    &work,
                    &*backend,
                    &self.settings.copy_peers,
                    self.settings.copy_tls.as_ref(),
                    self.settings.timeout,
                ) {
                    Ok(()) => {
                        tracing::info!(%endpoint, bytes, "remote copy done");
                        proto_core::wire::RemoteCopyStatus::Ok
                    }
                    Err(error) => {
                        tracing::warn!(%error, %endpoint, bytes, "REMOTE_COPY_TENSOR failed");
                        error.status()
                    }
                };
                conn.remote_copy_done(status)
            }
        }
    }

    fn establish(&self, request: &CommInitRequest, conn: &Connection) -> proto_core::Result<Link> {
        let timeout = self.settings.timeout;
        match self.settings.variant {
            LinkVariant::V8_0 => Ok(Link::Pairwise(CommLink::establish(
                request,
                timeout,
                &self.settings.peers,
                self.settings.tls.as_ref(),
                &self.settings.transport,
            )?)),
            LinkVariant::Ranked => {
                let backend = &**conn.backend();
                let vote = self.settings.backend_communicator
                    && backend.communicator_available(request.device);
                Ok(
                    match ranked::establish(request, backend, vote, &self.settings)? {
                        ranked::Ranked::Pairwise(link) => Link::Pairwise(link),
                        ranked::Ranked::Communicator(communicator) => {
                            Link::Communicator(communicator)
                        }
                    },
                )
            }
        }
    }
}
