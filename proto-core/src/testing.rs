//! Test support (feature `testing`): our client and our server driven against each other in
//! memory, in the style of quinn-proto's `tests/util.rs` `Pair`. No sockets; every byte stream
//! is cut at random (reproducible) points. The server side is the one
//! [`Connection`](crate::driver::Connection) every shell runs, over any backend.
// Test support: a broken expectation is a failed test, reported by panicking.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)]

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use crate::backend::{Backend, MemoryBackend};
use crate::dispatch::DispatcherConfig;
use crate::driver::{Action, CommWork, Connection, Place, Receive};
use crate::error::Error;
use crate::session::{ClientEvent, ClientSession, ServerSessionConfig};
use crate::wire::{ProtocolVersion, Request, Response};

/// A tiny deterministic PRNG (xorshift64) so splits are random but reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// A client session and a server [`Connection`] joined in memory.
pub struct Pair<B: Backend + ?Sized = MemoryBackend> {
    /// Our client.
    pub client: ClientSession,
    /// The server side of the connection.
    pub server: Connection<B>,
    /// The server's backend.
    pub backend: Arc<B>,
    /// The splits' generator.
    pub rng: Rng,
    /// The error that failed the server side (a shell would close the connection).
    pub server_error: Option<Error>,
    /// Client bytes not yet read by the server (in-place mode only: the server "reads" them
    /// when it asks for input, straight into backend memory where it may).
    wire: VecDeque<u8>,
    direct_io: bool,
    /// Bytes of SET data the server placed straight in backend memory.
    pub received_in_place: usize,
    /// Reply bytes the server sent straight from backend memory.
    pub sent_in_place: usize,
}

impl Pair<MemoryBackend> {
    /// A pair over a fresh [`MemoryBackend`] (2 devices of 1 GiB), the server with default
    /// settings for `server_version`.
    pub fn new(
        client_version: ProtocolVersion,
        server_version: ProtocolVersion,
        seed: u64,
    ) -> Pair<MemoryBackend> {
        Pair::with_config(client_version, DispatcherConfig::new(server_version), seed)
    }

    /// A pair over a fresh [`MemoryBackend`] with the dispatcher's settings given.
    pub fn with_config(
        client_version: ProtocolVersion,
        config: DispatcherConfig,
        seed: u64,
    ) -> Pair<MemoryBackend> {
        Pair::with_backend(
            client_version,
            Arc::new(MemoryBackend::new(2, 1 << 30)),
            config,
            seed,
        )
    }
}

impl<B: Backend + ?Sized> Pair<B> {
    /// A pair over `backend`. Panics on a server version we do not speak.
    pub fn with_backend(
        client_version: ProtocolVersion,
        backend: Arc<B>,
        config: DispatcherConfig,
        seed: u64,
    ) -> Pair<B> {
        let dialect = config
            .version
            .dialect()
            .expect("a supported server version");
        let session = ServerSessionConfig::new(dialect);
        Pair {
            client: ClientSession::new(client_version, [0; 24]).expect("a supported version"),
            server: Connection::new(backend.clone(), &session, &config, false)
                .expect("a supported version"),
            backend,
            rng: Rng::new(seed),
            server_error: None,
            wire: VecDeque::new(),
            direct_io: false,
            received_in_place: 0,
            sent_in_place: 0,
        }
    }

    /// The server moves tensor data the way a shell with a socket does: SET data received
    /// straight into backend memory, large replies sent straight from it. Client bytes then
    /// wait on the "wire" until the server reads them.
    pub fn in_place(mut self) -> Pair<B> {
        self.direct_io = true;
        self.server.set_direct_io(true);
        self
    }

    /// Moves bytes both ways, cut at random points, until nothing moves. Returns the client's
    /// events; a server error is kept in [`server_error`](Self::server_error).
    pub fn drive(&mut self) -> Result<Vec<ClientEvent>, Error> {
        let mut events = Vec::new();
        loop {
            let mut moved = false;
            while let Some(bytes) = self.client.poll_transmit() {
                moved = true;
                self.feed_server(bytes);
            }
            if self.server_error.is_none() {
                match self.run_server() {
                    Ok(sent) => moved |= sent,
                    Err(error) => self.server_error = Some(error),
                }
            }
            while let Some(event) = self.client.poll_event()? {
                events.push(event);
            }
            if !moved {
                return Ok(events);
            }
        }
    }

