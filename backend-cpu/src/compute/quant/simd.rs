//! Runtime CPU-feature dispatch and the hand-written AVX2 kernels (x86-64 only).
//!
//! The portable kernels are `#[inline(always)]` functions; every entry point here instantiates
//! one twice, as plain code and inside a function compiled for AVX2+FMA+F16C, and runs the
//! latter when the CPU has those features, so the compiler auto-vectorizes the kernel with
//! 256-bit instructions (default x86-64 code only has SSE2). The hottest dot products have
//! explicit AVX2 versions instead: the quantized ones compute the same exact integer block
//! sums as the portable code and combine them in f32 with the same scalar code in the same
//! order, the F16 one keeps the portable code's 32 f32 lanes (multiply, then add), so their
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
//! `float::vec_dot_f16` / `float::vec_dot_f32` in two zmm per output (multiply then add, no
//! FMA). With one activation row (generation: the output projection streams several MB of
//! weights) it takes three consecutive weight rows at a time, prefetched 16 KiB ahead (F32:
//! one row, 8 KiB). Its results (per weight row, one per activation row) become destination
//! rows through `vpermt2ps`, sixteen weight rows at a time (`columns_to_rows3_zmm`). The Q4_K
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

use super::tiles::{self, Q8Row, StridedRows, Q0};
use super::{float, k_quants, q4, q5, q8, scan};

/// Whether the AVX2 paths are taken on this machine.
#[cfg(test)]
pub(super) fn avx2_active() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::has_avx2()
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
                if x86::has_avx2() {
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

    vec_dot_f32(x: &[u8], y: &[u8]) -> f32 = float::vec_dot_f32;
    vec_dot_bf16(x: &[u8], y: &[u8]) -> f32 = float::vec_dot_bf16;
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
                if x86::has_avx2() {
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
    vec_dot_f16(x: &[u8], y: &[u8]) -> f32 => x86::vec_dot_f16, float::vec_dot_f16;
    /// Q4_1 x Q8_1 over whole blocks.
    vec_dot_q4_1_q8_1(x: &[u8], y: &[u8]) -> f32 => x86::vec_dot_q4_1_q8_1, q4::vec_dot_q4_1_q8_1;
    /// Q5_0 x Q8_0 over whole blocks.
    vec_dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 => x86::vec_dot_q5_0_q8_0, q5::vec_dot_q5_0_q8_0;
    /// Q5_1 x Q8_1 over whole blocks.
    vec_dot_q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 => x86::vec_dot_q5_1_q8_1, q5::vec_dot_q5_1_q8_1;
    /// Q4_0 x Q8_0 over whole blocks (`x`, `y` exact multiples of the block sizes).
    vec_dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 => x86::vec_dot_q4_0_q8_0, q4::vec_dot_q4_0_q8_0;
    /// Q8_0 x Q8_0 over whole blocks.
    vec_dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 => x86::vec_dot_q8_0_q8_0, q8::vec_dot_q8_0_q8_0;
    /// Q4_K x Q8_K over whole super-blocks.
    vec_dot_q4_k_q8_k(x: &[u8], y: &[u8]) -> f32
        => x86::vec_dot_q4_k_q8_k, k_quants::vec_dot_q4_k_q8_k;
    /// Q5_K x Q8_K over whole super-blocks.
    vec_dot_q5_k_q8_k(x: &[u8], y: &[u8]) -> f32
        => x86::vec_dot_q5_k_q8_k, k_quants::vec_dot_q5_k_q8_k;
    /// Q6_K x Q8_K over whole super-blocks.
    vec_dot_q6_k_q8_k(x: &[u8], y: &[u8]) -> f32
        => x86::vec_dot_q6_k_q8_k, k_quants::vec_dot_q6_k_q8_k;
    /// `q8::quantize_q8_0` (ggml-cpu's AVX `quantize_row_q8_0`): the same maxima, scale,
    /// rounding and clamping, the same bytes.
    quantize_q8_0(src: &[f32], dst: &mut [u8]) => x86::quantize_q8_0, q8::quantize_q8_0;
    /// `float::quantize_f16` through F16C's `vcvtps2ph` eight values at a time (the
    /// instruction the `half` crate takes on such a CPU: the same bytes).
    quantize_f16(src: &[f32], dst: &mut [u8]) => x86::quantize_f16, float::quantize_f16;
    /// `float::round_f16`: F16C there and back, eight values at a time (the same bits).
    round_f16(values: &mut [f32]) => x86::round_f16, float::round_f16;
    /// `scan::first_where_masked`: sixteen compares and two move-masks per step (the same
    /// index).
    first_where_masked(w: &[f32], masked: bool) -> usize
        => x86::first_where_masked, scan::first_where_masked;
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
        if RM.is_multiple_of(4) && RN == 1 && x86::has_avx512_vnni() {
            // SAFETY: `has_avx512_vnni` checked the kernel's features; `tiles::dot_tile`
            // checked the lengths; RM is a multiple of 4 and RN is 1.
            unsafe {
                match kind {
                    Q0::Q4_0 => x86::dot_tile_vl1::<RM, RN, false>(w, y, out),
                    Q0::Q8_0 => x86::dot_tile_vl1::<RM, RN, true>(w, y, out),
                }
            }
            return;
        }
        if RM.is_multiple_of(2) && RN > 1 && x86::has_avx512_vnni() {
            // SAFETY: `has_avx512_vnni` checked AVX-512 F/BW/VL/VNNI besides AVX2, FMA and
            // F16C, the features the kernel is compiled for; `tiles::dot_tile` checked the
            // lengths; RM is even.
            unsafe {
                match kind {
                    Q0::Q4_0 => x86::dot_tile_zmm::<RM, RN, false>(w, y, out),
                    Q0::Q8_0 => x86::dot_tile_zmm::<RM, RN, true>(w, y, out),
                }
            }
            return;
        }
        if x86::has_avx2() {
            let vnni = x86::has_avx_vnni();
            // SAFETY: `has_avx2` checked that this CPU supports AVX2, FMA and F16C, the
            // features the kernels are compiled for, and the VNNI instantiations run only where
            // `has_avx_vnni` found AVX-VNNI; `tiles::dot_tile` checked that every weight row
            // holds as many blocks as the activation rows, the kernels' only other requirement.
            unsafe {
                match (kind, vnni) {
                    (Q0::Q4_0, false) => x86::dot_tile::<RM, RN, false, false>(w, y, out),
                    (Q0::Q4_0, true) => x86::dot_tile::<RM, RN, false, true>(w, y, out),
                    (Q0::Q8_0, false) => x86::dot_tile::<RM, RN, true, false>(w, y, out),
                    (Q0::Q8_0, true) => x86::dot_tile::<RM, RN, true, true>(w, y, out),
                }
            }
            return;
        }
    }
    tiles::dot_tile_portable(kind, w, y, out);
}

/// [`dot_tile`] forced onto the AVX2 kernel (`vnni` false) or the AVX-VNNI one, for the
/// throughput test; `None` where the CPU lacks the features.
#[cfg(test)]
pub(super) fn dot_tile_variant<const RM: usize, const RN: usize>(
    kind: Q0,
    vnni: bool,
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]; RM],
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx2() && (!vnni || x86::has_avx_vnni()) {
            // SAFETY: the features were checked just above; the caller passes rows of equal
            // blocks.
            unsafe {
                match (kind, vnni) {
                    (Q0::Q4_0, false) => x86::dot_tile::<RM, RN, false, false>(w, y, out),
                    (Q0::Q4_0, true) => x86::dot_tile::<RM, RN, false, true>(w, y, out),
                    (Q0::Q8_0, false) => x86::dot_tile::<RM, RN, true, false>(w, y, out),
                    (Q0::Q8_0, true) => x86::dot_tile::<RM, RN, true, true>(w, y, out),
                }
            }
            return Some(());
        }
    }
    None
}

/// The one-activation-row float kernel with `G` rows per group and prefetch distance `PF`,
/// for the throughput test; `None` where the CPU lacks AVX-512 F or the rows have a tail.
#[cfg(test)]
pub(super) fn dot_float_row1_variant<const G: usize, const PF: usize>(
    kind: tiles::FloatRows,
    w: StridedRows<'_>,
    y: &[f32],
    out: &mut [f32],
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        let ok = w.row_len() == kind.bytes() * y.len() && out.len() == w.count();
        if ok && dot_float_rows_fast(y.len()) {
            let steps = y.len() / 32;
            // SAFETY: features and lengths checked.
            unsafe {
                match kind {
                    tiles::FloatRows::F16 => {
                        x86::dot_float_row1_zmm::<true, G, PF>(w, y.as_ptr(), steps, out)
                    }
                    tiles::FloatRows::F32 => {
                        x86::dot_float_row1_zmm::<false, G, PF>(w, y.as_ptr(), steps, out)
                    }
                }
            }
            return Some(());
        }
    }
    None
}

/// The AVX-512 VNNI tile kernel forced for any shape (even `RM`), for the throughput test;
/// `None` where the CPU lacks it.
#[cfg(test)]
pub(super) fn dot_tile_zmm_variant<const RM: usize, const RN: usize>(
    kind: Q0,
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]; RM],
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if RM.is_multiple_of(2) && x86::has_avx512_vnni() {
            // SAFETY: features checked; the caller passes rows of equal blocks; RM even.
            unsafe {
                match kind {
                    Q0::Q4_0 => x86::dot_tile_zmm::<RM, RN, false>(w, y, out),
                    Q0::Q8_0 => x86::dot_tile_zmm::<RM, RN, true>(w, y, out),
                }
            }
            return Some(());
        }
    }
    None
}

