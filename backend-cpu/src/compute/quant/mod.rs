//! ggml's quantized block formats: dequantization, activation quantization and dot products.
//!
//! Pure functions over byte slices (no tensors, no threads), so the op kernels in
//! `compute/ops/` can call them row by row. The five functions at the top (`supports`,
//! `vec_dot_type`, `dequantize_row`, `quantize_row`, `vec_dot`) are a fixed contract; the rest
//! are additions.
//!
//! Everything follows ggml as of llama.cpp b11434:
//!
//! | what | upstream |
//! |---|---|
//! | block layouts | `ggml/src/ggml-common.h` (`block_q4_0` ... `block_q8_K`) |
//! | [`dequantize_row`] | `dequantize_row_*` in `ggml/src/ggml-quants.c` (bit-exact: same operations in the same order, no fused multiply-add, as ggml-base is built) |
//! | [`quantize_row`] | ggml-cpu's `from_float` on x86-64 (`ggml/src/ggml-cpu/arch/x86/quants.c`): for Q8_0/Q8_1 the AVX path (`d = amax/127`, multiplier `127/amax`, round half to even); Q8_K and the weight formats use the `_ref` functions (bit-exact) |
//! | [`quantize_row_ref`] | `quantize_row_*_ref` in `ggml-quants.c` (`from_float_ref`; Q8_0/Q8_1 round half away from zero) |
//! | [`vec_dot_type`] | `type_traits_cpu[].vec_dot_type` in `ggml/src/ggml-cpu/ggml-cpu.c` |
//! | [`vec_dot`] | `ggml_vec_dot_*_generic` in `ggml/src/ggml-cpu/quants.c`: exact integer sums per block, scaled by the block's scales and summed in f32 in block order (ggml's generic Q3_K..Q6_K keep eight f32 lane sums across super-blocks; here each super-block's exact sum is scaled once, a rounding-level difference); F32/F16/BF16 in 32 f32 lanes |
//!
//! Lengths are checked: a row of `n` elements of a type with block size `B` and `S` bytes per
//! block takes `n / B * S` bytes ([`row_size`]); `n` must be a multiple of `B`. Byte slices
//! longer than needed are accepted (only their prefix is read or written), shorter ones are an
//! [`Error::Backend`]. Nothing here panics on bad input.
//!
//! Speed: on x86-64 every kernel also exists compiled for AVX2+FMA+F16C and is picked at run
//! time when the CPU has those (module `simd`; never AVX-512 or AMX). The dot products of F16,
//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K are hand-written AVX2 integer kernels
//! whose results are bit-identical to the portable code (same exact integer block sums, same
//! f32 combination in the same order); the rest is portable code written to auto-vectorize.
//!
//! Module layout: `float.rs` (F32, F16, BF16), `q4.rs` (Q4_0, Q4_1), `q5.rs` (Q5_0, Q5_1),
//! `q8.rs` (Q8_0, Q8_1, Q8_K), `k_quants.rs` (Q2_K..Q6_K), `k_quantize.rs` (their reference
//! quantizers), `iq4_nl.rs` (IQ4_NL), `iq4_xs.rs` (IQ4_XS), `fp4.rs` (MXFP4, NVFP4),
//! `ternary.rs` (TQ1_0, TQ2_0), `q1_q2.rs` (Q1_0, Q2_0), `iq2.rs` (IQ2_XXS, IQ2_XS, IQ2_S),
//! `iq3.rs` (IQ3_XXS, IQ3_S), `iq1.rs` (IQ1_S, IQ1_M) (these eight portable code only; the
//! grid formats' tables are generated into `iq_grids.rs`), `scan.rs` (SOFT_MAX's row
//! maximum and masked runs), `simd/` (run-time dispatch, one file per x86 instruction set), `tests.rs`.

mod float;
mod fp4;
mod iq1;
mod iq2;
mod iq3;
mod iq4_nl;
mod iq4_xs;
mod iq_grids;
mod k_quantize;
mod k_quants;
mod q1_q2;
mod q4;
mod q5;
mod q8;
mod scan;
// The one module allowed `unsafe`: runtime-detected AVX2 code (see its docs).
#[allow(unsafe_code)]
mod simd;
mod ternary;
#[cfg(test)]
mod tests;
// Register-blocked Q4_0 / Q8_0 dot products (MUL_MAT's tile kernels).
mod tiles;

