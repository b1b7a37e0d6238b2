//! Blocking socket steps every comm link stage shares, each bounded by a deadline.

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use proto_core::backend::Side;
use proto_core::comm::{CommError, Transmit};

use super::secure::{secure, CommStream, CommTls};
use super::transport::LinkStream;
use super::CommPeers;

/// The reference's connect retries: 100 tries, 50 ms apart.
const CONNECT_TRIES: u32 = 100;
const CONNECT_PAUSE: Duration = Duration::from_millis(50);
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// Rank 0's listening socket on `0.0.0.0:port` (std sets SO_REUSEADDR on Unix, as the
/// reference does).
pub(super) fn listen(port: u16) -> Result<TcpListener, CommError> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Accepts the next connection from an allowed peer before `deadline`; others are closed at
/// once, with a log line. With `tls` the peer must complete the handshake with a certificate of
/// our CA (within the timeout); a peer that does not fails the set-up.
pub(super) fn accept(
    listener: &TcpListener,
    deadline: Instant,
    timeout: Duration,
    peers: &CommPeers,
    tls: Option<&CommTls>,
) -> Result<CommStream, CommError> {
    loop {
        match listener.accept() {
            Ok((_, peer)) if !peers.allows(peer.ip()) => {
                tracing::warn!(%peer, "comm link: connection refused (not in --comm-peers)");
            }
            Ok((stream, peer)) => {
                stream.set_nonblocking(false)?;
                prepare(&stream, timeout)?;
                let peer_ip = peer.ip().to_string();
                let stream = secure(stream, Side::Accepted, &peer_ip, tls, deadline, timeout)
                    .inspect_err(|error| {
                        tracing::warn!(%peer, %error, "comm link: peer refused");
                    })?;
                tracing::info!(%peer, tls = tls.is_some(), "comm link: peer connected");
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

/// Connects to `host:port`, retrying while nothing listens there yet (as the reference: 100
/// tries, 50 ms apart), never past `deadline`; only to addresses `peers` allows. With `tls`
/// the peer's certificate must be of our CA and name `host`.
pub(super) fn connect(
    host: &str,
    port: u16,
    deadline: Instant,
    timeout: Duration,
    peers: &CommPeers,
    tls: Option<&CommTls>,
) -> Result<CommStream, CommError> {
    let resolved: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()?
        .filter(SocketAddr::is_ipv4)
        .collect();
    let addrs: Vec<SocketAddr> = resolved
        .iter()
        .copied()
        .filter(|addr| peers.allows(addr.ip()))
        .collect();
    if let (true, Some(refused)) = (addrs.is_empty(), resolved.first()) {
        return Err(CommError::PeerNotAllowed { ip: refused.ip() });
    }
    let mut last = io::Error::from(io::ErrorKind::AddrNotAvailable);
    for _ in 0..CONNECT_TRIES {
        for addr in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(timeout));
            }
            match TcpStream::connect_timeout(addr, left) {
                Ok(stream) => {
                    prepare(&stream, timeout)?;
                    let stream = secure(stream, Side::Connected, host, tls, deadline, timeout)
                        .inspect_err(|error| {
                            tracing::warn!(%addr, %error, "comm link: peer refused");
                        })?;
                    tracing::info!(%addr, tls = tls.is_some(), "comm link: connected");
                    return Ok(stream);
                }
                Err(error) => last = error,
            }
        }
        std::thread::sleep(CONNECT_PAUSE);
    }
    Err(last.into())
}

/// TCP_NODELAY as the reference, the shared socket tuning, and a bound on every write (a
/// stalled peer would otherwise block a full send buffer forever).
fn prepare(stream: &TcpStream, timeout: Duration) -> Result<(), CommError> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(timeout))?;
    crate::tune_or_log(stream);
    Ok(())
}

/// Writes one transmit (the reference's send + flush), over the link's transport.
pub(super) fn write(
    stream: &mut LinkStream,
    transmit: &Transmit,
    timeout: Duration,
) -> Result<(), CommError> {
    match stream.transport() {
        Some(transport) => transport.write(&transmit.data),
        None => write_tcp(&mut stream.tcp, transmit, timeout),
    }
}

fn write_tcp(
    stream: &mut CommStream,
    transmit: &Transmit,
    timeout: Duration,
) -> Result<(), CommError> {
    // With TLS the flush hands the last record to the socket; on a socket it does nothing.
    let written = stream
        .write_all(&transmit.data)
        .and_then(|()| stream.flush());
    written.map_err(|error| {
        if matches!(
            error.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            timed_out(timeout)
        } else {
            error.into()
        }
    })
}

/// The most one read of the link takes: a machine's `wanted` is everything it still expects
/// (a whole all-reduce payload), and the read buffer is sized for one read, not for that.
const READ_CHUNK: usize = 1 << 20;

/// Reads at most `max` bytes (at least one unless EOF, at most [`READ_CHUNK`]) before
/// `deadline`, over the link's transport, into `buf` (kept by the caller from read to read,
/// grown to what one read takes, so no read allocates or zeroes); empty at EOF.
pub(super) fn read_up_to<'b>(
    stream: &mut LinkStream,
    max: usize,
    deadline: Instant,
    timeout: Duration,
    buf: &'b mut Vec<u8>,
) -> Result<&'b [u8], CommError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out(timeout));
    }
    let want = max.clamp(1, READ_CHUNK);
    if buf.len() < want {
        buf.resize(want, 0);
    }
    let room = &mut buf[..want];
    let stream = match stream.transport() {
        Some(transport) => {
            let n = transport.read_into(room, left)?;
            return Ok(&buf[..n]);
        }
        None => &mut stream.tcp,
    };
    match stream.read_by(room, deadline) {
        Ok(n) => Ok(&buf[..n]),
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
pub(super) fn offer(
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

pub(super) fn timed_out(timeout: Duration) -> CommError {
    CommError::Timeout {
        millis: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::super::secure::CommStream;
    use super::super::transport::CommTransport;
    use super::*;

    #[test]
    fn the_read_buffer_is_sized_for_one_read_not_for_everything_wanted() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (_, mut stream) = CommTransport::tcp().offer(CommStream::Plain(accepted));
        let timeout = Duration::from_secs(5);
        let mut buf = Vec::new();
        for round in 0..3u8 {
            peer.write_all(&[round; 10]).unwrap();
            // an all-reduce of a terabyte still to come: one read takes what arrived
            let deadline = Instant::now() + timeout;
            let got = read_up_to(&mut stream, 1 << 40, deadline, timeout, &mut buf).unwrap();
            assert_eq!(got, &[round; 10]);
            assert!(buf.len() <= READ_CHUNK, "{}", buf.len());
        }
        drop(peer);
        let deadline = Instant::now() + timeout;
        let got = read_up_to(&mut stream, 1 << 40, deadline, timeout, &mut buf).unwrap();
        assert!(got.is_empty(), "EOF reads empty");
    }
}
