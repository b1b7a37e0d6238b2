//! The newest upstream link (PROTOCOL.md §6.3, PR #28967; still announces 8.0.1): rank 0
//! accepts `world − 1` peers in any order, each names its rank, the ranks vote on a backend
//! communicator in a bootstrap exchange, and either every backend builds its communicator
//! through further exchanges (then the sockets close) or, at world 2, the pair keeps its one
//! socket for the pairwise all-reduce.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto_core::backend::{Backend, Bootstrap, Communicator, Duplex, SecuredStream, Side};
use proto_core::comm::{
    negotiate, path_offer, BootstrapExchange, CommError, Handshake, LinkVariant, Path, Rank0Event,
    Rank0Setup,
};
use proto_core::wire::CommInitRequest;

use super::pairwise::{drive_handshake, host_of, port_of, CommLink};
use super::secure::{secure_boxed, CommTls};
use super::transport::{CommTransport, LinkStream};
use super::{io, CommPeers, CommSettings};

/// Largest bootstrap exchange (all ranks' blocks together) a rank takes part in.
const EXCHANGE_LIMIT: usize = 1 << 20;

/// What a ranked set-up ends with.
pub(super) enum Ranked {
    /// At world 2 with a rank voting no: the pairwise link over the pair's socket.
    Pairwise(CommLink),
    /// Every rank voted yes: the backend's communicator (the comm sockets are closed).
    Communicator(Box<dyn Communicator>),
}

/// Sets up the link COMM_INIT asks for, voting `vote` (this backend offers a communicator and
/// the deployer did not turn it off).
pub(super) fn establish(
    request: &CommInitRequest,
    backend: &dyn Backend,
    vote: bool,
    settings: &CommSettings,
) -> proto_core::Result<Ranked> {
    let (timeout, peers, tls) = (settings.timeout, &settings.peers, settings.tls.as_ref());
    let port = port_of(request)?;
    let deadline = Instant::now() + timeout;
    let transport = &settings.transport;
    let mut star = if request.rank == 0 {
        Star::accept(
            port,
            request.world,
            deadline,
            timeout,
            peers,
            tls,
            transport,
        )?
    } else {
        // Checks the rank and world before anything is opened.
        Handshake::connector(LinkVariant::Ranked, request.rank, request.world, [0; 24])?;
        let host = host_of(request)?;
        let connected = io::connect(&host, port, deadline, timeout, peers, tls)?;
        let (caps, mut stream) = transport.offer(connected);
        let handshake =
            Handshake::connector(LinkVariant::Ranked, request.rank, request.world, caps)?;
        drive_handshake(&mut stream, handshake, deadline, timeout)?;
        Star::leaf(stream, request.rank, request.world, timeout, peers, tls)?
    };
    let votes = star.exchange(&[path_offer(vote)])?;
    match negotiate(&votes)? {
        Path::Pairwise => {
            tracing::info!(world = request.world, "comm link: pairwise path");
            let stream = star.streams.pop().ok_or(CommError::NotDone)?;
            Ok(Ranked::Pairwise(CommLink::new(
                stream,
                request.rank,
                timeout,
            )))
        }
        Path::BackendCommunicator => {
            tracing::info!(world = request.world, "comm link: backend communicator");
            let communicator = backend.communicator_init(request.device, &mut star)?;
            Ok(Ranked::Communicator(communicator))
        }
    }
}

/// The comm sockets of a group: on rank 0 one per peer, in rank order; on a rank above 0
/// the one to rank 0.
struct Star {
    rank: u32,
    world: u32,
    streams: Vec<LinkStream>,
    local_ip: Ipv4Addr,
    timeout: Duration,
    peers: CommPeers,
    tls: Option<CommTls>,
}

