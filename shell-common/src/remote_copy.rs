//! The source side of the remote-copy extension (ours; wire layout in
//! [`proto_core::wire::extension`]): server A pushes a region of its backend memory to server
//! B as B's client, on blocking `std::net`, off the event loop (the driver hands it over as
//! [`CommWork::RemoteCopy`](proto_core::driver::CommWork::RemoteCopy)). Every wait on B is
//! bounded by the comm timeout.
//!
//! A connects only to endpoints of its allow-list ([`PeerAllowList`], `--peer HOST:PORT`,
//! resolved at start-up; empty by default, so every REMOTE_COPY_TENSOR is refused): a client
//! cannot make the server connect anywhere else, and A never resolves a name a client sent.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use proto_core::backend::{Backend, TensorLocation};
use proto_core::dispatch::RemoteCopyWork;

use crate::tls::ClientTls;
use proto_core::wire::{
    Command, Dialect, ProtocolVersion, RemoteCopyStatus, Request, Response, SetTensorHeader,
    Tensor2dHeader, EXTENSION_REMOTE_COPY, HELLO_FLAG_EXTENSIONS, REQUEST_HEADER_SIZE,
    RESPONSE_HEADER_SIZE,
};

/// Largest piece of the source region lent to one blocking write.
const PIECE: u64 = 16 << 20;

/// The servers this server may push to (`--peer HOST:PORT`, repeatable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerAllowList {
    peers: Vec<Peer>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Peer {
    /// `host:port` as given (host compared case-insensitively).
    text: String,
    /// What it resolved to at start-up.
    addrs: Vec<SocketAddr>,
}

impl PeerAllowList {
    /// No peer: every remote copy is refused.
    pub fn none() -> PeerAllowList {
        PeerAllowList::default()
    }

    /// Resolves every `HOST:PORT` once, now. Fails for one that does not resolve.
    pub fn resolve<S: AsRef<str>>(specs: &[S]) -> io::Result<PeerAllowList> {
        let mut peers = Vec::new();
        for spec in specs {
            let text = spec.as_ref().to_owned();
            let addrs: Vec<SocketAddr> = text.to_socket_addrs()?.collect();
            if addrs.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("--peer {text}: resolves to no address"),
                ));
            }
            peers.push(Peer { text, addrs });
        }
        Ok(PeerAllowList { peers })
    }

    /// Whether no peer is allowed.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The addresses to try for a client's `endpoint`: a literal `IP:PORT` must be one a peer
    /// resolved to; a `HOST:PORT` must equal a peer as given. `None`: not allowed.
    pub fn lookup(&self, endpoint: &str) -> Option<Vec<SocketAddr>> {
        if let Ok(addr) = endpoint.parse::<SocketAddr>() {
            return self
                .peers
                .iter()
                .any(|peer| peer.addrs.contains(&addr))
                .then(|| vec![addr]);
        }
        self.peers
            .iter()
            .find(|peer| peer.text.eq_ignore_ascii_case(endpoint))
            .map(|peer| peer.addrs.clone())
    }
}

/// Why B refused, as B said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeerRefusal {
    /// B's HELLO announced a major we cannot talk to.
    #[error("peer speaks protocol {major}.{minor}.{patch}")]
    Version {
        /// Major.
        major: u8,
        /// Minor.
        minor: u8,
        /// Patch.
        patch: u8,
    },
    /// B's HELLO lacks the extensions bit.
    #[error("peer does not offer extensions")]
    NoExtensions,
    /// B did not grant the remote-copy extension.
    #[error("peer did not grant remote copy")]
    NotGranted,
    /// B refused the ticket with this status.
    #[error("peer refused the ticket: {0:?}")]
    Ticket(RemoteCopyStatus),
    /// B answered something no server of ours sends.
    #[error("peer answered a malformed response")]
    Malformed,
}

