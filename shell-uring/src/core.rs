//! One connection's protocol state, driven without any I/O: [`ServerSession`] →
//! [`Dispatcher`] → transmit queue. The ring thread runs it inline for cheap events and hands
//! it to a blocking thread for heavy ones (large copies, graph compute, cache file I/O, the comm
//! link).

use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_core::backend::{Backend, TensorLocation};
use proto_core::dispatch::{Dispatcher, Outcome, TensorReadStream};
use proto_core::session::{ServerEvent, ServerSession};
use proto_core::wire::CommInitRequest;

use shell_common::direct::record;
use shell_common::is_heavy;

use crate::comm::CommLink;

pub(crate) use shell_common::ConnectionConfig;

/// Most bytes [`Core::send_direct`] sends in one call (several pieces).
const SEND_BURST: usize = 4 << 20;

/// Work of an event that needs sockets besides the client's (the comm link).
#[derive(Debug)]
pub(crate) enum CommWork {
    Init(Box<CommInitRequest>),
    Allreduce {
        device: u32,
        at: TensorLocation,
        elements: u64,
    },
}

/// Work that must not run on the ring thread.
#[derive(Debug)]
pub(crate) enum Work {
    /// A heavy event for the dispatcher.
    Event(ServerEvent),
    /// Comm link work (may wait for the peer for up to the comm timeout).
    Comm(CommWork),
    /// The next piece (at most 16 MiB) of a large GET_TENSOR reply.
    Reply,
}

/// Where driving stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// More input is needed (the transmit queue may hold responses to write).
    Idle,
    /// This work must run on a blocking thread (after the transmit queue was written).
    Work(Work),
    /// The connection must close.
    Failed(proto_core::Error),
}

/// The protocol state of one connection. Dropping it frees every buffer the client held.
pub(crate) struct Core {
    pub session: ServerSession,
    dispatcher: Dispatcher<dyn Backend>,
    links: HashMap<u32, CommLink>,
    comm_timeout: Duration,
    /// A large reply in progress, read from the backend one piece at a time (or sent straight
    /// from it, see [`send_direct`](Self::send_direct)).
    reply: Option<TensorReadStream>,
    /// Whether the backend lent its memory for direct sends so far (it is asked once).
    pub direct_replies: bool,
    /// Bytes to write, in order.
    pub outbox: Vec<Bytes>,
}

