//! The K-quants Q2_K..Q6_K: super-blocks of 256 weights with per-group scales.
//!
//! ```text
//! block_q2_K (84 B):  scales: [u8; 16] | qs: [u8; 64] | d: f16 | dmin: f16
//!                     16 groups of 16, w = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3
//! block_q3_K (110 B): hmask: [u8; 32] | qs: [u8; 64] | scales: [u8; 12] | d: f16
//!                     16 groups of 16, w = d * (sc - 32) * q, q in -4..3, sc 6-bit packed
//! block_q4_K (144 B): d: f16 | dmin: f16 | scales: [u8; 12] | qs: [u8; 128]
//!                     8 groups of 32, w = d * sc * q - dmin * m, q in 0..15, sc/m 6-bit packed
//! block_q5_K (176 B): d: f16 | dmin: f16 | scales: [u8; 12] | qh: [u8; 32] | qs: [u8; 128]
//!                     as Q4_K with q in 0..31 (fifth bit from qh)
//! block_q6_K (210 B): ql: [u8; 128] | qh: [u8; 64] | scales: [i8; 16] | d: f16
//!                     16 groups of 16, w = d * sc * q, q in -32..31
//! ```
//!
//! Each format has an `unpack_*` that spreads a super-block's quants into 256 signed bytes in
//! element order (for Q2_K, Q4_K and Q5_K without the min, which ggml handles separately
//! through `bsums`). Dequantization applies ggml's float formula to them element by element
//! (same operations in the same order as `dequantize_row_*`), and the dot products compute the
//! exact integer `sum(scale_g * sum_{e in g}(q_e * y_e))` per super-block, then combine it in
//! f32 with the super-block scales.

use super::q8::{q8k, Q8K, Q8_K_BYTES};
use super::{fp16, QK_K};

/// Bytes of a `block_q2_K`.
pub(super) const Q2_K_BYTES: usize = 84;
/// Bytes of a `block_q3_K`.
pub(super) const Q3_K_BYTES: usize = 110;
/// Bytes of a `block_q4_K`.
pub(super) const Q4_K_BYTES: usize = 144;
/// Bytes of a `block_q5_K`.
pub(super) const Q5_K_BYTES: usize = 176;
/// Bytes of a `block_q6_K`.
pub(super) const Q6_K_BYTES: usize = 210;

/// Quants of one super-block in element order.
pub(super) type Quants = [i8; QK_K];

// ---------------------------------------------------------------------------------------
// Scales

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of group `j` (0..8) of Q4_K/Q5_K.
#[inline(always)]
pub(super) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All 8 scales and mins of a Q4_K/Q5_K super-block.
#[inline(always)]
pub(super) fn scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, q);
    }
    (sc, m)
}

/// The 16 signed scales of a Q3_K super-block (6-bit values minus 32).
#[inline(always)]
pub(super) fn scales_q3_k(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0x0F } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// A little-endian f16 at `at` of a block.
#[inline(always)]
fn fp16_at<const N: usize>(b: &[u8; N], at: usize) -> f32 {
    fp16(b[at], b[at + 1])
}

// ---------------------------------------------------------------------------------------
// Unpacking

/// Q2_K quants: element `128n + 32j + l` is bits `2j..2j+2` of `qs[32n + l]`.
#[inline(always)]
pub(super) fn unpack_q2_k(b: &[u8; Q2_K_BYTES], a: &mut Quants) {
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                a[128 * n + 32 * j + l] = ((b[16 + 32 * n + l] >> (2 * j)) & 3) as i8;
            }
        }
    }
}

/// Q3_K quants: as Q2_K for the low two bits, minus 4 where bit `4n + j` of `hmask[l]` is
/// clear.
#[inline(always)]
pub(super) fn unpack_q3_k(b: &[u8; Q3_K_BYTES], a: &mut Quants) {
    for n in 0..2 {
        for j in 0..4 {
            let m = 1u8 << (4 * n + j);
            for l in 0..32 {
                let low = ((b[32 + 32 * n + l] >> (2 * j)) & 3) as i8;
                let high = if b[l] & m != 0 { 0 } else { 4 };
                a[128 * n + 32 * j + l] = low - high;
            }
        }
    }
}

/// Q4_K quants: element `64j + l` is the low nibble of `qs[32j + l]`, `64j + 32 + l` the high
/// one.
#[inline(always)]
pub(super) fn unpack_q4_k(b: &[u8; Q4_K_BYTES], a: &mut Quants) {
    for j in 0..4 {
        for l in 0..32 {
            let q = b[16 + 32 * j + l];
            a[64 * j + l] = (q & 0x0F) as i8;
            a[64 * j + 32 + l] = (q >> 4) as i8;
        }
    }
}

