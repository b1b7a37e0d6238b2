//! ggml's quantized block formats: dequantization, activation quantization and dot products.
//!
//! Pure functions over byte slices (no tensors, no threads), so the op kernels in
//! `compute/ops/` can call them row by row. Every type's block geometry and kernels are one row
//! of the format table ([`format`], `format.rs`, like ggml's `type_traits`); the functions here
//! (`supports`, `vec_dot_type`, `dequantize_row`, `quantize_row`, `vec_dot`, ...) look the row up
//! and check lengths. Adding a type is one table row plus its kernels.
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
//! time when the CPU has those (module `simd`, which also has AVX-VNNI and AVX-512 tile
//! kernels; never AMX). The dot products of F16,
//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K are hand-written AVX2 integer kernels
//! whose results are bit-identical to the portable code (same exact integer block sums, same
//! f32 combination in the same order); the rest is portable code written to auto-vectorize.
//!
//! Module layout: `format.rs` (the per-type table), `float.rs` (F32, F16, BF16), `q4.rs`
//! (Q4_0, Q4_1), `q5.rs` (Q5_0, Q5_1), `q8.rs` (Q8_0, Q8_1, Q8_K), `k_quants.rs` (Q2_K..Q6_K),
//! `k_quantize.rs` (their reference quantizers), `iq4_nl.rs` (IQ4_NL), `iq4_xs.rs` (IQ4_XS),
//! `fp4.rs` (MXFP4, NVFP4), `fp8.rs` (F8_E4M3), `ternary.rs` (TQ1_0, TQ2_0), `q1_q2.rs` (Q1_0, Q2_0), `iq2.rs`
//! (IQ2_XXS, IQ2_XS, IQ2_S), `iq3.rs` (IQ3_XXS, IQ3_S), `iq1.rs` (IQ1_S, IQ1_M) (these eight
//! portable code only; the grid formats' tables are generated into `iq_grids.rs`), `scan.rs`
//! (SOFT_MAX's row maximum and masked runs), `simd/` (run-time dispatch, one file per x86
//! instruction set), `tiles.rs` (MUL_MAT's tile kernels), `tests/`.

mod float;
// The per-type table: block geometry, kernels, vec_dot_type.
mod format;
mod fp4;
// F8_E4M3 (8.0.1): conversions, row kernels and the dot product with F32.
mod fp8;
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

#[cfg(test)]
pub(crate) use tiles::force_widen_f16_tiles;
pub use tiles::{
    columns_to_rows, dot_f16_x2, dot_float_rows, dot_float_rows_fast, dot_q4_k_rows,
    dot_q4_k_rows_wide, dot_rows, dot_rows_wide, dot_tile, widen_f16_tiles, FloatRows, Q8Row,
    Q8Rows, StridedRows, Q0,
};

#[cfg(test)]
pub(crate) use format::id;
pub use format::{format, type_id, Format, RowDot};
#[cfg(test)]
pub(crate) use fp8::{f32_to_f8_e4m3, f8_e4m3_to_f32};
// Kernels forced past the run-time choice, for the tile benchmarks (`benches/tiles.rs`).
pub use simd::{
    dot_float_row1_variant, dot_tile_variant, dot_tile_vl1_variant, dot_tile_zmm_variant,
};

use proto_core::{Error, Result};

/// `v[i] = v[i].exp()` for every element, bit for bit, vectorized where the CPU and the
/// platform's `expf` allow (module `simd`): for kernels that take an exponential per element
/// (GLU's SWIGLU; in SOFT_MAX most entries are masked, and gathering the others cost more
/// than it saved, measured).
pub fn exp_in_place(v: &mut [f32]) {
    simd::exp_in_place(v);
}

