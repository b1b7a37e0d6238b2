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

/// A destination region as the source server will write it: `n_copies` rows of `size` bytes,
/// `stride` apart, from synthetic address `start` of the buffer `handle` (the stride is 0 for
/// one row, whatever was sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyShape {
    /// The wire handle of the buffer on the issuing connection.
    pub handle: u64,
    /// First address of the region (the issuing connection's address space).
    pub start: u64,
    /// Bytes per row.
    pub size: u64,
    /// Rows.
    pub n_copies: u64,
    /// Distance between rows (0 for one row).
    pub stride: u64,
}

impl CopyShape {
    /// A shape, the stride dropped for one row.
    pub fn new(handle: u64, start: u64, size: u64, n_copies: u64, stride: u64) -> CopyShape {
        CopyShape {
            handle,
            start,
            size,
            n_copies,
            stride: if n_copies == 1 { 0 } else { stride },
        }
    }
}

/// What a ticket allows: writing one region of a buffer, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The buffer.
    pub entry: BufferEntry,
    /// The region.
    pub shape: CopyShape,
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
            entry: BufferEntry {
                id: BufferId(1),
                device: 0,
                base: 0x1000,
                size: 64,
            },
            shape: CopyShape::new(1, 0x1000, 64, 1, 0),
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

#[cfg(test)]
mod dispatcher_tests {
    use std::sync::Arc;

    use super::TicketBoard;
    use crate::backend::MemoryBackend;
    use crate::dispatch::{Dispatcher, DispatcherConfig, Outcome};
    use crate::session::{ServerEvent, TensorWrite};
    use crate::wire::{
        ProtocolVersion, RemoteCopyStatus, Request, Response, RpcTensor, SetTensorHeader,
        Tensor2dHeader,
    };

    type D = Dispatcher<MemoryBackend>;

    fn request(d: &mut D, request: Request) -> Response {
        match d.handle(ServerEvent::Request(request)).unwrap() {
            Outcome::Respond(response) => response,
            other => panic!("{other:?}"),
        }
    }

    /// A dispatcher on `backend` sharing `board`, with one 4096-byte buffer and a tensor of
    /// it when `with_buffer`.
    fn connection(
        backend: &Arc<MemoryBackend>,
        board: &Arc<TicketBoard>,
        with_buffer: bool,
    ) -> (D, RpcTensor) {
        let mut config = DispatcherConfig::new(ProtocolVersion::V8_0_0);
        config.remote_copy = Some(board.clone());
        let mut d = Dispatcher::new(backend.clone(), config).unwrap();
        let mut tensor = RpcTensor::contiguous(1, 24, [4096, 1, 1, 1]).unwrap();
        if with_buffer {
            let Response::AllocBuffer { remote_ptr, .. } = request(
                &mut d,
                Request::AllocBuffer {
                    device: 0,
                    size: 4096,
                },
            ) else {
                panic!()
            };
            let Response::BufferBase(base) =
                request(&mut d, Request::BufferGetBase { buffer: remote_ptr })
            else {
                panic!()
            };
            tensor.buffer = remote_ptr;
            tensor.data = base;
        }
        (d, tensor)
    }

    fn expect(d: &mut D, tensor: &RpcTensor, offset: u64, size: u64) -> (u8, u64) {
        match request(
            d,
            Request::RemoteCopyExpect(Box::new(Tensor2dHeader {
                tensor: tensor.clone(),
                offset,
                size,
                n_copies: 1,
                stride: 0,
            })),
        ) {
            Response::RemoteCopyExpect { status, ticket } => (status, ticket),
            other => panic!("{other:?}"),
        }
    }

