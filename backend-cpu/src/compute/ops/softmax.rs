//! SOFT_MAX (scale, optional mask with ALiBi slopes, optional attention sinks) and the
//! DIAG_MASK ops, as `ggml_compute_forward_soft_max_f32` / `_diag_mask_f32` compute them.
//!
//! SOFT_MAX row `(i1, i2, i3)`: `w = x * scale + slope(i2) * mask[i1, i2 % m2, i3 % m3]`, then
//! `max` (including the head's sink, if any), `e = exp(w - max)` summed in f64 (plus
//! `exp(sink - max)`), and `y = e * (1 / sum)`.

use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::quant;

use super::{alibi_slope, c_max, map_rows, Node};

pub(super) fn soft_max(node: &Node<'_>, dst: Dst<'_>, scale: f32, max_bias: f32) -> Result<()> {
    let a = node.input(0)?;
    // the mask may be the destination itself: ggml's allocator reuses a source of the same
    // layout for SOFT_MAX's result, and that can be the mask
    let mask = node.inputs.get(1).copied().flatten();
    let sinks = node.optional_view(2)?;
    let n_head = a.layout().ne[2];
    let ne0 = a.layout().ne[0];
    map_rows(
        node,
        dst,
        a,
        8,
        || (vec![0.0f32; ne0], Vec::new()),
        |(mask_row, scratch), part, [i1, i2, i3], x, y| {
            let slope = alibi_slope(max_bias, n_head, i2);
            match &mask {
                Some(mask) => {
                    let ml = mask.layout();
                    mask.load_f32(part, [i1, i2 % ml.ne[2], i3 % ml.ne[3]], mask_row, scratch)?;
                    // ggml scales, then adds `slope * m`: both products rounded, then the sum
                    // (Rust never fuses them), in one pass
                    for ((w, &x), &m) in y.iter_mut().zip(x).zip(mask_row.iter()) {
                        *w = x * scale + slope * m;
                    }
                }
                None => y.iter_mut().zip(x).for_each(|(w, &x)| *w = x * scale),
            }
            let mut max = quant::row_max(y);
            let sink = sinks.as_ref().map(|s| s.value([i2, 0, 0, 0]));
            if let Some(sink) = sink {
                max = c_max(max, sink);
            }
            let mut sum = exp_and_sum(y, max);
            if let Some(sink) = sink {
                sum += f64::from((sink - max).exp());
            }
            let inv = (1.0 / sum) as f32;
            y.iter_mut().for_each(|w| *w *= inv);
            Ok(())
        },
    )
}

/// `w = exp(w - max)` for every entry, returning the sum of the results in f64, added in
/// order.
///
/// Masked entries (-inf) give +0 for any `max` but -inf or NaN (where ggml's NaN must come
/// out), and adding +0 leaves the sum (never -0) as it is; most entries are masked (the KV
/// cache's unused cells, the causal mask), so they are skipped, and the runs between them go
/// through the vectorized `exp` (the same bits as `f32::exp`).
fn exp_and_sum(w: &mut [f32], max: f32) -> f64 {
    let mut sum = 0.0f64;
    if max == f32::NEG_INFINITY || max.is_nan() {
        for v in w.iter_mut() {
            *v = (*v - max).exp();
            sum += f64::from(*v);
        }
        return sum;
    }
    let mut rest = w;
    while !rest.is_empty() {
        let masked = quant::first_where_masked(rest, false);
        rest[..masked].fill(0.0);
        rest = &mut rest[masked..];
        let run = quant::first_where_masked(rest, true);
        let (values, after) = rest.split_at_mut(run);
        values.iter_mut().for_each(|v| *v -= max);
        quant::exp_in_place(values);
        sum = values.iter().fold(sum, |s, &v| s + f64::from(v));
        rest = after;
    }
    sum
}