/// Runs `body` inside a function compiled for AVX2 + FMA where the CPU has them, so that the
/// `f32::mul_add` of a loop inlined into it is one `vfmadd` (a portable `mul_add` is a
/// library call per element); returns false without running it where the CPU lacks them.
/// For loops that want ggml's fused multiply-adds (ROPE's rotation) without intrinsics.
#[inline(always)]
pub fn with_fma(body: impl FnOnce()) -> bool {
    simd::with_fma(body)
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

/// Elements per super-block of the K-quants (`QK_K`).
pub const QK_K: usize = 256;
/// Elements per block of the 32-element formats (`QK4_0` = `QK8_0` = ... = 32).
pub const QK32: usize = 32;

/// Bytes of a row of `n` elements of `type_id` (ggml's `ggml_row_size`); `None` for unknown
/// types and for `n` not a multiple of the block size.
pub fn row_size(type_id: u32, n: usize) -> Option<usize> {
    format(type_id)?.row_bytes(n)
}

/// Whether `type_id` can be dequantized and used as MUL_MAT / GET_ROWS weights: the types with
/// both `to_float` and a `vec_dot` in ggml (the format table's rows with a dot product; Q8_1
/// and Q8_K are activation formats only).
pub fn supports(type_id: u32) -> bool {
    format(type_id).is_some_and(|format| format.dot.is_some())
}

/// Whether values can be quantized into `type_id` ([`quantize_row`] accepts it): not the grid
/// formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), which have no `from_float`
/// in ggml-cpu.
pub fn can_quantize(type_id: u32) -> bool {
    format(type_id).is_some_and(Format::can_quantize_into)
}

/// The type ggml converts activations (src1 of MUL_MAT) to before the dot product with weights
/// of `type_id` (ggml-cpu's `vec_dot_type`): Q8_0, Q8_1 or Q8_K for the quantized weight
/// formats, the type itself for F16/BF16/F32. Q8_1 maps to itself as in ggml's table (it has
/// no `vec_dot` there either); `None` for every type without an entry.
pub fn vec_dot_type(type_id: u32) -> Option<u32> {
    format(type_id)?.vec_dot_type
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
    let (format, bytes) = checked_len(type_id, dst.len(), src.len(), "dequantize_row: source")?;
    (format.dequantize)(&src[..bytes], dst);
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
    quantize_with(type_id, src, dst, |format| format.quantize)
}

/// Quantizes `src.len()` f32 values into `dst` with ggml's reference quantizers
/// (`quantize_row_*_ref`, ggml's `from_float_ref`), for every type [`quantize_row`] takes.
pub fn quantize_row_ref(type_id: u32, src: &[f32], dst: &mut [u8]) -> Result<()> {
    quantize_with(type_id, src, dst, |format| format.quantize_ref)
}

/// Runs the quantizer `pick` chooses from `type_id`'s row on the exact prefix of `dst` that
/// `src` fills.
fn quantize_with(
    type_id: u32,
    src: &[f32],
    dst: &mut [u8],
    pick: fn(&Format) -> Option<format::Quantize>,
) -> Result<()> {
    let format = format(type_id).ok_or_else(|| unsupported(type_id))?;
    // a type without this quantizer is refused whatever the lengths
    let quantize = pick(format).ok_or_else(|| unsupported(type_id))?;
    let (_, need) = checked_len(type_id, src.len(), dst.len(), "quantize_row: destination")?;
    quantize(src, &mut dst[..need]);
    Ok(())
}

/// Dot product of `n` elements: `x` a row of weights in `type_id`, `y` a row of activations
/// in `vec_dot_type(type_id)`.
pub fn vec_dot(type_id: u32, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    let weights = format(type_id).ok_or_else(|| unsupported(type_id))?;
    let kernel = weights.dot.ok_or_else(|| unsupported(type_id))?;
    let y_type = weights.vec_dot_type.ok_or_else(|| unsupported(type_id))?;
    let (_, x_bytes) = checked_len(type_id, n, x.len(), "vec_dot: x")?;
    let (_, y_bytes) = checked_len(y_type, n, y.len(), "vec_dot: y")?;
    Ok(kernel(&x[..x_bytes], &y[..y_bytes]))
}

/// The kernel [`vec_dot`] runs for weights of `type_id`, without its per-call checks, for
/// callers that check the lengths once for many rows: `x` must be exactly
/// `row_size(type_id, n)` bytes and `y` exactly `row_size(vec_dot_type(type_id), n)` (the
/// kernels read whole blocks as far as the shorter slice goes, so other lengths are safe but
/// give other sums). `None` for types without a dot product.
pub fn row_dot_kernel(type_id: u32) -> Option<RowDot> {
    format(type_id)?.dot
}

fn unsupported(type_id: u32) -> Error {
    Error::OpRefused {
        op: type_id,
        reason: "quantized type not supported by the CPU backend",
    }
}

/// The format of `type_id` and the bytes of `n` elements of it, checked against the `have`
/// bytes available.
fn checked_len(
    type_id: u32,
    n: usize,
    have: usize,
    what: &str,
) -> Result<(&'static Format, usize)> {
    let format = format(type_id).ok_or_else(|| unsupported(type_id))?;
    let need = format.row_bytes(n).ok_or_else(|| {
        Error::Backend(format!(
            "{what}: {n} elements of type {type_id} is not a whole number of {}-element blocks",
            format.block_size
        ))
    })?;
    if have < need {
        return Err(Error::Backend(format!(
            "{what}: {n} elements of type {type_id} take {need} bytes, only {have} given"
        )));
    }
    Ok((format, need))
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