    fn attach(d: &mut D, ticket: u64, tensor: &RpcTensor, offset: u64, len: u64) -> u8 {
        match request(
            d,
            Request::RemoteCopyAttach {
                ticket,
                buffer: tensor.buffer,
                start: tensor.data + offset,
                size: len,
                n_copies: 1,
                stride: 99,
            },
        ) {
            Response::RemoteCopyAttach(status) => status,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tickets_are_revoked_and_lent_buffers_never_freed() {
        let backend = Arc::new(MemoryBackend::new(1, 1 << 20));
        let board = Arc::new(TicketBoard::new());
        let (mut owner, tensor) = connection(&backend, &board, true);

        // One ticket per connection; a bad region gets none.
        let (ok, first) = expect(&mut owner, &tensor, 0, 16);
        assert_eq!(ok, 0);
        assert_eq!(
            expect(&mut owner, &tensor, 4090, 16),
            (RemoteCopyStatus::BadDestination.byte(), 0)
        );
        assert!(
            board.is_empty(),
            "the next EXPECT revokes the previous ticket"
        );
        let (_, ticket) = expect(&mut owner, &tensor, 0, 16);
        assert_ne!(ticket, first);
        assert_eq!(board.len(), 1);
        // Freeing the buffer revokes it; so does the connection's end.
        let (mut spare, spare_tensor) = connection(&backend, &board, true);
        expect(&mut spare, &spare_tensor, 0, 8);
        assert_eq!(board.len(), 2);
        spare
            .handle(ServerEvent::Request(Request::FreeBuffer {
                buffer: spare_tensor.buffer,
            }))
            .unwrap();
        assert_eq!(board.len(), 1);
        let (mut spare, spare_tensor) = connection(&backend, &board, true);
        expect(&mut spare, &spare_tensor, 0, 8);
        assert_eq!(board.len(), 2);
        drop(spare);
        assert_eq!(board.len(), 1);
        assert_eq!(backend.live_buffers(), 1);

        // A connection holding buffers cannot attach; a wrong region consumes the ticket.
        let (mut holder, _) = connection(&backend, &board, true);
        assert_eq!(
            attach(&mut holder, ticket, &tensor, 0, 16),
            RemoteCopyStatus::TicketRefused.byte()
        );
        drop(holder);
        let (mut pusher, _) = connection(&backend, &board, false);
        assert_eq!(
            attach(&mut pusher, ticket, &tensor, 8, 16),
            RemoteCopyStatus::BadDestination.byte()
        );
        assert!(board.is_empty());
        assert_eq!(
            attach(&mut pusher, ticket, &tensor, 0, 16),
            RemoteCopyStatus::TicketRefused.byte()
        );

        // Attached: exactly the granted write, then DEVICE_COUNT only; the buffer stays.
        let (_, ticket) = expect(&mut owner, &tensor, 0, 16);
        let (mut pusher, _) = connection(&backend, &board, false);
        assert_eq!(attach(&mut pusher, ticket, &tensor, 0, 16), 0);
        let write = |offset| ServerEvent::TensorWriteBegin {
            write: TensorWrite::Set(Box::new(SetTensorHeader {
                tensor: tensor.clone(),
                cache_flag: 0,
                offset,
            })),
            data_len: 16,
        };
        pusher.handle(write(0)).unwrap();
        pusher
            .handle(ServerEvent::TensorData(vec![7u8; 16].into()))
            .unwrap();
        pusher.handle(ServerEvent::TensorWriteEnd).unwrap();
        assert!(pusher.handle(write(0)).is_err(), "one write only");
        let (mut pusher, _) = connection(&backend, &board, false);
        let (_, ticket) = expect(&mut owner, &tensor, 0, 16);
        assert_eq!(attach(&mut pusher, ticket, &tensor, 0, 16), 0);
        assert!(pusher
            .handle(ServerEvent::Request(Request::FreeBuffer {
                buffer: tensor.buffer
            }))
            .is_err());
        drop(pusher);
        assert_eq!(backend.live_buffers(), 1, "the lent buffer is not freed");
        let Response::TensorData(data) = request(
            &mut owner,
            Request::GetTensor {
                tensor: Box::new(tensor.clone()),
                offset: 0,
                size: 16,
            },
        ) else {
            panic!()
        };
        assert_eq!(&data[..], &[7u8; 16]);
        drop(owner);
        assert_eq!(backend.live_buffers(), 0);
        assert!(board.is_empty());
    }
}
