//! Admission and progress: which connections hold the server's client places, and when one
//! must give its place up.
//!
//! * A connection must complete HELLO within [`Limits::hello_timeout`].
//! * While a message arrives or a reply drains ([`Activity::Receiving`] / [`Activity::Sending`]),
//!   at least `min_progress_rate × progress_window` bytes must move in every
//!   [`Limits::progress_window`]: a minimum rate over a window, not a deadline per message, so
//!   a 1 GiB SET_TENSOR over a slow link is fine while a trickle is not.
//! * Established sessions idle between commands stay open; but when every place (or every
//!   place of one address) is taken, a new connection makes room: the oldest connection still
//!   awaiting HELLO, else the session idle longest that holds no buffers gives way. A connection
//!   holding buffers or in a command never does. Only if none can is the new one refused.
//!
//! The connection's driver reports its [`Activity`] and the bytes it moves to its [`Client`]
//! (a [`Monitor`]); one watchdog thread per server checks the deadlines. A connection that must
//! go is told the one way every shell already understands: its socket is shut down (through a
//! duplicate of its descriptor), so whatever it waits for (a read, a write, readiness, a ring
//! operation) ends at once; the shell then logs the reason [`ClientSlot::ending`] gives.

use std::collections::{BTreeMap, HashMap};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use proto_core::driver::{Activity, Monitor};
use proto_core::wire::REQUEST_HEADER_SIZE;

use crate::shell::{Closed, ConnectionError};

/// Why the server closed a connection (logged as `kind=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ServerClosed {
    /// HELLO did not arrive within the deadline.
    #[error("HELLO did not arrive within {0:?}")]
    HelloTimeout(Duration),
    /// A message that had begun stopped arriving at the minimum rate.
    #[error("a message stopped arriving: under {min_bytes} bytes in {window:?}")]
    ReceiveStalled {
        /// Bytes owed per window.
        min_bytes: u64,
        /// The window.
        window: Duration,
    },
    /// The client stopped reading a reply at the minimum rate.
    #[error("a reply stopped draining: under {min_bytes} bytes in {window:?}")]
    SendStalled {
        /// Bytes owed per window.
        min_bytes: u64,
        /// The window.
        window: Duration,
    },
    /// Every place was taken: this connection (awaiting HELLO, or idle without buffers) gave
    /// way to a new one.
    #[error("gave way to a new client: every place was taken")]
    GaveWay,
}

impl ServerClosed {
    /// The stable name logged as `kind=`.
    pub fn kind(&self) -> &'static str {
        match self {
            ServerClosed::HelloTimeout(_) => "hello_timeout",
            ServerClosed::ReceiveStalled { .. } => "receive_stalled",
            ServerClosed::SendStalled { .. } => "send_stalled",
            ServerClosed::GaveWay => "gave_way",
        }
    }
}

/// The admission limits of a server (from [`ServerConfig`](crate::ServerConfig)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections at once.
    pub max_clients: usize,
    /// Most connections at once from one IP address.
    pub max_per_address: usize,
    /// How long a connection may take to complete HELLO (`None`: forever).
    pub hello_timeout: Option<Duration>,
    /// The window over which a message in progress must move `min_progress_rate` bytes a
    /// second (`None`: no progress check).
    pub progress_window: Option<Duration>,
    /// Bytes a second a message in progress must move, averaged over the window.
    pub min_progress_rate: u64,
}

impl Limits {
    /// Only a client limit: no per-address limit, no deadlines.
    pub fn max_clients(max: usize) -> Limits {
        Limits {
            max_clients: max,
            max_per_address: max,
            hello_timeout: None,
            progress_window: None,
            min_progress_rate: 0,
        }
    }

    /// Bytes that must move per window (at least one).
    fn window_bytes(&self, window: Duration) -> u64 {
        ((self.min_progress_rate as f64 * window.as_secs_f64()) as u64).max(1)
    }

    /// How often the watchdog looks: a fraction of the shortest deadline.
    fn tick(&self) -> Option<Duration> {
        let shortest = match (self.hello_timeout, self.progress_window) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return None,
        };
        Some((shortest / 8).clamp(Duration::from_millis(5), Duration::from_millis(250)))
    }
}

