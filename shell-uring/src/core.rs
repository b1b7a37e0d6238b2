//! One connection's protocol state on the ring: the driver, its comm links, the bytes it
//! queued for the ring to send and its transport negotiation. The ring thread polls it inline
//! and hands it to a blocking thread for heavy work, and for good once the connection moves
//! to RDMA ([`Core::switch`]: `shell_rdma::serve` runs it to its end).

use std::net::{IpAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;

use proto_core::backend::Backend;
use proto_core::driver::{Action, CommWork, Connection, Place};
use shell_common::direct::{self, SEND_PIECE};
use shell_common::shell::{Closed, ConnectionError};
use shell_common::{CommLinks, ConnectionConfig, Direct, SendQueue};
use shell_rdma::serve::{Served, Upgrader};

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
    /// HELLO's answer is written and the connection moves to RDMA: for a blocking thread
    /// ([`Core::switch`]), where it stays until it ends.
    Switch,
    /// The connection ended (over RDMA, or refused by `--transport rdma`): close it at once.
    Ended(Result<Closed, ConnectionError>),
}

/// The protocol state of one connection. Dropping it frees every buffer the client held.
pub(crate) struct Core {
    pub conn: Connection,
    links: CommLinks,
    /// Bytes to write, in order.
    pub outbox: SendQueue,
    /// HELLO's transport caps and the switch they lead to.
    upgrader: Upgrader,
    /// The connection's local address (chooses the RDMA device).
    local: Option<IpAddr>,
}

impl Core {
    /// The state of a connection whose socket's local address is `local`.
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        config: &ConnectionConfig,
        local: Option<IpAddr>,
    ) -> proto_core::Result<Core> {
        Ok(Core {
            conn: config.connect(backend, true)?,
            links: config.comm_links(),
            outbox: SendQueue::new(),
            upgrader: Upgrader::new(config.transport),
            local,
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
                // Everything before is written (HELLO's answer included): switch.
                Ok(Action::Receive(_))
                    if self.outbox.is_empty() && self.upgrader.switch_pending() =>
                {
                    return Stop::Switch
                }
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
                // HELLO's transport caps (with `--transport tcp` the driver never asks).
                Ok(Action::Upgrade(peer)) => {
                    let caps = match self.local {
                        Some(local) => match self.upgrader.answer(local, &peer) {
                            Ok(caps) => caps,
                            Err(refused) => return Stop::Ended(Err(refused.into())),
                        },
                        None => [0; 24],
                    };
                    if let Err(error) = self.conn.answer_hello(caps) {
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

    /// Moves the connection to RDMA once HELLO's answer is written (on a blocking thread, after
    /// [`Stop::Switch`]) and serves it there to its end: [`Stop::Ended`]; or [`Stop::Idle`]
    /// when activation failed with `--transport auto` and it stays on TCP. `stream` is the
    /// connection's socket (watched for the client's hang-up), `stop` says the server shuts
    /// down.
    pub(crate) fn switch(&mut self, stream: &TcpStream, stop: &dyn Fn() -> bool) -> Stop {
        let Some(switch) = self.upgrader.take() else {
            return Stop::Idle;
        };
        let mode = self.upgrader.mode();
        match switch.serve(stream.as_fd(), mode, &mut self.conn, &mut self.links, stop) {
            Served::Ended(ending) => Stop::Ended(ending),
            Served::StayOnTcp => Stop::Idle,
        }
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
