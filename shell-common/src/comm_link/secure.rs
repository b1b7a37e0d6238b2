//! TLS on the comm link: when the server runs with `--tls-*`, every connection between servers
//! (the set-up sockets, the pairwise all-reduce, a backend communicator's own connections) is
//! TLS 1.3 with the server's certificate and key, and both ends verify the other's certificate
//! against `--tls-client-ca`: the accepting end as a TLS server requiring a client
//! certificate, the connecting end as a TLS client presenting the server's certificate and
//! checking the peer's for the address it connected to. Without TLS the socket is used as is,
//! byte for byte the reference's link.
//!
//! The handshake runs before any byte of the link, its every wait bounded by the comm timeout
//! (in total, not per read). rustls's blocking `StreamOwned` carries the records afterwards;
//! the link reads through [`CommStream::read_by`], which ends by its deadline however slowly a
//! peer delivers a record (`StreamOwned`'s own read waits for a whole record, one socket read
//! after another, each bounded only by itself).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto_core::backend::{Duplex, SecuredStream, Side};
use proto_core::comm::CommError;
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ConnectionCommon, ServerConnection, SideData, StreamOwned};

use super::io::timed_out;
use crate::tls::ServerTls;

/// The comm link's TLS: the server's own configurations, as an acceptor (client certificates
/// required) and as a connector (its certificate presented as the client's).
#[derive(Clone)]
pub struct CommTls {
    acceptor: Arc<rustls::ServerConfig>,
    connector: Arc<rustls::ClientConfig>,
}

impl CommTls {
    /// The comm link's TLS of a server with `tls`: the same certificate, key and CA.
    pub fn new(tls: &ServerTls) -> CommTls {
        CommTls {
            acceptor: tls.config.clone(),
            connector: tls.client.0.clone(),
        }
    }
}

impl fmt::Debug for CommTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CommTls")
    }
}

impl PartialEq for CommTls {
    fn eq(&self, other: &CommTls) -> bool {
        Arc::ptr_eq(&self.acceptor, &other.acceptor)
            && Arc::ptr_eq(&self.connector, &other.connector)
    }
}

impl Eq for CommTls {}

/// A comm connection: the socket, or TLS over it.
pub(crate) enum CommStream {
    /// Without TLS: the reference's bytes.
    Plain(TcpStream),
    /// TLS, this end connected.
    Client(Box<StreamOwned<ClientConnection, TcpStream>>),
    /// TLS, this end accepted.
    Server(Box<StreamOwned<ServerConnection, TcpStream>>),
}

impl fmt::Debug for CommStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            CommStream::Plain(_) => "plain",
            CommStream::Client(_) => "TLS (connected)",
            CommStream::Server(_) => "TLS (accepted)",
        };
        f.debug_struct("CommStream")
            .field("kind", &kind)
            .field("socket", self.socket())
            .finish()
    }
}

impl CommStream {
    /// Whether it is TLS.
    pub(crate) fn is_tls(&self) -> bool {
        !matches!(self, CommStream::Plain(_))
    }

    /// The socket under it (for timeouts and addresses).
    pub(crate) fn socket(&self) -> &TcpStream {
        match self {
            CommStream::Plain(stream) => stream,
            CommStream::Client(tls) => &tls.sock,
            CommStream::Server(tls) => &tls.sock,
        }
    }
}

impl CommStream {
    /// Reads at most `buf.len()` bytes (at least one unless EOF: `Ok(0)`) by `deadline`: a
    /// peer that delivers a TLS record a byte at a time cannot hold the read past it.
    /// `TimedOut` once it has passed.
    pub(crate) fn read_by(&mut self, buf: &mut [u8], deadline: Instant) -> io::Result<usize> {
        match self {
            CommStream::Plain(stream) => {
                stream.set_read_timeout(Some(time_left(deadline)?))?;
                stream.read(buf)
            }
            CommStream::Client(tls) => read_tls_by(&mut tls.conn, &mut tls.sock, buf, deadline),
            CommStream::Server(tls) => read_tls_by(&mut tls.conn, &mut tls.sock, buf, deadline),
        }
    }
}

/// The time left to `deadline`, `TimedOut` if none.
fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::ErrorKind::TimedOut.into())
    } else {
        Ok(left)
    }
}

