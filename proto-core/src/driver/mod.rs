//! The one connection driver every shell, test harness and fuzz target uses.
//!
//! A [`Connection`] owns everything one client connection needs besides its socket: the
//! [`ServerSession`], the [`Dispatcher`], a large reply in progress and the comm work waiting
//! for its turn. In the manner of quinn-proto's `Connection`, input goes in
//! ([`handle_input`](Connection::handle_input), [`handle_eof`](Connection::handle_eof), what a
//! socket call did: [`receive_in_place`](Connection::receive_in_place),
//! [`send_in_place`](Connection::send_in_place), [`comm_init_done`](Connection::comm_init_done))
//! and [`poll`](Connection::poll) says what to do next ([`Action`]). A shell is then only a loop
//! around `poll` that owns the socket, the threads and the comm link:
//!
//! ```text
//! loop match conn.poll(Place::EventLoop)? {
//!     Transmit         => write out every conn.poll_transmit()
//!     Offload          => run conn.poll(Place::Blocking) off the event loop, act on its answer
//!     Comm(work)       => run it with the comm link off the event loop
//!     SendInPlace      => when writable: conn.send_in_place(non-blocking send)
//!     Receive(Idle)    => read what comes (or close: shutdown), conn.handle_input(bytes)
//!     Receive(Stream{..}) => when readable: conn.receive_in_place(non-blocking recv), or read
//!                         a fresh buffer of at most `remaining` bytes into handle_input
//!     Upgrade(peer caps)  => conn.answer_hello(own caps for them); once HELLO's answer is
//!                         written, the shell may move the connection to that transport
//! }
//! ```
//!
//! Any `Err` closes that one connection (the protocol has no error replies); dropping the
//! connection frees every buffer the client held.

mod activity;
mod heavy;

use bytes::Bytes;

use crate::backend::{Backend, TensorLocation};
use crate::dispatch::{
    Dispatcher, DispatcherConfig, Outcome, RemoteCopyWork, TensorReadStream, MAX_REPLY_CHUNK,
    MIN_IN_PLACE_REPLY,
};
use crate::error::{Error, Result};
use crate::session::{ServerEvent, ServerSession, ServerSessionConfig};
use crate::wire::{CommInitRequest, RemoteCopyStatus, Response};

pub use activity::{Activity, Monitor};
pub use heavy::{is_heavy, is_heavy_to_free, HEAVY_BYTES, HEAVY_FREE_BYTES};

use std::sync::Arc;

/// Where [`Connection::poll`] runs: on the thread that serves other connections too, or on one
/// where blocking is fine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The event loop: heavy work is not run here but announced with [`Action::Offload`].
    EventLoop,
    /// A thread of its own (a blocking pool, `block_in_place`): everything runs.
    Blocking,
}

/// What a shell must do next for a connection.
#[derive(Debug)]
pub enum Action {
    /// Write out every [`Connection::poll_transmit`] (responses, a reply's head or piece),
    /// then poll again.
    Transmit,
    /// Heavy work is next: call [`Connection::poll`] with [`Place::Blocking`] where blocking
    /// does not stall other connections, and act on what it returns.
    Offload,
    /// Work that needs sockets besides the client's (the comm link). It may wait for a peer
    /// up to the comm timeout: run it off the event loop, report COMM_INIT's result with
    /// [`Connection::comm_init_done`], then poll again.
    Comm(CommWork),
    /// A streamed reply's data goes straight from backend memory: when the socket is writable,
    /// call [`Connection::send_in_place`].
    SendInPlace,
    /// More input is needed.
    Receive(Receive),
    /// HELLO offered these transport caps (only with
    /// [`DispatcherConfig::negotiate_transport`]): answer with
    /// [`Connection::answer_hello`] and this side's caps for them (all zero: stay on TCP).
    /// After that answer is written (the next [`Action::Receive`]), the shell switches the
    /// connection to the negotiated transport if both caps are non-zero.
    Upgrade(crate::wire::ConnCaps),
}