/// Q5_K quants: as Q4_K, plus 16 where bit `2j` (low nibbles) or `2j + 1` (high nibbles) of
/// `qh[l]` is set.
#[inline(always)]
pub(super) fn unpack_q5_k(b: &[u8; Q5_K_BYTES], a: &mut Quants) {
    for j in 0..4 {
        for l in 0..32 {
            let q = b[48 + 32 * j + l];
            let h = b[16 + l] >> (2 * j);
            a[64 * j + l] = ((q & 0x0F) | ((h & 1) << 4)) as i8;
            a[64 * j + 32 + l] = ((q >> 4) | ((h & 2) << 3)) as i8;
        }
    }
}

/// Q6_K quants: per half `n`, element `128n + l + 32k` (k = 0..4) takes a nibble of
/// `ql[64n + l]` (k = 0, 2) or `ql[64n + 32 + l]` (k = 1, 3) and two bits `2k..2k+2` of
/// `qh[32n + l]`, minus 32.
#[inline(always)]
pub(super) fn unpack_q6_k(b: &[u8; Q6_K_BYTES], a: &mut Quants) {
    for n in 0..2 {
        for l in 0..32 {
            let ql0 = b[64 * n + l];
            let ql1 = b[64 * n + 32 + l];
            let qh = b[128 + 32 * n + l];
            let base = 128 * n + l;
            a[base] = ((ql0 & 0x0F) | ((qh & 3) << 4)) as i8 - 32;
            a[base + 32] = ((ql1 & 0x0F) | (((qh >> 2) & 3) << 4)) as i8 - 32;
            a[base + 64] = ((ql0 >> 4) | (((qh >> 4) & 3) << 4)) as i8 - 32;
            a[base + 96] = ((ql1 >> 4) | (((qh >> 6) & 3) << 4)) as i8 - 32;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Dequantization

/// Runs `f` on every (block, 256 outputs) pair.
#[inline(always)]
fn for_blocks<const N: usize>(
    src: &[u8],
    dst: &mut [f32],
    mut f: impl FnMut(&[u8; N], &mut [f32; QK_K]),
) {
    for (b, out) in src.chunks_exact(N).zip(dst.chunks_exact_mut(QK_K)) {
        let (Some(b), Some(out)) = (b.first_chunk::<N>(), out.first_chunk_mut::<QK_K>()) else {
            break;
        };
        f(b, out);
    }
}

/// `dequantize_row_q2_K`: `dl * q - ml` with `dl = d * (sc & 15)`, `ml = dmin * (sc >> 4)`.
#[inline(always)]
pub(super) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<Q2_K_BYTES>(
        src,
        dst,
        #[inline(always)]
        |b, out| {
            let d = fp16_at(b, 80);
            let min = fp16_at(b, 82);
            let mut a = [0i8; QK_K];
            unpack_q2_k(b, &mut a);
            for (g, (out, a)) in out.chunks_exact_mut(16).zip(a.chunks_exact(16)).enumerate() {
                let sc = b[g];
                let dl = d * f32::from(sc & 0x0F);
                let ml = min * f32::from(sc >> 4);
                for (o, &q) in out.iter_mut().zip(a) {
                    *o = dl * f32::from(q) - ml;
                }
            }
        },
    );
}

/// `dequantize_row_q3_K`: `dl * q` with `dl = d * (sc - 32)`.
#[inline(always)]
pub(super) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<Q3_K_BYTES>(
        src,
        dst,
        #[inline(always)]
        |b, out| {
            let d = fp16_at(b, 108);
            let mut scales_raw = [0u8; 12];
            scales_raw.copy_from_slice(&b[96..108]);
            let scales = scales_q3_k(&scales_raw);
            let mut a = [0i8; QK_K];
            unpack_q3_k(b, &mut a);
            for ((out, a), &sc) in out
                .chunks_exact_mut(16)
                .zip(a.chunks_exact(16))
                .zip(&scales)
            {
                let dl = d * f32::from(sc);
                for (o, &q) in out.iter_mut().zip(a) {
                    *o = dl * f32::from(q);
                }
            }
        },
    );
}

/// Q4_K and Q5_K: `d1 * q - m1` with `d1 = d * sc`, `m1 = dmin * m` per group of 32.
#[inline(always)]
fn dequantize_k4(b_d: f32, b_dmin: f32, scales: &[u8; 12], a: &Quants, out: &mut [f32; QK_K]) {
    let (sc, m) = scales_mins_k4(scales);
    for (g, (out, a)) in out.chunks_exact_mut(32).zip(a.chunks_exact(32)).enumerate() {
        let d1 = b_d * f32::from(sc[g]);
        let m1 = b_dmin * f32::from(m[g]);
        for (o, &q) in out.iter_mut().zip(a) {
            *o = d1 * f32::from(q) - m1;
        }
    }
}

/// `dequantize_row_q4_K`.
#[inline(always)]
pub(super) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<Q4_K_BYTES>(
        src,
        dst,
        #[inline(always)]
        |b, out| {
            let mut scales = [0u8; 12];
            scales.copy_from_slice(&b[4..16]);
            let mut a = [0i8; QK_K];
            unpack_q4_k(b, &mut a);
            dequantize_k4(fp16_at(b, 0), fp16_at(b, 2), &scales, &a, out);
        },
    );
}

