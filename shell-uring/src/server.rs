//! The io_uring server: accept loop, per-connection drivers, limits and graceful shutdown.
//!
//! Each ring thread owns one io_uring and serves the clients it accepted. Per connection: drive
//! the [`Core`], write its outbox with one `sendmsg` straight from the response `Bytes`, then
//! receive (between messages into one reusable 64 KiB buffer). At most one socket operation
//! is in flight, except that the next SET_TENSOR chunk is received while a blocking thread
//! writes the last one to the backend.
//!
//! Streamed SET_TENSOR data and large replies move straight between the socket and backend
//! memory lent for one non-blocking call (the kernel must not hold it across completions). A
//! direct transfer is tried once per pass of the loop (so none starves the others) and polled
//! for only when the socket was empty (full). One large transfer at a time runs on the ring;
//! further ones on blocking threads, at most [`ServerConfig::direct_threads`]: more copying
//! threads than cores only add context switches (sixteen clients on two cores, a thread per
//! transfer: 10 % less than the tokio shell). A socket stalled there for 100 ms is handed back
//! to the ring's poll, so a stalled client holds no thread.
//!
//! Heavy work goes to a blocking thread with the whole `Core`, which comes back through the
//! ring's mailbox (an eventfd the ring always has a read posted on). Freeing a client that held
//! [`HEAVY_FREE_BYTES`](shell_common::HEAVY_FREE_BYTES) is heavy too (unmapping a GiB takes
//! about 100 ms); `join` waits for those frees.
//!
//! A connection that switches to RDMA after HELLO ([`Stop::Switch`]) goes to a blocking thread
//! for good: `shell_rdma::serve` runs it to its end, and the core comes back only to be closed
//! (or, when activation failed with `--transport auto`, to go on over TCP).

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use proto_core::backend::Backend;
use proto_core::session::MAX_DATA_CHUNK;
use proto_core::wire::ProtocolVersion;
use shell_common::shell::{
    self, ClientSlot, ClientSlots, Closed, ConnectionError, FINAL_FLUSH_TIMEOUT, READ_SIZE,
};
use shell_common::{ConnectionConfig, Direct, SendQueue};

use crate::core::{Core, Stop};
use crate::pool::{lock, Pool};
use crate::ring::{self, Completion, EventFd, OpId, Ring, Tag};

/// Default for [`ServerConfig::stream_chunk`]: 8 MiB (two are alive at once per streaming
/// client: one being written to the backend, the next being received).
pub const DEFAULT_STREAM_CHUNK: usize = 8 << 20;

/// Data chunks kept for reuse per streaming connection.
const HELD_CHUNKS: usize = 2;
/// Submission queue entries per ring.
const RING_ENTRIES: u32 = 512;
/// A direct transfer with at least this many bytes to go that starts while another one runs on
/// the ring runs on a blocking thread.
const DIRECT_OFFLOAD_BYTES: u64 = 4 << 20;
/// How long a direct transfer on a blocking thread waits for a stalled socket before handing
/// the wait back to the ring.
const DIRECT_STALL: Duration = Duration::from_millis(100);

const TAG_ACCEPT: Tag = 0;
const TAG_WAKE: Tag = 1;
const TAG_GRACE: Tag = 2;
const TAG_ACCEPT_RETRY: Tag = 3;
/// The first connection's tag (tags are never reused, and never one of the ring's own).
const FIRST_CONN_TAG: Tag = 1 << 32;

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

/// How a direct transfer on a blocking thread ([`direct_blocking`]) ended.
enum DirectEnd {
    /// Nothing left to move directly (the core says what comes next).
    Done,
    /// The socket stayed empty (full) for [`DIRECT_STALL`]: the ring waits for it instead.
    Stalled,
    /// The dispatcher declined to lend memory for the streamed write: receive into buffers.
    Buffered,
    /// The peer closed its side, or the socket failed.
    End(Ending),
}