pub use tiles::{
    columns_to_rows, dot_f16_x2, dot_float_rows, dot_float_rows_fast, dot_q4_k_rows,
    dot_q4_k_rows_wide, dot_rows, dot_rows_wide, FloatRows, Q8Row, Q8Rows, StridedRows, Q0,
};

use proto_core::{Error, Result};

/// `v[i] = v[i].exp()` for every element, bit for bit, vectorized where the CPU and the
/// platform's `expf` allow (module `simd`): for kernels that take an exponential per element
/// (GLU's SWIGLU; in SOFT_MAX most entries are masked, and gathering the others cost more
/// than it saved, measured).
pub fn exp_in_place(v: &mut [f32]) {
    simd::exp_in_place(v);
}

/// The maximum of `w` as ggml's in-order `MAX` scan finds it (same bits, NaNs included),
/// vectorized where the row has no NaN.
pub fn row_max(w: &[f32]) -> f32 {
    simd::row_max(w)
}

/// The index of the first entry of `w` that is -inf (`masked`) or is not (`!masked`), else
/// `w.len()`: SOFT_MAX's masked runs, sixteen entries per step.
pub fn first_where_masked(w: &[f32], masked: bool) -> usize {
    simd::first_where_masked(w, masked)
}

/// ggml type ids of the formats handled here (`enum ggml_type`).
pub mod ty {
    /// `GGML_TYPE_F32`.
    pub const F32: u32 = 0;
    /// `GGML_TYPE_F16`.
    pub const F16: u32 = 1;
    /// `GGML_TYPE_Q4_0`.
    pub const Q4_0: u32 = 2;
    /// `GGML_TYPE_Q4_1`.
    pub const Q4_1: u32 = 3;
    /// `GGML_TYPE_Q5_0`.
    pub const Q5_0: u32 = 6;
    /// `GGML_TYPE_Q5_1`.
    pub const Q5_1: u32 = 7;
    /// `GGML_TYPE_Q8_0`.
    pub const Q8_0: u32 = 8;
    /// `GGML_TYPE_Q8_1`.
    pub const Q8_1: u32 = 9;
    /// `GGML_TYPE_Q2_K`.
    pub const Q2_K: u32 = 10;
    /// `GGML_TYPE_Q3_K`.
    pub const Q3_K: u32 = 11;
    /// `GGML_TYPE_Q4_K`.
    pub const Q4_K: u32 = 12;
    /// `GGML_TYPE_Q5_K`.
    pub const Q5_K: u32 = 13;
    /// `GGML_TYPE_Q6_K`.
    pub const Q6_K: u32 = 14;
    /// `GGML_TYPE_Q8_K`.
    pub const Q8_K: u32 = 15;
    /// `GGML_TYPE_IQ2_XXS`.
    pub const IQ2_XXS: u32 = 16;
    /// `GGML_TYPE_IQ2_XS`.
    pub const IQ2_XS: u32 = 17;
    /// `GGML_TYPE_IQ3_XXS`.
    pub const IQ3_XXS: u32 = 18;
    /// `GGML_TYPE_IQ1_S`.
    pub const IQ1_S: u32 = 19;
    /// `GGML_TYPE_IQ4_NL`.
    pub const IQ4_NL: u32 = 20;
    /// `GGML_TYPE_IQ3_S`.
    pub const IQ3_S: u32 = 21;
    /// `GGML_TYPE_IQ2_S`.
    pub const IQ2_S: u32 = 22;
    /// `GGML_TYPE_IQ4_XS`.
    pub const IQ4_XS: u32 = 23;
    /// `GGML_TYPE_IQ1_M`.
    pub const IQ1_M: u32 = 29;
    /// `GGML_TYPE_BF16`.
    pub const BF16: u32 = 30;
    /// `GGML_TYPE_TQ1_0`.
    pub const TQ1_0: u32 = 34;
    /// `GGML_TYPE_TQ2_0`.
    pub const TQ2_0: u32 = 35;
    /// `GGML_TYPE_MXFP4`.
    pub const MXFP4: u32 = 39;
    /// `GGML_TYPE_NVFP4`.
    pub const NVFP4: u32 = 40;
    /// `GGML_TYPE_Q1_0`.
    pub const Q1_0: u32 = 41;
    /// `GGML_TYPE_Q2_0`.
    pub const Q2_0: u32 = 42;
}

