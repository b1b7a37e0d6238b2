//! AVX2 kernels of the F16 / F32 MUL_MAT tiles, for CPUs without AVX-512 F: per output the
//! 32 lanes of `float::vec_dot_f16` / `float::vec_dot_f32` as four ymm (quarters: lanes
//! `8 q .. 8 q + 8`), each step's products fused in step order (one FMA each)
//! and reduced as the AVX2 `vec_dot_f16` does, so every result has the portable bits.

use std::arch::x86_64::*;

use crate::compute::quant::tiles::{self, StridedRows};

use super::avx2_tiles::hsum8;

/// The 16 ymm registers: a pass of [`float_pass`] keeps its accumulators, its activation
/// vectors, a weight vector and a product in them (more spills an accumulator to the stack,
/// and its store-to-load round trip then bounds the whole loop).
const REGISTERS: usize = 16;

/// Whether a pass over `quarters` quarters of an `rm` x `rn` tile fits in [`REGISTERS`].
const fn fits(rm: usize, rn: usize, quarters: usize) -> bool {
    quarters * rm * rn + rn + 2 <= REGISTERS
}

/// Quarter `q` (values `8 q .. 8 q + 8`) of step `s` (32 values) of a float weight row at
/// `w` (F16 if `F16`, else F32 little-endian), widened to f32.
///
/// # Safety
/// AVX2 and F16C; the step lies inside the row.
#[inline(always)]
unsafe fn weight_quarter<const F16: bool>(w: *const u8, s: usize, q: usize) -> __m256 {
    // SAFETY: the caller's guarantees.
    unsafe {
        if F16 {
            _mm256_cvtph_ps(_mm_loadu_si128(w.add(64 * s + 16 * q).cast()))
        } else {
            _mm256_loadu_ps(w.add(128 * s + 32 * q).cast())
        }
    }
}

/// The accumulators of quarters `first .. first + Q` of every output of the tile over all
/// the steps (each accumulator sees the additions of the portable lanes in their order).
///
/// # Safety
/// Those of [`dot_float_tile_ymm`], whose features it is inlined with.
#[inline(always)]
unsafe fn float_pass<const RM: usize, const RN: usize, const Q: usize, const F16: bool>(
    w: [*const u8; RM],
    y: [*const f32; RN],
    steps: usize,
    first: usize,
) -> [[[__m256; Q]; RN]; RM] {
    // SAFETY: the caller's guarantees (features; step `s` inside the rows).
    unsafe {
        let mut acc = [[[_mm256_setzero_ps(); Q]; RN]; RM];
        for s in 0..steps {
            for (k, q) in (first..first + Q).enumerate() {
                let yv: [__m256; RN] =
                    std::array::from_fn(|j| _mm256_loadu_ps(y[j].add(32 * s + 8 * q)));
                for i in 0..RM {
                    let x = weight_quarter::<F16>(w[i], s, q);
                    for j in 0..RN {
                        acc[i][j][k] = _mm256_fmadd_ps(x, yv[j], acc[i][j][k]);
                    }
                }
            }
        }
        acc
    }
}

/// `RM` float weight rows at `w` (F16 if `F16`, else F32 little-endian) times `RN`
/// activation rows at `y` (f32; for F16 weights exact widenings of F16 values), `steps`
/// steps of 32 values, into `out[i][j]`: two weight rows at a time (or one) where the whole
/// tile's accumulators would not [`fit`](fits) in registers, each with [`dot_float_rows_tile`].
///
/// # Safety
/// AVX2, FMA and F16C; `64 * steps` (F16) or `128 * steps` (F32) readable bytes at every
/// `w[i]`, `32 * steps` f32 at every `y[j]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_float_tile_ymm<const RM: usize, const RN: usize, const F16: bool>(
    w: [*const u8; RM],
    y: [*const f32; RN],
    steps: usize,
    out: &mut [[f32; RN]; RM],
) {
    // SAFETY (every call): the caller's guarantees, for a subset of its rows.
    if fits(RM, RN, 1) {
        unsafe { dot_float_rows_tile::<RM, RN, F16>(w, y, steps, out) };
        return;
    }
    let (pairs, rest) = out.as_chunks_mut::<2>();
    let pairs_len = pairs.len();
    if fits(2, RN, 1) {
        for (i, o) in pairs.iter_mut().enumerate() {
            unsafe { dot_float_rows_tile::<2, RN, F16>([w[2 * i], w[2 * i + 1]], y, steps, o) };
        }
        for (i, o) in rest.iter_mut().enumerate() {
            let o = std::array::from_mut(o);
            unsafe { dot_float_rows_tile::<1, RN, F16>([w[2 * pairs_len + i]], y, steps, o) };
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            let o = std::array::from_mut(o);
            unsafe { dot_float_rows_tile::<1, RN, F16>([w[i]], y, steps, o) };
        }
    }
}

