//! Runtime CPU-feature dispatch (this file) and the hand-written x86-64 kernels, one file per
//! instruction set: `avx2.rs` (AVX2+FMA+F16C: F16, SOFT_MAX scans, Q8_0 quantization, the
//! Q4_1/Q5_x/K-quant dot products), `avx2_tiles.rs` (the Q4_0 / Q8_0 tiles and rows on 256-bit
//! vectors, AVX-VNNI where present), `avx512.rs` (AVX-512 BW/VL/VNNI: zmm tiles, Q4_K rows),
//! `avx512f.rs` (AVX-512 F: the F16 / F32 tiles), `avx2_float.rs` (the F16 / F32 tiles on
//! 256-bit vectors, where the CPU lacks AVX-512 F), `expf.rs` (glibc's `expf`, vectorized).
//! Each file owns the run-time check of its features; the `pub(super)` functions here pick.
//!
//! The portable kernels are `#[inline(always)]` functions; every entry point here instantiates
//! one twice, as plain code and inside a function compiled for AVX2+FMA+F16C, and runs the
//! latter when the CPU has those features, so the compiler auto-vectorizes the kernel with
//! 256-bit instructions (default x86-64 code only has SSE2). The hottest dot products have
//! explicit AVX2 versions instead: the quantized ones compute the same exact integer block
//! sums as the portable code and combine them in f32 with the same scalar code in the same
//! order, the F16 one keeps the portable code's 32 f32 lanes (one FMA per product), so their
//! results are bit-identical (the tests check it).
//!
//! The Q4_0 / Q8_0 tile kernels (`tiles`, MUL_MAT) have an AVX2 version and, where CPUID
//! reports AVX-VNNI, one whose byte products are the VEX-encoded `vpdpbusd` (written as inline
//! assembly: its intrinsics and target feature need a newer Rust than the crate's minimum).
//! Both compute the exact lane sums of `tiles` and the same f32 steps, so every path gives
//! the portable bits.
//!
//! Where the CPU has AVX-512 F/BW/VL/VNNI, the tiles with an even number of weight rows and
//! more than one activation row (prompt processing) take a 512-bit kernel instead: two weight
//! rows per zmm, each half exactly the AVX-VNNI kernel's accumulator, so the same bits again.
//! With one activation row (generation) groups of four weight rows take the 256-bit EVEX
//! `vpdpbusd` through intrinsics instead (the AVX-VNNI kernel's steps, the activation block
//! loaded once for the four rows): in cache about 1.5x the AVX-VNNI kernel's speed (Q4_0,
//! Q8_0), streaming from memory up to 15% faster for Q4_0 (measured on Zen 5).
//!
//! The F16 and F32 MUL_MAT have one AVX-512 F tile kernel with the 32 lanes of
//! `float::vec_dot_f16` / `float::vec_dot_f32` in two zmm per output (one FMA per
//! product). With one activation row (generation: the output projection streams several MB of
//! weights) it takes one weight row after the other, without software prefetch (one
//! sequential stream, which the hardware prefetcher follows best). CPUs without AVX-512 F
//! take the AVX2 version (`avx2_float.rs`): four ymm per output, a quarter of the lanes per
//! pass where the tile's accumulators would not fit the 16 registers otherwise. The AVX-512
//! kernel's results (per weight row, one per activation row) become destination rows through
//! `vpermt2ps`, sixteen weight rows at a time (`columns_to_rows3_zmm`). The Q4_K
//! MUL_MAT has a row kernel (AVX2, and AVX-512 BW with both nibble halves of 32 quant bytes
//! in one zmm) that decodes each weight block once for several activation rows and computes
//! the exact integer sums and f32 steps of `vec_dot_q4_k_q8_k`. With AVX-512 VNNI it takes
//! 16 activation rows per call, one per i32 lane: their quants interleaved per super-block,
//! `vpdpbusd` against the weight's decoded quants broadcast four at a time, four weight rows
//! at a time, the group scales applied per lane with `vpmulld` and the mins with `vpdpwssd`
//! (pp64 on the tiny Q4_K model: about 2.4x less CPU in the Q4_K products than the
//! reference's tiled AVX2 kernel). One activation row (generation, and a prompt's last-token
//! output projection) has its own AVX-512 kernel: the row rearranged once per call so a
//! weight block is two 64-byte loads, scales spread with `vpermw`, four weight rows reduced
//! and combined together. Both give the same bits as `vec_dot_q4_k_q8_k`.
//!
//! No AMX: AMX instructions die with SIGILL on machines that advertise but do not enable them.
//!
//! `unsafe` is allowed here (`#[allow(unsafe_code)]` on the module, the crate denies it):
//! calling `#[target_feature]` functions after the run-time check, the intrinsics' unaligned
//! loads and stores and the inline assembly's loads, each inside the arrays it is given.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_float;
#[cfg(target_arch = "x86_64")]
mod avx2_tiles;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512f;
#[cfg(target_arch = "x86_64")]
mod expf;

