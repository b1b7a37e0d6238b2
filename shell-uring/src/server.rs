//! The io_uring server: accept loop, per-connection drivers, limits and graceful shutdown.
//!
//! Each ring thread owns one io_uring instance and serves many clients on it (with
//! [`ServerConfig::rings`] > 1, each ring accepts on its own duplicate of the listener and keeps
//! the clients it accepted). A connection has at most one socket operation in flight at a time,
//! except while a SET_TENSOR chunk is being written to the backend, when the next chunk is
//! already being received.
//!
//! Per connection the loop is the tokio shell's: drive the [`Core`] until it needs input, write
//! its transmit queue with one `sendmsg` straight from the response `Bytes`, then receive —
//! between messages into one reusable 64 KiB buffer. During a streamed write the data goes
//! straight into backend memory: one non-blocking `recv` fills the destination region the
//! dispatcher lends for that call (memory the kernel must not hold across completions, so no
//! `RECV` op points into it). A large GET_TENSOR reply is sent the same way, with non-blocking
//! `send`s from the lent region. These direct transfers are optimistic: a connection whose
//! transfer goes on is queued in the loop's ready queue and simply tried again on the next
//! pass (one call per connection per pass, so a large transfer does not starve the others;
//! while the queue is not empty the loop only collects completions, it does not wait for
//! them); only when a call finds the socket empty (full) does a `POLL_ADD` wait until it is
//! readable (writable) again. One large direct transfer (4 MiB or more to go) at a time runs on
//! the ring thread; further ones that start meanwhile run on blocking threads (non-blocking
//! calls with `poll` in between, the core and a share of the socket with them), so the copies
//! of many clients' transfers proceed on several cores: at most
//! [`ServerConfig::direct_threads`] at once (by default the cores but the ring's), the rest take
//! turns on the ring thread. More copying threads than cores only add context switches (with
//! sixteen clients on two cores, a thread per transfer moved 10 % less than the tokio shell).
//! A transfer there whose socket stalls for 100 ms comes back, and the ring waits for readiness
//! with a `POLL_ADD` before the next one, so a client that stops reading or writing holds no
//! thread. Where the dispatcher declines (the tensor cache also stores the data, data arrived
//! buffered with the header, a backend without host memory), streamed data is received into a
//! buffer of `min(stream_remaining, chunk)` bytes with `MSG_WAITALL`, handed to the session
//! whole, and replies go piece by piece through the transmit queue. Heavy events and comm link work go to
//! a blocking thread with the whole `Core`; the ring goes on serving the others and the core
//! comes back through the ring's mailbox (an eventfd the ring always has a read posted on).
//! Freeing a large buffer is heavy work too, and so is freeing a closing client that held
//! [`HEAVY_FREE_BYTES`](shell_common::HEAVY_FREE_BYTES) or more (unmapping a GiB takes about
//! 100 ms, which the ring's other clients would wait out); `join` waits for those frees.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use proto_core::backend::Backend;
use proto_core::session::MAX_DATA_CHUNK;
use proto_core::wire::ProtocolVersion;
pub use shell_common::config::{
    DEFAULT_COMM_TIMEOUT, DEFAULT_MAX_CLIENTS, DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_SHUTDOWN_GRACE,
};

use shell_common::shell::{
    self, ClientSlot, ClientSlots, Closed, ConnectionError, FINAL_FLUSH_TIMEOUT, READ_SIZE,
};

use crate::core::{ConnectionConfig, Core, Stop, Work};
use crate::pool::Pool;
use crate::ring::{self, Completion, EventFd, OpId, Ring, Tag};

/// Default for [`ServerConfig::stream_chunk`]: 8 MiB (two are alive at once per streaming
/// client: one being written to the backend, the next being received).
pub const DEFAULT_STREAM_CHUNK: usize = 8 << 20;

/// Data chunks kept for reuse per streaming connection.
const HELD_CHUNKS: usize = 2;
/// Submission queue entries per ring.
const RING_ENTRIES: u32 = 512;
/// A direct transfer with at least this many bytes to go that starts while another one runs on
/// the ring runs on a blocking thread (non-blocking calls and `poll`), so the copies of several
/// large transfers proceed on several cores.
const DIRECT_OFFLOAD_BYTES: u64 = 4 << 20;
/// How long a direct transfer on a blocking thread waits for a socket that neither takes nor
/// gives data before handing the wait back to the ring (a stalled client holds no thread).
const DIRECT_STALL: Duration = Duration::from_millis(100);
/// Most blocking threads.
const MAX_BLOCKING_THREADS: usize = 256;

const TAG_ACCEPT: Tag = 0;
const TAG_WAKE: Tag = 1;
const TAG_GRACE: Tag = 2;
const TAG_ACCEPT_RETRY: Tag = 3;

/// Settings of a server: the knobs every shell shares, plus the ring layout.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The settings every shell takes (version, limits, cache, timeouts).
    pub base: shell_common::ServerConfig,
    /// Ring threads (each serves the clients it accepted); at least 1.
    pub rings: usize,
    /// Size of each receive of streamed tensor data (at most 16 MiB).
    pub stream_chunk: usize,
    /// Most large direct transfers of one ring's clients that run on blocking threads at once
    /// (at least 1); further ones share the ring thread. Default: the cores but one (the ring
    /// thread's), at least 1: more copying threads than cores only add context switches.
    pub direct_threads: usize,
}

