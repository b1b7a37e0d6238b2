//! The Q4_0 / Q8_0 tile kernels of MUL_MAT on 256-bit vectors: AVX2, with AVX-VNNI's
//! `vpdpbusd` (inline assembly) where the CPU has it, and the Q4_0 / Q8_0 row dot products
//! built from the same steps.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::compute::quant::tiles::{self, Q8Row, StridedRows, ROW_BLOCK_BYTES, ROW_SCALE};

use crate::compute::quant::q4::Q4_0_BYTES;
use crate::compute::quant::q8::Q8_0_BYTES;

use super::avx2::has_avx2;

/// How far ahead (bytes) the tile kernels prefetch weight rows when they stream them.
pub(super) const PREFETCH: usize = 2048;

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

/// Sixteen i16 ones, for `vpmaddwd` to sum pairs (read from memory: the tiles use every
/// register).
static ONES: [i16; 16] = [1; 16];

/// One Q8_0 weight block times one activation block of a [`Q8Row`] without VNNI, into
/// `acc`: the activation quants take the signs of the weight quants (`vpsignb`), times
/// the weights' magnitudes `u` (`vpmaddubsw`: unsigned times signed, pairs summed, which
/// cannot saturate as |y| <= 127), pairs summed again, so each i32 lane is the exact sum
/// of four products; then `acc = fma(dx * dy, lanes as f32, acc)`. One asm block for the
/// reason of [`vnni_step`].
///
/// # Safety
/// AVX2 and FMA; `xq` must point at the weight block's 32 quants, `yb` at a whole block of
/// `ROW_BLOCK_BYTES` bytes whose quants are never -128 ([`Q8Row::signable`]), `ones` at
/// [`ONES`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sign_step(
    acc: &mut __m256,
    u: __m256i,
    xq: *const u8,
    dx: __m256,
    yb: *const u8,
    ones: *const i16,
) {
    // SAFETY: AVX2/FMA instructions only (enabled here); the reads are the caller's 32
    // bytes at `xq`, the block at `yb` (quants at 0, scales at ROW_SCALE = 64) and `ONES`,
    // unaligned loads. Writes only `acc` and the two temporaries; no stack, no flags.
    asm!(
        "vmovdqu {t}, ymmword ptr [{yb}]",
        "vpsignb {t}, {t}, ymmword ptr [{xq}]",
        "vpmaddubsw {t}, {u}, {t}",
        "vpmaddwd {t}, {t}, ymmword ptr [{ones}]",
        "vcvtdq2ps {t}, {t}",
        "vmulps {d}, {dx}, ymmword ptr [{yb} + 64]",
        "vfmadd231ps {acc}, {d}, {t}",
        acc = inout(ymm_reg) *acc,
        u = in(ymm_reg) u,
        xq = in(reg) xq,
        dx = in(ymm_reg) dx,
        yb = in(reg) yb,
        ones = in(reg) ones,
        t = out(ymm_reg) _,
        d = out(ymm_reg) _,
        options(pure, readonly, nostack, preserves_flags)
    );
}

