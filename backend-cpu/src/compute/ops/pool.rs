//! POOL_1D, POOL_2D, UPSCALE and PAD_REFLECT_1D, with ggml-cpu's arithmetic (`ops.cpp`), all
//! in f32 (F16 pooling sources widened exactly):
//!
//! * POOL_1D / POOL_2D: each output is the maximum (from `-FLT_MAX`, C++'s `std::max` order)
//!   or the sum of the window's values inside the source, rows then columns; a 2-D average
//!   divides by the whole window size `k0 * k1` (padding counts), a 1-D one by the taps inside
//!   the row (0 without any);
//! * UPSCALE: dimensions 2 and 3 take the source index `i / (ne / ne_src)` (f32, truncated);
//!   dimensions 0 and 1 are sampled at `(i + 0.5) / scale - 0.5` (`i / scale` with
//!   align-corners, whose scale is `(ne - 1) / (ne_src - 1)`): nearest (truncated `i /
//!   scale`), bilinear between the clamped neighbours, bilinear with a triangle filter as wide
//!   as the downscaling (antialias, weights normalized), or bicubic (a = -0.75, clamped
//!   neighbours), each formula in ggml's operation order;
//! * PAD_REFLECT_1D: row `[x0 .. xn]` becomes `[x_p0 .. x1, x0 .. xn, x_{n-1} .. x_{n-p1}]`.
//!
//! Threads: destination rows.

use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::plan::{PoolOp, PoolParams, ScaleMode};

use super::ssm::span;
use super::{fill_rows, widen_all, Node};

/// POOL_1D (`kernel[1] == 1`, a unit axis 1) and POOL_2D.
pub(super) fn pool(node: &Node<'_>, dst: Dst<'_>, params: PoolParams) -> Result<()> {
    let a = node.view(0)?;
    let [ne0, ne1, ne2, _] = a.layout.ne;
    let src = widen_all(node, &a)?;
    let PoolParams {
        op,
        kernel: [k0, k1],
        axes: [across, down],
        one_d,
    } = params;
    // ggml's `(float) ka` of its int `k0 * k1`
    let window = k0.saturating_mul(k1) as f32;
    fill_rows(
        node,
        dst,
        k0.saturating_mul(k1),
        || (),
        |_, [oy, i2, i3], row| {
            // POOL_1D: row (oy, i2, i3) of the source; POOL_2D: plane (i2, i3)
            let plane = span(&src, (i3 * ne2 + i2) * ne1 * ne0, ne1 * ne0)?;
            let (rows, y0) = down.inside(oy, k1, ne1);
            for (ox, out) in row.iter_mut().enumerate() {
                let (cols, x0) = across.inside(ox, k0, ne0);
                let mut result = match op {
                    PoolOp::Max => -f32::MAX,
                    PoolOp::Avg => 0.0,
                };
                for y in y0..y0 + rows.len() {
                    for &v in &plane[y * ne0 + x0..][..cols.len()] {
                        result = match op {
                            // std::max(v, result)
                            PoolOp::Max if v < result => result,
                            PoolOp::Max => v,
                            PoolOp::Avg => result + v,
                        };
                    }
                }
                *out = match op {
                    PoolOp::Max => result,
                    PoolOp::Avg if !one_d => result / window,
                    PoolOp::Avg => {
                        let count = rows.len() * cols.len();
                        if count > 0 {
                            result / count as f32
                        } else {
                            0.0
                        }
                    }
                };
            }
            Ok(())
        },
    )
}

/// Source index of destination index `i` at scale `sf` (`(int64) (i / sf)`), kept inside the
/// source's `n` elements.
#[inline]
fn nearest(i: usize, sf: f32, n: usize) -> usize {
    ((i as f32 / sf) as i64).clamp(0, n as i64 - 1) as usize
}

/// ggml's bicubic convolution weights (a = -0.75) for the four neighbours at offset `t`.
#[inline]
fn bicubic(p: [f32; 4], t: f32) -> f32 {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    p[0] * far(t + 1.0) + p[1] * near(t) + p[2] * near(1.0 - t) + p[3] * far(2.0 - t)
}