/// What kind of input the connection waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receive {
    /// Between messages: read whatever arrives. The only point where a shutting-down server
    /// may close the connection (a command in progress is finished first).
    Idle,
    /// SET_TENSOR / SET_TENSOR_2D data streams in and `remaining` bytes of it are still owed.
    /// `in_place`: try [`Connection::receive_in_place`] when readable; else (or when that
    /// declines) read at most `remaining` bytes into a fresh buffer for
    /// [`Connection::handle_input`] (never a reused one: the session slices the backend's
    /// chunks out of it).
    Stream {
        /// Data bytes owed.
        remaining: u64,
        /// Whether the next bytes may go straight into backend memory.
        in_place: bool,
    },
}

/// Comm link work for the shell (see [`Action::Comm`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommWork {
    /// Set up the link COMM_INIT asks for, then report with [`Connection::comm_init_done`].
    Init(Box<CommInitRequest>),
    /// Sum `elements` f32 at `at` with the other ranks over the device's link and write the
    /// sums back there.
    Allreduce {
        /// The device.
        device: u32,
        /// The tensor's bytes.
        at: TensorLocation,
        /// Number of f32 elements.
        elements: u64,
    },
    /// Drop the device's link.
    Free {
        /// The device.
        device: u32,
    },
    /// REMOTE_COPY_TENSOR (ours): push the checked source region to server B, then report
    /// with [`Connection::remote_copy_done`].
    RemoteCopy(Box<RemoteCopyWork>),
}

/// Sees every event before it runs (feature `testing`).
#[cfg(feature = "testing")]
type Observer = Box<dyn FnMut(&ServerEvent) + Send>;

/// One client connection's protocol state (see the module docs).
pub struct Connection<B: Backend + ?Sized = dyn Backend> {
    session: ServerSession,
    dispatcher: Dispatcher<B>,
    /// A large reply being sent, from backend memory or piece by piece.
    reply: Option<TensorReadStream>,
    /// A heavy event taken from the session, waiting for [`Place::Blocking`].
    parked: Option<ServerEvent>,
    /// Comm work waiting for the transmits before it to be written.
    comm: Option<CommWork>,
    /// Whether the shell can lend the backend's memory to its socket and the backend agreed
    /// so far (it is asked once per reply).
    lend: bool,
    /// The client's transport caps waiting for [`Connection::answer_hello`].
    upgrade: Option<crate::wire::ConnCaps>,
    /// The error that failed the connection: every later poll returns it.
    failed: Option<Error>,
    /// Told the activity after each poll and the bytes moved (admission control).
    monitor: Option<Arc<dyn Monitor>>,
    /// Sees every event before it runs (fuzz targets check the session's event grammar).
    #[cfg(feature = "testing")]
    observer: Option<Observer>,
}

impl<B: Backend + ?Sized> std::fmt::Debug for Connection<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("session", &self.session)
            .field("reply", &self.reply)
            .field("parked", &self.parked)
            .field("comm", &self.comm)
            .field("lend", &self.lend)
            .finish_non_exhaustive()
    }
}

impl<B: Backend + ?Sized> Connection<B> {
    /// A connection awaiting HELLO. Fails for a version whose major we do not speak.
    ///
    /// `direct_io`: whether the shell's stream can move tensor data straight between the
    /// socket and backend memory ([`receive_in_place`](Self::receive_in_place),
    /// [`send_in_place`](Self::send_in_place)); an in-memory pipe cannot.
    pub fn new(
        backend: Arc<B>,
        session: &ServerSessionConfig,
        dispatcher: &DispatcherConfig,
        direct_io: bool,
    ) -> Result<Self> {
        Ok(Connection {
            session: ServerSession::new(session.clone()),
            dispatcher: Dispatcher::new(backend, dispatcher.clone())?,
            reply: None,
            parked: None,
            comm: None,
            lend: direct_io,
            upgrade: None,
            failed: None,
            monitor: None,
            #[cfg(feature = "testing")]
            observer: None,
        })
    }

