//! The plain float types: F32 (identity), F16 (IEEE binary16) and BF16 (bfloat16).
//!
//! f32 -> f16 goes through the `half` crate (F16C instructions where the CPU has them, round to
//! nearest even, as ggml's `GGML_CPU_FP32_TO_FP16`); f16 -> f32 is exact branch-free code
//! that vectorizes ([`super::f16_to_f32`]). BF16 is ggml's own formula
//! (`ggml_compute_fp32_to_bf16`): NaNs keep their top bits and are forced quiet, everything
//! else rounds to nearest even.
//!
//! The dot products follow the shape of ggml's SIMD `ggml_vec_dot_f32/f16/bf16`: products
//! fused into 32 f32 lanes (`mul_add`: one FMA where the CPU has it, as ggml's; a library
//! call on the rare x86-64 CPU without, so that every CPU gets the same bits), the lanes
//! reduced pairwise at the end (ggml adds the leftovers in double; the difference is a
//! rounding-level one).

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::f16_to_f32;

/// Elements per step of the dot products (also their accumulator lanes).
pub(super) const LANES: usize = 32;

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

#[inline(always)]
pub(super) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(2).zip(dst.iter_mut()) {
        if let Some(b) = b.first_chunk::<2>() {
            *out = f16_to_f32(u16::from_le_bytes(*b));
        }
    }
}

/// Elements per step of the F16 quantizer (a stack buffer for the `half` crate's F16C slice
/// conversion).
const CHUNK: usize = 64;

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

/// Every value rounded to F16 and widened back: [`quantize_f16`] then [`dequantize_f16`]
/// (the same conversions, so the same bits), without the bytes between them.
#[inline(always)]
pub(super) fn round_f16(values: &mut [f32]) {
    let mut halves = [f16::ZERO; CHUNK];
    for v in values.chunks_mut(CHUNK) {
        let halves = &mut halves[..v.len()];
        halves.convert_from_f32_slice(v);
        for (h, o) in halves.iter().zip(v.iter_mut()) {
            *o = f16_to_f32(h.to_bits());
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

/// Dot product of two rows of `W`-byte elements decoded by `get`: products summed in
/// [`LANES`] f32 lanes (whole steps of `LANES` elements), then [`finish_dot`].
#[inline(always)]
fn dot<const W: usize>(x: &[u8], y: &[u8], get: impl Fn([u8; W]) -> f32) -> f32 {
    lanes_dot(x, y, &get, &get)
}

/// Dot product of a row `x` of `WX`-byte elements decoded by `gx` with a row `y` of `WY`
/// items of type `Y` per element decoded by `gy` (bytes, or values already widened to f32:
/// `WY = 1`): products summed in [`LANES`] f32 lanes (whole steps of `LANES` elements), then
/// [`finish_dot`]. Every decoding gives the same products in the same order, so the same bits.
#[inline(always)]
pub(super) fn lanes_dot<const WX: usize, const WY: usize, Y: Copy>(
    x: &[u8],
    y: &[Y],
    gx: impl Fn([u8; WX]) -> f32,
    gy: impl Fn([Y; WY]) -> f32,
) -> f32 {
    let mut acc = [0f32; LANES];
    let mut cx = x.chunks_exact(WX * LANES);
    let mut cy = y.chunks_exact(WY * LANES);
    for (bx, by) in (&mut cx).zip(&mut cy) {
        let mut vx = [0f32; LANES];
        let mut vy = [0f32; LANES];
        for (v, b) in vx.iter_mut().zip(bx.chunks_exact(WX)) {
            if let Some(b) = b.first_chunk::<WX>() {
                *v = gx(*b);
            }
        }
        for (v, b) in vy.iter_mut().zip(by.chunks_exact(WY)) {
            if let Some(b) = b.first_chunk::<WY>() {
                *v = gy(*b);
            }
        }
        for l in 0..LANES {
            acc[l] = vx[l].mul_add(vy[l], acc[l]);
        }
    }
    finish_dot(acc, cx.remainder(), cy.remainder(), gx, gy)
}

/// The end of the float dot products: the tail (fewer than [`LANES`] elements, decoded as in
/// [`lanes_dot`]) added into the first lanes, then the lanes reduced pairwise as ggml's
/// `GGML_F32_VEC_REDUCE`.
#[inline(always)]
pub(super) fn finish_dot<const WX: usize, const WY: usize, Y: Copy>(
    mut acc: [f32; LANES],
    x_tail: &[u8],
    y_tail: &[Y],
    gx: impl Fn([u8; WX]) -> f32,
    gy: impl Fn([Y; WY]) -> f32,
) -> f32 {
    let tail = x_tail.chunks_exact(WX).zip(y_tail.chunks_exact(WY));
    for (a, (bx, by)) in acc.iter_mut().zip(tail) {
        if let (Some(bx), Some(by)) = (bx.first_chunk::<WX>(), by.first_chunk::<WY>()) {
            *a = gx(*bx).mul_add(gy(*by), *a);
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `vec_dot_f16` of F16 row `x` with an F16 row given as its f32 values `y` (exact
/// widenings): the same lanes, products and sums, so the same bits.
#[inline(always)]
pub(super) fn vec_dot_f16_widened(x: &[u8], y: &[f32]) -> f32 {
    lanes_dot(x, y, get_f16, |[v]: [f32; 1]| v)
}

/// `vec_dot_f32` of F32 row `x` (little-endian bytes) with the values `y`: the same bits.
#[inline(always)]
pub(super) fn vec_dot_f32_widened(x: &[u8], y: &[f32]) -> f32 {
    lanes_dot(x, y, f32::from_le_bytes, |[v]: [f32; 1]| v)
}

/// An f16 element.
#[inline(always)]
pub(super) fn get_f16(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

#[inline(always)]
pub(super) fn vec_dot_f32(x: &[u8], y: &[u8]) -> f32 {
    dot::<4>(x, y, f32::from_le_bytes)
}

#[inline(always)]
pub(super) fn vec_dot_f16(x: &[u8], y: &[u8]) -> f32 {
    dot::<2>(x, y, get_f16)
}

#[inline(always)]
pub(super) fn vec_dot_bf16(x: &[u8], y: &[u8]) -> f32 {
    dot::<2>(x, y, |b| bf16_to_f32(u16::from_le_bytes(b)))
}

/// A bf16 value as the `half` crate's type (tests compare against it).
#[cfg(test)]
pub(super) fn half_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}
