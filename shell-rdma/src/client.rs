//! The client side (`ggml-rpc-client`): this side's caps for HELLO, and the switch once the
//! server answered with its own (§10.2: the client activates after reading the response).

use std::net::IpAddr;
use std::os::fd::BorrowedFd;

use proto_core::wire::ConnCaps;

use crate::caps::{RdmaCaps, TransportMode, CAPS_LEN};
use crate::framing::{Framer, Framing};
use crate::serve::RefusedError;
use crate::stream::{RdmaStream, StreamError, Timing};
use crate::sys::{IbvQueuePair, Prepared};
use crate::verbs::VerbsError;

/// Probes for a connection whose TCP local address is `local`: the caps to offer, and what
/// to activate if the server answers with caps. Without a device the client offers all-zero
/// caps (`--transport rdma`: an error instead).
pub fn offer(
    mode: TransportMode,
    local: IpAddr,
) -> Result<(ConnCaps, Option<Prepared>), RefusedError> {
    if !mode.probes() {
        return Ok(([0; CAPS_LEN], None));
    }
    match crate::sys::probe(local) {
        Ok(prepared) => Ok((prepared.caps().encode(), Some(prepared))),
        Err(error) if mode == TransportMode::Rdma => Err(RefusedError::NoDevice(error.to_string())),
        Err(error) => {
            tracing::debug!("RDMA probe: {error}; continuing with TCP");
            Ok(([0; CAPS_LEN], None))
        }
    }
}

/// After HELLO's response: the RDMA link when both sides offered caps and activation
/// succeeded, `None` to stay on TCP (the probed resources are released).
pub fn switch(
    mode: TransportMode,
    prepared: Option<Prepared>,
    server: &ConnCaps,
    tcp: BorrowedFd<'_>,
) -> Result<Option<ClientLink>, RefusedError> {
    let (Some(prepared), Some(peer)) = (prepared, RdmaCaps::decode(server)) else {
        if mode == TransportMode::Rdma {
            return Err(RefusedError::PeerWithoutRdma);
        }
        return Ok(None);
    };
    let activated = tcp
        .try_clone_to_owned()
        .map_err(|source| VerbsError {
            call: "dup",
            source,
        })
        .and_then(|fd| prepared.activate(peer, fd));
    match activated {
        Ok(verbs) => Ok(Some(ClientLink {
            stream: RdmaStream::new(verbs, Timing::default()),
            framer: Framer::new(Framing::Request),
        })),
        Err(error) if mode == TransportMode::Rdma => Err(RefusedError::Activate(error.to_string())),
        Err(error) => {
            tracing::warn!("RDMA activate failed, staying on TCP: {error}");
            Ok(None)
        }
    }
}

/// A client connection's RDMA stream (blocking calls).
pub struct ClientLink {
    stream: RdmaStream<IbvQueuePair>,
    framer: Framer,
}

impl std::fmt::Debug for ClientLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLink").finish_non_exhaustive()
    }
}

impl ClientLink {
    /// Writes the next bytes of the request stream, cut as every reference server reads.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), StreamError> {
        let stream = &mut self.stream;
        self.framer.feed(bytes, &mut |w| stream.send(w))
    }

    /// Reads what arrives (at least one byte), waiting at most the stall bound: the client
    /// only reads when a response is owed.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, StreamError> {
        let stall = self.stream.stall();
        match self.stream.recv(buf, stall)? {
            Some(n) => Ok(n),
            None => Err(StreamError::Stalled(stall)),
        }
    }
}