/// Elements per super-block of the K-quants (`QK_K`).
pub const QK_K: usize = 256;
/// Elements per block of the 32-element formats (`QK4_0` = `QK8_0` = ... = 32).
pub const QK32: usize = 32;

/// `(elements per block, bytes per block)` of the types this module knows (ggml's `blck_size`
/// and `type_size`).
pub fn block_layout(type_id: u32) -> Option<(usize, usize)> {
    Some(match type_id {
        ty::F32 => (1, 4),
        ty::F16 | ty::BF16 => (1, 2),
        ty::Q4_0 => (QK32, q4::Q4_0_BYTES),
        ty::Q4_1 => (QK32, q4::Q4_1_BYTES),
        ty::Q5_0 => (QK32, q5::Q5_0_BYTES),
        ty::Q5_1 => (QK32, q5::Q5_1_BYTES),
        ty::Q8_0 => (QK32, q8::Q8_0_BYTES),
        ty::Q8_1 => (QK32, q8::Q8_1_BYTES),
        ty::Q2_K => (QK_K, k_quants::Q2_K_BYTES),
        ty::Q3_K => (QK_K, k_quants::Q3_K_BYTES),
        ty::Q4_K => (QK_K, k_quants::Q4_K_BYTES),
        ty::Q5_K => (QK_K, k_quants::Q5_K_BYTES),
        ty::Q6_K => (QK_K, k_quants::Q6_K_BYTES),
        ty::Q8_K => (QK_K, q8::Q8_K_BYTES),
        ty::IQ4_NL => (QK32, iq4_nl::IQ4_NL_BYTES),
        ty::IQ4_XS => (QK_K, iq4_xs::IQ4_XS_BYTES),
        ty::IQ2_XXS => (QK_K, iq2::IQ2_XXS_BYTES),
        ty::IQ2_XS => (QK_K, iq2::IQ2_XS_BYTES),
        ty::IQ2_S => (QK_K, iq2::IQ2_S_BYTES),
        ty::IQ3_XXS => (QK_K, iq3::IQ3_XXS_BYTES),
        ty::IQ3_S => (QK_K, iq3::IQ3_S_BYTES),
        ty::IQ1_S => (QK_K, iq1::IQ1_S_BYTES),
        ty::IQ1_M => (QK_K, iq1::IQ1_M_BYTES),
        ty::MXFP4 => (QK32, fp4::MXFP4_BYTES),
        ty::NVFP4 => (fp4::QK_NVFP4, fp4::NVFP4_BYTES),
        ty::TQ1_0 => (QK_K, ternary::TQ1_0_BYTES),
        ty::TQ2_0 => (QK_K, ternary::TQ2_0_BYTES),
        ty::Q1_0 => (q1_q2::QK1_0, q1_q2::Q1_0_BYTES),
        ty::Q2_0 => (q1_q2::QK2_0, q1_q2::Q2_0_BYTES),
        _ => return None,
    })
}

/// Bytes of a row of `n` elements of `type_id` (ggml's `ggml_row_size`); `None` for unknown
/// types and for `n` not a multiple of the block size.
pub fn row_size(type_id: u32, n: usize) -> Option<usize> {
    let (block, bytes) = block_layout(type_id)?;
    if !n.is_multiple_of(block) {
        return None;
    }
    (n / block).checked_mul(bytes)
}

