//! CUMSUM, TRI, FILL and SOLVE_TRI: the small ops of chunked linear attention graphs
//! (Qwen3-Next style), and DIAG, with ggml's arithmetic (`ops.cpp`):
//!
//! * CUMSUM: `y[0] = x[0]`, `y[i] = y[i - 1] + x[i]`, one f32 add after another;
//! * TRI: element (column `i0`, row `i1`) of each matrix kept or set to +0 (NaNs included);
//! * FILL: the value, rounded once to the destination type;
//! * SOLVE_TRI: forward substitution, `x[i] = (b[i] - Σ_{t<i} a[i][t] · x[t]) / a[i][i]`, the
//!   sum in f32 over ascending `t` for each column of `B`; a zero diagonal gives what the
//!   division gives (ggml only asserts it in debug builds);
//! * DIAG: row `i1` of matrix `(i2, i3)` is zero but for element `i1`, the source's
//!   `[i1, 0, i2, i3]`.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::plan::TriKeep;
use crate::compute::view::{encode, Scalar};

use super::{map_rows, Node};

pub(super) fn cumsum(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        1,
        || (),
        |_, _, _, x, y| {
            let mut running = 0.0f32;
            for (i, (y, &x)) in y.iter_mut().zip(x).enumerate() {
                // the first element is copied, not added to zero: -0.0 stays -0.0
                running = if i == 0 { x } else { running + x };
                *y = running;
            }
            Ok(())
        },
    )
}

pub(super) fn tri(node: &Node<'_>, dst: Dst<'_>, keep: TriKeep) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        1,
        || (),
        |_, _, [i1, _, _], x, y| {
            for (i0, (y, &x)) in y.iter_mut().zip(x).enumerate() {
                *y = if keep.keeps(i0, i1) { x } else { 0.0 };
            }
            Ok(())
        },
    )
}

pub(super) fn fill(node: &Node<'_>, mut dst: Dst<'_>, value: f32) -> Result<()> {
    let layout = *dst.layout();
    let scalar = Scalar::float(layout.type_id)
        .ok_or_else(|| crate::compute::view::internal("FILL of a non-float destination"))?;
    let ne0 = layout.ne[0];
    // one row of the value in the destination type, written to every row
    let mut row = vec![0u8; ne0 * scalar.size()];
    encode(scalar, &vec![value; ne0], &mut row);
    let chunk = node.pool.chunk(layout.rows(), ne0);
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        for r in part.rows() {
            part.write(r, 0, &row)?;
        }
        Ok(())
    })
}

/// SOLVE_TRI: each batch `(i2, i3)` of `A` (`n x n`, lower triangular) and `B` (`n` rows of
/// `k` columns) gives the `n` rows of `X`; batches are the unit of work.
pub(super) fn solve_tri(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (a, b) = (node.view(0)?, node.view(1)?);
    let layout = *dst.layout();
    let (k, n) = (layout.ne[0], layout.ne[1]);
    let batches = layout.ne[2] * layout.ne[3];
    if n == 0 || k == 0 {
        return Ok(());
    }
    // parts of whole batches: `n` rows each (n > 0, the destination is not empty)
    let per_batch = n.saturating_mul(n).saturating_mul(k).max(1);
    let chunk = node.pool.chunk(batches, per_batch) * n;
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || (vec![0.0f32; n * n], vec![0.0f32; n * k], Vec::new()),
        |(lhs, x, bytes), mut part: DstPart<'_>| {
            for first in part.rows().step_by(n) {
                let [_, i2, i3] = layout.row_index(first);
                for (i, row) in lhs.chunks_exact_mut(n).enumerate() {
                    a.load_f32([i, i2, i3], row)?;
                }
                for (i, row) in x.chunks_exact_mut(k).enumerate() {
                    b.load_f32([i, i2, i3], row)?;
                }
                substitute(lhs, x, n, k);
                bytes.resize(k * 4, 0);
                for (i, row) in x.chunks_exact(k).enumerate() {
                    encode(Scalar::F32, row, bytes);
                    part.write_at([i, i2, i3], 0, bytes)?;
                }
            }
            Ok(())
        },
    )
}

/// Forward substitution in place: `x` holds `B` (`n` rows of `k`) and becomes `X`. Row `i`
/// only reads rows `t < i`, already solved; each column's sum runs over ascending `t`, as
/// ggml's loop does.
fn substitute(lhs: &[f32], x: &mut [f32], n: usize, k: usize) {
    let mut sums = vec![0.0f32; k];
    for i in 0..n {
        sums.iter_mut().for_each(|s| *s = 0.0);
        let a_row = &lhs[i * n..(i + 1) * n];
        let (solved, rest) = x.split_at_mut(i * k);
        for (t, &a_it) in a_row[..i].iter().enumerate() {
            let x_t = &solved[t * k..(t + 1) * k];
            for (s, &v) in sums.iter_mut().zip(x_t) {
                *s += a_it * v;
            }
        }
        let diag = a_row[i];
        for (v, &s) in rest[..k].iter_mut().zip(&sums) {
            *v = (*v - s) / diag;
        }
    }
}

pub(super) fn diag(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let a = node.view(0)?;
    let layout = *dst.layout();
    let n = layout.ne[0];
    let chunk = node.pool.chunk(layout.rows(), n);
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || (vec![0.0f32; n], vec![0u8; n * 4]),
        |(row, bytes), mut part: DstPart<'_>| {
            for r in part.rows() {
                let [i1, i2, i3] = layout.row_index(r);
                row.fill(0.0);
                row[i1] = a.value([i1, 0, i2, i3]);
                encode(Scalar::F32, row, bytes);
                part.write(r, 0, bytes)?;
            }
            Ok(())
        },
    )
}
