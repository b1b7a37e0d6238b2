//! Reference quantizers of the K-quants: ggml's `quantize_row_q2_K_ref` ...
//! `quantize_row_q6_K_ref` (`ggml/src/ggml-quants.c`, b11434), which ggml-cpu's `from_float`
//! calls for these types (no importance matrix).
//!
//! Bit-exact: the same f32 operations in the same order as the C (ggml-base is built without
//! fused multiply-add, so neither is anything here), `nearest_int`'s magic-number rounding, and
//! the C's integer truncations (`uint8_t ls = nearest_int(...)`, `int8_t l = ...`) spelled as
//! `as` casts. The search helpers are ggml's `make_qkx2_quants` (Q2_K, Q4_K, Q5_K),
//! `make_q3_quants` (Q3_K) and `make_qx_quants` with `rmse_type` 1 and no weights (Q6_K).
//!
//! Nothing here panics: every index is bounded by the block sizes, NaN and infinite inputs give
//! whatever bytes the same float operations give (ggml's `nearest_int` assertion is compiled
//! out in release builds; here it is a bit operation on any input).

use super::k_quants::{scale_min_k4, Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
use super::{fp16, fp16_bytes, nearest_int, QK_K};

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this quantize to zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `make_qkx2_quants`: a scale and a min for `x` (quants `0..=nmax` into `l`) that
/// minimize the weighted error, searching `nstep + 1` candidate scales around `nmax / range`.
/// Returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len().min(weights.len()).min(l_out.len());
    if n == 0 {
        return (0.0, 0.0);
    }
    let (x, weights, l_out) = (&x[..n], &weights[..n], &mut l_out[..n]);
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let error = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * f32::from(l_out[i]) + min - x[i];
        best_error += weights[i] * error(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut aux = [0u8; 32];
    let aux = &mut aux[..n.min(32)];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for (i, a) in aux.iter_mut().enumerate() {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            *a = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for (i, &a) in aux.iter().enumerate() {
                let diff = this_scale * f32::from(a) + this_min - x[i];
                cur_error += weights[i] * error(diff);
            }
            if cur_error < best_error {
                l_out[..aux.len()].copy_from_slice(aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_q3_quants` with `do_rmse`: signed quants `-nmax..nmax` refined by up to five
/// passes of coordinate descent on the `x^2`-weighted error; `l_out` gets them plus `nmax`
/// (all zeros for an all-zero group, as in ggml).
fn make_q3_quants(x: &[f32], nmax: i32, l_out: &mut [i8]) -> f32 {
    let n = x.len().min(l_out.len());
    let (x, l_out) = (&x[..n], &mut l_out[..n]);
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    // the signed quants (ggml keeps them in L, an int8_t array, until the end)
    let mut l_cur = [0i32; 16];
    let l_cur = &mut l_cur[..n.min(16)];
    for (i, lc) in l_cur.iter_mut().enumerate() {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        *lc = l;
        let w = x[i] * x[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (i, lc) in l_cur.iter_mut().enumerate() {
            let w = x[i] * x[i];
            let old = *lc as f32;
            let mut slx = sumlx - w * x[i] * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *lc {
                    let nf = new_l as f32;
                    slx += w * x[i] * nf;
                    sl2 += w * nf * nf;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *lc = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for (o, &lc) in l_out.iter_mut().zip(l_cur.iter()) {
        *o = (lc + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no quant weights: signed quants
/// `-nmax..nmax` (stored plus `nmax` in `l_out`) and the scale minimizing the `x^2`-weighted
/// error among 19 candidate scales around `max / -nmax`.
fn make_qx_quants_rmse1(x: &[f32], nmax: i32, l_out: &mut [i8]) -> f32 {
    let n = x.len().min(l_out.len());
    let (x, l_out) = (&x[..n], &mut l_out[..n]);
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = -nmax_f / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (i, o) in l_out.iter_mut().enumerate() {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        *o = (l + nmax) as i8;
        let w = x[i] * x[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax_f + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            let lf = l as f32;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l_out.iter_mut().zip(x) {
                let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
                *o = (l + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Packs 2-bit quants (values 0..3 in the low bits of `l`) as Q2_K/Q3_K do: byte `32n + k` of
/// `qs` holds elements `128n + k`, `+32`, `+64`, `+96` in bits 0-1, 2-3, 4-5, 6-7.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for (n, out) in qs.chunks_exact_mut(32).take(QK_K / 128).enumerate() {
        let j = 128 * n;
        for (k, q) in out.iter_mut().enumerate() {
            *q = l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`.
pub(super) fn quantize_q2_k_ref(src: &[f32], dst: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q2_K_BYTES)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut mins = [0.0f32; QK_K / 16];
        let mut weights = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (scale, min) = make_qkx2_quants(
                xs,
                &weights,
                3,
                &mut l[16 * j..16 * j + 16],
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = scale;
            mins[j] = min;
            if scale > max_scale {
                max_scale = scale;
            }
            if min > max_min {
                max_min = min;
            }
        }

        let mut sc = [0u8; QK_K / 16];
        let d = if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (s, &scale) in sc.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * scale) as u8;
            }
            fp16_bytes(max_scale / Q4SCALE)
        } else {
            fp16_bytes(0.0)
        };
        let dmin = if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (s, &min) in sc.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * min) as u8) << 4;
            }
            fp16_bytes(max_min / Q4SCALE)
        } else {
            fp16_bytes(0.0)
        };
        let (d_f, dmin_f) = (fp16(d[0], d[1]), fp16(dmin[0], dmin[1]));
        for j in 0..QK_K / 16 {
            let dl = d_f * f32::from(sc[j] & 0xF);
            if dl == 0.0 {
                continue;
            }
            let dm = dmin_f * f32::from(sc[j] >> 4);
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / dl).clamp(0, 3);
                l[16 * j + ii] = q as u8;
            }
        }

        y[..16].copy_from_slice(&sc);
        pack_2bit(&l, &mut y[16..80]);
        y[80..82].copy_from_slice(&d);
        y[82..84].copy_from_slice(&dmin);
    }
}