/// Whether `type_id` can be dequantized and used as MUL_MAT / GET_ROWS weights.
///
/// These are the types with both `to_float` and a `vec_dot` in ggml: F32, F16, BF16, Q4_0,
/// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0,
/// Q2_0, and the grid formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (which
/// have no quantizer: [`quantize_row`] refuses them, as ggml-cpu has no `from_float` for them).
/// (Q8_1 and Q8_K are activation formats only:
/// [`dequantize_row`] and [`quantize_row`] handle them, [`vec_dot`] does not.)
pub fn supports(type_id: u32) -> bool {
    matches!(
        type_id,
        ty::F32
            | ty::F16
            | ty::BF16
            | ty::Q4_0
            | ty::Q4_1
            | ty::Q5_0
            | ty::Q5_1
            | ty::Q8_0
            | ty::Q2_K
            | ty::Q3_K
            | ty::Q4_K
            | ty::Q5_K
            | ty::Q6_K
            | ty::IQ4_NL
            | ty::IQ4_XS
            | ty::MXFP4
            | ty::NVFP4
            | ty::TQ1_0
            | ty::TQ2_0
            | ty::Q1_0
            | ty::Q2_0
            | ty::IQ2_XXS
            | ty::IQ2_XS
            | ty::IQ2_S
            | ty::IQ3_XXS
            | ty::IQ3_S
            | ty::IQ1_S
            | ty::IQ1_M
    )
}

/// The type ggml converts activations (src1 of MUL_MAT) to before the dot product with weights
/// of `type_id` (ggml-cpu's `vec_dot_type`): Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4/NVFP4/Q1_0/
/// Q2_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants/IQ4_XS/TQ1_0/TQ2_0 and the grid formats
/// (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), the type itself for
/// F16/BF16/F32.
///
/// Q8_1 maps to itself as in ggml's table (it has no `vec_dot` there either); `None` for every
/// type without an entry here.
pub fn vec_dot_type(type_id: u32) -> Option<u32> {
    Some(match type_id {
        ty::F32 => ty::F32,
        ty::F16 => ty::F16,
        ty::BF16 => ty::BF16,
        ty::Q4_0 | ty::Q5_0 | ty::Q8_0 | ty::IQ4_NL => ty::Q8_0,
        ty::MXFP4 | ty::NVFP4 | ty::Q1_0 | ty::Q2_0 => ty::Q8_0,
        ty::Q4_1 | ty::Q5_1 | ty::Q8_1 => ty::Q8_1,
        ty::Q2_K | ty::Q3_K | ty::Q4_K | ty::Q5_K | ty::Q6_K => ty::Q8_K,
        ty::IQ4_XS | ty::TQ1_0 | ty::TQ2_0 => ty::Q8_K,
        ty::IQ2_XXS | ty::IQ2_XS | ty::IQ2_S | ty::IQ3_XXS | ty::IQ3_S => ty::Q8_K,
        ty::IQ1_S | ty::IQ1_M => ty::Q8_K,
        _ => return None,
    })
}

/// Rounds every value to F16 and widens it back, in place: the bits of [`quantize_row`] to
/// F16 followed by [`dequantize_row`], in one pass.
pub fn round_to_f16(values: &mut [f32]) {
    simd::round_f16(values);
}

