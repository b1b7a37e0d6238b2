//! IQ2_XXS, IQ2_XS and IQ2_S: 256-element super-blocks whose groups of 8 weights are points of
//! a lattice ("grid") of magnitudes in {8, 25, 43} (one byte each, packed in a `u64`), with
//! one sign bit per weight and 4-bit block scales.
//!
//! ```text
//! block_iq2_xxs (66 bytes): d: f16 | qs: [u16; 32]
//!     per 32-element block ib: 8 bytes at 2 + 8*ib = four grid indices (u8, into
//!     IQ2XXS_GRID) | u32 s: bits 7l..7l+6 = group l's signs (through KSIGNS_IQ2XS),
//!     bits 28..31 = scale ls
//!     w = d * (0.5 + ls) * 0.25 * grid * sign
//! block_iq2_xs (74 bytes): d: f16 | qs: [u16; 32] | scales: [u8; 8]
//!     qs[4*ib + l]: bits 0..8 index into IQ2XS_GRID, bits 9..15 signs (KSIGNS_IQ2XS);
//!     groups 0,1 of block ib scaled by scales[ib] & 15, groups 2,3 by scales[ib] >> 4
//!     w = d * (0.5 + ls) * 0.25 * grid * sign
//! block_iq2_s (82 bytes): d: f16 | qs: [u8; 32] | signs: [u8; 32] | qh: [u8; 8] | scales: [u8; 8]
//!     group l of block ib: index qs[4*ib + l] | ((qh[ib] >> 2l) & 3) << 8 into IQ2S_GRID,
//!     sign bits signs[4*ib + l]; scales as IQ2_XS
//! ```
//! Activations for the dot product are Q8_K (ggml-cpu's `vec_dot_type`); there is no
//! quantizer (ggml-cpu has no `from_float` for these: they need an importance matrix).
//!
//! Follows ggml b11434: `dequantize_row_iq2_{xxs,xs,s}` (`ggml-quants.c`, bit-exact) and
//! `ggml_vec_dot_iq2_{xxs,xs,s}_q8_K_generic` (`ggml-cpu/quants.c`): exact integer sums per
//! super-block (`sum ls' * sum grid*sign*q8` with `ls' = 2*ls + 1`), then
//! `sumf += d * d8 * bsum` in super-block order and `0.125 * sumf`.

use super::fp16;
use super::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::q8::Q8_K_BYTES;
use super::QK_K;

/// Bytes of a `block_iq2_xxs`.
pub(super) const IQ2_XXS_BYTES: usize = 66;
/// Bytes of a `block_iq2_xs`.
pub(super) const IQ2_XS_BYTES: usize = 74;
/// Bytes of a `block_iq2_s`.
pub(super) const IQ2_S_BYTES: usize = 82;

/// 32-element blocks per super-block.
const NB: usize = QK_K / 32;

/// A 32-element block as its 4-bit scale `ls` and four groups of 8 weights, each a grid point
/// (8 magnitude bytes) and its sign bits.
pub(super) type Block32 = (u32, [(u64, u8); 4]);

/// `grid * sign` of 8 weights: byte `j` of `grid` (little-endian), negated where bit `j` of
/// `signs` is set.
#[inline(always)]
pub(super) fn signed8(grid: u64, signs: u8) -> [i32; 8] {
    let g = grid.to_le_bytes();
    let mut out = [0i32; 8];
    for j in 0..8 {
        let v = i32::from(g[j]);
        out[j] = if signs & (1 << j) != 0 { -v } else { v };
    }
    out
}

/// `db * grid[j] * (±1)` of 8 weights into `y`, multiplied in that order as ggml does.
#[inline(always)]
pub(super) fn dequant8(grid: u64, signs: u8, db: f32, y: &mut [f32]) {
    let g = grid.to_le_bytes();
    for j in 0..8 {
        let s = if signs & (1 << j) != 0 { -1.0f32 } else { 1.0 };
        y[j] = db * f32::from(g[j]) * s;
    }
}

/// Exact sum of `grid * sign * q8` over 8 weights.
#[inline(always)]
pub(super) fn dot8(grid: u64, signs: u8, q8: &[u8]) -> i32 {
    let w = signed8(grid, signs);
    let mut sum = 0i32;
    for j in 0..8 {
        sum += w[j] * i32::from(q8[j] as i8);
    }
    sum
}

/// The Q8_K super-block's scale `d`.
#[inline(always)]
pub(super) fn q8k_d(by: &[u8]) -> f32 {
    f32::from_le_bytes([by[0], by[1], by[2], by[3]])
}

