//! `server_session`: arbitrary bytes, arbitrarily split, through a [`ServerSession`] and a
//! [`Dispatcher`] over a small [`MemoryBackend`].
//!
//! Input layout: `flags: u8`, then [`Splits`], then the byte stream the client "sent".
//!
//! | flags bit | meaning |
//! | --- | --- |
//! | 0 | dialect: 1 = protocol 8, 0 = protocol 7 |
//! | 1 | the dispatcher has a tensor cache (HELLO flag, SET_TENSOR_HASH hits) |
//! | 2-3 | session `max_chunk`: 16 MiB, 1, 13 or 4096 bytes |
//! | 4 | a 1 MiB per-connection memory quota |
//! | 5 | COMM_INIT link set-up succeeds (else it fails) |
//! | 6 | report EOF after the last piece |
//! | 7 | tiny graph limits (2 nodes, 4 tensors) |
//!
//! Pieces of odd length are delivered the way a shell with direct socket access delivers
//! streamed SET_TENSOR data: as much of the piece as the session's
//! `in_place_capacity` allows goes straight into backend memory through
//! `Dispatcher::receive_in_place` (in random-sized receives), the rest through `handle_input`.

use std::sync::Arc;

use arbitrary::Unstructured;
use bytes::Bytes;
use proto_core::backend::MemoryBackend;
use proto_core::dispatch::{Dispatcher, DispatcherConfig, Outcome, TensorReadStream, MAX_REPLY_CHUNK};
use proto_core::graph::GraphLimits;
use proto_core::session::{ServerEvent, ServerSession, ServerSessionConfig, MAX_DATA_CHUNK};
use proto_core::tensor_cache::MemoryTensorCache;
use proto_core::wire::{Dialect, ProtocolVersion, RESPONSE_HEADER_SIZE};

use crate::{byte, Splits};

/// Bytes per device of the fuzzed backend (two devices).
pub const DEVICE_CAPACITY: u64 = 32 << 20;
/// Most bytes of one streamed reply the simulated client reads before it hangs up.
pub const STREAM_PULL_LIMIT: u64 = 48 << 20;
/// The session's buffered-message limit.
pub const MAX_MESSAGE_SIZE: u64 = 4 << 20;

/// Flag bits (see the module documentation).
pub mod flag {
    /// Protocol 8.
    pub const V8: u8 = 1;
    /// Tensor cache.
    pub const CACHE: u8 = 2;
    /// `max_chunk` selector shift (2 bits).
    pub const CHUNK_SHIFT: u8 = 2;
    /// Memory quota.
    pub const QUOTA: u8 = 16;
    /// COMM_INIT succeeds.
    pub const COMM_OK: u8 = 32;
    /// EOF at the end.
    pub const EOF: u8 = 64;
    /// Tiny graph limits.
    pub const SMALL_GRAPHS: u8 = 128;
}

/// A decoded `server_session` input.
#[derive(Debug, Clone)]
pub struct ServerInput<'a> {
    /// Flag bits.
    pub flags: u8,
    /// How the stream is cut.
    pub splits: Splits,
    /// What the client sent.
    pub stream: &'a [u8],
}

impl<'a> ServerInput<'a> {
    /// Reads the layout.
    pub fn parse(data: &'a [u8]) -> ServerInput<'a> {
        let mut u = Unstructured::new(data);
        let flags = byte(&mut u);
        let splits = Splits::read(&mut u);
        ServerInput { flags, splits, stream: u.take_rest() }
    }

    /// Writes the layout.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.flags];
        self.splits.encode(&mut out);
        out.extend_from_slice(self.stream);
        out
    }
}

/// What a run did (for the seed generator's sanity checks).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServerStats {
    /// Events the session produced.
    pub events: usize,
    /// Responses sent.
    pub responses: usize,
    /// The error that ended the run, if any.
    pub error: Option<String>,
}

/// Checks the streamed-write event grammar: Begin, Data*, End, with chunk bounds.
#[derive(Debug, Default)]
struct StreamCheck {
    remaining: Option<u64>,
}

impl StreamCheck {
    /// Streamed data placed in memory directly, bypassing the events.
    fn placed(&mut self, n: u64) {
        let remaining = self.remaining.as_mut().expect("in-place data outside a streamed write");
        assert!(n <= *remaining, "more in-place data than announced");
        *remaining -= n;
    }