/// Why a remote copy failed (mapped to the client's status by [`status`](Self::status)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RemoteCopyError {
    /// The endpoint is not on the allow-list (or not UTF-8).
    #[error("endpoint not on the --peer allow-list")]
    PeerNotAllowed,
    /// No address of the peer accepted a connection in time.
    #[error("cannot connect to the peer: {kind}")]
    Connect {
        /// The last connect error.
        kind: io::ErrorKind,
    },
    /// The peer closed or stalled before the data (HELLO, EXTENSIONS, ATTACH).
    #[error("peer failed during the handshake: {kind}")]
    Handshake {
        /// The socket error.
        kind: io::ErrorKind,
    },
    /// The peer answered, but refused.
    #[error("peer refused: {0}")]
    Refused(PeerRefusal),
    /// Reading the source region failed.
    #[error("reading the source region failed: {0}")]
    Source(proto_core::error::ErrorKind),
    /// The peer closed or stalled while the data streamed, or before confirming it.
    #[error("peer failed after {sent} of {len} bytes: {kind}")]
    Stream {
        /// Bytes written before the failure.
        sent: u64,
        /// Bytes of the copy.
        len: u64,
        /// The socket error.
        kind: io::ErrorKind,
    },
}

impl RemoteCopyError {
    /// The status answered to the client.
    pub fn status(&self) -> RemoteCopyStatus {
        match self {
            RemoteCopyError::PeerNotAllowed => RemoteCopyStatus::PeerNotAllowed,
            RemoteCopyError::Connect { .. } | RemoteCopyError::Handshake { .. } => {
                RemoteCopyStatus::PeerUnreachable
            }
            RemoteCopyError::Refused(PeerRefusal::Ticket(status)) => *status,
            RemoteCopyError::Refused(_) => RemoteCopyStatus::PeerWithoutExtension,
            RemoteCopyError::Source(_) => RemoteCopyStatus::BadSource,
            RemoteCopyError::Stream { .. } => RemoteCopyStatus::PeerClosed,
        }
    }
}

