//! The server-to-server comm link of protocol 8.0.0 (PROTOCOL.md §6.1, §6.2, §6.4) on TCP
//! (async-io; the same addressing, retries and timeouts as the tokio shell's).
//!
//! The byte-level work is done by the sans-IO machines of [`proto_core::comm`]
//! ([`Handshake`], [`PairwiseAllReduce`]); this module only opens the socket and moves bytes.
//! Each machine's current receive is read with exactly the length it still wants, so nothing
//! belonging to the next stage (the next all-reduce) is ever read early, and each of its
//! transmits is one write.
//!
//! Addressing follows the reference: rank 0 listens on `0.0.0.0:port` and accepts one peer,
//! rank 1 connects to `host:port`, retrying 100 times at 50 ms intervals. Unlike the reference
//! (gap G13), accepting and every exchange are bounded by a timeout, so a missing or silent peer
//! fails the command instead of hanging the connection forever. Only the 8.0.0 link exists here:
//! exactly two ranks, caps exchange only, pairwise all-reduce; both ends stay on TCP (all-zero
//! caps).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use async_io::{Async, Timer};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use proto_core::comm::{
    CommError, Handshake, HandshakeEvent, LinkVariant, PairwiseAllReduce, WireFormat,
};
use proto_core::wire::CommInitRequest;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};

/// How often rank 1 tries to connect to rank 0, and how long it waits between tries.
const CONNECT_TRIES: u32 = 100;
const CONNECT_PAUSE: Duration = Duration::from_millis(50);

/// Why a comm link could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The link's byte stream broke the protocol, or the request cannot be served.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The peer did not connect or answer in time.
    #[error("comm link timed out after {0:?}")]
    Timeout(Duration),
    /// A request this link cannot serve (port out of range, empty host...).
    #[error("{0}")]
    Unsupported(String),
    /// The peer sent bytes the exchange does not expect now.
    #[error("the peer sent data out of turn")]
    OutOfTurn,
}

impl From<LinkError> for proto_core::Error {
    fn from(error: LinkError) -> proto_core::Error {
        proto_core::Error::Comm(error.to_string())
    }
}

/// An established link to the other rank of a device's communicator.
#[derive(Debug)]
pub struct CommLink {
    stream: Async<TcpStream>,
    rank: u32,
    timeout: Duration,
}

impl CommLink {
    /// This server's rank (0 or 1).
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Sets up the link that COMM_INIT asks for (world must be 2: the 8.0.0 link).
    pub async fn establish(
        request: &CommInitRequest,
        timeout: Duration,
    ) -> Result<CommLink, LinkError> {
        let port = u16::try_from(request.port)
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| LinkError::Unsupported(format!("invalid port {}", request.port)))?;
        let (stream, mut handshake) = if request.rank == 0 {
            let handshake = Handshake::acceptor(LinkVariant::V8_0, request.world, [0; 24])?;
            (accept_peer(port, timeout).await?, handshake)
        } else {
            let handshake =
                Handshake::connector(LinkVariant::V8_0, request.rank, request.world, [0; 24])?;
            let host = request.host_str();
            if host.is_empty() {
                return Err(LinkError::Unsupported("rank > 0 without a host".into()));
            }
            (connect_peer(&host, port).await?, handshake)
        };
        stream.get_ref().set_nodelay(true)?;
        shell_common::tune_or_log(stream.get_ref());
        let mut link = CommLink {
            stream,
            rank: request.rank,
            timeout,
        };
        let exchange = async {
            loop {
                while let Some(transmit) = handshake.poll_transmit() {
                    link.stream.write_all(&transmit.data).await?;
                }
                while let Some(HandshakeEvent::CapsExchanged { .. }) = handshake.poll_event() {
                    // Both ends announce all-zero caps: the link stays on TCP.
                }
                if handshake.is_done() {
                    return Ok::<(), LinkError>(());
                }
                let wanted = handshake.wanted();
                let data = read_up_to(&mut link.stream, wanted).await?;
                if data.is_empty() {
                    handshake.handle_close()?;
                    return Err(CommError::ConnectionClosed { peer: None }.into());
                }
                offer(&data, |piece| handshake.handle_input(piece))?;
            }
        };
        within(timeout, exchange).await?;
        Ok(link)
    }

    /// The pairwise all-reduce of one tensor: sends this rank's partial, receives the peer's,
    /// returns the sums (rank 0 sends first, rank 1 receives first, as the reference).
    pub async fn allreduce(&mut self, local: Vec<f32>) -> Result<Vec<f32>, LinkError> {
        let format = WireFormat::select(true, local.len() as u64);
        let mut machine = PairwiseAllReduce::new(self.rank, local, format)?;
        let stream = &mut self.stream;
        let exchange = async {
            loop {
                while let Some(transmit) = machine.poll_transmit() {
                    stream.write_all(&transmit.data).await?;
                }
                if machine.is_done() {
                    return Ok::<(), LinkError>(());
                }
                let data = read_up_to(stream, machine.wanted()).await?;
                if data.is_empty() {
                    machine.handle_close()?;
                    return Err(CommError::ConnectionClosed { peer: None }.into());
                }
                offer(&data, |piece| machine.handle_input(piece))?;
            }
        };
        within(self.timeout, exchange).await?;
        Ok(machine.into_result()?)
    }
}

