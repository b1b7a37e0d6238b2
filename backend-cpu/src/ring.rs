//! The CPU device's communicator: a ring all-reduce over TCP between the ranks' servers, for
//! any world size (upstream has no CPU communicator: its CPU servers vote no and fall back to
//! the pairwise link, which only exists at world 2).
//!
//! Set-up, through one bootstrap exchange over the comm sockets: every rank listens on an
//! ephemeral port and contributes `ip (4) | port (2, LE) | token (8, LE)`; it then connects to
//! the next rank, introduces itself with `next's token | own rank | world`, and accepts the
//! previous rank (a connection with the wrong introduction is dropped, and accepting goes on
//! until the deadline). At world 2 the two ranks hold one connection per direction.
//!
//! All-reduce of `n` f32 on `world` ranks: the tensor is cut into `world` chunks; a
//! reduce-scatter of `world − 1` steps leaves chunk `(rank + 1) % world` fully summed on `rank`,
//! an all-gather of `world − 1` steps hands every finished chunk around. Each link carries
//! `2 (world − 1) / world` of the tensor. Chunks travel in segments, and a segment is passed
//! on as soon as it is summed, so the steps overlap. Above
//! [`BF16_WIRE_MIN_ELEMENTS`](proto_core::comm::BF16_WIRE_MIN_ELEMENTS) the wire carries bf16
//! as the pairwise link does; the owner of a finished chunk rounds its own copy to bf16 too,
//! so every rank ends with the same bits. Sends run on a thread of their own; every wait for a
//! segment and every blocked write is bounded by the comm timeout, and the side that fails
//! first shuts the other side's socket down.
//!
//! The shell secures both connections before the introduction ([`Bootstrap::secure`]): TLS
//! with the server's certificate when it runs with TLS (this crate sees only a byte stream),
//! the sockets unchanged otherwise. The raw sockets are kept beside the streams, for their
//! timeouts and the shutdown.

use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proto_core::backend::{Backend, Bootstrap, Communicator, SecuredStream, Side, TensorLocation};
use proto_core::comm::bf16::{bf16_to_f32, f32_to_bf16};
use proto_core::comm::{accumulate, encode_partial, CommError, WireFormat};
use proto_core::{Error, Result};

/// Bytes each rank contributes to the set-up exchange.
const BLOCK: usize = 14;
/// Bytes of the introduction a rank sends to the next one.
const HELLO: usize = 16;
/// Elements per segment: the unit that is passed on as soon as it is summed.
const SEGMENT: usize = 1 << 18;
const POLL: Duration = Duration::from_millis(5);
/// Which side of an all-reduce failed first.
const NO_FAILURE: u8 = 0;
const RECEIVER_FAILED: u8 = 1;
const SENDER_FAILED: u8 = 2;

/// One connection of the ring: the stream the shell secured, and its socket.
struct Link {
    stream: SecuredStream,
    socket: TcpStream,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.socket.fmt(f)
    }
}

impl Link {
    /// Has the shell secure `socket` (this end is `side`, the other at `peer`); each wait of
    /// a handshake takes at most the comm timeout.
    fn secure(
        socket: TcpStream,
        side: Side,
        peer: std::net::IpAddr,
        bootstrap: &dyn Bootstrap,
    ) -> Result<Link> {
        let timeout = Some(bootstrap.timeout());
        socket.set_read_timeout(timeout).map_err(comm)?;
        socket.set_write_timeout(timeout).map_err(comm)?;
        let raw = socket.try_clone().map_err(comm)?;
        let stream = bootstrap.secure(Box::new(socket), side, peer)?;
        Ok(Link {
            stream,
            socket: raw,
        })
    }
}

/// A ring of TCP connections: to the next rank and from the previous one.
#[derive(Debug)]
pub(crate) struct Ring {
    rank: u32,
    world: u32,
    to_next: Link,
    from_prev: Link,
    timeout: Duration,
    /// The tensor of the last all-reduce, reused by the next (freed with the ring).
    scratch: Vec<f32>,
}