/// Runs one remote copy: connect to B (allow-listed), HELLO, EXTENSIONS, ATTACH, one
/// SET_TENSOR streamed from backend memory, DEVICE_COUNT as the barrier. Blocks (at most
/// `timeout` per wait on B).
///
/// With `tls` (this server runs with `--tls-*`), the connection to B is TLS 1.3 with this
/// server's certificate, B's verified for the endpoint's host; the handshake runs within the
/// first request, under the same socket timeouts.
pub fn push(
    work: &RemoteCopyWork,
    backend: &dyn Backend,
    peers: &PeerAllowList,
    tls: Option<&ClientTls>,
    timeout: Duration,
) -> Result<(), RemoteCopyError> {
    let request = &work.request;
    let endpoint = request
        .endpoint_str()
        .ok_or(RemoteCopyError::PeerNotAllowed)?;
    let addrs = peers
        .lookup(endpoint)
        .ok_or(RemoteCopyError::PeerNotAllowed)?;
    let tcp = connect(&addrs, timeout)?;
    let handshake = |kind| RemoteCopyError::Handshake { kind };
    let mut stream: Box<dyn Link> = match tls {
        None => Box::new(tcp),
        Some(tls) => {
            let host = endpoint
                .rsplit_once(':')
                .map_or(endpoint, |(host, _)| host)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = crate::tls::server_name(host)
                .map_err(|_| handshake(io::ErrorKind::InvalidInput))?;
            let connection = rustls::ClientConnection::new(tls.0.clone(), name)
                .map_err(|_| handshake(io::ErrorKind::InvalidInput))?;
            Box::new(rustls::StreamOwned::new(connection, tcp))
        }
    };
    let refused = RemoteCopyError::Refused;

    // HELLO: the same request in 7 and 8; B's answer tells its dialect.
    let hello = call(&mut stream, &Request::Hello { caps: [0; 24] }, Dialect::V8)
        .map_err(|e| call_error(e, handshake))?;
    let Response::Hello { version, flags, .. } = hello else {
        return Err(refused(PeerRefusal::Malformed));
    };
    let Some(dialect) = version.dialect() else {
        let ProtocolVersion {
            major,
            minor,
            patch,
        } = version;
        return Err(refused(PeerRefusal::Version {
            major,
            minor,
            patch,
        }));
    };
    if flags & HELLO_FLAG_EXTENSIONS == 0 {
        return Err(refused(PeerRefusal::NoExtensions));
    }
    let granted = call(
        &mut stream,
        &Request::Extensions {
            wanted: EXTENSION_REMOTE_COPY,
        },
        dialect,
    )
    .map_err(|e| call_error(e, handshake))?;
    if granted != Response::Extensions(EXTENSION_REMOTE_COPY) {
        return Err(refused(PeerRefusal::NotGranted));
    }
    let bad_destination = refused(PeerRefusal::Ticket(RemoteCopyStatus::BadDestination));
    let start = request
        .dst
        .data
        .checked_add(request.dst_offset)
        .ok_or(bad_destination)?;
    let rows = request.n_copies;
    // Rows go as one SET_TENSOR_2D, which protocol 7 lacks (B refused the ticket then too).
    if rows != 1 && dialect != Dialect::V8 {
        return Err(bad_destination);
    }
    let len = request.total().ok_or(bad_destination)?;
    let attached = call(
        &mut stream,
        &Request::RemoteCopyAttach {
            ticket: request.ticket,
            buffer: request.dst.buffer,
            start,
            size: request.size,
            n_copies: rows,
            stride: if rows == 1 { 0 } else { request.dst_stride },
        },
        dialect,
    )
    .map_err(|e| call_error(e, handshake))?;
    match attached {
        Response::RemoteCopyAttach(0) => {}
        Response::RemoteCopyAttach(byte) => {
            return Err(refused(PeerRefusal::Ticket(
                RemoteCopyStatus::from_byte(byte).ok_or(refused(PeerRefusal::Malformed))?,
            )))
        }
        _ => return Err(refused(PeerRefusal::Malformed)),
    }

    // SET_TENSOR (one row) or SET_TENSOR_2D (rows): the head, then the data straight from
    // backend memory.
    let mut head = BytesMut::with_capacity(REQUEST_HEADER_SIZE + Tensor2dHeader::SIZE);
    if rows == 1 {
        head.put_u8(Command::SetTensor.id());
        head.put_u64_le(SetTensorHeader::SIZE as u64 + len);
        SetTensorHeader {
            tensor: request.dst.clone(),
            cache_flag: 0,
            offset: request.dst_offset,
        }
        .encode(&mut head);
    } else {
        head.put_u8(Command::SetTensor2d.id());
        head.put_u64_le(Tensor2dHeader::SIZE as u64 + len);
        Tensor2dHeader {
            tensor: request.dst.clone(),
            offset: request.dst_offset,
            size: request.size,
            n_copies: rows,
            stride: request.dst_stride,
        }
        .encode(&mut head);
    }
    let mut sent = 0u64;
    let streaming = |sent: u64, kind| RemoteCopyError::Stream { sent, len, kind };
    stream
        .write_all(&head)
        .map_err(|e| streaming(0, e.kind()))?;
    let mut bounce: Vec<u8> = Vec::new();
    // The source rows, each in pieces of at most PIECE bytes (A checked that every row lies in
    // its buffer, so the offsets cannot overflow).
    let row_len = if rows == 1 { len } else { request.size };
    let (mut row, mut within) = (0u64, 0u64);
    while sent < len {
        if within == row_len {
            row += 1;
            within = 0;
        }
        let take = (row_len - within).min(PIECE) as usize;
        let at = TensorLocation {
            buffer: work.src.buffer,
            offset: work.src.offset + row * request.src_stride + within,
        };
        within += take as u64;
        let mut failed = None;
        let lent = backend.read_in_place(at, take, &mut |piece| match stream.write_all(piece) {
            Ok(()) => piece.len(),
            Err(error) => {
                failed = Some(error.kind());
                0
            }
        });
        match lent {
            Ok(Some(n)) if n == take => {}
            Ok(Some(_)) => return Err(streaming(sent, failed.unwrap_or(io::ErrorKind::WriteZero))),
            Ok(None) => {
                // Not host memory: through one bounded bounce buffer.
                bounce.resize(take, 0);
                backend
                    .read(at, &mut bounce)
                    .map_err(|e| RemoteCopyError::Source(e.kind()))?;
                stream
                    .write_all(&bounce)
                    .map_err(|e| streaming(sent, e.kind()))?;
            }
            Err(error) => return Err(RemoteCopyError::Source(error.kind())),
        }
        sent += take as u64;
    }
    // The barrier: B answers DEVICE_COUNT only after it applied the write.
    match call(&mut stream, &Request::DeviceCount, dialect) {
        Ok(Response::DeviceCount(_)) => Ok(()),
        Ok(_) => Err(refused(PeerRefusal::Malformed)),
        Err(CallError::Io(kind)) => Err(streaming(sent, kind)),
        Err(CallError::Malformed) => Err(refused(PeerRefusal::Malformed)),
    }
}

