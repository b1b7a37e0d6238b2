//! Q8_0, Q8_1 and Q8_K: 8-bit quants, the activation formats of the dot products (Q8_0 is
//! also a weight format).
//!
//! ```text
//! block_q8_0 (34 bytes):  d: f16 | qs: [i8; 32]                          w = q * d
//! block_q8_1 (36 bytes):  d: f16 | s: f16 | qs: [i8; 32]                 w = q * d, s = d * sum(q)
//! block_q8_K (292 bytes): d: f32 | qs: [i8; 256] | bsums: [i16; 16] (LE)  w = q * d, bsums[i] = sum(qs[16i..16i+16])
//! ```

use super::{fp16, fp16_bytes, nearest_int, QK32, QK_K};

/// Bytes of a `block_q8_0`.
pub(super) const Q8_0_BYTES: usize = 34;
/// Bytes of a `block_q8_1`.
pub(super) const Q8_1_BYTES: usize = 36;
/// Bytes of a `block_q8_K`.
pub(super) const Q8_K_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);
/// Offset of `bsums` in a `block_q8_K`.
pub(super) const Q8_K_BSUMS: usize = 4 + QK_K;

#[inline(always)]
fn dequantize_q8<const BYTES: usize, const QS: usize>(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK32)) {
        let (Some(b), Some(out)) = (b.first_chunk::<BYTES>(), out.first_chunk_mut::<QK32>()) else {
            break;
        };
        let d = fp16(b[0], b[1]);
        for j in 0..QK32 {
            out[j] = f32::from(b[QS + j] as i8) * d;
        }
    }
}

#[inline(always)]
pub(super) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    dequantize_q8::<Q8_0_BYTES, 2>(src, dst);
}

/// Q8_1 has no `to_float` in ggml; this is the obvious `q * d`.
#[inline(always)]
pub(super) fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    dequantize_q8::<Q8_1_BYTES, 4>(src, dst);
}

/// `dequantize_row_q8_K`: `d * q`.
#[inline(always)]
pub(super) fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(Q8_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (Some(b), Some(out)) = (b.first_chunk::<Q8_K_BYTES>(), out.first_chunk_mut::<QK_K>())
        else {
            break;
        };
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for j in 0..QK_K {
            out[j] = d * f32::from(b[4 + j] as i8);
        }
    }
}

/// `_mm_max_ps` / `_mm256_max_ps` on one lane: the second operand unless `a > b`.
#[inline(always)]
fn max_ps(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Largest `|x|` of a 32-element block computed as ggml's AVX quantizers do (so NaNs fall
/// out the same way): eight lanes over the four 8-element vectors, then 8 -> 4 -> 2 -> 1.
#[inline(always)]
fn abs_max_avx(x: &[f32; QK32]) -> f32 {
    let mut m = [0f32; 8];
    for (k, c) in x.chunks_exact(8).enumerate() {
        for (m, &v) in m.iter_mut().zip(c) {
            // the first vector is taken as is (`maxAbs = |v0|`)
            *m = if k == 0 { v.abs() } else { max_ps(*m, v.abs()) };
        }
    }
    let h: [f32; 4] = std::array::from_fn(|l| max_ps(m[l + 4], m[l]));
    let h = [max_ps(h[0], h[2]), max_ps(h[1], h[3])];
    max_ps(h[0], h[1])
}

/// Largest `|x|` of a block with ggml's `if (ax > amax)` scan (NaNs skipped), in eight lanes
/// so that it vectorizes (the maximum does not depend on the order).
#[inline(always)]
fn abs_max_scan(x: &[f32]) -> f32 {
    let mut m = [0f32; 8];
    for c in x.chunks_exact(8) {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = max_ps(v.abs(), *m);
        }
    }
    m.iter().fold(0f32, |acc, &v| max_ps(v, acc))
}

/// `_mm256_round_ps(v, _MM_ROUND_NEAREST)`, `_mm256_cvtps_epi32` and the saturating packs to
/// i8 of ggml's AVX quantizers: round half to even, saturate to [-128, 127], NaN to -128
/// (the "integer indefinite" value packs to -128).
#[inline(always)]
fn round_pack_i8(v: f32) -> i8 {
    let r = v.round_ties_even();
    if r.is_nan() {
        -128
    } else {
        r.clamp(-128.0, 127.0) as i8
    }
}