impl ServerConfig {
    /// Defaults for a version: one ring, the shared defaults of [`shell_common::ServerConfig`].
    pub fn new(version: ProtocolVersion) -> ServerConfig {
        ServerConfig::from_base(shell_common::ServerConfig::new(version))
    }

    /// The shared settings `base`, with one ring and [`DEFAULT_STREAM_CHUNK`].
    pub fn from_base(base: shell_common::ServerConfig) -> ServerConfig {
        ServerConfig {
            base,
            rings: 1,
            stream_chunk: DEFAULT_STREAM_CHUNK,
            direct_threads: std::thread::available_parallelism()
                .map_or(1, |cores| cores.get().saturating_sub(1))
                .max(1),
        }
    }
}

/// A heavy piece of work that came back from a blocking thread.
struct Returned {
    tag: Tag,
    core: Box<Core>,
    stop: Stop,
    /// How a direct transfer run on the blocking thread ended (`None`: other work).
    direct: Option<DirectEnd>,
}

/// How a direct transfer on a blocking thread ([`Loop::offload_direct`]) ended.
enum DirectEnd {
    /// Nothing left to move directly (the core says what comes next).
    Done,
    /// The socket stayed empty (full) for [`DIRECT_STALL`]: the ring waits for it instead.
    Stalled,
    /// The dispatcher declined to lend memory for the streamed write (`false`) or the reply
    /// (`true`): take the buffered path.
    Declined {
        writable: bool,
    },
    /// The peer closed its side.
    Eof,
    Io(io::Error),
}

/// Where blocking threads return cores to a ring.
struct Mailbox {
    returned: Mutex<Vec<Returned>>,
    eventfd: EventFd,
}

impl Mailbox {
    fn deliver(&self, returned: Returned) {
        self.returned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(returned);
        self.eventfd.wake();
    }

    fn take(&self) -> Vec<Returned> {
        std::mem::take(
            &mut *self
                .returned
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }
}

struct Shared {
    backend: Arc<dyn Backend>,
    connection: ConnectionConfig,
    slots: ClientSlots,
    shutdown_grace: Duration,
    stream_chunk: usize,
    direct_threads: usize,
    stop: AtomicBool,
    announced: AtomicBool,
    mailboxes: Vec<Arc<Mailbox>>,
    pool: Pool,
    /// Closing connections whose buffers a blocking thread is freeing ([`Server::join`] waits
    /// for them).
    freeing: Freeing,
}

/// A count of connections being freed on blocking threads, that one can wait to reach zero.
#[derive(Default)]
struct Freeing {
    count: Mutex<usize>,
    done: std::sync::Condvar,
}

impl Freeing {
    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.count
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn begin(&self) {
        *self.lock() += 1;
    }

    fn end(&self) {
        let mut count = self.lock();
        *count -= 1;
        if *count == 0 {
            self.done.notify_all();
        }
    }

    fn wait(&self) {
        let mut count = self.lock();
        while *count > 0 {
            count = self
                .done
                .wait(count)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

/// Asks a running [`Server`] to shut down (cheap to clone, usable from any thread).
#[derive(Clone)]
pub struct Stopper(Arc<Shared>);

impl Stopper {
    /// Stops accepting, closes idle clients, lets busy ones finish their current command.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        for mailbox in &self.0.mailboxes {
            mailbox.eventfd.wake();
        }
    }
}

impl std::fmt::Debug for Stopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stopper").finish_non_exhaustive()
    }
}

/// A running io_uring server.
#[derive(Debug)]
pub struct Server {
    stopper: Stopper,
    threads: Vec<JoinHandle<()>>,
    local_addr: SocketAddr,
}

