//! Vectored writes without a runtime: which bytes of a queue of [`Bytes`] one `writev` offers,
//! and what is left once the socket took some.
//!
//! A shell (or the client) keeps a [`SendQueue`], offers the socket
//! [`SendQueue::io_slices`] in a write call of its runtime, and hands the byte count it got back
//! to [`SendQueue::advance`], until the queue [`is_empty`](SendQueue::is_empty):
//!
//! ```
//! # use std::io::Write;
//! use bytes::Bytes;
//! use shell_common::vectored::{SendQueue, MAX_IO_SLICES};
//!
//! let mut queue = SendQueue::from(vec![Bytes::from_static(b"head"), Bytes::from_static(b"data")]);
//! let mut socket = Vec::new();
//! while !queue.is_empty() {
//!     let written = socket.write_vectored(&queue.io_slices(MAX_IO_SLICES))?;
//!     queue.written(written)?;
//! }
//! assert_eq!(socket, b"headdata");
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Every call offers at most [`SEND_PIECE`] bytes: a 256 MiB SET_TENSOR from the client went
//! 35 % faster in such pieces than in writes of all the socket would take (see [`SEND_PIECE`]
//! why). The buffers are never copied; the slices point into them.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes};

use crate::direct::SEND_PIECE;

/// Most slices a shell offers in one vectored write (well below every platform's `IOV_MAX`).
pub const MAX_IO_SLICES: usize = 64;

/// Buffers waiting to be written, in order; empty buffers are dropped as they come in.
///
/// A queue drained by writes keeps its allocation: a shell that keeps one per connection and
/// [`extend`](Extend::extend)s it with each batch of transmits allocates nothing per response.
#[derive(Debug, Clone, Default)]
pub struct SendQueue {
    buffers: VecDeque<Bytes>,
    /// The bytes still to write (the sum of `buffers`' lengths).
    len: usize,
}

impl SendQueue {
    /// An empty queue.
    pub fn new() -> SendQueue {
        SendQueue::default()
    }

    /// Queues `bytes` after everything queued so far (nothing, when it is empty).
    pub fn push(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.len += bytes.len();
            self.buffers.push_back(bytes);
        }
    }

    /// Whether every byte was written.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    /// The buffers still to write (the front one advanced past what was written), in order:
    /// for a write that sets its own limits, such as an io_uring `SENDMSG` with `MSG_WAITALL`.
    pub fn buffers(&self) -> impl ExactSizeIterator<Item = &Bytes> {
        self.buffers.iter()
    }

    /// The bytes still to write.
    pub fn remaining(&self) -> usize {
        self.len
    }

    /// What the next write call offers: the queue's front, in order, in at most `max_slices`
    /// slices and at most [`SEND_PIECE`] bytes (the last slice may end inside a buffer).
    /// Empty only when the queue is, or when `max_slices` is 0. ([`Buf::chunks_vectored`]
    /// fills a caller's array with the same slices.)
    pub fn io_slices(&self, max_slices: usize) -> Vec<IoSlice<'_>> {
        let mut slices = vec![IoSlice::new(&[]); max_slices.min(self.buffers.len())];
        let count = self.chunks_vectored(&mut slices);
        slices.truncate(count);
        slices
    }

    /// Drops the first `written` bytes, which the socket took (at most [`remaining`]; more
    /// is a bug of the caller, and empties the queue).
    ///
    /// [`remaining`]: SendQueue::remaining
    pub fn advance(&mut self, mut written: usize) {
        while written > 0 {
            let Some(front) = self.buffers.front_mut() else {
                debug_assert!(false, "advanced {written} bytes past the queue's end");
                return;
            };
            if written < front.len() {
                front.advance(written);
                self.len -= written;
                return;
            }
            written -= front.len();
            self.len -= front.len();
            self.buffers.pop_front();
        }
    }
}

