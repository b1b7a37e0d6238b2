//! TQ1_0 and TQ2_0: ternary weights (-1, 0, +1 times one f16 scale per 256 elements, as in
//! BitNet b1.58 and TriLMs).
//!
//! ```text
//! block_tq1_0 (54 bytes): qs: [u8; 48] | qh: [u8; 4] | d: f16   5 trits per qs byte, 4 per qh byte
//! block_tq2_0 (66 bytes): qs: [u8; 64] | d: f16                  2 bits per element, q - 1
//! ```
//! TQ1_0 stores trits base 3 as a fixed-point fraction: a byte `b` holds trits `t0..t4` as
//! `b = ceil((t0*81 + t1*27 + t2*9 + t3*3 + t4) * 256 / 243)`, and trit `n` is read back as
//! `((b * 3^n mod 256) * 3) >> 8`. Element order: `qs[m]` (m < 32) holds elements
//! `m + 32n`, n = 0..5; `qs[32 + m]` (m < 16) holds `160 + m + 16n`; `qh[j]` holds
//! `240 + j + 4n`, n = 0..4 (its fifth trit is always 0). TQ2_0: `qs[32h + m]` holds elements
//! `128h + 32l + m` in bits `2l..2l+2`. Activations for both dot products are Q8_K (ggml-cpu's
//! `vec_dot_type`).
//!
//! Follows ggml b11434: `dequantize_row_tq1_0` / `_tq2_0` and `quantize_row_tq1_0_ref` /
//! `_tq2_0_ref` (`ggml-quants.c`; also ggml-cpu's `from_float`), bit-exact, and
//! `ggml_vec_dot_tq1_0_q8_K_generic` / `ggml_vec_dot_tq2_0_q8_K_generic`
//! (`ggml-cpu/quants.c`): one exact integer sum per super-block, scaled by `d * d8`.

use super::q8::Q8_K_BYTES;
use super::{fp16, fp16_bytes, QK_K};

/// Bytes of a `block_tq1_0`.
pub(super) const TQ1_0_BYTES: usize = 54;
/// Bytes of a `block_tq2_0`.
pub(super) const TQ2_0_BYTES: usize = 66;

