//! SUM_ROWS, MEAN, SUM, ARGMAX, ARGSORT, TOP_K and COUNT_EQUAL.
//!
//! Sums accumulate in f64 and round to f32 once, as ggml's `ggml_vec_sum_f32` (a `ggml_float`
//! accumulator) does; MEAN then divides the f32 sum by `ne0` in f32. ARGMAX keeps ggml's tie
//! rule: the last index holding the maximum (`ggml_vec_argmax_f32`). ARGSORT sorts each row's
//! indices by value (ties keep index order; ggml's `std::sort` leaves them unspecified), TOP_K
//! takes the indices of the `k` largest and, as ggml does to stress that their order is
//! unspecified, swaps the first two. COUNT_EQUAL counts in integers (partial counts per work
//! item, added at the end: exact in any order).

use std::cmp::Ordering;

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::view::encode;

use super::{c_max, dst_scalar, Node};

fn row_sum(x: &[f32]) -> f64 {
    x.iter().map(|&v| f64::from(v)).sum()
}

pub(super) fn sum_rows(node: &Node<'_>, mut dst: Dst<'_>, mean: bool) -> Result<()> {
    let a = node.view(0)?;
    let layout = *dst.layout();
    let scalar = dst_scalar(&layout)?;
    let ne00 = a.layout.ne[0];
    let chunk = node.pool.chunk(layout.rows(), ne00);
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut x = vec![0.0f32; ne00];
        let mut bytes = vec![0u8; scalar.size()];
        for r in part.rows() {
            let idx = layout.row_index(r);
            a.load_f32(idx, &mut x)?;
            let mut value = row_sum(&x) as f32;
            if mean {
                value /= ne00 as f32;
            }
            encode(scalar, &[value], &mut bytes);
            part.write(r, 0, &bytes)?;
        }
        Ok(())
    })
}

pub(super) fn sum(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let a = node.view(0)?;
    let layout = *dst.layout();
    let scalar = dst_scalar(&layout)?;
    let al = a.layout;
    let mut x = vec![0.0f32; al.ne[0]];
    let mut total = 0.0f64;
    for r in 0..al.rows() {
        a.load_f32(al.row_index(r), &mut x)?;
        total += row_sum(&x);
    }
    let mut bytes = vec![0u8; scalar.size()];
    encode(scalar, &[total as f32], &mut bytes);
    for mut part in dst.split_rows(1) {
        part.write(0, 0, &bytes)?;
    }
    Ok(())
}

pub(super) fn argmax(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let a = node.view(0)?;
    let al = a.layout;
    let mut x = vec![0.0f32; al.ne[0]];
    let mut out = Vec::with_capacity(al.ne[1] * 4);
    for i1 in 0..al.ne[1] {
        a.load_f32([i1, 0, 0], &mut x)?;
        let mut max = f32::NEG_INFINITY;
        let mut index = 0i32;
        for (i, &v) in x.iter().enumerate() {
            max = c_max(max, v);
            if max == v {
                index = i32::try_from(i).unwrap_or(i32::MAX);
            }
        }
        out.extend_from_slice(&index.to_le_bytes());
    }
    // the destination is one row of ne01 I32 values
    for mut part in dst.split_rows(1) {
        part.write(0, 0, &out)?;
    }
    Ok(())
}

/// The indices of row `x` ordered by value, largest first if `descending`; equal values keep
/// their order. NaN, which ggml's `<` leaves unordered (its sort's result is then up to the
/// sort), goes after every number (first when `descending`): the comparison must be a total
/// order, or the sort panics.
fn sorted_indices(x: &[f32], descending: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = if descending {
            (x[b], x[a])
        } else {
            (x[a], x[b])
        };
        match (a.is_nan(), b.is_nan()) {
            (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
        }
    });
    order
}

/// Row by row: the first `ne0` of the row's sorted indices (after `fix`), as I32.
fn index_rows(
    node: &Node<'_>,
    mut dst: Dst<'_>,
    descending: bool,
    fix: fn(&mut [usize]),
) -> Result<()> {
    let a = node.view(0)?;
    let layout = *dst.layout();
    let ne00 = a.layout.ne[0];
    let k = layout.ne[0];
    let chunk = node.pool.chunk(layout.rows(), ne00 * 8);
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut x = vec![0.0f32; ne00];
        let mut bytes = Vec::with_capacity(k * 4);
        for r in part.rows() {
            a.load_f32(layout.row_index(r), &mut x)?;
            let mut order = sorted_indices(&x, descending);
            order.truncate(k);
            fix(&mut order);
            bytes.clear();
            for i in order {
                bytes.extend_from_slice(&i32::try_from(i).unwrap_or(i32::MAX).to_le_bytes());
            }
            part.write(r, 0, &bytes)?;
        }
        Ok(())
    })
}

pub(super) fn argsort(node: &Node<'_>, dst: Dst<'_>, descending: bool) -> Result<()> {
    index_rows(node, dst, descending, |_| {})
}

pub(super) fn top_k(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    index_rows(node, dst, true, |top| {
        if top.len() > 1 {
            top.swap(0, 1);
        }
    })
}

pub(super) fn count_equal(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (a, b) = (node.view(0)?, node.view(1)?);
    let l = a.layout;
    let mut total = 0u64;
    if !l.is_empty() {
        let rows = l.rows();
        let chunk = node.pool.chunk(rows, l.ne[0]);
        let mut counts = vec![0u64; rows.div_ceil(chunk)];
        let items: Vec<(usize, &mut u64)> = counts
            .iter_mut()
            .enumerate()
            .map(|(n, count)| (n * chunk, count))
            .collect();
        node.pool.run(items, &|(first, count): (usize, &mut u64)| {
            for r in first..(first + chunk).min(rows) {
                let [i1, i2, i3] = l.row_index(r);
                let equal = (0..l.ne[0])
                    .filter(|&i0| a.index_at([i0, i1, i2, i3]) == b.index_at([i0, i1, i2, i3]))
                    .count();
                *count += equal as u64;
            }
            Ok(())
        })?;
        total = counts.iter().sum();
    }
    for mut part in dst.split_rows(1) {
        part.write(0, 0, &(total as i64).to_le_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::sorted_indices;

    const NAN: f32 = f32::NAN;

    #[test]
    fn rows_with_nan_sort_in_a_total_order() {
        // Found by the graph_compute fuzz target: with NaN beside numbers the comparison was
        // no total order, and the standard library's sort panicked on it.
        let row = [2.0, NAN, -1.0, NAN, 0.0, -0.0, 7.5, NAN, 1.0, -3.0, 4.0];
        let ascending = [9, 2, 4, 5, 8, 0, 10, 6, 1, 3, 7];
        assert_eq!(sorted_indices(&row, false), ascending);
        let descending = [1, 3, 7, 6, 10, 0, 8, 4, 5, 2, 9];
        assert_eq!(sorted_indices(&row, true), descending);
        let nan_every_third = |i: u32| {
            if i.is_multiple_of(3) {
                NAN
            } else {
                (i * 37 % 11) as f32
            }
        };
        let many: Vec<f32> = (0..100).map(nan_every_third).collect();
        let order = sorted_indices(&many, false);
        let (numbers, nans) = order.split_at(66);
        assert!(numbers.windows(2).all(|w| many[w[0]] <= many[w[1]]));
        assert!(nans.iter().all(|&i| many[i].is_nan()));
    }
}