/// One admitted connection, as admission control sees it; its driver's [`Monitor`].
#[derive(Debug)]
pub struct Client {
    id: u64,
    peer: SocketAddr,
    accepted: Instant,
    /// A duplicate of the connection's socket: shutting it down ends whatever the shell waits
    /// for. `None` where it could not be duplicated (the connection is then never closed here).
    socket: Option<socket2::Socket>,
    activity: AtomicU8,
    holds_buffers: AtomicBool,
    /// When the connection last became idle (or was admitted), on [`coarse_now`]'s clock.
    idle_since: AtomicU64,
    moved: AtomicU64,
    closed: OnceLock<ServerClosed>,
}

impl Client {
    fn activity_now(&self) -> Activity {
        Activity::from_u8(self.activity.load(Ordering::Relaxed))
    }

    fn idle_since(&self) -> u64 {
        self.idle_since.load(Ordering::Relaxed)
    }

    fn closing(&self) -> bool {
        self.closed.get().is_some()
    }

    /// Closes the connection for `reason` (the first reason wins).
    fn close(&self, reason: ServerClosed) {
        if self.closed.set(reason).is_err() {
            return;
        }
        if let Some(socket) = &self.socket {
            // An error means the socket is already closed: nothing is left to end.
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    /// Whether a whole frame header (HELLO's, unless the client breaks the protocol) waits in
    /// the socket, not read yet: the connection is about to be served (a client sends HELLO
    /// right after connecting), and a flood of new connections that outpaces the server's
    /// reads must not push it out before its turn comes. Only counted, never read.
    fn header_waiting(&self) -> bool {
        let Some(socket) = &self.socket else {
            return false;
        };
        let mut head = [std::mem::MaybeUninit::<u8>::uninit(); REQUEST_HEADER_SIZE];
        let peeked = socket.recv_with_flags(&mut head, libc::MSG_PEEK | libc::MSG_DONTWAIT);
        matches!(peeked, Ok(n) if n == REQUEST_HEADER_SIZE)
    }

    /// Whether this connection may give way to a new one.
    fn may_give_way(&self) -> bool {
        !self.closing()
            && self.socket.is_some()
            && match self.activity_now() {
                Activity::AwaitingHello => true,
                Activity::Idle => !self.holds_buffers.load(Ordering::Relaxed),
                _ => false,
            }
    }
}

// Called around every command of every connection: only the connection's own thread writes
// these cells (the watchdog and admission only read them), so plain loads and stores do, not
// locked read-modify-writes; and the clock is read only on becoming idle, the one change whose
// time matters (which idle session gives way).
impl Monitor for Client {
    fn activity(&self, activity: Activity, holds_buffers: bool) {
        if self.holds_buffers.load(Ordering::Relaxed) != holds_buffers {
            self.holds_buffers.store(holds_buffers, Ordering::Relaxed);
        }
        let now = activity.as_u8();
        if self.activity.load(Ordering::Relaxed) != now {
            if activity == Activity::Idle {
                self.idle_since.store(coarse_now(), Ordering::Relaxed);
            }
            self.activity.store(now, Ordering::Relaxed);
        }
    }

    fn moved(&self, bytes: u64) {
        let total = self.moved.load(Ordering::Relaxed).wrapping_add(bytes);
        self.moved.store(total, Ordering::Relaxed);
    }
}

/// Nanoseconds on the coarse monotonic clock: the kernel's last tick (a few milliseconds
/// apart), read without a timestamp-counter read, fine enough to tell which session has been
/// idle longest (sessions idle since the same tick give way in admission order).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn coarse_now() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Nanoseconds since the first call, where the system has no coarse clock.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn coarse_now() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let elapsed = EPOCH.get_or_init(Instant::now).elapsed().as_nanos();
    u64::try_from(elapsed).unwrap_or(u64::MAX)
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    clients: BTreeMap<u64, Arc<Client>>,
}

impl Table {
    /// The connection that gives way among those `of` selects: the oldest awaiting HELLO (one
    /// whose HELLO header waits unread in its socket last), else the one idle longest without
    /// buffers.
    fn victim(&self, of: impl Fn(&Client) -> bool) -> Option<Arc<Client>> {
        let candidates = || {
            self.clients
                .values()
                .filter(|client| of(client) && client.may_give_way())
        };
        // In admission order (ids grow with it), so under a flood the first one tried is
        // usually the one: one peek per admission, not one per place.
        let awaiting_hello =
            || candidates().filter(|client| client.activity_now() == Activity::AwaitingHello);
        awaiting_hello()
            .find(|client| !client.header_waiting())
            .or_else(|| awaiting_hello().next())
            .or_else(|| candidates().min_by_key(|client| client.idle_since()))
            .cloned()
    }