/// [`dot_float_tile_ymm`] on a tile whose accumulators fit in registers for at least one
/// quarter of the lanes: as many quarters per pass over the steps as fit (all four, two or
/// one), then per output `(q0 + q2) + (q1 + q3)` and [`hsum8`], the reduction of the AVX2
/// `vec_dot_f16`.
///
/// # Safety
/// Those of [`dot_float_tile_ymm`].
#[inline(always)]
unsafe fn dot_float_rows_tile<const RM: usize, const RN: usize, const F16: bool>(
    w: [*const u8; RM],
    y: [*const f32; RN],
    steps: usize,
    out: &mut [[f32; RN]; RM],
) {
    let mut quarters = [[[_mm256_setzero_ps(); 4]; RN]; RM];
    // SAFETY (all three arms): the caller's guarantees.
    if fits(RM, RN, 4) {
        quarters = unsafe { float_pass::<RM, RN, 4, F16>(w, y, steps, 0) };
    } else if fits(RM, RN, 2) {
        for first in [0, 2] {
            let acc = unsafe { float_pass::<RM, RN, 2, F16>(w, y, steps, first) };
            for (qi, ai) in quarters.iter_mut().zip(acc) {
                for (qj, aj) in qi.iter_mut().zip(ai) {
                    qj[first..first + 2].copy_from_slice(&aj);
                }
            }
        }
    } else {
        for first in 0..4 {
            let acc = unsafe { float_pass::<RM, RN, 1, F16>(w, y, steps, first) };
            for (qi, ai) in quarters.iter_mut().zip(acc) {
                for (qj, [aj]) in qi.iter_mut().zip(ai) {
                    qj[first] = aj;
                }
            }
        }
    }
    for (oi, qi) in out.iter_mut().zip(&quarters) {
        for (o, [q0, q1, q2, q3]) in oi.iter_mut().zip(qi) {
            // SAFETY: AVX2 (the caller's).
            *o = unsafe {
                hsum8(_mm256_add_ps(
                    _mm256_add_ps(*q0, *q2),
                    _mm256_add_ps(*q1, *q3),
                ))
            };
        }
    }
}

/// `tiles::dot_float_rows` (F16 weights if `F16`, else F32) on AVX2: the tile kernel on
/// the groups of `tiles::dot_rows`, then on the rest one by one; with one activation row
/// (generation: the output projection streams its weights from memory) one weight row after
/// the other, a single sequential stream as on AVX-512.
///
/// # Safety
/// AVX2, FMA and F16C; the rows of `y` of one length, a multiple of 32; every row of `w` of
/// two (F16) or four (F32) times that many bytes; `out` as long as `w`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_float_rows_ymm<const RN: usize, const F16: bool>(
    w: StridedRows<'_>,
    y: &[&[f32]; RN],
    out: &mut [[f32; RN]],
) {
    let steps = y.first().map_or(0, |r| r.len()) / 32;
    let yp: [*const f32; RN] = std::array::from_fn(|j| y[j].as_ptr());
    if RN == 1 {
        for (n, o) in out.iter_mut().enumerate() {
            // SAFETY: the caller's guarantees for row `n`.
            unsafe {
                let o = std::array::from_mut(o);
                dot_float_tile_ymm::<1, RN, F16>([w.row(n).as_ptr()], yp, steps, o);
            }
        }
        return;
    }
    tiles::for_each_group(
        w,
        out,
        // SAFETY: the caller's guarantees, row by row.
        |g, o| unsafe { dot_float_tile_ymm::<4, RN, F16>(g.map(|r| r.as_ptr()), yp, steps, o) },
        |r, o| unsafe {
            let o = std::array::from_mut(o);
            dot_float_tile_ymm::<1, RN, F16>([r.as_ptr()], yp, steps, o);
        },
    );
}