/// [`CommStream::read_by`] over TLS: plaintext already decrypted first; else one socket read
/// at a time, each bounded by the time left, until a record completes.
fn read_tls_by<D: SideData>(
    conn: &mut ConnectionCommon<D>,
    sock: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<usize> {
    loop {
        match conn.reader().read(buf) {
            Ok(n) => return Ok(n),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
        // What rustls has to say first (an alert, a key update's answer): the socket's write
        // timeout bounds it as any write of the link.
        while conn.wants_write() {
            conn.write_tls(sock)?;
        }
        sock.set_read_timeout(Some(time_left(deadline)?))?;
        if conn.read_tls(sock)? == 0 {
            // EOF without close_notify: the next `reader().read` says so
            conn.process_new_packets().map_err(io::Error::other)?;
            return match conn.reader().read(buf) {
                Ok(n) => Ok(n),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(error) => Err(error),
            };
        }
        conn.process_new_packets().map_err(io::Error::other)?;
    }
}

impl Read for CommStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            CommStream::Plain(stream) => stream.read(buf),
            CommStream::Client(tls) => tls.read(buf),
            CommStream::Server(tls) => tls.read(buf),
        }
    }
}

impl Write for CommStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            CommStream::Plain(stream) => stream.write(buf),
            CommStream::Client(tls) => tls.write(buf),
            CommStream::Server(tls) => tls.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            CommStream::Plain(stream) => stream.flush(),
            CommStream::Client(tls) => tls.flush(),
            CommStream::Server(tls) => tls.flush(),
        }
    }
}

/// Secures `stream` (this end is `side`; `peer` names the other end: the host the connecting
/// side asked for, whose certificate must carry it), the handshake over by `deadline` and at
/// most `timeout` from now. Without `tls` the socket as it is. Afterwards the socket's write
/// timeout is `timeout` again (reads set their own).
pub(crate) fn secure(
    stream: TcpStream,
    side: Side,
    peer: &str,
    tls: Option<&CommTls>,
    deadline: Instant,
    timeout: Duration,
) -> Result<CommStream, CommError> {
    let Some(tls) = tls else {
        return Ok(CommStream::Plain(stream));
    };
    // Each wait of the handshake ends by the deadline: the socket's timeouts follow it.
    let follow_deadline = |sock: &TcpStream, left: Duration| {
        sock.set_read_timeout(Some(left))?;
        sock.set_write_timeout(Some(left))
    };
    let secured = match tls_over(stream, side, peer, tls, deadline, timeout, follow_deadline)? {
        Tls::Client(tls) => CommStream::Client(tls),
        Tls::Server(tls) => CommStream::Server(tls),
    };
    secured.socket().set_write_timeout(Some(timeout))?;
    Ok(secured)
}

/// [`secure`] for a backend communicator's connection to or from `peer`
/// ([`Bootstrap::secure`](proto_core::backend::Bootstrap::secure)): the communicator set the
/// socket's timeouts, which bound each wait; the handshake ends by `timeout` from now.
pub(crate) fn secure_boxed(
    socket: Box<dyn Duplex>,
    side: Side,
    peer: IpAddr,
    tls: Option<&CommTls>,
    timeout: Duration,
) -> Result<SecuredStream, CommError> {
    let Some(tls) = tls else {
        return Ok(socket);
    };
    let deadline = Instant::now() + timeout;
    let peer = peer.to_string();
    // The communicator's timeouts stay.
    Ok(
        match tls_over(socket, side, &peer, tls, deadline, timeout, |_, _| Ok(()))? {
            Tls::Client(tls) => tls,
            Tls::Server(tls) => tls,
        },
    )
}

/// TLS over some byte stream, by which end this server is.
enum Tls<S: Read + Write> {
    /// This end connected.
    Client(Box<StreamOwned<ClientConnection, S>>),
    /// This end accepted.
    Server(Box<StreamOwned<ServerConnection, S>>),
}

/// Runs the handshake over `stream` (see [`secure`]); `limit_waits(stream, left)` is called
/// before each step with the time left to the deadline.
fn tls_over<S: Read + Write>(
    stream: S,
    side: Side,
    peer: &str,
    tls: &CommTls,
    deadline: Instant,
    timeout: Duration,
    limit_waits: impl Fn(&S, Duration) -> io::Result<()>,
) -> Result<Tls<S>, CommError> {
    let deadline = deadline.min(Instant::now() + timeout);
    let secured = match side {
        Side::Connected => {
            let name =
                ServerName::try_from(peer.to_owned()).map_err(|_| CommError::TlsHandshake {
                    reason: format!("{peer:?} is not a DNS name or an IP address"),
                })?;
            let connection = ClientConnection::new(tls.connector.clone(), name)
                .map_err(|error| handshake_error(&error))?;
            let mut tls = StreamOwned::new(connection, stream);
            handshake(&mut tls.conn, &mut tls.sock, deadline, timeout, limit_waits)?;
            Tls::Client(Box::new(tls))
        }
        Side::Accepted => {
            let connection = ServerConnection::new(tls.acceptor.clone())
                .map_err(|error| handshake_error(&error))?;
            let mut tls = StreamOwned::new(connection, stream);
            handshake(&mut tls.conn, &mut tls.sock, deadline, timeout, limit_waits)?;
            Tls::Server(Box::new(tls))
        }
    };
    tracing::debug!(?side, peer, "comm link: TLS handshake completed");
    Ok(secured)
}

