//! The loss and optimizer ops of ggml's training graphs (llama.cpp's opt API), with ggml-cpu's
//! arithmetic (`ops.cpp`), all in f32 but for the sums ggml keeps in `ggml_float`:
//!
//! * CROSS_ENTROPY_LOSS: per row, `max`, `t = x - max`, `log Σ e^t` (the sum in f64, its
//!   logarithm of the sum rounded to f32, as ggml's `logf` takes it), `Σ (t - log Σ) · label`
//!   in f64 rounded to f32; the rows' results added in f64 (ggml adds them in f32 per thread,
//!   then the threads' sums: a thread-count-dependent order; here the row order), rounded,
//!   times `-1 / rows`;
//! * CROSS_ENTROPY_LOSS_BACK: per row, `e = exp(x - max)`, `Σ e` in f64,
//!   `(e · (1 / Σ) - label) · (grad / rows)`;
//! * OPT_STEP_ADAMW (three steps, see the plan): `m = m β1 + g (1 - β1)`,
//!   `v = v β2 + g g (1 - β2)`, then `w = w (1 - α wd) - α (m β1h) / (sqrt(v β2h) + eps)`;
//! * OPT_STEP_SGD: `w = w (1 - α wd) - α g`.
//!
//! The optimizers' parameters are a tensor (the opt API sets them before each step), read
//! when the node runs.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::view::{internal, SrcView};

use super::{c_max, map_rows, Node};

/// The first `N` values of a contiguous F32 tensor (the plan checked its element count).
fn leading_values<const N: usize>(view: &SrcView<'_>) -> Result<[f32; N]> {
    let mut out = [0.0f32; N];
    for (i, v) in out.iter_mut().enumerate() {
        let bytes = view
            .bytes
            .get(4 * i..4 * i + 4)
            .ok_or_else(|| internal("optimizer parameters shorter than planned"))?;
        *v = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
    Ok(out)
}

/// ggml's `ggml_vec_max_f32`: `MAX(max, x)` from -inf.
fn row_max(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |m, &v| c_max(m, v))
}

pub(super) fn cross_entropy_loss(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (logits, labels) = (node.view(0)?, node.view(1)?);
    let l = logits.layout;
    let width = l.ne[0];
    // each row's Σ label · log_softmax, then their sum in row order
    let rows = if l.is_empty() { 0 } else { l.rows() };
    let mut row_sums = vec![0.0f32; rows];
    if rows > 0 {
        let chunk = node.pool.chunk(rows, width.saturating_mul(4));
        let items: Vec<(usize, &mut [f32])> = row_sums
            .chunks_mut(chunk)
            .enumerate()
            .map(|(n, sums)| (n * chunk, sums))
            .collect();
        node.pool.run_with(
            items,
            || (vec![0.0f32; width], vec![0.0f32; width]),
            |(x, y), (first, sums): (usize, &mut [f32])| {
                for (k, sum) in sums.iter_mut().enumerate() {
                    let idx = l.row_index(first + k);
                    logits.load_f32(idx, x)?;
                    labels.load_f32(idx, y)?;
                    let max = row_max(x);
                    let mut exps = 0.0f64;
                    for v in x.iter_mut() {
                        *v -= max;
                        exps += f64::from(v.exp());
                    }
                    // ggml: logf of the f64 sum (rounded to f32), then added as -log in f32
                    let log_sum = -((exps as f32).ln());
                    *sum = x
                        .iter()
                        .zip(y.iter())
                        .map(|(&t, &label)| f64::from((t + log_sum) * label))
                        .sum::<f64>() as f32;
                }
                Ok(())
            },
        )?;
    }
    let total = row_sums.iter().map(|&s| f64::from(s)).sum::<f64>() as f32;
    let loss = total * (-1.0 / rows as f32);
    for mut part in dst.split_rows(1) {
        part.write(0, 0, &loss.to_le_bytes())?;
    }
    Ok(())
}

pub(super) fn cross_entropy_loss_back(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let (grad, logits, labels) = (node.view(0)?, node.input(1)?, node.view(2)?);
    let width = dst.layout().ne[0];
    let rows = dst.layout().rows();
    let grad_by_rows = grad.value([0, 0, 0, 0]) / rows as f32;
    map_rows(
        node,
        dst,
        logits,
        4,
        || vec![0.0f32; width],
        |y, _, idx, x, out| {
            labels.load_f32(idx, y)?;
            let max = row_max(x);
            let mut sum = 0.0f64;
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (v - max).exp();
                sum += f64::from(*o);
            }
            let scale = (1.0 / sum) as f32;
            for (o, &label) in out.iter_mut().zip(y.iter()) {
                *o = (*o * scale - label) * grad_by_rows;
            }
            Ok(())
        },
    )
}

/// The moment update of OPT_STEP_ADAMW: `m` (or, `second`, `v`) in place.
pub(super) fn adamw_moment(node: &Node<'_>, dst: Dst<'_>, second: bool) -> Result<()> {
    let (moment, grad) = (node.input(0)?, node.view(1)?);
    let [_, beta1, beta2] = leading_values::<3>(&node.view(2)?)?;
    let width = dst.layout().ne[0];
    map_rows(
        node,
        dst,
        moment,
        3,
        || vec![0.0f32; width],
        |g, _, idx, m, out| {
            grad.load_f32(idx, g)?;
            for ((o, &m), &g) in out.iter_mut().zip(m).zip(g.iter()) {
                *o = if second {
                    m * beta2 + g * g * (1.0 - beta2)
                } else {
                    m * beta1 + g * (1.0 - beta1)
                };
            }
            Ok(())
        },
    )
}

/// The weight update of OPT_STEP_ADAMW, from the updated moments.
pub(super) fn adamw_weights(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let (weights, m, v) = (node.input(0)?, node.view(1)?, node.view(2)?);
    let [alpha, _, _, eps, wd, beta1h, beta2h] = leading_values::<7>(&node.view(3)?)?;
    let keep = 1.0 - alpha * wd;
    let width = dst.layout().ne[0];
    map_rows(
        node,
        dst,
        weights,
        6,
        || (vec![0.0f32; width], vec![0.0f32; width]),
        |(ms, vs), _, idx, w, out| {
            m.load_f32(idx, ms)?;
            v.load_f32(idx, vs)?;
            for (((o, &w), &m), &v) in out.iter_mut().zip(w).zip(ms.iter()).zip(vs.iter()) {
                let mh = m * beta1h;
                let vh = (v * beta2h).sqrt() + eps;
                *o = w * keep - alpha * mh / vh;
            }
            Ok(())
        },
    )
}

pub(super) fn sgd_step(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let (weights, grad) = (node.input(0)?, node.view(1)?);
    let [alpha, wd] = leading_values::<2>(&node.view(2)?)?;
    let keep = 1.0 - alpha * wd;
    let width = dst.layout().ne[0];
    map_rows(
        node,
        dst,
        weights,
        2,
        || vec![0.0f32; width],
        |g, _part: &DstPart<'_>, idx, w, out| {
            grad.load_f32(idx, g)?;
            for ((o, &w), &g) in out.iter_mut().zip(w).zip(g.iter()) {
                *o = w * keep - alpha * g;
            }
            Ok(())
        },
    )
}
