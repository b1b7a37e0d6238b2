//! MXFP4 and NVFP4: 4-bit E2M1 floating-point weights with power-of-two (MXFP4) or E4M3
//! (NVFP4) block scales.
//!
//! ```text
//! block_mxfp4 (17 bytes): e: u8 (E8M0)      | qs: [u8; 16]   w = 2^(e-128) * FP4[q]
//! block_nvfp4 (36 bytes): d: [u8; 4] (UE4M3) | qs: [u8; 32]   w = ue4m3(d[s]) / 2 * FP4[q]
//! ```
//! [`FP4`] holds the E2M1 values doubled (so they are integers); the scales are halved to make
//! up for it, as in ggml. MXFP4: element `j < 16` of a 32-element block is the low nibble of
//! `qs[j]`, element `j + 16` its high nibble. NVFP4: a 64-element block is four 16-element
//! sub-blocks with a scale each; within sub-block `s`, element `j < 8` is the low nibble of
//! `qs[8s + j]` and element `j + 8` its high nibble. Activations for both dot products are Q8_0
//! (ggml-cpu's `vec_dot_type`).
//!
//! Follows ggml b11434: `dequantize_row_mxfp4` / `_nvfp4` and `quantize_row_mxfp4_ref` /
//! `_nvfp4_ref` (`ggml-quants.c`; also ggml-cpu's `from_float`), bit-exact, with the scale
//! conversions of `ggml-impl.h` (`ggml_e8m0_to_fp32_half`, `ggml_ue4m3_to_fp32`,
//! `ggml_fp32_to_ue4m3`), and `ggml_vec_dot_mxfp4_q8_0_generic` /
//! `ggml_vec_dot_nvfp4_q8_0_generic` (`ggml-cpu/quants.c`): exact integer sums per (sub-)block,
//! scaled and summed in f32 in block order.

use super::q8::Q8_0_BYTES;
use super::{fp16, QK32};

/// Bytes of a `block_mxfp4`.
pub(super) const MXFP4_BYTES: usize = 17;
/// Elements per `block_nvfp4` (`QK_NVFP4`).
pub(super) const QK_NVFP4: usize = 64;
/// Bytes of a `block_nvfp4`.
pub(super) const NVFP4_BYTES: usize = 36;

/// Elements per NVFP4 sub-block (`QK_NVFP4_SUB`), each with its own scale.
const NVFP4_SUB: usize = 16;

/// ggml's `kvalues_fp4` (= `kvalues_mxfp4`): the 16 E2M1 values, doubled.
const FP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

const HALF: usize = QK32 / 2;

/// `ggml_e8m0_to_fp32_half`: `2^(e - 128)`, the E8M0 scale halved (subnormal for `e < 2`).
#[inline(always)]
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// `ggml_ue4m3_to_fp32`: an unsigned E4M3 scale (bias 7, three mantissa bits), halved. `0` and
/// `0x7F` give zero; the top bit is ignored (as in ggml, which masks the exponent to 4 bits).
/// Every value is exact in f32, so the arithmetic order does not matter.
#[inline(always)]
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0x0F);
    let man = f32::from(x & 0x07);
    let raw = if exp == 0 {
        man * 2f32.powi(-9)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    raw * 0.5
}

/// `ggml_fp32_to_ue4m3`: truncating conversion with one round bit (no ties-to-even), clamped
/// to 448 (`0x7E`); non-positive values and NaN give 0.
fn fp32_to_ue4m3(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let fp32_exp = ((bits >> 23) & 0xFF) as i32 - 127;
    let fp32_man = ((bits >> 20) & 0x7) as i32;
    let mut exp = fp32_exp + 7;
    if exp <= 0 {
        // subnormal: man * 2^-9, man = round(x * 2^9) (x < 2^-6 here, so no overflow)
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7E;
    }
    let mut man = fp32_man + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7E;
        }
    }
    ((exp << 3) | man) as u8
}

/// ggml's `best_index_mxfp4`: the first index whose `FP4[i] * d` is nearest to `x` (0 for
/// NaN).
#[inline(always)]
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (f32::from(FP4[0]) * d - x).abs();
    for (i, &v) in FP4.iter().enumerate().skip(1) {
        let err = (f32::from(v) * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// C's `(uint8_t) f` as x86-64 compiles it (truncation to a 32-bit integer, low byte kept;
/// NaN and out-of-range values become `INT_MIN`, whose low byte is 0).
#[inline(always)]
fn c_float_to_u8(f: f32) -> u8 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        0
    } else {
        (f as i32) as u8
    }
}

/// `dequantize_row_mxfp4`: `FP4[q] * 2^(e-128)`.
pub(super) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(MXFP4_BYTES)
        .zip(dst.chunks_exact_mut(QK32))
    {
        let d = e8m0_half(b[0]);
        for j in 0..HALF {
            let q = b[1 + j];
            out[j] = f32::from(FP4[usize::from(q & 0x0F)]) * d;
            out[j + HALF] = f32::from(FP4[usize::from(q >> 4)]) * d;
        }
    }
}

/// `quantize_row_mxfp4_ref`: `e = floor(log2(amax)) - 2 + 127` (so the largest magnitude lands
/// in the top binade of E2M1; 0 for an all-zero block), each value to the nearest of
/// `FP4[i] * 2^(e-128)`.
pub(super) fn quantize_mxfp4_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK32)
        .zip(dst.chunks_exact_mut(MXFP4_BYTES))
    {
        let mut amax = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        let e = if amax > 0.0 {
            c_float_to_u8(amax.log2().floor() - 2.0 + 127.0)
        } else {
            0
        };
        let d = e8m0_half(e);
        b[0] = e;
        for j in 0..HALF {
            b[1 + j] = best_index(x[j], d) | (best_index(x[j + HALF], d) << 4);
        }
    }
}