/// Dequantizes `dst.len()` elements (a multiple of the block size) of `type_id` from `src`.
///
/// Bit-exact with ggml's `to_float` (`dequantize_row_*`, `ggml_fp16_to_fp32_row`,
/// `ggml_bf16_to_fp32_row`, and a plain copy for F32). Q8_1 (`d * q`) and Q8_K (`d * q`) are
/// accepted as well.
pub fn dequantize_row(type_id: u32, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let bytes = checked_len(type_id, dst.len(), src.len(), "dequantize_row: source")?;
    let src = &src[..bytes];
    match type_id {
        ty::F32 => simd::dequantize_f32(src, dst),
        ty::F16 => simd::dequantize_f16(src, dst),
        ty::BF16 => simd::dequantize_bf16(src, dst),
        ty::Q4_0 => simd::dequantize_q4_0(src, dst),
        ty::Q4_1 => simd::dequantize_q4_1(src, dst),
        ty::Q5_0 => simd::dequantize_q5_0(src, dst),
        ty::Q5_1 => simd::dequantize_q5_1(src, dst),
        ty::Q8_0 => simd::dequantize_q8_0(src, dst),
        ty::Q8_1 => simd::dequantize_q8_1(src, dst),
        ty::Q8_K => simd::dequantize_q8_k(src, dst),
        ty::Q2_K => simd::dequantize_q2_k(src, dst),
        ty::Q3_K => simd::dequantize_q3_k(src, dst),
        ty::Q4_K => simd::dequantize_q4_k(src, dst),
        ty::Q5_K => simd::dequantize_q5_k(src, dst),
        ty::Q6_K => simd::dequantize_q6_k(src, dst),
        ty::IQ4_NL => iq4_nl::dequantize_iq4_nl(src, dst),
        ty::IQ4_XS => iq4_xs::dequantize_iq4_xs(src, dst),
        ty::MXFP4 => fp4::dequantize_mxfp4(src, dst),
        ty::NVFP4 => fp4::dequantize_nvfp4(src, dst),
        ty::TQ1_0 => ternary::dequantize_tq1_0(src, dst),
        ty::TQ2_0 => ternary::dequantize_tq2_0(src, dst),
        ty::Q1_0 => q1_q2::dequantize_q1_0(src, dst),
        ty::Q2_0 => q1_q2::dequantize_q2_0(src, dst),
        ty::IQ2_XXS => iq2::dequantize_iq2_xxs(src, dst),
        ty::IQ2_XS => iq2::dequantize_iq2_xs(src, dst),
        ty::IQ2_S => iq2::dequantize_iq2_s(src, dst),
        ty::IQ3_XXS => iq3::dequantize_iq3_xxs(src, dst),
        ty::IQ3_S => iq3::dequantize_iq3_s(src, dst),
        ty::IQ1_S => iq1::dequantize_iq1_s(src, dst),
        ty::IQ1_M => iq1::dequantize_iq1_m(src, dst),
        // checked_len accepted only the types above
        _ => {}
    }
    Ok(())
}

/// Quantizes `src.len()` f32 values into `dst` in `type_id` (a `vec_dot_type`, or any type with
/// a reference quantizer), exactly as ggml's `from_float` does.
///
/// On x86-64 ggml-cpu's `from_float` for Q8_0 and Q8_1 is its AVX code, which differs from
/// `quantize_row_q8_0_ref` (multiplier `127/amax` instead of `1/(amax/127)`, ties rounded to
/// even instead of away from zero); this function follows the AVX code, since that is what
/// llama.cpp's CPU backend runs. Q8_K, Q4_0, Q4_1, Q5_0 and Q5_1 use the `_ref` quantizers (as
/// ggml-cpu does), F16 rounds to nearest even, BF16 rounds to nearest even and keeps NaNs quiet
/// NaNs. The K-quant weight formats (Q2_K..Q6_K) use the `_ref` quantizers too (as ggml-cpu
/// does; no importance matrix).
pub fn quantize_row(type_id: u32, src: &[f32], dst: &mut [u8]) -> Result<()> {
    match type_id {
        ty::Q8_0 => {
            let dst = quantize_target(type_id, src, dst)?;
            simd::quantize_q8_0(src, dst);
            Ok(())
        }
        ty::Q8_1 => {
            let dst = quantize_target(type_id, src, dst)?;
            simd::quantize_q8_1(src, dst);
            Ok(())
        }
        _ => quantize_row_ref(type_id, src, dst),
    }
}