    /// Whether the shell's stream can move tensor data straight between the socket and backend
    /// memory (see [`new`](Self::new)).
    pub fn set_direct_io(&mut self, direct_io: bool) {
        self.lend = direct_io;
    }

    /// Reports this connection's [`Activity`] after every poll, and the bytes it moves, to
    /// `monitor` (the server's admission control).
    pub fn set_monitor(&mut self, monitor: Arc<dyn Monitor>) {
        self.monitor = Some(monitor);
    }

    /// What the connection does, as of now (see [`Activity`]).
    pub fn activity(&self) -> Activity {
        if self.parked.is_some() || self.comm.is_some() {
            Activity::Working
        } else if self.reply.is_some() || self.session.has_transmit() {
            Activity::Sending
        } else if self.session.awaiting_hello() {
            Activity::AwaitingHello
        } else if self.session.stream_remaining() > 0 || self.session.buffered() > 0 {
            Activity::Receiving
        } else {
            Activity::Idle
        }
    }

    fn moved(&self, bytes: usize) {
        if let Some(monitor) = &self.monitor {
            monitor.moved(bytes as u64);
        }
    }

    /// Calls `observer` with every event before it runs (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn observe(&mut self, observer: impl FnMut(&ServerEvent) + Send + 'static) {
        self.observer = Some(Box::new(observer));
    }

    /// The command whose response is owed, if one is.
    pub fn awaiting_response(&self) -> Option<crate::wire::Command> {
        self.session.awaiting_response()
    }

    /// Appends bytes read from the client.
    pub fn handle_input(&mut self, data: Bytes) {
        self.moved(data.len());
        self.session.handle_input(data);
    }

    /// The client closed its side. An error if it stopped in the middle of a frame.
    pub fn handle_eof(&mut self) -> Result<()> {
        self.session.handle_eof()
    }

    /// The next bytes to write to the client, in order.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        let bytes = self.session.poll_transmit()?;
        // Counted when handed out: a reply larger than one transmit goes in place or in pieces.
        self.moved(bytes.len());
        Some(bytes)
    }

    /// Whether bytes wait in [`poll_transmit`](Self::poll_transmit).
    pub fn has_transmit(&self) -> bool {
        self.session.has_transmit()
    }

    /// The backend (for comm work).
    pub fn backend(&self) -> &Arc<B> {
        self.dispatcher.backend()
    }

    /// Whether freeing what the client holds is heavy ([`is_heavy_to_free`]): drop the
    /// connection off the event loop then.
    pub fn heavy_to_free(&self) -> bool {
        is_heavy_to_free(self.dispatcher.buffers())
    }

    /// Bytes of the streamed write in progress not yet received (0: none streams).
    pub fn stream_remaining(&self) -> u64 {
        self.session.stream_remaining()
    }

    /// How many bytes of the streamed write [`receive_in_place`](Self::receive_in_place) may
    /// place now (0: none, feed [`handle_input`](Self::handle_input)).
    pub fn in_place_capacity(&self) -> u64 {
        if self.lend {
            self.session.in_place_capacity()
        } else {
            0
        }
    }

    /// Data bytes of the reply in progress still to send (0: none).
    pub fn reply_remaining(&self) -> u64 {
        self.reply.as_ref().map_or(0, TensorReadStream::remaining)
    }

    /// Runs the connection until the shell must act. On [`Place::EventLoop`] heavy work stops
    /// it with [`Action::Offload`]; on [`Place::Blocking`] everything runs, and it stops after
    /// each reply piece so the shell can write it while nothing else is held.
    pub fn poll(&mut self, place: Place) -> Result<Action> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let result = self.poll_inner(place);
        if let Err(error) = &result {
            self.failed = Some(error.clone());
        }
        if let Some(monitor) = &self.monitor {
            let activity = match &result {
                Ok(Action::Offload | Action::Comm(_)) => Activity::Working,
                _ => self.activity(),
            };
            monitor.activity(activity, !self.dispatcher.buffers().is_empty());
        }
        result
    }

    fn poll_inner(&mut self, place: Place) -> Result<Action> {
        loop {
            if let Some(peer) = self.upgrade {
                // Nothing else runs before HELLO is answered (the client waits for it).
                return Ok(Action::Upgrade(peer));
            }
            if let Some(event) = self.parked.take() {
                if place == Place::EventLoop {
                    self.parked = Some(event);
                    return Ok(Action::Offload);
                }
                self.execute(event)?;
                continue;
            }
            if self.comm.is_some() {
                // The client may be waiting for the responses before it (and comm work may
                // wait for the peer a long time).
                if self.session.has_transmit() {
                    return Ok(Action::Transmit);
                }
                if let Some(work) = self.comm.take() {
                    return Ok(Action::Comm(work));
                }
            }
            if let Some(reply) = self.reply.as_mut() {
                // The head and earlier pieces go out before more of the reply.
                if self.session.has_transmit() {
                    return Ok(Action::Transmit);
                }
                if self.lend {
                    return Ok(Action::SendInPlace);
                }
                if place == Place::EventLoop {
                    return Ok(Action::Offload);
                }
                if let Some(piece) = self.dispatcher.read_chunk(reply)? {
                    self.session.send_response_data(piece)?;
                }
                if reply.remaining() == 0 {
                    self.reply = None;
                }
                return Ok(Action::Transmit);
            }
            let Some(event) = self.session.poll_event()? else {
                if self.session.has_transmit() {
                    return Ok(Action::Transmit);
                }
                return Ok(Action::Receive(self.receive()));
            };
            if place == Place::EventLoop && is_heavy(&event, self.dispatcher.buffers()) {
                self.parked = Some(event);
                return Ok(Action::Offload);
            }
            self.execute(event)?;
        }
    }

    fn receive(&self) -> Receive {
        let remaining = self.session.stream_remaining();
        if remaining == 0 {
            return Receive::Idle;
        }
        Receive::Stream {
            remaining,
            in_place: self.lend_receive(),
        }
    }

    /// Whether the streamed write's next bytes may be received into backend memory now.
    fn lend_receive(&self) -> bool {
        self.lend
            && self.session.in_place_capacity() > 0
            && self.dispatcher.in_place_target(1).is_some()
    }

    fn execute(&mut self, event: ServerEvent) -> Result<()> {
        #[cfg(feature = "testing")]
        if let Some(observer) = self.observer.as_mut() {
            observer(&event);
        }
        // Lent replies cost no copy, so medium ones (logits) are worth streaming too.
        self.dispatcher.set_stream_replies_above(if self.lend {
            MIN_IN_PLACE_REPLY
        } else {
            MAX_REPLY_CHUNK
        });
        match self.dispatcher.handle(event)? {
            Outcome::Done => {}
            Outcome::Respond(response) => self.session.send_response(&response)?,
            Outcome::RespondStream(reply) => {
                self.session
                    .begin_response_stream(reply.command(), reply.len())?;
                if !reply.is_empty() {
                    self.reply = Some(reply);
                }
            }
            Outcome::CommInit(request) => self.comm = Some(CommWork::Init(request)),
            Outcome::CommAllreduce {
                device,
                at,
                elements,
            } => {
                self.comm = Some(CommWork::Allreduce {
                    device,
                    at,
                    elements,
                })
            }
            Outcome::CommFree { device } => self.comm = Some(CommWork::Free { device }),
            Outcome::RemoteCopy(work) => self.comm = Some(CommWork::RemoteCopy(work)),
            Outcome::Upgrade(peer) => self.upgrade = Some(peer),
        }
        Ok(())
    }

    /// Answers the HELLO of [`Action::Upgrade`] with this side's transport caps.
    pub fn answer_hello(&mut self, caps: crate::wire::ConnCaps) -> Result<()> {
        if self.upgrade.take().is_none() {
            return Err(Error::InvalidState("no HELLO waits for transport caps"));
        }
        let response = self.dispatcher.hello_response(caps);
        self.session.send_response(&response)
    }

    /// Records the result of [`CommWork::Init`] and queues COMM_INIT's answer.
    pub fn comm_init_done(&mut self, device: u32, ok: bool) -> Result<()> {
        let response = self.dispatcher.finish_comm_init(device, ok);
        self.session.send_response(&response)
    }

    /// Queues REMOTE_COPY_TENSOR's answer after [`CommWork::RemoteCopy`] ran.
    pub fn remote_copy_done(&mut self, status: RemoteCopyStatus) -> Result<()> {
        self.session
            .send_response(&Response::RemoteCopyTensor(status.byte()))
    }

    /// Receives the next bytes of the streamed write straight into backend memory: the
    /// backend lends the destination (at most one chunk, or the rest of a SET_TENSOR_2D row) to
    /// `recv`, a non-blocking receive that returns how many bytes it placed at the start.
    ///
    /// `Ok(Some(n))`: `n` bytes placed (0: none were there, or the shell's call failed: it
    /// keeps its own error). `Ok(None)`: not possible now (see [`Receive::Stream`]): read
    /// into a buffer instead.
    pub fn receive_in_place(
        &mut self,
        recv: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<Option<usize>> {
        if !self.lend {
            return Ok(None);
        }
        let capacity = self.session.in_place_capacity();
        let Some((at, take)) = self.dispatcher.in_place_target(capacity) else {
            return Ok(None);
        };
        let take = to_usize(take)?;
        let Some(received) = self.dispatcher.backend().write_in_place(at, take, recv)? else {
            self.lend = false;
            return Ok(None);
        };
        if received > take {
            return Err(Error::Backend(
                "in-place receive reported more bytes than it was lent".into(),
            ));
        }
        self.moved(received);
        self.dispatcher.received_in_place(received as u64)?;
        self.session.data_received_in_place(received as u64)?;
        Ok(Some(received))
    }

    /// Sends the next bytes of the reply in progress straight from backend memory: the
    /// backend lends the next contiguous region (at most 16 MiB) to `send`, a non-blocking send
    /// that returns how many bytes it took from the start. Only after
    /// [`Action::SendInPlace`].
    ///
    /// `Ok(Some(n))`: `n` bytes sent (0: the socket took none, or the shell's call failed).
    /// `Ok(None)`: the backend's memory is not host-addressable: poll again, the reply then
    /// goes piece by piece through [`poll_transmit`](Self::poll_transmit).
    pub fn send_in_place(&mut self, send: &mut dyn FnMut(&[u8]) -> usize) -> Result<Option<usize>> {
        let Some(reply) = self.reply.as_mut() else {
            return Ok(Some(0));
        };
        let (at, take) = reply.next_region(MAX_REPLY_CHUNK);
        let take = to_usize(take)?;
        let Some(sent) = self.dispatcher.backend().read_in_place(at, take, send)? else {
            self.lend = false;
            return Ok(None);
        };
        if sent > take {
            return Err(Error::Backend(
                "in-place send reported more bytes than it was lent".into(),
            ));
        }
        if let Some(monitor) = &self.monitor {
            monitor.moved(sent as u64);
        }
        self.session.response_data_sent_in_place(sent as u64)?;
        reply.advance(sent as u64);
        if reply.remaining() == 0 {
            self.reply = None;
        }
        Ok(Some(sent))
    }
}

fn to_usize(n: u64) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::SizeOverflow("length exceeds the address space"))
}
