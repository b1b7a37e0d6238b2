//! A receive of a known number of bytes that may arrive in any number of pieces.

/// How much a receive reserves up front. Larger receives grow as bytes actually arrive, so a
/// large expected length alone never makes us allocate.
const PREALLOC_LIMIT: usize = 64 * 1024;

/// Accumulates exactly `want` bytes from arbitrarily split input.
#[derive(Debug, Clone, Default)]
pub(super) struct RecvBuf {
    buf: Vec<u8>,
    want: usize,
}

impl RecvBuf {
    /// A receive of `want` bytes. Callers bound `want` before creating it.
    pub(super) fn new(want: usize) -> Self {
        Self {
            buf: Vec::with_capacity(want.min(PREALLOC_LIMIT)),
            want,
        }
    }

    /// Takes as many bytes from the front of `data` as this receive still lacks; returns how many.
    pub(super) fn fill(&mut self, data: &[u8]) -> usize {
        let n = self.remaining().min(data.len());
        // `n <= data.len()`, so the split cannot fail; `get` keeps that provably panic-free.
        let taken = data.get(..n).unwrap_or_default();
        self.buf.extend_from_slice(taken);
        n
    }

    /// Bytes still missing.
    pub(super) fn remaining(&self) -> usize {
        self.want.saturating_sub(self.buf.len())
    }

    /// Whether all `want` bytes arrived.
    pub(super) fn is_full(&self) -> bool {
        self.remaining() == 0
    }

    /// The bytes received so far.
    pub(super) fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The received bytes, giving up the buffer.
    pub(super) fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::RecvBuf;

    #[test]
    fn fills_across_pieces_and_keeps_surplus() {
        let mut r = RecvBuf::new(5);
        assert_eq!(r.fill(b"ab"), 2);
        assert!(!r.is_full());
        assert_eq!(r.fill(b"cdefg"), 3);
        assert!(r.is_full());
        assert_eq!(r.fill(b"xyz"), 0);
        assert_eq!(r.as_slice(), b"abcde");
        assert_eq!(r.into_vec(), b"abcde".to_vec());
    }

    #[test]
    fn zero_length_is_immediately_full() {
        let mut r = RecvBuf::new(0);
        assert!(r.is_full());
        assert_eq!(r.fill(b"a"), 0);
    }

    #[test]
    fn huge_want_does_not_allocate_up_front() {
        let r = RecvBuf::new(usize::MAX);
        assert_eq!(r.remaining(), usize::MAX);
        assert!(r.buf.capacity() <= super::PREALLOC_LIMIT);
    }
}
