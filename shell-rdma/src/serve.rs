//! The server side, written once for every shell: answering HELLO's caps ([`Upgrader`]) and,
//! after the switch, the one blocking per-connection loop over the RDMA stream ([`serve`]).
//!
//! A shell that asks for `negotiate_transport` does, on its event loop:
//!
//! ```text
//! Action::Upgrade(peer) => conn.answer_hello(upgrader.answer(local_ip, &peer)?)?
//! Action::Receive(_) if upgrader.switch_pending() =>   // HELLO's answer is written
//!     off the event loop: upgrader.take().serve(&socket, conn, links, stop)
//! ```
//!
//! and the connection then runs here to its end; the TCP socket only tells that the client
//! went away.

use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use proto_core::driver::{Action, Connection, Place, Receive};
use proto_core::wire::ConnCaps;
use shell_common::shell::{self, Closed, ConnectionError, READ_SIZE};
use shell_common::CommLinks;

use crate::caps::{RdmaCaps, TransportMode, CAPS_LEN};
use crate::framing::{Framer, Framing};
use crate::stream::{RdmaStream, StreamError, Timing};
use crate::verbs::Verbs;

/// How often an idle connection looks at the shutdown flag.
const IDLE_TICK: Duration = Duration::from_millis(200);

/// Why a connection that had to switch to RDMA (`--transport rdma`) was closed instead.
#[derive(Debug, thiserror::Error)]
pub enum RefusedError {
    /// The client offered no caps.
    #[error("--transport rdma: the client did not offer RDMA")]
    PeerWithoutRdma,
    /// No device for this connection.
    #[error("--transport rdma: {0}")]
    NoDevice(String),
    /// Activation failed.
    #[error("--transport rdma: RDMA activate failed: {0}")]
    Activate(String),
}

impl From<RefusedError> for ConnectionError {
    fn from(e: RefusedError) -> ConnectionError {
        ConnectionError::Io(io::Error::other(e))
    }
}

/// One connection's transport negotiation.
#[derive(Debug)]
pub struct Upgrader {
    mode: TransportMode,
    pending: Option<Switch>,
}

impl Upgrader {
    /// For a connection of a server started with `mode`.
    pub fn new(mode: TransportMode) -> Upgrader {
        Upgrader {
            mode,
            pending: None,
        }
    }

    /// This side's caps for the client's `peer` caps (HELLO's answer), the connection's TCP
    /// local address choosing the device. A client without caps gets all-zero caps without a
    /// probe (it ignores them either way); with `--transport rdma` it is refused instead.
    pub fn answer(&mut self, local: IpAddr, peer: &ConnCaps) -> Result<ConnCaps, RefusedError> {
        let Some(peer) = RdmaCaps::decode(peer) else {
            if self.mode == TransportMode::Rdma {
                return Err(RefusedError::PeerWithoutRdma);
            }
            return Ok([0; CAPS_LEN]);
        };
        if !self.mode.probes() {
            return Ok([0; CAPS_LEN]);
        }
        self.probe(local, peer)
    }

    fn probe(&mut self, local: IpAddr, peer: RdmaCaps) -> Result<ConnCaps, RefusedError> {
        match crate::sys::probe(local) {
            Ok(prepared) => {
                let caps = prepared.caps().encode();
                self.pending = Some(Switch { prepared, peer });
                Ok(caps)
            }
            Err(error) if self.mode == TransportMode::Rdma => {
                Err(RefusedError::NoDevice(error.to_string()))
            }
            Err(error) => {
                tracing::debug!("RDMA probe: {error}; continuing with TCP");
                Ok([0; CAPS_LEN])
            }
        }
    }

    /// Whether the connection switches once HELLO's answer is written.
    pub fn switch_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The switch to run after HELLO's answer was written.
    pub fn take(&mut self) -> Option<Switch> {
        self.pending.take()
    }

    /// [`take`](Self::take) once `written` (the shell's next action is a receive, so HELLO's
    /// answer is out); `None` before.
    pub fn take_if(&mut self, written: bool) -> Option<Switch> {
        if written {
            self.pending.take()
        } else {
            None
        }
    }

    /// The mode.
    pub fn mode(&self) -> TransportMode {
        self.mode
    }
}

/// A probed queue pair and the client's caps: activated once HELLO's answer is out.
#[derive(Debug)]
pub struct Switch {
    prepared: crate::sys::Prepared,
    peer: RdmaCaps,
}

