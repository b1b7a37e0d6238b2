//! One connection's protocol state on the ring: the driver, its comm links and the bytes it
//! queued for the ring to send. The ring thread polls it inline and hands it to a blocking
//! thread for heavy work.

use std::net::TcpStream;
use std::sync::Arc;

use proto_core::backend::Backend;
use proto_core::driver::{Action, CommWork, Connection, Place};
use shell_common::direct::{self, SEND_PIECE};
use shell_common::shell::ConnectionError;
use shell_common::{CommLinks, ConnectionConfig, Direct, SendQueue};

use crate::ring::{recv_now, send_now};

/// Most bytes one [`Core::direct`] sends (several pieces): the ring makes one call per
/// connection per pass, and a pass costs a ring submission.
const SEND_BURST: u64 = 4 << 20;

/// Where driving stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Socket work: the outbox to send, or input to receive.
    Idle,
    /// A reply's data goes straight from backend memory ([`Core::direct`]).
    SendInPlace,
    /// The driver's heavy work (an event, the next piece of a large reply): for a blocking
    /// thread ([`Core::run`]), after the outbox was sent.
    Heavy,
    /// Comm link work (may wait for the peer up to the comm timeout): likewise.
    Comm(CommWork),
    /// The connection must close.
    Failed(proto_core::Error),
}

/// The protocol state of one connection. Dropping it frees every buffer the client held.
pub(crate) struct Core {
    pub conn: Connection,
    links: CommLinks,
    /// Bytes to write, in order.
    pub outbox: SendQueue,
}

impl Core {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        config: &ConnectionConfig,
    ) -> proto_core::Result<Core> {
        Ok(Core {
            conn: config.connect(backend, true)?,
            links: config.comm_links(),
            outbox: SendQueue::new(),
        })
    }

    /// Polls the driver until the ring must act. On the ring thread (`blocking == false`) it
    /// stops at heavy work; on a blocking thread it runs everything, comm work included once
    /// the responses before it are out.
    pub(crate) fn drive(&mut self, blocking: bool) -> Stop {
        let place = if blocking {
            Place::Blocking
        } else {
            Place::EventLoop
        };
        let mut action = self.conn.poll(place);
        loop {
            while let Some(bytes) = self.conn.poll_transmit() {
                self.outbox.push(bytes);
            }
            match action {
                Err(error) => return Stop::Failed(error),
                Ok(Action::Transmit | Action::Receive(_)) => return Stop::Idle,
                Ok(Action::SendInPlace) => return Stop::SendInPlace,
                Ok(Action::Offload) => return Stop::Heavy,
                // Responses first: the client may be waiting for them.
                Ok(Action::Comm(work)) if blocking && self.outbox.is_empty() => {
                    if let Err(error) = self.links.run(work, &mut self.conn) {
                        return Stop::Failed(error);
                    }
                    action = self.conn.poll(place);
                }
                Ok(Action::Comm(work)) => return Stop::Comm(work),
                // The io_uring shell stays on TCP (it does not ask for `negotiate_transport`).
                Ok(Action::Upgrade(_)) => {
                    if let Err(error) = self.conn.answer_hello([0; 24]) {
                        return Stop::Failed(error);
                    }
                    action = self.conn.poll(place);
                }
            }
        }
    }

    /// Runs the heavy work [`drive`](Self::drive) stopped at (on a blocking thread), then
    /// drives on.
    pub(crate) fn run(&mut self, work: Stop) -> Stop {
        if let Stop::Comm(work) = work {
            if let Err(error) = self.links.run(work, &mut self.conn) {
                return Stop::Failed(error);
            }
        }
        self.drive(true)
    }

    /// One step of a direct transfer between `stream` and backend memory: with `writable` the
    /// reply in progress (its head already written), in pieces of [`SEND_PIECE`] up to
    /// [`SEND_BURST`] while the socket takes whole pieces; otherwise one `recv` of the streamed
    /// write. `Ok(None)`: the socket had nothing to give (take); wait until it is ready.
    pub(crate) fn direct(
        &mut self,
        stream: &TcpStream,
        writable: bool,
    ) -> Result<Option<Direct>, ConnectionError> {
        if !writable {
            return direct::receive_once(&mut self.conn, |dst| recv_now(stream, dst));
        }
        let start = self.conn.reply_remaining();
        loop {
            let before = self.conn.reply_remaining();
            let step = direct::send_once(&mut self.conn, |src| send_now(stream, src));
            let sent = start - self.conn.reply_remaining();
            match step {
                Ok(Some(Direct::Moved))
                    if before - self.conn.reply_remaining() == SEND_PIECE as u64
                        && sent < SEND_BURST => {}
                // What moved before the socket filled up counts; the next call sees it full.
                Ok(None) if sent > 0 => return Ok(Some(Direct::Moved)),
                step => return step,
            }
        }
    }
}