    fn open(&self, of: impl Fn(&Client) -> bool) -> usize {
        self.clients
            .values()
            .filter(|client| of(client) && !client.closing())
            .count()
    }
}

#[derive(Debug)]
struct Shared {
    limits: Limits,
    table: Mutex<Table>,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic elsewhere while holding the table leaves it consistent (inserts and removes
        // are single calls).
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The clients a server serves at once (`--max-clients`, `--max-clients-per-address`) and
/// their deadlines, shared by its accept loops.
#[derive(Debug, Clone)]
pub struct ClientSlots {
    shared: Arc<Shared>,
}

/// One client's place among [`ClientSlots`]; dropping it frees the place.
#[derive(Debug)]
pub struct ClientSlot {
    client: Arc<Client>,
    shared: Arc<Shared>,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.shared.table().clients.remove(&self.client.id);
    }
}

impl ClientSlot {
    /// What the connection's driver reports to ([`proto_core::driver::Connection::set_monitor`]).
    pub fn monitor(&self) -> Arc<dyn Monitor> {
        self.client.clone()
    }

    /// How the connection ended, as logged: the server's reason when it closed the connection
    /// (its socket shut down, the shell saw an end of input or a failed write), else `result`.
    pub fn ending(
        &self,
        result: Result<Closed, ConnectionError>,
    ) -> Result<Closed, ConnectionError> {
        match (self.client.closed.get(), &result) {
            // A shutdown during a server shutdown is that, whatever admission thought.
            (_, Ok(Closed::Shutdown)) | (None, _) => result,
            (Some(reason), _) => Err(ConnectionError::Closed(*reason)),
        }
    }

    /// Why the server closed this connection, if it did.
    pub fn closed_for(&self) -> Option<ServerClosed> {
        self.client.closed.get().copied()
    }
}

impl ClientSlots {
    /// Room for `max` clients, with no other limit (no deadlines).
    pub fn new(max: usize) -> ClientSlots {
        ClientSlots::with_limits(Limits::max_clients(max))
    }

    /// Room and deadlines as `limits` say; with a deadline, a watchdog thread checks them
    /// (it ends with the last clone of these slots).
    pub fn with_limits(limits: Limits) -> ClientSlots {
        let shared = Arc::new(Shared {
            limits,
            table: Mutex::default(),
        });
        if let Some(tick) = limits.tick() {
            let weak = Arc::downgrade(&shared);
            let dispatch = tracing::dispatcher::get_default(Clone::clone);
            let spawned = std::thread::Builder::new()
                .name("rpc-admission".into())
                .spawn(move || {
                    let _dispatch = tracing::dispatcher::set_default(&dispatch);
                    watchdog(weak, tick)
                });
            if let Err(error) = spawned {
                tracing::error!(%error, "cannot start the admission watchdog: no deadlines");
            }
        }
        ClientSlots { shared }
    }