pub(super) fn diag_mask(node: &Node<'_>, dst: Dst<'_>, n_past: usize, value: f32) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        1,
        || (),
        |_, _, [i1, _, _], x, y| {
            y.copy_from_slice(x);
            // ggml: for i in n_past..ne0, masked where i > n_past + i1
            let first = n_past.saturating_add(i1).saturating_add(1).max(n_past);
            if first < y.len() {
                y[first..].iter_mut().for_each(|v| *v = value);
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs between masked entries through the vectorized `exp` give the bits of the
    /// plain loop: each entry `exp(w - max)` (+0 where masked under a finite maximum), the
    /// sum in f64 in order.
    #[test]
    fn exp_and_sum_matches_the_plain_loop() {
        let inf = f32::INFINITY;
        let causal: Vec<f32> = (0..70)
            .map(|i| {
                if i < 37 {
                    (i as f32 * 0.37).sin() * 4.0
                } else {
                    -inf
                }
            })
            .collect();
        // runs that start and end inside and across the 16-entry scan steps
        let long: Vec<f32> = (0..300)
            .map(|i| {
                if (i % 53) < 20 || (i > 140 && i < 180) {
                    (i as f32 * 0.11).cos() * 3.0
                } else {
                    -inf
                }
            })
            .collect();
        let rows: [&[f32]; 7] = [
            &causal,
            &long,
            &[
                -inf, 1.0, 2.0, -inf, -inf, 3.0, 0.5, -inf, 7.0, 8.0, 9.0, -inf,
            ],
            &[-inf; 9],
            &[1.0, f32::NAN, 3.0, -inf, 2.0],
            &[inf, 1.0, -inf],
            &[],
        ];
        for row in rows {
            let max = quant::row_max(row);
            let mut want = row.to_vec();
            let mut want_sum = 0.0f64;
            for w in want.iter_mut() {
                if *w == -inf && max > -inf {
                    *w = 0.0;
                    continue;
                }
                *w = (*w - max).exp();
                want_sum += f64::from(*w);
            }
            let mut got = row.to_vec();
            let sum = exp_and_sum(&mut got, max);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{row:?}");
            assert_eq!(sum.to_bits(), want_sum.to_bits(), "{row:?}");
        }
    }

    /// The 16-entry scan finds what `position` finds, for every start inside a step.
    #[test]
    fn masked_scan_matches_position() {
        let inf = f32::INFINITY;
        let row: Vec<f32> = (0..90)
            .map(|i| {
                if (i / 7) % 3 == 0 || i == 50 {
                    1.0
                } else {
                    -inf
                }
            })
            .collect();
        for start in 0..row.len() {
            let w = &row[start..];
            for masked in [false, true] {
                let want = w
                    .iter()
                    .position(|&v| (v == -inf) == masked)
                    .unwrap_or(w.len());
                assert_eq!(
                    quant::first_where_masked(w, masked),
                    want,
                    "{start} {masked}"
                );
            }
        }
    }

    /// The lane maximum is the in-order scan's value (zeros compare equal whatever their
    /// sign), and its bits where a NaN forces the scan.
    #[test]
    fn row_max_matches_the_ordered_scan() {
        let inf = f32::INFINITY;
        let mut late_nan: Vec<f32> = (0..100).map(|i| (i as f32 * 0.7).sin()).collect();
        late_nan[37] = f32::NAN;
        let mut long_nan_tail = late_nan.clone();
        long_nan_tail[37] = 0.5;
        long_nan_tail[98] = f32::NAN;
        let ramp: Vec<f32> = (0..77).map(|i| (i as f32 - 40.0).abs() * -0.5).collect();
        let rows: [&[f32]; 10] = [
            &late_nan,
            &long_nan_tail,
            &ramp,
            &[],
            &[-inf; 13],
            &[
                1.0, -2.0, 3.5, 0.25, -inf, 7.0, 2.0, -1.0, 6.5, 0.0, -0.0, 3.0,
            ],
            &[-0.0, 0.0, -0.0, -inf, -0.0, 0.0, -0.0, -0.0, 0.0, -5.0],
            &[f32::NAN, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, -1.0],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, f32::NAN],
            &[
                -3.0, inf, 2.0, 1.0, 0.5, -inf, 4.0, 3.0, 2.5, 1.5, 9.0, -8.0, 1.0, 2.0, 3.0, 4.0,
            ],
        ];
        for w in rows {
            let scan = w.iter().fold(f32::NEG_INFINITY, |m, &v| c_max(m, v));
            let got = quant::row_max(w);
            if w.iter().any(|v| v.is_nan()) {
                assert_eq!(got.to_bits(), scan.to_bits(), "{w:?}");
            } else {
                assert_eq!(got, scan, "{w:?}");
            }
        }
    }
}