/// What a blocking thread does with a connection's core.
enum Job {
    /// [`Stop::Heavy`] or [`Stop::Comm`].
    Work(Stop),
    /// The direct transfer in progress (a reply's with `true`), with a share of the socket.
    Direct(Arc<TcpStream>, bool),
    /// [`Stop::Switch`]: the connection served over RDMA until it ends, with a share of the
    /// socket (watched for the client's hang-up).
    Switch(Arc<TcpStream>),
}

/// Where blocking threads return cores to a ring.
struct Mailbox {
    returned: Mutex<Vec<Returned>>,
    eventfd: EventFd,
}

impl Mailbox {
    fn new(eventfd: EventFd) -> Mailbox {
        let returned = Mutex::default();
        Mailbox { returned, eventfd }
    }

    fn deliver(&self, returned: Returned) {
        lock(&self.returned).push(returned);
        self.eventfd.wake();
    }
}

struct Shared {
    backend: Arc<dyn Backend>,
    connection: ConnectionConfig,
    slots: ClientSlots,
    /// With `stream_chunk` and `direct_threads` in bounds.
    config: ServerConfig,
    stop: AtomicBool,
    announced: AtomicBool,
    mailboxes: Vec<Arc<Mailbox>>,
    pool: Pool,
    /// Each closing connection freed on a blocking thread holds a clone until it is freed;
    /// [`Server::join`] drops this one and waits until every clone is gone.
    freeing: Mutex<Option<Sender<()>>>,
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
    /// Disconnected once every connection freed on a blocking thread is freed.
    freed: Receiver<()>,
}

impl Server {
    /// Starts serving clients accepted on `listener` on [`ServerConfig::rings`] ring threads.
    ///
    /// Fails, before anything is served, for an unsupported version, or when the kernel refuses
    /// io_uring (the error then reads "io_uring is not available: ...").
    pub fn start(
        listener: TcpListener,
        backend: Arc<dyn Backend>,
        mut config: ServerConfig,
    ) -> io::Result<Server> {
        let connection = config.base.connection_config()?;
        let local_addr = listener.local_addr()?;
        let rings = config.rings.max(1);
        config.stream_chunk = config.stream_chunk.clamp(1, MAX_DATA_CHUNK);
        config.direct_threads = config.direct_threads.max(1);
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let mailboxes = (0..rings)
            .map(|_| Ok(Arc::new(Mailbox::new(EventFd::new()?))))
            .collect::<io::Result<_>>()?;
        let (freeing, freed) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared {
            backend,
            connection,
            slots: config.base.client_slots(),
            config,
            stop: AtomicBool::new(false),
            announced: AtomicBool::new(false),
            mailboxes,
            pool: Pool::new(dispatch.clone()),
            freeing: Mutex::new(Some(freeing)),
        });
        let mut listeners = (1..rings)
            .map(|_| listener.try_clone())
            .collect::<io::Result<Vec<_>>>()?;
        listeners.push(listener);
        let mut server = Server {
            stopper: Stopper(shared.clone()),
            threads: Vec::with_capacity(rings),
            local_addr,
            freed,
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
                        Err(error) => drop(ready_tx.send(Err(error))),
                        Ok(ring) => {
                            let _ = ready_tx.send(Ok(()));
                            Loop::new(ring, shared, index, listener).run();
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
                return Err(unavailable(error));
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

    /// Waits until every ring thread has ended (after a [`stop`](Self::stop): once every
    /// connection closed or the grace period ran out) and every client's buffers are freed, but
    /// those of a command still running after the grace period (freed when it ends).
    pub fn join(mut self) {
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!("a ring thread panicked");
            }
        }
        lock(&self.stopper.0.freeing).take();
        let _ = self.freed.recv();
        self.stopper.0.pool.close();
    }
}

/// Checks that this kernel lets this process use io_uring with the operations the server needs.
pub fn probe() -> io::Result<()> {
    Ring::new(8).map(drop).map_err(unavailable)
}

fn unavailable(error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("io_uring is not available: {error}"))
}