use super::tiles::{self, Q8Row, StridedRows, Q0};
use super::{float, fp8, k_quants, q4, q5, q8, scan};

/// Whether the AVX2 paths are taken on this machine.
#[cfg(test)]
pub(super) fn avx2_active() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::has_avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Defines `pub(super) fn $name(args) -> ret` that runs the `#[inline(always)]` portable
/// `$kernel` compiled for AVX2+FMA+F16C when the CPU has them (the compiler then vectorizes it
/// with 256-bit instructions), and as plain x86-64 / other-target code otherwise.
macro_rules! multiversion {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $kernel:path;)*) => {$(
        $(#[$doc])*
        #[inline]
        pub(super) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU must support AVX2, FMA and F16C.
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $kernel($($arg),*)
                }
                if avx2::has_avx2() {
                    // SAFETY: `has_avx2` checked at run time that this CPU supports AVX2, FMA
                    // and F16C, the features `avx2` is compiled for; that is its only
                    // requirement (the kernel itself is safe code).
                    return unsafe { avx2($($arg),*) };
                }
            }
            $kernel($($arg),*)
        }
    )*};
}

multiversion! {
    dequantize_f32(src: &[u8], dst: &mut [f32]) = float::dequantize_f32;
    dequantize_f16(src: &[u8], dst: &mut [f32]) = float::dequantize_f16;
    dequantize_bf16(src: &[u8], dst: &mut [f32]) = float::dequantize_bf16;
    dequantize_q4_0(src: &[u8], dst: &mut [f32]) = q4::dequantize_q4_0;
    dequantize_q4_1(src: &[u8], dst: &mut [f32]) = q4::dequantize_q4_1;
    dequantize_q5_0(src: &[u8], dst: &mut [f32]) = q5::dequantize_q5_0;
    dequantize_q5_1(src: &[u8], dst: &mut [f32]) = q5::dequantize_q5_1;
    dequantize_q8_0(src: &[u8], dst: &mut [f32]) = q8::dequantize_q8_0;
    dequantize_q8_1(src: &[u8], dst: &mut [f32]) = q8::dequantize_q8_1;
    dequantize_q8_k(src: &[u8], dst: &mut [f32]) = q8::dequantize_q8_k;
    dequantize_q2_k(src: &[u8], dst: &mut [f32]) = k_quants::dequantize_q2_k;
    dequantize_q3_k(src: &[u8], dst: &mut [f32]) = k_quants::dequantize_q3_k;
    dequantize_q4_k(src: &[u8], dst: &mut [f32]) = k_quants::dequantize_q4_k;
    dequantize_q5_k(src: &[u8], dst: &mut [f32]) = k_quants::dequantize_q5_k;
    dequantize_q6_k(src: &[u8], dst: &mut [f32]) = k_quants::dequantize_q6_k;

    quantize_f32(src: &[f32], dst: &mut [u8]) = float::quantize_f32;
    quantize_bf16(src: &[f32], dst: &mut [u8]) = float::quantize_bf16;
    quantize_q8_1(src: &[f32], dst: &mut [u8]) = q8::quantize_q8_1;
    quantize_q8_k(src: &[f32], dst: &mut [u8]) = q8::quantize_q8_k;
    q8_0_to_row_blocks(offset: i32, src: &[u8], dst: &mut [u8]) -> bool
        = tiles::q8_0_to_row_blocks;

    vec_dot_f32(x: &[u8], y: &[u8]) -> f32 = float::vec_dot_f32;
    vec_dot_bf16(x: &[u8], y: &[u8]) -> f32 = float::vec_dot_bf16;
    vec_dot_f8_e4m3_f32(x: &[u8], y: &[u8]) -> f32 = fp8::vec_dot_f8_e4m3_f32;
    vec_dot_q2_k_q8_k(x: &[u8], y: &[u8]) -> f32 = k_quants::vec_dot_q2_k_q8_k;
    vec_dot_q3_k_q8_k(x: &[u8], y: &[u8]) -> f32 = k_quants::vec_dot_q3_k_q8_k;
}