    /// A place for the client `socket` from `peer`, or `None` (logged: the caller closes the
    /// connection) when every place (of all, or of `peer`'s address) is taken and no
    /// connection can give way. A connection that gives way is closed (see the module docs).
    pub fn admit<S: AsFd>(&self, peer: SocketAddr, socket: &S) -> Option<ClientSlot> {
        let limits = self.shared.limits;
        let ip = peer.ip();
        let same_address = |client: &Client| client.peer.ip() == ip;
        let mut table = self.shared.table();
        if table.open(same_address) >= limits.max_per_address {
            let Some(victim) = table.victim(same_address) else {
                tracing::warn!(
                    %peer,
                    max_clients_per_address = limits.max_per_address,
                    "refusing client connection: too many clients from this address"
                );
                return None;
            };
            give_way(&victim, peer);
        }
        if table.open(|_| true) >= limits.max_clients {
            let Some(victim) = table.victim(|_| true) else {
                tracing::warn!(
                    %peer,
                    max_clients = limits.max_clients,
                    "refusing client connection: too many clients"
                );
                return None;
            };
            give_way(&victim, peer);
        }
        let socket = match socket2::SockRef::from(socket).try_clone() {
            Ok(socket) => Some(socket),
            Err(error) => {
                // Out of descriptors: served, but never closed by admission control.
                tracing::warn!(%peer, %error, "cannot watch the client's deadlines");
                None
            }
        };
        let id = table.next_id;
        table.next_id += 1;
        let now = Instant::now();
        let client = Arc::new(Client {
            id,
            peer,
            accepted: now,
            socket,
            activity: AtomicU8::new(Activity::AwaitingHello.as_u8()),
            holds_buffers: AtomicBool::new(false),
            idle_since: AtomicU64::new(coarse_now()),
            moved: AtomicU64::new(0),
            closed: OnceLock::new(),
        });
        table.clients.insert(id, client.clone());
        Some(ClientSlot {
            client,
            shared: self.shared.clone(),
        })
    }