/// The one-row EVEX kernel, for the throughput test; `None` where the CPU lacks it.
#[cfg(test)]
pub(super) fn dot_tile_vl1_variant<const RM: usize>(
    kind: Q0,
    w: &[&[u8]; RM],
    y: &Q8Row<'_>,
    out: &mut [[f32; 1]; RM],
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if RM.is_multiple_of(4) && x86::has_avx512_vnni() {
            // SAFETY: features checked; the caller passes rows of equal blocks; RM % 4 == 0,
            // one activation row.
            unsafe {
                let y = std::array::from_ref(y);
                match kind {
                    Q0::Q4_0 => x86::dot_tile_vl1::<RM, 1, false>(w, y, out),
                    Q0::Q8_0 => x86::dot_tile_vl1::<RM, 1, true>(w, y, out),
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
        x86::has_avx512_vnni()
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
        if x86::has_avx2() {
            // SAFETY: `has_avx2` checked AVX2, FMA and F16C, the kernel's features; it reads
            // only inside the slice.
            if let Some(max) = unsafe { x86::row_max_no_nan(w) } {
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
        if x86::glibc_expf_ok() {
            // SAFETY: `glibc_expf_ok` checked AVX-512 F, AVX2 and FMA; the kernel touches only
            // the slice.
            unsafe { x86::exp_glibc(v) };
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
        x86::glibc_expf_ok()
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
        if x86::has_avx512_vnni() {
            // SAFETY: as in `dot_tile` (AVX-512 VNNI and the rest checked by
            // `has_avx512_vnni`, lengths by `tiles::dot_rows`).
            unsafe {
                match kind {
                    Q0::Q4_0 => x86::dot_rows_zmm::<RN, false>(w, y, out),
                    Q0::Q8_0 => x86::dot_rows_zmm::<RN, true>(w, y, out),
                }
            }
            return;
        }
        if x86::has_avx2() {
            let vnni = x86::has_avx_vnni();
            // SAFETY: as in `dot_tile` (features checked here, lengths by `tiles::dot_rows`).
            unsafe {
                match (kind, vnni) {
                    (Q0::Q4_0, false) => x86::dot_rows::<RN, false, false>(w, y, out),
                    (Q0::Q4_0, true) => x86::dot_rows::<RN, false, true>(w, y, out),
                    (Q0::Q8_0, false) => x86::dot_rows::<RN, true, false>(w, y, out),
                    (Q0::Q8_0, true) => x86::dot_rows::<RN, true, true>(w, y, out),
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
        if x86::has_avx2() && y.len().is_multiple_of(2 * float::LANES) {
            // SAFETY: AVX2, FMA and F16C checked; the caller passes rows of `y`'s length,
            // a multiple of 64 bytes (checked here).
            return unsafe { x86::vec_dot_f16_x2(x, y) };
        }
    }
    [vec_dot_f16(x[0], y), vec_dot_f16(x[1], y)]
}

/// Whether [`dot_float_rows`] takes the AVX-512 kernels for rows of `n` elements: whole
/// steps of 32 (no tail) on a CPU with AVX-512 F.
pub(super) fn dot_float_rows_fast(n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        n.is_multiple_of(float::LANES) && x86::has_avx512f()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = n;
        false
    }
}

/// [`tiles::dot_float_rows`] after its checks (every row of `w` `kind.bytes()` times as many
/// bytes as each row of `y` has values, `out` as long as `w`): the AVX-512 kernels where
/// [`dot_float_rows_fast`] holds, else the portable `vec_dot` per pair (the same bits).
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
            // SAFETY: `dot_float_rows_fast` checked AVX-512 F (and AVX2, FMA, F16C) and that
            // the rows are whole steps of 32 values; the caller checked the lengths (each
            // weight row `kind.bytes()` bytes per value).
            unsafe {
                match kind {
                    tiles::FloatRows::F16 => x86::dot_float_rows_zmm::<RN, true>(w, y, out),
                    tiles::FloatRows::F32 => x86::dot_float_rows_zmm::<RN, false>(w, y, out),
                }
            };
            return;
        }
    }
    for (n, o) in out.iter_mut().enumerate().take(w.count()) {
        for (o, y) in o.iter_mut().zip(y) {
            *o = kind.portable(w.row(n), y);
        }
    }
}

/// The leading weight rows of [`tiles::columns_to_rows`] that a vector kernel moved (a
/// multiple of 16; 0 where none applies: the caller moves the rest).
pub(super) fn columns_to_rows<const N: usize>(group: &[[f32; N]], out: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if N == 3 && out.len() == N * group.len() && x86::has_avx512f() {
            // SAFETY: `has_avx512f` checked AVX-512 F; `N` is 3 and `out` holds the three rows.
            return unsafe { x86::columns_to_rows3_zmm(group.as_flattened(), out) };
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
        if x86::has_avx512_vnni() {
            if RN == x86::Q4K_VNNI_ROWS {
                // SAFETY: `has_avx512_vnni` checked AVX-512 F, BW, VL and VNNI (and AVX2,
                // FMA, F16C); `RN` is checked; the caller checked the lengths.
                unsafe { x86::dot_q4_k_rows_vnni(w, y, out) };
                return;
            }
            if RN == 1 {
                // SAFETY: `has_avx512_vnni` checked AVX-512 F, BW and VL (and AVX2, FMA,
                // F16C); `RN` is checked; the caller checked the lengths.
                unsafe { x86::dot_q4_k_row1_zmm(w, y, out) };
                return;
            }
            // SAFETY: `has_avx512_vnni` checked AVX-512 F and BW (and AVX2, FMA, F16C); the
            // caller checked the lengths.
            unsafe { x86::dot_q4_k_rows_zmm(w, y, out) };
            return;
        }
        if x86::has_avx2() {
            // SAFETY: `has_avx2` checked AVX2, FMA and F16C; the caller checked the lengths.
            unsafe { x86::dot_q4_k_rows(w, y, out) };
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
        if x86::has_avx512_vnni() {
            return x86::Q4K_VNNI_ROWS;
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
        if x86::has_avx2() {
            // SAFETY: as in `dot_q4_k_rows` (AVX2 checked).
            unsafe { x86::dot_q4_k_rows(w, y, &mut out) };
            all.push(("avx2", out.clone()));
        }
        if x86::has_avx512_vnni() {
            // SAFETY: as in `dot_q4_k_rows` (AVX-512 F and BW checked).
            unsafe { x86::dot_q4_k_rows_zmm(w, y, &mut out) };
            all.push(("avx512", out.clone()));
            if RN == 1 {
                // SAFETY: as in `dot_q4_k_rows` (AVX-512 F, BW, VL and `RN` checked).
                unsafe { x86::dot_q4_k_row1_zmm(w, y, &mut out) };
                all.push(("avx512-row1", out.clone()));
            }
            if RN == x86::Q4K_VNNI_ROWS {
                // SAFETY: as in `dot_q4_k_rows` (AVX-512 VNNI and `RN` checked).
                unsafe { x86::dot_q4_k_rows_vnni(w, y, &mut out) };
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
        if x86::has_avx2() {
            // SAFETY: as in `dot_tile` (AVX2 checked; the caller passes rows of equal blocks).
            unsafe {
                match kind {
                    Q0::Q4_0 => x86::dot_tile::<RM, RN, false, false>(w, y, &mut out),
                    Q0::Q8_0 => x86::dot_tile::<RM, RN, true, false>(w, y, &mut out),
                }
            }
            all.push(("avx2", out));
        }
        if x86::has_avx_vnni() {
            // SAFETY: as in `dot_tile` (AVX2 and AVX-VNNI checked).
            unsafe {
                match kind {
                    Q0::Q4_0 => x86::dot_tile::<RM, RN, false, true>(w, y, &mut out),
                    Q0::Q8_0 => x86::dot_tile::<RM, RN, true, true>(w, y, &mut out),
                }
            }
            all.push(("avx-vnni", out));
        }
        if RM.is_multiple_of(4) && RN == 1 && x86::has_avx512_vnni() {
            // SAFETY: as in `dot_tile` (AVX-512 VNNI checked; RM a multiple of 4, RN 1).
            unsafe {
                match kind {
                    Q0::Q4_0 => x86::dot_tile_vl1::<RM, RN, false>(w, y, &mut out),
                    Q0::Q8_0 => x86::dot_tile_vl1::<RM, RN, true>(w, y, &mut out),
                }
            }
            all.push(("avx512-vl one row", out));
        }
        if RM.is_multiple_of(2) && x86::has_avx512_vnni() {
            // SAFETY: as in `dot_tile` (AVX-512 VNNI checked; RM even).
            unsafe {
                match kind {
                    Q0::Q4_0 => x86::dot_tile_zmm::<RM, RN, false>(w, y, &mut out),
                    Q0::Q8_0 => x86::dot_tile_zmm::<RM, RN, true>(w, y, &mut out),
                }
            }
            all.push(("avx512-vnni", out));
        }
    }
    all
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::super::tiles::{self, Q8Row, StridedRows, ROW_BIAS, ROW_BLOCK_BYTES, ROW_SCALE};

    use super::super::float::{finish_dot, get_f16, LANES};
    use super::super::k_quants::{
        combine_k4, k4_scales, mins_dot, q6_k_scales, sum_blocks, Q4_K_BYTES, Q5_K_BYTES,
        Q6_K_BYTES,
    };
    use super::super::q4::{Q4_0_BYTES, Q4_1_BYTES};
    use super::super::q5::{Q5_0_BYTES, Q5_1_BYTES};
    use super::super::q8::{Q8_0_BYTES, Q8_1_BYTES, Q8_K_BSUMS, Q8_K_BYTES};
    use super::super::{fp16, QK_K};

    /// 0: not probed yet, 1: no AVX2+FMA+F16C, 2: yes.
    static AVX2: AtomicU8 = AtomicU8::new(0);

    /// Whether the CPU supports AVX2, FMA and F16C (probed once).
    #[inline(always)]
    pub(super) fn has_avx2() -> bool {
        match AVX2.load(Ordering::Relaxed) {
            0 => {
                let yes = is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c");
                AVX2.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
            state => state == 2,
        }
    }

    /// Sum of the eight i32 lanes (wrapping; the callers' sums are exact in i32).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// 32 bytes at `at` of `b`.
    ///
    /// # Safety
    /// AVX2 must be available; `at + 32 <= N` (checked in debug builds).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load32<const N: usize>(b: &[u8; N], at: usize) -> __m256i {
        debug_assert!(at + 32 <= N);
        // SAFETY: the caller guarantees `at + 32 <= N`, so the 32 bytes read lie inside `b`;
        // `loadu` has no alignment requirement.
        _mm256_loadu_si256(b.as_ptr().add(at).cast())
    }

    /// 16 bytes at `at` of `b`.
    ///
    /// # Safety
    /// `at + 16 <= N` (checked in debug builds).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load16<const N: usize>(b: &[u8; N], at: usize) -> __m128i {
        debug_assert!(at + 16 <= N);
        // SAFETY: the caller guarantees `at + 16 <= N`, so the 16 bytes read lie inside `b`.
        _mm_loadu_si128(b.as_ptr().add(at).cast())
    }

    /// Low and high nibbles of 32 bytes, as two vectors of bytes 0..15.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn nibbles(v: __m256i) -> (__m256i, __m256i) {
        let mask = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(v, mask),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
        )
    }

    /// `sum(u * s)` per pair of bytes widened to eight i32 lanes: `u` unsigned bytes, `s`
    /// signed bytes, every pair sum within i16 (the callers keep `u <= 63`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    /// `scale * sum(u * s)` per pair of bytes widened to eight i32 lanes (same conditions as
    /// [`dot_u8_i8`], and `|scale * pair sum|` within i32).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot_u8_i8_scaled(u: __m256i, s: __m256i, scale: i32) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(scale as i16))
    }

    /// F16 x F16 row: the 32 lanes of `float::vec_dot_f16` as four vectors of eight, with the
    /// same multiply-then-add per lane, tail and reduction, so the result is bit-identical.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_f16(x: &[u8], y: &[u8]) -> f32 {
        const STEP: usize = 2 * LANES;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut cx = x.chunks_exact(STEP);
        let mut cy = y.chunks_exact(STEP);
        for (bx, by) in (&mut cx).zip(&mut cy) {
            let (Some(bx), Some(by)) = (bx.first_chunk::<STEP>(), by.first_chunk::<STEP>()) else {
                break;
            };
            for (k, acc) in acc.iter_mut().enumerate() {
                let vx = _mm256_cvtph_ps(load16(bx, 16 * k));
                let vy = _mm256_cvtph_ps(load16(by, 16 * k));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(vx, vy));
            }
        }
        if cx.remainder().is_empty() && cy.remainder().is_empty() {
            // no tail: `finish_dot`'s pairwise reduction (lanes l += l + 16, l += l + 8, then
            // within the eight) in registers
            let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
            return hsum8(v);
        }
        let mut lanes = [0f32; LANES];
        for (k, acc) in acc.iter().enumerate() {
            // SAFETY: lanes 8k..8k+8 of the 32-lane array; `storeu` needs no alignment.
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * k), *acc);
        }
        finish_dot(lanes, cx.remainder(), cy.remainder(), get_f16, get_f16)
    }

    /// Two F16 rows times one: [`vec_dot_f16`] of each, sharing the conversions of `y`
    /// (same lanes, same multiply-then-add, same reduction: the same bits).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `x[0]`, `x[1]` and `y` of one length, a multiple of 64 bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_f16_x2(x: &[&[u8]; 2], y: &[u8]) -> [f32; 2] {
        const STEP: usize = 2 * LANES;
        let (a, b, yp) = (x[0].as_ptr(), x[1].as_ptr(), y.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 4]; 2];
        for s in 0..y.len() / STEP {
            let [acc_a, acc_b] = &mut acc;
            for (k, (ca, cb)) in acc_a.iter_mut().zip(acc_b.iter_mut()).enumerate() {
                let at = STEP * s + 16 * k;
                // SAFETY: `at + 16 <= y.len()`, the length of all three rows.
                let vy = _mm256_cvtph_ps(_mm_loadu_si128(yp.add(at).cast()));
                let va = _mm256_cvtph_ps(_mm_loadu_si128(a.add(at).cast()));
                let vb = _mm256_cvtph_ps(_mm_loadu_si128(b.add(at).cast()));
                *ca = _mm256_add_ps(*ca, _mm256_mul_ps(va, vy));
                *cb = _mm256_add_ps(*cb, _mm256_mul_ps(vb, vy));
            }
        }
        acc.map(|a| {
            hsum8(_mm256_add_ps(
                _mm256_add_ps(a[0], a[2]),
                _mm256_add_ps(a[1], a[3]),
            ))
        })
    }

    /// `float::quantize_f16` with F16C: `vcvtps2ph` rounding to nearest even, eight values
    /// (16 little-endian bytes) per step, the rest through the portable code.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_f16(src: &[f32], dst: &mut [u8]) {
        let n = src.len().min(dst.len() / 2);
        let (chunks, _) = src[..n].as_chunks::<8>();
        let (out, _) = dst[..2 * n].as_chunks_mut::<16>();
        for (c, o) in chunks.iter().zip(out) {
            // SAFETY: eight floats in, sixteen bytes out.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(c.as_ptr()));
                _mm_storeu_si128(o.as_mut_ptr().cast(), h);
            }
        }
        let done = chunks.len() * 8;
        super::super::float::quantize_f16(&src[done..n], &mut dst[2 * done..2 * n]);
    }

    /// `float::round_f16` with F16C: `vcvtps2ph` (nearest even) and `vcvtph2ps` eight values
    /// per step, the rest through the portable code.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn round_f16(values: &mut [f32]) {
        let (chunks, tail) = values.as_chunks_mut::<8>();
        for c in chunks {
            // SAFETY: eight floats in and out.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(c.as_ptr()));
                _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        super::super::float::round_f16(tail);
    }

    /// The largest entry of `w` by C's `MAX` (`_mm256_max_ps(m, v)` is `m > v ? m : v`), in
    /// sixteen lanes, or `None` when `w` holds a NaN (whose effect depends on the order).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row_max_no_nan(w: &[f32]) -> Option<f32> {
        let (chunks, tail) = w.as_chunks::<16>();
        let mut max = [_mm256_set1_ps(f32::NEG_INFINITY); 2];
        let mut nan = _mm256_setzero_ps();
        for chunk in chunks {
            for (h, m) in max.iter_mut().enumerate() {
                // SAFETY: eight floats of the chunk.
                let v = unsafe { _mm256_loadu_ps(chunk[8 * h..].as_ptr()) };
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                *m = _mm256_max_ps(*m, v);
            }
        }
        if _mm256_movemask_ps(nan) != 0 || tail.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut lanes = [0f32; 16];
        // SAFETY: sixteen floats of `lanes`.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), max[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), max[1]);
        }
        let c_max = super::super::scan::c_max;
        let max = lanes.into_iter().fold(f32::NEG_INFINITY, c_max);
        Some(tail.iter().fold(max, |m, &v| c_max(m, v)))
    }

    /// `scan::first_where_masked`: per sixteen entries, two compares with -inf and their
    /// move-masks.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn first_where_masked(w: &[f32], masked: bool) -> usize {
        let (chunks, tail) = w.as_chunks::<16>();
        let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
        for (n, chunk) in chunks.iter().enumerate() {
            // SAFETY: sixteen floats of the chunk.
            let (lo, hi) = unsafe {
                (
                    _mm256_loadu_ps(chunk.as_ptr()),
                    _mm256_loadu_ps(chunk[8..].as_ptr()),
                )
            };
            let lo = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(lo, neg_inf)) as u32;
            let hi = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(hi, neg_inf)) as u32;
            let is_masked = lo | (hi << 8);
            let hits = if masked {
                is_masked
            } else {
                !is_masked & 0xffff
            };
            if hits != 0 {
                return n * 16 + hits.trailing_zeros() as usize;
            }
        }
        chunks.len() * 16
            + tail
                .iter()
                .position(|&v| (v == f32::NEG_INFINITY) == masked)
                .unwrap_or(tail.len())
    }

    /// `q8::quantize_q8_0` with AVX2: per block the largest `|x|` over the four vectors with
    /// `max_ps` in the portable order (NaNs fall out the same way), `d = amax / 127` to f16
    /// (F16C, nearest even, as the `half` crate does on such a CPU), `q = x * (127 / amax)`
    /// rounded half to even, then clamped to `[-128, 127]` with `max_ps(q, -128)` first
    /// (a NaN gives -128, as the portable code's), packed in element order.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
        let sign = _mm256_set1_ps(-0.0);
        for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
            let p = x.as_ptr();
            // SAFETY: `x` holds 32 values.
            let v: [__m256; 4] = std::array::from_fn(|k| _mm256_loadu_ps(p.add(8 * k)));
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for v in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
            }
            let h = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let half =
                _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d)))
                    as u16;
            b[..2].copy_from_slice(&half.to_le_bytes());
            let idv = _mm256_set1_ps(id);
            let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
            let q: [__m256i; 4] = std::array::from_fn(|k| {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v[k], idv),
                );
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
            });
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let ordered =
                _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: a Q8_0 block holds 32 quants after its 2-byte scale.
            _mm256_storeu_si256(b.as_mut_ptr().add(2).cast(), ordered);
        }
    }

    /// The 32 bits of a Q5 block's `qh` as bytes: 16 where the element's bit is set, else 0
    /// (byte `e` for element `e`, matching the nibble order of [`q4_32`]).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q5_high_bits(qh: [u8; 4]) -> __m256i {
        let v = _mm256_set1_epi32(i32::from_le_bytes(qh));
        // byte e takes byte e / 8 of qh ...
        let spread = _mm256_shuffle_epi8(
            v,
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        // ... and tests its bit e % 8
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    /// The 32 nibbles of 16 bytes at `at` in element order: low nibbles (elements 0..16),
    /// then high nibbles (16..32).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q4_32<const N: usize>(b: &[u8; N], at: usize) -> __m256i {
        let qs = load16(b, at);
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(qs, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), mask);
        _mm256_set_m128i(hi, lo)
    }

    /// Q4_1 x Q8_1 row: the loop of `q4::vec_dot_q4_1_q8_1` with an AVX2 block sum.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q4_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in x.chunks_exact(Q4_1_BYTES).zip(y.chunks_exact(Q8_1_BYTES)) {
            let (Some(xb), Some(yb)) = (
                xb.first_chunk::<Q4_1_BYTES>(),
                yb.first_chunk::<Q8_1_BYTES>(),
            ) else {
                break;
            };
            let sumi = hsum_i32(dot_u8_i8(q4_32(xb, 4), load32(yb, 4)));
            sumf += (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1])) * sumi as f32
                + fp16(xb[2], xb[3]) * fp16(yb[2], yb[3]);
        }
        sumf
    }

    /// Q5_0 x Q8_0 row: the loop of `q5::vec_dot_q5_0_q8_0` with an AVX2 block sum
    /// (`sum(q * y) - 16 * sum(y)`, `q` unsigned).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in x.chunks_exact(Q5_0_BYTES).zip(y.chunks_exact(Q8_0_BYTES)) {
            let (Some(xb), Some(yb)) = (
                xb.first_chunk::<Q5_0_BYTES>(),
                yb.first_chunk::<Q8_0_BYTES>(),
            ) else {
                break;
            };
            let q = _mm256_or_si256(q4_32(xb, 6), q5_high_bits([xb[2], xb[3], xb[4], xb[5]]));
            let q8 = load32(yb, 2);
            let d = _mm256_sub_epi32(dot_u8_i8(q, q8), dot_u8_i8(_mm256_set1_epi8(16), q8));
            let sumi = hsum_i32(d);
            sumf += (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1])) * sumi as f32;
        }
        sumf
    }

    /// Q5_1 x Q8_1 row: the loop of `q5::vec_dot_q5_1_q8_1` with an AVX2 block sum.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in x.chunks_exact(Q5_1_BYTES).zip(y.chunks_exact(Q8_1_BYTES)) {
            let (Some(xb), Some(yb)) = (
                xb.first_chunk::<Q5_1_BYTES>(),
                yb.first_chunk::<Q8_1_BYTES>(),
            ) else {
                break;
            };
            let q = _mm256_or_si256(q4_32(xb, 8), q5_high_bits([xb[4], xb[5], xb[6], xb[7]]));
            let sumi = hsum_i32(dot_u8_i8(q, load32(yb, 4)));
            sumf += (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1])) * sumi as f32
                + fp16(xb[2], xb[3]) * fp16(yb[2], yb[3]);
        }
        sumf
    }

    /// `sum_g scales[g] * sum(q * y)` of a Q4_K super-block (groups of 32, quants 0..15).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn isum_q4_k(x: &[u8; Q4_K_BYTES], q8: &[u8; QK_K], scales: &[i32; 8]) -> i32 {
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let (lo, hi) = nibbles(load32(x, 16 + 32 * j));
            let s0 = dot_u8_i8_scaled(lo, load32(q8, 64 * j), scales[2 * j]);
            let s1 = dot_u8_i8_scaled(hi, load32(q8, 64 * j + 32), scales[2 * j + 1]);
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(s0, s1));
        }
        hsum_i32(acc)
    }

    /// `sum_g scales[g] * sum(q * y)` of a Q5_K super-block (groups of 32, quants 0..31).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn isum_q5_k(x: &[u8; Q5_K_BYTES], q8: &[u8; QK_K], scales: &[i32; 8]) -> i32 {
        let qh = load32(x, 16);
        let one = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let (lo, hi) = nibbles(load32(x, 48 + 32 * j));
            // bits 2j (low nibbles) and 2j + 1 (high nibbles) of every qh byte
            let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32));
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(h, one));
            let h1 = _mm256_slli_epi16::<3>(_mm256_and_si256(h, _mm256_set1_epi8(2)));
            let q0 = _mm256_or_si256(lo, h0);
            let q1 = _mm256_or_si256(hi, h1);
            let s0 = dot_u8_i8_scaled(q0, load32(q8, 64 * j), scales[2 * j]);
            let s1 = dot_u8_i8_scaled(q1, load32(q8, 64 * j + 32), scales[2 * j + 1]);
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(s0, s1));
        }
        hsum_i32(acc)
    }

    /// `sum_g scales[g] * sum((q - 32) * y)` of a Q6_K super-block (groups of 16).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn isum_q6_k(x: &[u8; Q6_K_BYTES], q8: &[u8; QK_K], scales: &[i32; 16]) -> i32 {
        let low4 = _mm256_set1_epi8(0x0F);
        let two = _mm256_set1_epi8(3);
        let m32 = _mm256_set1_epi8(32);
        let mut acc = _mm256_setzero_si256();
        for n in 0..2 {
            let ql0 = load32(x, 64 * n);
            let ql1 = load32(x, 64 * n + 32);
            let qh = load32(x, 128 + 32 * n);
            let quants = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, low4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(qh, two)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, low4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(qh), two)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(qh), two)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(qh), two)),
                ),
            ];
            for (k, &q) in quants.iter().enumerate() {
                let y = load32(q8, 128 * n + 32 * k);
                // (q - 32) * y per pair, exact in i16 (|q - 32| <= 32, |y| <= 128)
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(m32, y));
                let g = 8 * n + 2 * k;
                let sc = _mm256_set_m128i(
                    _mm_set1_epi16(scales[g + 1] as i16),
                    _mm_set1_epi16(scales[g] as i16),
                );
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
            }
        }
        hsum_i32(acc)
    }

    /// Q4_K x Q8_K row.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q4_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
        sum_blocks::<Q4_K_BYTES>(
            x,
            y,
            #[inline(always)]
            |xb, yb| {
                let (scales, mins) = k4_scales(xb);
                let summs = mins_dot(&yb.bsums, &mins, 2);
                // SAFETY: (of the call) this closure runs inside this AVX2 function.
                let isum = isum_q4_k(xb, yb.qs, &scales);
                combine_k4(xb, yb.d, isum, summs)
            },
        )
    }

    /// Q5_K x Q8_K row.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q5_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
        sum_blocks::<Q5_K_BYTES>(
            x,
            y,
            #[inline(always)]
            |xb, yb| {
                let (scales, mins) = k4_scales(xb);
                let summs = mins_dot(&yb.bsums, &mins, 2);
                // SAFETY: (of the call) this closure runs inside this AVX2 function.
                let isum = isum_q5_k(xb, yb.qs, &scales);
                combine_k4(xb, yb.d, isum, summs)
            },
        )
    }

    /// Q6_K x Q8_K row.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q6_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
        sum_blocks::<Q6_K_BYTES>(
            x,
            y,
            #[inline(always)]
            |xb, yb| {
                let scales = q6_k_scales(xb);
                // SAFETY: (of the call) this closure runs inside this AVX2 function.
                let isum = isum_q6_k(xb, yb.qs, &scales);
                fp16(xb[208], xb[209]) * yb.d * isum as f32
            },
        )
    }

    /// How far ahead (bytes) the tile kernels prefetch weight rows when they stream them.
    const PREFETCH: usize = 2048;

    /// 0: not probed yet, 1: no AVX-VNNI, 2: yes.
    static VNNI: AtomicU8 = AtomicU8::new(0);

    /// Whether the CPU has AVX-VNNI (the VEX-encoded `vpdpbusd` on 256-bit vectors: CPUID
    /// leaf 7 sub-leaf 1, EAX bit 4) besides AVX2+FMA+F16C (probed once). It needs no OS
    /// support beyond AVX's.
    pub(super) fn has_avx_vnni() -> bool {
        match VNNI.load(Ordering::Relaxed) {
            0 => {
                let yes = has_avx2() && {
                    // SAFETY: every x86-64 CPU has CPUID; leaf 7 is read only when leaf 0
                    // says it exists.
                    #[allow(unused_unsafe)]
                    let (max, eax) = unsafe {
                        let max = __cpuid(0).eax;
                        (max, if max >= 7 { __cpuid_count(7, 1).eax } else { 0 })
                    };
                    max >= 7 && eax & (1 << 4) != 0
                };
                VNNI.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
            state => state == 2,
        }
    }

    /// One weight block times one activation block of a [`Q8Row`] with AVX-VNNI, into `acc`:
    /// the lanes start from the block's biases, `vpdpbusd` adds the exact sums of four
    /// products of the unsigned weight bytes `u` with the signed activation quants, then
    /// `acc = fma(dx * dy, lanes as f32, acc)` (`dx` broadcast, `dy` the block's eight
    /// copies of its scale). One asm block, so that the compiler keeps nothing but the
    /// accumulators in registers across the rows of a tile (it would otherwise hoist the
    /// activation loads and spill accumulators).
    ///
    /// # Safety
    /// The CPU must support AVX-VNNI ([`has_avx_vnni`]); `yb` must point at a whole block of
    /// `ROW_BLOCK_BYTES` bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vnni_step(acc: &mut __m256, u: __m256i, dx: __m256, yb: *const u8) {
        // SAFETY: the caller guarantees AVX-VNNI (the other instructions are AVX/FMA, enabled
        // here) and the block at `yb`: quants at 0..32, biases at ROW_BIAS (32), scales at
        // ROW_SCALE (64), read with unaligned loads. The block writes only `acc` and its two
        // temporaries (`out`, so distinct from the inputs); no stack, no flags.
        asm!(
            "vmovdqu {t}, ymmword ptr [{yb} + 32]",
            "{{vex}} vpdpbusd {t}, {u}, ymmword ptr [{yb}]",
            "vcvtdq2ps {t}, {t}",
            "vmulps {d}, {dx}, ymmword ptr [{yb} + 64]",
            "vfmadd231ps {acc}, {d}, {t}",
            acc = inout(ymm_reg) *acc,
            u = in(ymm_reg) u,
            dx = in(ymm_reg) dx,
            yb = in(reg) yb,
            t = out(ymm_reg) _,
            d = out(ymm_reg) _,
            options(pure, readonly, nostack, preserves_flags)
        );
    }

    /// [`vnni_step`] with the scale product `dx * dy` already computed, at `d` (broadcast
    /// from memory, which costs no arithmetic unit).
    ///
    /// # Safety
    /// As [`vnni_step`]; `d` must point at a readable f32.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vnni_step_scaled(acc: &mut __m256, u: __m256i, yb: *const u8, d: *const f32) {
        // SAFETY: as in `vnni_step`, and the caller guarantees the f32 at `d`.
        asm!(
            "vmovdqu {t}, ymmword ptr [{yb} + 32]",
            "{{vex}} vpdpbusd {t}, {u}, ymmword ptr [{yb}]",
            "vcvtdq2ps {t}, {t}",
            "vbroadcastss {d}, dword ptr [{dp}]",
            "vfmadd231ps {acc}, {d}, {t}",
            acc = inout(ymm_reg) *acc,
            u = in(ymm_reg) u,
            yb = in(reg) yb,
            dp = in(reg) d,
            t = out(ymm_reg) _,
            d = out(ymm_reg) _,
            options(pure, readonly, nostack, preserves_flags)
        );
    }

    /// Exact `x * y` sums of signed bytes, four consecutive bytes per i32 lane, without VNNI:
    /// widened to i16 (so that -128 * -128 is exact), summed in pairs, then the pairs in pairs
    /// (`hadd` mixes the halves; the permutation restores the element order).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lanes_i8_i8(x: __m256i, y: __m256i) -> __m256i {
        let x0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x));
        let x1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(x));
        let y0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(y));
        let y1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(y));
        let h = _mm256_hadd_epi32(_mm256_madd_epi16(x0, y0), _mm256_madd_epi16(x1, y1));
        _mm256_permute4x64_epi64::<0b11_01_10_00>(h)
    }

    /// Exact `u * s` sums, four consecutive bytes per i32 lane, for unsigned `u <= 15` and
    /// signed `s` (every pair sum fits i16, so `maddubs` does not saturate).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lanes_u4_i8(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    /// The sum of eight f32 lanes in the order of `tiles::hsum8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn hsum8(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))
    }

    /// A little-endian f16 at `p` as f32 (F16C; exact).
    ///
    /// # Safety
    /// F16C must be available; `p` must point at two readable bytes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn half_at(p: *const u8) -> f32 {
        // SAFETY: the caller guarantees two readable bytes at `p`.
        let bits = u16::from_le_bytes([*p, *p.add(1)]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// The 32 quants of the weight block at `xb` as the kernels multiply them: Q4_0 nibbles
    /// in element order (0..15, the `- 8` is in the bias), Q8_0 bytes as they are, or with
    /// VNNI offset by 128 to be unsigned (the `- 128 * y` is in the bias).
    ///
    /// # Safety
    /// AVX2; `xb` must point at a whole block.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn weight_quants<const Q8: bool, const VNNI: bool>(xb: *const u8) -> __m256i {
        if Q8 {
            // SAFETY: a Q8_0 block holds 32 quants after its 2-byte scale.
            let v = _mm256_loadu_si256(xb.add(2).cast());
            if VNNI {
                _mm256_xor_si256(v, _mm256_set1_epi8(-128))
            } else {
                v
            }
        } else {
            // SAFETY: a Q4_0 block holds 16 bytes of nibbles after its 2-byte scale.
            // the 16 bytes in both halves, the upper half shifted right by 4 bits, then the
            // low nibble of every byte
            let qs = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb.add(2).cast()));
            let shifted = _mm256_srlv_epi64(qs, _mm256_set_epi64x(4, 4, 0, 0));
            _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
        }
    }

    /// `tiles::dot_tile` for Q8_0 (`Q8`) or Q4_0 weights: per block each weight row's quants
    /// are unpacked once and each activation row's loaded once, the `RM x RN` products kept
    /// in f32 lane accumulators. The lane sums are exact (VNNI: `vpdpbusd` started from the
    /// bias; else `lanes_i8_i8` or `lanes_u4_i8` plus the bias), the f32 steps those of
    /// `tiles::dot_tile_portable`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C, and AVX-VNNI if `VNNI`; every row of `w` must hold at least as
    /// many blocks as the rows of `y`, which must all have the same number.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_tile<
        const RM: usize,
        const RN: usize,
        const Q8: bool,
        const VNNI: bool,
    >(
        w: &[&[u8]; RM],
        y: &[Q8Row<'_>; RN],
        out: &mut [[f32; RN]; RM],
    ) {
        let bb = if Q8 { Q8_0_BYTES } else { Q4_0_BYTES };
        let blocks = y.first().map_or(0, |r| r.blocks);
        let mut acc = [[_mm256_setzero_ps(); RN]; RM];
        if VNNI && RM == 4 {
            // The scale products of a block step, four at a time: `dx` of the four weight
            // rows times each row's `dy` (the same f32 products as one by one).
            let mut scales = [[0f32; 4]; RN];
            for b in 0..blocks {
                let xb: [*const u8; RM] = std::array::from_fn(|i| w[i].as_ptr().add(b * bb));
                if RN == 1 {
                    // One activation row: the weights stream from memory, several rows at a
                    // time, which the hardware prefetchers follow badly. (A prefetch past the
                    // end of the row is harmless: it does not fault.)
                    for p in xb {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast());
                    }
                }
                let halves = xb.map(|p| u64::from(u16::from_le_bytes([*p, *p.add(1)])));
                let bits = halves[0] | halves[1] << 16 | halves[2] << 32 | halves[3] << 48;
                let dx = _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64));
                for (j, s) in scales.iter_mut().enumerate() {
                    let yb = y[j].bytes.as_ptr().add(b * ROW_BLOCK_BYTES);
                    let dy = _mm_broadcast_ss(&*yb.add(ROW_SCALE).cast::<f32>());
                    _mm_storeu_ps(s.as_mut_ptr(), _mm_mul_ps(dx, dy));
                }
                for i in 0..RM {
                    let q = weight_quants::<Q8, VNNI>(xb[i]);
                    for j in 0..RN {
                        let yb = y[j].bytes.as_ptr().add(b * ROW_BLOCK_BYTES);
                        vnni_step_scaled(&mut acc[i][j], q, yb, &scales[j][i]);
                    }
                }
            }
        } else {
            for b in 0..blocks {
                for i in 0..RM {
                    // SAFETY: the caller guarantees `blocks` whole blocks in every weight row.
                    let xb = w[i].as_ptr().add(b * bb);
                    if RN == 1 {
                        // One activation row: the weights stream from memory, several rows at a
                        // time, which the hardware prefetchers follow badly. (A prefetch past the
                        // end of the row is harmless: it does not fault.)
                        _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_add(PREFETCH).cast());
                    }
                    let dx = _mm256_set1_ps(half_at(xb));
                    let q = weight_quants::<Q8, VNNI>(xb);
                    for j in 0..RN {
                        // SAFETY: every activation row has `blocks` blocks of ROW_BLOCK_BYTES:
                        // 32 quants, 8 biases and 8 copies of the scale.
                        let yb = y[j].bytes.as_ptr().add(b * ROW_BLOCK_BYTES);
                        if VNNI {
                            vnni_step(&mut acc[i][j], q, dx, yb);
                            continue;
                        }
                        let bias = || _mm256_loadu_si256(yb.add(ROW_BIAS).cast());
                        let lanes = if Q8 {
                            lanes_i8_i8(q, _mm256_loadu_si256(yb.cast()))
                        } else {
                            _mm256_add_epi32(lanes_u4_i8(q, _mm256_loadu_si256(yb.cast())), bias())
                        };
                        let d = _mm256_mul_ps(dx, _mm256_loadu_ps(yb.add(ROW_SCALE).cast()));
                        acc[i][j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[i][j]);
                    }
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            for (o, a) in o.iter_mut().zip(a) {
                *o = hsum8(*a);
            }
        }
    }

    /// `tiles::dot_rows`: [`dot_tile`] on its groups of four rows, then on the rest one by
    /// one.
    ///
    /// # Safety
    /// As [`dot_tile`], for every row of `w`; `out` as long as `w`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows<const RN: usize, const Q8: bool, const VNNI: bool>(
        w: StridedRows<'_>,
        y: &[Q8Row<'_>; RN],
        out: &mut [[f32; RN]],
    ) {
        tiles::for_each_group(
            w,
            out,
            // SAFETY: the caller's guarantees, row by row.
            |g, o| unsafe { dot_tile::<4, RN, Q8, VNNI>(g, y, o) },
            |r, o| unsafe { dot_tile::<1, RN, Q8, VNNI>(&[r], y, std::array::from_mut(o)) },
        );
    }

    /// 0: not probed yet, 1: no AVX-512 VNNI, 2: yes.
    static ZMM: AtomicU8 = AtomicU8::new(0);

    /// Whether the CPU has AVX-512 F, BW, VL and VNNI (the EVEX `vpdpbusd` on zmm) besides
    /// AVX2+FMA+F16C (probed once; the macro also checks that the OS saves zmm state).
    pub(super) fn has_avx512_vnni() -> bool {
        match ZMM.load(Ordering::Relaxed) {
            0 => {
                let yes = has_avx2()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni");
                ZMM.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
            state => state == 2,
        }
    }

    /// `tiles::dot_tile` with 512-bit VNNI, `RM` even: weight rows `2p` and `2p + 1` share
    /// each zmm, row `2p` in the low 256 bits, so that one `vpdpbusd` computes the exact lane
    /// sums of two weight rows with one activation row (broadcast to both halves, its bias
    /// likewise the start of both), and one `fma` steps both accumulators with
    /// `dx * dy` of each row (the same f32 product as the other kernels). Each half is the
    /// AVX-VNNI kernel's accumulator, so the results are the same bits.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C ([`has_avx512_vnni`]); `RM` even; every row
    /// of `w` must hold at least as many blocks as the rows of `y`, which must all have the
    /// same number.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot_tile_zmm<const RM: usize, const RN: usize, const Q8: bool>(
        w: &[&[u8]; RM],
        y: &[Q8Row<'_>; RN],
        out: &mut [[f32; RN]; RM],
    ) {
        let bb = if Q8 { Q8_0_BYTES } else { Q4_0_BYTES };
        let blocks = y.first().map_or(0, |r| r.blocks);
        // only the first RM / 2 rows are used
        let mut acc = [[_mm512_setzero_ps(); RN]; RM];
        for b in 0..blocks {
            for p in 0..RM / 2 {
                // SAFETY: the caller guarantees `blocks` whole blocks in every weight row.
                let x0 = w[2 * p].as_ptr().add(b * bb);
                let x1 = w[2 * p + 1].as_ptr().add(b * bb);
                if RN == 1 {
                    // As in `dot_tile`: the weights stream (a prefetch does not fault).
                    _mm_prefetch::<_MM_HINT_T0>(x0.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(x1.wrapping_add(PREFETCH).cast());
                }
                let q = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(weight_quants::<Q8, true>(x0)),
                    weight_quants::<Q8, true>(x1),
                );
                let dx = _mm512_castsi512_ps(_mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_castps_si256(_mm256_set1_ps(half_at(x0)))),
                    _mm256_castps_si256(_mm256_set1_ps(half_at(x1))),
                ));
                for j in 0..RN {
                    // SAFETY: every activation row has `blocks` blocks of ROW_BLOCK_BYTES:
                    // 32 quants, 8 biases and 8 copies of the scale.
                    let yb = y[j].bytes.as_ptr().add(b * ROW_BLOCK_BYTES);
                    let yq = _mm512_broadcast_i64x4(_mm256_loadu_si256(yb.cast()));
                    let bias = _mm512_broadcast_i64x4(_mm256_loadu_si256(yb.add(ROW_BIAS).cast()));
                    let dy = _mm512_castsi512_ps(_mm512_broadcast_i64x4(_mm256_loadu_si256(
                        yb.add(ROW_SCALE).cast(),
                    )));
                    let lanes = _mm512_dpbusd_epi32(bias, q, yq);
                    let d = _mm512_mul_ps(dx, dy);
                    acc[p][j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[p][j]);
                }
            }
        }
        for p in 0..RM / 2 {
            for j in 0..RN {
                let a = _mm512_castps_si512(acc[p][j]);
                out[2 * p][j] = hsum8(_mm256_castsi256_ps(_mm512_castsi512_si256(a)));
                out[2 * p + 1][j] = hsum8(_mm256_castsi256_ps(_mm512_extracti64x4_epi64::<1>(a)));
            }
        }
    }

    /// `tiles::dot_tile` for one activation row and `RM` weight rows (a multiple of four) with
    /// the 256-bit EVEX `vpdpbusd` of AVX-512 VL/VNNI: as the AVX-VNNI kernel's `RM == 4`
    /// path (lanes from the bias, `vpdpbusd`, `fma(dx * dy, lanes, acc)` with the four
    /// products `dx * dy` computed together), but with the activation block's quants, biases
    /// and scale loaded once per block for all the rows, and written with intrinsics the
    /// compiler schedules (the AVX-VNNI one is inline assembly). The same bits.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C ([`has_avx512_vnni`]); `RM` a multiple of 4
    /// and `RN` 1 (only `y[0]` is read, only `out[i][0]` written); every row of `w` must
    /// hold at least as many blocks as `y[0]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot_tile_vl1<const RM: usize, const RN: usize, const Q8: bool>(
        w: &[&[u8]; RM],
        y: &[Q8Row<'_>; RN],
        out: &mut [[f32; RN]; RM],
    ) {
        let Some(y) = y.first() else {
            return;
        };
        let bb = if Q8 { Q8_0_BYTES } else { Q4_0_BYTES };
        let mut acc = [_mm256_setzero_ps(); RM];
        let lane: [__m256i; 4] = std::array::from_fn(|i| _mm256_set1_epi32(i as i32));
        for b in 0..y.blocks {
            // SAFETY: the activation row has `blocks` blocks of ROW_BLOCK_BYTES: 32 quants,
            // 8 biases and 8 copies of the scale.
            let yb = y.bytes.as_ptr().add(b * ROW_BLOCK_BYTES);
            let yq = _mm256_loadu_si256(yb.cast());
            let bias = _mm256_loadu_si256(yb.add(ROW_BIAS).cast());
            let dy = _mm_loadu_ps(yb.add(ROW_SCALE).cast());
            for g in 0..RM / 4 {
                // SAFETY: the caller guarantees `blocks` whole blocks in every weight row.
                let xb: [*const u8; 4] = std::array::from_fn(|i| w[4 * g + i].as_ptr().add(b * bb));
                for p in xb {
                    // the weights stream (a prefetch past the end does not fault)
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast());
                }
                let halves = xb.map(|p| u64::from(u16::from_le_bytes([*p, *p.add(1)])));
                let bits = halves[0] | halves[1] << 16 | halves[2] << 32 | halves[3] << 48;
                let d4 = _mm256_castps128_ps256(_mm_mul_ps(
                    _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)),
                    dy,
                ));
                for i in 0..4 {
                    let q = weight_quants::<Q8, true>(xb[i]);
                    let lanes = _mm256_dpbusd_epi32(bias, q, yq);
                    let d = _mm256_permutexvar_ps(lane[i], d4);
                    let a = &mut acc[4 * g + i];
                    *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), *a);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            if let Some(o) = o.first_mut() {
                *o = hsum8(*a);
            }
        }
    }

    /// `tiles::dot_rows` with [`dot_tile_zmm`] (one activation row: [`dot_tile_vl1`]) on its
    /// groups of four rows, then the AVX-VNNI (or AVX2) [`dot_tile`] on the rest one by one.
    ///
    /// # Safety
    /// As [`dot_tile_zmm`], for every row of `w`; `out` as long as `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_zmm<const RN: usize, const Q8: bool>(
        w: StridedRows<'_>,
        y: &[Q8Row<'_>; RN],
        out: &mut [[f32; RN]],
    ) {
        let vnni = has_avx_vnni();
        tiles::for_each_group(
            w,
            out,
            // SAFETY: the caller's guarantees, row by row (one activation row: the one-row
            // kernel, which needs RN == 1).
            |g, o| unsafe {
                if RN == 1 {
                    dot_tile_vl1::<4, RN, Q8>(g, y, o);
                } else {
                    dot_tile_zmm::<4, RN, Q8>(g, y, o);
                }
            },
            |r, o| {
                let (g, o) = (&[r], std::array::from_mut(o));
                // SAFETY: as above (AVX-VNNI checked by `has_avx_vnni`).
                unsafe {
                    if vnni {
                        dot_tile::<1, RN, Q8, true>(g, y, o);
                    } else {
                        dot_tile::<1, RN, Q8, false>(g, y, o);
                    }
                }
            },
        );
    }

    /// glibc's `__exp2f_data.tab` (`EXP2F_TABLE_BITS` = 5): `2^(i/32)` with `i << 47`
    /// taken out of its bits.
    const EXP2F_TAB: [u64; 32] = [
        0x3ff0000000000000,
        0x3fefd9b0d3158574,
        0x3fefb5586cf9890f,
        0x3fef9301d0125b51,
        0x3fef72b83c7d517b,
        0x3fef54873168b9aa,
        0x3fef387a6e756238,
        0x3fef1e9df51fdee1,
        0x3fef06fe0a31b715,
        0x3feef1a7373aa9cb,
        0x3feedea64c123422,
        0x3feece086061892d,
        0x3feebfdad5362a27,
        0x3feeb42b569d4f82,
        0x3feeab07dd485429,
        0x3feea47eb03a5585,
        0x3feea09e667f3bcd,
        0x3fee9f75e8ec5f74,
        0x3feea11473eb0187,
        0x3feea589994cce13,
        0x3feeace5422aa0db,
        0x3feeb737b0cdc5e5,
        0x3feec49182a3f090,
        0x3feed503b23e255d,
        0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47,
        0x3fef199bdd85529c,
        0x3fef3720dcef9069,
        0x3fef5818dcfba487,
        0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da,
        0x3fefd0765b6e4540,
    ];
    /// glibc's `expf` constants: `32 / ln 2`, the rounding shift `0x1.8p52` and the cubic's
    /// coefficients (`__exp2f_data.invln2_scaled`, `shift`, `poly_scaled`).
    const EXPF_INVLN2N: u64 = 0x40471547652b82fe;
    const EXPF_SHIFT: u64 = 0x4338000000000000;
    const EXPF_C: [u64; 3] = [0x3ebc6af84b912394, 0x3f2ebfce50fac4f3, 0x3f962e42ff0c52d6];

    /// 0: not probed yet, 1: no, 2: yes.
    static EXPF: AtomicU8 = AtomicU8::new(0);

    /// Whether [`exp_glibc`] runs here and gives `f32::exp`'s bits: AVX-512 F, and the same
    /// results on a sweep of about 260 000 floats of every exponent and sign (so a platform
    /// whose `expf` is another algorithm never takes it). Probed once.
    pub(super) fn glibc_expf_ok() -> bool {
        match EXPF.load(Ordering::Relaxed) {
            0 => {
                let yes = has_avx512f() && {
                    let mut x: Vec<f32> = (0..=u32::MAX)
                        .step_by(16411)
                        .map(f32::from_bits)
                        .chain([0.0, -0.0, 88.0, -88.0, 87.99, -87.99, 1e-30, -1e-30])
                        .collect();
                    let want: Vec<u32> = x.iter().map(|v| v.exp().to_bits()).collect();
                    // SAFETY: AVX-512 F (and AVX2, FMA with it) checked just above.
                    unsafe { exp_glibc(&mut x) };
                    x.iter().map(|v| v.to_bits()).eq(want)
                };
                EXPF.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
            state => state == 2,
        }
    }

    /// glibc's `expf` (`sysdeps/ieee754/flt-32/e_expf.c` as its FMA build compiles it) on
    /// eight floats at a time: `kd = fma(N/ln2, x, shift)`, `r = fma(N/ln2, x, -(kd -
    /// shift))`, `s` from the table and `kd`'s bits, `((fma(z, r^2, fma(C2, r, 1))) * s`
    /// with `z = fma(C0, r, C1)`, rounded to f32. Lanes outside its fast path (`|x| >= 88`,
    /// infinities, NaNs) and the tail go through `f32::exp`.
    ///
    /// # Safety
    /// AVX-512 F, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn exp_glibc(v: &mut [f32]) {
        let tab = |i: usize| _mm512_loadu_si512(EXP2F_TAB[i..i + 8].as_ptr().cast());
        let (t0, t1, t2, t3) = (tab(0), tab(8), tab(16), tab(24));
        let inv = _mm512_set1_pd(f64::from_bits(EXPF_INVLN2N));
        let shift = _mm512_set1_pd(f64::from_bits(EXPF_SHIFT));
        let c = EXPF_C.map(|b| _mm512_set1_pd(f64::from_bits(b)));
        let one = _mm512_set1_pd(1.0);
        let mut chunks = v.chunks_exact_mut(8);
        for chunk in &mut chunks {
            let p = chunk.as_mut_ptr();
            // SAFETY: eight values at `p`.
            let xf = _mm256_loadu_ps(p);
            let abstop = _mm256_and_si256(
                _mm256_srli_epi32::<20>(_mm256_castps_si256(xf)),
                _mm256_set1_epi32(0x7ff),
            );
            let slow = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(
                abstop,
                _mm256_set1_epi32(0x42a),
            )));
            let xd = _mm512_cvtps_pd(xf);
            let kd = _mm512_fmadd_pd(inv, xd, shift);
            let ki = _mm512_castpd_si512(kd);
            let kd = _mm512_sub_pd(kd, shift);
            let r = _mm512_fmsub_pd(inv, xd, kd);
            let lo = _mm512_permutex2var_epi64(t0, ki, t1);
            let hi = _mm512_permutex2var_epi64(t2, ki, t3);
            let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
            let t = _mm512_mask_blend_epi64(upper, lo, hi);
            let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
            let z = _mm512_fmadd_pd(r, c[0], c[1]);
            let r2 = _mm512_mul_pd(r, r);
            let y = _mm512_fmadd_pd(r, c[2], one);
            let y = _mm512_mul_pd(_mm512_fmadd_pd(z, r2, y), s);
            let mut x = [0f32; 8];
            _mm256_storeu_ps(x.as_mut_ptr(), xf);
            _mm256_storeu_ps(p, _mm512_cvtpd_ps(y));
            if slow != 0 {
                for (i, (o, x)) in chunk.iter_mut().zip(x).enumerate() {
                    if slow & (1 << i) != 0 {
                        *o = x.exp();
                    }
                }
            }
        }
        chunks
            .into_remainder()
            .iter_mut()
            .for_each(|x| *x = x.exp());
    }

    /// 0: not probed yet, 1: no AVX-512 F, 2: yes.
    static AVX512F: AtomicU8 = AtomicU8::new(0);

    /// Whether the CPU has AVX-512 F besides AVX2+FMA+F16C (probed once; the macro also
    /// checks that the OS saves zmm state).
    pub(super) fn has_avx512f() -> bool {
        match AVX512F.load(Ordering::Relaxed) {
            0 => {
                let yes = has_avx2() && is_x86_feature_detected!("avx512f");
                AVX512F.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
            state => state == 2,
        }
    }

    /// The reduction of the float tile kernels' 32 lanes (`lo`: lanes 0..16, `hi`: 16..32):
    /// `lo + hi` is `[acc0 + acc2 | acc1 + acc3]` of the AVX2 `vec_dot_f16`'s four vectors,
    /// then its halves' sum and [`hsum8`], the AVX2 kernel's `(acc0 + acc2) + (acc1 + acc3)`.
    ///
    /// # Safety
    /// AVX-512 F and AVX2.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn reduce_halves(lo: __m512, hi: __m512) -> f32 {
        let h = _mm512_castps_si512(_mm512_add_ps(lo, hi));
        let v8 = _mm256_add_ps(
            _mm256_castsi256_ps(_mm512_castsi512_si256(h)),
            _mm256_castsi256_ps(_mm512_extracti64x4_epi64::<1>(h)),
        );
        hsum8(v8)
    }

    /// Lane `i` of destination row `j` (of three) takes entry `3 i + j` of 48 results: from the
    /// first two vectors (`vpermt2ps` indices, 0..32) or from the third (`- 32`, under the mask).
    const fn columns_to_rows3_indices() -> ([[i32; 16]; 3], [[i32; 16]; 3], [u16; 3]) {
        let mut low = [[0i32; 16]; 3];
        let mut high = [[0i32; 16]; 3];
        let mut mask = [0u16; 3];
        let mut j = 0;
        while j < 3 {
            let mut i = 0;
            while i < 16 {
                let k = 3 * i + j;
                if k < 32 {
                    low[j][i] = k as i32;
                } else {
                    high[j][i] = (k - 32) as i32;
                    mask[j] |= 1 << i;
                }
                i += 1;
            }
            j += 1;
        }
        (low, high, mask)
    }

    const COLUMNS_TO_ROWS3: ([[i32; 16]; 3], [[i32; 16]; 3], [u16; 3]) = columns_to_rows3_indices();

    /// [`tiles::columns_to_rows`] with three activation rows, sixteen weight rows (48 results,
    /// three vectors) at a time: each destination row's sixteen values with one two-source
    /// permute and one masked permute. Returns the weight rows moved.
    ///
    /// # Safety
    /// AVX-512 F; `out.len() == group.len()` (three rows of `group.len() / 3` values).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn columns_to_rows3_zmm(group: &[f32], out: &mut [f32]) -> usize {
        let width = group.len() / 3;
        let blocks = width / 16;
        let (low, high, mask) = COLUMNS_TO_ROWS3;
        let low = low.map(|v| _mm512_loadu_si512(v.as_ptr().cast()));
        let high = high.map(|v| _mm512_loadu_si512(v.as_ptr().cast()));
        for b in 0..blocks {
            let src = group[48 * b..48 * b + 48].as_ptr();
            // SAFETY: 48 values from `src` lie in the block just sliced.
            let (a, c, e) = unsafe {
                (
                    _mm512_loadu_ps(src),
                    _mm512_loadu_ps(src.add(16)),
                    _mm512_loadu_ps(src.add(32)),
                )
            };
            for j in 0..3 {
                let row = _mm512_permutex2var_ps(a, low[j], c);
                let row = _mm512_mask_permutexvar_ps(row, mask[j], high[j], e);
                let dst = out[j * width + 16 * b..j * width + 16 * b + 16].as_mut_ptr();
                // SAFETY: the 16 values at `dst` lie in the slice just taken.
                unsafe { _mm512_storeu_ps(dst, row) };
            }
        }
        16 * blocks
    }

    /// Consecutive weight rows per pass of the one-activation-row float loop ([`dot_float_row1_zmm`]).
    const ROW1_GROUP: usize = 3;

    /// Bytes ahead of the current weight rows that the one-activation-row float loop
    /// prefetches. Measured with `tiles::throughput::row1_throughput` (a 32000 x 256 matrix,
    /// 16 MB in F16, which stays in L3, 32 MB in F32, which does not; Zen 4 VM, best of 40;
    /// the test now prints the median, on normal F32 values), in us per pass, F16 / F32:
    /// without prefetch, two rows per group, 309 / 1439; three
    /// rows, 16 KiB ahead, 220 / 650; two rows 8 KiB ahead 215 / 725, 16 KiB 230 / 700,
    /// 32 KiB 285 / 850; four rows 16 KiB 250 / 950; one row 16 KiB 277 / 850. Prefetching
    /// into L2 only (T1) or non-temporally (NTA) was slower or the same. In llama-bench tg32
    /// on the tiny F16 model, server CPU time without prefetch 1.8x that with it.
    const ROW1_PREFETCH: usize = 16384;

    /// [`ROW1_GROUP`] for F32 weights. The F32 figures above came from random bit patterns
    /// (subnormals and NaNs among them), the best pass, and weights 16 bytes off a cache line
    /// (as the buffers then were): every 64-byte load straddled two lines. On 64-byte aligned
    /// normal values (COLD, median), one row 8 KiB ahead takes 876-944 us, one row 4 KiB
    /// ahead 901-961, two rows 8 KiB ahead 950-1056, three rows 16 KiB ahead 1209-1317.
    /// Under llama-bench (tiny F32 model, tg32, server and client pinned apart), perf samples
    /// in this loop: one row 2219-2361, two rows 2557-2776, the reference's
    /// `ggml_vec_dot_f32` 2201-2358. (F16 keeps three rows: there two rows took 7 % and one
    /// row 35 % more samples.)
    const ROW1_GROUP_F32: usize = 1;

    /// [`ROW1_PREFETCH`] for F32 weights (see [`ROW1_GROUP_F32`]).
    const ROW1_PREFETCH_F32: usize = 8192;

    /// Half `h` (values `16 h .. 16 h + 16`) of step `s` (32 values) of a float weight row
    /// at `w` (F16 if `F16`, else F32), widened to f32.
    ///
    /// # Safety
    /// AVX-512 F and F16C; the step lies inside the row.
    #[inline(always)]
    unsafe fn weight_half<const F16: bool>(w: *const u8, s: usize, h: usize) -> __m512 {
        // SAFETY: the caller's guarantees.
        unsafe {
            if F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(w.add(64 * s + 32 * h).cast()))
            } else {
                _mm512_loadu_ps(w.add(128 * s + 64 * h).cast())
            }
        }
    }

    /// The accumulators of half `h` of [`dot_float_tile_zmm`]'s lanes over all the steps.
    ///
    /// # Safety
    /// Those of [`dot_float_tile_zmm`], whose features it is inlined with.
    #[inline(always)]
    unsafe fn float_half_pass<const RM: usize, const RN: usize, const F16: bool>(
        w: [*const u8; RM],
        y: [*const f32; RN],
        steps: usize,
        h: usize,
    ) -> [[__m512; RN]; RM] {
        // SAFETY: the caller's guarantees (features; step `s` inside the rows).
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); RN]; RM];
            for s in 0..steps {
                let yv: [__m512; RN] =
                    std::array::from_fn(|j| _mm512_loadu_ps(y[j].add(32 * s + 16 * h)));
                for i in 0..RM {
                    let x = weight_half::<F16>(w[i], s, h);
                    for j in 0..RN {
                        acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_mul_ps(x, yv[j]));
                    }
                }
            }
            acc
        }
    }

    /// `RM` float weight rows at `w` (F16 if `F16`, else F32 little-endian) times `RN`
    /// activation rows at `y` (f32; for F16 weights exact widenings of F16 values), `steps`
    /// steps of 32 values: per output the 32 lanes of `float::vec_dot_f16` /
    /// `float::vec_dot_f32` as two zmm (`lo`: lanes 0..16, `hi`: 16..32), each step's
    /// products added to them in step order (multiply, then add: no FMA, so the portable
    /// bits), and the reduction of [`reduce_halves`] (that of the AVX2 `vec_dot_f16`).
    ///
    /// With more than four outputs the `lo` lanes of all steps go first, then the `hi` lanes
    /// (each accumulator sees the same additions in the same order, so the same bits): the
    /// accumulators of one half, the activation vectors, a weight vector and a product fit in
    /// the 32 zmm, where both halves at once spill to the stack (4 x 3 tiles: 24 accumulators).
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA and F16C; `64 * steps` (F16) or `128 * steps` (F32) readable
    /// bytes at every `w[i]`, `32 * steps` f32 at every `y[j]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn dot_float_tile_zmm<const RM: usize, const RN: usize, const F16: bool>(
        w: [*const u8; RM],
        y: [*const f32; RN],
        steps: usize,
        out: &mut [[f32; RN]; RM],
    ) {
        let (lo, hi) = if RM * RN > 4 {
            // SAFETY: the caller's guarantees.
            unsafe {
                (
                    float_half_pass::<RM, RN, F16>(w, y, steps, 0),
                    float_half_pass::<RM, RN, F16>(w, y, steps, 1),
                )
            }
        } else {
            let mut lo = [[_mm512_setzero_ps(); RN]; RM];
            let mut hi = [[_mm512_setzero_ps(); RN]; RM];
            for s in 0..steps {
                for i in 0..RM {
                    // SAFETY: step `s` lies inside the rows (the caller's guarantee).
                    let x0 = unsafe { weight_half::<F16>(w[i], s, 0) };
                    let x1 = unsafe { weight_half::<F16>(w[i], s, 1) };
                    for j in 0..RN {
                        let y0 = _mm512_loadu_ps(y[j].add(32 * s));
                        let y1 = _mm512_loadu_ps(y[j].add(32 * s + 16));
                        lo[i][j] = _mm512_add_ps(lo[i][j], _mm512_mul_ps(x0, y0));
                        hi[i][j] = _mm512_add_ps(hi[i][j], _mm512_mul_ps(x1, y1));
                    }
                }
            }
            (lo, hi)
        };
        for i in 0..RM {
            for j in 0..RN {
                out[i][j] = reduce_halves(lo[i][j], hi[i][j]);
            }
        }
    }

    /// `tiles::dot_float_rows` with one activation row (generation), whose weights stream
    /// from memory (the output projection, several MB): in one sequential stream,
    /// consecutive rows `G` at a time through the tile kernel, each group's rows prefetched
    /// `PF` bytes ahead (none if 0), then the rest one by one.
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA and F16C; `32 * steps` f32 at `y`; every row of `w` at least
    /// `64 * steps` (F16) or `128 * steps` bytes; `out` as long as `w`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dot_float_row1_zmm<const F16: bool, const G: usize, const PF: usize>(
        w: StridedRows<'_>,
        y: *const f32,
        steps: usize,
        out: &mut [f32],
    ) {
        let groups = w.count() / G;
        let (head, tail) = out.split_at_mut(groups * G);
        let (head, _) = head.as_chunks_mut::<G>();
        for (g, o) in head.iter_mut().enumerate() {
            let first = g * G;
            let rows: [*const u8; G] = std::array::from_fn(|i| w.row(first + i).as_ptr());
            if PF > 0 {
                for &r in &rows {
                    for line in (0..w.row_len()).step_by(64) {
                        // a hint (nothing is read, any address is allowed)
                        _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(PF + line).cast());
                    }
                }
            }
            let mut res = [[0f32; 1]; G];
            // SAFETY: the caller's guarantees for rows `first..first + G`.
            unsafe { dot_float_tile_zmm::<G, 1, F16>(rows, [y], steps, &mut res) };
            *o = res.map(|[v]| v);
        }
        for (n, o) in tail.iter_mut().enumerate() {
            let r = w.row(groups * G + n).as_ptr();
            let mut res = [[0f32; 1]];
            // SAFETY: the caller's guarantees for that row.
            unsafe { dot_float_tile_zmm::<1, 1, F16>([r], [y], steps, &mut res) };
            *o = res[0][0];
        }
    }

    /// `tiles::dot_float_rows` (F16 weights if `F16`, else F32): the tile kernel on the
    /// groups of `tiles::dot_rows`, then on the rest one by one; with one activation row,
    /// [`dot_float_row1_zmm`].
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA and F16C; the rows of `y` of one length, a multiple of 32; every
    /// row of `w` of two (F16) or four (F32) times that many bytes; `out` as long as `w`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dot_float_rows_zmm<const RN: usize, const F16: bool>(
        w: StridedRows<'_>,
        y: &[&[f32]; RN],
        out: &mut [[f32; RN]],
    ) {
        let steps = y.first().map_or(0, |r| r.len()) / 32;
        let yp: [*const f32; RN] = std::array::from_fn(|j| y[j].as_ptr());
        if RN == 1 {
            // SAFETY: the caller's guarantees.
            unsafe {
                let (y, o) = (yp[0], out.as_flattened_mut());
                if F16 {
                    dot_float_row1_zmm::<F16, ROW1_GROUP, ROW1_PREFETCH>(w, y, steps, o)
                } else {
                    dot_float_row1_zmm::<F16, ROW1_GROUP_F32, ROW1_PREFETCH_F32>(w, y, steps, o)
                }
            };
            return;
        }
        tiles::for_each_group(
            w,
            out,
            // SAFETY: the caller's guarantees, row by row.
            |g, o| unsafe { dot_float_tile_zmm::<4, RN, F16>(g.map(|r| r.as_ptr()), yp, steps, o) },
            |r, o| unsafe {
                let o = std::array::from_mut(o);
                dot_float_tile_zmm::<1, RN, F16>([r.as_ptr()], yp, steps, o);
            },
        );
    }

    /// `tiles::dot_q4_k_rows`: per weight row and super-block the scales, mins and nibbles
    /// decoded once for the `RN` activation rows, then per activation row the exact integer
    /// sums of [`vec_dot_q4_k_q8_k`] (the scaled quant products, and the bsums times the mins
    /// through `vpmaddwd`) and its f32 steps (`k_quants::combine_k4`, summed in block order):
    /// the same bits.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row of `y` as many Q8_K blocks as the rows of `w` have Q4_K
    /// blocks (whole blocks); `out` as long as `w`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_k_rows<const RN: usize>(
        w: StridedRows<'_>,
        y: &[&[u8]; RN],
        out: &mut [[f32; RN]],
    ) {
        let blocks = w.row_len() / Q4_K_BYTES;
        for (n, o) in out.iter_mut().enumerate().take(w.count()) {
            let x = w.row(n);
            let mut sumf = [0f32; RN];
            for b in 0..blocks {
                let Some(xb) = x[b * Q4_K_BYTES..].first_chunk::<Q4_K_BYTES>() else {
                    break;
                };
                let (scales, mins) = k4_scales(xb);
                let mins16: [i16; 16] = std::array::from_fn(|j| i16::from(mins[j / 2]));
                // SAFETY: 32 bytes of the 16 i16.
                let mins16 = _mm256_loadu_si256(mins16.as_ptr().cast());
                let sc: [__m256i; 8] = std::array::from_fn(|i| _mm256_set1_epi16(scales[i] as i16));
                let q: [(__m256i, __m256i); 4] =
                    std::array::from_fn(|j| nibbles(load32(xb, 16 + 32 * j)));
                for (sum, yr) in sumf.iter_mut().zip(y) {
                    let Some(yb) = yr[b * Q8_K_BYTES..].first_chunk::<Q8_K_BYTES>() else {
                        break;
                    };
                    let Some(qs) = yb[4..].first_chunk::<QK_K>() else {
                        break;
                    };
                    let mut acc = _mm256_setzero_si256();
                    for (j, (lo, hi)) in q.iter().enumerate() {
                        let s0 = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(*lo, load32(qs, 64 * j)),
                            sc[2 * j],
                        );
                        let s1 = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(*hi, load32(qs, 64 * j + 32)),
                            sc[2 * j + 1],
                        );
                        acc = _mm256_add_epi32(acc, _mm256_add_epi32(s0, s1));
                    }
                    let bsums = load32(yb, Q8_K_BSUMS);
                    let summs = hsum_i32(_mm256_madd_epi16(bsums, mins16));
                    let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
                    *sum += combine_k4(xb, yd, hsum_i32(acc), summs);
                }
            }
            *o = sumf;
        }
    }

    /// [`dot_q4_k_rows`] in 512-bit vectors: the low and high nibbles of each 32 bytes of
    /// quants side by side in one zmm (they meet activation quants `64 j .. 64 j + 64`, one
    /// load), their two scales in one vector of i16, so half the instructions per activation
    /// row; the integer sums are exact (the same values), the f32 steps the same: the same
    /// bits.
    ///
    /// # Safety
    /// AVX-512 F and BW, AVX2, FMA and F16C; the lengths as for [`dot_q4_k_rows`].
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_k_rows_zmm<const RN: usize>(
        w: StridedRows<'_>,
        y: &[&[u8]; RN],
        out: &mut [[f32; RN]],
    ) {
        let blocks = w.row_len() / Q4_K_BYTES;
        let mask = _mm256_set1_epi8(0x0F);
        for (n, o) in out.iter_mut().enumerate().take(w.count()) {
            let x = w.row(n);
            let mut sumf = [0f32; RN];
            for b in 0..blocks {
                let Some(xb) = x[b * Q4_K_BYTES..].first_chunk::<Q4_K_BYTES>() else {
                    break;
                };
                let (scales, mins) = k4_scales(xb);
                // the block's two f16 scales widened once for all the activation rows (exact:
                // `combine_k4`'s values)
                let (xd, xmin) = (fp16(xb[0], xb[1]), fp16(xb[2], xb[3]));
                let mins16: [i16; 16] = std::array::from_fn(|j| i16::from(mins[j / 2]));
                // SAFETY: 32 bytes of the 16 i16.
                let mins16 = _mm256_loadu_si256(mins16.as_ptr().cast());
                let q: [__m512i; 4] = std::array::from_fn(|j| {
                    let v = load32(xb, 16 + 32 * j);
                    let lo = _mm256_and_si256(v, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                });
                let sc: [__m512i; 4] = std::array::from_fn(|j| {
                    let lo = _mm256_set1_epi16(scales[2 * j] as i16);
                    let hi = _mm256_set1_epi16(scales[2 * j + 1] as i16);
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                });
                for (sum, yr) in sumf.iter_mut().zip(y) {
                    let Some(yb) = yr[b * Q8_K_BYTES..].first_chunk::<Q8_K_BYTES>() else {
                        break;
                    };
                    let mut acc = _mm512_setzero_si512();
                    for j in 0..4 {
                        // SAFETY: bytes `4 + 64 j .. 4 + 64 j + 64` of the block, its quants.
                        let yq = _mm512_loadu_si512(yb.as_ptr().add(4 + 64 * j).cast());
                        let p = _mm512_madd_epi16(_mm512_maddubs_epi16(q[j], yq), sc[j]);
                        acc = _mm512_add_epi32(acc, p);
                    }
                    let isum8 = _mm256_add_epi32(
                        _mm512_castsi512_si256(acc),
                        _mm512_extracti64x4_epi64::<1>(acc),
                    );
                    let summs8 = _mm256_madd_epi16(load32(yb, Q8_K_BSUMS), mins16);
                    // both horizontal sums at once: [isum, summs] in the low two lanes
                    let h = _mm256_hadd_epi32(isum8, summs8);
                    let h =
                        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                    let h = _mm_hadd_epi32(h, h);
                    let isum = _mm_cvtsi128_si32(h);
                    let summs = _mm_extract_epi32::<1>(h);
                    let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
                    // `combine_k4`'s steps
                    let (d, dmin) = (xd * yd, xmin * yd);
                    *sum += d * isum as f32 - dmin * summs as f32;
                }
            }
            *o = sumf;
        }
    }

    /// Activation rows of [`dot_q4_k_rows_vnni`]: one per i32 lane of a zmm.
    pub(super) const Q4K_VNNI_ROWS: usize = 16;

    /// One Q8_K super-block of [`Q4K_VNNI_ROWS`] activation rows, interleaved for
    /// [`dot_q4_k_rows_vnni`].
    #[repr(C, align(64))]
    struct Q8KLanes {
        /// Per four quants `4k..4k + 4`, 64 bytes: those of row `r` in bytes `4r..4r + 4`.
        q: [u8; 4 * QK_K * Q4K_VNNI_ROWS / 4],
        /// Per pair of groups of 32 (`2h`, `2h + 1`), 16 i32: row `r`'s bsum of group `2h`
        /// (the sum of its two bsums of 16) in the low i16, of group `2h + 1` in the high.
        bsums: [i32; 4 * Q4K_VNNI_ROWS],
        /// Row `r`'s `d`.
        d: [f32; Q4K_VNNI_ROWS],
    }

    /// One Q4_K super-block of a weight row as [`dot_q4_k_rows_vnni`] reads it.
    #[repr(C, align(64))]
    struct Q4KDecoded {
        /// The quants (0..15) in element order.
        q: [u8; QK_K],
    }

    /// `tiles::dot_q4_k_rows` for [`Q4K_VNNI_ROWS`] activation rows with AVX-512 VNNI: super-block
    /// by super-block, the activation rows' quants interleaved (four of each row per i32
    /// lane, one row per lane), each weight row's block decoded once into bytes; then
    /// `vpdpbusd` with the weight's four quants broadcast gives per lane (activation row) the
    /// sum over a group of 32, times the group's scale (`vpmulld`), and `vpdpwssd` the mins
    /// times the bsums: the exact integer sums of [`vec_dot_q4_k_q8_k`], for four weight rows
    /// at a time. The f32 steps are `combine_k4`'s, lane by lane, added to the sums in block
    /// order: the same bits.
    ///
    /// # Safety
    /// AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C; `RN` == [`Q4K_VNNI_ROWS`]; every row of
    /// `y` as many Q8_K blocks as the rows of `w` have Q4_K blocks (whole blocks); `out` as
    /// long as `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_k_rows_vnni<const RN: usize>(
        w: StridedRows<'_>,
        y: &[&[u8]; RN],
        out: &mut [[f32; RN]],
    ) {
        const R: usize = Q4K_VNNI_ROWS;
        assert!(RN == R);
        let blocks = w.row_len() / Q4_K_BYTES;
        let rows = out.len().min(w.count());
        let out = &mut out[..rows];
        for o in out.iter_mut() {
            *o = [0.0; RN];
        }
        let mut lanes = Q8KLanes {
            q: [0; 4 * QK_K * R / 4],
            bsums: [0; 4 * R],
            d: [0.0; R],
        };
        for b in 0..blocks {
            for (r, yr) in y.iter().enumerate() {
                let Some(yb) = yr[b * Q8_K_BYTES..].first_chunk::<Q8_K_BYTES>() else {
                    return;
                };
                lanes.d[r] = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
                for (k, q) in yb[4..4 + QK_K].chunks_exact(4).enumerate() {
                    lanes.q[64 * k + 4 * r..64 * k + 4 * r + 4].copy_from_slice(q);
                }
                let bs = |i: usize| {
                    i16::from_le_bytes([yb[Q8_K_BSUMS + 2 * i], yb[Q8_K_BSUMS + 2 * i + 1]])
                };
                for h in 0..4 {
                    // |bsum| <= 16 * 128 per group of 16: the sums of two fit in i16
                    let g0 = bs(4 * h) + bs(4 * h + 1);
                    let g1 = bs(4 * h + 2) + bs(4 * h + 3);
                    lanes.bsums[R * h + r] = i32::from(g0 as u16) | (i32::from(g1) << 16);
                }
            }
            let mut n = 0;
            while n + 4 <= rows {
                q4_k_vnni_rows::<4, RN>(w, n, b, &lanes, out);
                n += 4;
            }
            while n < rows {
                q4_k_vnni_rows::<1, RN>(w, n, b, &lanes, out);
                n += 1;
            }
        }
    }

    /// Block `b` of weight rows `n..n + RM` of [`dot_q4_k_rows_vnni`] against the activation
    /// block in `lanes`, added to `out[n..n + RM]`.
    ///
    /// # Safety
    /// As for [`dot_q4_k_rows_vnni`]; `n + RM <= out.len()`, block `b` inside the rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q4_k_vnni_rows<const RM: usize, const RN: usize>(
        w: StridedRows<'_>,
        n: usize,
        b: usize,
        lanes: &Q8KLanes,
        out: &mut [[f32; RN]],
    ) {
        let mask = _mm256_set1_epi8(0x0F);
        let mut dec = [const { Q4KDecoded { q: [0; QK_K] } }; RM];
        // per group of 32, the RM rows' scales
        let mut scales = [[0i32; RM]; 8];
        let mut mins = [[0u8; 8]; RM];
        let mut xd = [[0f32; 2]; RM];
        for i in 0..RM {
            let Some(xb) = w.row(n + i)[b * Q4_K_BYTES..].first_chunk::<Q4_K_BYTES>() else {
                return;
            };
            let (sc, m) = k4_scales(xb);
            for (s, v) in scales.iter_mut().zip(sc) {
                s[i] = v;
            }
            mins[i] = m;
            xd[i] = [fp16(xb[0], xb[1]), fp16(xb[2], xb[3])];
            for j in 0..4 {
                let v = load32(xb, 16 + 32 * j);
                let p = dec[i].q.as_mut_ptr().add(64 * j);
                // SAFETY: bytes `64 j .. 64 j + 64` of the 256.
                _mm256_storeu_si256(p.cast(), _mm256_and_si256(v, mask));
                _mm256_storeu_si256(
                    p.add(32).cast(),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                );
            }
        }
        let mut isum = [_mm512_setzero_si512(); RM];
        for (g, sc) in scales.iter().enumerate() {
            let mut acc = [_mm512_setzero_si512(); RM];
            for kk in 0..8 {
                let k = 8 * g + kk;
                // SAFETY: bytes `64 k .. 64 k + 64` of the interleaved quants (k < 64).
                let a = _mm512_load_si512(lanes.q.as_ptr().add(64 * k).cast());
                for i in 0..RM {
                    // SAFETY: bytes `4 k .. 4 k + 4` of the 256 decoded quants.
                    let x = dec[i].q.as_ptr().add(4 * k).cast::<i32>().read_unaligned();
                    acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_set1_epi32(x), a);
                }
            }
            for i in 0..RM {
                let s = _mm512_mullo_epi32(acc[i], _mm512_set1_epi32(sc[i]));
                isum[i] = _mm512_add_epi32(isum[i], s);
            }
        }
        // SAFETY: the 16 f32 of `d`, 64-byte aligned (the struct's alignment, offset a
        // multiple of 64).
        let yd = _mm512_load_ps(lanes.d.as_ptr());
        for i in 0..RM {
            let mut summs = _mm512_setzero_si512();
            for h in 0..4 {
                let m = i32::from(mins[i][2 * h]) | (i32::from(mins[i][2 * h + 1]) << 16);
                // SAFETY: the 16 i32 of pair `h`, 64-byte aligned as above.
                let bs = _mm512_load_si512(lanes.bsums.as_ptr().add(16 * h).cast());
                summs = _mm512_dpwssd_epi32(summs, _mm512_set1_epi32(m), bs);
            }
            // `combine_k4`'s steps, lane by lane
            let d = _mm512_mul_ps(_mm512_set1_ps(xd[i][0]), yd);
            let dmin = _mm512_mul_ps(_mm512_set1_ps(xd[i][1]), yd);
            let t = _mm512_sub_ps(
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[i])),
                _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summs)),
            );
            let o = out[n + i].as_mut_ptr();
            // SAFETY: `RN` == 16 f32 of row `n + i`'s output.
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), t));
        }
    }

    /// Bytes of one Q8_K block of the activation row of [`dot_q4_k_row1_zmm`]: the quants in
    /// the order the weight nibbles of a 64-byte load meet them (per half of the block, groups
    /// of 32 in the order 0, 2, 1, 3), the eight bsums of the groups of 32 (i16), `d`, padding.
    const Q8K_ROW1_BYTES: usize = 288;

    /// The 8 scales (bytes 0..8) and 8 mins (bytes 8..16) of a Q4_K super-block, as
    /// `k4_scales` decodes them (the 12-byte packing: low six bits of bytes 0..8, then the
    /// nibbles of bytes 8..12 with the top two bits of bytes 0..8), eight at a time in a u64.
    #[inline(always)]
    fn k4_scales_mins_u64(xb: &[u8; Q4_K_BYTES]) -> (u64, u64) {
        let u = |at: usize| u32::from_le_bytes([xb[at], xb[at + 1], xb[at + 2], xb[at + 3]]);
        let (a, b, c) = (u(4), u(8), u(12));
        let sc_lo = a & 0x3F3F_3F3F;
        let sc_hi = (c & 0x0F0F_0F0F) | (((a >> 6) & 0x0303_0303) << 4);
        let mn_lo = b & 0x3F3F_3F3F;
        let mn_hi = ((c >> 4) & 0x0F0F_0F0F) | (((b >> 6) & 0x0303_0303) << 4);
        (
            u64::from(sc_lo) | (u64::from(sc_hi) << 32),
            u64::from(mn_lo) | (u64::from(mn_hi) << 32),
        )
    }

    /// `tiles::dot_q4_k_rows` for one activation row (generation, and the last-token output
    /// projection of a prompt): the activation row rearranged once per call (see
    /// [`Q8K_ROW1_BYTES`]), so that each weight block is two 64-byte loads whose low and
    /// high nibbles meet 64 activation quants each; the scales and mins decoded with integer
    /// masks and spread by `vpermw`; four weight rows at a time, their integer sums reduced
    /// together and `combine_k4`'s f32 steps done for the four in one vector. The integer
    /// sums are exact (those of [`vec_dot_q4_k_q8_k`]), the f32 steps the same: the same bits.
    ///
    /// # Safety
    /// AVX-512 F, BW and VL, AVX2, FMA and F16C; `RN` == 1; every row of `y` as many Q8_K
    /// blocks as the rows of `w` have Q4_K blocks (whole blocks); `out` as long as `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_k_row1_zmm<const RN: usize>(
        w: StridedRows<'_>,
        y: &[&[u8]; RN],
        out: &mut [[f32; RN]],
    ) {
        assert!(RN == 1);
        let blocks = w.row_len() / Q4_K_BYTES;
        let rows = out.len().min(w.count());
        let mut ya = vec![0u8; blocks * Q8K_ROW1_BYTES];
        for (b, o) in ya.chunks_exact_mut(Q8K_ROW1_BYTES).enumerate() {
            let Some(yb) = y[0][b * Q8_K_BYTES..].first_chunk::<Q8_K_BYTES>() else {
                return;
            };
            for (c, o) in o[..QK_K].chunks_exact_mut(32).enumerate() {
                // chunk `c` of the rearranged quants is group `g` of 32
                let g = 4 * (c / 4) + [0, 2, 1, 3][c % 4];
                o.copy_from_slice(&yb[4 + 32 * g..4 + 32 * g + 32]);
            }
            let bs =
                |i: usize| i16::from_le_bytes([yb[Q8_K_BSUMS + 2 * i], yb[Q8_K_BSUMS + 2 * i + 1]]);
            for g in 0..8 {
                // |bsum| <= 16 * 128 per group of 16: the sums of two fit in i16
                let s = bs(2 * g) + bs(2 * g + 1);
                o[QK_K + 2 * g..QK_K + 2 * g + 2].copy_from_slice(&s.to_le_bytes());
            }
            o[QK_K + 16..QK_K + 20].copy_from_slice(&yb[..4]);
        }
        let mut n = 0;
        while n + 4 <= rows {
            q4_k_row1_rows::<4, RN>(w, n, &ya, out);
            n += 4;
        }
        while n < rows {
            q4_k_row1_rows::<1, RN>(w, n, &ya, out);
            n += 1;
        }
    }

    /// Weight rows `n..n + RM` (`RM` 1 or 4) of [`dot_q4_k_row1_zmm`] against the rearranged
    /// activation row `ya`, into `out[n..n + RM][0]`.
    ///
    /// # Safety
    /// As for [`dot_q4_k_row1_zmm`]; `n + RM <= out.len()`, `ya` as many blocks as the rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn q4_k_row1_rows<const RM: usize, const RN: usize>(
        w: StridedRows<'_>,
        n: usize,
        ya: &[u8],
        out: &mut [[f32; RN]],
    ) {
        let mask = _mm512_set1_epi8(0x0F);
        // `vpermw` indices: the scale of the groups that the low (high) nibbles of the first
        // (second) 64 bytes meet, per 256-bit half
        let idx = |lo: i16, hi: i16| {
            let v: [i16; 32] = std::array::from_fn(|i| if i < 16 { lo } else { hi });
            // SAFETY: 64 bytes of the 32 i16.
            _mm512_loadu_si512(v.as_ptr().cast())
        };
        let (i_lo0, i_hi0, i_lo1, i_hi1) = (idx(0, 2), idx(1, 3), idx(4, 6), idx(5, 7));
        let mut sum = _mm_setzero_ps();
        let mut sum1 = 0f32;
        for yb in ya.chunks_exact(Q8K_ROW1_BYTES) {
            let b = (yb.as_ptr() as usize - ya.as_ptr() as usize) / Q8K_ROW1_BYTES;
            // SAFETY: the 288 bytes of the block: quants at 0, 64, 128, 192, bsums at 256.
            let yp = yb.as_ptr();
            let (ylo0, yhi0) = (
                _mm512_loadu_si512(yp.cast()),
                _mm512_loadu_si512(yp.add(64).cast()),
            );
            let (ylo1, yhi1) = (
                _mm512_loadu_si512(yp.add(128).cast()),
                _mm512_loadu_si512(yp.add(192).cast()),
            );
            let bs2 = _mm_loadu_si128(yp.add(QK_K).cast());
            let yd =
                f32::from_le_bytes([yb[QK_K + 16], yb[QK_K + 17], yb[QK_K + 18], yb[QK_K + 19]]);
            let mut isum = [_mm256_setzero_si256(); RM];
            let mut summs = [_mm_setzero_si128(); RM];
            let mut xd = [0f32; 4];
            let mut xmin = [0f32; 4];
            for i in 0..RM {
                let Some(xb) = w.row(n + i)[b * Q4_K_BYTES..].first_chunk::<Q4_K_BYTES>() else {
                    return;
                };
                (xd[i], xmin[i]) = (fp16(xb[0], xb[1]), fp16(xb[2], xb[3]));
                let (sc, mn) = k4_scales_mins_u64(xb);
                let sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
                // SAFETY: bytes 16..80 and 80..144 of the block, its quants.
                let v0 = _mm512_loadu_si512(xb.as_ptr().add(16).cast());
                let v1 = _mm512_loadu_si512(xb.as_ptr().add(80).cast());
                let lo0 = _mm512_and_si512(v0, mask);
                let hi0 = _mm512_and_si512(_mm512_srli_epi16::<4>(v0), mask);
                let lo1 = _mm512_and_si512(v1, mask);
                let hi1 = _mm512_and_si512(_mm512_srli_epi16::<4>(v1), mask);
                let p = |q: __m512i, y: __m512i, ix: __m512i| {
                    _mm512_madd_epi16(_mm512_maddubs_epi16(q, y), _mm512_permutexvar_epi16(ix, sc))
                };
                let acc = _mm512_add_epi32(
                    _mm512_add_epi32(p(lo0, ylo0, i_lo0), p(hi0, yhi0, i_hi0)),
                    _mm512_add_epi32(p(lo1, ylo1, i_lo1), p(hi1, yhi1, i_hi1)),
                );
                isum[i] = _mm256_add_epi32(
                    _mm512_castsi512_si256(acc),
                    _mm512_extracti64x4_epi64::<1>(acc),
                );
                let mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
                summs[i] = _mm_madd_epi16(mn, bs2);
            }
            if RM == 4 {
                // the four rows' sums side by side
                let h = _mm256_hadd_epi32(
                    _mm256_hadd_epi32(isum[0], isum[1 % RM]),
                    _mm256_hadd_epi32(isum[2 % RM], isum[3 % RM]),
                );
                let is = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                let ms = _mm_hadd_epi32(
                    _mm_hadd_epi32(summs[0], summs[1 % RM]),
                    _mm_hadd_epi32(summs[2 % RM], summs[3 % RM]),
                );
                let ydv = _mm_set1_ps(yd);
                // `combine_k4`'s steps, row by row in the lanes
                let d = _mm_mul_ps(_mm_loadu_ps(xd.as_ptr()), ydv);
                let dmin = _mm_mul_ps(_mm_loadu_ps(xmin.as_ptr()), ydv);
                let t = _mm_sub_ps(
                    _mm_mul_ps(d, _mm_cvtepi32_ps(is)),
                    _mm_mul_ps(dmin, _mm_cvtepi32_ps(ms)),
                );
                sum = _mm_add_ps(sum, t);
            } else {
                let is = hsum_i32(isum[0]);
                let ms = _mm_cvtsi128_si32(_mm_hadd_epi32(
                    _mm_hadd_epi32(summs[0], summs[0]),
                    _mm_hadd_epi32(summs[0], summs[0]),
                ));
                let (d, dmin) = (xd[0] * yd, xmin[0] * yd);
                sum1 += d * is as f32 - dmin * ms as f32;
            }
        }
        if RM == 4 {
            let mut s = [0f32; 4];
            // SAFETY: 16 bytes of the four f32.
            _mm_storeu_ps(s.as_mut_ptr(), sum);
            for (i, v) in s.iter().enumerate() {
                out[n + i][0] = *v;
            }
        } else {
            out[n][0] = sum1;
        }
    }

    /// One Q8_0 (`Q8`) or Q4_0 row times a Q8_0 row (whole blocks of both, as far as the
    /// shorter goes): `tiles::vec_dot_portable` with AVX2 lane sums.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn vec_dot_q0<const Q8: bool>(x: &[u8], y: &[u8]) -> f32 {
        let bb = if Q8 { Q8_0_BYTES } else { Q4_0_BYTES };
        let blocks = (x.len() / bb).min(y.len() / Q8_0_BYTES);
        let mut acc = _mm256_setzero_ps();
        for b in 0..blocks {
            // SAFETY: blocks `b` of `x` and `y` lie inside the slices (`blocks` above).
            let xb = x.as_ptr().add(b * bb);
            let yb = y.as_ptr().add(b * Q8_0_BYTES);
            let yq = _mm256_loadu_si256(yb.add(2).cast());
            let lanes = if Q8 {
                lanes_i8_i8(weight_quants::<true, false>(xb), yq)
            } else {
                let q = weight_quants::<false, false>(xb);
                _mm256_sub_epi32(lanes_u4_i8(q, yq), lanes_u4_i8(_mm256_set1_epi8(8), yq))
            };
            let d = half_at(xb) * half_at(yb);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
        }
        hsum8(acc)
    }

    /// Q4_0 x Q8_0 row.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
        vec_dot_q0::<false>(x, y)
    }

    /// Q8_0 x Q8_0 row.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
        vec_dot_q0::<true>(x, y)
    }
}
