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
//! No AVX-512 and no AMX: AMX instructions die with SIGILL on machines that advertise but do
//! not enable them.
//!
//! `unsafe` is allowed here (`#[allow(unsafe_code)]` on the module, the crate denies it):
//! calling `#[target_feature]` functions after the run-time check, and the intrinsics'
//! unaligned loads and stores, each inside the arrays it is given.

use super::{float, k_quants, q4, q5, q8};

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
    quantize_f16(src: &[f32], dst: &mut [u8]) = float::quantize_f16;
    quantize_bf16(src: &[f32], dst: &mut [u8]) = float::quantize_bf16;
    quantize_q8_0(src: &[f32], dst: &mut [u8]) = q8::quantize_q8_0;
    quantize_q8_1(src: &[f32], dst: &mut [u8]) = q8::quantize_q8_1;
    quantize_q8_k(src: &[f32], dst: &mut [u8]) = q8::quantize_q8_k;

    vec_dot_f32(x: &[u8], y: &[u8]) -> f32 = float::vec_dot_f32;
    vec_dot_bf16(x: &[u8], y: &[u8]) -> f32 = float::vec_dot_bf16;
    vec_dot_q2_k_q8_k(x: &[u8], y: &[u8]) -> f32 = k_quants::vec_dot_q2_k_q8_k;
    vec_dot_q3_k_q8_k(x: &[u8], y: &[u8]) -> f32 = k_quants::vec_dot_q3_k_q8_k;
}

/// Defines `pub(super) fn $name(x, y) -> f32` that runs the hand-written AVX2 `$avx2` when the
/// CPU has AVX2+FMA+F16C, the portable `$portable` otherwise.
macro_rules! avx2_or_portable {
    ($($(#[$doc:meta])* $name:ident => $avx2:path, $portable:path;)*) => {$(
        $(#[$doc])*
        #[inline]
        pub(super) fn $name(x: &[u8], y: &[u8]) -> f32 {
            #[cfg(target_arch = "x86_64")]
            {
                if x86::has_avx2() {
                    // SAFETY: `has_avx2` checked at run time that this CPU supports AVX2, FMA
                    // and F16C, the features the kernel is compiled for; the kernel itself
                    // only reads inside the slices it is given.
                    return unsafe { $avx2(x, y) };
                }
            }
            $portable(x, y)
        }
    )*};
}

avx2_or_portable! {
    /// F16 x F16 (`x`, `y` of equal length).
    vec_dot_f16 => x86::vec_dot_f16, float::vec_dot_f16;
    /// Q4_1 x Q8_1 over whole blocks.
    vec_dot_q4_1_q8_1 => x86::vec_dot_q4_1_q8_1, q4::vec_dot_q4_1_q8_1;
    /// Q5_0 x Q8_0 over whole blocks.
    vec_dot_q5_0_q8_0 => x86::vec_dot_q5_0_q8_0, q5::vec_dot_q5_0_q8_0;
    /// Q5_1 x Q8_1 over whole blocks.
    vec_dot_q5_1_q8_1 => x86::vec_dot_q5_1_q8_1, q5::vec_dot_q5_1_q8_1;
    /// Q4_0 x Q8_0 over whole blocks (`x`, `y` exact multiples of the block sizes).
    vec_dot_q4_0_q8_0 => x86::vec_dot_q4_0_q8_0, q4::vec_dot_q4_0_q8_0;
    /// Q8_0 x Q8_0 over whole blocks.
    vec_dot_q8_0_q8_0 => x86::vec_dot_q8_0_q8_0, q8::vec_dot_q8_0_q8_0;
    /// Q4_K x Q8_K over whole super-blocks.
    vec_dot_q4_k_q8_k => x86::vec_dot_q4_k_q8_k, k_quants::vec_dot_q4_k_q8_k;
    /// Q5_K x Q8_K over whole super-blocks.
    vec_dot_q5_k_q8_k => x86::vec_dot_q5_k_q8_k, k_quants::vec_dot_q5_k_q8_k;
    /// Q6_K x Q8_K over whole super-blocks.
    vec_dot_q6_k_q8_k => x86::vec_dot_q6_k_q8_k, k_quants::vec_dot_q6_k_q8_k;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::super::float::{finish_dot, get_f16, LANES};
    use super::super::k_quants::{
        combine_k4, k4_scales, mins_dot, q6_k_scales, sum_blocks, Q4_K_BYTES, Q5_K_BYTES,
        Q6_K_BYTES,
    };
    use super::super::q4::{Q4_0_BYTES, Q4_1_BYTES};
    use super::super::q5::{Q5_0_BYTES, Q5_1_BYTES};
    use super::super::q8::{Q8_0_BYTES, Q8_1_BYTES};
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

    /// Integer part of one Q4_0 x Q8_0 block: `sum(q * y) - 8 * sum(y)`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn block_dot_q4_0(x: &[u8; Q4_0_BYTES], y: &[u8; Q8_0_BYTES]) -> i32 {
        let q4 = q4_32(x, 2);
        let q8 = load32(y, 2);
        let qy = dot_u8_i8(q4, q8);
        let ysum = dot_u8_i8(_mm256_set1_epi8(8), q8);
        hsum_i32(_mm256_sub_epi32(qy, ysum))
    }

    /// Q4_0 x Q8_0 row: the loop of `q4::vec_dot_q4_0_q8_0_with` with the AVX2 block sum.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in x.chunks_exact(Q4_0_BYTES).zip(y.chunks_exact(Q8_0_BYTES)) {
            let (Some(xb), Some(yb)) = (xb.first_chunk(), yb.first_chunk()) else {
                break;
            };
            let sumi = block_dot_q4_0(xb, yb);
            sumf += sumi as f32 * fp16(xb[0], xb[1]) * fp16(yb[0], yb[1]);
        }
        sumf
    }

    /// Integer part of one Q8_0 x Q8_0 block, widened to i16 so that -128 * -128 is exact.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn block_dot_q8_0(x: &[u8; Q8_0_BYTES], y: &[u8; Q8_0_BYTES]) -> i32 {
        let x0 = _mm256_cvtepi8_epi16(load16(x, 2));
        let x1 = _mm256_cvtepi8_epi16(load16(x, 18));
        let y0 = _mm256_cvtepi8_epi16(load16(y, 2));
        let y1 = _mm256_cvtepi8_epi16(load16(y, 18));
        let s = _mm256_add_epi32(_mm256_madd_epi16(x0, y0), _mm256_madd_epi16(x1, y1));
        hsum_i32(s)
    }

    /// Q8_0 x Q8_0 row: the loop of `q8::vec_dot_q8_0_q8_0_with` with the AVX2 block sum.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in x.chunks_exact(Q8_0_BYTES).zip(y.chunks_exact(Q8_0_BYTES)) {
            let (Some(xb), Some(yb)) = (xb.first_chunk(), yb.first_chunk()) else {
                break;
            };
            let sumi = block_dot_q8_0(xb, yb);
            sumf += sumi as f32 * (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1]));
        }
        sumf
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
        let mut lanes = [0f32; LANES];
        for (k, acc) in acc.iter().enumerate() {
            // SAFETY: lanes 8k..8k+8 of the 32-lane array; `storeu` needs no alignment.
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * k), *acc);
        }
        finish_dot(lanes, cx.remainder(), cy.remainder(), get_f16)
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
}
