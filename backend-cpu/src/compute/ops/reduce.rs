//! SUM_ROWS, MEAN, SUM, ARGMAX, ARGSORT, TOP_K and COUNT_EQUAL.
//!
//! Sums accumulate in f64 and round to f32 once, as ggml's `ggml_vec_sum_f32` (a `ggml_float`
//! accumulator) does; MEAN then divides the f32 sum by `ne0` in f32. ARGMAX keeps ggml's tie
//! rule: the last index holding the maximum (`ggml_vec_argmax_f32`). ARGSORT sorts each row's
//! indices by value and TOP_K takes the indices of the `k` largest, tied values falling as
//! ggml-cpu's `std::sort` and `std::partial_sort` leave them (`sort`); TOP_K then swaps the
//! first two, as ggml does to stress that their order is unspecified. COUNT_EQUAL counts in
//! integers (partial counts per work item, added at the end: exact in any order).

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::view::encode;

use super::{c_max, dst_scalar, sort, Node};

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

/// `a` before `b` in ggml's order: `x[a] < x[b]` (`>` if `descending`). NaN, which ggml's
/// comparison leaves unordered (its sort's result is then up to the sort), goes after every
/// number (first when `descending`): the order must be a strict weak one.
fn precedes(x: &[f32], a: usize, b: usize, descending: bool) -> bool {
    let (a, b) = if descending {
        (x[b], x[a])
    } else {
        (x[a], x[b])
    };
    match (a.is_nan(), b.is_nan()) {
        (false, false) => a < b,
        (true, _) => false,
        (false, true) => true,
    }
}

/// The indices of row `x` ordered by value, largest first if `descending`, equal values as
/// ggml-cpu's `std::sort` leaves them.
fn sorted_indices(x: &[f32], descending: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    sort::sort(&mut order, &|a, b| precedes(x, a, b, descending));
    order
}

/// The indices of row `x`'s `k` largest values, largest first, equal values as ggml-cpu's
/// `std::partial_sort` leaves them.
fn top_indices(x: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    sort::partial_sort(&mut order, k, &|a, b| precedes(x, a, b, true));
    order.truncate(k);
    order
}

/// Row by row: the first `ne0` of the indices `pick` returns for the row (given `ne0`), as I32.
fn index_rows(
    node: &Node<'_>,
    mut dst: Dst<'_>,
    pick: impl Fn(&[f32], usize) -> Vec<usize> + Sync,
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
            let mut order = pick(&x, k);
            order.truncate(k);
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
    index_rows(node, dst, |x, _| sorted_indices(x, descending))
}

pub(super) fn top_k(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    index_rows(node, dst, |x, k| {
        let mut top = top_indices(x, k);
        if top.len() > 1 {
            top.swap(0, 1);
        }
        top
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
    use std::process::Command;

    use super::{sorted_indices, top_indices};
    use crate::compute::tests::Rng;

    /// ggml-cpu's ARGSORT and TOP_K loops (`cmp_argsort`, `cmp_top_k`) over rows read from
    /// stdin (`a|d|t k n values...`), one line of indices out per row.
    const GGML_SORTS: &str = r#"
#include <algorithm>
#include <cstdio>
#include <vector>
int main() {
    char mode; int k, n;
    while (std::scanf(" %c %d %d", &mode, &k, &n) == 3) {
        std::vector<float> x(n);
        std::vector<int> idx(n);
        for (int i = 0; i < n; i++) { std::scanf("%f", &x[i]); idx[i] = i; }
        const float * d = x.data();
        if (mode == 'a') std::sort(idx.begin(), idx.end(), [d](int a, int b) { return d[a] < d[b]; });
        if (mode == 'd') std::sort(idx.begin(), idx.end(), [d](int a, int b) { return d[a] > d[b]; });
        if (mode == 't') std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [d](int a, int b) { return d[a] > d[b]; });
        for (int i = 0; i < (mode == 't' ? k : n); i++) std::printf("%d ", idx[i]);
        std::printf("\n");
    }
}
"#;

    /// Ties fall as in GCC's library, which every llama.cpp Linux build (the peers included)
    /// sorts with: test-backend-ops's TOPK_MOE compares the picked set, and a tie at the `k`
    /// boundary once picked a different expert than ggml-cpu. Rows drawn from a few values,
    /// every length around the insertion-sort threshold and past the introsort's recursion.
    #[test]
    fn ties_fall_as_in_gccs_sort_and_partial_sort() {
        let dir = std::env::temp_dir().join(format!("ggml-sorts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary folder");
        let (source, program) = (dir.join("sorts.cpp"), dir.join("sorts"));
        std::fs::write(&source, GGML_SORTS).expect("write the C++ source");
        let compiled = Command::new("g++")
            .args(["-O2", "-std=c++17", "-o"])
            .arg(&program)
            .arg(&source)
            .status()
            .expect("g++ (the llama.cpp peers need it too) runs");
        assert!(compiled.success(), "g++ compiles the sorts");

        let mut rng = Rng::new(31);
        let mut rows = Vec::new();
        for n in (0..70).chain([127, 128, 288, 300, 1000, 4096]) {
            for distinct in [1, 2, 3, 7, 50] {
                let row: Vec<f32> = (0..n)
                    .map(|_| rng.below(distinct) as f32 * 0.25 - 0.5)
                    .collect();
                let k = if n == 0 { 0 } else { rng.below(n) + 1 };
                rows.push((k, row));
            }
        }
        let mut input = String::new();
        for (k, row) in &rows {
            for mode in ["a", "d", "t"] {
                input.push_str(&format!("{mode} {k} {}", row.len()));
                for v in row {
                    input.push_str(&format!(" {v}"));
                }
                input.push('\n');
            }
        }
        let rows_file = dir.join("rows");
        std::fs::write(&rows_file, input).expect("write the rows");
        let output = Command::new(&program)
            .stdin(std::fs::File::open(&rows_file).expect("read the rows"))
            .output()
            .expect("run the sorts");
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(output.stdout).expect("ASCII");
        let mut lines = text.lines();
        for (k, row) in &rows {
            let ours = [
                sorted_indices(row, false),
                sorted_indices(row, true),
                top_indices(row, *k),
            ];
            for (mode, ours) in ["ascending", "descending", "top k"].iter().zip(ours) {
                let theirs: Vec<usize> = lines
                    .next()
                    .expect("one line per row and mode")
                    .split_whitespace()
                    .map(|i| i.parse().expect("an index"))
                    .collect();
                assert_eq!(ours, theirs, "{mode}, k = {k}, row {row:?}");
            }
        }
    }

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