/// `qs` bytes of a `block_tq1_0`, the first 32 of them holding 32-element rows of trits.
const TQ1_QS: usize = 48;
/// `qh` bytes of a `block_tq1_0`.
const TQ1_QH: usize = 4;

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` (0, 1 or 2) of a TQ1_0 byte.
#[inline(always)]
fn trit(b: u8, n: usize) -> i32 {
    let q = b.wrapping_mul(POW3[n]);
    i32::from((u16::from(q) * 3) >> 8)
}

/// The element index of trit `n` of TQ1_0 byte `byte` (`qs` bytes first, then `qh`).
#[inline(always)]
fn tq1_element(byte: usize, n: usize) -> usize {
    if byte < 32 {
        byte + 32 * n
    } else if byte < TQ1_QS {
        160 + (byte - 32) + 16 * n
    } else {
        240 + (byte - TQ1_QS) + TQ1_QH * n
    }
}

/// Trits per TQ1_0 byte: five in `qs`, four in `qh`.
#[inline(always)]
fn tq1_trits(byte: usize) -> usize {
    if byte < TQ1_QS {
        5
    } else {
        4
    }
}

/// C's `lroundf` as glibc on x86-64 gives it (round half away from zero; NaN and values out of
/// `long`'s range give `LONG_MIN`), then truncated to `int` as ggml's `int xi = lroundf(..)`.
#[inline(always)]
fn c_lroundf_int(f: f32) -> i32 {
    const LONG_RANGE: f32 = 9_223_372_036_854_775_808.0; // 2^63
    if !(-LONG_RANGE..LONG_RANGE).contains(&f) {
        i64::MIN as i32
    } else {
        (f.round() as i64) as i32
    }
}

/// ggml's `amax = MAX(amax, |v|)` over a super-block (`a > b ? a : b`: a NaN is taken when
/// met, and replaced by the next element's magnitude).
#[inline(always)]
fn c_amax(x: &[f32]) -> f32 {
    x.iter().fold(
        0.0f32,
        |amax, v| if amax > v.abs() { amax } else { v.abs() },
    )
}

/// `dequantize_row_tq1_0`: `(trit - 1) * d`.
pub(super) fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(TQ1_0_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[52], b[53]);
        for (byte, &v) in b[..TQ1_QS + TQ1_QH].iter().enumerate() {
            for n in 0..tq1_trits(byte) {
                out[tq1_element(byte, n)] = (trit(v, n) - 1) as f32 * d;
            }
        }
    }
}

/// `quantize_row_tq1_0_ref`: `d = amax`, each element rounded to -1, 0 or 1 times `d` and
/// packed base 3 (see the module docs).
pub(super) fn quantize_tq1_0_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(TQ1_0_BYTES))
    {
        let d = c_amax(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[52..54].copy_from_slice(&fp16_bytes(d));
        for byte in 0..TQ1_QS + TQ1_QH {
            let mut q = 0u8;
            for n in 0..tq1_trits(byte) {
                let xi = c_lroundf_int(x[tq1_element(byte, n)] * id).wrapping_add(1);
                q = (i32::from(q) * 3).wrapping_add(xi) as u8;
            }
            if byte >= TQ1_QS {
                // the first trit goes to the most significant place
                q = q.wrapping_mul(3);
            }
            b[byte] = (u32::from(q) * 256).div_ceil(243) as u8;
        }
    }
}

/// `ggml_vec_dot_tq1_0_q8_K_generic`.
pub(super) fn vec_dot_tq1_0_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(TQ1_0_BYTES).zip(y.chunks_exact(Q8_K_BYTES)) {
        let mut sum = 0i32;
        for (byte, &v) in bx[..TQ1_QS + TQ1_QH].iter().enumerate() {
            for n in 0..tq1_trits(byte) {
                let q8 = i32::from(by[4 + tq1_element(byte, n)] as i8);
                sum += (trit(v, n) - 1) * q8;
            }
        }
        let d8 = f32::from_le_bytes([by[0], by[1], by[2], by[3]]);
        sumf += sum as f32 * (fp16(bx[52], bx[53]) * d8);
    }
    sumf
}

/// `dequantize_row_tq2_0`: `(q - 1) * d`.
pub(super) fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(TQ2_0_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16(b[64], b[65]);
        for (h, y) in out.chunks_exact_mut(128).enumerate() {
            for l in 0..4 {
                for m in 0..32 {
                    let q = i32::from((b[32 * h + m] >> (2 * l)) & 3);
                    y[32 * l + m] = (q - 1) as f32 * d;
                }
            }
        }
    }
}

/// `quantize_row_tq2_0_ref`: `d = amax`, each element rounded to -1, 0 or 1 times `d`, stored
/// as `q + 1` in two bits.
pub(super) fn quantize_tq2_0_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(TQ2_0_BYTES))
    {
        let d = c_amax(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[64..66].copy_from_slice(&fp16_bytes(d));
        for (h, xh) in x.chunks_exact(128).enumerate() {
            for m in 0..32 {
                let mut q = 0u8;
                for n in 0..4 {
                    let xi = c_lroundf_int(xh[m + 32 * n] * id).wrapping_add(1);
                    q = q.wrapping_add(((xi & 3) << (2 * n)) as u8);
                }
                b[32 * h + m] = q;
            }
        }
    }
}

/// `ggml_vec_dot_tq2_0_q8_K_generic`.
pub(super) fn vec_dot_tq2_0_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(TQ2_0_BYTES).zip(y.chunks_exact(Q8_K_BYTES)) {
        let mut sumi = 0i32;
        for h in 0..2 {
            for l in 0..4 {
                for m in 0..32 {
                    let q8 = i32::from(by[4 + 128 * h + 32 * l + m] as i8);
                    let q = i32::from((bx[32 * h + m] >> (2 * l)) & 3);
                    sumi += q8 * (q - 1);
                }
            }
        }
        let d = f32::from_le_bytes([by[0], by[1], by[2], by[3]]) * fp16(bx[64], bx[65]);
        sumf += sumi as f32 * d;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every base-3 digit string round-trips through ggml's fixed-point packing.
    #[test]
    fn trits_round_trip_through_the_packing() {
        for v in 0u32..243 {
            let b = (v * 256).div_ceil(243) as u8;
            let mut r = 0u32;
            for n in 0..5 {
                r = r * 3 + trit(b, n) as u32;
            }
            assert_eq!(r, v);
        }
        let mut seen = [false; QK_K];
        for byte in 0..TQ1_QS + TQ1_QH {
            for n in 0..tq1_trits(byte) {
                assert!(!std::mem::replace(&mut seen[tq1_element(byte, n)], true));
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(c_lroundf_int(2.5), 3);
        assert_eq!(c_lroundf_int(-0.5), -1);
        assert_eq!(c_lroundf_int(f32::NAN), 0);
    }
}