impl Server {
    /// Starts serving clients accepted on `listener` on [`ServerConfig::rings`] ring threads.
    ///
    /// Fails, before anything is served, for an unsupported version, or when the kernel refuses
    /// io_uring (the error then reads "io_uring is not available: ...").
    pub fn start(
        listener: TcpListener,
        backend: Arc<dyn Backend>,
        config: ServerConfig,
    ) -> io::Result<Server> {
        let connection = config.base.connection_config()?;
        let local_addr = listener.local_addr()?;
        let rings = config.rings.max(1);
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let mut mailboxes = Vec::with_capacity(rings);
        for _ in 0..rings {
            mailboxes.push(Arc::new(Mailbox {
                returned: Mutex::new(Vec::new()),
                eventfd: EventFd::new()?,
            }));
        }
        let shared = Arc::new(Shared {
            backend,
            connection,
            slots: ClientSlots::new(config.base.max_clients),
            shutdown_grace: config.base.shutdown_grace,
            stream_chunk: config.stream_chunk.clamp(1, MAX_DATA_CHUNK),
            direct_threads: config.direct_threads.max(1),
            stop: AtomicBool::new(false),
            announced: AtomicBool::new(false),
            mailboxes,
            pool: Pool::new(MAX_BLOCKING_THREADS, dispatch.clone()),
            freeing: Freeing::default(),
        });
        let mut listeners = Vec::with_capacity(rings);
        for _ in 1..rings {
            listeners.push(listener.try_clone()?);
        }
        listeners.push(listener);
        let mut server = Server {
            stopper: Stopper(shared.clone()),
            threads: Vec::with_capacity(rings),
            local_addr,
        };
        for (index, listener) in listeners.into_iter().enumerate() {
            let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
            let shared = shared.clone();
            let dispatch = dispatch.clone();
            let thread = std::thread::Builder::new()
                .name(format!("rpc-uring-{index}"))
                .spawn(move || {
                    let _dispatch = tracing::dispatcher::set_default(&dispatch);
                    match Ring::new(RING_ENTRIES) {
                        Err(error) => {
                            let _ = ready_tx.send(Err(error));
                        }
                        Ok(ring) => {
                            let _ = ready_tx.send(Ok(()));
                            let mailbox = shared.mailboxes[index].clone();
                            Loop::new(ring, shared, mailbox, listener).run();
                        }
                    }
                })?;
            server.threads.push(thread);
            let ready = ready_rx
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("the ring thread died")));
            if let Err(error) = ready {
                server.stop();
                server.join();
                return Err(io::Error::new(
                    error.kind(),
                    format!("io_uring is not available: {error}"),
                ));
            }
        }
        Ok(server)
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A handle that shuts the server down from anywhere.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Asks the server to shut down (see [`Stopper::stop`]); [`join`](Self::join) waits.
    pub fn stop(&self) {
        self.stopper.stop();
    }

    /// Waits until every ring thread has ended: after a [`stop`](Self::stop), once every
    /// connection closed or the grace period ran out. Every buffer the clients held is freed by
    /// then (except those of commands still running on a blocking thread after the grace
    /// period, which are freed when the command ends).
    pub fn join(mut self) {
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!("a ring thread panicked");
            }
        }
        self.stopper.0.freeing.wait();
        self.stopper.0.pool.close();
    }
}

/// Checks that this kernel lets this process use io_uring with the operations the server needs.
pub fn probe() -> io::Result<()> {
    Ring::new(8).map(drop).map_err(|error| {
        io::Error::new(error.kind(), format!("io_uring is not available: {error}"))
    })
}

/// How a connection ended (for the log).
type Ending = Result<Closed, ConnectionError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    /// Receiving between messages (cancelled by a shutdown).
    Idle,
    /// Receiving streamed tensor data.
    Stream,
    /// Waiting until streamed tensor data can be received straight into backend memory.
    StreamReady,
    /// Waiting until a large reply can be sent straight from backend memory.
    ReplyReady,
    Send,
}

enum AfterSend {
    Continue,
    Offload(Work),
    Close(Ending),
}

struct Conn {
    /// The client's place among the server's clients, freed when the connection is.
    slot: ClientSlot,
    /// Shared with a blocking thread while it runs a direct transfer.
    stream: Arc<TcpStream>,
    span: tracing::Span,
    /// `None` while on a blocking thread.
    core: Option<Box<Core>>,
    read_buf: BytesMut,
    op: Option<(OpId, OpKind)>,
    /// Streamed data received while the core was away.
    stash: Option<(BytesMut, io::Result<usize>)>,
    /// The last data chunks handed to the session: once the backend has written them and
    /// dropped its slices, their memory receives the next chunks (no fresh pages to fault in
    /// for every chunk). Released when the streamed write ends.
    held: Vec<Bytes>,
    after_send: AfterSend,
    /// What the blocking thread returned while an operation was still in flight.
    parked: Option<Stop>,
    /// Set when the connection fails while an operation is in flight: close once it is done.
    ending: Option<Ending>,
    /// The streamed write in progress is received into buffers (the dispatcher declined to
    /// lend backend memory for it).
    buffered_stream: bool,
    /// A direct transfer on a blocking thread found the socket stalled: the ring waits for
    /// readiness before the next one.
    stalled: bool,
    /// Counted in [`Loop::ring_direct`] (until the connection's next `advance`).
    ring_direct: bool,
}

/// Connections of one ring, addressed by tags that are never reused (index + generation).
#[derive(Default)]
struct Conns {
    slots: Vec<(u32, Option<Conn>)>,
    free: Vec<usize>,
    len: usize,
}

impl Conns {
    fn insert(&mut self, conn: Conn) -> Tag {
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push((0, None));
            self.slots.len() - 1
        });
        let slot = &mut self.slots[index];
        // Generation 0 is reserved for the ring's own tags.
        slot.0 = slot.0.checked_add(1).unwrap_or(1);
        slot.1 = Some(conn);
        self.len += 1;
        (u64::from(slot.0) << 32) | index as u64
    }

    fn split(tag: Tag) -> (usize, u32) {
        ((tag & 0xffff_ffff) as usize, (tag >> 32) as u32)
    }

    fn get_mut(&mut self, tag: Tag) -> Option<&mut Conn> {
        let (index, generation) = Conns::split(tag);
        match self.slots.get_mut(index) {
            Some((g, Some(conn))) if *g == generation => Some(conn),
            _ => None,
        }
    }

    fn remove(&mut self, tag: Tag) -> Option<Conn> {
        let (index, generation) = Conns::split(tag);
        match self.slots.get_mut(index) {
            Some((g, conn @ Some(_))) if *g == generation => {
                self.free.push(index);
                self.len -= 1;
                conn.take()
            }
            _ => None,
        }
    }

    fn tags(&self) -> Vec<Tag> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, (_, conn))| conn.is_some())
            .map(|(index, (generation, _))| (u64::from(*generation) << 32) | index as u64)
            .collect()
    }
}