/// Runs the handshake to its end before `deadline`: before each step `limit_waits` is told
/// the time left.
fn handshake<C, D, S>(
    conn: &mut C,
    sock: &mut S,
    deadline: Instant,
    timeout: Duration,
    limit_waits: impl Fn(&S, Duration) -> io::Result<()>,
) -> Result<(), CommError>
where
    C: DerefMut + Deref<Target = ConnectionCommon<D>>,
    D: SideData,
    S: Read + Write,
{
    let transient = |error: &io::Error| {
        matches!(
            error.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
        )
    };
    let time_left = || {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(timed_out(timeout))
        } else {
            Ok(left)
        }
    };
    while conn.is_handshaking() {
        limit_waits(sock, time_left()?)?;
        match conn.complete_io(sock) {
            Ok(_) => {}
            Err(error) if transient(&error) => {}
            Err(error) => return Err(handshake_error(&error)),
        }
    }
    // Our last flight (a client's certificate and Finished) may still be queued.
    while conn.wants_write() {
        limit_waits(sock, time_left()?)?;
        match conn.write_tls(sock) {
            Ok(0) => return Err(CommError::ConnectionClosed { peer: None }),
            Ok(_) => {}
            Err(error) if transient(&error) => {}
            Err(error) => return Err(handshake_error(&error)),
        }
    }
    Ok(())
}