/// Quantizes `src.len()` f32 values into `dst` with ggml's reference quantizers
/// (`quantize_row_*_ref`, ggml's `from_float_ref`), for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
/// Q8_0, Q8_1, Q8_K, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0 and Q2_0.
pub fn quantize_row_ref(type_id: u32, src: &[f32], dst: &mut [u8]) -> Result<()> {
    if !matches!(
        type_id,
        ty::F32
            | ty::F16
            | ty::BF16
            | ty::Q4_0
            | ty::Q4_1
            | ty::Q5_0
            | ty::Q5_1
            | ty::Q8_0
            | ty::Q8_1
            | ty::Q8_K
            | ty::Q2_K
            | ty::Q3_K
            | ty::Q4_K
            | ty::Q5_K
            | ty::Q6_K
            | ty::IQ4_NL
            | ty::IQ4_XS
            | ty::MXFP4
            | ty::NVFP4
            | ty::TQ1_0
            | ty::TQ2_0
            | ty::Q1_0
            | ty::Q2_0
    ) {
        return Err(unsupported(type_id));
    }
    let dst = quantize_target(type_id, src, dst)?;
    match type_id {
        ty::F32 => simd::quantize_f32(src, dst),
        ty::F16 => simd::quantize_f16(src, dst),
        ty::BF16 => simd::quantize_bf16(src, dst),
        ty::Q4_0 => q4::quantize_q4_0_ref(src, dst),
        ty::Q4_1 => q4::quantize_q4_1_ref(src, dst),
        ty::Q5_0 => q5::quantize_q5_0_ref(src, dst),
        ty::Q5_1 => q5::quantize_q5_1_ref(src, dst),
        ty::Q8_0 => q8::quantize_q8_0_ref(src, dst),
        ty::Q8_1 => q8::quantize_q8_1_ref(src, dst),
        ty::Q8_K => simd::quantize_q8_k(src, dst),
        ty::Q2_K => k_quantize::quantize_q2_k_ref(src, dst),
        ty::Q3_K => k_quantize::quantize_q3_k_ref(src, dst),
        ty::Q4_K => k_quantize::quantize_q4_k_ref(src, dst),
        ty::Q5_K => k_quantize::quantize_q5_k_ref(src, dst),
        ty::Q6_K => k_quantize::quantize_q6_k_ref(src, dst),
        ty::IQ4_NL => iq4_nl::quantize_iq4_nl_ref(src, dst),
        ty::IQ4_XS => iq4_xs::quantize_iq4_xs_ref(src, dst),
        ty::MXFP4 => fp4::quantize_mxfp4_ref(src, dst),
        ty::NVFP4 => fp4::quantize_nvfp4_ref(src, dst),
        ty::TQ1_0 => ternary::quantize_tq1_0_ref(src, dst),
        ty::TQ2_0 => ternary::quantize_tq2_0_ref(src, dst),
        ty::Q1_0 => q1_q2::quantize_q1_0_ref(src, dst),
        ty::Q2_0 => q1_q2::quantize_q2_0_ref(src, dst),
        _ => {}
    }
    Ok(())
}

/// Dot product of `n` elements: `x` a row of weights in `type_id`, `y` a row of activations
/// in `vec_dot_type(type_id)`.
pub fn vec_dot(type_id: u32, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    if !supports(type_id) {
        return Err(unsupported(type_id));
    }
    let y_type = vec_dot_type(type_id).ok_or_else(|| unsupported(type_id))?;
    let x_bytes = checked_len(type_id, n, x.len(), "vec_dot: x")?;
    let y_bytes = checked_len(y_type, n, y.len(), "vec_dot: y")?;
    let (x, y) = (&x[..x_bytes], &y[..y_bytes]);
    let kernel = row_dot_kernel(type_id).ok_or_else(|| unsupported(type_id))?;
    Ok(kernel(x, y))
}

/// A row dot product: weights, activations.
pub type RowDot = fn(&[u8], &[u8]) -> f32;