/// `ggml_vec_dot_mxfp4_q8_0_generic`.
pub(super) fn vec_dot_mxfp4_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(MXFP4_BYTES).zip(y.chunks_exact(Q8_0_BYTES)) {
        let d = fp16(by[0], by[1]) * e8m0_half(bx[0]);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for j in 0..HALF {
            let q = bx[1 + j];
            sumi1 += i32::from(by[2 + j] as i8) * i32::from(FP4[usize::from(q & 0x0F)]);
            sumi2 += i32::from(by[2 + j + HALF] as i8) * i32::from(FP4[usize::from(q >> 4)]);
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}

/// `dequantize_row_nvfp4`: `FP4[q] * ue4m3(d[s]) / 2` per 16-element sub-block.
pub(super) fn dequantize_nvfp4(src: &[u8], dst: &mut [f32]) {
    const SUB_HALF: usize = NVFP4_SUB / 2;
    for (b, out) in src
        .chunks_exact(NVFP4_BYTES)
        .zip(dst.chunks_exact_mut(QK_NVFP4))
    {
        for (s, yb) in out.chunks_exact_mut(NVFP4_SUB).enumerate() {
            let d = ue4m3_half(b[s]);
            for j in 0..SUB_HALF {
                let q = b[4 + s * SUB_HALF + j];
                yb[j] = f32::from(FP4[usize::from(q & 0x0F)]) * d;
                yb[j + SUB_HALF] = f32::from(FP4[usize::from(q >> 4)]) * d;
            }
        }
    }
}

/// `quantize_row_nvfp4_ref`: per 16-element sub-block the UE4M3 scale of `amax / 6` (6 being
/// the largest E2M1 magnitude), then each value to the nearest of `FP4[i] * scale / 2`.
pub(super) fn quantize_nvfp4_ref(src: &[f32], dst: &mut [u8]) {
    const SUB_HALF: usize = NVFP4_SUB / 2;
    for (x, b) in src
        .chunks_exact(QK_NVFP4)
        .zip(dst.chunks_exact_mut(NVFP4_BYTES))
    {
        for (s, xb) in x.chunks_exact(NVFP4_SUB).enumerate() {
            let mut amax = 0.0f32;
            for &v in xb {
                if amax < v.abs() {
                    amax = v.abs();
                }
            }
            let ue = fp32_to_ue4m3(amax / 6.0);
            b[s] = ue;
            let d = ue4m3_half(ue);
            for j in 0..SUB_HALF {
                b[4 + s * SUB_HALF + j] =
                    best_index(xb[j], d) | (best_index(xb[j + SUB_HALF], d) << 4);
            }
        }
    }
}

/// `ggml_vec_dot_nvfp4_q8_0_generic`: each 16-element sub-block against its half of a Q8_0
/// block, `dy * d * sum` added in sub-block order.
pub(super) fn vec_dot_nvfp4_q8_0(x: &[u8], y: &[u8]) -> f32 {
    const SUB_HALF: usize = NVFP4_SUB / 2;
    let mut sumf = 0.0f32;
    for (bx, by) in x
        .chunks_exact(NVFP4_BYTES)
        .zip(y.chunks_exact(2 * Q8_0_BYTES))
    {
        for s in 0..4 {
            let d = ue4m3_half(bx[s]);
            let yb = &by[(s / 2) * Q8_0_BYTES..(s / 2 + 1) * Q8_0_BYTES];
            let off = 2 + (s % 2) * NVFP4_SUB;
            let dy = fp16(yb[0], yb[1]);
            let (mut lo, mut hi) = (0i32, 0i32);
            for j in 0..SUB_HALF {
                let q = bx[4 + s * SUB_HALF + j];
                lo += i32::from(yb[off + j] as i8) * i32::from(FP4[usize::from(q & 0x0F)]);
                hi += i32::from(yb[off + j + SUB_HALF] as i8) * i32::from(FP4[usize::from(q >> 4)]);
            }
            sumf += dy * d * (lo + hi) as f32;
        }
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_conversions_match_ggml_definitions() {
        assert_eq!(e8m0_half(0), f32::from_bits(0x0020_0000)); // 2^-128
        assert_eq!(e8m0_half(1), f32::from_bits(0x0040_0000)); // 2^-127
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(255), 2f32.powi(127));
        assert_eq!(ue4m3_half(0x38), 0.5); // 1.0 halved
        assert_eq!(ue4m3_half(0x7E), 224.0); // 448 halved
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-10));
        assert_eq!(ue4m3_half(0x7F), 0.0);
        // every UE4M3 value below 2^8 converts back to itself (ggml saturates exponent 15 to
        // 0x7E)
        for x in 1u8..0x78 {
            assert_eq!(fp32_to_ue4m3(2.0 * ue4m3_half(x)), x, "{x:#x}");
        }
        assert_eq!(fp32_to_ue4m3(256.0), 0x7E);
        assert_eq!(fp32_to_ue4m3(1e9), 0x7E);
        assert_eq!(fp32_to_ue4m3(-1.0), 0);
        assert_eq!(fp32_to_ue4m3(f32::NAN), 0);
        assert_eq!(fp32_to_ue4m3(1e-30), 0);
        assert_eq!(c_float_to_u8(-8.0), 248);
        assert_eq!(c_float_to_u8(f32::INFINITY), 0);
    }
}
