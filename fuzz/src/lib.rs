//! Shared pieces of the proto-core fuzz targets.
//!
//! Every target reads its input through a small, documented byte layout (built on
//! `arbitrary::Unstructured`, whose integers are little-endian and zero-filled once the input
//! runs out) so that `examples/make_seeds.rs` and `make-seeds.py` can write meaningful seeds
//! with the matching `encode` functions. The typed round-trip messages use `#[derive(Arbitrary)]`
//! mirrors instead (see [`mirror`]).

pub mod boot;
pub mod client;
pub mod compute;
pub mod graph;
pub mod mirror;
pub mod ranked;
pub mod server;

use arbitrary::{Arbitrary, Unstructured};

/// Split points of a byte stream: `k` piece lengths (each `len + 1` bytes), used cyclically.
/// Layout: `k: u8` (taken modulo [`MAX_SPLITS`] + 1), then `k` little-endian `u16`s.
/// `k == 0` delivers the stream in one piece.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Splits(pub Vec<u16>);

/// Most split lengths an input can carry.
pub const MAX_SPLITS: usize = 32;

impl Splits {
    /// Reads the split header.
    pub fn read(u: &mut Unstructured<'_>) -> Splits {
        let k = usize::from(u8::arbitrary(u).unwrap_or(0)) % (MAX_SPLITS + 1);
        Splits((0..k).map(|_| u16::arbitrary(u).unwrap_or(0)).collect())
    }

    /// Appends the split header (at most [`MAX_SPLITS`] lengths are kept).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let k = self.0.len().min(MAX_SPLITS);
        out.push(k as u8);
        for len in &self.0[..k] {
            out.extend_from_slice(&len.to_le_bytes());
        }
    }

    /// Cuts `data` into the pieces these splits describe.
    pub fn pieces<'d>(&self, mut data: &'d [u8]) -> Vec<&'d [u8]> {
        if self.0.is_empty() {
            return vec![data];
        }
        let mut out = Vec::new();
        let mut i = 0;
        while !data.is_empty() {
            let len = (usize::from(self.0[i % self.0.len()]) + 1).min(data.len());
            let (piece, rest) = data.split_at(len);
            out.push(piece);
            data = rest;
            i += 1;
        }
        out
    }
}

/// Reads one byte (0 once the input is exhausted).
pub fn byte(u: &mut Unstructured<'_>) -> u8 {
    u8::arbitrary(u).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_round_trip_and_cut() {
        let splits = Splits(vec![0, 2]);
        let mut bytes = Vec::new();
        splits.encode(&mut bytes);
        bytes.extend_from_slice(b"abcdefg");
        let mut u = Unstructured::new(&bytes);
        assert_eq!(Splits::read(&mut u), splits);
        let rest = u.take_rest();
        assert_eq!(splits.pieces(rest), vec![&b"a"[..], b"bcd", b"e", b"fg"]);
        assert_eq!(Splits::default().pieces(b"xy"), vec![&b"xy"[..]]);
    }
}