/// One ring thread's event loop.
struct Loop {
    ring: Ring,
    shared: Arc<Shared>,
    mailbox: Arc<Mailbox>,
    listener: Option<TcpListener>,
    accept_op: Option<OpId>,
    conns: Conns,
    /// Connections whose next direct transfer is tried right away, without waiting for
    /// readiness through the ring (the kind says which direction), in turn: one non-blocking
    /// call each per pass, so a large transfer does not starve the others.
    ready: VecDeque<(Tag, OpKind)>,
    /// Connections running a large direct transfer on this ring (flagged `ring_direct`).
    ring_direct: usize,
    /// Direct transfers of this ring's connections running on blocking threads.
    offloaded_direct: usize,
    /// Most of those at once ([`ServerConfig::direct_threads`]).
    max_offloaded_direct: usize,
    stopping: bool,
}

impl Loop {
    fn new(ring: Ring, shared: Arc<Shared>, mailbox: Arc<Mailbox>, listener: TcpListener) -> Loop {
        Loop {
            ring,
            mailbox,
            listener: Some(listener),
            accept_op: None,
            conns: Conns::default(),
            ready: VecDeque::new(),
            ring_direct: 0,
            offloaded_direct: 0,
            max_offloaded_direct: shared.direct_threads,
            shared,
            stopping: false,
        }
    }

    fn run(mut self) {
        self.post_accept();
        self.ring.wait_wake(TAG_WAKE, &self.mailbox.eventfd);
        let mut batch = Vec::new();
        while !(self.stopping && self.listener.is_none() && self.conns.len == 0) {
            // With direct transfers to try, completions are only collected, not waited for.
            let submitted = if self.ready.is_empty() {
                self.ring.submit_and_wait(None)
            } else {
                self.ring.submit_no_wait()
            };
            if let Err(error) = submitted {
                tracing::error!(%error, "io_uring wait failed; closing every connection");
                break;
            }
            self.ring.completions(&mut batch);
            for (tag, completion) in batch.drain(..) {
                self.on_completion(tag, completion);
            }
            // One pass: each connection queued now gets one transfer; those that moved data
            // queue up again behind the others.
            for _ in 0..self.ready.len() {
                if let Some((tag, kind)) = self.ready.pop_front() {
                    self.transfer(tag, kind);
                }
            }
        }
        for tag in self.conns.tags() {
            self.drop_conn(tag);
        }
    }

    fn on_completion(&mut self, tag: Tag, completion: Completion) {
        match completion {
            Completion::Internal => {}
            Completion::Accept(result) => self.on_accept(result),
            Completion::Wake => self.on_wake(),
            Completion::Timer if tag == TAG_GRACE => self.on_grace(),
            Completion::Timer => self.post_accept(),
            Completion::Recv { buf, result } => self.on_recv(tag, buf, result),
            Completion::Send { bufs, result } => self.on_send(tag, bufs, result),
            Completion::Ready(result) => self.on_ready(tag, result),
        }
    }

    fn post_accept(&mut self) {
        if self.stopping || self.accept_op.is_some() {
            return;
        }
        if let Some(listener) = &self.listener {
            self.accept_op = Some(self.ring.accept(TAG_ACCEPT, listener.as_raw_fd()));
        }
    }

    fn on_accept(&mut self, result: io::Result<TcpStream>) {
        self.accept_op = None;
        if self.stopping {
            // Cancelled (or a client that raced the shutdown: dropped).
            self.listener = None;
            return;
        }
        let stream = match result {
            Ok(stream) => stream,
            Err(error) => {
                shell::accept_failed(&error);
                self.ring.timer(TAG_ACCEPT_RETRY, shell::ACCEPT_PAUSE);
                return;
            }
        };
        self.post_accept();
        let peer = match stream.peer_addr() {
            Ok(peer) => peer,
            Err(error) => return shell::accept_failed(&error),
        };
        let shared = &self.shared;
        let Some(slot) = shared.slots.admit(peer) else {
            return;
        };
        let span = tracing::info_span!("client", %peer, shell = "uring");
        let core = {
            let _entered = span.enter();
            shell::accepted(&stream);
            Core::new(shared.backend.clone(), &shared.connection)
        };
        let conn = Conn {
            slot,
            stream: Arc::new(stream),
            span,
            core: None,
            read_buf: BytesMut::new(),
            op: None,
            stash: None,
            held: Vec::new(),
            after_send: AfterSend::Continue,
            parked: None,
            ending: None,
            buffered_stream: false,
            stalled: false,
            ring_direct: false,
        };
        let tag = self.conns.insert(conn);
        match core {
            Ok(core) => {
                if let Some(conn) = self.conns.get_mut(tag) {
                    conn.core = Some(Box::new(core));
                }
                self.advance(tag, None);
            }
            Err(error) => self.finish(tag, Err(error.into())),
        }
    }

