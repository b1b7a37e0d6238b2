//! The plain float types: F32 (identity), F16 (IEEE binary16) and BF16 (bfloat16).
//!
//! F16 conversions go through the `half` crate (F16C instructions where the CPU has them,
//! round to nearest even, as ggml's `GGML_CPU_FP32_TO_FP16`). BF16 is ggml's own formula
//! (`ggml_compute_fp32_to_bf16`): NaNs keep their top bits and are forced quiet, everything
//! else rounds to nearest even.
//!
//! The dot products follow the shape of ggml's SIMD `ggml_vec_dot_f32/f16/bf16`: products
//! summed in 32 f32 lanes, the lanes reduced at the end (ggml reduces pairwise and adds the
//! leftovers in double; the difference is a rounding-level one).

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Elements converted per step of the F16 paths (stack buffers).
const CHUNK: usize = 64;
/// Accumulator lanes of the dot products.
const LANES: usize = 32;

#[inline(always)]
pub(super) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(4).zip(dst.iter_mut()) {
        if let Some(b) = b.first_chunk::<4>() {
            *out = f32::from_le_bytes(*b);
        }
    }
}

#[inline(always)]
pub(super) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(4)) {
        out.copy_from_slice(&x.to_le_bytes());
    }
}

/// `n` little-endian u16 from bytes into a buffer (no alignment needed on `src`).
#[inline(always)]
fn load_u16(src: &[u8], out: &mut [u16]) {
    for (b, o) in src.chunks_exact(2).zip(out.iter_mut()) {
        if let Some(b) = b.first_chunk::<2>() {
            *o = u16::from_le_bytes(*b);
        }
    }
}

#[inline(always)]
pub(super) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    let mut bits = [0u16; CHUNK];
    for (s, d) in src.chunks(2 * CHUNK).zip(dst.chunks_mut(CHUNK)) {
        let bits = &mut bits[..d.len()];
        load_u16(s, bits);
        bits.reinterpret_cast::<f16>().convert_to_f32_slice(d);
    }
}

#[inline(always)]
pub(super) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    let mut halves = [f16::ZERO; CHUNK];
    for (s, d) in src.chunks(CHUNK).zip(dst.chunks_mut(2 * CHUNK)) {
        let halves = &mut halves[..s.len()];
        halves.convert_from_f32_slice(s);
        for (h, o) in halves.iter().zip(d.chunks_exact_mut(2)) {
            o.copy_from_slice(&h.to_le_bytes());
        }
    }
}

/// ggml's `GGML_BF16_TO_FP32`.
#[inline(always)]
pub(super) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// ggml's `GGML_FP32_TO_BF16` (`ggml_compute_fp32_to_bf16`).
#[inline(always)]
pub(super) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        // NaN: keep the top bits, force it quiet
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
pub(super) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(2).zip(dst.iter_mut()) {
        if let Some(b) = b.first_chunk::<2>() {
            *out = bf16_to_f32(u16::from_le_bytes(*b));
        }
    }
}

#[inline(always)]
pub(super) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
        out.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}

/// Sums `a[i] * b[i]` in [`LANES`] f32 lanes, then reduces the lanes.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32], acc: &mut [f32; LANES]) {
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] += x * y;
    }
}

#[inline(always)]
fn reduce(acc: &[f32; LANES]) -> f32 {
    // pairwise, like ggml's GGML_F32_VEC_REDUCE
    let mut v = *acc;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

#[inline(always)]
pub(super) fn vec_dot_f32(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; LANES];
    let (mut fx, mut fy) = ([0f32; CHUNK], [0f32; CHUNK]);
    for (sx, sy) in x.chunks(4 * CHUNK).zip(y.chunks(4 * CHUNK)) {
        let len = sx.len() / 4;
        dequantize_f32(sx, &mut fx[..len]);
        dequantize_f32(sy, &mut fy[..len]);
        dot_lanes(&fx[..len], &fy[..len], &mut acc);
    }
    reduce(&acc)
}

#[inline(always)]
pub(super) fn vec_dot_f16(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; LANES];
    let (mut fx, mut fy) = ([0f32; CHUNK], [0f32; CHUNK]);
    for (sx, sy) in x.chunks(2 * CHUNK).zip(y.chunks(2 * CHUNK)) {
        let len = sx.len() / 2;
        dequantize_f16(sx, &mut fx[..len]);
        dequantize_f16(sy, &mut fy[..len]);
        dot_lanes(&fx[..len], &fy[..len], &mut acc);
    }
    reduce(&acc)
}

#[inline(always)]
pub(super) fn vec_dot_bf16(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; LANES];
    let (mut fx, mut fy) = ([0f32; CHUNK], [0f32; CHUNK]);
    for (sx, sy) in x.chunks(2 * CHUNK).zip(y.chunks(2 * CHUNK)) {
        let len = sx.len() / 2;
        dequantize_bf16(sx, &mut fx[..len]);
        dequantize_bf16(sy, &mut fy[..len]);
        dot_lanes(&fx[..len], &fy[..len], &mut acc);
    }
    reduce(&acc)
}

/// A bf16 value as the `half` crate's type (tests compare against it).
#[cfg(test)]
pub(super) fn half_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}