impl Core {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        config: &ConnectionConfig,
    ) -> proto_core::Result<Core> {
        Ok(Core {
            session: ServerSession::new(config.session.clone()),
            dispatcher: Dispatcher::new(backend, config.dispatcher.clone())?,
            links: HashMap::new(),
            comm_timeout: config.comm_timeout,
            reply: None,
            direct_replies: true,
            outbox: Vec::new(),
        })
    }

    /// Hands events to the dispatcher until more input is needed. On the ring thread
    /// (`blocking == false`) it stops at heavy work and returns it; on a blocking thread it runs
    /// everything, except comm work while responses are still unwritten (the client may be
    /// waiting for them), and it stops after each piece of a large reply so the ring can send
    /// it while the next piece is read.
    pub(crate) fn drive(&mut self, blocking: bool) -> Stop {
        loop {
            if self.reply.is_some() {
                if !blocking {
                    return Stop::Work(Work::Reply);
                }
                if !self.outbox.is_empty() {
                    return Stop::Idle;
                }
                if let Err(error) = self.next_piece() {
                    return Stop::Failed(error);
                }
                continue;
            }
            let event = match self.session.poll_event() {
                Ok(Some(event)) => event,
                Ok(None) => return Stop::Idle,
                Err(error) => return Stop::Failed(error),
            };
            if !blocking && is_heavy(&event, self.dispatcher.buffers()) {
                return Stop::Work(Work::Event(event));
            }
            match self.execute(event) {
                Err(error) => return Stop::Failed(error),
                Ok(None) => {}
                Ok(Some(comm)) => {
                    if !blocking || !self.outbox.is_empty() {
                        return Stop::Work(Work::Comm(comm));
                    }
                    if let Err(error) = self.comm(comm) {
                        return Stop::Failed(error);
                    }
                }
            }
        }
    }

    /// Runs work returned by [`drive`](Self::drive) (on a blocking thread), then drives on.
    pub(crate) fn run(&mut self, work: Work) -> Stop {
        let result = match work {
            Work::Event(event) => match self.execute(event) {
                Ok(Some(comm)) if self.outbox.is_empty() => self.comm(comm),
                Ok(Some(comm)) => return Stop::Work(Work::Comm(comm)),
                Ok(None) => Ok(()),
                Err(error) => Err(error),
            },
            Work::Comm(comm) => self.comm(comm),
            Work::Reply => self.next_piece(),
        };
        match result {
            Ok(()) => self.drive(true),
            Err(error) => Stop::Failed(error),
        }
    }

    /// Executes one event; returns comm work it asks for.
    fn execute(&mut self, event: ServerEvent) -> proto_core::Result<Option<CommWork>> {
        match self.dispatcher.handle(event)? {
            Outcome::Done => {}
            Outcome::Respond(response) => {
                self.session.send_response(&response)?;
                self.collect_transmit();
            }
            Outcome::RespondStream(reply) => {
                self.session
                    .begin_response_stream(reply.command(), reply.len())?;
                self.collect_transmit();
                if !reply.is_empty() {
                    self.reply = Some(reply);
                }
            }
            Outcome::CommFree { device } => {
                if self.links.remove(&device).is_some() {
                    tracing::info!(device, "comm link closed");
                }
            }
            Outcome::CommInit(request) => return Ok(Some(CommWork::Init(request))),
            Outcome::CommAllreduce {
                device,
                at,
                elements,
            } => {
                return Ok(Some(CommWork::Allreduce {
                    device,
                    at,
                    elements,
                }))
            }
        }
        Ok(None)
    }

    /// Receives the next part of the streamed write from `stream` straight into backend
    /// memory (one non-blocking `recv`). `None`: not possible now (see
    /// `Dispatcher::receive_in_place`), receive into a buffer instead.
    pub(crate) fn receive_direct(
        &mut self,
        stream: &TcpStream,
    ) -> proto_core::Result<Option<io::Result<usize>>> {
        let mut outcome = None;
        let placed = self
            .dispatcher
            .receive_in_place(&mut self.session, &mut |dst| {
                record(crate::ring::recv_now(stream, dst), &mut outcome)
            })?;
        Ok(placed.and(outcome))
    }

    /// Sends the next part of the reply in progress (its head already written) straight from
    /// backend memory to `stream`: non-blocking `send`s of at most
    /// [`SEND_PIECE`](shell_common::direct::SEND_PIECE) each, up to [`SEND_BURST`] bytes while
    /// the socket takes whole pieces (the ring makes one call per connection per pass, and a
    /// pass costs a ring submission). `None`: the backend does not lend its memory (nothing was
    /// sent; the reply goes piece by piece through the outbox).
    pub(crate) fn send_direct(
        &mut self,
        stream: &TcpStream,
    ) -> proto_core::Result<Option<io::Result<usize>>> {
        let mut total = 0;
        while total < SEND_BURST {
            let Some(reply) = self.reply.as_mut() else {
                return Ok(Some(Ok(total)));
            };
            let mut outcome = None;
            let sent = self
                .dispatcher
                .send_in_place(reply, &mut self.session, &mut |src| {
                    record(
                        crate::ring::send_now(stream, shell_common::direct::send_piece(src)),
                        &mut outcome,
                    )
                })?;
            if sent.is_none() {
                self.direct_replies = false;
                return Ok(if total == 0 { None } else { Some(Ok(total)) });
            }
            if reply.remaining() == 0 {
                self.reply = None;
            }
            match outcome.unwrap_or(Ok(0)) {
                Ok(n) if n == shell_common::direct::SEND_PIECE => total += n,
                Ok(n) => return Ok(Some(Ok(total + n))),
                // What moved before the socket filled up counts; the next call sees it full.
                Err(error) if total > 0 && shell_common::direct::retry(&error) => {
                    return Ok(Some(Ok(total)))
                }
                Err(error) => return Ok(Some(Err(error))),
            }
        }
        Ok(Some(Ok(total)))
    }

    /// Whether freeing what the client holds would stall the ring (see
    /// [`shell_common::is_heavy_to_free`]).
    pub(crate) fn heavy_to_free(&self) -> bool {
        shell_common::is_heavy_to_free(self.dispatcher.buffers())
    }

    /// Bytes of the reply in progress still to send (0: none in progress).
    pub(crate) fn reply_remaining(&self) -> u64 {
        self.reply.as_ref().map_or(0, TensorReadStream::remaining)
    }

    /// Reads the next piece of the reply in progress and queues it.
    fn next_piece(&mut self) -> proto_core::Result<()> {
        let Some(reply) = self.reply.as_mut() else {
            return Ok(());
        };
        if let Some(piece) = self.dispatcher.read_chunk(reply)? {
            self.session.send_response_data(piece)?;
        }
        if reply.remaining() == 0 {
            self.reply = None;
        }
        self.collect_transmit();
        Ok(())
    }

    fn collect_transmit(&mut self) {
        while let Some(bytes) = self.session.poll_transmit() {
            if !bytes.is_empty() {
                self.outbox.push(bytes);
            }
        }
    }

    /// COMM_INIT (a failure is the soft answer `ok = 0`) or COMM_ALLREDUCE (a failure closes
    /// the connection, as in the reference). Blocks.
    fn comm(&mut self, work: CommWork) -> proto_core::Result<()> {
        match work {
            CommWork::Init(request) => {
                let device = request.device;
                let ok = match CommLink::establish(&request, self.comm_timeout) {
                    Ok(link) => {
                        tracing::info!(device, rank = link.rank(), "comm link ready");
                        self.links.insert(device, link);
                        true
                    }
                    Err(error) => {
                        tracing::warn!(%error, device, rank = request.rank, world = request.world, "COMM_INIT failed");
                        false
                    }
                };
                let response = self.dispatcher.finish_comm_init(device, ok);
                self.session.send_response(&response)?;
                self.collect_transmit();
                Ok(())
            }
            CommWork::Allreduce {
                device,
                at,
                elements,
            } => {
                let link = self.links.get_mut(&device).ok_or_else(|| {
                    proto_core::Error::Comm(format!("no comm link for device {device}"))
                })?;
                let len = usize::try_from(elements)
                    .ok()
                    .and_then(|n| n.checked_mul(4))
                    .ok_or(proto_core::Error::SizeOverflow("all-reduce tensor"))?;
                let backend = self.dispatcher.backend().clone();
                let mut bytes = vec![0u8; len];
                backend.read(at, &mut bytes)?;
                let local: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let sums = link.allreduce(local)?;
                for (out, value) in bytes.chunks_exact_mut(4).zip(&sums) {
                    out.copy_from_slice(&value.to_le_bytes());
                }
                backend.write(at, &bytes)
            }
        }
    }
}