/// Defines `pub(super) fn $name(args) -> ret` that runs the hand-written AVX2 `$avx2` when
/// the CPU has AVX2+FMA+F16C, the portable `$portable` otherwise (both give the same results).
macro_rules! avx2_or_portable {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $avx2:path, $portable:path;)*) => {$(
        $(#[$doc])*
        #[inline]
        pub(super) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                if avx2::has_avx2() {
                    // SAFETY: `has_avx2` checked at run time that this CPU supports AVX2, FMA
                    // and F16C, the features the kernel is compiled for; the kernel itself
                    // only reads and writes inside the slices it is given.
                    return unsafe { $avx2($($arg),*) };
                }
            }
            $portable($($arg),*)
        }
    )*};
}

avx2_or_portable! {
    /// F16 x F16 (`x`, `y` of equal length).
    vec_dot_f16(x: &[u8], y: &[u8]) -> f32 => avx2::vec_dot_f16, float::vec_dot_f16;
    /// Q4_1 x Q8_1 over whole blocks.
    vec_dot_q4_1_q8_1(x: &[u8], y: &[u8]) -> f32 => avx2::vec_dot_q4_1_q8_1, q4::vec_dot_q4_1_q8_1;
    /// Q5_0 x Q8_0 over whole blocks.
    vec_dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 => avx2::vec_dot_q5_0_q8_0, q5::vec_dot_q5_0_q8_0;
    /// Q5_1 x Q8_1 over whole blocks.
    vec_dot_q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 => avx2::vec_dot_q5_1_q8_1, q5::vec_dot_q5_1_q8_1;
    /// Q4_0 x Q8_0 over whole blocks (`x`, `y` exact multiples of the block sizes).
    vec_dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 => avx2_tiles::vec_dot_q4_0_q8_0, q4::vec_dot_q4_0_q8_0;
    /// Q8_0 x Q8_0 over whole blocks.
    vec_dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 => avx2_tiles::vec_dot_q8_0_q8_0, q8::vec_dot_q8_0_q8_0;
    /// Q4_K x Q8_K over whole super-blocks.
    vec_dot_q4_k_q8_k(x: &[u8], y: &[u8]) -> f32
        => avx2::vec_dot_q4_k_q8_k, k_quants::vec_dot_q4_k_q8_k;
    /// Q5_K x Q8_K over whole super-blocks.
    vec_dot_q5_k_q8_k(x: &[u8], y: &[u8]) -> f32
        => avx2::vec_dot_q5_k_q8_k, k_quants::vec_dot_q5_k_q8_k;
    /// Q6_K x Q8_K over whole super-blocks.
    vec_dot_q6_k_q8_k(x: &[u8], y: &[u8]) -> f32
        => avx2::vec_dot_q6_k_q8_k, k_quants::vec_dot_q6_k_q8_k;
    /// `q8::quantize_q8_0` (ggml-cpu's AVX `quantize_row_q8_0`): the same maxima, scale,
    /// rounding and clamping, the same bytes.
    quantize_q8_0(src: &[f32], dst: &mut [u8]) => avx2::quantize_q8_0, q8::quantize_q8_0;
    /// `float::quantize_f16` through F16C's `vcvtps2ph` eight values at a time (the
    /// instruction the `half` crate takes on such a CPU: the same bytes).
    quantize_f16(src: &[f32], dst: &mut [u8]) => avx2::quantize_f16, float::quantize_f16;
    /// `float::round_f16`: F16C there and back, eight values at a time (the same bits).
    round_f16(values: &mut [f32]) => avx2::round_f16, float::round_f16;
    /// `scan::first_where_masked`: sixteen compares and two move-masks per step (the same
    /// index).
    first_where_masked(w: &[f32], masked: bool) -> usize
        => avx2::first_where_masked, scan::first_where_masked;
}

