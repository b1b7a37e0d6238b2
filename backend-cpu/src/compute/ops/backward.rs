//! The gradients of forward ops that ggml's backward passes (and llama.cpp's opt API) build,
//! with ggml-cpu's arithmetic (`ops.cpp`):
//!
//! * SILU_BACK: `dx = dy · s · (1 + x (1 - s))`, `s = 1 / (1 + e^-x)`, in f32;
//! * RMS_NORM_BACK: `Σ x²` and `Σ x·dz` in f64 (each product in f32), then in f32
//!   `rrms = 1 / sqrt(Σx² / n + eps)`, `scale = -Σx·dz / (Σx² + eps·n)`,
//!   `dx = (dz + x · scale) · rrms`;
//! * SOFT_MAX_BACK: `dx = scale · (dy - dot(y, dy)) · y`, the dot in f32;
//! * GET_ROWS_BACK: the destination is zero but for rows named by the ids, each the f32 sum
//!   (in id order) of the gradient rows naming it;
//! * REPEAT_BACK: each destination element is the f32 sum of its repetitions in the source,
//!   the outer repetition index first, as ggml's loop nest adds them.
//!
//! Every kernel computes whole destination rows, each the same way whatever the split.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::view::{encode, Scalar};

use super::norm::sum_f64;
use super::rows::checked_ids;
use super::{dot, map_rows, Node};

/// Why GET_ROWS_BACK fails at run time.
const GET_ROWS_BACK_ID: &str = "GET_ROWS_BACK row id outside the destination's rows";

pub(super) fn silu_back(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let (dy, x) = (node.input(0)?, node.input(1)?);
    let width = dst.layout().ne[0];
    map_rows(
        node,
        dst,
        dy,
        8,
        || (vec![0.0f32; width], Vec::new()),
        |(xs, scratch), part, idx, dy, out| {
            // read before the row is written: x may be the destination itself
            x.load_f32(part, idx, xs, scratch)?;
            for ((out, &dy), &x) in out.iter_mut().zip(dy).zip(xs.iter()) {
                let s = 1.0 / (1.0 + (-x).exp());
                *out = dy * s * (1.0 + x * (1.0 - s));
            }
            Ok(())
        },
    )
}

pub(super) fn rms_norm_back(node: &Node<'_>, dst: Dst<'_>, eps: f32) -> Result<()> {
    let (dz, x) = (node.input(0)?, node.view(1)?);
    let width = dst.layout().ne[0];
    map_rows(
        node,
        dst,
        dz,
        4,
        || vec![0.0f32; width],
        |xs, _, idx, dz, out| {
            x.load_f32(idx, xs)?;
            let n = xs.len() as f32;
            let sum_xx = sum_f64(xs, |v| f64::from(v * v)) as f32;
            let sum_xdz: f64 = xs.iter().zip(dz).map(|(&x, &d)| f64::from(x * d)).sum();
            let mean_eps = sum_xx / n + eps;
            let sum_eps = sum_xx + eps * n;
            let rrms = 1.0 / mean_eps.sqrt();
            let scale_x = (-sum_xdz) as f32 / sum_eps;
            for ((out, &dz), &x) in out.iter_mut().zip(dz).zip(xs.iter()) {
                *out = (dz + x * scale_x) * rrms;
            }
            Ok(())
        },
    )
}

pub(super) fn soft_max_back(node: &Node<'_>, dst: Dst<'_>, scale: f32) -> Result<()> {
    let (dy, y) = (node.input(0)?, node.input(1)?);
    let width = dst.layout().ne[0];
    map_rows(
        node,
        dst,
        dy,
        3,
        || (vec![0.0f32; width], Vec::new()),
        |(ys, scratch), part, idx, dy, out| {
            // read before the row is written: y may be the destination itself
            y.load_f32(part, idx, ys, scratch)?;
            let dot_y_dy = dot(ys, dy);
            for ((out, &dy), &y) in out.iter_mut().zip(dy).zip(ys.iter()) {
                *out = scale * (dy - dot_y_dy) * y;
            }
            Ok(())
        },
    )
}

pub(super) fn get_rows_back(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (grad, ids) = (node.view(0)?, node.view(1)?);
    let layout = *dst.layout();
    let (width, rows) = (layout.ne[0], layout.ne[1]);
    // every id checked before anything is written
    let targets = checked_ids(&ids, rows, GET_ROWS_BACK_ID)?;
    // the gradient rows of each destination row, ascending (a counting sort by target):
    // `sources[starts[r]..starts[r + 1]]` for row r
    let mut starts = vec![0usize; rows + 1];
    for &t in targets.iter() {
        starts[t + 1] += 1;
    }
    for r in 0..rows {
        starts[r + 1] += starts[r];
    }
    let mut next = starts.clone();
    let mut sources = vec![0usize; targets.len()];
    for (i, &t) in targets.iter().enumerate() {
        sources[next[t]] = i;
        next[t] += 1;
    }
    let chunk = node.pool.chunk(rows, width.saturating_mul(2));
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || (vec![0.0f32; width], vec![0.0f32; width], Vec::new()),
        |(acc, row, bytes), mut part: DstPart<'_>| {
            for r in part.rows() {
                // ggml clears the destination and adds: a lone -0.0 becomes +0.0 too
                acc.fill(0.0);
                for &i in &sources[starts[r]..starts[r + 1]] {
                    grad.load_f32([i, 0, 0], row)?;
                    acc.iter_mut().zip(row.iter()).for_each(|(a, &v)| *a += v);
                }
                bytes.resize(width * 4, 0);
                encode(Scalar::F32, acc, bytes);
                part.write(r, 0, bytes)?;
            }
            Ok(())
        },
    )
}

pub(super) fn repeat_back(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let a = node.view(0)?;
    let layout = *dst.layout();
    let ne = layout.ne;
    // the plan checked that every source size is a multiple of the (non-zero) destination's
    let reps = [0, 1, 2, 3].map(|d| a.layout.ne[d] / ne[d].max(1));
    let src_width = a.layout.ne[0];
    let per_row = reps[1] * reps[2] * reps[3] * src_width;
    let chunk = node.pool.chunk(layout.rows(), per_row.max(1));
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || (vec![0.0f32; ne[0]], vec![0.0f32; src_width], Vec::new()),
        |(acc, row, bytes), mut part: DstPart<'_>| {
            for r in part.rows() {
                let [k1, k2, k3] = layout.row_index(r);
                acc.fill(0.0);
                for i3 in 0..reps[3] {
                    for i2 in 0..reps[2] {
                        for i1 in 0..reps[1] {
                            a.load_f32([i1 * ne[1] + k1, i2 * ne[2] + k2, i3 * ne[3] + k3], row)?;
                            for piece in row.chunks_exact(ne[0]) {
                                acc.iter_mut().zip(piece).for_each(|(a, &v)| *a += v);
                            }
                        }
                    }
                }
                bytes.resize(ne[0] * 4, 0);
                encode(Scalar::F32, acc, bytes);
                part.write_at([k1, k2, k3], 0, bytes)?;
            }
            Ok(())
        },
    )
}
