//! A lean load generator for the small-command round-trip rates: each generator thread drives
//! its share of the connections from one mio event loop, with the request frame encoded once
//! (by the core's [`ClientSession`]) and every reply compared with the first.
//!
//! Why not the async client (`ggml_rpc_client::Client`): on a machine with two cores the client
//! and the server share the CPU, and an async client that costs more per round trip than the
//! server measures mostly itself (a profile with it showed it at 45 % of the CPU, the server at
//! 36 %). Here a round trip costs the client one `send` and one `recv`, no task wake-ups, so what
//! the rate shows is the server. Every server, the reference included, gets the same generator.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token};
use proto_core::session::{ClientEvent, ClientSession};
use proto_core::wire::{ProtocolVersion, Request, RESPONSE_HEADER_SIZE};

use crate::BoxError;

/// How the generator's connections reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clients {
    /// All connected at once, each with one request in flight.
    Concurrent,
    /// One after another, each for its share of the time: for a server that serves one client
    /// at a time (the reference), whose HELLO to a second connection waits for the first.
    Serial,
}

/// GET_ALIGNMENT round trips per second over `clients` connections for `seconds`;
/// `version` is what HELLO speaks (the server's major). Concurrent connections are driven by
/// `threads` generator threads (split evenly).
pub fn round_trips(
    addr: SocketAddr,
    version: ProtocolVersion,
    clients: usize,
    mode: Clients,
    threads: usize,
    seconds: f64,
) -> Result<f64, BoxError> {
    if mode == Clients::Serial {
        let share = Duration::from_secs_f64(seconds / clients.max(1) as f64);
        let start = Instant::now();
        let mut done = 0;
        for _ in 0..clients.max(1) {
            done += drive(vec![Connection::open(addr, version)?], share)?;
        }
        return Ok(done as f64 / start.elapsed().as_secs_f64());
    }
    let threads = threads.clamp(1, clients.max(1));
    let duration = Duration::from_secs_f64(seconds);
    // Connect everyone first, so no thread measures while others still connect.
    let mut shares: Vec<Vec<Connection>> = (0..threads).map(|_| Vec::new()).collect();
    for index in 0..clients {
        shares[index % threads].push(Connection::open(addr, version)?);
    }
    let start = Instant::now();
    let done = std::thread::scope(|scope| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|share| scope.spawn(move || drive(share, duration)))
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .map_err(|_| BoxError::from("generator panicked"))?
            })
            .sum::<Result<u64, BoxError>>()
    })?;
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// One connection after HELLO, with its request frame and the reply every request must get.
struct Connection {
    stream: TcpStream,
    request: Vec<u8>,
    reply: Vec<u8>,
}

impl Connection {
    /// Connects, performs HELLO and one GET_ALIGNMENT through the core's client session (which
    /// checks both replies), keeping the request's bytes and the reply's.
    fn open(addr: SocketAddr, version: ProtocolVersion) -> Result<Connection, BoxError> {
        let mut stream = connect(addr)?;
        stream.set_nodelay(true)?;
        let mut session = ClientSession::new(version, [0; 24])?;
        flush(&mut stream, &mut session)?;
        match next_event(&mut stream, &mut session)?.0 {
            ClientEvent::Connected(_) => {}
            other => return Err(format!("unexpected answer to HELLO: {other:?}").into()),
        }
        session.send(&Request::GetAlignment { device: 0 })?;
        let mut request = Vec::new();
        while let Some(bytes) = session.poll_transmit() {
            request.extend_from_slice(&bytes);
        }
        stream.write_all(&request)?;
        let (event, reply) = next_event(&mut stream, &mut session)?;
        match event {
            ClientEvent::Response(proto_core::wire::Response::Alignment(n)) if n > 0 => {}
            other => return Err(format!("unexpected answer to GET_ALIGNMENT: {other:?}").into()),
        }
        if reply.len() < RESPONSE_HEADER_SIZE {
            return Err("short GET_ALIGNMENT reply".into());
        }
        Ok(Connection {
            stream,
            request,
            reply,
        })
    }
}