/// [`tiles::dot_tile`] after its length checks: where the CPU has AVX-512 VNNI the one-row
/// EVEX kernel for `RM` a multiple of 4 and `RN == 1`, the 512-bit kernel for even `RM` and
/// `RN > 1`; else the AVX-VNNI kernel where the CPU has AVX-VNNI, else the AVX2 one, else
/// the portable one (all give the same bits). (The EVEX kernel with three activation rows
/// was faster on weights in L1 but slower than the 512-bit one in MUL_MAT's L2 tiles.)
pub(super) fn dot_tile<const RM: usize, const RN: usize>(
    kind: Q0,
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]; RM],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if RM.is_multiple_of(4) && RN == 1 && avx512::has_avx512_vnni() {
            // SAFETY: `has_avx512_vnni` checked the kernel's features; `tiles::dot_tile`
            // checked the lengths; RM is a multiple of 4 and RN is 1.
            unsafe {
                match kind {
                    Q0::Q4_0 => avx512::dot_tile_vl1::<RM, RN, false>(w, y, out),
                    Q0::Q8_0 => avx512::dot_tile_vl1::<RM, RN, true>(w, y, out),
                }
            }
            return;
        }
        if RM.is_multiple_of(2) && RN > 1 && avx512::has_avx512_vnni() {
            // SAFETY: `has_avx512_vnni` checked AVX-512 F/BW/VL/VNNI besides AVX2, FMA and
            // F16C, the features the kernel is compiled for; `tiles::dot_tile` checked the
            // lengths; RM is even.
            unsafe {
                match kind {
                    Q0::Q4_0 => avx512::dot_tile_zmm::<RM, RN, false>(w, y, out),
                    Q0::Q8_0 => avx512::dot_tile_zmm::<RM, RN, true>(w, y, out),
                }
            }
            return;
        }
        if avx2::has_avx2() {
            let vnni = avx2_tiles::has_avx_vnni();
            // SAFETY: `has_avx2` checked that this CPU supports AVX2, FMA and F16C, the
            // features the kernels are compiled for, and the VNNI instantiations run only where
            // `has_avx_vnni` found AVX-VNNI; `tiles::dot_tile` checked that every weight row
            // holds as many blocks as the activation rows, the kernels' only other requirement.
            unsafe {
                match (kind, vnni) {
                    (Q0::Q4_0, false) => avx2_tiles::dot_tile::<RM, RN, false, false>(w, y, out),
                    (Q0::Q4_0, true) => avx2_tiles::dot_tile::<RM, RN, false, true>(w, y, out),
                    (Q0::Q8_0, false) => avx2_tiles::dot_tile::<RM, RN, true, false>(w, y, out),
                    (Q0::Q8_0, true) => avx2_tiles::dot_tile::<RM, RN, true, true>(w, y, out),
                }
            }
            return;
        }
    }
    tiles::dot_tile_portable(kind, w, y, out);
}

/// [`dot_tile`] forced onto the AVX2 kernel (`vnni` false) or the AVX-VNNI one, for the
/// tile benchmarks (`benches/tiles.rs`); `None` where the CPU lacks the features.
pub fn dot_tile_variant<const RM: usize, const RN: usize>(
    kind: Q0,
    vnni: bool,
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]; RM],
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::has_avx2() && (!vnni || avx2_tiles::has_avx_vnni()) {
            // SAFETY: the features were checked just above; the caller passes rows of equal
            // blocks.
            unsafe {
                match (kind, vnni) {
                    (Q0::Q4_0, false) => avx2_tiles::dot_tile::<RM, RN, false, false>(w, y, out),
                    (Q0::Q4_0, true) => avx2_tiles::dot_tile::<RM, RN, false, true>(w, y, out),
                    (Q0::Q8_0, false) => avx2_tiles::dot_tile::<RM, RN, true, false>(w, y, out),
                    (Q0::Q8_0, true) => avx2_tiles::dot_tile::<RM, RN, true, true>(w, y, out),
                }
            }
            return Some(());
        }
    }
    None
}

/// The one-activation-row float kernel with `G` rows per group, each prefetched
/// `ahead_rows` rows ahead (none if 0), for the tile benchmarks (`benches/tiles.rs`); `None`
/// where the CPU lacks AVX-512 F or the rows have a tail.
pub fn dot_float_row1_variant<const G: usize>(
    kind: tiles::FloatRows,
    w: StridedRows<'_>,
    y: &[f32],
    ahead_rows: usize,
    out: &mut [f32],
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        let ok = w.row_len() == kind.bytes() * y.len() && out.len() == w.count();
        if ok && dot_float_rows_fast(y.len()) && avx512f::has_avx512f() {
            let (steps, ahead) = (y.len() / 32, ahead_rows * w.row_len());
            // SAFETY: features and lengths checked.
            unsafe {
                match kind {
                    tiles::FloatRows::F16 => {
                        avx512f::dot_float_row1_zmm::<true, G>(w, y.as_ptr(), steps, ahead, out)
                    }
                    tiles::FloatRows::F32 => {
                        avx512f::dot_float_row1_zmm::<false, G>(w, y.as_ptr(), steps, ahead, out)
                    }
                }
            }
            return Some(());
        }
    }
    None
}

