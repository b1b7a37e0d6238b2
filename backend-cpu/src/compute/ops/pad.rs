//! PAD, ROLL, ARANGE and TIMESTEP_EMBEDDING: generic F32 ops that move or generate values,
//! row by row, as ggml's CPU kernels define them (`ops.cpp`):
//!
//! * PAD: destination element `i` is source element `i - before` in every dimension, or 0
//!   where that lies outside the source; circular padding wraps it around instead;
//! * ROLL: destination element `i` is source element `i - shift`, wrapped, in every dimension;
//! * ARANGE: element `i` (flat order) is `start + step * i`, in f32;
//! * TIMESTEP_EMBEDDING: row `i`, with `half = dim / 2`, `freq_j = exp(-ln(max_period) * j /
//!   half)`: `cos(t_i * freq_j)` at `j`, `sin(t_i * freq_j)` at `half + j`, and 0 in the last
//!   column of an odd `dim`.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::plan::PadParams;
use crate::compute::view::{encode, Layout, Scalar};

use super::Node;

/// Runs `fill(scratch, idx, row)` for every destination row `idx` (F32, `ne0` values), split
/// over the pool: the shape of the kernels here, whose rows do not map one to one onto a
/// source row of the same index.
fn write_rows<S>(
    node: &Node<'_>,
    mut dst: Dst<'_>,
    cost: usize,
    init: impl Fn() -> S + Sync + Send,
    fill: impl Fn(&mut S, [usize; 3], &mut [f32]) -> Result<()> + Sync + Send,
) -> Result<()> {
    let layout = *dst.layout();
    let ne0 = layout.ne[0];
    let chunk = node.pool.chunk(layout.rows(), ne0.saturating_mul(cost));
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || (init(), vec![0.0f32; ne0], vec![0u8; ne0 * 4]),
        |(state, row, bytes), mut part: DstPart<'_>| {
            for r in part.rows() {
                let idx = layout.row_index(r);
                fill(state, idx, row)?;
                encode(Scalar::F32, row, bytes);
                part.write_at(idx, 0, bytes)?;
            }
            Ok(())
        },
    )
}

/// Where destination index `i` of a dimension of `n` source elements reads after moving by
/// `by`: `i - by`, wrapped around if `wrap`, `None` outside the source otherwise.
#[inline]
fn source_index(i: usize, by: i64, n: usize, wrap: bool) -> Option<usize> {
    let j = i as i64 - by;
    if wrap {
        // n > 0: the plan refuses wrapping an empty source
        usize::try_from(j.rem_euclid(n.max(1) as i64)).ok()
    } else {
        usize::try_from(j).ok().filter(|&j| j < n)
    }
}

/// The source row a destination row reads (`None`: a row of padding).
fn source_row(
    [i1, i2, i3]: [usize; 3],
    src: &Layout,
    by: &[i64; 4],
    wrap: bool,
) -> Option<[usize; 3]> {
    Some([
        source_index(i1, by[1], src.ne[1], wrap)?,
        source_index(i2, by[2], src.ne[2], wrap)?,
        source_index(i3, by[3], src.ne[3], wrap)?,
    ])
}

pub(super) fn pad(node: &Node<'_>, dst: Dst<'_>, params: PadParams) -> Result<()> {
    let a = node.view(0)?;
    let ne00 = a.layout.ne[0];
    let PadParams { before, circular } = params;
    write_rows(
        node,
        dst,
        1,
        || vec![0.0f32; ne00],
        |x, idx, row| {
            let Some(from) = source_row(idx, &a.layout, &before, circular) else {
                row.fill(0.0);
                return Ok(());
            };
            a.load_f32(from, x)?;
            for (i0, y) in row.iter_mut().enumerate() {
                *y = source_index(i0, before[0], ne00, circular).map_or(0.0, |j| x[j]);
            }
            Ok(())
        },
    )
}

pub(super) fn roll(node: &Node<'_>, dst: Dst<'_>, shifts: [i64; 4]) -> Result<()> {
    let a = node.view(0)?;
    let ne00 = a.layout.ne[0];
    write_rows(
        node,
        dst,
        1,
        || vec![0.0f32; ne00],
        |x, idx, row| {
            // same shape as the source, so a wrapped index always exists
            let from = source_row(idx, &a.layout, &shifts, true).unwrap_or(idx);
            a.load_f32(from, x)?;
            for (i0, y) in row.iter_mut().enumerate() {
                *y = source_index(i0, shifts[0], ne00, true).map_or(0.0, |j| x[j]);
            }
            Ok(())
        },
    )
}

pub(super) fn arange(node: &Node<'_>, dst: Dst<'_>, start: f32, step: f32) -> Result<()> {
    let layout = *dst.layout();
    let ne0 = layout.ne[0];
    write_rows(
        node,
        dst,
        1,
        || (),
        |_, idx, row| {
            let first = layout.row_number(idx) * ne0;
            for (i0, y) in row.iter_mut().enumerate() {
                // ggml: `start + step * i` with `i` converted to float
                *y = start + step * (first + i0) as f32;
            }
            Ok(())
        },
    )
}

pub(super) fn timestep_embedding(
    node: &Node<'_>,
    dst: Dst<'_>,
    dim: usize,
    max_period: i32,
) -> Result<()> {
    let a = node.view(0)?;
    let half = dim / 2;
    // `-logf(max_period) * j / half`, in f32, left to right
    let log_period = -(max_period as f32).ln();
    let freqs: Vec<f32> = (0..half)
        .map(|j| (log_period * j as f32 / half as f32).exp())
        .collect();
    write_rows(
        node,
        dst,
        8,
        || (),
        |_, [i, _, _], row| {
            let t = a.value([i, 0, 0, 0]);
            let (cos, rest) = row.split_at_mut(half);
            for ((c, s), &freq) in cos.iter_mut().zip(rest.iter_mut()).zip(&freqs) {
                let arg = t * freq;
                *c = arg.cos();
                *s = arg.sin();
            }
            // the last column of an odd width
            if let Some(last) = rest.get_mut(half) {
                *last = 0.0;
            }
            Ok(())
        },
    )
}