/// `quantize_row_q3_K_ref`.
pub(super) fn quantize_q3_k_ref(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q3_K_BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(&x[16 * j..16 * j + 16], 4, &mut l[16 * j..16 * j + 16]);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }

        let mut sc = [0u8; 12];
        let d = if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &scale) in scales.iter().enumerate() {
                // `int8_t l = nearest_int(...)`: truncated to 8 bits first, then clamped
                let q = i32::from(nearest_int(iscale * scale) as i8).clamp(-32, 31) + 32;
                if j < 8 {
                    sc[j] = (q & 0xF) as u8;
                } else {
                    sc[j - 8] |= ((q & 0xF) << 4) as u8;
                }
                sc[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
            }
            fp16_bytes(1.0 / iscale)
        } else {
            fp16_bytes(0.0)
        };
        let d_f = fp16(d[0], d[1]);
        for j in 0..QK_K / 16 {
            let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
            let s = i32::from(low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
            let dl = d_f * s as f32;
            if dl == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / dl).clamp(-4, 3);
                l[16 * j + ii] = (q + 4) as i8;
            }
        }

        // the high bit of element j goes to bit j / 32 of hmask[j % 32]
        let mut hmask = [0u8; QK_K / 8];
        let mut low = [0u8; QK_K];
        for (j, (&q, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
            let mut q = q;
            if q > 3 {
                hmask[j % 32] |= 1 << (j / 32);
                q -= 4;
            }
            *lo = q as u8;
        }
        y[..32].copy_from_slice(&hmask);
        pack_2bit(&low, &mut y[32..96]);
        y[96..108].copy_from_slice(&sc);
        y[108..110].copy_from_slice(&d);
    }
}

