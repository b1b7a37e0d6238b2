//! The comm link over RDMA (PROTOCOL.md §6.2 step 4, §6.3 step 2, §10): each comm socket
//! offers caps probed for its local address, and once the caps are exchanged both servers
//! move the rest of the link (ranks, bootstrap exchanges, pairwise all-reduce payloads) to an
//! RC queue pair, as the reference does. A side without a device offers all-zero caps, and a
//! side whose peer offered none, or whose activation fails, stays on TCP ("RDMA activate
//! failed, staying on TCP"; the hazard of §10.2 applies as upstream).

use std::net::{IpAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto_core::comm::{CommError, ConnCaps};
use shell_common::comm_link::{CommTransport, LinkTransport, LinkUpgrade, PendingLink};

use crate::caps::{RdmaCaps, TransportMode};
use crate::stream::{RdmaStream, StreamError, Timing};
use crate::sys::{IbvQueuePair, Prepared};

/// The comm links' transport for `--transport`: caps offered unless `tcp`.
pub fn transport(mode: TransportMode) -> CommTransport {
    if mode.probes() {
        CommTransport::with(Arc::new(RdmaUpgrade))
    } else {
        CommTransport::tcp()
    }
}

/// Probes a device for each comm socket.
#[derive(Debug)]
struct RdmaUpgrade;

impl LinkUpgrade for RdmaUpgrade {
    fn offer(&self, local: IpAddr) -> Option<(ConnCaps, Box<dyn PendingLink>)> {
        match crate::sys::probe(local) {
            Ok(prepared) => Some((prepared.caps().encode(), Box::new(Pending(prepared)))),
            Err(error) => {
                tracing::debug!("comm link: RDMA probe: {error}; continuing with TCP");
                None
            }
        }
    }
}

struct Pending(Prepared);

impl PendingLink for Pending {
    fn activate(
        self: Box<Self>,
        peer: &ConnCaps,
        tcp: &TcpStream,
        timeout: Duration,
    ) -> Option<Box<dyn LinkTransport>> {
        let Some(peer) = RdmaCaps::decode(peer) else {
            tracing::info!("comm link: peer does not support RDMA, continuing with TCP");
            return None;
        };
        let activated = tcp
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| crate::verbs::VerbsError {
                call: "dup",
                source,
            })
            .and_then(|fd| self.0.activate(peer, fd));
        match activated {
            Ok(verbs) => {
                let timing = Timing {
                    stall: timeout,
                    ..Timing::default()
                };
                Some(Box::new(RdmaLink(RdmaStream::new(verbs, timing))))
            }
            Err(error) => {
                tracing::warn!("comm link: RDMA activate failed, staying on TCP: {error}");
                None
            }
        }
    }
}

/// A comm link's RDMA stream: each write as its own SENDs (the segmentation every
/// reference version reads), every wait bounded.
struct RdmaLink(RdmaStream<IbvQueuePair>);

impl std::fmt::Debug for RdmaLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RdmaLink").field(&self.0).finish()
    }
}

fn comm_error(error: StreamError) -> CommError {
    match error {
        StreamError::Stalled(within) => CommError::Timeout {
            millis: u64::try_from(within.as_millis()).unwrap_or(u64::MAX),
        },
        error => CommError::Transport {
            reason: error.to_string(),
        },
    }
}

impl LinkTransport for RdmaLink {
    fn write(&mut self, data: &[u8]) -> Result<(), CommError> {
        self.0.send(data).map_err(comm_error)
    }

    fn read_into(&mut self, buf: &mut [u8], within: Duration) -> Result<usize, CommError> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            return match self.0.recv(buf, left) {
                // A zero-length SEND carries nothing: wait on (0 means EOF here).
                Ok(Some(0)) if !left.is_zero() => continue,
                Ok(Some(0)) | Ok(None) => Err(comm_error(StreamError::Stalled(within))),
                Ok(Some(n)) => Ok(n),
                Err(StreamError::PeerGone) => Ok(0),
                Err(error) => Err(comm_error(error)),
            };
        }
    }
}