    fn on_wake(&mut self) {
        self.ring.wait_wake(TAG_WAKE, &self.mailbox.eventfd);
        if self.shared.stop.load(Ordering::SeqCst) && !self.stopping {
            self.begin_stop();
        }
        for returned in self.mailbox.take() {
            self.on_returned(returned);
        }
    }

    fn begin_stop(&mut self) {
        self.stopping = true;
        if !self.shared.announced.swap(true, Ordering::SeqCst) {
            shell::stopping(self.shared.slots.active());
        }
        match self.accept_op {
            Some(op) => self.ring.cancel(op),
            None => self.listener = None,
        }
        for tag in self.conns.tags() {
            if let Some(conn) = self.conns.get_mut(tag) {
                if let Some((op, OpKind::Idle)) = conn.op {
                    self.ring.cancel(op);
                }
            }
        }
        if self.conns.len > 0 {
            self.ring.timer(TAG_GRACE, self.shared.shutdown_grace);
        }
    }

    fn on_grace(&mut self) {
        if self.conns.len == 0 {
            return;
        }
        shell::grace_over(self.conns.len);
        for tag in self.conns.tags() {
            self.drop_conn(tag);
        }
    }

    /// Drops a connection without further ado (its operation, if any, is cancelled; a core on
    /// a blocking thread is dropped when it comes back).
    fn drop_conn(&mut self, tag: Tag) {
        if let Some(conn) = self.conns.remove(tag) {
            if let Some((op, _)) = conn.op {
                self.ring.cancel(op);
            }
            // A direct transfer on a blocking thread stops at once.
            let _ = conn.stream.shutdown(std::net::Shutdown::Both);
            if conn.ring_direct {
                self.ring_direct -= 1;
            }
            drop(conn);
        }
    }

    fn on_returned(&mut self, returned: Returned) {
        let Returned {
            tag,
            core,
            stop,
            direct,
        } = returned;
        if direct.is_some() {
            self.offloaded_direct -= 1;
        }
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        conn.core = Some(core);
        if conn.ending.is_none() && matches!(stop, Stop::Idle) {
            match direct {
                None | Some(DirectEnd::Done) | Some(DirectEnd::Declined { writable: true }) => {}
                Some(DirectEnd::Declined { writable: false }) => conn.buffered_stream = true,
                Some(DirectEnd::Stalled) => conn.stalled = true,
                Some(DirectEnd::Eof) => return self.on_direct_eof(tag),
                Some(DirectEnd::Io(error)) => {
                    return self.finish(tag, Err(ConnectionError::Io(error)))
                }
            }
        }
        if conn.ending.is_some() {
            if conn.op.is_none() {
                if let Some(ending) = conn.ending.take() {
                    self.finish(tag, ending);
                }
            }
            return;
        }
        match stop {
            Stop::Failed(error) => self.fail(tag, error),
            // The operation in flight (the previous reply piece being sent, the next data chunk
            // being received) continues the connection when it completes.
            stop if conn.op.is_some() => conn.parked = Some(stop),
            stop => self.resume(tag, stop),
        }
    }

