//! The pairwise link between two ranks: the 8.0.0 set-up (PROTOCOL.md §6.2) and the
//! all-reduce exchange (§6.4), which the newest link also uses at world 2 when a rank votes
//! against a backend communicator.

use std::time::{Duration, Instant};

use proto_core::comm::{
    CommError, Handshake, HandshakeEvent, LinkVariant, PairwiseAllReduce, WireFormat,
};
use proto_core::wire::CommInitRequest;

use super::secure::CommTls;
use super::transport::{CommTransport, LinkStream};
use super::{io, CommPeers};

/// An established link to the other rank of a two-rank group.
#[derive(Debug)]
pub struct CommLink {
    stream: LinkStream,
    rank: u32,
    timeout: Duration,
    /// The read buffer, kept from one all-reduce to the next.
    read_buf: Vec<u8>,
}

impl CommLink {
    /// The link over `stream`, whose set-up is complete.
    pub(super) fn new(stream: LinkStream, rank: u32, timeout: Duration) -> CommLink {
        CommLink {
            stream,
            rank,
            timeout,
            read_buf: Vec::new(),
        }
    }

    /// This end's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Whether the link moved to RDMA after its caps exchange.
    pub fn switched(&self) -> bool {
        self.stream.switched()
    }

    /// Sets up the 8.0.0 link that COMM_INIT asks for (world 2 only): rank 0 accepts one
    /// peer, rank 1 connects; with `tls` the TLS handshake; then the caps exchange (with
    /// `transport`'s caps on a plain link: it switches to RDMA when both sides offered them).
    pub fn establish(
        request: &CommInitRequest,
        timeout: Duration,
        peers: &CommPeers,
        tls: Option<&CommTls>,
        transport: &CommTransport,
    ) -> Result<CommLink, CommError> {
        let port = port_of(request)?;
        let deadline = Instant::now() + timeout;
        let (mut stream, handshake) = if request.rank == 0 {
            // Checks the rank and world before anything is opened.
            Handshake::acceptor(LinkVariant::V8_0, request.world, [0; 24])?;
            let listener = io::listen(port)?;
            let accepted = io::accept(&listener, deadline, timeout, peers, tls)?;
            let (caps, stream) = transport.offer(accepted);
            let handshake = Handshake::acceptor(LinkVariant::V8_0, request.world, caps)?;
            (stream, handshake)
        } else {
            Handshake::connector(LinkVariant::V8_0, request.rank, request.world, [0; 24])?;
            let host = host_of(request)?;
            let connected = io::connect(&host, port, deadline, timeout, peers, tls)?;
            let (caps, stream) = transport.offer(connected);
            let handshake =
                Handshake::connector(LinkVariant::V8_0, request.rank, request.world, caps)?;
            (stream, handshake)
        };
        drive_handshake(&mut stream, handshake, deadline, timeout)?;
        Ok(CommLink::new(stream, request.rank, timeout))
    }

    /// The pairwise all-reduce of one tensor; returns the sums.
    pub fn allreduce(&mut self, local: Vec<f32>) -> Result<Vec<f32>, CommError> {
        let format = WireFormat::select(true, local.len() as u64);
        let mut machine = PairwiseAllReduce::new(self.rank, local, format)?;
        loop {
            while let Some(transmit) = machine.poll_transmit() {
                io::write(&mut self.stream, &transmit, self.timeout)?;
            }
            if machine.is_done() {
                break;
            }
            // Each wait is bounded, not the whole exchange: a large tensor on a slow link that
            // keeps moving may take longer than the timeout.
            let deadline = Instant::now() + self.timeout;
            let wanted = machine.wanted();
            let data = io::read_up_to(
                &mut self.stream,
                wanted,
                deadline,
                self.timeout,
                &mut self.read_buf,
            )?;
            if data.is_empty() {
                machine.handle_close()?;
                return Err(CommError::ConnectionClosed { peer: None });
            }
            io::offer(data, |piece| machine.handle_input(piece))?;
        }
        machine.into_result()
    }
}

/// COMM_INIT's port, which must be a TCP port.
pub(super) fn port_of(request: &CommInitRequest) -> Result<u16, CommError> {
    u16::try_from(request.port)
        .ok()
        .filter(|&p| p != 0)
        .ok_or(CommError::InvalidPort { port: request.port })
}

/// Rank 0's host, which a rank above 0 must be given.
pub(super) fn host_of(request: &CommInitRequest) -> Result<String, CommError> {
    let host = request.host_str();
    if host.is_empty() {
        return Err(CommError::NoHost { rank: request.rank });
    }
    Ok(host)
}

/// Runs one side's handshake on `stream` to its end, applying the peer's caps once they are
/// exchanged (the bytes after them go over RDMA when the link switched).
pub(super) fn drive_handshake(
    stream: &mut LinkStream,
    mut handshake: Handshake,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), CommError> {
    let mut buf = Vec::new();
    loop {
        let mut progressed = false;
        while let Some(transmit) = handshake.poll_transmit() {
            io::write(stream, &transmit, timeout)?;
            progressed = true;
        }
        // Taking an event (the caps were applied) may release the next transmit.
        while let Some(HandshakeEvent::CapsExchanged { peer_caps }) = handshake.poll_event() {
            stream.apply(&peer_caps, timeout);
            progressed = true;
        }
        if handshake.is_done() {
            return Ok(());
        }
        if progressed {
            continue;
        }
        let data = io::read_up_to(stream, handshake.wanted(), deadline, timeout, &mut buf)?;
        if data.is_empty() {
            handshake.handle_close()?;
            return Err(CommError::ConnectionClosed { peer: None });
        }
        io::offer(data, |piece| handshake.handle_input(piece))?;
    }
}
