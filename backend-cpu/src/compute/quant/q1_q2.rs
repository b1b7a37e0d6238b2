//! Q1_0 and Q2_0: 1-bit (sign) and 2-bit weights with one f16 scale per block.
//!
//! ```text
//! block_q1_0 (18 bytes, 128 elements): d: f16 | qs: [u8; 16]   w = bit ? d : -d
//! block_q2_0 (18 bytes,  64 elements): d: f16 | qs: [u8; 16]   w = (q - 1) * d, q in 0..4
//! ```
//! Element `j` is bit `j % 8` of `qs[j / 8]` (Q1_0), bits `2 * (j % 4)..` of `qs[j / 4]`
//! (Q2_0). Activations for both dot products are Q8_0 (ggml-cpu's `vec_dot_type`): four Q8_0
//! blocks per Q1_0 block, two per Q2_0 block.
//!
//! Follows ggml b11434: `dequantize_row_q1_0` / `_q2_0` and `quantize_row_q1_0_ref` /
//! `_q2_0_ref` (`ggml-quants.c`; also ggml-cpu's `from_float`), bit-exact, and
//! `ggml_vec_dot_q1_0_q8_0_generic` / `ggml_vec_dot_q2_0_q8_0_generic` (`ggml-cpu/quants.c`):
//! exact integer sums per Q8_0 block, scaled by the Q8_0 block's `d` and summed in f32 per
//! weight block, then scaled by the weight block's `d`.

use super::q8::Q8_0_BYTES;
use super::{fp16, fp16_bytes, QK32};

/// Elements per `block_q1_0` (`QK1_0`).
pub(super) const QK1_0: usize = 128;
/// Bytes of a `block_q1_0`.
pub(super) const Q1_0_BYTES: usize = 18;
/// Elements per `block_q2_0` (`QK2_0`).
pub(super) const QK2_0: usize = 64;
/// Bytes of a `block_q2_0`.
pub(super) const Q2_0_BYTES: usize = 18;

/// C's `(int) f` as x86-64 compiles it: truncation, `INT_MIN` for NaN and out-of-range values.
#[inline(always)]
fn c_float_to_int(f: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        i32::MIN
    } else {
        f as i32
    }
}

/// `dequantize_row_q1_0`: `d` where the bit is set, `-d` where not.
pub(super) fn dequantize_q1_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(Q1_0_BYTES)
        .zip(dst.chunks_exact_mut(QK1_0))
    {
        let d = fp16(b[0], b[1]);
        for (j, y) in out.iter_mut().enumerate() {
            *y = if (b[2 + j / 8] >> (j % 8)) & 1 != 0 {
                d
            } else {
                -d
            };
        }
    }
}

/// `quantize_row_q1_0_ref`: `d` the mean magnitude (summed in element order), a bit per
/// element set for `x >= 0`.
pub(super) fn quantize_q1_0_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK1_0)
        .zip(dst.chunks_exact_mut(Q1_0_BYTES))
    {
        let sum_abs = x.iter().fold(0.0f32, |s, v| s + v.abs());
        b[..2].copy_from_slice(&fp16_bytes(sum_abs / QK1_0 as f32));
        for (byte, xs) in b[2..].iter_mut().zip(x.chunks_exact(8)) {
            *byte = xs
                .iter()
                .enumerate()
                .fold(0u8, |acc, (k, &v)| acc | (u8::from(v >= 0.0) << k));
        }
    }
}

/// `ggml_vec_dot_q1_0_q8_0_generic`.
pub(super) fn vec_dot_q1_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x
        .chunks_exact(Q1_0_BYTES)
        .zip(y.chunks_exact(4 * Q8_0_BYTES))
    {
        let mut sumi = 0.0f32;
        for (k, yb) in by.chunks_exact(Q8_0_BYTES).enumerate() {
            let mut block = 0i32;
            for j in 0..QK32 {
                let q = i32::from(yb[2 + j] as i8);
                block += if (bx[2 + 4 * k + j / 8] >> (j % 8)) & 1 != 0 {
                    q
                } else {
                    -q
                };
            }
            sumi += fp16(yb[0], yb[1]) * block as f32;
        }
        sumf += fp16(bx[0], bx[1]) * sumi;
    }
    sumf
}

/// The 2-bit code of element `j` of a Q2_0 block.
#[inline(always)]
fn q2(b: &[u8], j: usize) -> i32 {
    i32::from((b[2 + j / 4] >> (2 * (j % 4))) & 3)
}

/// `dequantize_row_q2_0`: `(q - 1) * d`.
pub(super) fn dequantize_q2_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(Q2_0_BYTES)
        .zip(dst.chunks_exact_mut(QK2_0))
    {
        let d = fp16(b[0], b[1]);
        for (j, y) in out.iter_mut().enumerate() {
            *y = (q2(b, j) - 1) as f32 * d;
        }
    }
}

/// `quantize_row_q2_0_ref`: `d = amax`, `q = round(x / d) + 1` clamped to 0..=3.
pub(super) fn quantize_q2_0_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK2_0)
        .zip(dst.chunks_exact_mut(Q2_0_BYTES))
    {
        let mut amax = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
            }
        }
        let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
        b[..2].copy_from_slice(&fp16_bytes(amax));
        for (byte, xs) in b[2..].iter_mut().zip(x.chunks_exact(4)) {
            let mut acc = 0u8;
            for (k, &v) in xs.iter().enumerate() {
                let q = c_float_to_int((v * id).round()).wrapping_add(1).clamp(0, 3);
                acc |= (q as u8) << (2 * k);
            }
            *byte = acc;
        }
    }
}

/// `ggml_vec_dot_q2_0_q8_0_generic`.
pub(super) fn vec_dot_q2_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x
        .chunks_exact(Q2_0_BYTES)
        .zip(y.chunks_exact(2 * Q8_0_BYTES))
    {
        let mut sumi = 0.0f32;
        for (k, yb) in by.chunks_exact(Q8_0_BYTES).enumerate() {
            let mut block = 0i32;
            for j in 0..QK32 {
                block += (q2(bx, QK32 * k + j) - 1) * i32::from(yb[2 + j] as i8);
            }
            sumi += fp16(yb[0], yb[1]) * block as f32;
        }
        sumf += fp16(bx[0], bx[1]) * sumi;
    }
    sumf
}