/// UPSCALE of the F32 source in slot 0 to the destination's shape.
pub(super) fn upscale(
    node: &Node<'_>,
    dst: Dst<'_>,
    mode: ScaleMode,
    align_corners: bool,
) -> Result<()> {
    let a = node.view(0)?;
    let [ne00, ne01, ne02, ne03] = a.layout.ne;
    let [ne0, ne1, ne2, ne3] = dst.layout().ne;
    let src = widen_all(node, &a)?;
    let scale = |n: usize, n_src: usize| n as f32 / n_src as f32;
    let (mut sf0, mut sf1) = (scale(ne0, ne00), scale(ne1, ne01));
    let (sf2, sf3) = (scale(ne2, ne02), scale(ne3, ne03));
    let mut offset = 0.5f32;
    if align_corners {
        offset = 0.0;
        if ne0 > 1 && ne00 > 1 {
            sf0 = (ne0 - 1) as f32 / (ne00 - 1) as f32;
        }
        if ne1 > 1 && ne01 > 1 {
            sf1 = (ne1 - 1) as f32 / (ne01 - 1) as f32;
        }
    }
    // clamped source index, as ggml clamps its neighbours
    let clamp = |i: i64, n: usize| i.clamp(0, n as i64 - 1) as usize;
    fill_rows(
        node,
        dst,
        16,
        || (),
        |_, [i1, i2, i3], row| {
            let (i02, i03) = (nearest(i2, sf2, ne02), nearest(i3, sf3, ne03));
            let plane = span(&src, (i03 * ne02 + i02) * ne01 * ne00, ne01 * ne00)?;
            let at = |x: usize, y: usize| plane[y * ne00 + x];
            match mode {
                ScaleMode::Nearest => {
                    let i01 = nearest(i1, sf1, ne01);
                    for (i0, out) in row.iter_mut().enumerate() {
                        *out = at(nearest(i0, sf0, ne00), i01);
                    }
                }
                ScaleMode::Bilinear => {
                    let y = (i1 as f32 + offset) / sf1 - offset;
                    let y0 = clamp(y.floor() as i64, ne01);
                    let y1 = clamp(y.floor() as i64 + 1, ne01);
                    let dy = (y - y0 as f32).clamp(0.0, 1.0);
                    for (i0, out) in row.iter_mut().enumerate() {
                        let x = (i0 as f32 + offset) / sf0 - offset;
                        let x0 = clamp(x.floor() as i64, ne00);
                        let x1 = clamp(x.floor() as i64 + 1, ne00);
                        let dx = (x - x0 as f32).clamp(0.0, 1.0);
                        *out = at(x0, y0) * (1.0 - dx) * (1.0 - dy)
                            + at(x1, y0) * dx * (1.0 - dy)
                            + at(x0, y1) * (1.0 - dx) * dy
                            + at(x1, y1) * dx * dy;
                    }
                }
                ScaleMode::BilinearAntialias => {
                    let triangle = |x: f32| (1.0 - x.abs()).max(0.0);
                    let support1 = (1.0 / sf1).max(1.0);
                    let support0 = (1.0 / sf0).max(1.0);
                    let (inv1, inv0) = (1.0 / support1, 1.0 / support0);
                    let y = (i1 as f32 + offset) / sf1;
                    // ggml converts the float bounds to int64 (truncation), then clamps
                    let y_min = ((y - support1 + offset) as i64).max(0) as usize;
                    let y_max = ((y + support1 + offset) as i64).clamp(0, ne01 as i64) as usize;
                    for (i0, out) in row.iter_mut().enumerate() {
                        let x = (i0 as f32 + offset) / sf0;
                        let x_min = ((x - support0 + offset) as i64).max(0) as usize;
                        let x_max = ((x + support0 + offset) as i64).clamp(0, ne00 as i64) as usize;
                        let (mut value, mut total) = (0.0f32, 0.0f32);
                        for sy in y_min..y_max {
                            let wy = triangle((sy as f32 - y + offset) * inv1);
                            for sx in x_min..x_max {
                                let weight = triangle((sx as f32 - x + offset) * inv0) * wy;
                                if weight <= 0.0 {
                                    continue;
                                }
                                value += at(sx, sy) * weight;
                                total += weight;
                            }
                        }
                        *out = if total > 0.0 { value / total } else { value };
                    }
                }
                ScaleMode::Bicubic => {
                    let y = (i1 as f32 + offset) / sf1 - offset;
                    let y0 = y.floor() as i64;
                    let dy = y - y0 as f32;
                    for (i0, out) in row.iter_mut().enumerate() {
                        let x = (i0 as f32 + offset) / sf0 - offset;
                        let x0 = x.floor() as i64;
                        let dx = x - x0 as f32;
                        let p = |ox: i64, oy: i64| {
                            at(
                                clamp(x0.saturating_add(ox), ne00),
                                clamp(y0.saturating_add(oy), ne01),
                            )
                        };
                        let line = |oy: i64| bicubic([p(-1, oy), p(0, oy), p(1, oy), p(2, oy)], dx);
                        *out = bicubic([line(-1), line(0), line(1), line(2)], dy);
                    }
                }
            }
            Ok(())
        },
    )
}

/// PAD_REFLECT_1D: `left` mirrored elements before each row, the rest after it.
pub(super) fn pad_reflect_1d(node: &Node<'_>, dst: Dst<'_>, left: usize) -> Result<()> {
    let a = node.view(0)?;
    let n = a.layout.ne[0];
    fill_rows(
        node,
        dst,
        1,
        || vec![0.0f32; n],
        |x, idx, row| {
            a.load_f32(idx, x)?;
            let (before, rest) = row.split_at_mut(left);
            let (middle, after) = rest.split_at_mut(n);
            middle.copy_from_slice(x);
            // the plan keeps both pads below n: x[1..=left] and x[n-1-right..n-1] exist
            for (i, out) in before.iter_mut().rev().enumerate() {
                *out = x[i + 1];
            }
            for (i, out) in after.iter_mut().enumerate() {
                *out = x[n - 2 - i];
            }
            Ok(())
        },
    )
}
