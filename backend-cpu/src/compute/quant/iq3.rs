//! IQ3_XXS and IQ3_S: 256-element super-blocks whose groups of 4 weights are points of a grid
//! of magnitudes (one byte each, packed in a `u32`), with one sign bit per weight and 4-bit
//! block scales.
//!
//! ```text
//! block_iq3_xxs (98 bytes): d: f16 | qs: [u8; 64] | scales_and_signs: [u32; 8]
//!     block ib: grid indices qs[8*ib..8*ib + 8] (u8, into IQ3XXS_GRID, two per group of 8);
//!     u32 s = scales_and_signs[ib]: bits 7l..7l+6 = group l's signs (KSIGNS_IQ2XS),
//!     bits 28..31 = scale ls
//!     w = d * (0.5 + ls) * 0.5 * grid * sign
//! block_iq3_s (110 bytes): d: f16 | qs: [u8; 64] | qh: [u8; 8] | signs: [u8; 32] | scales: [u8; 4]
//!     group l of block ib: indices qs[8*ib + 2l] | ((qh[ib] >> 2l) & 1) << 8 and
//!     qs[8*ib + 2l + 1] | ((qh[ib] >> (2l + 1)) & 1) << 8 into IQ3S_GRID, sign bits
//!     signs[4*ib + l]; ls = (scales[ib/2] >> 4*(ib%2)) & 15
//!     w = d * (1 + 2*ls) * grid * sign
//! ```
//! Activations for the dot product are Q8_K (ggml-cpu's `vec_dot_type`); there is no
//! quantizer (ggml-cpu has no `from_float` for these).
//!
//! Follows ggml b11434: `dequantize_row_iq3_{xxs,s}` (`ggml-quants.c`, bit-exact) and
//! `ggml_vec_dot_iq3_{xxs,s}_q8_K_generic` (`ggml-cpu/quants.c`): exact integer sums per
//! super-block, then `sumf += d * d8 * bsum` in super-block order (and `0.25 * sumf` for
//! IQ3_XXS).

use super::fp16;
use super::iq2::{dequant8, dot8, q8k_d, q8k_group, Block32};
use super::iq_grids::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::q8::Q8_K_BYTES;
use super::QK_K;

/// Bytes of a `block_iq3_xxs`.
pub(super) const IQ3_XXS_BYTES: usize = 98;
/// Bytes of a `block_iq3_s`.
pub(super) const IQ3_S_BYTES: usize = 110;

/// 32-element blocks per super-block.
const NB: usize = QK_K / 32;

/// Two 4-value grid points as the 8 bytes of one group.
#[inline(always)]
fn pair(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

/// IQ3_XXS block `ib` of `b`: `(ls, [(grid, signs); 4])`.
#[inline(always)]
fn iq3_xxs_block(b: &[u8], ib: usize) -> Block32 {
    let qs = &b[2 + 8 * ib..2 + 8 * ib + 8];
    let at = 66 + 4 * ib;
    let s = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let mut groups = [(0u64, 0u8); 4];
    for (l, g) in groups.iter_mut().enumerate() {
        *g = (
            pair(
                IQ3XXS_GRID[usize::from(qs[2 * l])],
                IQ3XXS_GRID[usize::from(qs[2 * l + 1])],
            ),
            KSIGNS_IQ2XS[((s >> (7 * l)) & 127) as usize],
        );
    }
    (s >> 28, groups)
}

/// IQ3_S block `ib` of `b`: `(ls, [(grid, signs); 4])`.
#[inline(always)]
fn iq3_s_block(b: &[u8], ib: usize) -> Block32 {
    let qs = &b[2 + 8 * ib..2 + 8 * ib + 8];
    let qh = usize::from(b[66 + ib]);
    let mut groups = [(0u64, 0u8); 4];
    for (l, g) in groups.iter_mut().enumerate() {
        let i1 = usize::from(qs[2 * l]) | ((qh << (8 - 2 * l)) & 256);
        let i2 = usize::from(qs[2 * l + 1]) | ((qh << (7 - 2 * l)) & 256);
        *g = (pair(IQ3S_GRID[i1], IQ3S_GRID[i2]), b[74 + 4 * ib + l]);
    }
    let ls = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    (u32::from(ls), groups)
}

/// `dequantize_row_iq3_xxs`.
pub(super) fn dequantize_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ3_XXS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[0], b[1]);
        for (ib, y) in out.chunks_exact_mut(32).enumerate() {
            let (ls, groups) = iq3_xxs_block(b, ib);
            let db = d * (0.5 + ls as f32) * 0.5;
            for (&(grid, signs), y) in groups.iter().zip(y.chunks_exact_mut(8)) {
                dequant8(grid, signs, db, y);
            }
        }
    }
}

/// `dequantize_row_iq3_s`.
pub(super) fn dequantize_iq3_s(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ3_S_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[0], b[1]);
        for (ib, y) in out.chunks_exact_mut(32).enumerate() {
            let (ls, groups) = iq3_s_block(b, ib);
            let db = d * (1 + 2 * ls) as f32;
            for (&(grid, signs), y) in groups.iter().zip(y.chunks_exact_mut(8)) {
                dequant8(grid, signs, db, y);
            }
        }
    }
}

/// The exact `sum (2*ls + 1) * sum grid*sign*q8` of one super-block.
#[inline(always)]
fn bsum(bx: &[u8], by: &[u8], block: fn(&[u8], usize) -> Block32) -> i32 {
    let mut bsum = 0i32;
    for ib in 0..NB {
        let (ls, groups) = block(bx, ib);
        let mut sumi = 0i32;
        for (l, &(grid, signs)) in groups.iter().enumerate() {
            sumi += dot8(grid, signs, q8k_group(by, 4 * ib + l));
        }
        bsum += sumi * (2 * ls as i32 + 1);
    }
    bsum
}

/// `ggml_vec_dot_iq3_xxs_q8_K_generic`.
pub(super) fn vec_dot_iq3_xxs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x
        .chunks_exact(IQ3_XXS_BYTES)
        .zip(y.chunks_exact(Q8_K_BYTES))
    {
        let d = fp16(bx[0], bx[1]) * q8k_d(by);
        sumf += d * bsum(bx, by, iq3_xxs_block) as f32;
    }
    0.25 * sumf
}

/// `ggml_vec_dot_iq3_s_q8_K_generic`.
pub(super) fn vec_dot_iq3_s_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(IQ3_S_BYTES).zip(y.chunks_exact(Q8_K_BYTES)) {
        let d = fp16(bx[0], bx[1]) * q8k_d(by);
        sumf += d * bsum(bx, by, iq3_s_block) as f32;
    }
    sumf
}