/// The byte stream to B: a socket, or TLS over one.
trait Link: Read + Write {}

impl<S: Read + Write> Link for S {}

fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream, RemoteCopyError> {
    let mut last = io::ErrorKind::AddrNotAvailable;
    for addr in addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(stream) => {
                let prepared = stream
                    .set_nodelay(true)
                    .and_then(|()| stream.set_read_timeout(Some(timeout)))
                    .and_then(|()| stream.set_write_timeout(Some(timeout)));
                if let Err(error) = prepared {
                    last = error.kind();
                    continue;
                }
                crate::tune_or_log(&stream);
                return Ok(stream);
            }
            Err(error) => last = error.kind(),
        }
    }
    Err(RemoteCopyError::Connect { kind: last })
}

enum CallError {
    Io(io::ErrorKind),
    Malformed,
}

fn call_error(
    error: CallError,
    io: impl FnOnce(io::ErrorKind) -> RemoteCopyError,
) -> RemoteCopyError {
    match error {
        CallError::Io(kind) => io(kind),
        CallError::Malformed => RemoteCopyError::Refused(PeerRefusal::Malformed),
    }
}

/// One request with a fixed-size answer.
fn call(stream: &mut dyn Link, request: &Request, dialect: Dialect) -> Result<Response, CallError> {
    let command = request.command();
    let frame = request
        .to_frame(dialect)
        .map_err(|_| CallError::Malformed)?;
    stream
        .write_all(&frame)
        .map_err(|e| CallError::Io(e.kind()))?;
    let expected = command.fixed_response_size().ok_or(CallError::Malformed)?;
    let mut header = [0u8; RESPONSE_HEADER_SIZE];
    stream
        .read_exact(&mut header)
        .map_err(|e| CallError::Io(e.kind()))?;
    if u64::from_le_bytes(header) != expected {
        return Err(CallError::Malformed);
    }
    let mut payload = vec![0u8; expected as usize];
    stream
        .read_exact(&mut payload)
        .map_err(|e| CallError::Io(e.kind()))?;
    Response::decode(command, expected, payload.into()).map_err(|_| CallError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_matches_exactly() {
        let peers = PeerAllowList::resolve(&["127.0.0.1:50052", "localhost:50053"]).unwrap();
        assert_eq!(
            peers.lookup("127.0.0.1:50052"),
            Some(vec!["127.0.0.1:50052".parse().unwrap()])
        );
        assert!(peers.lookup("LOCALHOST:50053").is_some());
        assert_eq!(peers.lookup("127.0.0.1:50054"), None);
        assert_eq!(peers.lookup("10.0.0.1:50052"), None);
        assert_eq!(peers.lookup("localhost:50052"), None);
        assert_eq!(peers.lookup("example.com:50052"), None);
        assert!(PeerAllowList::none().lookup("127.0.0.1:50052").is_none());
    }
}
