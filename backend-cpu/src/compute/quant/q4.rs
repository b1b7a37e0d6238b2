//! Q4_0 and Q4_1: 32 weights per block, 4 bits each.
//!
//! ```text
//! block_q4_0 (18 bytes): d: f16 | qs: [u8; 16]            w = (q - 8) * d
//! block_q4_1 (20 bytes): d: f16 | m: f16 | qs: [u8; 16]   w = q * d + m
//! ```
//! Element `j < 16` is the low nibble of `qs[j]`, element `j + 16` its high nibble.

use super::q8::Q8_1_BYTES;
use super::{fp16, fp16_bytes, QK32};

/// Bytes of a `block_q4_0`.
pub(super) const Q4_0_BYTES: usize = 18;
/// Bytes of a `block_q4_1`.
pub(super) const Q4_1_BYTES: usize = 20;

const HALF: usize = QK32 / 2;

#[inline(always)]
pub(super) fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(Q4_0_BYTES).zip(dst.chunks_exact_mut(QK32)) {
        let (Some(b), Some(out)) = (b.first_chunk::<Q4_0_BYTES>(), out.first_chunk_mut::<QK32>())
        else {
            break;
        };
        let d = fp16(b[0], b[1]);
        for j in 0..HALF {
            let q = b[2 + j];
            out[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
            out[j + HALF] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }
}

#[inline(always)]
pub(super) fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(Q4_1_BYTES).zip(dst.chunks_exact_mut(QK32)) {
        let (Some(b), Some(out)) = (b.first_chunk::<Q4_1_BYTES>(), out.first_chunk_mut::<QK32>())
        else {
            break;
        };
        let d = fp16(b[0], b[1]);
        let m = fp16(b[2], b[3]);
        for j in 0..HALF {
            let q = b[4 + j];
            out[j] = f32::from(q & 0x0F) * d + m;
            out[j + HALF] = f32::from(q >> 4) * d + m;
        }
    }
}

/// `quantize_row_q4_0_ref`: `d = max / -8` where `max` is the value of largest magnitude
/// (the first one on ties), `q = min(15, trunc(x / d + 8.5))`.
pub(super) fn quantize_q4_0_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK32).zip(dst.chunks_exact_mut(Q4_0_BYTES)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&fp16_bytes(d));
        for j in 0..HALF {
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + HALF] * id + 8.5) as i8).min(15) as u8;
            b[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// `quantize_row_q4_1_ref`: `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min) / d + 0.5))`.
pub(super) fn quantize_q4_1_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK32).zip(dst.chunks_exact_mut(Q4_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&fp16_bytes(d));
        b[2..4].copy_from_slice(&fp16_bytes(min));
        for j in 0..HALF {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + HALF] - min) * id + 0.5) as i8).min(15) as u8;
            b[4 + j] = q0 | (q1 << 4);
        }
    }
}

/// ggml's block minimum and maximum (`FLT_MAX` / `-FLT_MAX` seeds, strict comparisons).
pub(super) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Q4_0 x Q8_0 row: eight exact lane sums per block, scaled by `dx * dy` into eight f32
/// lanes (the definition shared by every Q4_0 kernel, see `tiles`).
#[inline(always)]
pub(super) fn vec_dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    super::tiles::vec_dot_portable(super::tiles::Q0::Q4_0, x, y)
}

/// `ggml_vec_dot_q4_1_q8_1_generic`: `sumf += (dx * dy) * sumi + m * s`, with `s` the Q8_1
/// block's stored `d * sum(q)`.
#[inline(always)]
pub(super) fn vec_dot_q4_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (xb, yb) in x.chunks_exact(Q4_1_BYTES).zip(y.chunks_exact(Q8_1_BYTES)) {
        let (Some(xb), Some(yb)) = (
            xb.first_chunk::<Q4_1_BYTES>(),
            yb.first_chunk::<Q8_1_BYTES>(),
        ) else {
            break;
        };
        let mut sum0 = 0i32;
        let mut sum1 = 0i32;
        for j in 0..HALF {
            let q = xb[4 + j];
            sum0 += i32::from(q & 0x0F) * i32::from(yb[4 + j] as i8);
            sum1 += i32::from(q >> 4) * i32::from(yb[4 + HALF + j] as i8);
        }
        let sumi = sum0 + sum1;
        sumf += (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1])) * sumi as f32
            + fp16(xb[2], xb[3]) * fp16(yb[2], yb[3]);
    }
    sumf
}
