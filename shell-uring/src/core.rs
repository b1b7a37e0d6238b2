//! One connection's protocol state on the ring: the driver
//! ([`proto_core::driver::Connection`]), its comm links, and the bytes it queued for the ring
//! to send. The ring thread polls it inline and hands it to a blocking thread for heavy work
//! (large copies, graph compute, cache file I/O, the comm link).

use std::io;
use std::net::TcpStream;
use std::sync::Arc;

use bytes::Bytes;
use proto_core::backend::Backend;
use proto_core::driver::{Action, CommWork, Connection, Place};

use shell_common::direct::{record, retry, send_piece, SEND_PIECE};
use shell_common::CommLinks;

pub(crate) use shell_common::ConnectionConfig;

/// Most bytes [`Core::send_direct`] sends in one call (several pieces).
const SEND_BURST: usize = 4 << 20;

/// Work that must not run on the ring thread.
#[derive(Debug)]
pub(crate) enum Work {
    /// The driver's heavy work (an event, the next piece of a large reply).
    Heavy,
    /// Comm link work (may wait for the peer for up to the comm timeout).
    Comm(CommWork),
}

/// Where driving stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Socket work: the outbox to send, or input to receive.
    Idle,
    /// A reply's data goes straight from backend memory ([`Core::send_direct`]).
    SendInPlace,
    /// This work must run on a blocking thread (after the outbox was sent).
    Work(Work),
    /// The connection must close.
    Failed(proto_core::Error),
}

/// The protocol state of one connection. Dropping it frees every buffer the client held.
pub(crate) struct Core {
    pub conn: Connection,
    links: CommLinks,
    /// Bytes to write, in order.
    pub outbox: Vec<Bytes>,
}

impl Core {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        config: &ConnectionConfig,
    ) -> proto_core::Result<Core> {
        Ok(Core {
            conn: config.connect(backend, true)?,
            links: CommLinks::new(config.comm_timeout),
            outbox: Vec::new(),
        })
    }

    /// Polls the driver until the ring must act. On the ring thread (`blocking == false`) it
    /// stops at heavy work and returns it; on a blocking thread it runs everything, comm work
    /// included once the responses before it are out.
    pub(crate) fn drive(&mut self, blocking: bool) -> Stop {
        let place = if blocking {
            Place::Blocking
        } else {
            Place::EventLoop
        };
        let mut action = self.conn.poll(place);
        loop {
            self.collect_transmit();
            match action {
                Err(error) => return Stop::Failed(error),
                Ok(Action::Transmit | Action::Receive(_)) => return Stop::Idle,
                Ok(Action::SendInPlace) => return Stop::SendInPlace,
                Ok(Action::Offload) => return Stop::Work(Work::Heavy),
                // Responses first: the client may be waiting for them.
                Ok(Action::Comm(work)) if blocking && self.outbox.is_empty() => {
                    if let Err(error) = self.links.run(work, &mut self.conn) {
                        return Stop::Failed(error);
                    }
                    action = self.conn.poll(place);
                }
                Ok(Action::Comm(work)) => return Stop::Work(Work::Comm(work)),
            }
        }
    }

    /// Runs work returned by [`drive`](Self::drive) (on a blocking thread), then drives on.
    pub(crate) fn run(&mut self, work: Work) -> Stop {
        if let Work::Comm(work) = work {
            if let Err(error) = self.links.run(work, &mut self.conn) {
                return Stop::Failed(error);
            }
        }
        self.drive(true)
    }

    /// Receives the next part of the streamed write from `stream` straight into backend
    /// memory (one non-blocking `recv`). `None`: not possible now, receive into a buffer.
    pub(crate) fn receive_direct(
        &mut self,
        stream: &TcpStream,
    ) -> proto_core::Result<Option<io::Result<usize>>> {
        let mut outcome = None;
        let placed = self.conn.receive_in_place(&mut |dst| {
            record(crate::ring::recv_now(stream, dst), &mut outcome)
        })?;
        Ok(placed.and(outcome))
    }

    /// Sends the next part of the reply in progress (its head already written) straight from
    /// backend memory to `stream`: non-blocking `send`s of at most [`SEND_PIECE`] each, up to
    /// [`SEND_BURST`] bytes while the socket takes whole pieces (the ring makes one call per
    /// connection per pass, and a pass costs a ring submission). `None`: the backend does not
    /// lend its memory (nothing was sent; the driver goes piece by piece).
    pub(crate) fn send_direct(
        &mut self,
        stream: &TcpStream,
    ) -> proto_core::Result<Option<io::Result<usize>>> {
        let mut total = 0;
        while total < SEND_BURST && self.conn.reply_remaining() > 0 {
            let mut outcome = None;
            let sent = self.conn.send_in_place(&mut |src| {
                record(crate::ring::send_now(stream, send_piece(src)), &mut outcome)
            })?;
            if sent.is_none() {
                return Ok(if total == 0 { None } else { Some(Ok(total)) });
            }
            match outcome.unwrap_or(Ok(0)) {
                Ok(n) if n == SEND_PIECE => total += n,
                Ok(n) => return Ok(Some(Ok(total + n))),
                // What moved before the socket filled up counts; the next call sees it full.
                Err(error) if total > 0 && retry(&error) => return Ok(Some(Ok(total))),
                Err(error) => return Ok(Some(Err(error))),
            }
        }
        Ok(Some(Ok(total)))
    }

    fn collect_transmit(&mut self) {
        while let Some(bytes) = self.conn.poll_transmit() {
            if !bytes.is_empty() {
                self.outbox.push(bytes);
            }
        }
    }
}
