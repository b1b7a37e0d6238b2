//! F8_E4M3 (ggml type `f8_e4m3`, 8.0.1 / llama.cpp b12032+1): one byte per element in the
//! OCP FP8 E4M3 format: bit 7 sign, bits 6..3 exponent (bias 7), bits 2..0 mantissa; no
//! infinities, `0x7F` / `0xFF` NaN, largest finite magnitude `0x7E` = 448.
//!
//! The conversions follow `ggml_f8_e4m3_to_fp32` / `ggml_fp32_to_f8_e4m3` in
//! `ggml/src/ggml-impl.h` (b12032+1) value for value: decoding is exact (NaN decodes to the
//! positive quiet NaN ggml's `NAN` is); encoding keeps the sign of zero, maps every NaN to
//! `0x7F`, saturates infinities and everything that would round past 448 to sign | `0x7E`, and
//! rounds to nearest, ties to even (magnitudes below 2^-6 to the subnormal `round(|x| · 512)`).
//!
//! ggml-cpu's `type_traits_cpu` row: `from_float` = the reference encoder, `vec_dot` =
//! `ggml_vec_dot_f8_e4m3_f32` with `vec_dot_type` F32 (activations stay f32). The dot product
//! here sums in the 32 f32 lanes of the other float dot products (`float::lanes_dot`); ggml's
//! SIMD code fuses the multiply-adds and adds the tail after the reduction, a rounding-level
//! difference.

use super::float::lanes_dot;

/// `ggml_f8_e4m3_to_fp32`: the exact value of one E4M3 byte.
#[inline(always)]
pub(crate) fn f8_e4m3_to_f32(x: u8) -> f32 {
    let ax = x & 0x7F;
    if ax == 0x7F {
        // both NaN encodings decode to ggml's `NAN` (sign not kept)
        return f32::NAN;
    }
    let exp = u32::from(ax >> 3);
    let man = u32::from(ax & 0x7);
    let value = if exp == 0 {
        // subnormal: M · 2^-9, exact in f32
        man as f32 * (1.0 / 512.0)
    } else {
        // (1 + M/8) · 2^(E-7): the f32 with that exponent and the mantissa's top three bits
        f32::from_bits(((exp + 127 - 7) << 23) | (man << 20))
    };
    if x & 0x80 != 0 {
        -value
    } else {
        value
    }
}

/// `ggml_round_to_nearest_even` for the non-negative, small values the encoder gives it.
#[inline(always)]
fn round_to_nearest_even(x: f32) -> u32 {
    let value = x.floor();
    let fraction = x - value;
    // `x` lies in [0, 16] here, so the cast is exact
    let v = value as u32;
    if fraction > 0.5 || (fraction == 0.5 && v & 1 == 1) {
        v + 1
    } else {
        v
    }
}

/// `ggml_fp32_to_f8_e4m3`: saturating conversion, round to nearest, ties to even.
#[inline(always)]
pub(crate) fn f32_to_f8_e4m3(x: f32) -> u8 {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let x = x.abs();
    if x.is_nan() {
        return 0x7F;
    }
    if x == 0.0 {
        return sign;
    }
    if x.is_infinite() || x >= 448.0 {
        return sign | 0x7E;
    }
    if x < 0.015625 {
        // subnormal: M / 512, M in 0..=8 (8 is the smallest normal, 0x08, as the bits say)
        return sign | round_to_nearest_even(x * 512.0) as u8;
    }
    // frexp: x = m · 2^e with m in [0.5, 1); x is normal and finite here
    let bits = x.to_bits();
    let e = ((bits >> 23) & 0xFF) as i32 - 126;
    let mantissa = f32::from_bits((bits & 0x007F_FFFF) | (127 << 23)); // in [1, 2)
    let mut encoded_exp = e + 6;
    let mut encoded_man = round_to_nearest_even((mantissa - 1.0) * 8.0);
    if encoded_man == 8 {
        encoded_man = 0;
        encoded_exp += 1;
    }
    if encoded_exp > 15 || (encoded_exp == 15 && encoded_man > 6) {
        return sign | 0x7E;
    }
    // x >= 2^-6 gives e >= -5, so encoded_exp >= 1
    sign | ((encoded_exp as u8) << 3) | encoded_man as u8
}

/// `dequantize_row_f8_e4m3`.
pub(super) fn dequantize_f8_e4m3(src: &[u8], dst: &mut [f32]) {
    for (&b, out) in src.iter().zip(dst.iter_mut()) {
        *out = f8_e4m3_to_f32(b);
    }
}

/// `quantize_row_f8_e4m3` (= `quantize_row_f8_e4m3_ref`).
pub(super) fn quantize_f8_e4m3(src: &[f32], dst: &mut [u8]) {
    for (&x, out) in src.iter().zip(dst.iter_mut()) {
        *out = f32_to_f8_e4m3(x);
    }
}

/// `ggml_vec_dot_f8_e4m3_f32`: an F8_E4M3 row with an F32 row (little-endian bytes).
#[inline(always)]
pub(super) fn vec_dot_f8_e4m3_f32(x: &[u8], y: &[u8]) -> f32 {
    lanes_dot(x, y, |[b]: [u8; 1]| f8_e4m3_to_f32(b), f32::from_le_bytes)
}