/// How a connection ended (for the log).
type Ending = Result<Closed, ConnectionError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    /// Receiving between messages (cancelled by a shutdown).
    Idle,
    /// Receiving streamed tensor data into a buffer.
    Stream,
    /// Waiting until the socket is readable (writable, `true`) for a direct transfer.
    Ready(bool),
    Send,
}

enum AfterSend {
    Continue,
    Offload(Stop),
    Close(Ending),
}

/// One client. Dropped in field order: its buffers, then the socket, then its client slot.
struct Conn {
    /// `None` while on a blocking thread.
    core: Option<Box<Core>>,
    /// Shared with a blocking thread while it runs a direct transfer.
    stream: Arc<TcpStream>,
    slot: ClientSlot,
    span: tracing::Span,
    read_buf: BytesMut,
    op: Option<(OpId, OpKind)>,
    /// Streamed data received while the core was away.
    stash: Option<(BytesMut, io::Result<usize>)>,
    /// The last data chunks handed to the session: once the backend dropped its slices, their
    /// memory receives the next chunks (no fresh pages to fault in for every chunk).
    held: Vec<Bytes>,
    after_send: AfterSend,
    /// What the blocking thread returned while an operation was still in flight.
    parked: Option<Stop>,
    /// Set when the connection fails while an operation is in flight: close once it is done.
    ending: Option<Ending>,
    /// The dispatcher declined to lend memory for the streamed write in progress.
    buffered_stream: bool,
    /// A direct transfer on a blocking thread found the socket stalled: the ring waits for
    /// readiness before the next one.
    stalled: bool,
    /// Counted in [`Loop::ring_direct`] (until the connection's next `advance`).
    ring_direct: bool,
}

impl Conn {
    /// Receives the next `min(remaining, chunk)` bytes of streamed data into a buffer.
    fn recv_stream(&mut self, ring: &mut Ring, tag: Tag, remaining: u64, config: &ServerConfig) {
        let want = usize::try_from(remaining)
            .unwrap_or(usize::MAX)
            .min(config.stream_chunk);
        let buf = stream_buffer(&mut self.held, want);
        let op = ring.recv(tag, self.stream.as_raw_fd(), buf, want, true);
        self.op = Some((op, OpKind::Stream));
    }

    /// Frees the client's buffers, closes the socket, logs the ending.
    fn close(self, ending: Ending) {
        let span = self.span.clone();
        let ending = self.slot.ending(ending);
        drop(self);
        span.in_scope(|| shell::log_end(&ending));
    }
}

/// One ring thread's event loop.
struct Loop {
    ring: Ring,
    shared: Arc<Shared>,
    mailbox: Arc<Mailbox>,
    listener: Option<TcpListener>,
    accept_op: Option<OpId>,
    /// By tag: a few comparisons per lookup where a `HashMap` hashed each tag with SipHash (a
    /// sixth of the ring thread's instructions per small command).
    conns: BTreeMap<Tag, Conn>,
    next_tag: Tag,
    /// Connections whose next direct transfer (writable: a reply) is tried without waiting for
    /// readiness, in turn: one call each per pass.
    ready: VecDeque<(Tag, bool)>,
    /// Connections running a large direct transfer on this ring (flagged `ring_direct`).
    ring_direct: usize,
    /// Direct transfers of this ring's connections running on blocking threads.
    offloaded_direct: usize,
    stopping: bool,
}

impl Loop {
    fn new(ring: Ring, shared: Arc<Shared>, index: usize, listener: TcpListener) -> Loop {
        Loop {
            ring,
            mailbox: shared.mailboxes[index].clone(),
            shared,
            listener: Some(listener),
            accept_op: None,
            conns: BTreeMap::new(),
            next_tag: FIRST_CONN_TAG,
            ready: VecDeque::new(),
            ring_direct: 0,
            offloaded_direct: 0,
            stopping: false,
        }
    }