/// The Q8_K values of group `g` (8 elements) of a super-block.
#[inline(always)]
pub(super) fn q8k_group(by: &[u8], g: usize) -> &[u8] {
    &by[4 + 8 * g..4 + 8 * g + 8]
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// IQ2_XXS block `ib` of `b`: `(ls, [(grid, signs); 4])`.
#[inline(always)]
fn iq2_xxs_block(b: &[u8], ib: usize) -> Block32 {
    let at = 2 + 8 * ib;
    let s = u32_at(b, at + 4);
    let mut groups = [(0u64, 0u8); 4];
    for (l, g) in groups.iter_mut().enumerate() {
        *g = (
            IQ2XXS_GRID[usize::from(b[at + l])],
            KSIGNS_IQ2XS[((s >> (7 * l)) & 127) as usize],
        );
    }
    (s >> 28, groups)
}

/// IQ2_XS group `g` (0..32) of `b`: `(grid, signs)`.
#[inline(always)]
fn iq2_xs_group(b: &[u8], g: usize) -> (u64, u8) {
    let q = u16_at(b, 2 + 2 * g);
    (
        IQ2XS_GRID[usize::from(q & 511)],
        KSIGNS_IQ2XS[usize::from(q >> 9)],
    )
}

/// IQ2_S group `g` (0..32) of `b`: `(grid, signs)`.
#[inline(always)]
fn iq2_s_group(b: &[u8], g: usize) -> (u64, u8) {
    let (ib, l) = (g / 4, g % 4);
    let hi = (usize::from(b[66 + ib]) << (8 - 2 * l)) & 0x300;
    (IQ2S_GRID[usize::from(b[2 + g]) | hi], b[34 + g])
}

/// The two 4-bit scales of block `ib` (IQ2_XS and IQ2_S): groups 0-1 and 2-3.
#[inline(always)]
fn half_scales(sc: u8) -> [u8; 2] {
    [sc & 0x0F, sc >> 4]
}

/// `dequantize_row_iq2_xxs`.
pub(super) fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ2_XXS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[0], b[1]);
        for (ib, y) in out.chunks_exact_mut(32).enumerate() {
            let (ls, groups) = iq2_xxs_block(b, ib);
            let db = d * (0.5 + ls as f32) * 0.25;
            for (&(grid, signs), y) in groups.iter().zip(y.chunks_exact_mut(8)) {
                dequant8(grid, signs, db, y);
            }
        }
    }
}

/// `dequantize_row_iq2_xs`.
pub(super) fn dequantize_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ2_XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[0], b[1]);
        for (g, y) in out.chunks_exact_mut(8).enumerate() {
            let ls = half_scales(b[66 + g / 4])[(g % 4) / 2];
            let db = d * (0.5 + f32::from(ls)) * 0.25;
            let (grid, signs) = iq2_xs_group(b, g);
            dequant8(grid, signs, db, y);
        }
    }
}

/// `dequantize_row_iq2_s`.
pub(super) fn dequantize_iq2_s(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ2_S_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[0], b[1]);
        for (g, y) in out.chunks_exact_mut(8).enumerate() {
            let ls = half_scales(b[74 + g / 4])[(g % 4) / 2];
            let db = d * (0.5 + f32::from(ls)) * 0.25;
            let (grid, signs) = iq2_s_group(b, g);
            dequant8(grid, signs, db, y);
        }
    }
}

/// `ggml_vec_dot_iq2_xxs_q8_K_generic`.
pub(super) fn vec_dot_iq2_xxs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x
        .chunks_exact(IQ2_XXS_BYTES)
        .zip(y.chunks_exact(Q8_K_BYTES))
    {
        let d = fp16(bx[0], bx[1]) * q8k_d(by);
        let mut bsum = 0i32;
        for ib in 0..NB {
            let (ls, groups) = iq2_xxs_block(bx, ib);
            let mut sumi = 0i32;
            for (l, &(grid, signs)) in groups.iter().enumerate() {
                sumi += dot8(grid, signs, q8k_group(by, 4 * ib + l));
            }
            bsum += sumi * (2 * ls as i32 + 1);
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

/// IQ2_XS and IQ2_S: the exact `sum ls' * sum grid*sign*q8` of one super-block.
#[inline(always)]
fn iq2_scaled_bsum(
    bx: &[u8],
    by: &[u8],
    scales_at: usize,
    group: fn(&[u8], usize) -> (u64, u8),
) -> i32 {
    let mut bsum = 0i32;
    for ib in 0..NB {
        let [s1, s2] = half_scales(bx[scales_at + ib]);
        let mut sumi = [0i32; 2];
        for l in 0..4 {
            let (grid, signs) = group(bx, 4 * ib + l);
            sumi[l / 2] += dot8(grid, signs, q8k_group(by, 4 * ib + l));
        }
        bsum += sumi[0] * (2 * i32::from(s1) + 1) + sumi[1] * (2 * i32::from(s2) + 1);
    }
    bsum
}

/// `ggml_vec_dot_iq2_xs_q8_K_generic`.
pub(super) fn vec_dot_iq2_xs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(IQ2_XS_BYTES).zip(y.chunks_exact(Q8_K_BYTES)) {
        let d = fp16(bx[0], bx[1]) * q8k_d(by);
        sumf += d * iq2_scaled_bsum(bx, by, 66, iq2_xs_group) as f32;
    }
    0.125 * sumf
}

/// `ggml_vec_dot_iq2_s_q8_K_generic`.
pub(super) fn vec_dot_iq2_s_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(IQ2_S_BYTES).zip(y.chunks_exact(Q8_K_BYTES)) {
        let d = fp16(bx[0], bx[1]) * q8k_d(by);
        sumf += d * iq2_scaled_bsum(bx, by, 74, iq2_s_group) as f32;
    }
    0.125 * sumf
}