/// The shared part of `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref`: 8 groups of 32
/// through `make_qkx2_quants` (weights `sqrt(mean(x^2)) + |x|`), 6-bit scales and mins packed
/// as `get_scale_min_k4` reads them, then the quants redone with the rounded scales. Returns
/// the quants (`0..=nmax`), `d`, `dmin` and the 12 scale bytes.
fn quantize_k4_block(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> ([u8; QK_K], [u8; 2], [u8; 2], [u8; 12]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 32];
    let mut mins = [0.0f32; QK_K / 32];
    let mut weights = [0.0f32; 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(
            xs,
            &weights,
            nmax,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut sc = [0u8; 12];
    for j in 0..QK_K / 32 {
        // `uint8_t ls = nearest_int(...)`: truncated to 8 bits, then capped at 63
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = fp16_bytes(max_scale / 63.0);
    let dmin = fp16_bytes(max_min / 63.0);
    let (d_f, dmin_f) = (fp16(d[0], d[1]), fp16(dmin[0], dmin[1]));
    for j in 0..QK_K / 32 {
        let (s, m) = scale_min_k4(j, &sc);
        let dl = d_f * f32::from(s);
        if dl == 0.0 {
            continue;
        }
        let dm = dmin_f * f32::from(m);
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dl).clamp(0, nmax);
            l[32 * j + ii] = q as u8;
        }
    }
    (l, d, dmin, sc)
}

/// `quantize_row_q4_K_ref`.
pub(super) fn quantize_q4_k_ref(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q4_K_BYTES)) {
        let (l, d, dmin, sc) = quantize_k4_block(x, 15, -1.0, 20);
        y[..2].copy_from_slice(&d);
        y[2..4].copy_from_slice(&dmin);
        y[4..16].copy_from_slice(&sc);
        for (n, qs) in y[16..].chunks_exact_mut(32).enumerate() {
            let j = 64 * n;
            for (k, q) in qs.iter_mut().enumerate() {
                *q = l[j + k] | (l[j + k + 32] << 4);
            }
        }
    }
}

/// `quantize_row_q5_K_ref`.
pub(super) fn quantize_q5_k_ref(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q5_K_BYTES)) {
        let (l, d, dmin, sc) = quantize_k4_block(x, 31, -0.5, 15);
        y[..2].copy_from_slice(&d);
        y[2..4].copy_from_slice(&dmin);
        y[4..16].copy_from_slice(&sc);
        let mut qh = [0u8; 32];
        let (mut m1, mut m2) = (1u8, 2u8);
        for (n, ql) in y[48..].chunks_exact_mut(32).enumerate() {
            let base = 64 * n;
            for (j, q) in ql.iter_mut().enumerate() {
                let mut l1 = l[base + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = l[base + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                *q = l1 | (l2 << 4);
            }
            m1 = m1.wrapping_shl(2);
            m2 = m2.wrapping_shl(2);
        }
        y[16..48].copy_from_slice(&qh);
    }
}

/// `quantize_row_q6_K_ref`.
pub(super) fn quantize_q6_k_ref(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q6_K_BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants_rmse1(&x[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..]);
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            y.fill(0);
            continue;
        }

        let iscale = -128.0 / max_scale;
        let d = fp16_bytes(1.0 / iscale);
        let mut sc = [0i8; QK_K / 16];
        for (s, &scale) in sc.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * scale).min(127) as i8;
        }
        let d_f = fp16(d[0], d[1]);
        for j in 0..QK_K / 16 {
            let dl = d_f * f32::from(sc[j]);
            if dl == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / dl).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }

        let (ql, rest) = y.split_at_mut(128);
        let (qh, rest) = rest.split_at_mut(64);
        for n in 0..QK_K / 128 {
            let j = 128 * n;
            let ql = &mut ql[64 * n..64 * n + 64];
            let qh = &mut qh[32 * n..32 * n + 32];
            for k in 0..32 {
                let q = |o: usize| l[j + k + o] as u8;
                ql[k] = (q(0) & 0xF) | ((q(64) & 0xF) << 4);
                ql[k + 32] = (q(32) & 0xF) | ((q(96) & 0xF) << 4);
                qh[k] =
                    (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
            }
        }
        for (o, &s) in rest[..16].iter_mut().zip(&sc) {
            *o = s as u8;
        }
        rest[16..18].copy_from_slice(&d);
    }
}