/// The kernel [`vec_dot`] runs for weights of `type_id`, without its per-call checks, for
/// callers that check the lengths once for many rows: `x` must be exactly
/// `row_size(type_id, n)` bytes and `y` exactly `row_size(vec_dot_type(type_id), n)` (the
/// kernels read whole blocks as far as the shorter slice goes, so other lengths are safe but
/// give other sums). `None` for types without a dot product. The one table of dot kernels.
pub fn row_dot_kernel(type_id: u32) -> Option<RowDot> {
    Some(match type_id {
        ty::Q4_0 => simd::vec_dot_q4_0_q8_0,
        ty::Q8_0 => simd::vec_dot_q8_0_q8_0,
        ty::Q4_K => simd::vec_dot_q4_k_q8_k,
        ty::Q5_K => simd::vec_dot_q5_k_q8_k,
        ty::Q6_K => simd::vec_dot_q6_k_q8_k,
        ty::F32 => simd::vec_dot_f32,
        ty::F16 => simd::vec_dot_f16,
        ty::BF16 => simd::vec_dot_bf16,
        ty::Q4_1 => simd::vec_dot_q4_1_q8_1,
        ty::Q5_0 => simd::vec_dot_q5_0_q8_0,
        ty::Q5_1 => simd::vec_dot_q5_1_q8_1,
        ty::Q2_K => simd::vec_dot_q2_k_q8_k,
        ty::Q3_K => simd::vec_dot_q3_k_q8_k,
        ty::IQ4_NL => iq4_nl::vec_dot_iq4_nl_q8_0,
        ty::IQ4_XS => iq4_xs::vec_dot_iq4_xs_q8_k,
        ty::MXFP4 => fp4::vec_dot_mxfp4_q8_0,
        ty::NVFP4 => fp4::vec_dot_nvfp4_q8_0,
        ty::TQ1_0 => ternary::vec_dot_tq1_0_q8_k,
        ty::TQ2_0 => ternary::vec_dot_tq2_0_q8_k,
        ty::Q1_0 => q1_q2::vec_dot_q1_0_q8_0,
        ty::Q2_0 => q1_q2::vec_dot_q2_0_q8_0,
        ty::IQ2_XXS => iq2::vec_dot_iq2_xxs_q8_k,
        ty::IQ2_XS => iq2::vec_dot_iq2_xs_q8_k,
        ty::IQ2_S => iq2::vec_dot_iq2_s_q8_k,
        ty::IQ3_XXS => iq3::vec_dot_iq3_xxs_q8_k,
        ty::IQ3_S => iq3::vec_dot_iq3_s_q8_k,
        ty::IQ1_S => iq1::vec_dot_iq1_s_q8_k,
        ty::IQ1_M => iq1::vec_dot_iq1_m_q8_k,
        _ => return None,
    })
}

fn unsupported(type_id: u32) -> Error {
    Error::OpRefused {
        op: type_id,
        reason: "quantized type not supported by the CPU backend",
    }
}

/// Bytes of `n` elements of `type_id`, checked against the `have` bytes available.
fn checked_len(type_id: u32, n: usize, have: usize, what: &str) -> Result<usize> {
    let (block, _) = block_layout(type_id).ok_or_else(|| unsupported(type_id))?;
    let need = row_size(type_id, n).ok_or_else(|| {
        Error::Backend(format!(
            "{what}: {n} elements of type {type_id} is not a whole number of {block}-element blocks"
        ))
    })?;
    if have < need {
        return Err(Error::Backend(format!(
            "{what}: {n} elements of type {type_id} take {need} bytes, only {have} given"
        )));
    }
    Ok(need)
}

/// The exact prefix of `dst` that `src.len()` values of `type_id` fill.
fn quantize_target<'a>(type_id: u32, src: &[f32], dst: &'a mut [u8]) -> Result<&'a mut [u8]> {
    let need = checked_len(type_id, src.len(), dst.len(), "quantize_row: destination")?;
    Ok(&mut dst[..need])
}

/// ggml's `GGML_FP16_TO_FP32` of a little-endian half (a block's scale: one value, through
/// F16C where the CPU has it).
#[inline(always)]
fn fp16(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// Exact f16 -> f32 without branches or tables, for arrays of halves (ggml's portable `ggml_compute_fp16_to_fp32`,
/// after Maratyszcza's FP16 library), so loops over it vectorize: normal numbers, infinities
/// and NaNs are rebiased through a multiplication by 2^-112, subnormals built with a magic
/// bias.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let w = u32::from(h) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    // exponent rebias 0xE0 << 23, then scale by 2^-112
    let normalized = f32::from_bits((two_w >> 4) + (0xE0 << 23)) * f32::from_bits(0x0780_0000);
    let denormalized = f32::from_bits((two_w >> 17) | (126 << 23)) - 0.5;
    let bits = if two_w < (1 << 27) {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    f32::from_bits(sign | bits)
}

/// ggml's `GGML_FP32_TO_FP16` (round to nearest even), little-endian bytes.
#[inline(always)]
fn fp16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// ggml's `nearest_int`: `fval + 1.5 * 2^23` read back as an integer, i.e. round half to even
/// for `|fval| < 2^22`.
#[inline(always)]
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}
