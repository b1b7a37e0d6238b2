//! Q5_0 and Q5_1: 32 weights per block, 5 bits each (4 in `qs`, the fifth in `qh`).
//!
//! ```text
//! block_q5_0 (22 bytes): d: f16 | qh: u32 (LE) | qs: [u8; 16]            w = (q - 16) * d
//! block_q5_1 (24 bytes): d: f16 | m: f16 | qh: u32 (LE) | qs: [u8; 16]   w = q * d + m
//! ```
//! Element `j < 16` is the low nibble of `qs[j]` plus bit `j` of `qh` as its bit 4; element
//! `j + 16` the high nibble plus bit `j + 16`.

use super::q4::min_max;
use super::q8::{Q8_0_BYTES, Q8_1_BYTES};
use super::{fp16, fp16_bytes, QK32};

/// Bytes of a `block_q5_0`.
pub(super) const Q5_0_BYTES: usize = 22;
/// Bytes of a `block_q5_1`.
pub(super) const Q5_1_BYTES: usize = 24;

const HALF: usize = QK32 / 2;

/// The 32 unsigned 5-bit values of a block, from its `qh` and `qs`.
#[inline(always)]
fn unpack(qh: [u8; 4], qs: &[u8]) -> [u8; QK32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK32];
    for (j, &b) in qs.iter().take(HALF).enumerate() {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        q[j] = (b & 0x0F) | h0;
        q[j + HALF] = (b >> 4) | h1;
    }
    q
}

#[inline(always)]
pub(super) fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(Q5_0_BYTES).zip(dst.chunks_exact_mut(QK32)) {
        let (Some(b), Some(out)) = (b.first_chunk::<Q5_0_BYTES>(), out.first_chunk_mut::<QK32>())
        else {
            break;
        };
        let d = fp16(b[0], b[1]);
        let q = unpack([b[2], b[3], b[4], b[5]], &b[6..]);
        for j in 0..QK32 {
            out[j] = (i32::from(q[j]) - 16) as f32 * d;
        }
    }
}

#[inline(always)]
pub(super) fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(Q5_1_BYTES).zip(dst.chunks_exact_mut(QK32)) {
        let (Some(b), Some(out)) = (b.first_chunk::<Q5_1_BYTES>(), out.first_chunk_mut::<QK32>())
        else {
            break;
        };
        let d = fp16(b[0], b[1]);
        let m = fp16(b[2], b[3]);
        let q = unpack([b[4], b[5], b[6], b[7]], &b[8..]);
        for j in 0..QK32 {
            out[j] = f32::from(q[j]) * d + m;
        }
    }
}

/// Packs 32 five-bit values into `qh` (returned) and `qs`.
fn pack(q: &[u8; QK32], qs: &mut [u8]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, out) in qs.iter_mut().take(HALF).enumerate() {
        let (q0, q1) = (q[j], q[j + HALF]);
        *out = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        qh |= u32::from((q0 & 0x10) >> 4) << j;
        qh |= u32::from((q1 & 0x10) >> 4) << (j + HALF);
    }
    qh.to_le_bytes()
}

/// `quantize_row_q5_0_ref`: `d = max / -16` where `max` is the value of largest magnitude,
/// `q = min(31, trunc(x / d + 16.5))`.
pub(super) fn quantize_q5_0_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK32).zip(dst.chunks_exact_mut(Q5_0_BYTES)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK32];
        for (qj, &v) in q.iter_mut().zip(x) {
            *qj = ((v * id + 16.5) as i8).min(31) as u8;
        }
        b[..2].copy_from_slice(&fp16_bytes(d));
        let qh = pack(&q, &mut b[6..]);
        b[2..6].copy_from_slice(&qh);
    }
}

/// `quantize_row_q5_1_ref`: `d = (max - min) / 31`, `m = min`,
/// `q = trunc((x - min) / d + 0.5)` (as `uint8_t`, no clamp).
pub(super) fn quantize_q5_1_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK32).zip(dst.chunks_exact_mut(Q5_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK32];
        for (qj, &v) in q.iter_mut().zip(x) {
            *qj = ((v - min) * id + 0.5) as u8;
        }
        b[..2].copy_from_slice(&fp16_bytes(d));
        b[2..4].copy_from_slice(&fp16_bytes(min));
        let qh = pack(&q, &mut b[8..]);
        b[4..8].copy_from_slice(&qh);
    }
}

/// Integer part of one Q5 block against a Q8 block's 32 quants: `sum((q - offset) * y)`.
#[inline(always)]
fn block_dot(q: &[u8; QK32], y: &[u8], offset: i32) -> i32 {
    let mut sum0 = 0i32;
    let mut sum1 = 0i32;
    for (j, &yj) in y.iter().take(HALF).enumerate() {
        sum0 += (i32::from(q[j]) - offset) * i32::from(yj as i8);
    }
    for (j, &yj) in y.iter().skip(HALF).take(HALF).enumerate() {
        sum1 += (i32::from(q[j + HALF]) - offset) * i32::from(yj as i8);
    }
    sum0 + sum1
}

/// `ggml_vec_dot_q5_0_q8_0_generic`: `sumf += (dx * dy) * sumi`.
#[inline(always)]
pub(super) fn vec_dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (xb, yb) in x.chunks_exact(Q5_0_BYTES).zip(y.chunks_exact(Q8_0_BYTES)) {
        let (Some(xb), Some(yb)) = (
            xb.first_chunk::<Q5_0_BYTES>(),
            yb.first_chunk::<Q8_0_BYTES>(),
        ) else {
            break;
        };
        let q = unpack([xb[2], xb[3], xb[4], xb[5]], &xb[6..]);
        let sumi = block_dot(&q, &yb[2..], 16);
        sumf += (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1])) * sumi as f32;
    }
    sumf
}

/// `ggml_vec_dot_q5_1_q8_1_generic`: `sumf += (dx * dy) * sumi + m * s`.
#[inline(always)]
pub(super) fn vec_dot_q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (xb, yb) in x.chunks_exact(Q5_1_BYTES).zip(y.chunks_exact(Q8_1_BYTES)) {
        let (Some(xb), Some(yb)) = (
            xb.first_chunk::<Q5_1_BYTES>(),
            yb.first_chunk::<Q8_1_BYTES>(),
        ) else {
            break;
        };
        let q = unpack([xb[4], xb[5], xb[6], xb[7]], &xb[8..]);
        let sumi = block_dot(&q, &yb[4..], 0);
        sumf += (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1])) * sumi as f32
            + fp16(xb[2], xb[3]) * fp16(yb[2], yb[3]);
    }
    sumf
}
