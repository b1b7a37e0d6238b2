//! AVX2+FMA+F16C kernels: the F16 dot products and conversions, SOFT_MAX's row scans, Q8_0
//! quantization, the Q4_1/Q5_0/Q5_1 and K-quant dot products, and the Q4_K row kernel.

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::compute::quant::tiles::StridedRows;

use crate::compute::quant::float::{finish_dot, get_f16, LANES};
use crate::compute::quant::k_quants::{
    combine_k4, k4_scales, mins_dot, q6_k_scales, sum_blocks, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES,
};
use crate::compute::quant::q4::Q4_1_BYTES;
use crate::compute::quant::q5::{Q5_0_BYTES, Q5_1_BYTES};
use crate::compute::quant::q8::{Q8_0_BYTES, Q8_1_BYTES, Q8_K_BSUMS, Q8_K_BYTES};
use crate::compute::quant::{fp16, QK_K};

use super::avx2_tiles::hsum8;

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
pub(super) unsafe fn hsum_i32(v: __m256i) -> i32 {
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
pub(super) unsafe fn load32<const N: usize>(b: &[u8; N], at: usize) -> __m256i {
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
/// same FMA per lane, tail and reduction, so the result is bit-identical.
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
            *acc = _mm256_fmadd_ps(vx, vy, *acc);
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
/// (same lanes, same FMAs, same reduction: the same bits).
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
            *ca = _mm256_fmadd_ps(va, vy, *ca);
            *cb = _mm256_fmadd_ps(vb, vy, *cb);
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
            _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d))) as u16;
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
                    let s0 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(*lo, load32(qs, 64 * j)), sc[2 * j]);
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
