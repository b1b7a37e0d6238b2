//! The destination side of the remote-copy extension: one-shot tickets shared by every
//! connection of a server (see [`crate::wire::extension`]).
//!
//! REMOTE_COPY_EXPECT on the client's connection issues a ticket for one region of one of its
//! buffers; REMOTE_COPY_ATTACH on the source server's connection takes it, and that connection
//! may then write exactly that region once (one SET_TENSOR). A connection holds at most one
//! ticket; it is revoked by its next EXPECT, by freeing its buffer and by the connection's end.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::buffers::BufferEntry;

/// Most tickets outstanding on one server (one per connection at most, so this bounds only
/// a server with this many clients each holding one).
pub const MAX_TICKETS: usize = 4096;

/// What a ticket allows: writing `len` bytes at synthetic address `start` of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The wire handle of the buffer on the issuing connection.
    pub handle: u64,
    /// The buffer.
    pub entry: BufferEntry,
    /// First address of the region (the issuing connection's address space).
    pub start: u64,
    /// Bytes of the region.
    pub len: u64,
}

/// The server-wide ticket board.
#[derive(Debug, Default)]
pub struct TicketBoard {
    tickets: Mutex<HashMap<u64, Grant>>,
    /// Random SipHash keys (std seeds them from the OS): tickets cannot be guessed from
    /// earlier ones.
    keys: RandomState,
    counter: AtomicU64,
}

impl TicketBoard {
    /// An empty board.
    pub fn new() -> TicketBoard {
        TicketBoard::default()
    }

    /// Issues a ticket for `grant`; `None` when [`MAX_TICKETS`] are outstanding.
    pub fn issue(&self, grant: Grant) -> Option<u64> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        if tickets.len() >= MAX_TICKETS {
            return None;
        }
        loop {
            let n = self.counter.fetch_add(1, Ordering::Relaxed);
            let ticket = self.keys.hash_one(n);
            if ticket != 0 && !tickets.contains_key(&ticket) {
                tickets.insert(ticket, grant);
                return Some(ticket);
            }
        }
    }

    /// Takes a ticket (it can be used once).
    pub fn take(&self, ticket: u64) -> Option<Grant> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        tickets.remove(&ticket)
    }

    /// Drops a ticket, used or not.
    pub fn revoke(&self, ticket: u64) {
        self.take(ticket);
    }

    /// Outstanding tickets (for leak checks).
    pub fn len(&self) -> usize {
        self.tickets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no ticket is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BufferId;

    #[test]
    fn tickets_are_one_shot_and_bounded() {
        let board = TicketBoard::new();
        let grant = Grant {
            handle: 1,
            entry: BufferEntry {
                id: BufferId(1),
                device: 0,
                base: 0x1000,
                size: 64,
            },
            start: 0x1000,
            len: 64,
        };
        let a = board.issue(grant).unwrap();
        let b = board.issue(grant).unwrap();
        assert_ne!(a, b);
        assert_eq!(board.take(a), Some(grant));
        assert_eq!(board.take(a), None);
        board.revoke(b);
        assert!(board.is_empty());
        for _ in 0..MAX_TICKETS {
            board.issue(grant).unwrap();
        }
        assert_eq!(board.issue(grant), None);
    }
}
