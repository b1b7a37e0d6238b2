//! The protocol-8.0.0 server-to-server link (PROTOCOL.md §6.1, §6.2, §6.4) on blocking TCP.
//!
//! The one comm link of every shell. The byte-level work is done by the sans-IO machines of
//! [`proto_core::comm`]; this module only opens the socket and moves bytes, on blocking
//! `std::net` sockets. Shells run it where blocking stalls no other client (the driver announces
//! it as [`Action::Comm`](proto_core::driver::Action::Comm)). Rank 0 listens on `0.0.0.0:port`
//! and accepts one peer, rank 1 connects to `host:port` (100 tries, 50 ms apart); accepting and
//! each exchange are bounded by the comm timeout.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use proto_core::backend::Backend;
use proto_core::comm::{
    CommError, Handshake, HandshakeEvent, LinkVariant, PairwiseAllReduce, WireFormat,
};
use proto_core::driver::{CommWork, Connection};
use proto_core::wire::CommInitRequest;

const CONNECT_TRIES: u32 = 100;
const CONNECT_PAUSE: Duration = Duration::from_millis(50);
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// An established link to the other rank of a device's communicator.
#[derive(Debug)]
pub struct CommLink {
    stream: TcpStream,
    rank: u32,
    timeout: Duration,
}

impl CommLink {
    /// This end's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Sets up the link that COMM_INIT asks for (world 2: the 8.0.0 link).
    pub fn establish(request: &CommInitRequest, timeout: Duration) -> Result<CommLink, CommError> {
        let port = u16::try_from(request.port)
            .ok()
            .filter(|&p| p != 0)
            .ok_or(CommError::InvalidPort { port: request.port })?;
        let (stream, mut handshake) = if request.rank == 0 {
            let handshake = Handshake::acceptor(LinkVariant::V8_0, request.world, [0; 24])?;
            (accept_peer(port, timeout)?, handshake)
        } else {
            let handshake =
                Handshake::connector(LinkVariant::V8_0, request.rank, request.world, [0; 24])?;
            let host = request.host_str();
            if host.is_empty() {
                return Err(CommError::NoHost { rank: request.rank });
            }
            (connect_peer(&host, port)?, handshake)
        };
        stream.set_nodelay(true)?;
        crate::tune_or_log(&stream);
        let mut link = CommLink {
            stream,
            rank: request.rank,
            timeout,
        };
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(transmit) = handshake.poll_transmit() {
                link.stream.write_all(&transmit.data)?;
            }
            while let Some(HandshakeEvent::CapsExchanged { .. }) = handshake.poll_event() {
                // Both ends announce all-zero caps: the link stays on TCP.
            }
            if handshake.is_done() {
                return Ok(link);
            }
            let data = read_up_to(&mut link.stream, handshake.wanted(), deadline, timeout)?;
            if data.is_empty() {
                handshake.handle_close()?;
                return Err(CommError::ConnectionClosed { peer: None });
            }
            offer(&data, |piece| handshake.handle_input(piece))?;
        }
    }

    /// The pairwise all-reduce of one tensor; returns the sums.
    pub fn allreduce(&mut self, local: Vec<f32>) -> Result<Vec<f32>, CommError> {
        let format = WireFormat::select(true, local.len() as u64);
        let mut machine = PairwiseAllReduce::new(self.rank, local, format)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            while let Some(transmit) = machine.poll_transmit() {
                self.stream.write_all(&transmit.data)?;
            }
            if machine.is_done() {
                break;
            }
            let data = read_up_to(&mut self.stream, machine.wanted(), deadline, self.timeout)?;
            if data.is_empty() {
                machine.handle_close()?;
                return Err(CommError::ConnectionClosed { peer: None });
            }
            offer(&data, |piece| machine.handle_input(piece))?;
        }
        machine.into_result()
    }
}

/// The comm links of one client connection, one per device, and the work the driver asks of
/// them. Blocks: run it off the event loop.
#[derive(Debug)]
pub struct CommLinks {
    links: HashMap<u32, CommLink>,
    timeout: Duration,
}

