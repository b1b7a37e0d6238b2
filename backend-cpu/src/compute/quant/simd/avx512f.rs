//! AVX-512 F kernels: the F16 / F32 MUL_MAT tiles and the column-to-row transposes of their
//! results.

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::compute::quant::tiles::{self, StridedRows};

use super::avx2::has_avx2;
use super::avx2_tiles::hsum8;

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
///
/// One row at a time, as ggml's `ggml_vec_dot_f16` streams the output projection: the
/// hardware prefetcher follows one sequential stream best. Two to four interleaved rows
/// (`bench::dot_float_row1_variant`) were much slower on Zen 4 and, on Intel, slower for F16
/// weights and no faster for F32 than one row with the prefetch below.
const ROW1_GROUP: usize = 1;

/// How far ahead of the current weight row the one-activation-row float loop prefetches,
/// in rows (0: none), on this CPU.
///
/// Under llama-bench the output projection rarely stays in cache between tokens, so the
/// cold passes of `cargo bench -p backend-cpu --bench tiles -- float_row1` decide: on Intel
/// (Xeon, AVX-512) two rows ahead was clearly faster for F32 and F16 weights, one or four
/// less so; on AMD (Zen 4) any prefetch was slower, so none there.
fn row1_prefetch_rows() -> usize {
    if super::amd_cores() {
        0
    } else {
        2
    }
}

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
                    acc[i][j] = _mm512_fmadd_ps(x, yv[j], acc[i][j]);
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
/// products fused into them in step order (one FMA each, as the portable `mul_add`:
/// the same bits), and the reduction of [`reduce_halves`] (that of the AVX2 `vec_dot_f16`).
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
                    lo[i][j] = _mm512_fmadd_ps(x0, y0, lo[i][j]);
                    hi[i][j] = _mm512_fmadd_ps(x1, y1, hi[i][j]);
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
/// `ahead` bytes ahead (none if 0), then the rest one by one.
///
/// # Safety
/// AVX-512 F, AVX2, FMA and F16C; `32 * steps` f32 at `y`; every row of `w` at least
/// `64 * steps` (F16) or `128 * steps` bytes; `out` as long as `w`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn dot_float_row1_zmm<const F16: bool, const G: usize>(
    w: StridedRows<'_>,
    y: *const f32,
    steps: usize,
    ahead: usize,
    out: &mut [f32],
) {
    let groups = w.count() / G;
    let (head, tail) = out.split_at_mut(groups * G);
    let (head, _) = head.as_chunks_mut::<G>();
    for (g, o) in head.iter_mut().enumerate() {
        let first = g * G;
        let rows: [*const u8; G] = std::array::from_fn(|i| w.row(first + i).as_ptr());
        if ahead > 0 {
            for &r in &rows {
                for line in (0..w.row_len()).step_by(64) {
                    // a hint (nothing is read, any address is allowed)
                    _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(ahead + line).cast());
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
            let ahead = row1_prefetch_rows() * w.row_len();
            dot_float_row1_zmm::<F16, ROW1_GROUP>(w, y, steps, ahead, o)
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