/// `dequantize_row_q5_K`.
#[inline(always)]
pub(super) fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<Q5_K_BYTES>(
        src,
        dst,
        #[inline(always)]
        |b, out| {
            let mut scales = [0u8; 12];
            scales.copy_from_slice(&b[4..16]);
            let mut a = [0i8; QK_K];
            unpack_q5_k(b, &mut a);
            dequantize_k4(fp16_at(b, 0), fp16_at(b, 2), &scales, &a, out);
        },
    );
}

/// `dequantize_row_q6_K`: `d * sc * q`.
#[inline(always)]
pub(super) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<Q6_K_BYTES>(
        src,
        dst,
        #[inline(always)]
        |b, out| {
            let d = fp16_at(b, 208);
            let mut a = [0i8; QK_K];
            unpack_q6_k(b, &mut a);
            for (g, (out, a)) in out.chunks_exact_mut(16).zip(a.chunks_exact(16)).enumerate() {
                let sc = f32::from(b[192 + g] as i8);
                for (o, &q) in out.iter_mut().zip(a) {
                    *o = d * sc * f32::from(q);
                }
            }
        },
    );
}

// ---------------------------------------------------------------------------------------
// Dot products

/// `sum_g scales[g] * sum_{e in group g}(a[e] * q8[e])` for groups of `G` elements; exact
/// (|a| <= 63, |q8| <= 128, |scale| <= 128: every partial sum fits an i32).
#[inline(always)]
pub(super) fn group_dot<const G: usize>(a: &Quants, q8: &[u8; QK_K], scales: &[i32]) -> i32 {
    let mut isum = 0i32;
    for ((a, q8), &sc) in a.chunks_exact(G).zip(q8.chunks_exact(G)).zip(scales) {
        let mut s = 0i32;
        for (&x, &y) in a.iter().zip(q8) {
            s += i32::from(x) * i32::from(y as i8);
        }
        isum += sc * s;
    }
    isum
}

/// Runs `f` on every (weight block, Q8_K block) pair and sums what it returns.
#[inline(always)]
pub(super) fn sum_blocks<const N: usize>(
    x: &[u8],
    y: &[u8],
    mut f: impl FnMut(&[u8; N], &Q8K<'_>) -> f32,
) -> f32 {
    let mut sumf = 0f32;
    for (xb, yb) in x.chunks_exact(N).zip(y.chunks_exact(Q8_K_BYTES)) {
        let (Some(xb), Some(yb)) = (xb.first_chunk::<N>(), yb.first_chunk::<Q8_K_BYTES>()) else {
            break;
        };
        let Some(yb) = q8k(yb) else {
            break;
        };
        sumf += f(xb, &yb);
    }
    sumf
}

/// `sum_j bsums[j] * mins[j / per]`: the min correction of Q2_K (`per` = 1) and Q4_K/Q5_K
/// (`per` = 2).
#[inline(always)]
pub(super) fn mins_dot(bsums: &[i16; 16], mins: &[u8], per: usize) -> i32 {
    let mut s = 0i32;
    for (j, &b) in bsums.iter().enumerate() {
        s += i32::from(b) * i32::from(mins[j / per]);
    }
    s
}

/// `ggml_vec_dot_q2_K_q8_K_generic`: `sumf += dall * isum - dmin * summs` with
/// `dall = yd * d`, `dmin = yd * dmin`, `summs = sum(bsums[j] * (sc[j] >> 4))`.
#[inline(always)]
pub(super) fn vec_dot_q2_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    sum_blocks::<Q2_K_BYTES>(
        x,
        y,
        #[inline(always)]
        |xb, yb| {
            let mut mins = [0u8; 16];
            let mut scales = [0i32; 16];
            for j in 0..16 {
                mins[j] = xb[j] >> 4;
                scales[j] = i32::from(xb[j] & 0x0F);
            }
            let summs = mins_dot(&yb.bsums, &mins, 1);
            let mut a = [0i8; QK_K];
            unpack_q2_k(xb, &mut a);
            let isum = group_dot::<16>(&a, yb.qs, &scales);
            let dall = yb.d * fp16_at(xb, 80);
            let dmin = yb.d * fp16_at(xb, 82);
            dall * isum as f32 - dmin * summs as f32
        },
    )
}