impl Ring {
    /// Builds this rank's ring through one bootstrap exchange.
    pub(crate) fn establish(bootstrap: &mut dyn Bootstrap) -> Result<Ring> {
        let (rank, world, timeout) = (bootstrap.rank(), bootstrap.world(), bootstrap.timeout());
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(comm)?;
        listener.set_nonblocking(true).map_err(comm)?;
        let port = listener.local_addr().map_err(comm)?.port();
        let token = std::collections::hash_map::RandomState::new().hash_one((rank, port));
        let mut block = [0u8; BLOCK];
        block[..4].copy_from_slice(&bootstrap.local_ip().octets());
        block[4..6].copy_from_slice(&port.to_le_bytes());
        block[6..].copy_from_slice(&token.to_le_bytes());
        let gathered = bootstrap.exchange(&block)?;
        let next = (rank + 1) % world;
        let prev = (rank + world - 1) % world;
        let (next_addr, next_token) = peer_block(&gathered, next)?;
        let deadline = Instant::now() + timeout;

        if !bootstrap.peer_allowed(next_addr.ip()) {
            return Err(Error::Comm(CommError::PeerNotAllowed {
                ip: next_addr.ip(),
            }));
        }
        // With TLS a connection is usable once the next rank has handshaken it, so the ranks
        // take turns around the ring: rank 0 connects first, every other rank first accepts
        // its previous rank and then connects to its next (all at once, each would wait for a
        // handshake its next rank has not reached yet).
        let (to_next, from_prev) = if rank == 0 {
            let to_next = introduce(&*bootstrap, next_addr, next_token, deadline)?;
            let from_prev = accept_prev(&listener, token, prev, world, deadline, &*bootstrap)?;
            (to_next, from_prev)
        } else {
            let from_prev = accept_prev(&listener, token, prev, world, deadline, &*bootstrap)?;
            let to_next = introduce(&*bootstrap, next_addr, next_token, deadline)?;
            (to_next, from_prev)
        };
        Ok(Ring {
            rank,
            world,
            to_next,
            from_prev,
            timeout,
            scratch: Vec::new(),
        })
    }
}

impl Communicator for Ring {
    fn allreduce(
        &mut self,
        backend: &dyn Backend,
        at: TensorLocation,
        elements: u64,
    ) -> Result<()> {
        let n = usize::try_from(elements)
            .ok()
            .filter(|n| n.checked_mul(4).is_some())
            .ok_or(Error::SizeOverflow("all-reduce tensor"))?;
        // The link's scratch: read straight into it (no second copy), and kept for the next
        // all-reduce, whose pages are then already there (first-touch page faults of a fresh
        // 64 MiB buffer cost more than the copy).
        let mut values = std::mem::take(&mut self.scratch);
        values.clear();
        values.resize(n, 0.0);
        backend.read(at, bytemuck::cast_slice_mut(&mut values))?;
        for v in values.iter_mut() {
            *v = f32::from_bits(u32::from_le(v.to_bits())); // nothing on little-endian hosts
        }
        let result = self.reduce(&mut values).and_then(|()| {
            for v in values.iter_mut() {
                *v = f32::from_bits(v.to_bits().to_le());
            }
            backend.write(at, bytemuck::cast_slice(&values))
        });
        self.scratch = values;
        result
    }
}

impl Ring {
    /// Sums `values` across the ring in place.
    fn reduce(&mut self, values: &mut [f32]) -> Result<()> {
        let (rank, world) = (self.rank as usize, self.world as usize);
        let format = WireFormat::select(true, values.len() as u64);
        let timeout = self.timeout;
        // The side that fails first shuts the other side's socket down, so that it stops at
        // once instead of waiting out its own timeout (a sender blocked on a stalled next rank,
        // a receiver waiting for bytes the failed side will never pass on); its error is the
        // one reported.
        let stop_sending = &self.to_next.socket;
        let stop_receiving = &self.from_prev.socket;
        let first_failure = AtomicU8::new(NO_FAILURE);
        let fail = |side: u8, other: &TcpStream| {
            if first_failure
                .compare_exchange(NO_FAILURE, side, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let _ = other.shutdown(Shutdown::Both);
            }
        };
        let to_next = &mut self.to_next.stream;
        let (from_prev, prev_socket) = (&mut self.from_prev.stream, &self.from_prev.socket);
        std::thread::scope(|scope| {
            let (queue, outbox) = mpsc::channel::<bytes::Bytes>();
            let sender = scope.spawn(|| -> Result<()> {
                for data in outbox {
                    // With TLS the flush hands the last record to the socket.
                    if let Err(e) = to_next.write_all(&data).and_then(|()| to_next.flush()) {
                        fail(SENDER_FAILED, stop_receiving);
                        return Err(io_error(e, timeout));
                    }
                }
                Ok(())
            });
            let received = receive_side(
                values,
                rank,
                world,
                format,
                &queue,
                (from_prev, prev_socket),
                timeout,
            );
            if received.is_err() {
                fail(RECEIVER_FAILED, stop_sending);
            }
            drop(queue);
            let sent = sender
                .join()
                .unwrap_or(Err(Error::Comm(CommError::InvalidState {
                    operation: "ring sender thread panicked",
                })));
            if first_failure.load(Ordering::SeqCst) == SENDER_FAILED {
                sent.and(received)
            } else {
                // A receive error explains a failed send (the queue closed, or the socket was
                // shut down), not the other way round.
                received.and(sent)
            }
        })
    }
}