    /// Continues a connection whose core came back, with no operation in flight.
    fn resume(&mut self, tag: Tag, stop: Stop) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        if let Some((buf, result)) = conn.stash.take() {
            if !matches!(stop, Stop::Idle) {
                return self.fail(
                    tag,
                    proto_core::Error::InvalidState("work returned during a streamed write"),
                );
            }
            return self.stream_received(tag, buf, result);
        }
        self.advance(tag, not_idle(stop));
    }

    /// Drives the connection's core and starts its next socket operation.
    fn advance(&mut self, tag: Tag, first: Option<Stop>) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        if std::mem::take(&mut conn.ring_direct) {
            self.ring_direct -= 1;
        }
        let Some(core) = conn.core.as_mut() else {
            return;
        };
        let stop = match first {
            Some(stop) => stop,
            None => {
                let _entered = conn.span.enter();
                core.drive(false)
            }
        };
        let fd = conn.stream.as_raw_fd();
        match stop {
            Stop::Failed(error) => return self.fail(tag, error),
            Stop::SendInPlace => {
                // The head first, then the data straight from backend memory.
                if !core.outbox.is_empty() {
                    return self.send_outbox(tag, AfterSend::Continue, None);
                }
                if std::mem::take(&mut conn.stalled) {
                    let op = self.ring.poll(tag, fd, true);
                    conn.op = Some((op, OpKind::ReplyReady));
                    return;
                }
                if core.conn.reply_remaining() >= DIRECT_OFFLOAD_BYTES {
                    if self.ring_direct > 0 && self.offloaded_direct < self.max_offloaded_direct {
                        return self.offload_direct(tag, true);
                    }
                    conn.ring_direct = true;
                    self.ring_direct += 1;
                }
                // The socket is most likely writable: try first, poll only if it is not.
                self.ready.push_back((tag, OpKind::ReplyReady));
                return;
            }
            Stop::Work(work) => {
                if core.outbox.is_empty() {
                    return self.offload(tag, work);
                }
                // Responses first: the client may be waiting for them.
                return self.send_outbox(tag, AfterSend::Offload(work), None);
            }
            Stop::Idle => {}
        }
        if !core.outbox.is_empty() {
            return self.send_outbox(tag, AfterSend::Continue, None);
        }
        let remaining = core.conn.stream_remaining();
        if remaining > 0 {
            // Streamed tensor data: finished even during shutdown (the grace period bounds it).
            if core.conn.in_place_capacity() > 0 && !conn.buffered_stream {
                if std::mem::take(&mut conn.stalled) {
                    let op = self.ring.poll(tag, fd, false);
                    conn.op = Some((op, OpKind::StreamReady));
                    return;
                }
                if remaining >= DIRECT_OFFLOAD_BYTES {
                    if self.ring_direct > 0 && self.offloaded_direct < self.max_offloaded_direct {
                        return self.offload_direct(tag, false);
                    }
                    conn.ring_direct = true;
                    self.ring_direct += 1;
                }
                // Data most likely arrived with the header or since the last receive: try
                // first, poll only if nothing is there.
                self.ready.push_back((tag, OpKind::StreamReady));
                return;
            }
            let want = usize::try_from(remaining)
                .unwrap_or(usize::MAX)
                .min(self.shared.stream_chunk);
            let buf = stream_buffer(&mut conn.held, want);
            let op = self.ring.recv(tag, fd, buf, want, true);
            conn.op = Some((op, OpKind::Stream));
            return;
        }
        conn.held.clear();
        conn.buffered_stream = false;
        if self.stopping {
            return self.finish(tag, Ok(Closed::Shutdown));
        }
        let buf = std::mem::take(&mut conn.read_buf);
        let op = self.ring.recv(tag, fd, buf, READ_SIZE, false);
        conn.op = Some((op, OpKind::Idle));
    }

    /// Hands the core and `work` to a blocking thread. While a data chunk is written to the
    /// backend there, the next chunk is already being received here.
    fn offload(&mut self, tag: Tag, work: Work) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        let Some(mut core) = conn.core.take() else {
            return;
        };
        // During a streamed write the heavy work is a data chunk.
        let remaining = core.conn.stream_remaining();
        if matches!(work, Work::Heavy) && remaining > 0 && conn.op.is_none() {
            let want = usize::try_from(remaining)
                .unwrap_or(usize::MAX)
                .min(self.shared.stream_chunk);
            let fd = conn.stream.as_raw_fd();
            let buf = stream_buffer(&mut conn.held, want);
            let op = self.ring.recv(tag, fd, buf, want, true);
            conn.op = Some((op, OpKind::Stream));
        }
        let mailbox = self.mailbox.clone();
        let span = conn.span.clone();
        self.shared.pool.execute(move || {
            let stop = span.in_scope(|| core.run(work));
            mailbox.deliver(Returned {
                tag,
                core,
                stop,
                direct: None,
            });
        });
    }

    /// Runs the direct transfer in progress (a reply's data with `writable`, a streamed write's
    /// otherwise) on a blocking thread with the core: non-blocking calls, `poll` in between.
    fn offload_direct(&mut self, tag: Tag, writable: bool) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        let Some(mut core) = conn.core.take() else {
            return;
        };
        let stream = conn.stream.clone();
        let mailbox = self.mailbox.clone();
        let span = conn.span.clone();
        self.offloaded_direct += 1;
        self.shared.pool.execute(move || {
            let (stop, end) = span.in_scope(|| direct_blocking(&mut core, &stream, writable));
            // The ring alone owns the socket again before it sees the core.
            drop(stream);
            mailbox.deliver(Returned {
                tag,
                core,
                stop,
                direct: Some(end),
            });
        });
    }

    fn on_direct_eof(&mut self, tag: Tag) {
        let Some(core) = self.conns.get_mut(tag).and_then(|conn| conn.core.as_mut()) else {
            return;
        };
        let ending = shell::end_of_input(&mut core.conn);
        self.finish(tag, ending);
    }

    fn send_outbox(&mut self, tag: Tag, after: AfterSend, timeout: Option<Duration>) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        let Some(core) = conn.core.as_mut() else {
            return;
        };
        let bufs = std::mem::take(&mut core.outbox);
        conn.after_send = after;
        let op = self.ring.send(tag, conn.stream.as_raw_fd(), bufs, timeout);
        conn.op = Some((op, OpKind::Send));
    }

    fn on_send(&mut self, tag: Tag, mut bufs: Vec<Bytes>, result: io::Result<usize>) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        conn.op = None;
        let home = conn.core.is_some();
        if let Some(ending) = conn.ending.take() {
            if home {
                return self.finish(tag, ending);
            }
            conn.ending = Some(ending);
            return;
        }
        let result = result.and_then(|sent| {
            if sent == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            advance_bufs(&mut bufs, sent);
            Ok(())
        });
        if let Err(error) = result {
            return match std::mem::replace(&mut conn.after_send, AfterSend::Continue) {
                AfterSend::Close(ending) => self.finish(tag, ending),
                _ if home => self.finish(tag, Err(ConnectionError::Io(error))),
                // Closed when the core comes back from its blocking thread.
                _ => conn.ending = Some(Err(ConnectionError::Io(error))),
            };
        }
        if !bufs.is_empty() {
            // A partial send: the rest goes out in the next one.
            let timeout =
                matches!(conn.after_send, AfterSend::Close(_)).then_some(FINAL_FLUSH_TIMEOUT);
            let op = self.ring.send(tag, conn.stream.as_raw_fd(), bufs, timeout);
            conn.op = Some((op, OpKind::Send));
            return;
        }
        if !home {
            // The core comes back through the mailbox and continues the connection.
            return;
        }
        let parked = conn.parked.take().and_then(not_idle);
        match std::mem::replace(&mut conn.after_send, AfterSend::Continue) {
            AfterSend::Continue => self.advance(tag, parked),
            AfterSend::Offload(work) => self.offload(tag, work),
            AfterSend::Close(ending) => self.finish(tag, ending),
        }
    }

    fn on_recv(&mut self, tag: Tag, buf: BytesMut, result: io::Result<usize>) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        let kind = conn.op.take().map(|(_, kind)| kind);
        if conn.core.is_none() {
            conn.stash = Some((buf, result));
            return;
        }
        if let Some(ending) = conn.ending.take() {
            return self.finish(tag, ending);
        }
        if let Some(parked) = conn.parked.take().and_then(not_idle) {
            // Only an idle core comes back while the next data chunk is received.
            drop(parked);
            return self.fail(
                tag,
                proto_core::Error::InvalidState("work returned during a streamed write"),
            );
        }
        match kind {
            Some(OpKind::Stream) => self.stream_received(tag, buf, result),
            _ => self.idle_received(tag, buf, result),
        }
    }

    /// A socket polled for a direct transfer is ready: move data straight between it and
    /// backend memory.
    fn on_ready(&mut self, tag: Tag, result: io::Result<usize>) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        let kind = conn.op.take().map(|(_, kind)| kind);
        if let Some(ending) = conn.ending.take() {
            return self.finish(tag, ending);
        }
        if let Err(error) = result {
            return self.finish(tag, Err(ConnectionError::Io(error)));
        }
        if let Some(kind) = kind {
            self.transfer(tag, kind);
        }
    }

    /// One non-blocking transfer straight between the socket and backend memory (for a
    /// connection with no operation in flight and its core at home); waits for readiness
    /// through the ring only when the socket had nothing to give or take.
    fn transfer(&mut self, tag: Tag, kind: OpKind) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        let Conn {
            core,
            stream,
            buffered_stream,
            ..
        } = conn;
        // A poll is only posted while the core is home, and nothing takes it meanwhile.
        let Some(core) = core.as_mut() else {
            return;
        };
        let fd = stream.as_raw_fd();
        let (moved, writable) = match kind {
            OpKind::StreamReady => match core.receive_direct(stream) {
                Err(error) => return self.fail(tag, error),
                Ok(None) => {
                    *buffered_stream = true;
                    return self.advance(tag, None);
                }
                Ok(Some(Ok(0))) => {
                    let ending = shell::end_of_input(&mut core.conn);
                    return self.finish(tag, ending);
                }
                Ok(Some(result)) => (result, false),
            },
            OpKind::ReplyReady => match core.send_direct(stream) {
                Err(error) => return self.fail(tag, error),
                // The backend does not lend its memory: the driver goes piece by piece.
                Ok(None) => return self.advance(tag, None),
                Ok(Some(result)) => (result, true),
            },
            _ => return,
        };
        match moved {
            Ok(_) => self.advance(tag, None),
            Err(error) if shell_common::direct::retry(&error) => {
                let op = self.ring.poll(tag, fd, writable);
                conn.op = Some((
                    op,
                    if writable {
                        OpKind::ReplyReady
                    } else {
                        OpKind::StreamReady
                    },
                ));
            }
            Err(error) => self.finish(tag, Err(ConnectionError::Io(error))),
        }
    }

    fn idle_received(&mut self, tag: Tag, mut buf: BytesMut, result: io::Result<usize>) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        let Some(core) = conn.core.as_mut() else {
            return;
        };
        match result {
            Ok(0) => {
                let ending = shell::end_of_input(&mut core.conn);
                self.finish(tag, ending);
            }
            Ok(_) => {
                let data = buf.split().freeze();
                conn.read_buf = buf;
                core.conn.handle_input(data);
                self.advance(tag, None);
            }
            Err(error) if ring::cancelled(&error) && self.stopping => {
                self.finish(tag, Ok(Closed::Shutdown))
            }
            Err(error) => self.finish(tag, Err(ConnectionError::Io(error))),
        }
    }

    fn stream_received(&mut self, tag: Tag, buf: BytesMut, result: io::Result<usize>) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        let Some(core) = conn.core.as_mut() else {
            return;
        };
        match result {
            Ok(0) => {
                let ending = shell::end_of_input(&mut core.conn);
                self.finish(tag, ending);
            }
            Ok(_) => {
                // A short receive (the stream ended, or the kernel stopped early) is handed over
                // as it is; the next receive asks for the rest.
                let data = buf.freeze();
                if conn.held.len() >= HELD_CHUNKS {
                    conn.held.remove(0);
                }
                conn.held.push(data.clone());
                core.conn.handle_input(data);
                self.advance(tag, None);
            }
            Err(error) => self.finish(tag, Err(ConnectionError::Io(error))),
        }
    }

    /// The connection failed: responses it already owed still go out (bounded in time), then
    /// it closes.
    fn fail(&mut self, tag: Tag, error: proto_core::Error) {
        let Some(conn) = self.conns.get_mut(tag) else {
            return;
        };
        if let Some((op, _)) = conn.op {
            self.ring.cancel(op);
            conn.ending = Some(Err(ConnectionError::Protocol(error)));
            return;
        }
        let owed = conn
            .core
            .as_ref()
            .is_some_and(|core| !core.outbox.is_empty());
        if owed {
            self.send_outbox(
                tag,
                AfterSend::Close(Err(ConnectionError::Protocol(error))),
                Some(FINAL_FLUSH_TIMEOUT),
            );
        } else {
            self.finish(tag, Err(ConnectionError::Protocol(error)));
        }
    }

    /// Closes a connection (no operation in flight): its buffers are freed first, then the
    /// socket is closed, then the ending is logged. A client that held much memory is freed on
    /// a blocking thread, so the ring's other clients do not wait for it.
    fn finish(&mut self, tag: Tag, ending: Ending) {
        let Some(conn) = self.conns.remove(tag) else {
            return;
        };
        if conn.ring_direct {
            self.ring_direct -= 1;
        }
        let Conn {
            stream,
            span,
            core,
            slot,
            ..
        } = conn;
        let closing = Closing {
            core,
            slot,
            stream,
            span,
            ending,
        };
        if !closing.heavy_to_free() {
            return closing.close();
        }
        let shared = self.shared.clone();
        shared.freeing.begin();
        self.shared.pool.execute(move || {
            closing.close();
            shared.freeing.end();
        });
    }
}