fn handshake_error(error: &dyn fmt::Display) -> CommError {
    CommError::TlsHandshake {
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;
    use crate::tls::test_certs::Ca;

    fn comm_tls(dir: &std::path::Path, ca: &Ca, stem: &str) -> CommTls {
        let files = ca.leaf(dir, stem, &["localhost", "127.0.0.1"]);
        CommTls::new(&ServerTls::load(&files).unwrap())
    }

    /// A deadline that does not bound anything here.
    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// A pair of loopback sockets: (connected, accepted).
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let connected = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        (connected, accepted)
    }

    #[test]
    fn both_ends_of_one_ca_talk_and_a_silent_peer_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("comm CA");
        let (a, b) = (
            comm_tls(dir.path(), &ca, "a"),
            comm_tls(dir.path(), &ca, "b"),
        );
        let timeout = Duration::from_secs(5);
        let (connected, accepted) = pair();
        let server = std::thread::spawn(move || {
            let mut stream =
                secure(accepted, Side::Accepted, "peer", Some(&b), far(), timeout).unwrap();
            let mut got = [0u8; 5];
            stream.read_exact(&mut got).unwrap();
            stream.write_all(&got).unwrap();
            stream.flush().unwrap();
        });
        let mut stream = secure(
            connected,
            Side::Connected,
            "127.0.0.1",
            Some(&a),
            far(),
            timeout,
        )
        .unwrap();
        stream.write_all(b"hello").unwrap();
        stream.flush().unwrap();
        let mut echo = [0u8; 5];
        stream.read_exact(&mut echo).unwrap();
        assert_eq!(&echo, b"hello");
        server.join().unwrap();

        // A peer that connects and says nothing: the handshake ends at the timeout.
        let short = Duration::from_millis(300);
        for side in [Side::Accepted, Side::Connected] {
            let (connected, accepted) = pair();
            let (ours, _silent) = match side {
                Side::Accepted => (accepted, connected),
                Side::Connected => (connected, accepted),
            };
            let started = Instant::now();
            let error = secure(ours, side, "127.0.0.1", Some(&a), far(), short).unwrap_err();
            assert!(
                matches!(error, CommError::Timeout { .. }),
                "{side:?}: {error}"
            );
            assert!(
                started.elapsed() < short * 4,
                "{side:?}: {:?}",
                started.elapsed()
            );
        }
    }

    #[test]
    fn a_read_ends_by_its_deadline_while_a_peer_trickles_a_record() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("comm CA");
        let (a, b) = (
            comm_tls(dir.path(), &ca, "a"),
            comm_tls(dir.path(), &ca, "b"),
        );
        let timeout = Duration::from_secs(5);
        let (connected, accepted) = pair();
        let b1 = b.clone();
        let peer = std::thread::spawn(move || {
            secure(accepted, Side::Accepted, "peer", Some(&b1), far(), timeout).unwrap()
        });
        let mut ours = secure(
            connected,
            Side::Connected,
            "127.0.0.1",
            Some(&a),
            far(),
            timeout,
        )
        .unwrap();
        let CommStream::Server(mut peer) = peer.join().unwrap() else {
            panic!("the accepting end is a TLS server");
        };
        // One record of "hello", sent a byte every 20 ms (about half a second in all).
        peer.conn.writer().write_all(b"hello").unwrap();
        let mut record = Vec::new();
        while peer.conn.wants_write() {
            peer.conn.write_tls(&mut record).unwrap();
        }
        assert!(record.len() > 20, "{} bytes", record.len());
        let trickle = |mut sock: TcpStream, bytes: Vec<u8>| {
            std::thread::spawn(move || {
                for byte in bytes {
                    if sock.write_all(&[byte]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let sender = trickle(peer.sock.try_clone().unwrap(), record.clone());
        let mut buf = [0u8; 16];
        let started = Instant::now();
        let error = ours
            .read_by(&mut buf, Instant::now() + Duration::from_millis(150))
            .unwrap_err();
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{error}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "{:?}",
            started.elapsed()
        );
        sender.join().unwrap();

        // The same trickle with time enough: the record arrives whole.
        let (connected, accepted) = pair();
        let peer = std::thread::spawn(move || {
            secure(accepted, Side::Accepted, "peer", Some(&b), far(), timeout).unwrap()
        });
        let mut ours = secure(
            connected,
            Side::Connected,
            "127.0.0.1",
            Some(&a),
            far(),
            timeout,
        )
        .unwrap();
        let CommStream::Server(mut peer) = peer.join().unwrap() else {
            panic!("the accepting end is a TLS server");
        };
        peer.conn.writer().write_all(b"hello").unwrap();
        let mut record = Vec::new();
        while peer.conn.wants_write() {
            peer.conn.write_tls(&mut record).unwrap();
        }
        let sender = trickle(peer.sock.try_clone().unwrap(), record);
        let n = ours.read_by(&mut buf, far()).unwrap();
        assert_eq!(&buf[..n], b"hello");
        sender.join().unwrap();
        // and a closed peer reads as EOF (an error without close_notify, never a hang)
        drop(peer);
        let _ = ours.read_by(&mut buf, Instant::now() + Duration::from_secs(2));
    }

    #[test]
    fn a_certificate_of_another_ca_and_a_wrong_name_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ours = comm_tls(dir.path(), &Ca::new("our CA"), "ours");
        let theirs = comm_tls(dir.path(), &Ca::new("their CA"), "theirs");
        let timeout = Duration::from_secs(5);
        let (connected, accepted) = pair();
        let server = std::thread::spawn(move || {
            secure(
                accepted,
                Side::Accepted,
                "peer",
                Some(&ours),
                far(),
                timeout,
            )
            .map(|_| ())
        });
        let client = secure(
            connected,
            Side::Connected,
            "127.0.0.1",
            Some(&theirs),
            far(),
            timeout,
        );
        let error = client
            .err()
            .unwrap_or_else(|| server.join().unwrap().unwrap_err());
        assert!(matches!(error, CommError::TlsHandshake { .. }), "{error}");

        // The certificate names 127.0.0.1 and localhost, not 10.9.8.7.
        let ca = Ca::new("one CA");
        let (a, b) = (
            comm_tls(dir.path(), &ca, "a"),
            comm_tls(dir.path(), &ca, "b"),
        );
        let (connected, accepted) = pair();
        let server = std::thread::spawn(move || {
            let _ = secure(accepted, Side::Accepted, "peer", Some(&b), far(), timeout);
        });
        let error = secure(
            connected,
            Side::Connected,
            "10.9.8.7",
            Some(&a),
            far(),
            timeout,
        )
        .unwrap_err();
        assert!(
            matches!(&error, CommError::TlsHandshake { reason } if reason.contains("not valid for name")),
            "{error}"
        );
        server.join().unwrap();

        // Without TLS the socket is handed back as it is.
        let (connected, _accepted) = pair();
        let plain = secure(
            connected,
            Side::Connected,
            "127.0.0.1",
            None,
            far(),
            timeout,
        )
        .unwrap();
        assert!(matches!(plain, CommStream::Plain(_)));
    }
}