/// What the receiving side does with one received segment: its values here and the wire bytes.
type OnSegment<'a> = dyn FnMut(&mut [f32], &[u8]) -> Result<()> + 'a;

/// The receiving half of one all-reduce; queues every segment the sender passes on. Each
/// segment must arrive within the comm timeout of the wait for it (a stalled or vanished
/// neighbour fails the all-reduce after at most that long; a large all-reduce on a slow link
/// that keeps moving does not).
fn receive_side(
    values: &mut [f32],
    rank: usize,
    world: usize,
    format: WireFormat,
    queue: &mpsc::Sender<bytes::Bytes>,
    (from_prev, socket): (&mut SecuredStream, &TcpStream),
    timeout: Duration,
) -> Result<()> {
    let send = |data: bytes::Bytes| {
        queue
            .send(data)
            .map_err(|_| Error::Comm(CommError::ConnectionClosed { peer: None }))
    };
    let n = values.len();
    let mut wire = Vec::new();
    // Reads chunk `c` segment by segment from the previous rank and hands each to `f`.
    let mut receive_chunk = |values: &mut [f32], c: usize, f: &mut OnSegment<'_>| -> Result<()> {
        for segment in segments(chunk(n, world, c)) {
            let part = &mut values[segment];
            let len = part.len() * format.element_size();
            let deadline = Instant::now() + timeout;
            read_wire((&mut *from_prev, socket), &mut wire, len, deadline, timeout)?;
            f(part, &wire)?;
        }
        Ok(())
    };
    for segment in segments(chunk(n, world, rank)) {
        send(encode_partial(&values[segment], format))?;
    }
    // Reduce-scatter: step s receives chunk (rank − s − 1) and passes it on summed.
    for step in 0..world - 1 {
        let last = step == world - 2;
        receive_chunk(
            values,
            (rank + 2 * world - step - 1) % world,
            &mut |part, wire| {
                accumulate(part, wire, format)?;
                if last && format == WireFormat::Bf16 {
                    // The finished chunk: every rank must hold what the others receive.
                    for v in part.iter_mut() {
                        *v = bf16_to_f32(f32_to_bf16(*v));
                    }
                }
                send(encode_partial(part, format))
            },
        )?;
    }
    // All-gather: step s receives finished chunk (rank − s) and passes it on unless it is the
    // one the next rank finished.
    for step in 0..world - 1 {
        receive_chunk(values, (rank + world - step) % world, &mut |part, wire| {
            decode(part, wire, format);
            if step < world - 2 {
                send(bytes::Bytes::copy_from_slice(wire))?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Chunk `c` of `n` elements cut into `world` nearly equal chunks.
fn chunk(n: usize, world: usize, c: usize) -> Range<usize> {
    let at = |i: usize| (n as u128 * i as u128 / world as u128) as usize;
    at(c)..at(c + 1)
}

/// The segments of a chunk.
fn segments(range: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    range
        .clone()
        .step_by(SEGMENT)
        .map(move |start| start..(start + SEGMENT).min(range.end))
}

/// Replaces `values` with the wire's.
fn decode(values: &mut [f32], wire: &[u8], format: WireFormat) {
    match format {
        WireFormat::F32 => {
            for (v, b) in values.iter_mut().zip(wire.chunks_exact(4)) {
                *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WireFormat::Bf16 => {
            for (v, b) in values.iter_mut().zip(wire.chunks_exact(2)) {
                *v = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

/// Reads exactly `len` bytes from a stream into `buf` before `deadline` (the read timeouts
/// set on its socket).
fn read_wire(
    (stream, socket): (&mut SecuredStream, &TcpStream),
    buf: &mut Vec<u8>,
    len: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    buf.resize(len, 0);
    let mut filled = 0;
    while filled < len {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(timeout));
        }
        socket.set_read_timeout(Some(left)).map_err(comm)?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(Error::Comm(CommError::ConnectionClosed { peer: None })),
            Ok(k) => filled += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(e, timeout)),
        }
    }
    Ok(())
}

/// The address and token rank `peer` contributed.
fn peer_block(gathered: &[u8], peer: u32) -> Result<(SocketAddr, u64)> {
    let start = peer as usize * BLOCK;
    let block = gathered
        .get(start..start + BLOCK)
        .ok_or(Error::Comm(CommError::UnknownPeer { peer }))?;
    let ip = Ipv4Addr::new(block[0], block[1], block[2], block[3]);
    let port = u16::from_le_bytes([block[4], block[5]]);
    let mut token = [0u8; 8];
    token.copy_from_slice(&block[6..]);
    Ok((SocketAddr::from((ip, port)), u64::from_le_bytes(token)))
}

/// Connects to the next rank at `addr`, has the shell secure the connection, and introduces
/// this rank with the next one's `token`.
fn introduce(
    bootstrap: &dyn Bootstrap,
    addr: SocketAddr,
    token: u64,
    deadline: Instant,
) -> Result<Link> {
    let (rank, world, timeout) = (bootstrap.rank(), bootstrap.world(), bootstrap.timeout());
    let socket = connect(addr, deadline, timeout)?;
    let mut link = Link::secure(socket, Side::Connected, addr.ip(), bootstrap)?;
    let mut hello = [0u8; HELLO];
    hello[..8].copy_from_slice(&token.to_le_bytes());
    hello[8..12].copy_from_slice(&rank.to_le_bytes());
    hello[12..].copy_from_slice(&world.to_le_bytes());
    link.stream
        .write_all(&hello)
        .and_then(|()| link.stream.flush())
        .map_err(|e| io_error(e, timeout))?;
    Ok(link)
}

/// Connects to the next rank's ring listener (which was bound before the exchange).
fn connect(addr: SocketAddr, deadline: Instant, timeout: Duration) -> Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(timeout));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => {
                stream.set_nodelay(true).map_err(comm)?;
                stream.set_write_timeout(Some(timeout)).map_err(comm)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::thread::sleep(POLL),
            Err(e) => return Err(io_error(e, timeout)),
        }
    }
}

/// Accepts the previous rank: the first connection from an allowed address that the shell
/// secures (with TLS: a certificate of our CA) and that introduces itself with this rank's
/// token, rank `prev` and the same world.
fn accept_prev(
    listener: &TcpListener,
    token: u64,
    prev: u32,
    world: u32,
    deadline: Instant,
    bootstrap: &dyn Bootstrap,
) -> Result<Link> {
    let timeout = bootstrap.timeout();
    loop {
        // Strangers' failed handshakes and introductions do not extend the wait.
        if Instant::now() >= deadline {
            return Err(timed_out(timeout));
        }
        match listener.accept() {
            Ok((_, peer)) if !bootstrap.peer_allowed(peer.ip()) => {}
            Ok((stream, peer)) => {
                stream.set_nonblocking(false).map_err(comm)?;
                let Ok(mut link) = Link::secure(stream, Side::Accepted, peer.ip(), bootstrap)
                else {
                    // A failed handshake: not one of ours; drop it and go on waiting.
                    continue;
                };
                let mut hello = Vec::new();
                let read = read_wire(
                    (&mut link.stream, &link.socket),
                    &mut hello,
                    HELLO,
                    deadline,
                    timeout,
                );
                if read.is_ok()
                    && hello[..8] == token.to_le_bytes()
                    && hello[8..12] == prev.to_le_bytes()
                    && hello[12..] == world.to_le_bytes()
                {
                    link.socket.set_write_timeout(Some(timeout)).map_err(comm)?;
                    return Ok(link);
                }
                // Not the previous rank: drop it and go on waiting.
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(timed_out(timeout));
                }
                std::thread::sleep(POLL);
            }
            Err(e) => return Err(comm(e)),
        }
    }
}

fn comm(error: io::Error) -> Error {
    Error::Comm(error.into())
}

fn io_error(error: io::Error, timeout: Duration) -> Error {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(timeout),
        _ => comm(error),
    }
}

fn timed_out(timeout: Duration) -> Error {
    Error::Comm(CommError::Timeout {
        millis: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    })
}

#[cfg(test)]
mod tests;