/// Connects, retrying for a while: the reference serves one client at a time with a backlog of
/// one, so the connections of concurrent clients may be refused until it gets to them.
fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match TcpStream::connect(addr) {
            Ok(stream) => return Ok(stream),
            Err(error) if Instant::now() > deadline => return Err(error),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn flush(stream: &mut TcpStream, session: &mut ClientSession) -> io::Result<()> {
    while let Some(bytes) = session.poll_transmit() {
        stream.write_all(&bytes)?;
    }
    Ok(())
}

/// Reads until the session yields an event; returns it with the bytes that made it.
fn next_event(
    stream: &mut TcpStream,
    session: &mut ClientSession,
) -> Result<(ClientEvent, Vec<u8>), BoxError> {
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        if let Some(event) = session.poll_event()? {
            return Ok((event, seen));
        }
        // One byte at a time: the setup is not measured, and no byte of a later reply may be
        // taken by this one.
        if stream.read(&mut byte)? == 0 {
            return Err("the server closed the connection".into());
        }
        seen.push(byte[0]);
        session.handle_input(BytesMut::from(&byte[..]).freeze());
    }
}

/// One generator thread: keeps one request in flight on each of its connections until
/// `duration` is over; returns the round trips completed.
fn drive(connections: Vec<Connection>, duration: Duration) -> Result<u64, BoxError> {
    let mut poll = Poll::new()?;
    let mut streams = Vec::with_capacity(connections.len());
    let mut replies = Vec::with_capacity(connections.len());
    for (index, connection) in connections.into_iter().enumerate() {
        connection.stream.set_nonblocking(true)?;
        let mut stream = MioStream::from_std(connection.stream);
        poll.registry()
            .register(&mut stream, Token(index), Interest::READABLE)?;
        streams.push((stream, connection.request, 0usize));
        replies.push(connection.reply);
    }
    let mut events = Events::with_capacity(streams.len().max(1));
    let mut buffer = vec![0u8; 4096];
    let mut done = 0u64;
    for (stream, request, _) in &mut streams {
        send(stream, request)?;
    }
    let start = Instant::now();
    let mut stopping = false;
    let mut in_flight = streams.len();
    while in_flight > 0 {
        poll.poll(&mut events, Some(Duration::from_secs(10)))?;
        if events.is_empty() {
            return Err("the server stopped answering".into());
        }
        if !stopping && start.elapsed() >= duration {
            stopping = true;
        }
        for event in &events {
            let index = event.token().0;
            let (stream, request, have) = &mut streams[index];
            let reply = &replies[index];
            // One read per event: the server sends nothing but the reply to the one request in
            // flight, so a read that got less than the rest of the reply emptied the socket, and
            // the next bytes to arrive raise a new (edge-triggered) event.
            let want = reply.len() - *have;
            let read = loop {
                match stream.read(&mut buffer[..want]) {
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    read => break read,
                }
            };
            match read {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => {
                    if buffer[..n] != reply[*have..*have + n] {
                        return Err("a reply differs from the first one".into());
                    }
                    *have += n;
                    if *have == reply.len() {
                        *have = 0;
                        done += 1;
                        if stopping {
                            in_flight -= 1;
                        } else {
                            send(stream, request)?;
                        }
                    }
                }
                // A spurious event: nothing to read yet.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(done)
}

/// Writes a whole (small) request on a non-blocking socket: an empty send buffer always takes
/// it at once; a full one means the server stopped reading, which is an error here.
fn send(stream: &mut MioStream, request: &[u8]) -> Result<(), BoxError> {
    match stream.write(request) {
        Ok(n) if n == request.len() => Ok(()),
        Ok(_) => Err("a request did not fit the socket's send buffer".into()),
        Err(error) => Err(error.into()),
    }
}
