//! AVX-512 BW/VL/VNNI kernels: the Q4_0 / Q8_0 tiles on zmm and EVEX `vpdpbusd`, and the
//! Q4_K row kernels (BW, VNNI, one activation row).

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::compute::quant::tiles::{
    self, Q8Row, StridedRows, ROW_BIAS, ROW_BLOCK_BYTES, ROW_SCALE,
};

use crate::compute::quant::k_quants::{k4_scales, Q4_K_BYTES};
use crate::compute::quant::q4::Q4_0_BYTES;
use crate::compute::quant::q8::{Q8_0_BYTES, Q8_K_BSUMS, Q8_K_BYTES};
use crate::compute::quant::{fp16, QK_K};

use super::avx2::{has_avx2, hsum_i32, load32};
use super::avx2_tiles::{dot_tile, half_at, has_avx_vnni, hsum8, weight_quants, PREFETCH};

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
                let h = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
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
            let bs =
                |i: usize| i16::from_le_bytes([yb[Q8_K_BSUMS + 2 * i], yb[Q8_K_BSUMS + 2 * i + 1]]);
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
        let yd = f32::from_le_bytes([yb[QK_K + 16], yb[QK_K + 17], yb[QK_K + 18], yb[QK_K + 19]]);
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
