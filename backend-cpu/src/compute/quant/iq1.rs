//! IQ1_S and IQ1_M: 256-element super-blocks whose groups of 8 weights are points of a grid of
//! values in {-1, 0, 1} (IQ1S_GRID, one i8 each, packed in a `u64`), shifted by `±DELTA`, with
//! 3-bit block scales.
//!
//! ```text
//! block_iq1_s (50 bytes): d: f16 | qs: [u8; 32] | qh: [u16; 8]
//!     group l of block ib: index qs[4*ib + l] | ((qh[ib] >> 3l) & 7) << 8;
//!     ls = (qh[ib] >> 12) & 7, delta = -DELTA if bit 15 of qh[ib] else DELTA
//!     w = d * (2*ls + 1) * (grid + delta)
//! block_iq1_m (56 bytes): qs: [u8; 32] | qh: [u8; 16] | scales: [u16; 4]
//!     group l of block ib: index qs[4*ib + l] | ((qh[2*ib + l/2] >> 4*(l%2)) & 7) << 8,
//!     delta by bit 3 + 4*(l%2) of that qh byte; 3-bit scales: bits 6*(ib%2) (groups 0-1) and
//!     6*(ib%2) + 3 (groups 2-3) of scales[ib/2]; d: the f16 made of the top nibbles of
//!     scales[0..4] (scales[0] >> 12 lowest)
//!     w = d * (2*ls + 1) * (grid + delta)
//! ```
//! Activations for the dot product are Q8_K (ggml-cpu's `vec_dot_type`; the `delta` part uses
//! its `bsums` for IQ1_S); there is no quantizer (ggml-cpu has no `from_float` for these).
//!
//! Follows ggml b11434: `dequantize_row_iq1_{s,m}` (`ggml-quants.c`, bit-exact) and
//! `ggml_vec_dot_iq1_{s,m}_q8_K_generic` (`ggml-cpu/quants.c`): exact integer sums per
//! super-block of `ls' * sum grid*q8` and `ls' * delta_sign * sum q8`, then
//! `sumf += d * d8 * (sumi + DELTA * sumi_delta)` in super-block order.

use super::fp16;
use super::iq2::{q8k_d, q8k_group};
use super::iq_grids::IQ1S_GRID;
use super::q8::Q8_K_BYTES;
use super::QK_K;

/// Bytes of a `block_iq1_s`.
pub(super) const IQ1_S_BYTES: usize = 50;
/// Bytes of a `block_iq1_m`.
pub(super) const IQ1_M_BYTES: usize = 56;

/// `IQ1S_DELTA` = `IQ1M_DELTA`.
const DELTA: f32 = 0.125;
/// 32-element blocks per super-block.
const NB: usize = QK_K / 32;

/// The 8 grid values of point `index` (< 2048).
#[inline(always)]
fn grid(index: usize) -> [i8; 8] {
    IQ1S_GRID[index].to_le_bytes().map(|v| v as i8)
}

/// `dl * (grid + delta)` of 8 weights into `y`.
#[inline(always)]
fn dequant8(index: usize, dl: f32, delta: f32, y: &mut [f32]) {
    let g = grid(index);
    for j in 0..8 {
        y[j] = dl * (f32::from(g[j]) + delta);
    }
}

/// Exact `sum grid * q8` over 8 weights.
#[inline(always)]
fn dot8(index: usize, q8: &[u8]) -> i32 {
    let g = grid(index);
    let mut sum = 0i32;
    for j in 0..8 {
        sum += i32::from(g[j]) * i32::from(q8[j] as i8);
    }
    sum
}

/// IQ1_S block `ib` of `b`: `(ls, delta negative, [grid index; 4])`.
#[inline(always)]
fn iq1_s_block(b: &[u8], ib: usize) -> (i32, bool, [usize; 4]) {
    let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]);
    let mut idx = [0usize; 4];
    for (l, i) in idx.iter_mut().enumerate() {
        *i = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
    }
    (i32::from((qh >> 12) & 7), qh & 0x8000 != 0, idx)
}

/// The four 16-bit scale words of an IQ1_M block.
#[inline(always)]
fn iq1_m_scales(b: &[u8]) -> [u16; 4] {
    let mut sc = [0u16; 4];
    for (k, s) in sc.iter_mut().enumerate() {
        *s = u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]);
    }
    sc
}