    /// Clients served now (not counting those the server is closing).
    pub fn active(&self) -> usize {
        self.shared.table().open(|_| true)
    }
}

fn give_way(victim: &Client, newcomer: SocketAddr) {
    tracing::info!(
        peer = %victim.peer,
        %newcomer,
        activity = ?victim.activity_now(),
        "closing a connection to make room for a new client"
    );
    victim.close(ServerClosed::GaveWay);
}

/// Where a connection's progress was last found sufficient.
struct Mark {
    at: Instant,
    moved: u64,
}

/// Checks every connection's deadlines each `tick` until the slots are gone.
fn watchdog(shared: Weak<Shared>, tick: Duration) {
    let mut marks: HashMap<u64, Mark> = HashMap::new();
    loop {
        std::thread::sleep(tick);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let table = shared.table();
        marks.retain(|id, _| table.clients.contains_key(id));
        let now = Instant::now();
        for client in table.clients.values().filter(|client| !client.closing()) {
            if let Some(reason) = check(&shared.limits, client, &mut marks, now) {
                client.close(reason);
            }
        }
    }
}

/// Whether `client` missed a deadline at `now`; updates its progress mark.
fn check(
    limits: &Limits,
    client: &Client,
    marks: &mut HashMap<u64, Mark>,
    now: Instant,
) -> Option<ServerClosed> {
    let moved = client.moved.load(Ordering::Relaxed);
    let activity = client.activity_now();
    let mark = marks.entry(client.id).or_insert(Mark { at: now, moved });
    match (activity, limits.progress_window) {
        (Activity::AwaitingHello, _) => {
            let timeout = limits.hello_timeout?;
            (now.duration_since(client.accepted) >= timeout)
                .then_some(ServerClosed::HelloTimeout(timeout))
        }
        (Activity::Receiving | Activity::Sending, Some(window)) => {
            let min_bytes = limits.window_bytes(window);
            if moved.saturating_sub(mark.moved) >= min_bytes {
                *mark = Mark { at: now, moved };
                return None;
            }
            if now.duration_since(mark.at) < window {
                return None;
            }
            Some(if activity == Activity::Receiving {
                ServerClosed::ReceiveStalled { min_bytes, window }
            } else {
                ServerClosed::SendStalled { min_bytes, window }
            })
        }
        // Idle and working connections owe nothing: the window starts afresh when bytes are due.
        _ => {
            *mark = Mark { at: now, moved };
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// A connected socket pair (the server's end first).
    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (server, client)
    }

    fn peer(ip: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::from((ip, port))
    }

    fn closed_by_server(client: &mut TcpStream) -> bool {
        use std::io::Read;
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        matches!(client.read(&mut [0u8; 1]), Ok(0) | Err(_))
    }

    #[test]
    fn slots_admit_up_to_the_limit_and_free_on_drop() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (socket, _client) = pair(&listener);
        let slots = ClientSlots::new(2);
        let first = slots.admit(peer([127, 0, 0, 1], 9), &socket).unwrap();
        let second = slots.admit(peer([127, 0, 0, 1], 10), &socket).unwrap();
        // Both still await HELLO: the oldest gives way.
        let third = slots.admit(peer([127, 0, 0, 1], 11), &socket).unwrap();
        assert_eq!(first.closed_for(), Some(ServerClosed::GaveWay));
        assert_eq!(second.closed_for(), None);
        assert_eq!(slots.active(), 2);
        // Working connections never give way.
        second.client.activity(Activity::Working, false);
        third.client.activity(Activity::Receiving, false);
        assert!(slots.admit(peer([127, 0, 0, 1], 12), &socket).is_none());
        drop(first);
        drop(second);
        assert_eq!(slots.active(), 1);
        let fourth = slots.admit(peer([127, 0, 0, 1], 13), &socket).unwrap();
        assert_eq!(slots.active(), 2);
        drop((third, fourth));
        assert_eq!(slots.active(), 0);
    }

    #[test]
    fn awaiting_hello_gives_way_first_then_the_longest_idle_without_buffers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (socket, _client) = pair(&listener);
        let slots = ClientSlots::new(4);
        let at = |port| peer([10, 0, 0, 1], port);
        let idle_old = slots.admit(at(1), &socket).unwrap();
        idle_old.client.activity(Activity::Idle, false);
        std::thread::sleep(Duration::from_millis(2));
        let holding = slots.admit(at(2), &socket).unwrap();
        holding.client.activity(Activity::Idle, true);
        let idle_new = slots.admit(at(3), &socket).unwrap();
        idle_new.client.activity(Activity::Idle, false);
        let hello = slots.admit(at(4), &socket).unwrap();
        // Full: the one awaiting HELLO goes first, though it is the newest.
        let _a = slots.admit(at(5), &socket).unwrap();
        assert_eq!(hello.closed_for(), Some(ServerClosed::GaveWay));
        _a.client.activity(Activity::Sending, false);
        // Then the session idle longest that holds no buffers.
        let _b = slots.admit(at(6), &socket).unwrap();
        assert_eq!(idle_old.closed_for(), Some(ServerClosed::GaveWay));
        _b.client.activity(Activity::Working, true);
        let _c = slots.admit(at(7), &socket).unwrap();
        assert_eq!(idle_new.closed_for(), Some(ServerClosed::GaveWay));
        _c.client.activity(Activity::Receiving, false);
        // Only the idle session holding buffers is left, and it never gives way.
        assert!(slots.admit(at(8), &socket).is_none());
        assert_eq!(holding.closed_for(), None);
    }

    #[test]
    fn the_session_that_became_idle_first_gives_way_whatever_its_age() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (socket, _client) = pair(&listener);
        let slots = ClientSlots::new(2);
        let at = |port| peer([10, 0, 0, 1], port);
        let older = slots.admit(at(1), &socket).unwrap();
        older.client.activity(Activity::Sending, false);
        let newer = slots.admit(at(2), &socket).unwrap();
        newer.client.activity(Activity::Idle, false);
        // Past a few ticks of the coarse clock.
        std::thread::sleep(Duration::from_millis(50));
        older.client.activity(Activity::Idle, false);
        // Staying idle (polled again) does not restart its idle time.
        std::thread::sleep(Duration::from_millis(50));
        newer.client.activity(Activity::Idle, false);
        let _a = slots.admit(at(3), &socket).unwrap();
        assert_eq!(newer.closed_for(), Some(ServerClosed::GaveWay));
        assert_eq!(older.closed_for(), None);
    }

