//! A backend's own multi-process communicator (PROTOCOL.md §6.3 "backend communicator", §6.5).
//!
//! With the newest link every rank votes whether its backend offers a communicator; when all do,
//! each backend builds one through further bootstrap exchanges over the comm sockets (upstream:
//! NCCL's unique id), the sockets close, and COMM_ALLREDUCE is handed to the communicator. The
//! shell owns the sockets and lends them as a [`Bootstrap`]; the backend owns the
//! [`Communicator`] it builds (one per client connection and device, dropped with them).
//! Addresses and durations here are `core` value types: the core opens no socket and reads no
//! clock. A communicator opens its own connections; the shell secures each one
//! ([`Bootstrap::secure`]: TLS when the server runs with it), so a backend needs no TLS of its
//! own.

use core::net::{IpAddr, Ipv4Addr};
use core::time::Duration;

use super::{Backend, TensorLocation};
use crate::comm::CommError;
use crate::error::Result;

/// Which end of a communicator's connection this server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// It connected to the peer (with TLS: the client, presenting the server's certificate).
    Connected,
    /// It accepted the peer's connection (with TLS: the server, requiring the peer's).
    Accepted,
}

/// A byte stream both ways (a socket, or TLS over one).
pub trait Duplex: std::io::Read + std::io::Write + Send {}

impl<T: std::io::Read + std::io::Write + Send> Duplex for T {}

/// A communicator's connection once the shell secured it: the socket itself, or TLS over it.
/// Keep a clone of the socket (`try_clone`) to set its timeouts and to shut it down.
pub type SecuredStream = Box<dyn Duplex>;

/// The comm sockets of a group being set up, lent to [`Backend::communicator_init`].
pub trait Bootstrap {
    /// This server's rank.
    fn rank(&self) -> u32;
    /// The number of ranks.
    fn world(&self) -> u32;
    /// One rank-ordered all-gather: every rank passes a block of the same size and gets the
    /// `world` blocks in rank order back (PROTOCOL.md §6.3, "bootstrap exchange").
    fn exchange(&mut self, block: &[u8]) -> std::result::Result<Vec<u8>, CommError>;
    /// The address this server's peers reach it at (the local address of its comm sockets).
    fn local_ip(&self) -> Ipv4Addr;
    /// The bound on every wait for a peer, set by the deployer (the reference has none).
    fn timeout(&self) -> Duration;
    /// Whether the deployer lets this server's comm connections reach `ip` (`--comm-peers`):
    /// a communicator checks every address it connects to or accepts from.
    fn peer_allowed(&self, ip: IpAddr) -> bool;
    /// Secures a connection the communicator opened to `peer` ([`Side::Connected`]) or accepted
    /// from it, before any byte of its own went over it: with TLS when the server runs with it
    /// (the peer's certificate verified, and on a connected socket its name checked against
    /// `peer`), else the socket unchanged, so the wire bytes are the plain link's. `socket` is
    /// the connection as the communicator opened it, its read and write timeouts already set
    /// to what the handshake may take; the handshake also ends by [`Bootstrap::timeout`]. An
    /// error: the peer is not to be trusted (or the handshake timed out); close the socket.
    fn secure(
        &self,
        socket: Box<dyn Duplex>,
        side: Side,
        peer: IpAddr,
    ) -> std::result::Result<SecuredStream, CommError>;
}

/// A built communicator: sums F32 tensors in place across its ranks.
pub trait Communicator: Send + std::fmt::Debug {
    /// Sums the `elements` f32 at `at` (in `backend`'s memory) across every rank; every rank
    /// ends with the same values. An error leaves the communicator unusable.
    fn allreduce(&mut self, backend: &dyn Backend, at: TensorLocation, elements: u64)
        -> Result<()>;
}