/// The super-block scale of an IQ1_M block: an f16 spread over the top nibbles of the scales.
#[inline(always)]
fn iq1_m_d(sc: &[u16; 4]) -> f32 {
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    let [lo, hi] = bits.to_le_bytes();
    fp16(lo, hi)
}

/// IQ1_M block `ib` of `b`: `([ls of groups 0-1, ls of groups 2-3], [delta negative; 4],
/// [grid index; 4])`.
#[inline(always)]
fn iq1_m_block(b: &[u8], sc: &[u16; 4], ib: usize) -> ([i32; 2], [bool; 4], [usize; 4]) {
    let s = sc[ib / 2] >> (6 * (ib % 2));
    let ls = [i32::from(s & 7), i32::from((s >> 3) & 7)];
    let mut neg = [false; 4];
    let mut idx = [0usize; 4];
    for l in 0..4 {
        let qh = b[32 + 2 * ib + l / 2] >> (4 * (l % 2));
        idx[l] = usize::from(b[4 * ib + l]) | (usize::from(qh & 7) << 8);
        neg[l] = qh & 0x08 != 0;
    }
    (ls, neg, idx)
}

#[inline(always)]
fn delta(neg: bool) -> f32 {
    if neg {
        -DELTA
    } else {
        DELTA
    }
}

/// `dequantize_row_iq1_s`.
pub(super) fn dequantize_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ1_S_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[0], b[1]);
        for (ib, y) in out.chunks_exact_mut(32).enumerate() {
            let (ls, neg, idx) = iq1_s_block(b, ib);
            let dl = d * (2 * ls + 1) as f32;
            for (&i, y) in idx.iter().zip(y.chunks_exact_mut(8)) {
                dequant8(i, dl, delta(neg), y);
            }
        }
    }
}

/// `dequantize_row_iq1_m`.
pub(super) fn dequantize_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ1_M_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let sc = iq1_m_scales(b);
        let d = iq1_m_d(&sc);
        for (ib, y) in out.chunks_exact_mut(32).enumerate() {
            let (ls, neg, idx) = iq1_m_block(b, &sc, ib);
            let dl = [d * (2 * ls[0] + 1) as f32, d * (2 * ls[1] + 1) as f32];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                dequant8(idx[l], dl[l / 2], delta(neg[l]), y);
            }
        }
    }
}

/// `ggml_vec_dot_iq1_s_q8_K_generic`.
pub(super) fn vec_dot_iq1_s_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(IQ1_S_BYTES).zip(y.chunks_exact(Q8_K_BYTES)) {
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..NB {
            let (ls, neg, idx) = iq1_s_block(bx, ib);
            let ls = 2 * ls + 1;
            let mut lsum = 0i32;
            for (l, &i) in idx.iter().enumerate() {
                lsum += dot8(i, q8k_group(by, 4 * ib + l));
            }
            // bsums[2*ib] + bsums[2*ib + 1]: the sums of the block's two halves of 16
            let at = 260 + 4 * ib;
            let bs = i32::from(i16::from_le_bytes([by[at], by[at + 1]]))
                + i32::from(i16::from_le_bytes([by[at + 2], by[at + 3]]));
            sumi += ls * lsum;
            sumi1 += ls * if neg { -bs } else { bs };
        }
        sumf += fp16(bx[0], bx[1]) * q8k_d(by) * (sumi as f32 + DELTA * sumi1 as f32);
    }
    sumf
}

/// `ggml_vec_dot_iq1_m_q8_K_generic`.
pub(super) fn vec_dot_iq1_m_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(IQ1_M_BYTES).zip(y.chunks_exact(Q8_K_BYTES)) {
        let sc = iq1_m_scales(bx);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for ib in 0..NB {
            let (ls, neg, idx) = iq1_m_block(bx, &sc, ib);
            let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
            for l in 0..4 {
                let q8 = q8k_group(by, 4 * ib + l);
                let qsum: i32 = q8.iter().map(|&q| i32::from(q as i8)).sum();
                sum1[l / 2] += dot8(idx[l], q8);
                sum2[l / 2] += if neg[l] { -qsum } else { qsum };
            }
            let (ls1, ls2) = (2 * ls[0] + 1, 2 * ls[1] + 1);
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
        }
        sumf += iq1_m_d(&sc) * q8k_d(by) * (sumi1 as f32 + DELTA * sumi2 as f32);
    }
    sumf
}
