//! What a connection is doing, as a server's admission control sees it: whether it may be
//! asked to give way to a new client, and whether its bytes must keep moving.
//!
//! The core has no clock: it only reports. A shell's [`Monitor`] notes the time of each
//! change and judges deadlines and progress (`shell_common::admission`).

/// What a connection is doing, as of its last [`poll`](super::Connection::poll).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// HELLO has not arrived (complete) yet.
    AwaitingHello,
    /// An established session between commands, with no part of a message received.
    Idle,
    /// A message has begun arriving (a partial frame, or SET_TENSOR data still owed).
    Receiving,
    /// Bytes are owed to the client (responses, a reply streaming out).
    Sending,
    /// A command runs (off the event loop: a graph, comm work, a large write).
    Working,
}

impl Activity {
    /// A stable number for an atomic cell ([`from_u8`](Self::from_u8) inverts it).
    pub fn as_u8(self) -> u8 {
        match self {
            Activity::AwaitingHello => 0,
            Activity::Idle => 1,
            Activity::Receiving => 2,
            Activity::Sending => 3,
            Activity::Working => 4,
        }
    }

    /// The activity of [`as_u8`](Self::as_u8); an unknown number reads as `Working` (the one
    /// that is never interrupted).
    pub fn from_u8(value: u8) -> Activity {
        match value {
            0 => Activity::AwaitingHello,
            1 => Activity::Idle,
            2 => Activity::Receiving,
            3 => Activity::Sending,
            _ => Activity::Working,
        }
    }
}

/// Told what a connection does and how many bytes it moved (see
/// [`Connection::set_monitor`](super::Connection::set_monitor)). Called around every command
/// by whichever thread holds the connection (one at a time, handed over with the connection),
/// so an implementation may treat its cells as written by one thread; must be cheap (a load, a
/// store).
pub trait Monitor: Send + Sync {
    /// The connection's activity after a poll, and whether the client holds buffers.
    fn activity(&self, activity: Activity, holds_buffers: bool);
    /// Bytes moved between the client and the connection (received, or handed out to send).
    fn moved(&self, bytes: u64);
}