    fn feed_server(&mut self, mut bytes: Bytes) {
        if self.direct_io {
            self.wire.extend(&bytes[..]);
            return;
        }
        while !bytes.is_empty() {
            let cut = 1 + self.rng.below(bytes.len().min(1 << 20));
            self.server.handle_input(bytes.split_to(cut));
        }
    }

    fn deliver_to_client(&mut self, mut bytes: Bytes) {
        while !bytes.is_empty() {
            let cut = 1 + self.rng.below(bytes.len());
            self.client.handle_input(bytes.split_to(cut));
        }
    }

    /// Runs the server until it needs input the wire does not have; returns whether it sent
    /// anything.
    fn run_server(&mut self) -> Result<bool, Error> {
        let mut sent = false;
        loop {
            match self.server.poll(Place::Blocking)? {
                Action::Transmit => {
                    while let Some(bytes) = self.server.poll_transmit() {
                        sent = true;
                        self.deliver_to_client(bytes);
                    }
                }
                // Not returned on `Place::Blocking`.
                Action::Offload => {}
                // No comm link in memory: COMM_INIT is answered "failed" as on a link error.
                Action::Comm(CommWork::Init(request)) => {
                    self.server.comm_init_done(request.device, false)?
                }
                Action::Comm(CommWork::Allreduce { .. } | CommWork::Free { .. }) => {}
                // One transport in memory: stay on it.
                Action::Upgrade(_) => self.server.answer_hello([0; 24])?,
                // No second server in memory: the peer cannot be reached.
                Action::Comm(CommWork::RemoteCopy(_)) => self
                    .server
                    .remote_copy_done(crate::wire::RemoteCopyStatus::PeerUnreachable)?,
                Action::SendInPlace => {
                    let want = 1 + self.rng.below(5 << 20);
                    let mut out = Vec::new();
                    let moved = self.server.send_in_place(&mut |src| {
                        let n = want.min(src.len());
                        out.extend_from_slice(&src[..n]);
                        n
                    })?;
                    if let Some(n) = moved {
                        self.sent_in_place += n;
                        sent = true;
                        self.deliver_to_client(out.into());
                    }
                }
                Action::Receive(receive) => {
                    if self.wire.is_empty() {
                        return Ok(sent);
                    }
                    // A shell "reads" a random amount: into the destination when it may, else
                    // into a buffer handed to the connection.
                    let want = 1 + self.rng.below(self.wire.len().min(3 << 20));
                    if let Receive::Stream { in_place: true, .. } = receive {
                        let wire = &mut self.wire;
                        let placed = self.server.receive_in_place(&mut |dst| {
                            let n = want.min(dst.len());
                            for (d, s) in dst[..n].iter_mut().zip(wire.drain(..n)) {
                                *d = s;
                            }
                            n
                        })?;
                        if let Some(n) = placed {
                            self.received_in_place += n;
                            continue;
                        }
                    }
                    let chunk: Vec<u8> = self.wire.drain(..want).collect();
                    self.server.handle_input(chunk.into());
                }
            }
        }
    }

    /// Drives the HELLO exchange the client started and returns its one event.
    pub fn connect(&mut self) -> ClientEvent {
        let events = self.drive().expect("the client accepts the server");
        assert_eq!(events.len(), 1, "one event for HELLO");
        events.into_iter().next().expect("one event")
    }

    /// Sends a request that has a response and returns it.
    pub fn call(&mut self, request: Request) -> Response {
        self.client
            .send(&request)
            .expect("a request the client can send");
        let events = self.drive().expect("the client accepts the answer");
        match events.as_slice() {
            [ClientEvent::Response(response)] => response.clone(),
            other => panic!(
                "expected one response, got {other:?} (server: {:?})",
                self.server_error
            ),
        }
    }

    /// Sends a request without a response.
    pub fn cast(&mut self, request: Request) {
        self.client
            .send(&request)
            .expect("a request the client can send");
        let events = self.drive().expect("the client stays healthy");
        assert!(events.is_empty(), "no answer expected, got {events:?}");
    }

    /// Allocates a buffer on device 0 and returns (handle, base).
    pub fn alloc(&mut self, size: u64) -> (u64, u64) {
        let Response::AllocBuffer {
            remote_ptr,
            remote_size,
        } = self.call(Request::AllocBuffer { device: 0, size })
        else {
            panic!("bad alloc response");
        };
        assert_ne!(remote_ptr, 0, "allocation of {size} bytes failed");
        assert_eq!(remote_size, size);
        let Response::BufferBase(base) = self.call(Request::BufferGetBase { buffer: remote_ptr })
        else {
            panic!("bad base response");
        };
        (remote_ptr, base)
    }
}