/// The AVX-512 VNNI tile kernel forced for any shape (even `RM`), for the tile benchmarks
/// (`benches/tiles.rs`); `None` where the CPU lacks it.
pub fn dot_tile_zmm_variant<const RM: usize, const RN: usize>(
    kind: Q0,
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]; RM],
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if RM.is_multiple_of(2) && avx512::has_avx512_vnni() {
            // SAFETY: features checked; the caller passes rows of equal blocks; RM even.
            unsafe {
                match kind {
                    Q0::Q4_0 => avx512::dot_tile_zmm::<RM, RN, false>(w, y, out),
                    Q0::Q8_0 => avx512::dot_tile_zmm::<RM, RN, true>(w, y, out),
                }
            }
            return Some(());
        }
    }
    None
}

/// The one-row EVEX kernel, for the tile benchmarks (`benches/tiles.rs`); `None` where the
/// CPU lacks it.
pub fn dot_tile_vl1_variant<const RM: usize>(
    kind: Q0,
    w: &[&[u8]; RM],
    y: &Q8Row<'_>,
    out: &mut [[f32; 1]; RM],
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if RM.is_multiple_of(4) && avx512::has_avx512_vnni() {
            // SAFETY: features checked; the caller passes rows of equal blocks; RM % 4 == 0,
            // one activation row.
            unsafe {
                let y = std::array::from_ref(y);
                match kind {
                    Q0::Q4_0 => avx512::dot_tile_vl1::<RM, 1, false>(w, y, out),
                    Q0::Q8_0 => avx512::dot_tile_vl1::<RM, 1, true>(w, y, out),
                }
            }
            return Some(());
        }
    }
    None
}

/// Whether the CPU has the AVX-512 VNNI tile kernels.
pub(super) fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::has_avx512_vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU is AMD's (CPUID vendor "AuthenticAMD", or "HygonGenuine", whose cores are
/// AMD's), probed once: for kernel choices measured per vendor.
pub(super) fn amd_cores() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AMD.get_or_init(|| {
            let leaf = std::arch::x86_64::__cpuid(0);
            let mut vendor = [0u8; 12];
            for (part, word) in vendor
                .chunks_exact_mut(4)
                .zip([leaf.ebx, leaf.edx, leaf.ecx])
            {
                part.copy_from_slice(&word.to_le_bytes());
            }
            matches!(&vendor, b"AuthenticAMD" | b"HygonGenuine")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `scan::row_max`: the AVX2 lane maximum and NaN test where the CPU has AVX2+FMA+F16C (the
/// same value; a row with a NaN goes back to the in-order scan), the portable code otherwise.
pub(super) fn row_max(w: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::has_avx2() {
            // SAFETY: `has_avx2` checked AVX2, FMA and F16C, the kernel's features; it reads
            // only inside the slice.
            if let Some(max) = unsafe { avx2::row_max_no_nan(w) } {
                return max;
            }
        }
    }
    scan::row_max(w)
}

/// `v[i] = v[i].exp()` for every element, with the bits of `f32::exp` (the platform's
/// `expf`): eight at a time where the CPU has AVX-512 F and `f32::exp` is glibc's FMA
/// `expf` (its algorithm redone in f64 lanes, instruction for instruction; checked once at
/// run time against `f32::exp` on a sweep of the floats, else never used), one by one
/// otherwise and for the values outside glibc's fast path (`|x| >= 88`, infinities, NaNs).
pub(super) fn exp_in_place(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if expf::glibc_expf_ok() {
            // SAFETY: `glibc_expf_ok` checked AVX-512 F, AVX2 and FMA; the kernel touches only
            // the slice.
            unsafe { expf::exp_glibc(v) };
            return;
        }
    }
    v.iter_mut().for_each(|x| *x = x.exp());
}

/// Whether [`exp_in_place`] takes the vectorized path here (for the tests).
#[cfg(test)]
pub(super) fn exp_vectorized() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        expf::glibc_expf_ok()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`tiles::dot_rows`] after its checks: one kernel choice for all the rows.
pub(super) fn dot_rows<const RN: usize>(
    kind: Q0,
    w: StridedRows<'_>,
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::has_avx512_vnni() {
            // SAFETY: as in `dot_tile` (AVX-512 VNNI and the rest checked by
            // `has_avx512_vnni`, lengths by `tiles::dot_rows`).
            unsafe {
                match kind {
                    Q0::Q4_0 => avx512::dot_rows_zmm::<RN, false>(w, y, out),
                    Q0::Q8_0 => avx512::dot_rows_zmm::<RN, true>(w, y, out),
                }
            }
            return;
        }
        if avx2::has_avx2() {
            let vnni = avx2_tiles::has_avx_vnni();
            // SAFETY: as in `dot_tile` (features checked here, lengths by `tiles::dot_rows`).
            unsafe {
                match (kind, vnni) {
                    (Q0::Q4_0, false) => avx2_tiles::dot_rows::<RN, false, false>(w, y, out),
                    (Q0::Q4_0, true) => avx2_tiles::dot_rows::<RN, false, true>(w, y, out),
                    (Q0::Q8_0, false) => avx2_tiles::dot_rows::<RN, true, false>(w, y, out),
                    (Q0::Q8_0, true) => avx2_tiles::dot_rows::<RN, true, true>(w, y, out),
                }
            }
            return;
        }
    }
    tiles::for_each_group(
        w,
        out,
        |g, o| tiles::dot_tile_portable(kind, g, y, o),
        |r, o| tiles::dot_tile_portable(kind, &[r], y, std::array::from_mut(o)),
    );
}