/// `ggml_vec_dot_q3_K_q8_K_generic`: `d * isum` with `d = d_x * yd`.
#[inline(always)]
pub(super) fn vec_dot_q3_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    sum_blocks::<Q3_K_BYTES>(
        x,
        y,
        #[inline(always)]
        |xb, yb| {
            let mut scales_raw = [0u8; 12];
            scales_raw.copy_from_slice(&xb[96..108]);
            let scales = scales_q3_k(&scales_raw).map(i32::from);
            let mut a = [0i8; QK_K];
            unpack_q3_k(xb, &mut a);
            let isum = group_dot::<16>(&a, yb.qs, &scales);
            fp16_at(xb, 108) * yb.d * isum as f32
        },
    )
}

/// The f32 combination of Q4_K/Q5_K: `d * isum - dmin * summs`, `d = d_x * yd`,
/// `dmin = dmin_x * yd`.
#[inline(always)]
pub(super) fn combine_k4<const N: usize>(xb: &[u8; N], yd: f32, isum: i32, summs: i32) -> f32 {
    let d = fp16_at(xb, 0) * yd;
    let dmin = fp16_at(xb, 2) * yd;
    d * isum as f32 - dmin * summs as f32
}

/// Scales (as i32) and mins of a Q4_K/Q5_K block (`scales` at bytes 4..16 of both).
#[inline(always)]
pub(super) fn k4_scales<const N: usize>(xb: &[u8; N]) -> ([i32; 8], [u8; 8]) {
    let mut raw = [0u8; 12];
    raw.copy_from_slice(&xb[4..16]);
    let (sc, m) = scales_mins_k4(&raw);
    (sc.map(i32::from), m)
}

/// `ggml_vec_dot_q4_K_q8_K_generic`.
#[inline(always)]
pub(super) fn vec_dot_q4_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    sum_blocks::<Q4_K_BYTES>(
        x,
        y,
        #[inline(always)]
        |xb, yb| {
            let (scales, mins) = k4_scales(xb);
            let summs = mins_dot(&yb.bsums, &mins, 2);
            let mut a = [0i8; QK_K];
            unpack_q4_k(xb, &mut a);
            let isum = group_dot::<32>(&a, yb.qs, &scales);
            combine_k4(xb, yb.d, isum, summs)
        },
    )
}

/// `ggml_vec_dot_q5_K_q8_K_generic`.
#[inline(always)]
pub(super) fn vec_dot_q5_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    sum_blocks::<Q5_K_BYTES>(
        x,
        y,
        #[inline(always)]
        |xb, yb| {
            let (scales, mins) = k4_scales(xb);
            let summs = mins_dot(&yb.bsums, &mins, 2);
            let mut a = [0i8; QK_K];
            unpack_q5_k(xb, &mut a);
            let isum = group_dot::<32>(&a, yb.qs, &scales);
            combine_k4(xb, yb.d, isum, summs)
        },
    )
}

/// Scales of a Q6_K block as i32.
#[inline(always)]
pub(super) fn q6_k_scales(xb: &[u8; Q6_K_BYTES]) -> [i32; 16] {
    let mut s = [0i32; 16];
    for (j, o) in s.iter_mut().enumerate() {
        *o = i32::from(xb[192 + j] as i8);
    }
    s
}

/// `ggml_vec_dot_q6_K_q8_K_generic`: `d * isum` with `d = d_x * yd`.
#[inline(always)]
pub(super) fn vec_dot_q6_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    sum_blocks::<Q6_K_BYTES>(
        x,
        y,
        #[inline(always)]
        |xb, yb| {
            let scales = q6_k_scales(xb);
            let mut a = [0i8; QK_K];
            unpack_q6_k(xb, &mut a);
            let isum = group_dot::<16>(&a, yb.qs, &scales);
            fp16_at(xb, 208) * yb.d * isum as f32
        },
    )
}
