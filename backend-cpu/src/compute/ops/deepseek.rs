//! The DeepSeek-V4-style ops: the lightning indexer of its sparse attention and the three
//! hyper-connection ops that replace the plain residual connection (`x + f(x)`) by `hc`
//! parallel residual streams. Arithmetic as ggml-cpu's (`ops.cpp`), all in f32:
//!
//! * LIGHTNING_INDEXER: for token `t` of stream `s` and key `ik`,
//!   `sum_h max(q[h, t, s] · k[ik, s], 0) * weights[h, t, s]`, heads added in order from 0,
//!   plus `mask[ik, t, s % S']` (f16). The dot products use [`dot`]'s eight partial sums, as
//!   ggml's vectorized `ggml_vec_dot_f32` uses lanes (test-backend-ops allows an NMSE of
//!   1e-6 here); keys of any type are widened to f32 first, as ggml's `to_float` does;
//! * DSV4_HC_COMB: per token, the `4 x 4` logits `mixes[8 + dst + 4 * src] * scale[2] +
//!   base[8 + dst + 4 * src]`, a softmax over `dst` in every `src` column with `eps` added
//!   to each result, a normalization over `src` for every `dst`, then `n_iter - 1` rounds of
//!   a normalization over `dst`, then over `src`. Each normalization divides by `eps` plus
//!   the sum (multiplying by its reciprocal, as ggml does);
//! * DSV4_HC_PRE: `out[i, t] = scale * sum_h x[i, h, t] * w`, streams added in order from 0,
//!   `w` the stream's weight `weights[h, t]` or, gated, `1 / (1 + exp(-gate[i, h, t]))`;
//! * DSV4_HC_POST: `out[i, dst, t] = x[i, t] * post[dst, t]`, plus
//!   `sum_src residual[i, src, t] * comb[dst, src, t]` added in order, or without `comb`
//!   plus `residual[i, dst, t]`.
//!
//! Threads: destination rows (a token's scores, a token's `src` column of the mixing matrix,
//! a token's row, a token's stream). Every value is computed the same way whatever the split.

use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::plan::{HC_MIX_LEN, HC_STREAMS};
use crate::compute::view::internal;

use super::ssm::span;
use super::{c_max, dot, fill_rows, widen_all, Node};

/// LIGHTNING_INDEXER: `q {D, H, T, S}`, `k {D, 1, n_kv, S}`, `weights {H, T, 1, S}`,
/// `mask {n_kv, T, 1, S'}` in slots 0..4; destination `{n_kv, T, 1, S}`.
pub(super) fn lightning_indexer(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let (q, k, weights, mask) = (node.view(0)?, node.view(1)?, node.view(2)?, node.view(3)?);
    let [width, heads, _, _] = q.layout.ne;
    let n_kv = k.layout.ne[2];
    let mask_streams = mask.layout.ne[3];
    // every key is read once per token: widened once (rows `ik + n_kv * s`, `D` values each)
    let keys = widen_all(node, &k)?;
    // a token's queries, all heads: no more than q holds (or 0 for an empty q)
    let queries_len = heads
        .checked_mul(width)
        .ok_or_else(|| internal("LIGHTNING_INDEXER query rows beyond the address space"))?;
    fill_rows(
        node,
        dst,
        queries_len,
        || {
            (
                vec![0.0f32; queries_len],
                vec![0.0f32; heads],
                vec![0.0f32; n_kv],
            )
        },
        |(queries, head_weights, bias), [t, _, s], out| {
            for (h, query) in queries.chunks_exact_mut(width.max(1)).enumerate() {
                q.load_f32([h, t, s], query)?;
            }
            weights.load_f32([t, 0, s], head_weights)?;
            mask.load_f32([t, 0, s % mask_streams], bias)?;
            let stream_keys = span(&keys, s * n_kv * width, n_kv * width)?;
            for (ik, score_out) in out.iter_mut().enumerate() {
                let key = span(stream_keys, ik * width, width)?;
                let mut score = 0.0f32;
                for (h, &weight) in head_weights.iter().enumerate() {
                    let query = span(queries, h * width, width)?;
                    // ReLU, then the head's (pre-scaled) weight
                    score += c_max(dot(query, key), 0.0) * weight;
                }
                *score_out = score + bias[ik];
            }
            Ok(())
        },
    )
}

/// DSV4_HC_COMB: `mixes {24, T}`, `scale {>= 3}`, `base {24}` in slots 0..3; destination
/// `{4, 4, T}`, row `(src, t)` holding column `src` of token `t`'s matrix.
pub(super) fn hc_comb(node: &Node<'_>, dst: Dst<'_>, eps: f32, iterations: usize) -> Result<()> {
    let (mixes, scale, base) = (node.view(0)?, node.view(1)?, node.view(2)?);
    let scale = scale.value([2, 0, 0, 0]);
    let offset = HC_MIX_LEN - HC_STREAMS * HC_STREAMS;
    let base: [f32; HC_STREAMS * HC_STREAMS] =
        std::array::from_fn(|i| base.value([offset + i, 0, 0, 0]));
    fill_rows(
        node,
        dst,
        HC_STREAMS * iterations.saturating_add(1),
        // the last token's matrix: a token's four rows are usually in one part, computed once
        || None::<(usize, Matrix)>,
        |cached, [src, t, _], column| {
            let matrix = match *cached {
                Some((token, matrix)) if token == t => matrix,
                _ => {
                    let logits: Matrix = std::array::from_fn(|i| {
                        mixes.value([offset + i, t, 0, 0]) * scale + base[i]
                    });
                    let matrix = mixing_matrix(logits, eps, iterations);
                    *cached = Some((t, matrix));
                    matrix
                }
            };
            let at = src * HC_STREAMS;
            column.copy_from_slice(
                matrix
                    .get(at..at + HC_STREAMS)
                    .ok_or_else(|| internal("a DSV4_HC_COMB column outside the matrix"))?,
            );
            Ok(())
        },
    )
}