impl Star {
    /// Rank 0: accepts `world − 1` peers, one handshake at a time, filed by the rank each names.
    fn accept(
        port: u16,
        world: u32,
        deadline: Instant,
        timeout: Duration,
        peers: &CommPeers,
        tls: Option<&CommTls>,
        transport: &CommTransport,
    ) -> Result<Star, CommError> {
        let mut setup = Rank0Setup::new(LinkVariant::Ranked, world, [0; 24])?;
        let listener = io::listen(port)?;
        let mut current: Option<LinkStream> = None;
        let mut joined = BTreeMap::new();
        let mut buf = Vec::new();
        loop {
            let mut progressed = false;
            if let Some(stream) = current.as_mut() {
                while let Some(transmit) = setup.poll_transmit() {
                    io::write(stream, &transmit, timeout)?;
                    progressed = true;
                }
            }
            while let Some(event) = setup.poll_event() {
                progressed = true;
                match event {
                    Rank0Event::Accept => {
                        let accepted = io::accept(&listener, deadline, timeout, peers, tls)?;
                        let (caps, stream) = transport.offer(accepted);
                        current = Some(stream);
                        setup.handle_accepted_with(caps)?;
                    }
                    Rank0Event::CapsExchanged { peer_caps } => {
                        if let Some(stream) = current.as_mut() {
                            stream.apply(&peer_caps, timeout);
                        }
                    }
                    Rank0Event::PeerJoined { rank, .. } => {
                        let stream = current.take().ok_or(CommError::NotDone)?;
                        tracing::info!(rank, "comm link: rank joined");
                        joined.insert(rank, stream);
                    }
                }
            }
            if setup.is_done() {
                break;
            }
            if progressed {
                continue;
            }
            let wanted = setup.wanted();
            let stream = match current.as_mut() {
                Some(stream) if wanted > 0 => stream,
                _ => {
                    return Err(CommError::InvalidState {
                        operation: "rank 0 set-up waits on nothing",
                    })
                }
            };
            let data = io::read_up_to(stream, wanted, deadline, timeout, &mut buf)?;
            if data.is_empty() {
                setup.handle_close()?;
                return Err(CommError::ConnectionClosed { peer: None });
            }
            io::offer(data, |piece| setup.handle_input(piece))?;
        }
        let streams: Vec<LinkStream> = joined.into_values().collect();
        let local_ip = match streams
            .first()
            .map(|stream| stream.socket().local_addr())
            .transpose()?
        {
            Some(SocketAddr::V4(addr)) => *addr.ip(),
            _ => Ipv4Addr::LOCALHOST,
        };
        Ok(Star {
            rank: 0,
            world,
            streams,
            local_ip,
            timeout,
            peers: peers.clone(),
            tls: tls.cloned(),
        })
    }

    /// A rank above 0 with its socket to rank 0.
    fn leaf(
        stream: LinkStream,
        rank: u32,
        world: u32,
        timeout: Duration,
        peers: &CommPeers,
        tls: Option<&CommTls>,
    ) -> Result<Star, CommError> {
        let local_ip = match stream.socket().local_addr()? {
            SocketAddr::V4(addr) => *addr.ip(),
            SocketAddr::V6(_) => Ipv4Addr::LOCALHOST,
        };
        Ok(Star {
            rank,
            world,
            streams: vec![stream],
            local_ip,
            timeout,
            peers: peers.clone(),
            tls: tls.cloned(),
        })
    }

    /// The socket to `peer`.
    fn stream(&mut self, peer: u32) -> Result<&mut LinkStream, CommError> {
        let index = if self.rank == 0 {
            peer.checked_sub(1)
        } else {
            (peer == 0).then_some(0)
        };
        index
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.streams.get_mut(i))
            .ok_or(CommError::UnknownPeer { peer })
    }
}

impl Bootstrap for Star {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn world(&self) -> u32 {
        self.world
    }

    fn exchange(&mut self, block: &[u8]) -> Result<Vec<u8>, CommError> {
        let deadline = Instant::now() + self.timeout;
        let timeout = self.timeout;
        let mut exchange = BootstrapExchange::new(
            self.rank,
            self.world,
            Bytes::copy_from_slice(block),
            EXCHANGE_LIMIT,
        )?;
        let mut buf = Vec::new();
        loop {
            while let Some(transmit) = exchange.poll_transmit() {
                let stream = self.stream(transmit.peer.unwrap_or(0))?;
                io::write(stream, &transmit, timeout)?;
            }
            if exchange.is_done() {
                return Ok(exchange.into_result()?.into_bytes().to_vec());
            }
            // Rank 0 takes the peers' blocks in rank order, as the reference does.
            let from = (0..self.world)
                .find(|&peer| exchange.wanted(peer) > 0)
                .ok_or(CommError::InvalidState {
                    operation: "bootstrap exchange waits on nothing",
                })?;
            let wanted = exchange.wanted(from);
            let data = io::read_up_to(self.stream(from)?, wanted, deadline, timeout, &mut buf)?;
            if data.is_empty() {
                exchange.handle_close(from)?;
                return Err(CommError::ConnectionClosed { peer: Some(from) });
            }
            io::offer(data, |piece| exchange.handle_input(from, piece))?;
        }
    }

    fn local_ip(&self) -> Ipv4Addr {
        self.local_ip
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn peer_allowed(&self, ip: IpAddr) -> bool {
        self.peers.allows(ip)
    }

    fn secure(
        &self,
        socket: Box<dyn Duplex>,
        side: Side,
        peer: IpAddr,
    ) -> Result<SecuredStream, CommError> {
        secure_boxed(socket, side, peer, self.tls.as_ref(), self.timeout)
    }
}