    #[test]
    fn a_connection_whose_hello_waits_unread_gives_way_last() {
        use std::io::Write;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (hello_socket, mut hello) = pair(&listener);
        let (silent_socket, _silent) = pair(&listener);
        let slots = ClientSlots::new(2);
        let with_hello = slots.admit(peer([10, 0, 0, 1], 1), &hello_socket).unwrap();
        let without = slots.admit(peer([10, 0, 0, 1], 2), &silent_socket).unwrap();
        hello.write_all(&[14, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        // The bytes reach the server's socket (loopback: at once, but asynchronously).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !with_hello.client.header_waiting() {
            assert!(Instant::now() < deadline, "the bytes never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        let _newcomer = slots.admit(peer([10, 0, 0, 1], 3), &silent_socket).unwrap();
        assert_eq!(
            with_hello.closed_for(),
            None,
            "its HELLO is about to be served"
        );
        assert_eq!(without.closed_for(), Some(ServerClosed::GaveWay));
    }

    #[test]
    fn one_address_is_held_to_its_own_limit() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (socket, _client) = pair(&listener);
        let mut limits = Limits::max_clients(8);
        limits.max_per_address = 2;
        let slots = ClientSlots::with_limits(limits);
        let a1 = slots.admit(peer([10, 0, 0, 1], 1), &socket).unwrap();
        let a2 = slots.admit(peer([10, 0, 0, 1], 2), &socket).unwrap();
        a1.client.activity(Activity::Idle, true);
        a2.client.activity(Activity::Working, false);
        assert!(slots.admit(peer([10, 0, 0, 1], 3), &socket).is_none());
        // Another address is not affected.
        let _b = slots.admit(peer([10, 0, 0, 2], 1), &socket).unwrap();
        // Within its own limit, an address's idle connection gives way to its new one.
        a2.client.activity(Activity::Idle, false);
        let _a3 = slots.admit(peer([10, 0, 0, 1], 3), &socket).unwrap();
        assert_eq!(a2.closed_for(), Some(ServerClosed::GaveWay));
        assert_eq!(a1.closed_for(), None);
    }

    #[test]
    fn the_watchdog_closes_missed_hello_and_stalled_messages_and_keeps_idle_sessions() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let slots = ClientSlots::with_limits(Limits {
            max_clients: 8,
            max_per_address: 8,
            hello_timeout: Some(Duration::from_millis(100)),
            progress_window: Some(Duration::from_millis(100)),
            min_progress_rate: 10_000,
        });
        let (silent_socket, mut silent) = pair(&listener);
        let hello = slots.admit(peer([10, 0, 0, 1], 1), &silent_socket).unwrap();
        let (idle_socket, _idle) = pair(&listener);
        let idle = slots.admit(peer([10, 0, 0, 1], 2), &idle_socket).unwrap();
        idle.client.activity(Activity::Idle, false);
        let (stalled_socket, mut stalled_peer) = pair(&listener);
        let stalled = slots
            .admit(peer([10, 0, 0, 1], 3), &stalled_socket)
            .unwrap();
        stalled.client.activity(Activity::Sending, true);
        let (busy_socket, _busy) = pair(&listener);
        let busy = slots.admit(peer([10, 0, 0, 1], 4), &busy_socket).unwrap();
        busy.client.activity(Activity::Receiving, true);
        // 1,000 bytes per window are owed; this one moves plenty, 20 ms at a time.
        for _ in 0..25 {
            busy.client.moved(500);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            hello.closed_for(),
            Some(ServerClosed::HelloTimeout(Duration::from_millis(100)))
        );
        assert!(closed_by_server(&mut silent));
        assert!(matches!(
            stalled.closed_for(),
            Some(ServerClosed::SendStalled {
                min_bytes: 1000,
                ..
            })
        ));
        assert!(closed_by_server(&mut stalled_peer));
        assert_eq!(idle.closed_for(), None, "idle sessions stay open");
        assert_eq!(busy.closed_for(), None, "progressing messages stay open");
        assert_eq!(
            hello.ending(Ok(Closed::ByClient)).unwrap_err().to_string(),
            "HELLO did not arrive within 100ms"
        );
        assert!(matches!(
            idle.ending(Ok(Closed::ByClient)),
            Ok(Closed::ByClient)
        ));
    }
}