/// Rank 0: listens on `0.0.0.0:port` and accepts the one peer.
async fn accept_peer(port: u16, timeout: Duration) -> Result<Async<TcpStream>, LinkError> {
    // std sets SO_REUSEADDR on Unix listeners, as the tokio shell does explicitly.
    let listener = Async::<TcpListener>::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
    let (stream, peer) = within(timeout, async { Ok(listener.accept().await?) }).await?;
    tracing::info!(%peer, port, "comm link: peer connected");
    Ok(stream)
}

/// Rank 1: connects to rank 0, retrying while it is not listening yet.
async fn connect_peer(host: &str, port: u16) -> Result<Async<TcpStream>, LinkError> {
    let mut last = None;
    for _ in 0..CONNECT_TRIES {
        match connect(host, port).await {
            Ok(stream) => {
                tracing::info!(host, port, "comm link: connected to rank 0");
                return Ok(stream);
            }
            Err(error) => last = Some(error),
        }
        Timer::after(CONNECT_PAUSE).await;
    }
    Err(last
        .unwrap_or_else(|| std::io::ErrorKind::TimedOut.into())
        .into())
}

async fn connect(host: &str, port: u16) -> std::io::Result<Async<TcpStream>> {
    let target = (host.to_owned(), port);
    let addrs: Vec<SocketAddr> =
        blocking::unblock(move || target.to_socket_addrs().map(Iterator::collect)).await?;
    let mut last = None;
    for addr in addrs {
        match Async::<TcpStream>::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into()))
}

/// Reads at most `max` bytes (at least one unless EOF); empty at EOF.
async fn read_up_to(stream: &mut Async<TcpStream>, max: usize) -> Result<Vec<u8>, LinkError> {
    let mut buf = vec![0u8; max.max(1)];
    let n = stream.read(&mut buf).await?;
    buf.truncate(n);
    Ok(buf)
}

/// Offers `data` until the machine consumed all of it (it never reads past what it wants).
fn offer(
    data: &[u8],
    mut handle: impl FnMut(&[u8]) -> Result<usize, CommError>,
) -> Result<(), LinkError> {
    let mut rest = data;
    while !rest.is_empty() {
        let consumed = handle(rest)?;
        if consumed == 0 {
            return Err(LinkError::OutOfTurn);
        }
        rest = rest.get(consumed..).unwrap_or_default();
    }
    Ok(())
}

async fn within<T>(
    timeout: Duration,
    future: impl std::future::Future<Output = Result<T, LinkError>>,
) -> Result<T, LinkError> {
    futures_lite::future::or(future, async {
        Timer::after(timeout).await;
        Err(LinkError::Timeout(timeout))
    })
    .await
}
