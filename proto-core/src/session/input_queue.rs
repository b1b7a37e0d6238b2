//! A queue of received byte chunks that hands out frames without copying when it can.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

/// Received bytes, kept as the chunks the shell handed in.
///
/// Bulk data is sliced out of those chunks (zero copy); only a frame that straddles two
/// chunks is copied, and frames other than bulk data are bounded by the session's limits.
#[derive(Debug, Default)]
pub(crate) struct InputQueue {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl InputQueue {
    pub(crate) fn push(&mut self, data: Bytes) {
        if !data.is_empty() {
            self.len += data.len();
            self.chunks.push_back(data);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the first `N` bytes without consuming them; `None` if fewer are buffered.
    pub(crate) fn peek_array<const N: usize>(&self) -> Option<[u8; N]> {
        if self.len < N {
            return None;
        }
        let mut out = [0u8; N];
        let mut unfilled: &mut [u8] = &mut out;
        for chunk in &self.chunks {
            let take = unfilled.len().min(chunk.len());
            let (Some((into, rest)), Some(from)) = (
                std::mem::take(&mut unfilled).split_at_mut_checked(take),
                chunk.get(..take),
            ) else {
                break;
            };
            into.copy_from_slice(from);
            unfilled = rest;
            if unfilled.is_empty() {
                break;
            }
        }
        Some(out)
    }

    /// Removes and returns exactly `n` bytes (caller checked `len() >= n`); zero copy when
    /// they lie in one chunk.
    pub(crate) fn take(&mut self, n: usize) -> Bytes {
        debug_assert!(n <= self.len);
        let front_len = self.chunks.front().map_or(0, Bytes::len);
        if n <= front_len {
            return self.take_front(n);
        }
        let mut out = BytesMut::with_capacity(n);
        while out.len() < n {
            let want = n - out.len();
            let piece = self.take_front(want);
            if piece.is_empty() {
                break;
            }
            out.extend_from_slice(&piece);
        }
        out.freeze()
    }

    /// Removes up to `max` bytes from the front chunk only (never copies).
    pub(crate) fn take_front(&mut self, max: usize) -> Bytes {
        let Some(front) = self.chunks.front_mut() else {
            return Bytes::new();
        };
        let piece = if max >= front.len() {
            let whole = std::mem::take(front);
            self.chunks.pop_front();
            whole
        } else {
            front.split_to(max)
        };
        self.len -= piece.len();
        piece
    }

    /// Drops `n` bytes from the front.
    pub(crate) fn skip(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            let step = n.min(front.len());
            front.advance(step);
            self.len -= step;
            n -= step;
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_across_chunks() {
        let mut queue = InputQueue::default();
        queue.push(Bytes::from_static(b"ab"));
        queue.push(Bytes::from_static(b""));
        queue.push(Bytes::from_static(b"cdef"));
        assert_eq!(queue.len(), 6);
        assert_eq!(queue.peek_array::<3>(), Some(*b"abc"));
        assert_eq!(queue.peek_array::<7>(), None);
        queue.skip(1);
        assert_eq!(&queue.take(3)[..], b"bcd");
        assert_eq!(&queue.take_front(10)[..], b"ef");
        assert!(queue.is_empty());
        assert!(queue.take_front(1).is_empty());
    }
}