impl SendQueue {
    /// [`advance`](SendQueue::advance) by what one write call returned; a write that took nothing
    /// of a non-empty queue is the error `WriteZero` (the peer is gone).
    pub fn written(&mut self, written: usize) -> std::io::Result<()> {
        if written == 0 && !self.is_empty() {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        self.advance(written);
        Ok(())
    }
}

/// A `Buf` for runtimes that write one (tokio's `write_all_buf`): each chunk and each set of
/// vectored chunks is what one write call of [`SendQueue::io_slices`] offers.
impl Buf for SendQueue {
    fn remaining(&self) -> usize {
        SendQueue::remaining(self)
    }

    fn chunk(&self) -> &[u8] {
        self.buffers
            .front()
            .and_then(|front| front.get(..front.len().min(SEND_PIECE)))
            .unwrap_or_default()
    }

    fn advance(&mut self, written: usize) {
        SendQueue::advance(self, written)
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut budget = SEND_PIECE;
        let mut count = 0;
        for (slot, buffer) in dst.iter_mut().zip(&self.buffers) {
            if budget == 0 {
                break;
            }
            let take = buffer.len().min(budget);
            *slot = IoSlice::new(buffer.get(..take).unwrap_or_default());
            budget -= take;
            count += 1;
        }
        count
    }
}

impl From<Vec<Bytes>> for SendQueue {
    fn from(buffers: Vec<Bytes>) -> SendQueue {
        buffers.into_iter().collect()
    }
}

impl FromIterator<Bytes> for SendQueue {
    fn from_iter<I: IntoIterator<Item = Bytes>>(iter: I) -> SendQueue {
        let mut queue = SendQueue::new();
        queue.extend(iter);
        queue
    }
}

impl Extend<Bytes> for SendQueue {
    fn extend<I: IntoIterator<Item = Bytes>>(&mut self, iter: I) {
        for bytes in iter {
            self.push(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic, non-repeating-per-piece pattern of `len` bytes starting at `seed`.
    fn pattern(seed: usize, len: usize) -> Bytes {
        (0..len).map(|i| ((seed + i) % 251) as u8).collect()
    }

    /// Writes `queue` out to a socket that takes at most `accept` bytes per call; returns the
    /// bytes it received and the bytes offered by each call.
    fn drain(mut queue: SendQueue, max_slices: usize, accept: usize) -> (Vec<u8>, Vec<usize>) {
        let mut received = Vec::new();
        let mut offered = Vec::new();
        while !queue.is_empty() {
            let before = queue.remaining();
            let slices = queue.io_slices(max_slices);
            assert!(!slices.is_empty() && slices.len() <= max_slices);
            let len: usize = slices.iter().map(|s| s.len()).sum();
            offered.push(len);
            let mut taken = 0;
            for slice in &slices {
                let n = slice.len().min(accept - taken);
                received.extend_from_slice(&slice[..n]);
                taken += n;
            }
            drop(slices);
            queue.advance(taken);
            assert_eq!(queue.remaining(), before - taken);
        }
        (received, offered)
    }

    fn concat(buffers: &[Bytes]) -> Vec<u8> {
        buffers.iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn order_is_kept_and_no_call_offers_more_than_one_piece() {
        let buffers = vec![
            Bytes::from_static(b"head"),
            Bytes::new(),
            pattern(1, SEND_PIECE * 2 + 100),
            Bytes::from_static(b"tail"),
        ];
        let (received, offered) =
            drain(SendQueue::from(buffers.clone()), MAX_IO_SLICES, usize::MAX);
        assert!(received == concat(&buffers));
        assert!(offered.iter().all(|&n| n > 0 && n <= SEND_PIECE));
        // head + the first piece's rest, then a whole piece, then the end with the tail.
        assert_eq!(offered, [SEND_PIECE, SEND_PIECE, 4 + 100 + 4]);
    }

    #[test]
    fn partial_writes_resume_where_the_socket_stopped() {
        let buffers: Vec<Bytes> = (0..10).map(|i| pattern(i, 1000 + 37 * i)).collect();
        for accept in [1, 7, 999, 1000, 1001, 4096] {
            let (received, offered) =
                drain(SendQueue::from(buffers.clone()), MAX_IO_SLICES, accept);
            assert!(received == concat(&buffers), "accept {accept}");
            assert!(offered.iter().all(|&n| n <= SEND_PIECE));
        }
        // A large buffer taken a little at a time: every call still offers one piece at most.
        let large = vec![pattern(3, SEND_PIECE + 5000)];
        let (received, offered) = drain(SendQueue::from(large.clone()), MAX_IO_SLICES, 3000);
        assert!(received == concat(&large));
        assert!(offered.iter().all(|&n| n > 0 && n <= SEND_PIECE));
    }

    #[test]
    fn at_most_max_slices_per_call() {
        let buffers: Vec<Bytes> = (0..200).map(|i| pattern(i, 10)).collect();
        let queue = SendQueue::from(buffers.clone());
        assert_eq!(queue.io_slices(MAX_IO_SLICES).len(), MAX_IO_SLICES);
        assert_eq!(queue.io_slices(1).len(), 1);
        assert!(queue.io_slices(0).is_empty());
        for max_slices in [1, 3, MAX_IO_SLICES] {
            let (received, offered) =
                drain(SendQueue::from(buffers.clone()), max_slices, usize::MAX);
            assert!(received == concat(&buffers));
            assert_eq!(offered.len(), 200usize.div_ceil(max_slices));
        }
    }

    #[test]
    fn empty_buffers_are_skipped_and_an_empty_queue_offers_nothing() {
        let mut queue = SendQueue::new();
        queue.push(Bytes::new());
        assert!(queue.is_empty());
        assert!(queue.io_slices(MAX_IO_SLICES).is_empty());
        queue.advance(0);
        queue.push(Bytes::from_static(b"ab"));
        queue.push(Bytes::new());
        queue.push(Bytes::from_static(b"c"));
        assert_eq!(queue.remaining(), 3);
        queue.advance(2);
        let slices = queue.io_slices(MAX_IO_SLICES);
        assert_eq!(slices.len(), 1);
        assert_eq!(&*slices[0], b"c");
    }

    #[test]
    fn a_drained_queue_takes_more_and_counts_what_is_left() {
        let mut queue = SendQueue::new();
        for round in 0..3 {
            queue.extend([pattern(round, 5), Bytes::new(), pattern(round + 1, 7)]);
            assert_eq!(queue.remaining(), 12);
            let (received, _) = drain(queue.clone(), MAX_IO_SLICES, 4);
            assert!(received == concat(&[pattern(round, 5), pattern(round + 1, 7)]));
            queue.advance(6);
            assert_eq!(queue.remaining(), 6);
            queue.written(6).unwrap();
            assert!(queue.is_empty() && queue.remaining() == 0);
        }
    }

    #[test]
    fn a_write_that_takes_nothing_is_an_error_only_while_bytes_wait() {
        let mut queue = SendQueue::from(vec![Bytes::from_static(b"abc")]);
        let error = queue.written(0).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::WriteZero);
        queue.written(2).unwrap();
        assert_eq!(queue.remaining(), 1);
        queue.written(1).unwrap();
        assert!(queue.is_empty());
        queue.written(0).unwrap();
    }

    #[test]
    fn as_a_buf_it_offers_one_piece_per_call() {
        let queue = SendQueue::from(vec![
            Bytes::from(vec![1u8; SEND_PIECE + 7]),
            Bytes::from_static(b"tail"),
        ]);
        assert_eq!(Buf::remaining(&queue), SEND_PIECE + 11);
        assert_eq!(queue.chunk().len(), SEND_PIECE);
        {
            let mut dst = [IoSlice::new(&[]); 4];
            assert_eq!(queue.chunks_vectored(&mut dst), 1);
            assert_eq!(dst[0].len(), SEND_PIECE);
        }
        let mut queue = queue;
        Buf::advance(&mut queue, SEND_PIECE + 3);
        {
            let mut dst = [IoSlice::new(&[]); 4];
            assert_eq!(queue.chunks_vectored(&mut dst), 2);
            assert_eq!((dst[0].len(), &dst[1][..]), (4, &b"tail"[..]));
        }
        let mut out = Vec::new();
        while queue.has_remaining() {
            out.extend_from_slice(queue.chunk());
            let n = queue.chunk().len();
            Buf::advance(&mut queue, n);
        }
        assert_eq!(out, [1, 1, 1, 1, b't', b'a', b'i', b'l']);
    }
}