/// ggml-cpu's x86 `quantize_row_q8_0` (AVX): `d = amax / 127` stored as f16,
/// `q = round_half_even(x * (127 / amax))` (multiplier 0 for an all-zero block).
#[inline(always)]
pub(super) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK32).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let Some(x) = x.first_chunk::<QK32>() else {
            break;
        };
        let amax = abs_max_avx(x);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b[..2].copy_from_slice(&fp16_bytes(d));
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = round_pack_i8(v * id) as u8;
        }
    }
}

/// ggml-cpu's x86 `quantize_row_q8_1` (AVX): as [`quantize_q8_0`], plus
/// `s = f16(d * sum(q))` with the f32 `d`.
#[inline(always)]
pub(super) fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK32).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let Some(x) = x.first_chunk::<QK32>() else {
            break;
        };
        let amax = abs_max_avx(x);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in b[4..].iter_mut().zip(x) {
            let qi = round_pack_i8(v * id);
            sum += i32::from(qi);
            *q = qi as u8;
        }
        b[..2].copy_from_slice(&fp16_bytes(d));
        b[2..4].copy_from_slice(&fp16_bytes(d * sum as f32));
    }
}

/// `quantize_row_q8_0_ref`: `d = amax / 127`, `q = roundf(x * (1 / d))` (half away from zero).
pub(super) fn quantize_q8_0_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK32).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = x
            .iter()
            .fold(0f32, |m, v| if m > v.abs() { m } else { v.abs() });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&fp16_bytes(d));
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// `quantize_row_q8_1_ref`: as [`quantize_q8_0_ref`], plus `s = f16(sum(q) * d)`.
pub(super) fn quantize_q8_1_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK32).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let amax = x
            .iter()
            .fold(0f32, |m, v| if m > v.abs() { m } else { v.abs() });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in b[4..].iter_mut().zip(x) {
            let qi = (v * id).round() as i8;
            sum += i32::from(qi);
            *q = qi as u8;
        }
        b[..2].copy_from_slice(&fp16_bytes(d));
        b[2..4].copy_from_slice(&fp16_bytes(sum as f32 * d));
    }
}

/// `quantize_row_q8_K_ref` (also ggml-cpu's x86 `from_float`): `max` the value of largest
/// magnitude (the first on ties), `iscale = -127 / max`, `q = min(127, nearest_int(iscale * x))`,
/// `d = 1 / iscale` as f32, `bsums` the sums of 16 quants. An all-zero block gets `d = 0` and
/// zero quants (ggml leaves its `bsums` untouched; they are zeroed here).
#[inline(always)]
pub(super) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q8_K_BYTES)) {
        // ggml scans for the first element of largest magnitude; the same element, found in
        // two passes that vectorize
        let amax = abs_max_scan(x);
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b[4..4 + QK_K].iter_mut().zip(x) {
            *q = nearest_int(iscale * v).clamp(-128, 127) as i8 as u8;
        }
        let mut bsums = [0i16; QK_K / 16];
        for (s, qs) in bsums.iter_mut().zip(b[4..4 + QK_K].chunks_exact(16)) {
            *s = qs.iter().map(|&q| i16::from(q as i8)).sum();
        }
        for (s, out) in bsums.iter().zip(b[Q8_K_BSUMS..].chunks_exact_mut(2)) {
            out.copy_from_slice(&s.to_le_bytes());
        }
        b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// Q8_0 x Q8_0 row: eight exact lane sums per block, scaled by `dx * dy` into eight f32
/// lanes (the definition shared by every Q8_0 kernel, see `tiles`).
#[inline(always)]
pub(super) fn vec_dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    super::tiles::vec_dot_portable(super::tiles::Q0::Q8_0, x, y)
}

/// The parts of a `block_q8_K` the dot products need.
pub(super) struct Q8K<'a> {
    /// `d`.
    pub d: f32,
    /// The 256 quants (as bytes; reinterpret as i8).
    pub qs: &'a [u8; QK_K],
    /// `bsums`.
    pub bsums: [i16; QK_K / 16],
}

/// Splits a `block_q8_K`.
#[inline(always)]
pub(super) fn q8k(b: &[u8; Q8_K_BYTES]) -> Option<Q8K<'_>> {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let qs = b[4..].first_chunk::<QK_K>()?;
    let mut bsums = [0i16; QK_K / 16];
    for (s, v) in bsums.iter_mut().zip(b[Q8_K_BSUMS..].chunks_exact(2)) {
        *s = i16::from_le_bytes([v[0], v[1]]);
    }
    Some(Q8K { d, qs, bsums })
}
