//! `server_session`: arbitrary bytes, arbitrarily split, through the connection driver every
//! shell runs ([`Connection`]) over a small [`MemoryBackend`].
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
//! `Connection::receive_in_place` (in random-sized receives), the rest through `handle_input`.

use std::sync::{Arc, Mutex};

use arbitrary::Unstructured;
use bytes::Bytes;
use proto_core::backend::MemoryBackend;
use proto_core::dispatch::DispatcherConfig;
use proto_core::driver::{Action, CommWork, Connection, Place};
use proto_core::graph::GraphLimits;
use proto_core::session::{ServerEvent, ServerSessionConfig, MAX_DATA_CHUNK};
use proto_core::tensor_cache::MemoryTensorCache;
use proto_core::wire::{Dialect, ProtocolVersion, RESPONSE_HEADER_SIZE};

/// Events seen, and the streamed-write grammar, shared with the connection's observer.
type Observed = Arc<Mutex<(usize, StreamCheck)>>;

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
        ServerInput {
            flags,
            splits,
            stream: u.take_rest(),
        }
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
        let remaining = self
            .remaining
            .as_mut()
            .expect("in-place data outside a streamed write");
        assert!(n <= *remaining, "more in-place data than announced");
        *remaining -= n;
    }

    fn observe(&mut self, event: &ServerEvent, max_chunk: usize) {
        match event {
            ServerEvent::Request(request) => {
                assert!(
                    self.remaining.is_none(),
                    "request {request:?} inside a streamed write"
                );
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
                let remaining = self
                    .remaining
                    .as_mut()
                    .expect("data outside a streamed write");
                assert!(!chunk.is_empty(), "empty data chunk");
                assert!(
                    chunk.len() <= max_chunk,
                    "chunk of {} > max_chunk {max_chunk}",
                    chunk.len()
                );
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

/// The server side of the harness: the connection and backend built from the flag bits, with
/// every invariant checked as bytes go through. The seed generator drives it too.
pub struct Harness {
    flags: u8,
    backend: Arc<MemoryBackend>,
    conn: Connection<MemoryBackend>,
    observed: Observed,
    /// Response frames the server wrote (a size, then that many bytes).
    frames: FrameCount,
    stats: ServerStats,
    /// A streamed reply was cut short.
    truncated: bool,
}

impl Harness {
    /// A fresh connection configured by `flags`.
    pub fn new(flags: u8) -> Harness {
        let dialect = if flags & flag::V8 != 0 {
            Dialect::V8
        } else {
            Dialect::V7
        };
        let version = match dialect {
            Dialect::V7 => ProtocolVersion::V7_0_0,
            Dialect::V8 => ProtocolVersion::V8_0_0,
        };
        let max_chunk =
            [MAX_DATA_CHUNK, 1, 13, 4096][usize::from((flags >> flag::CHUNK_SHIFT) & 3)];
        let backend = Arc::new(MemoryBackend::new(2, DEVICE_CAPACITY));
        let mut config = DispatcherConfig::new(version);
        // Our remote-copy extension is offered, so EXTENSIONS and ids 0xF1-0xF3 are reachable.
        config.remote_copy = Some(Arc::new(proto_core::dispatch::TicketBoard::new()));
        if flags & flag::CACHE != 0 {
            config.tensor_cache = Some(Arc::new(MemoryTensorCache::default()));
        }
        if flags & flag::QUOTA != 0 {
            config.memory_quota = Some(1 << 20);
        }
        if flags & flag::SMALL_GRAPHS != 0 {
            config.graph_limits = GraphLimits {
                max_nodes: 2,
                max_tensors: 4,
            };
        }
        let session = ServerSessionConfig {
            dialect,
            max_message_size: MAX_MESSAGE_SIZE,
            max_chunk,
        };
        let mut conn =
            Connection::new(backend.clone(), &session, &config, false).expect("supported version");
        let observed: Observed = Arc::default();
        let seen = observed.clone();
        conn.observe(move |event| {
            let mut seen = seen.lock().expect("no panic while observing");
            seen.0 += 1;
            seen.1.observe(event, max_chunk);
        });
        Harness {
            flags,
            backend,
            conn,
            observed,
            frames: FrameCount::default(),
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
        self.conn.set_direct_io(true);
        let capacity = self.conn.in_place_capacity();
        if piece.len() % 2 == 1 && capacity > 0 {
            // a receive may fill only part of the region it is lent
            let want = (piece.len() / 2 + 1).min(capacity as usize);
            let source = piece;
            let placed = self.conn.receive_in_place(&mut |dst| {
                let n = want.min(dst.len());
                dst[..n].copy_from_slice(&source[..n]);
                n
            });
            match placed {
                Ok(Some(n)) => {
                    assert!(n as u64 <= capacity, "placed beyond the capacity");
                    self.observed
                        .lock()
                        .expect("not poisoned")
                        .1
                        .placed(n as u64);
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
        // Replies go through the transmit queue, piece by piece.
        self.conn.set_direct_io(false);
        if !piece.is_empty() {
            self.conn.handle_input(Bytes::copy_from_slice(piece));
        }
        let mut reply_sent = 0u64;
        loop {
            let action = match self.conn.poll(Place::Blocking) {
                Ok(action) => action,
                Err(error) => {
                    // Errors are final.
                    let again = self.conn.poll(Place::Blocking).map(|_| ()).unwrap_err();
                    assert_eq!(again, error, "error not sticky");
                    self.stats.error = Some(error.to_string());
                    // A shell still writes out the responses owed before the error.
                    self.drain(&mut out);
                    break;
                }
            };
            match action {
                Action::Transmit => {
                    let before = self.frames.bytes;
                    self.drain(&mut out);
                    if self.conn.reply_remaining() > 0 {
                        reply_sent += self.frames.bytes - before;
                        if reply_sent >= STREAM_PULL_LIMIT {
                            // The client stops reading a huge reply: the connection ends.
                            self.stats.error = Some("client stopped reading a reply".into());
                            self.truncated = true;
                            break;
                        }
                    } else {
                        reply_sent = 0;
                    }
                }
                Action::Comm(CommWork::Init(request)) => {
                    let ok = self.flags & flag::COMM_OK != 0;
                    if let Err(error) = self.conn.comm_init_done(request.device, ok) {
                        panic!("COMM_INIT's answer does not fit the session: {error}");
                    }
                }
                Action::Comm(CommWork::Allreduce { .. } | CommWork::Free { .. }) => {}
                // No second server: a remote copy's peer is unreachable.
                Action::Comm(CommWork::RemoteCopy(_)) => {
                    let unreachable = proto_core::wire::RemoteCopyStatus::PeerUnreachable;
                    if let Err(error) = self.conn.remote_copy_done(unreachable) {
                        panic!("REMOTE_COPY_TENSOR's answer does not fit the session: {error}");
                    }
                }
                // No second transport in memory: stay on TCP.
                Action::Upgrade(_) => {
                    if let Err(error) = self.conn.answer_hello([0; 24]) {
                        panic!("HELLO's answer does not fit the session: {error}");
                    }
                }
                Action::Offload | Action::SendInPlace => {
                    unreachable!("not on Place::Blocking without direct I/O")
                }
                Action::Receive(_) => {
                    // Whatever the session owed was answered, or the connection would stall.
                    assert_eq!(
                        self.conn.awaiting_response(),
                        None,
                        "a response is owed but none was produced"
                    );
                    break;
                }
            }
        }
        out
    }

    fn drain(&mut self, out: &mut Vec<u8>) {
        while let Some(bytes) = self.conn.poll_transmit() {
            self.frames.feed(&bytes);
            // Keep the server's bytes for the caller, except the bulk of huge replies.
            if out.len() < 1 << 20 {
                out.extend_from_slice(&bytes);
            }
        }
    }

    /// Ends the connection and checks that it released everything.
    pub fn finish(mut self) -> ServerStats {
        if !self.truncated {
            assert!(
                self.frames.whole(),
                "the server wrote part of a response frame"
            );
        }
        if self.flags & flag::EOF != 0 && !self.failed() {
            if let Err(error) = self.conn.handle_eof() {
                self.stats.error = Some(error.to_string());
            }
        }
        let backend = self.backend.clone();
        drop(self.conn);
        assert_eq!(
            backend.live_buffers(),
            0,
            "buffers leaked after the connection closed"
        );
        assert_eq!(backend.used_bytes(), 0);
        self.stats.events = self.observed.lock().expect("not poisoned").0;
        self.stats.responses = self.frames.frames;
        self.stats
    }
}

/// Splits the server's bytes into response frames (`size: u64`, then `size` bytes).
#[derive(Debug, Default)]
struct FrameCount {
    /// Bytes seen.
    bytes: u64,
    /// Complete frames.
    frames: usize,
    header: Vec<u8>,
    /// Payload bytes still due in the current frame.
    payload_left: u64,
}

impl FrameCount {
    fn feed(&mut self, mut data: &[u8]) {
        self.bytes += data.len() as u64;
        while !data.is_empty() {
            if self.payload_left > 0 {
                let take = self.payload_left.min(data.len() as u64) as usize;
                self.payload_left -= take as u64;
                data = &data[take..];
                if self.payload_left == 0 {
                    self.frames += 1;
                }
                continue;
            }
            let take = (RESPONSE_HEADER_SIZE - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.header.len() == RESPONSE_HEADER_SIZE {
                let size = u64::from_le_bytes(self.header[..8].try_into().expect("8 bytes"));
                self.header.clear();
                if size == 0 {
                    self.frames += 1;
                } else {
                    self.payload_left = size;
                }
            }
        }
    }

    fn whole(&self) -> bool {
        self.header.is_empty() && self.payload_left == 0
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