impl CommLinks {
    /// No links yet; every wait on a peer is bounded by `timeout`.
    pub fn new(timeout: Duration) -> CommLinks {
        CommLinks {
            links: HashMap::new(),
            timeout,
        }
    }

    /// Runs [`Action::Comm`](proto_core::driver::Action::Comm) work for `conn`. COMM_INIT's
    /// failure is the soft answer `ok = 0`; COMM_ALLREDUCE's closes the connection, as in the
    /// reference.
    pub fn run<B: Backend + ?Sized>(
        &mut self,
        work: CommWork,
        conn: &mut Connection<B>,
    ) -> proto_core::Result<()> {
        match work {
            CommWork::Init(request) => {
                let device = request.device;
                let ok = match CommLink::establish(&request, self.timeout) {
                    Ok(link) => {
                        tracing::info!(device, rank = link.rank(), "comm link ready");
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
                let link = self
                    .links
                    .get_mut(&device)
                    .ok_or(CommError::NoCommunicator { device })?;
                let len = usize::try_from(elements)
                    .ok()
                    .and_then(|n| n.checked_mul(4))
                    .ok_or(proto_core::Error::SizeOverflow("all-reduce tensor"))?;
                let backend = conn.backend().clone();
                let mut bytes = vec![0u8; len];
                backend.read(at, &mut bytes)?;
                let local: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let sums = link.allreduce(local)?;
                for (out, value) in bytes.chunks_exact_mut(4).zip(&sums) {
                    out.copy_from_slice(&value.to_le_bytes());
                }
                backend.write(at, &bytes)
            }
            CommWork::Free { device } => {
                if self.links.remove(&device).is_some() {
                    tracing::info!(device, "comm link closed");
                }
                Ok(())
            }
        }
    }
}

/// Rank 0: listens on `0.0.0.0:port` and accepts the one peer before `timeout`.
fn accept_peer(port: u16, timeout: Duration) -> Result<TcpStream, CommError> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(false)?;
                tracing::info!(%peer, port, "comm link: peer connected");
                return Ok(stream);
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(timed_out(timeout));
                }
                std::thread::sleep(ACCEPT_POLL);
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Rank 1: connects to rank 0, retrying while it is not listening yet.
fn connect_peer(host: &str, port: u16) -> Result<TcpStream, CommError> {
    let mut last = None;
    for _ in 0..CONNECT_TRIES {
        match TcpStream::connect((host, port)) {
            Ok(stream) => {
                tracing::info!(host, port, "comm link: connected to rank 0");
                return Ok(stream);
            }
            Err(error) => last = Some(error),
        }
        std::thread::sleep(CONNECT_PAUSE);
    }
    Err(last
        .unwrap_or_else(|| io::ErrorKind::TimedOut.into())
        .into())
}

/// Reads at most `max` bytes (at least one unless EOF) before `deadline`; empty at EOF.
fn read_up_to(
    stream: &mut TcpStream,
    max: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<u8>, CommError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out(timeout));
    }
    stream.set_read_timeout(Some(left))?;
    let mut buf = vec![0u8; max.max(1)];
    match stream.read(&mut buf) {
        Ok(n) => {
            buf.truncate(n);
            Ok(buf)
        }
        Err(error)
            if matches!(
                error.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(timed_out(timeout))
        }
        Err(error) => Err(error.into()),
    }
}

/// Offers `data` until the machine consumed all of it (it never reads past what it wants).
fn offer(
    data: &[u8],
    mut handle: impl FnMut(&[u8]) -> Result<usize, CommError>,
) -> Result<(), CommError> {
    let mut rest = data;
    while !rest.is_empty() {
        let consumed = handle(rest)?;
        if consumed == 0 {
            return Err(CommError::OutOfTurn);
        }
        rest = rest.get(consumed..).unwrap_or_default();
    }
    Ok(())
}

fn timed_out(timeout: Duration) -> CommError {
    CommError::Timeout {
        millis: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    }
}