/// [`vec_dot_f16`] of two rows with one, sharing the work on `y` where the rows have no
/// tail (lengths checked by the caller: all equal).
pub(super) fn vec_dot_f16_x2(x: &[&[u8]; 2], y: &[u8]) -> [f32; 2] {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::has_avx2() && y.len().is_multiple_of(2 * float::LANES) {
            // SAFETY: AVX2, FMA and F16C checked; the caller passes rows of `y`'s length,
            // a multiple of 64 bytes (checked here).
            return unsafe { avx2::vec_dot_f16_x2(x, y) };
        }
    }
    [vec_dot_f16(x[0], y), vec_dot_f16(x[1], y)]
}

/// Whether [`dot_float_rows`] takes a register-blocked kernel for rows of `n` elements:
/// whole steps of 32 (no tail) on a CPU with AVX2 (the AVX-512 F one where it has that).
pub(super) fn dot_float_rows_fast(n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        n.is_multiple_of(float::LANES) && avx2::has_avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = n;
        false
    }
}

/// `quant::with_fma`: `body` in a function built with AVX2 and FMA (the closure, called once,
/// is inlined into it and compiled with those features), where [`avx2::has_avx2`] holds.
#[inline(always)]
pub(super) fn with_fma(body: impl FnOnce()) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx2::has_avx2() {
        /// # Safety
        /// The CPU must have AVX2 and FMA.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run(body: impl FnOnce()) {
            body()
        }
        // SAFETY: `has_avx2` checked AVX2, FMA and F16C.
        unsafe { run(body) };
        return true;
    }
    let _ = body;
    false
}

/// [`tiles::dot_float_rows`] after its checks (every row of `w` `kind.bytes()` times as many
/// bytes as each row of `y` has values, `out` as long as `w`): where [`dot_float_rows_fast`]
/// holds the AVX-512 kernels, or the AVX2 ones on a CPU without AVX-512 F, else the portable
/// `vec_dot` per pair (all give the same bits).
pub(super) fn dot_float_rows<const RN: usize>(
    kind: tiles::FloatRows,
    w: StridedRows<'_>,
    y: &[&[f32]; RN],
    out: &mut [[f32; RN]],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let n = y.first().map_or(0, |r| r.len());
        if dot_float_rows_fast(n) {
            use tiles::FloatRows::{F16, F32};
            // SAFETY: `dot_float_rows_fast` checked AVX2, FMA and F16C (and AVX-512 F is
            // checked here) and that the rows are whole steps of 32 values; the caller
            // checked the lengths (each weight row `kind.bytes()` bytes per value).
            unsafe {
                match (kind, avx512f::has_avx512f()) {
                    (F16, true) => avx512f::dot_float_rows_zmm::<RN, true>(w, y, out),
                    (F32, true) => avx512f::dot_float_rows_zmm::<RN, false>(w, y, out),
                    (F16, false) => avx2_float::dot_float_rows_ymm::<RN, true>(w, y, out),
                    (F32, false) => avx2_float::dot_float_rows_ymm::<RN, false>(w, y, out),
                }
            };
            return;
        }
    }
    let mut portable = || {
        for (n, o) in out.iter_mut().enumerate().take(w.count()) {
            for (o, y) in o.iter_mut().zip(y) {
                *o = kind.portable(w.row(n), y);
            }
        }
    };
    // the lanes' `mul_add` is one instruction with FMA, a library call without
    if !with_fma(&mut portable) {
        portable();
    }
}