    fn observe(&mut self, event: &ServerEvent, max_chunk: usize) {
        match event {
            ServerEvent::Request(request) => {
                assert!(self.remaining.is_none(), "request {request:?} inside a streamed write");
                assert!(
                    request.bulk_data().is_none(),
                    "SET_TENSOR / SET_TENSOR_2D must stream, not arrive whole"
                );
            }
            ServerEvent::TensorWriteBegin { data_len, .. } => {
                assert!(self.remaining.is_none(), "nested streamed write");
                self.remaining = Some(*data_len);
            }
            ServerEvent::TensorData(chunk) => {
                let remaining = self.remaining.as_mut().expect("data outside a streamed write");
                assert!(!chunk.is_empty(), "empty data chunk");
                assert!(chunk.len() <= max_chunk, "chunk of {} > max_chunk {max_chunk}", chunk.len());
                assert!(chunk.len() as u64 <= *remaining, "more data than announced");
                *remaining -= chunk.len() as u64;
            }
            ServerEvent::TensorWriteEnd => {
                let remaining = self.remaining.take().expect("end outside a streamed write");
                assert_eq!(remaining, 0, "write ended with data missing");
            }
        }
    }
}

/// The server side of the harness: session, dispatcher and backend built from the flag bits,
/// with every invariant checked as bytes go through. The seed generator drives it too.
pub struct Harness {
    flags: u8,
    max_chunk: usize,
    backend: Arc<MemoryBackend>,
    dispatcher: Dispatcher<MemoryBackend>,
    session: ServerSession,
    check: StreamCheck,
    expected_out: u64,
    transmitted: u64,
    stats: ServerStats,
    /// A streamed reply was cut short.
    truncated: bool,
}

impl Harness {
    /// A fresh connection configured by `flags`.
    pub fn new(flags: u8) -> Harness {
        let dialect = if flags & flag::V8 != 0 { Dialect::V8 } else { Dialect::V7 };
        let version = match dialect {
            Dialect::V7 => ProtocolVersion::V7_0_0,
            Dialect::V8 => ProtocolVersion::V8_0_0,
        };
        let max_chunk =
            [MAX_DATA_CHUNK, 1, 13, 4096][usize::from((flags >> flag::CHUNK_SHIFT) & 3)];
        let backend = Arc::new(MemoryBackend::new(2, DEVICE_CAPACITY));
        let mut config = DispatcherConfig::new(version);
        if flags & flag::CACHE != 0 {
            config.tensor_cache = Some(Arc::new(MemoryTensorCache::default()));
        }
        if flags & flag::QUOTA != 0 {
            config.memory_quota = Some(1 << 20);
        }
        if flags & flag::SMALL_GRAPHS != 0 {
            config.graph_limits = GraphLimits { max_nodes: 2, max_tensors: 4 };
        }
        let dispatcher = Dispatcher::new(backend.clone(), config).expect("supported version");
        let session = ServerSession::new(ServerSessionConfig {
            dialect,
            max_message_size: MAX_MESSAGE_SIZE,
            max_chunk,
        });
        Harness {
            flags,
            max_chunk,
            backend,
            dispatcher,
            session,
            check: StreamCheck::default(),
            expected_out: 0,
            transmitted: 0,
            stats: ServerStats::default(),
            truncated: false,
        }
    }

    /// Whether the connection failed (the server would close it).
    pub fn failed(&self) -> bool {
        self.stats.error.is_some()
    }