/// What came of a switch.
#[derive(Debug)]
pub enum Served {
    /// The connection ran over RDMA to this end.
    Ended(Result<Closed, ConnectionError>),
    /// Activation failed with `--transport auto`: the connection goes on over TCP (as the
    /// reference, "RDMA activate failed, staying on TCP"; the client may then hang, §10.2).
    StayOnTcp,
}

impl Switch {
    /// Activates the queue pair and serves the connection over it to its end (blocking: call
    /// it off the event loop). `tcp` is the connection's socket, watched for hang-ups; `stop`
    /// says the server shuts down.
    pub fn serve(
        self,
        tcp: BorrowedFd<'_>,
        mode: TransportMode,
        conn: &mut Connection,
        links: &mut CommLinks,
        stop: &dyn Fn() -> bool,
    ) -> Served {
        let activated = tcp
            .try_clone_to_owned()
            .map_err(|source| crate::verbs::VerbsError {
                call: "dup",
                source,
            })
            .and_then(|fd| self.prepared.activate(self.peer, fd));
        let verbs = match activated {
            Ok(verbs) => verbs,
            Err(error) if mode == TransportMode::Rdma => {
                return Served::Ended(Err(RefusedError::Activate(error.to_string()).into()))
            }
            Err(error) => {
                tracing::warn!("RDMA activate failed, staying on TCP: {error}");
                return Served::StayOnTcp;
            }
        };
        let mut stream = RdmaStream::new(verbs, Timing::default());
        Served::Ended(serve(conn, links, &mut stream, stop))
    }
}

fn io_error(error: StreamError) -> ConnectionError {
    ConnectionError::Io(io::Error::other(error))
}

/// Serves a connection whose HELLO was answered over an activated RDMA stream, blocking,
/// until the client goes away, the connection fails or `stop` says the server shuts down.
pub fn serve<V: Verbs>(
    conn: &mut Connection,
    links: &mut CommLinks,
    stream: &mut RdmaStream<V>,
    stop: &dyn Fn() -> bool,
) -> Result<Closed, ConnectionError> {
    // The stream copies out of its receive ring anyway; nothing to lend.
    conn.set_direct_io(false);
    let mut framer = Framer::new(Framing::Response);
    let mut scratch = vec![0u8; READ_SIZE];
    let stall = stream.stall();
    loop {
        let action = match conn.poll(Place::Blocking) {
            Ok(action) => action,
            Err(error) => {
                // Responses owed before the error still go out (each SEND bounded).
                let _ = transmit(conn, &mut framer, stream);
                return Err(error.into());
            }
        };
        match action {
            Action::Transmit => transmit(conn, &mut framer, stream)?,
            Action::Comm(work) => links.run(work, conn)?,
            // A second HELLO fails in the session before this; answered for completeness.
            Action::Upgrade(_) => conn.answer_hello([0; CAPS_LEN])?,
            // Not returned on `Place::Blocking` / without direct I/O.
            Action::Offload | Action::SendInPlace => {}
            Action::Receive(Receive::Idle) => {
                if stop() {
                    return Ok(Closed::Shutdown);
                }
                match stream.recv(&mut scratch, IDLE_TICK) {
                    Ok(None) => {}
                    Ok(Some(n)) => conn.handle_input(Bytes::copy_from_slice(&scratch[..n])),
                    Err(StreamError::PeerGone) => return shell::end_of_input(conn),
                    Err(error) => return Err(io_error(error)),
                }
            }
            Action::Receive(Receive::Stream { remaining, .. }) => {
                // Streamed tensor data: the client owes it, so each wait is bounded.
                let mut buf = BytesMut::zeroed(shell::stream_read_size(remaining));
                let mut filled = 0;
                while filled < buf.len() {
                    let within = if filled == 0 { stall } else { Duration::ZERO };
                    match stream.recv(&mut buf[filled..], within) {
                        Ok(Some(n)) => filled += n,
                        Ok(None) if filled > 0 => break,
                        Ok(None) => return Err(io_error(StreamError::Stalled(stall))),
                        Err(StreamError::PeerGone) => return shell::end_of_input(conn),
                        Err(error) => return Err(io_error(error)),
                    }
                }
                buf.truncate(filled);
                conn.handle_input(buf.freeze());
            }
        }
    }
}

/// Writes out every queued transmit, cut as the reference's client reads responses.
fn transmit<V: Verbs>(
    conn: &mut Connection,
    framer: &mut Framer,
    stream: &mut RdmaStream<V>,
) -> Result<(), ConnectionError> {
    while let Some(bytes) = conn.poll_transmit() {
        framer
            .feed(&bytes, &mut |w| stream.send(w))
            .map_err(io_error)?;
    }
    Ok(())
}