/// What is left of a connection that closes.
struct Closing {
    core: Option<Box<Core>>,
    stream: Arc<TcpStream>,
    slot: ClientSlot,
    span: tracing::Span,
    ending: Ending,
}

impl Closing {
    /// Whether freeing what the client holds would stall the ring.
    fn heavy_to_free(&self) -> bool {
        self.core
            .as_ref()
            .is_some_and(|core| core.conn.heavy_to_free())
    }

    /// Frees the client's buffers, closes the socket, logs the ending.
    fn close(self) {
        let Closing {
            core,
            stream,
            slot,
            span,
            ending,
        } = self;
        drop(core);
        drop(stream);
        drop(slot);
        let _entered = span.enter();
        shell::log_end(&ending);
    }
}

/// A direct transfer on a blocking thread: non-blocking calls straight between `stream` and
/// backend memory until nothing is left to move directly, waiting with `poll` (at most
/// [`DIRECT_STALL`] at a time) while the socket is empty (full).
fn direct_blocking(core: &mut Core, stream: &TcpStream, writable: bool) -> (Stop, DirectEnd) {
    loop {
        let moved = if writable {
            if core.conn.reply_remaining() == 0 {
                return (Stop::Idle, DirectEnd::Done);
            }
            match core.send_direct(stream) {
                Err(error) => return (Stop::Failed(error), DirectEnd::Done),
                Ok(None) => return (Stop::Idle, DirectEnd::Declined { writable }),
                Ok(Some(result)) => result,
            }
        } else {
            if core.conn.in_place_capacity() == 0 {
                return (Stop::Idle, DirectEnd::Done);
            }
            match core.receive_direct(stream) {
                Err(error) => return (Stop::Failed(error), DirectEnd::Done),
                Ok(None) => return (Stop::Idle, DirectEnd::Declined { writable }),
                Ok(Some(Ok(0))) => return (Stop::Idle, DirectEnd::Eof),
                Ok(Some(result)) => result,
            }
        };
        match moved {
            Ok(_) => {}
            Err(error) if shell_common::direct::retry(&error) => {
                match ring::wait_ready(stream, writable, DIRECT_STALL) {
                    Ok(true) => {}
                    Ok(false) => return (Stop::Idle, DirectEnd::Stalled),
                    Err(error) => return (Stop::Idle, DirectEnd::Io(error)),
                }
            }
            Err(error) => return (Stop::Idle, DirectEnd::Io(error)),
        }
    }
}

/// A buffer for the next `want` bytes of streamed data: the memory of a chunk the backend is
/// done with when there is one, a fresh allocation otherwise.
fn stream_buffer(held: &mut Vec<Bytes>, want: usize) -> BytesMut {
    while let Some(position) = held.iter().position(Bytes::is_unique) {
        if let Ok(mut buf) = held.swap_remove(position).try_into_mut() {
            buf.clear();
            if buf.capacity() >= want {
                return buf;
            }
        }
    }
    BytesMut::with_capacity(want)
}

/// `None` for [`Stop::Idle`] (the core is driven again), the stop itself otherwise.
fn not_idle(stop: Stop) -> Option<Stop> {
    match stop {
        Stop::Idle => None,
        stop => Some(stop),
    }
}

/// Drops `sent` bytes from the front of a send queue.
fn advance_bufs(bufs: &mut Vec<Bytes>, mut sent: usize) {
    let mut done = 0;
    for buf in bufs.iter_mut() {
        if sent == 0 {
            break;
        }
        let step = sent.min(buf.len());
        buf.advance(step);
        sent -= step;
        if buf.is_empty() {
            done += 1;
        }
    }
    bufs.drain(..done);
}