/// [`dot_float_rows`] through the AVX2 kernels even on a CPU with AVX-512 F (for the tests,
/// so that every machine checks them); false where the CPU lacks AVX2 or the rows have a
/// tail (nothing written).
#[cfg(test)]
pub(super) fn dot_float_rows_avx2<const RN: usize>(
    kind: tiles::FloatRows,
    w: StridedRows<'_>,
    y: &[&[f32]; RN],
    out: &mut [[f32; RN]],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let n = y.first().map_or(0, |r| r.len());
        if dot_float_rows_fast(n) {
            // SAFETY: as in `dot_float_rows` (the caller, a test, passes checked lengths).
            unsafe {
                match kind {
                    tiles::FloatRows::F16 => avx2_float::dot_float_rows_ymm::<RN, true>(w, y, out),
                    tiles::FloatRows::F32 => avx2_float::dot_float_rows_ymm::<RN, false>(w, y, out),
                }
            };
            return true;
        }
    }
    let _ = (kind, w, y, out);
    false
}

/// The leading weight rows of [`tiles::columns_to_rows`] that a vector kernel moved (a
/// multiple of 16; 0 where none applies: the caller moves the rest).
pub(super) fn columns_to_rows<const N: usize>(group: &[[f32; N]], out: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if N == 3 && out.len() == N * group.len() && avx512f::has_avx512f() {
            // SAFETY: `has_avx512f` checked AVX-512 F; `N` is 3 and `out` holds the three rows.
            return unsafe { avx512f::columns_to_rows3_zmm(group.as_flattened(), out) };
        }
    }
    let _ = (group, out);
    0
}

/// [`tiles::dot_q4_k_rows`] after its checks: the AVX2 kernel where the CPU has AVX2, else
/// [`vec_dot_q4_k_q8_k`] per pair (the same bits).
pub(super) fn dot_q4_k_rows<const RN: usize>(
    w: StridedRows<'_>,
    y: &[&[u8]; RN],
    out: &mut [[f32; RN]],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::has_avx512_vnni() {
            if RN == avx512::Q4K_VNNI_ROWS {
                // SAFETY: `has_avx512_vnni` checked AVX-512 F, BW, VL and VNNI (and AVX2,
                // FMA, F16C); `RN` is checked; the caller checked the lengths.
                unsafe { avx512::dot_q4_k_rows_vnni(w, y, out) };
                return;
            }
            if RN == 1 {
                // SAFETY: `has_avx512_vnni` checked AVX-512 F, BW and VL (and AVX2, FMA,
                // F16C); `RN` is checked; the caller checked the lengths.
                unsafe { avx512::dot_q4_k_row1_zmm(w, y, out) };
                return;
            }
            // SAFETY: `has_avx512_vnni` checked AVX-512 F and BW (and AVX2, FMA, F16C); the
            // caller checked the lengths.
            unsafe { avx512::dot_q4_k_rows_zmm(w, y, out) };
            return;
        }
        if avx2::has_avx2() {
            // SAFETY: `has_avx2` checked AVX2, FMA and F16C; the caller checked the lengths.
            unsafe { avx2::dot_q4_k_rows(w, y, out) };
            return;
        }
    }
    for (n, o) in out.iter_mut().enumerate().take(w.count()) {
        for (o, y) in o.iter_mut().zip(y) {
            *o = vec_dot_q4_k_q8_k(w.row(n), y);
        }
    }
}

/// Activation rows per call that [`dot_q4_k_rows`] is fastest with on this CPU: 16 with
/// the AVX-512 VNNI kernel (one activation row per i32 lane), else 8.
pub(super) fn q4_k_rows_per_call() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::has_avx512_vnni() {
            return avx512::Q4K_VNNI_ROWS;
        }
    }
    8
}