    fn run(mut self) {
        self.post_accept();
        self.ring.wait_wake(TAG_WAKE, &self.mailbox.eventfd);
        let mut batch = Vec::new();
        while !(self.stopping && self.listener.is_none() && self.conns.is_empty()) {
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
                if let Some((tag, writable)) = self.ready.pop_front() {
                    self.transfer(tag, writable);
                }
            }
        }
        self.drop_all();
    }

    fn on_completion(&mut self, tag: Tag, completion: Completion) {
        match completion {
            Completion::Internal => {}
            Completion::Accept(result) => self.on_accept(result),
            Completion::Wake => self.on_wake(),
            Completion::Timer if tag == TAG_GRACE => self.on_grace(),
            Completion::Timer => self.post_accept(),
            Completion::Recv(buf, result) => self.on_recv(tag, buf, result),
            Completion::Send(bufs, result) => self.on_send(tag, bufs, result),
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
        let Some(slot) = self.shared.slots.admit(peer, &stream) else {
            return;
        };
        let span = tracing::info_span!("client", %peer, shell = "uring");
        let core = {
            let _entered = span.enter();
            shell::accepted(&stream);
            let local = stream.local_addr().ok().map(|local| local.ip());
            let backend = self.shared.backend.clone();
            Core::new(backend, &self.shared.connection, local).map(|mut core| {
                core.conn.set_monitor(slot.monitor());
                core
            })
        };
        let mut conn = Conn {
            core: None,
            stream: Arc::new(stream),
            slot,
            span,
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
        match core {
            Ok(core) => conn.core = Some(Box::new(core)),
            Err(error) => return conn.close(Err(error.into())),
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        self.conns.insert(tag, conn);
        self.advance(tag, None);
    }

    fn on_wake(&mut self) {
        self.ring.wait_wake(TAG_WAKE, &self.mailbox.eventfd);
        if self.shared.stop.load(Ordering::SeqCst) && !self.stopping {
            self.begin_stop();
        }
        let returned = std::mem::take(&mut *lock(&self.mailbox.returned));
        for returned in returned {
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
        for conn in self.conns.values() {
            if let Some((op, OpKind::Idle)) = conn.op {
                self.ring.cancel(op);
            }
        }
        if !self.conns.is_empty() {
            self.ring
                .timer(TAG_GRACE, self.shared.config.base.shutdown_grace);
        }
    }

    fn on_grace(&mut self) {
        if !self.conns.is_empty() {
            shell::grace_over(self.conns.len());
            self.drop_all();
        }
    }

    /// Drops every connection: operations in flight are cancelled, direct transfers on blocking
    /// threads stop at once, a core away is dropped when it comes back.
    fn drop_all(&mut self) {
        for conn in std::mem::take(&mut self.conns).into_values() {
            if let Some((op, _)) = conn.op {
                self.ring.cancel(op);
            }
            let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        }
        self.ring_direct = 0;
    }

    fn on_returned(&mut self, returned: Returned) {
        let (tag, stop, direct) = (returned.tag, returned.stop, returned.direct);
        if direct.is_some() {
            self.offloaded_direct -= 1;
        }
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        conn.core = Some(returned.core);
        if conn.ending.is_none() && matches!(stop, Stop::Idle) {
            match direct {
                None | Some(DirectEnd::Done) => {}
                Some(DirectEnd::Buffered) => conn.buffered_stream = true,
                Some(DirectEnd::Stalled) => conn.stalled = true,
                Some(DirectEnd::End(ending)) => return self.finish(tag, ending),
            }
        }
        let idle = conn.op.is_none();
        if let Some(ending) = conn.ending.take_if(|_| idle) {
            return self.finish(tag, ending);
        } else if conn.ending.is_some() {
            return;
        }
        match stop {
            Stop::Failed(error) => self.fail(tag, error),
            // The operation in flight (a reply piece, the next data chunk) continues it.
            stop if conn.op.is_some() => conn.parked = Some(stop),
            stop => self.resume(tag, stop),
        }
    }

    /// Continues a connection whose core came back, with no operation in flight.
    fn resume(&mut self, tag: Tag, stop: Stop) {
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        if let Some((buf, result)) = conn.stash.take() {
            if !matches!(stop, Stop::Idle) {
                return self.fail(tag, returned_while_streaming());
            }
            return self.received(tag, buf, result, true);
        }
        self.advance(tag, not_idle(stop));
    }

    /// Drives the connection's core and starts its next socket operation.
    fn advance(&mut self, tag: Tag, first: Option<Stop>) {
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        if std::mem::take(&mut conn.ring_direct) {
            self.ring_direct -= 1;
        }
        let Some(core) = conn.core.as_mut() else {
            return;
        };
        let stop = first.unwrap_or_else(|| conn.span.in_scope(|| core.drive(false)));
        let (outbox_empty, reply) = (core.outbox.is_empty(), core.conn.reply_remaining());
        match stop {
            Stop::Failed(error) => return self.fail(tag, error),
            Stop::Ended(ending) => return self.finish(tag, ending),
            // HELLO's answer is out (the core only switches with nothing queued): the
            // connection leaves the ring for a blocking thread until it ends.
            Stop::Switch => {
                let stream = conn.stream.clone();
                return self.offload(tag, Job::Switch(stream));
            }
            // The head first, then the data straight from backend memory.
            Stop::SendInPlace if outbox_empty => return self.start_direct(tag, true, reply),
            Stop::SendInPlace | Stop::Idle => {}
            // Responses first: the client may be waiting for them.
            work if !outbox_empty => return self.send_outbox(tag, AfterSend::Offload(work), None),
            work => return self.offload(tag, Job::Work(work)),
        }
        if !outbox_empty {
            return self.send_outbox(tag, AfterSend::Continue, None);
        }
        let remaining = core.conn.stream_remaining();
        if remaining > 0 {
            // Streamed tensor data: finished even during shutdown (the grace period bounds it).
            if core.conn.in_place_capacity() > 0 && !conn.buffered_stream {
                return self.start_direct(tag, false, remaining);
            }
            return conn.recv_stream(&mut self.ring, tag, remaining, &self.shared.config);
        }
        conn.held.clear();
        conn.buffered_stream = false;
        if self.stopping {
            return self.finish(tag, Ok(Closed::Shutdown));
        }
        let buf = std::mem::take(&mut conn.read_buf);
        let op = self
            .ring
            .recv(tag, conn.stream.as_raw_fd(), buf, READ_SIZE, false);
        conn.op = Some((op, OpKind::Idle));
    }

    /// Starts a direct transfer with `left` bytes to go (a reply's with `writable`).
    fn start_direct(&mut self, tag: Tag, writable: bool, left: u64) {
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        if std::mem::take(&mut conn.stalled) {
            return self.poll_ready(tag, writable);
        }
        if left >= DIRECT_OFFLOAD_BYTES {
            if self.ring_direct > 0 && self.offloaded_direct < self.shared.config.direct_threads {
                let stream = conn.stream.clone();
                return self.offload(tag, Job::Direct(stream, writable));
            }
            conn.ring_direct = true;
            self.ring_direct += 1;
        }
        // Data most likely came with the header or since the last receive, and a socket
        // most likely has room: try first, poll only if not.
        self.ready.push_back((tag, writable));
    }

    fn poll_ready(&mut self, tag: Tag, writable: bool) {
        if let Some(conn) = self.conns.get_mut(&tag) {
            let op = self.ring.poll(tag, conn.stream.as_raw_fd(), writable);
            conn.op = Some((op, OpKind::Ready(writable)));
        }
    }

    /// Hands the core to a blocking thread for `job`. While a data chunk is written to the
    /// backend there, the next chunk is already being received here.
    fn offload(&mut self, tag: Tag, job: Job) {
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        let Some(mut core) = conn.core.take() else {
            return;
        };
        let remaining = core.conn.stream_remaining();
        match &job {
            // During a streamed write the heavy work is a data chunk.
            Job::Work(Stop::Heavy) if remaining > 0 && conn.op.is_none() => {
                conn.recv_stream(&mut self.ring, tag, remaining, &self.shared.config)
            }
            Job::Direct(..) => self.offloaded_direct += 1,
            Job::Work(_) | Job::Switch(_) => {}
        }
        let (mailbox, span) = (self.mailbox.clone(), conn.span.clone());
        let shared = self.shared.clone();
        self.shared.pool.execute(move || {
            let (stop, direct) = span.in_scope(|| match job {
                Job::Work(work) => (core.run(work), None),
                // The socket's share is dropped here: the ring alone owns it again before it
                // sees the core.
                Job::Direct(stream, writable) => {
                    let (stop, end) = direct_blocking(&mut core, &stream, writable);
                    (stop, Some(end))
                }
                Job::Switch(stream) => {
                    let stopping = || shared.stop.load(Ordering::SeqCst);
                    (core.switch(&stream, &stopping), None)
                }
            });
            mailbox.deliver(Returned {
                tag,
                core,
                stop,
                direct,
            });
        });
    }

    fn send_outbox(&mut self, tag: Tag, after: AfterSend, timeout: Option<Duration>) {
        let Some(conn) = self.conns.get_mut(&tag) else {
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

    fn on_send(&mut self, tag: Tag, mut bufs: SendQueue, result: io::Result<usize>) {
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        conn.op = None;
        let home = conn.core.is_some();
        if let Some(ending) = conn.ending.take_if(|_| home) {
            return self.finish(tag, ending);
        } else if conn.ending.is_some() {
            return;
        }
        if let Err(error) = result.and_then(|sent| bufs.written(sent)) {
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
        let Some(core) = conn.core.as_mut() else {
            // The core comes back through the mailbox and continues the connection.
            return;
        };
        if core.outbox.is_empty() {
            // The drained queue keeps its allocation for the next responses.
            core.outbox = bufs;
        }
        let parked = conn.parked.take().and_then(not_idle);
        match std::mem::replace(&mut conn.after_send, AfterSend::Continue) {
            AfterSend::Continue => self.advance(tag, parked),
            AfterSend::Offload(work) => self.offload(tag, Job::Work(work)),
            AfterSend::Close(ending) => self.finish(tag, ending),
        }
    }

    fn on_recv(&mut self, tag: Tag, buf: BytesMut, result: io::Result<usize>) {
        let Some(conn) = self.conns.get_mut(&tag) else {
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
        if conn.parked.take().and_then(not_idle).is_some() {
            // Only an idle core comes back while the next data chunk is received.
            return self.fail(tag, returned_while_streaming());
        }
        self.received(tag, buf, result, kind == Some(OpKind::Stream));
    }

    /// A socket polled for a direct transfer is ready.
    fn on_ready(&mut self, tag: Tag, result: io::Result<usize>) {
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        let kind = conn.op.take().map(|(_, kind)| kind);
        if let Some(ending) = conn.ending.take() {
            return self.finish(tag, ending);
        }
        if let Err(error) = result {
            return self.finish(tag, Err(ConnectionError::Io(error)));
        }
        if let Some(OpKind::Ready(writable)) = kind {
            self.transfer(tag, writable);
        }
    }

    /// One direct transfer step (for a connection with no operation in flight and its core
    /// at home); waits for readiness through the ring only when the socket had nothing to give
    /// or take.
    fn transfer(&mut self, tag: Tag, writable: bool) {
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        // A transfer is only queued while the core is home, and nothing takes it meanwhile.
        let Some(core) = conn.core.as_mut() else {
            return;
        };
        match core.direct(&conn.stream, writable) {
            Ok(Some(Direct::Moved)) => self.advance(tag, None),
            Ok(Some(Direct::Declined)) => {
                // The backend lends no memory: receive into buffers, or the driver sends the
                // reply piece by piece.
                conn.buffered_stream |= !writable;
                self.advance(tag, None);
            }
            Ok(Some(Direct::Eof)) => {
                let ending = shell::end_of_input(&mut core.conn);
                self.finish(tag, ending);
            }
            Ok(None) => self.poll_ready(tag, writable),
            Err(ConnectionError::Protocol(error)) => self.fail(tag, error),
            Err(error) => self.finish(tag, Err(error)),
        }
    }

    /// A receive into `buf` completed: between messages, or of streamed data (`streamed`).
    fn received(&mut self, tag: Tag, mut buf: BytesMut, result: io::Result<usize>, streamed: bool) {
        let Some(conn) = self.conns.get_mut(&tag) else {
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
            Ok(_) if streamed => {
                // A short receive is handed over as it is; the next receive asks for the rest.
                let data = buf.freeze();
                if conn.held.len() >= HELD_CHUNKS {
                    conn.held.remove(0);
                }
                conn.held.push(data.clone());
                core.conn.handle_input(data);
                self.advance(tag, None);
            }
            Ok(_) => {
                let data = buf.split().freeze();
                conn.read_buf = buf;
                core.conn.handle_input(data);
                self.advance(tag, None);
            }
            Err(error) if !streamed && ring::cancelled(&error) && self.stopping => {
                self.finish(tag, Ok(Closed::Shutdown))
            }
            Err(error) => self.finish(tag, Err(ConnectionError::Io(error))),
        }
    }

    /// The connection failed: responses it already owed still go out (bounded in time), then
    /// it closes.
    fn fail(&mut self, tag: Tag, error: proto_core::Error) {
        let Some(conn) = self.conns.get_mut(&tag) else {
            return;
        };
        let ending = Err(ConnectionError::Protocol(error));
        if let Some((op, _)) = conn.op {
            self.ring.cancel(op);
            conn.ending = Some(ending);
        } else if conn
            .core
            .as_ref()
            .is_some_and(|core| !core.outbox.is_empty())
        {
            self.send_outbox(tag, AfterSend::Close(ending), Some(FINAL_FLUSH_TIMEOUT));
        } else {
            self.finish(tag, ending);
        }
    }

    /// Closes a connection (no operation in flight). A client that held much memory is freed
    /// on a blocking thread, so the ring's other clients do not wait for it.
    fn finish(&mut self, tag: Tag, ending: Ending) {
        let Some(conn) = self.conns.remove(&tag) else {
            return;
        };
        if conn.ring_direct {
            self.ring_direct -= 1;
        }
        if !conn
            .core
            .as_ref()
            .is_some_and(|core| core.conn.heavy_to_free())
        {
            return conn.close(ending);
        }
        let freeing = lock(&self.shared.freeing).clone();
        self.shared.pool.execute(move || {
            conn.close(ending);
            drop(freeing);
        });
    }
}

/// A direct transfer on a blocking thread: non-blocking calls until nothing is left to move
/// directly, waiting with `poll` (at most [`DIRECT_STALL`] at a time) while the socket is
/// empty (full).
fn direct_blocking(core: &mut Core, stream: &TcpStream, writable: bool) -> (Stop, DirectEnd) {
    loop {
        let left = if writable {
            core.conn.reply_remaining()
        } else {
            core.conn.in_place_capacity()
        };
        if left == 0 {
            return (Stop::Idle, DirectEnd::Done);
        }
        let end = match core.direct(stream, writable) {
            Ok(Some(Direct::Moved)) => continue,
            Ok(Some(Direct::Declined)) if writable => DirectEnd::Done,
            Ok(Some(Direct::Declined)) => DirectEnd::Buffered,
            Ok(Some(Direct::Eof)) => DirectEnd::End(shell::end_of_input(&mut core.conn)),
            Ok(None) => match ring::wait_ready(stream, writable, DIRECT_STALL) {
                Ok(true) => continue,
                Ok(false) => DirectEnd::Stalled,
                Err(error) => DirectEnd::End(Err(error.into())),
            },
            Err(ConnectionError::Protocol(error)) => return (Stop::Failed(error), DirectEnd::Done),
            Err(error) => DirectEnd::End(Err(error)),
        };
        return (Stop::Idle, end);
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

fn returned_while_streaming() -> proto_core::Error {
    proto_core::Error::InvalidState("work returned during a streamed write")
}
