//! NORM, RMS_NORM and L2_NORM, row by row, with ggml's precision choices (`ops.cpp`):
//!
//! * RMS_NORM: `sum(x*x)` accumulated in f64 (each square in f32), `mean = sum / n` rounded to
//!   f32, `scale = 1 / sqrt(mean + eps)`, `y = x * scale`;
//! * NORM: `sum(x)` in f64 rounded to f32, `mean = sum / n` in f32, the centred squares summed
//!   in f64 and divided by `n` (`ggml_vec_cvar_f32`), rounded to f32, then
//!   `y = (x - mean) / sqrt(variance + eps)`;
//! * L2_NORM: `sum(x*x)` in f64, `y = x / max(sqrt(sum), eps)` in f32;
//! * GROUP_NORM: NORM over all elements of a group of channels (`ne2`) of one batch entry
//!   (`i3`): the sum of each row in f64, the rows' sums added in f64, `mean` rounded to f32,
//!   the centred squares likewise, `y = (x - mean) · (1 / sqrt(variance + eps))`. A first pass
//!   computes every group's `(mean, scale)` (groups are its unit of work), a second normalizes
//!   the rows.
//!
//! The f64 sums run in eight interleaved partial sums ([`sum_f64`]), where ggml adds in order:
//! the same f32 results but for the rare case described there.

use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::view::Input;

use super::{map_rows, Node};

pub(super) fn rms_norm(node: &Node<'_>, dst: Dst<'_>, eps: f32) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        2,
        || (),
        |_, _, _, x, y| {
            let sum = sum_squares(x);
            let mean = (sum / x.len() as f64) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * scale);
            Ok(())
        },
    )
}

pub(super) fn norm(node: &Node<'_>, dst: Dst<'_>, eps: f32) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        3,
        || (),
        |_, _, _, x, y| {
            let sum = sum_f64(x, f64::from) as f32;
            let mean = sum / x.len() as f32;
            for (y, &x) in y.iter_mut().zip(x) {
                *y = x - mean;
            }
            let squares = sum_squares(y);
            let variance = (squares / x.len() as f64) as f32;
            let scale = 1.0 / (variance + eps).sqrt();
            y.iter_mut().for_each(|y| *y *= scale);
            Ok(())
        },
    )
}

pub(super) fn l2_norm(node: &Node<'_>, dst: Dst<'_>, eps: f32) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        2,
        || (),
        |_, _, _, x, y| {
            let sum = sum_squares(x) as f32;
            let scale = 1.0 / sum.sqrt().max(eps);
            y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * scale);
            Ok(())
        },
    )
}

/// Reads source row `(i1, i2, i3)` as f32 into the slice.
type RowLoader<'a> = dyn FnMut([usize; 3], &mut [f32]) -> Result<()> + 'a;