    /// Feeds received bytes, runs every event they complete, and returns what the server wrote.
    pub fn feed(&mut self, piece: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.failed() {
            return out;
        }
        let mut piece = piece;
        if piece.len() % 2 == 1 && self.session.in_place_capacity() > 0 {
            let capacity = self.session.in_place_capacity();
            // a receive may fill only part of the region it is lent
            let want = (piece.len() / 2 + 1).min(capacity as usize);
            let source = piece;
            let placed = self.dispatcher.receive_in_place(&mut self.session, &mut |dst| {
                let n = want.min(dst.len());
                dst[..n].copy_from_slice(&source[..n]);
                n
            });
            match placed {
                Ok(Some(n)) => {
                    assert!(n as u64 <= capacity, "placed beyond the capacity");
                    self.check.placed(n as u64);
                    piece = &piece[n..];
                }
                // declined (the tensor cache stores this write): the buffered path
                Ok(None) => {}
                Err(error) => {
                    self.stats.error = Some(error.to_string());
                    return out;
                }
            }
        }
        if !piece.is_empty() {
            self.session.handle_input(Bytes::copy_from_slice(piece));
        }
        loop {
            let event = match self.session.poll_event() {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(error) => {
                    // Errors are final.
                    assert_eq!(self.session.poll_event(), Err(error.clone()), "error not sticky");
                    self.stats.error = Some(error.to_string());
                    break;
                }
            };
            self.stats.events += 1;
            self.check.observe(&event, self.max_chunk);
            let response = match self.dispatcher.handle(event) {
                Ok(Outcome::Respond(response)) => Some(response),
                Ok(Outcome::RespondStream(stream)) => {
                    if !self.stream_reply(stream, &mut out) {
                        break;
                    }
                    None
                }
                Ok(Outcome::CommInit(request)) => {
                    let ok = self.flags & flag::COMM_OK != 0;
                    Some(self.dispatcher.finish_comm_init(request.device, ok))
                }
                Ok(Outcome::Done | Outcome::CommAllreduce { .. } | Outcome::CommFree { .. }) => {
                    None
                }
                Err(error) => {
                    self.stats.error = Some(error.to_string());
                    break;
                }
            };
            if let Some(response) = response {
                self.expected_out += RESPONSE_HEADER_SIZE as u64 + response.payload_len();
                if let Err(error) = self.session.send_response(&response) {
                    panic!("the dispatcher's response {response:?} does not fit the session: {error}");
                }
                self.stats.responses += 1;
            }
            // The dispatcher answered whatever the session owed, or the session would stall.
            assert_eq!(
                self.session.awaiting_response(),
                None,
                "a response is owed but none was produced"
            );
        }
        self.drain(&mut out);
        out
    }

    /// Sends a streamed GET_TENSOR / GET_TENSOR_2D reply piece by piece, writing out each piece
    /// before the next is read, as a shell does. A reply larger than [`STREAM_PULL_LIMIT`] is
    /// cut short: the client stops reading and the connection ends (the run stops). Returns
    /// whether the connection goes on.
    fn stream_reply(&mut self, mut stream: TensorReadStream, out: &mut Vec<u8>) -> bool {
        let len = stream.len();
        assert!(len > 0, "an empty reply needs no stream");
        if let Err(error) =
            self.session.begin_response_stream(stream.command(), len)
        {
            panic!("the dispatcher's {:?} stream does not fit the session: {error}", stream.command());
        }
        let mut sent = 0u64;
        loop {
            self.drain(out);
            if sent >= STREAM_PULL_LIMIT && sent < len {
                self.stats.error = Some(format!("client stopped reading a {len}-byte reply"));
                self.truncated = true;
                return false;
            }
            match self.dispatcher.read_chunk(&mut stream) {
                Ok(Some(piece)) => {
                    assert!(!piece.is_empty() && piece.len() as u64 <= MAX_REPLY_CHUNK);
                    sent += piece.len() as u64;
                    assert!(sent <= len, "streamed more than announced");
                    self.session.send_response_data(piece).expect("piece fits the reply");
                }
                Ok(None) => break,
                Err(error) => {
                    self.stats.error = Some(error.to_string());
                    self.truncated = true;
                    return false;
                }
            }
        }
        assert_eq!(sent, len, "streamed reply shorter than announced");
        self.expected_out += RESPONSE_HEADER_SIZE as u64 + len;
        self.stats.responses += 1;
        true
    }

    fn drain(&mut self, out: &mut Vec<u8>) {
        while let Some(bytes) = self.session.poll_transmit() {
            self.transmitted += bytes.len() as u64;
            // Keep the server's bytes for the caller, except the bulk of huge replies.
            if out.len() < 1 << 20 {
                out.extend_from_slice(&bytes);
            }
        }
    }

    /// Ends the connection and checks that it released everything.
    pub fn finish(mut self) -> ServerStats {
        if !self.truncated {
            assert_eq!(
                self.transmitted, self.expected_out,
                "transmitted bytes differ from the responses"
            );
        }
        if self.flags & flag::EOF != 0 && !self.failed() {
            if let Err(error) = self.session.handle_eof() {
                self.stats.error = Some(error.to_string());
            }
        }
        let backend = self.backend.clone();
        drop(self.session);
        drop(self.dispatcher);
        assert_eq!(backend.live_buffers(), 0, "buffers leaked after the connection closed");
        assert_eq!(backend.used_bytes(), 0);
        self.stats
    }
}

/// Runs one input. Panics on a broken invariant.
pub fn run(data: &[u8]) -> ServerStats {
    let input = ServerInput::parse(data);
    let mut harness = Harness::new(input.flags);
    for piece in input.splits.pieces(input.stream) {
        harness.feed(piece);
        if harness.failed() {
            break;
        }
    }
    harness.finish()
}