/// One Q4_0 weight block (its nibbles `u`, 0..15) times one activation block without
/// VNNI, into `acc`: `vpmaddubsw` (pair sums fit i16), pairs summed, plus the block's
/// biases (the `- 8`), then `acc = fma(dx * dy, lanes as f32, acc)`.
///
/// # Safety
/// AVX2 and FMA; `yb` must point at a whole block of `ROW_BLOCK_BYTES` bytes, `ones` at
/// [`ONES`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibble_step(acc: &mut __m256, u: __m256i, dx: __m256, yb: *const u8, ones: *const i16) {
    // SAFETY: as in `sign_step`; biases at ROW_BIAS = 32.
    asm!(
        "vpmaddubsw {t}, {u}, ymmword ptr [{yb}]",
        "vpmaddwd {t}, {t}, ymmword ptr [{ones}]",
        "vpaddd {t}, {t}, ymmword ptr [{yb} + 32]",
        "vcvtdq2ps {t}, {t}",
        "vmulps {d}, {dx}, ymmword ptr [{yb} + 64]",
        "vfmadd231ps {acc}, {d}, {t}",
        acc = inout(ymm_reg) *acc,
        u = in(ymm_reg) u,
        dx = in(ymm_reg) dx,
        yb = in(reg) yb,
        ones = in(reg) ones,
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
pub(super) unsafe fn hsum8(v: __m256) -> f32 {
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
pub(super) unsafe fn half_at(p: *const u8) -> f32 {
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
pub(super) unsafe fn weight_quants<const Q8: bool, const VNNI: bool>(xb: *const u8) -> __m256i {
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

/// How a tile kernel sums the products of a weight block with an activation block into
/// i32 lanes: the const parameter of [`tile`].
mod lane_sums {
    /// `vpdpbusd` started from the block's biases ([`super::vnni_step`]).
    pub const VNNI: u8 = 0;
    /// `vpmaddubsw` with the signs moved onto the activations (Q8_0, [`super::sign_step`])
    /// or the nibbles unsigned and the `- 8` in the biases (Q4_0, [`super::nibble_step`]).
    pub const SIGN: u8 = 1;
    /// Widened to i16 ([`super::lanes_i8_i8`]): Q8_0 activations holding -128, which the
    /// sign trick cannot negate (only a Q8_0 `src1` given as such holds it; quantizing
    /// never yields it).
    pub const WIDE: u8 = 2;
}

/// The lane sums [`tile`] may use for activation rows `y` on this CPU.
fn lane_sums_for<const Q8: bool, const VNNI: bool>(y: &[Q8Row<'_>]) -> u8 {
    if VNNI {
        lane_sums::VNNI
    } else if !Q8 || y.iter().all(|r| r.signable) {
        lane_sums::SIGN
    } else {
        lane_sums::WIDE
    }
}

/// `tiles::dot_tile` for Q8_0 (`Q8`) or Q4_0 weights: per block each weight row's quants
/// are unpacked once and each activation row's loaded once, the `RM x RN` products kept
/// in f32 lane accumulators. The lane sums are exact, the f32 steps those of
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
    // SAFETY (all three): the caller's guarantees; the lane sums are those the CPU has and
    // the activations allow.
    match lane_sums_for::<Q8, VNNI>(y) {
        lane_sums::VNNI => tile::<RM, RN, Q8, { lane_sums::VNNI }>(w, y, out),
        lane_sums::SIGN => tile::<RM, RN, Q8, { lane_sums::SIGN }>(w, y, out),
        _ => tile::<RM, RN, Q8, { lane_sums::WIDE }>(w, y, out),
    }
}

/// [`dot_tile`] with its lane sums chosen (`SUMS`, one of [`lane_sums`]).
///
/// # Safety
/// As [`dot_tile`]; AVX-VNNI for [`lane_sums::VNNI`]; for [`lane_sums::SIGN`] and Q8_0
/// weights no activation quant may be -128.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const RM: usize, const RN: usize, const Q8: bool, const SUMS: u8>(
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]; RM],
) {
    let vnni = SUMS == lane_sums::VNNI;
    let bb = if Q8 { Q8_0_BYTES } else { Q4_0_BYTES };
    let blocks = y.first().map_or(0, |r| r.blocks);
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    if vnni && RM == 4 {
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
                let q = weight_quants::<Q8, true>(xb[i]);
                for j in 0..RN {
                    let yb = y[j].bytes.as_ptr().add(b * ROW_BLOCK_BYTES);
                    vnni_step_scaled(&mut acc[i][j], q, yb, &scales[j][i]);
                }
            }
        }
    } else {
        let ones = ONES.as_ptr();
        for b in 0..blocks {
            for i in 0..RM {
                // SAFETY: the caller guarantees `blocks` whole blocks in every weight row.
                let xb = w[i].as_ptr().add(b * bb);
                if RN == 1 {
                    // As above: the weights stream.
                    _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_add(PREFETCH).cast());
                }
                let dx = _mm256_set1_ps(half_at(xb));
                let q = if vnni {
                    weight_quants::<Q8, true>(xb)
                } else {
                    weight_quants::<Q8, false>(xb)
                };
                // the sign trick multiplies the Q8_0 weights' magnitudes
                let u = if Q8 && SUMS == lane_sums::SIGN {
                    _mm256_abs_epi8(q)
                } else {
                    q
                };
                for j in 0..RN {
                    // SAFETY: every activation row has `blocks` blocks of ROW_BLOCK_BYTES
                    // (32 quants, 8 biases, 8 copies of the scale), and a Q8_0 weight block
                    // its 32 quants after the scale.
                    let yb = y[j].bytes.as_ptr().add(b * ROW_BLOCK_BYTES);
                    match SUMS {
                        lane_sums::VNNI => vnni_step(&mut acc[i][j], u, dx, yb),
                        lane_sums::SIGN if Q8 => {
                            sign_step(&mut acc[i][j], u, xb.add(2), dx, yb, ones)
                        }
                        lane_sums::SIGN => nibble_step(&mut acc[i][j], u, dx, yb, ones),
                        _ => {
                            let lanes = lanes_i8_i8(u, _mm256_loadu_si256(yb.cast()));
                            let d = _mm256_mul_ps(dx, _mm256_loadu_ps(yb.add(ROW_SCALE).cast()));
                            acc[i][j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[i][j]);
                        }
                    }
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
/// one, the lane sums chosen once.
///
/// # Safety
/// As [`dot_tile`], for every row of `w`; `out` as long as `w`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows<const RN: usize, const Q8: bool, const VNNI: bool>(
    w: StridedRows<'_>,
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]],
) {
    // SAFETY (all three): as in `dot_tile`.
    match lane_sums_for::<Q8, VNNI>(y) {
        lane_sums::VNNI => rows::<RN, Q8, { lane_sums::VNNI }>(w, y, out),
        lane_sums::SIGN => rows::<RN, Q8, { lane_sums::SIGN }>(w, y, out),
        _ => rows::<RN, Q8, { lane_sums::WIDE }>(w, y, out),
    }
}

/// [`dot_rows`] with its lane sums chosen, as in [`tile`].
///
/// # Safety
/// As [`tile`], for every row of `w`; `out` as long as `w`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const RN: usize, const Q8: bool, const SUMS: u8>(
    w: StridedRows<'_>,
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]],
) {
    tiles::for_each_group(
        w,
        out,
        // SAFETY: the caller's guarantees, row by row.
        |g, o| unsafe { tile::<4, RN, Q8, SUMS>(g, y, o) },
        |r, o| unsafe { tile::<1, RN, Q8, SUMS>(&[r], y, std::array::from_mut(o)) },
    );
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