/// GROUP_NORM with `per_group` channels in each group (the last may have fewer).
pub(super) fn group_norm(
    node: &Node<'_>,
    mut dst: Dst<'_>,
    per_group: usize,
    eps: f32,
) -> Result<()> {
    let a = node.input(0)?;
    let layout = *dst.layout();
    let [ne0, ne1, ne2, ne3] = layout.ne;
    // the plan made per_group at least 1 (a non-empty tensor, a positive group count)
    let per_group = per_group.max(1);
    let groups = ne2.div_ceil(per_group);
    // (mean, scale) of group g of batch entry i3 at g + groups * i3
    let mut stats = vec![(0.0f32, 0.0f32); groups * ne3];
    let group_stats =
        |unit: usize, load: &mut RowLoader<'_>, row: &mut [f32]| -> Result<(f32, f32)> {
            let (g, i3) = (unit % groups, unit / groups);
            let channels = g * per_group..((g + 1) * per_group).min(ne2);
            let count = (ne0 * ne1 * channels.len()) as f64;
            let mut sum = 0.0f64;
            for i2 in channels.clone() {
                for i1 in 0..ne1 {
                    load([i1, i2, i3], row)?;
                    sum += row.iter().map(|&v| f64::from(v)).sum::<f64>();
                }
            }
            let mean = (sum / count) as f32;
            let mut squares = 0.0f64;
            for i2 in channels {
                for i1 in 0..ne1 {
                    load([i1, i2, i3], row)?;
                    squares += row
                        .iter()
                        .map(|&v| f64::from((v - mean) * (v - mean)))
                        .sum::<f64>();
                }
            }
            let variance = (squares / count) as f32;
            Ok((mean, 1.0 / (variance + eps).sqrt()))
        };
    match a {
        Input::View(view) => {
            let items: Vec<(usize, &mut (f32, f32))> = stats.iter_mut().enumerate().collect();
            node.pool.run_with(
                items,
                || vec![0.0f32; ne0],
                |row, (unit, out)| {
                    *out = group_stats(unit, &mut |idx, row| view.load_f32(idx, row), row)?;
                    Ok(())
                },
            )?;
        }
        Input::Dst(_) => {
            // in place: the source is read through one part covering every row, one group
            // after another, before any row is written
            let mut row = vec![0.0f32; ne0];
            let mut scratch = Vec::new();
            for part in dst.split_rows(layout.rows()) {
                for (unit, out) in stats.iter_mut().enumerate() {
                    let mut load = |idx: [usize; 3], row: &mut [f32]| {
                        a.load_f32(&part, idx, row, &mut scratch)
                    };
                    *out = group_stats(unit, &mut load, &mut row)?;
                }
            }
        }
    }
    map_rows(
        node,
        dst,
        a,
        2,
        || (),
        |_, _, [_, i2, i3], x, y| {
            let (mean, scale) = stats[i2 / per_group + groups * i3];
            for (y, &x) in y.iter_mut().zip(x) {
                *y = (x - mean) * scale;
            }
            Ok(())
        },
    )
}

/// `sum(x*x)` in f64, each square rounded to f32 first, as ggml computes it.
fn sum_squares(x: &[f32]) -> f64 {
    sum_f64(x, |v| f64::from(v * v))
}

/// The f64 sum of `term(v)` over `x` in eight running sums (element `i` into sum `i % 8`)
/// instead of ggml's one: the adds overlap (and vectorize) instead of waiting on each other,
/// about a quarter of the time on a 256-value row. The terms here are f32 values widened, 24
/// significant bits each, so for `n` terms the f64 sums are exact, in any order, while the
/// terms span less than 2^(29 - log2 n) in magnitude (2^21 for 256 terms); beyond that the
/// result may differ from the in-order sum in its last f64 bits, which the rounding to f32
/// almost always absorbs.
pub(super) fn sum_f64(x: &[f32], term: impl Fn(f32) -> f64) -> f64 {
    let mut sums = [0f64; 8];
    let (chunks, rest) = x.as_chunks::<8>();
    for chunk in chunks {
        for (sum, &v) in sums.iter_mut().zip(chunk) {
            *sum += term(v);
        }
    }
    for (sum, &v) in sums.iter_mut().zip(rest) {
        *sum += term(v);
    }
    let [a, b, c, d, e, f, g, h] = sums;
    ((a + e) + (b + f)) + ((c + g) + (d + h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_order(x: &[f32], term: impl Fn(f32) -> f64) -> f64 {
        x.iter().map(|&v| term(v)).sum()
    }

    #[test]
    fn interleaved_sums_give_the_in_order_results() {
        // activations of a few magnitudes, lengths around the 8-wide steps
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32 - 0.5) * 8.0
        };
        for len in [0, 1, 7, 8, 9, 63, 256, 1000, 4096] {
            let x: Vec<f32> = (0..len).map(|_| next()).collect();
            let squares = |v: f32| f64::from(v * v);
            assert_eq!(
                sum_squares(&x),
                in_order(&x, squares),
                "squares, {len} values"
            );
            assert_eq!(
                sum_f64(&x, f64::from) as f32,
                in_order(&x, f64::from) as f32
            );
            let mean = (sum_squares(&x) / len.max(1) as f64) as f32;
            assert_eq!(mean, (in_order(&x, squares) / len.max(1) as f64) as f32);
        }
        // terms far apart in magnitude: no longer exact, but the same f32
        let wide: Vec<f32> = (0..256)
            .map(|i| if i % 3 == 0 { 1e-9 } else { 3.7e4 })
            .collect();
        let sum = sum_squares(&wide);
        let want = in_order(&wide, |v| f64::from(v * v));
        assert_eq!(sum as f32, want as f32);
        assert!((sum - want).abs() <= want * 1e-15);
    }
}