/// A `4 x 4` mixing matrix, element `(dst, src)` at `dst + 4 * src` (ggml's layout).
type Matrix = [f32; HC_STREAMS * HC_STREAMS];

/// The mixing matrix of one token's logits: softmax over `dst` (plus `eps`), then the
/// normalizations (see the module documentation).
fn mixing_matrix(logits: Matrix, eps: f32, iterations: usize) -> Matrix {
    let mut m = logits;
    for column in m.chunks_exact_mut(HC_STREAMS) {
        let max = column
            .iter()
            .fold(f32::NEG_INFINITY, |max, &v| c_max(max, v));
        let mut sum = 0.0f32;
        for v in column.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv_sum = 1.0 / sum;
        for v in column.iter_mut() {
            *v = *v * inv_sum + eps;
        }
    }
    normalize_over_src(&mut m, eps);
    for _ in 1..iterations {
        normalize_over_dst(&mut m, eps);
        normalize_over_src(&mut m, eps);
    }
    m
}

/// Divides every `dst` row by `eps` plus its sum over `src` (ggml's `norm_cols`).
fn normalize_over_src(m: &mut Matrix, eps: f32) {
    for dst in 0..HC_STREAMS {
        let sum = (0..HC_STREAMS).fold(eps, |sum, src| sum + m[dst + HC_STREAMS * src]);
        let inv_sum = 1.0 / sum;
        for src in 0..HC_STREAMS {
            m[dst + HC_STREAMS * src] *= inv_sum;
        }
    }
}

/// Divides every `src` column by `eps` plus its sum over `dst` (ggml's `norm_rows`).
fn normalize_over_dst(m: &mut Matrix, eps: f32) {
    for column in m.chunks_exact_mut(HC_STREAMS) {
        let sum = column.iter().fold(eps, |sum, &v| sum + v);
        let inv_sum = 1.0 / sum;
        for v in column.iter_mut() {
            *v *= inv_sum;
        }
    }
}

/// DSV4_HC_PRE: `x {n_embd, hc, T}` and `weights {hc, T}` (gated: gates
/// `{n_embd, hc, T}`) in slots 0 and 1; destination `{n_embd, T}`.
pub(super) fn hc_pre(node: &Node<'_>, dst: Dst<'_>, scale: f32, gated: bool) -> Result<()> {
    let (x, weights) = (node.view(0)?, node.view(1)?);
    let [n_embd, streams, _, _] = x.layout.ne;
    let weights_len = if gated { n_embd } else { streams };
    fill_rows(
        node,
        dst,
        streams.saturating_mul(if gated { 4 } else { 1 }),
        || (vec![0.0f32; n_embd], vec![0.0f32; weights_len]),
        |(x_row, w_row), [t, _, _], out| {
            out.fill(0.0);
            if !gated {
                weights.load_f32([t, 0, 0], w_row)?;
            }
            for h in 0..streams {
                x.load_f32([h, t, 0], x_row)?;
                if gated {
                    weights.load_f32([h, t, 0], w_row)?;
                    for ((sum, &xv), &gate) in out.iter_mut().zip(x_row.iter()).zip(w_row.iter()) {
                        *sum += xv * (1.0 / (1.0 + (-gate).exp()));
                    }
                } else {
                    let weight = w_row
                        .get(h)
                        .copied()
                        .ok_or_else(|| internal("a DSV4_HC_PRE stream without a weight"))?;
                    for (sum, &xv) in out.iter_mut().zip(x_row.iter()) {
                        *sum += xv * weight;
                    }
                }
            }
            for sum in out.iter_mut() {
                *sum *= scale;
            }
            Ok(())
        },
    )
}

/// DSV4_HC_POST: `x {n_embd, T}`, `residual {n_embd, hc, T}`, `post {hc, T}` and the
/// optional `comb {hc, hc, T}` in slots 0..4; destination `{n_embd, hc, T}`.
pub(super) fn hc_post(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let (x, residual, post) = (node.view(0)?, node.view(1)?, node.view(2)?);
    let comb = node.optional_view(3)?;
    let [n_embd, streams, _, _] = residual.layout.ne;
    fill_rows(
        node,
        dst,
        streams.saturating_add(1),
        || (vec![0.0f32; n_embd], vec![0.0f32; n_embd]),
        |(x_row, r_row), [dst_stream, t, _], out| {
            x.load_f32([t, 0, 0], x_row)?;
            let scale = post.value([dst_stream, t, 0, 0]);
            for (o, &xv) in out.iter_mut().zip(x_row.iter()) {
                *o = xv * scale;
            }
            match &comb {
                Some(comb) => {
                    for src_stream in 0..streams {
                        residual.load_f32([src_stream, t, 0], r_row)?;
                        let weight = comb.value([dst_stream, src_stream, t, 0]);
                        for (o, &rv) in out.iter_mut().zip(r_row.iter()) {
                            *o += rv * weight;
                        }
                    }
                }
                None => {
                    // identity mixing: each stream keeps its own residual
                    residual.load_f32([dst_stream, t, 0], r_row)?;
                    for (o, &rv) in out.iter_mut().zip(r_row.iter()) {
                        *o += rv;
                    }
                }
            }
            Ok(())
        },
    )
}