/// Every implementation of [`dot_q4_k_rows`] this CPU can run, with its name (for the test
/// that checks they agree bit for bit).
#[cfg(test)]
pub(super) fn dot_q4_k_rows_all<const RN: usize>(
    w: StridedRows<'_>,
    y: &[&[u8]; RN],
) -> Vec<(&'static str, Vec<[f32; RN]>)> {
    let mut all = Vec::new();
    let mut out = vec![[0f32; RN]; w.count()];
    for (n, o) in out.iter_mut().enumerate() {
        for (o, y) in o.iter_mut().zip(y) {
            *o = k_quants::vec_dot_q4_k_q8_k(w.row(n), y);
        }
    }
    all.push(("portable", out.clone()));
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::has_avx2() {
            // SAFETY: as in `dot_q4_k_rows` (AVX2 checked).
            unsafe { avx2::dot_q4_k_rows(w, y, &mut out) };
            all.push(("avx2", out.clone()));
        }
        if avx512::has_avx512_vnni() {
            // SAFETY: as in `dot_q4_k_rows` (AVX-512 F and BW checked).
            unsafe { avx512::dot_q4_k_rows_zmm(w, y, &mut out) };
            all.push(("avx512", out.clone()));
            if RN == 1 {
                // SAFETY: as in `dot_q4_k_rows` (AVX-512 F, BW, VL and `RN` checked).
                unsafe { avx512::dot_q4_k_row1_zmm(w, y, &mut out) };
                all.push(("avx512-row1", out.clone()));
            }
            if RN == avx512::Q4K_VNNI_ROWS {
                // SAFETY: as in `dot_q4_k_rows` (AVX-512 VNNI and `RN` checked).
                unsafe { avx512::dot_q4_k_rows_vnni(w, y, &mut out) };
                all.push(("avx512-vnni", out.clone()));
            }
        }
    }
    all
}

/// Every implementation of [`dot_tile`] this CPU can run, with its name (for the tests that
/// check they agree bit for bit).
#[cfg(test)]
pub(super) fn dot_tile_all<const RM: usize, const RN: usize>(
    kind: Q0,
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
) -> Vec<(&'static str, [[f32; RN]; RM])> {
    let mut all = Vec::new();
    let mut out = [[0f32; RN]; RM];
    tiles::dot_tile_portable(kind, w, y, &mut out);
    all.push(("portable", out));
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::has_avx2() {
            // SAFETY: as in `dot_tile` (AVX2 checked; the caller passes rows of equal blocks).
            unsafe {
                match kind {
                    Q0::Q4_0 => avx2_tiles::dot_tile::<RM, RN, false, false>(w, y, &mut out),
                    Q0::Q8_0 => avx2_tiles::dot_tile::<RM, RN, true, false>(w, y, &mut out),
                }
            }
            all.push(("avx2", out));
        }
        if avx2_tiles::has_avx_vnni() {
            // SAFETY: as in `dot_tile` (AVX2 and AVX-VNNI checked).
            unsafe {
                match kind {
                    Q0::Q4_0 => avx2_tiles::dot_tile::<RM, RN, false, true>(w, y, &mut out),
                    Q0::Q8_0 => avx2_tiles::dot_tile::<RM, RN, true, true>(w, y, &mut out),
                }
            }
            all.push(("avx-vnni", out));
        }
        if RM.is_multiple_of(4) && RN == 1 && avx512::has_avx512_vnni() {
            // SAFETY: as in `dot_tile` (AVX-512 VNNI checked; RM a multiple of 4, RN 1).
            unsafe {
                match kind {
                    Q0::Q4_0 => avx512::dot_tile_vl1::<RM, RN, false>(w, y, &mut out),
                    Q0::Q8_0 => avx512::dot_tile_vl1::<RM, RN, true>(w, y, &mut out),
                }
            }
            all.push(("avx512-vl one row", out));
        }
        if RM.is_multiple_of(2) && avx512::has_avx512_vnni() {
            // SAFETY: as in `dot_tile` (AVX-512 VNNI checked; RM even).
            unsafe {
                match kind {
                    Q0::Q4_0 => avx512::dot_tile_zmm::<RM, RN, false>(w, y, &mut out),
                    Q0::Q8_0 => avx512::dot_tile_zmm::<RM, RN, true>(w, y, &mut out),
                }
            }
            all.push(("avx512-vnni", out));
        }
    }
    all
}
