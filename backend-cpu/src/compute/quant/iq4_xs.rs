//! IQ4_XS: IQ4_NL's non-linear 4-bit values in 256-element super-blocks of eight 32-element
//! blocks, each block with a 6-bit scale.
//!
//! ```text
//! block_iq4_xs (136 bytes): d: f16 | scales_h: u16 | scales_l: [u8; 4] | qs: [u8; 128]
//!     ls(ib) = (scales_l[ib/2] >> 4*(ib%2)) & 15 | ((scales_h >> 2*ib) & 3) << 4
//!     w = d * (ls - 32) * KVALUES[q]
//! ```
//! Within block `ib`, element `j < 16` is the low nibble of `qs[16*ib + j]`, element `j + 16`
//! its high nibble. Activations for the dot product are Q8_K (ggml-cpu's `vec_dot_type`).
//!
//! Follows ggml b11434: `dequantize_row_iq4_xs` and `quantize_row_iq4_xs_ref`
//! (`quantize_iq4_xs` without importance weights, i.e. `quantize_row_iq4_nl_impl` with
//! 256-element super-blocks, 32-element blocks and `ntry = 7`; also ggml-cpu's `from_float`),
//! bit-exact, and `ggml_vec_dot_iq4_xs_q8_K_generic` (`ggml-cpu/quants.c`): exact integer sums
//! per 32-element block, scaled by `d * d8 * (ls - 32)` and summed in f32 in block order.

use super::iq4_nl::{best_index, GROUP_MAX_EPS, KVALUES};
use super::q8::Q8_K_BYTES;
use super::{fp16, fp16_bytes, nearest_int, QK32, QK_K};

/// Bytes of a `block_iq4_xs`.
pub(super) const IQ4_XS_BYTES: usize = 136;

/// Blocks per super-block.
const NB: usize = QK_K / QK32;
/// Offset of `qs` in a block.
const QS: usize = 8;
/// Tries either side of the first scale (`ntry` in ggml).
const NTRY: i32 = 7;

/// The 6-bit scale of block `ib` (0..8) of `b`, minus 32.
#[inline(always)]
fn block_scale(b: &[u8], ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    let hi = ((scales_h >> (2 * ib)) & 3) as u8;
    i32::from(lo | (hi << 4)) - 32
}

/// `dequantize_row_iq4_xs`: `d * (ls - 32) * KVALUES[q]`.
pub(super) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ4_XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[0], b[1]);
        for (ib, y) in out.chunks_exact_mut(QK32).enumerate() {
            let dl = d * block_scale(b, ib) as f32;
            let qs = &b[QS + 16 * ib..QS + 16 * ib + 16];
            for j in 0..16 {
                y[j] = dl * f32::from(KVALUES[usize::from(qs[j] & 0x0F)]);
                y[j + 16] = dl * f32::from(KVALUES[usize::from(qs[j] >> 4)]);
            }
        }
    }
}

/// `(sum w*q*x, sum w*q*q)` with `w = x^2` and `q` the table value nearest to `id * x`,
/// accumulated in element order as ggml does; the indices go to `l` when given.
#[inline(always)]
fn fit(xb: &[f32], id: f32, mut l: Option<&mut [u8]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (j, &v) in xb.iter().enumerate() {
        let idx = best_index(id * v);
        if let Some(l) = l.as_deref_mut() {
            l[j] = idx as u8;
        }
        let q = f32::from(KVALUES[idx]);
        let w = v * v;
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// `quantize_row_iq4_xs_ref`. Per 32-element block: a first scale `max / 127` refitted by
/// weighted least squares (weights `x^2`), then 15 more tries `id = (t - 127) / max`,
/// `t = -7..=7`, keeping the best fit; the super-block scale is `d = -max_scale / 32` of the
/// block scale largest in magnitude, each block scale rounded to `l` in `-32..=31` steps of
/// `d`, and every element re-chosen against `d * l`. Blocks below `GROUP_MAX_EPS` get scale 0
/// (and their elements index 8, the entry nearest to 0).
pub(super) fn quantize_iq4_xs_ref(src: &[f32], dst: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (x, b) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(IQ4_XS_BYTES))
    {
        let mut scales = [0.0f32; NB];
        let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
        for (ib, xb) in x.chunks_exact(QK32).enumerate() {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in xb {
                let ax = v.abs();
                if ax > amax {
                    amax = ax;
                    max = v;
                }
            }
            if amax < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let d = -max / f32::from(KVALUES[0]);
            let (sumqx, sumq2) = fit(xb, 1.0 / d, None);
            let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
            let mut best = d * sumqx;
            for itry in -NTRY..=NTRY {
                let id = (itry + i32::from(KVALUES[0])) as f32 / max;
                let (sumqx, sumq2) = fit(xb, id, None);
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
            scales[ib] = d;
            if d.abs() > amax_scale {
                amax_scale = d.abs();
                max_scale = d;
            }
        }

        let d = -max_scale / 32.0;
        b[..2].copy_from_slice(&fp16_bytes(d));
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut scales_h = 0u16;
        for (ib, xb) in x.chunks_exact(QK32).enumerate() {
            let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for (lj, &v) in l[QK32 * ib..QK32 * (ib + 1)].iter_mut().zip(xb) {
                *lj = best_index(idl * v) as u8;
            }
            let ls = (ls + 32) as u8;
            if ib % 2 == 0 {
                b[4 + ib / 2] = ls & 0x0F;
            } else {
                b[4 + ib / 2] |= (ls & 0x0F) << 4;
            }
            scales_h |= u16::from(ls >> 4) << (2 * ib);
        }
        b[2..4].copy_from_slice(&scales_h.to_le_bytes());
        for ib in 0..NB {
            for j in 0..16 {
                b[QS + 16 * ib + j] = l[QK32 * ib + j] | (l[QK32 * ib + 16 + j] << 4);
            }
        }
    }
}

/// `ggml_vec_dot_iq4_xs_q8_K_generic`.
pub(super) fn vec_dot_iq4_xs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(IQ4_XS_BYTES).zip(y.chunks_exact(Q8_K_BYTES)) {
        let d4d8 = fp16(bx[0], bx[1]) * f32::from_le_bytes([by[0], by[1], by[2], by[3]]);
        for ib in 0..NB {
            let dl = d4d8 * block_scale(bx, ib) as f32;
            let qs = &bx[QS + 16 * ib..QS + 16 * ib + 16];
            let q8 = &by[4 + QK32 * ib..4 + QK32 * (ib + 1)];
            let (mut sumi1, mut sumi2) = (0i32, 0i32);
            for j in 0..16 {
                sumi1 += i32::from(q8[j] as i8) * i32::from(KVALUES[usize::from(qs[j] & 0x0F)]);
                sumi2 += i32::from(q8[j + 16] as i8) * i32::from(KVALUES[usize::from(qs[j] >> 4)]);
            }
            sumf += dl * (sumi1 + sumi2) as f32;
        }
    }
    sumf
}
