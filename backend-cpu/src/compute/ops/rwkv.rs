//! RWKV_WKV6, RWKV_WKV7 and GATED_LINEAR_ATTN: per-head `S x S` states updated token by
//! token, with ggml-cpu's arithmetic (`ops.cpp`, `ggml_compute_forward_rwkv_wkv6_f32`,
//! `..._rwkv_wkv7_f32`, `..._gla_f32`), all in f32.
//!
//! The tokens are `n_seqs` equal runs, one per sequence; sequence `s` starts from the `s`-th
//! state of the state source. For token `t` and head `h` (vectors of `S` values; `st[i][j]`
//! the head's state):
//!
//! * RWKV 6: `kv = k[i] * v[j]`, `y[j] = sum_i r[i] * (kv * time_first[h][i] + st[i][j])`,
//!   then `st[i][j] = st[i][j] * time_decay[i] + kv`;
//! * GLA: `st[i][j] = st[i][j] * g[i] + k[i] * v[j]`, `y[j] = sum_i st[i][j] * (q[i] * scale)`;
//! * RWKV 7: for each row `i`, `sa = sum_j a[j] * st[i][j]`, then
//!   `st[i][j] = st[i][j] * w[j] + v[i] * k[j] + sa * b[j]`, `y[i] = sum_j st[i][j] * r[j]`.
//!
//! The destination `{S * H, n_tokens + S * n_seqs}` holds the outputs (row = token), then
//! the final states, flat, sequence after sequence.
//!
//! Sums over `i` (RWKV 6, GLA) run in `i` order as ggml's do; RWKV 7's sums over `j` are
//! [`dot`]s (eight partial sums, where ggml uses its SIMD partial sums). Where ggml's SIMD path
//! fuses a multiply and an add (FMA builds), here they round separately, as in its scalar
//! path: differences of an ulp, far below test-backend-ops' tolerance.
//!
//! Threads: every sequence's heads are split into runs, each scanned over the sequence's
//! tokens into its own buffers, which are then stored (a head's state is not one tile of the
//! destination). Each value is computed the same way whatever the split.

use std::ops::Range;

use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::plan::WkvOp;
use crate::compute::scratch::Scratch;
use crate::compute::view::internal;

use super::ssm::{span, span_mut, store_f32};
use super::{dot, widen_all, Node};

/// The sources of one node as f32, and its sizes.
struct Wkv {
    op: WkvOp,
    /// The per-token inputs, `{S, H, n_tokens}` each, in the op's source order (RWKV 6:
    /// `k, v, r, time_decay`; RWKV 7: `r, w, k, v, a, b`; GLA: `k, v, q, g`).
    inputs: Vec<Scratch<f32>>,
    /// RWKV 6's `time_first`, `S` values per head (empty for the others).
    time_first: Scratch<f32>,
    /// The initial states, `S * S * H` per sequence.
    states: Scratch<f32>,
    head_size: usize,
    heads: usize,
    /// Tokens per sequence.
    seq_tokens: usize,
}

/// What one work item (one sequence, a run of heads) computed.
struct WkvOut {
    seq: usize,
    heads: Range<usize>,
    /// The outputs, `[token][head][S]`.
    y: Vec<f32>,
    /// The final states of the heads, `[head][S][S]`.
    state: Vec<f32>,
}

impl Wkv {
    /// The `S` values of per-token input `which` for token `t` (of all) and head `h`.
    fn at(&self, which: usize, t: usize, h: usize) -> Result<&[f32]> {
        let values = self
            .inputs
            .get(which)
            .ok_or_else(|| internal("a recurrence input is missing"))?;
        span(
            values,
            (t * self.heads + h) * self.head_size,
            self.head_size,
        )
    }

    /// Runs heads `heads` of sequence `seq` over its tokens.
    fn run(&self, seq: usize, heads: Range<usize>) -> Result<WkvOut> {
        let n = self.head_size;
        let head_state = n * n;
        let count = heads.len();
        let first = (seq * self.heads + heads.start) * head_state;
        let mut state = span(&self.states, first, count * head_state)?.to_vec();
        let mut y = vec![0.0f32; self.seq_tokens * count * n];
        for local_t in 0..self.seq_tokens {
            let t = seq * self.seq_tokens + local_t;
            for (local, h) in heads.clone().enumerate() {
                let out = span_mut(&mut y, (local_t * count + local) * n, n)?;
                let st = span_mut(&mut state, local * head_state, head_state)?;
                match self.op {
                    WkvOp::Rwkv6 => {
                        let (k, v, r, decay) = (
                            self.at(0, t, h)?,
                            self.at(1, t, h)?,
                            self.at(2, t, h)?,
                            self.at(3, t, h)?,
                        );
                        let first = span(&self.time_first, h * n, n)?;
                        for ((((row, &k), &r), &tf), &td) in
                            st.chunks_exact_mut(n).zip(k).zip(r).zip(first).zip(decay)
                        {
                            for ((y, s), &v) in out.iter_mut().zip(row.iter_mut()).zip(v) {
                                let kv = v * k;
                                *y += (kv * tf + *s) * r;
                                *s = *s * td + kv;
                            }
                        }
                    }
                    WkvOp::GatedLinearAttn { scale } => {
                        let (k, v, q, g) = (
                            self.at(0, t, h)?,
                            self.at(1, t, h)?,
                            self.at(2, t, h)?,
                            self.at(3, t, h)?,
                        );
                        for (((row, &k), &q), &g) in st.chunks_exact_mut(n).zip(k).zip(q).zip(g) {
                            let q = q * scale;
                            for ((y, s), &v) in out.iter_mut().zip(row.iter_mut()).zip(v) {
                                *s = *s * g + v * k;
                                *y += *s * q;
                            }
                        }
                    }
                    WkvOp::Rwkv7 => {
                        let (r, w, k) = (self.at(0, t, h)?, self.at(1, t, h)?, self.at(2, t, h)?);
                        let (v, a, b) = (self.at(3, t, h)?, self.at(4, t, h)?, self.at(5, t, h)?);
                        for ((y, row), &v) in out.iter_mut().zip(st.chunks_exact_mut(n)).zip(v) {
                            let sa = dot(a, row);
                            for (((s, &w), &k), &b) in row.iter_mut().zip(w).zip(k).zip(b) {
                                *s = *s * w + v * k + sa * b;
                            }
                            *y = dot(row, r);
                        }
                    }
                }
            }
        }
        Ok(WkvOut {
            seq,
            heads,
            y,
            state,
        })
    }
}

/// RWKV_WKV6 / RWKV_WKV7 / GATED_LINEAR_ATTN, by `op`.
pub(super) fn wkv(node: &Node<'_>, mut dst: Dst<'_>, op: WkvOp) -> Result<()> {
    let (key, count) = match op {
        WkvOp::Rwkv6 => (0, 6),
        WkvOp::Rwkv7 => (2, 7),
        WkvOp::GatedLinearAttn { .. } => (0, 5),
    };
    let key_layout = node.view(key)?.layout;
    let (head_size, heads, tokens) = (key_layout.ne[0], key_layout.ne[1], key_layout.ne[2]);
    let states = node.view(count - 1)?;
    let n_seqs = states.layout.ne[1];
    let mut inputs = Vec::with_capacity(count - 1);
    let mut time_first = Scratch::default();
    for slot in 0..count - 1 {
        let values = widen_all(node, &node.view(slot)?)?;
        if op == WkvOp::Rwkv6 && slot == 3 {
            time_first = values;
        } else {
            inputs.push(values);
        }
    }
    let wkv = Wkv {
        op,
        inputs,
        time_first,
        states: widen_all(node, &states)?,
        head_size,
        heads,
        seq_tokens: tokens
            .checked_div(n_seqs)
            .ok_or_else(|| internal("a recurrence without sequences"))?,
    };
    let head_cost = tokens.saturating_mul(head_size).saturating_mul(head_size);
    let chunk = node.pool.chunk(heads, head_cost).max(1);
    let items: Vec<(usize, Range<usize>)> = (0..n_seqs)
        .flat_map(|seq| {
            (0..heads)
                .step_by(chunk)
                .map(move |start| (seq, start..(start + chunk).min(heads)))
        })
        .collect();
    let mut outs: Vec<Option<WkvOut>> = Vec::new();
    outs.resize_with(items.len(), || None);
    let work: Vec<_> = items.into_iter().zip(outs.iter_mut()).collect();
    node.pool.run(work, &|((seq, heads), out)| {
        *out = Some(wkv.run(seq, heads)?);
        Ok(())
    })?;
    store_wkv(&wkv, tokens, &mut dst, outs)
}

/// Writes the items' outputs (row = token) and final states (flat after the outputs).
fn store_wkv(wkv: &Wkv, tokens: usize, dst: &mut Dst<'_>, outs: Vec<Option<WkvOut>>) -> Result<()> {
    let n = wkv.head_size;
    let width = n * wkv.heads;
    let mut bytes = Vec::new();
    let mut parts = dst.split_rows(usize::MAX);
    let part = &mut parts
        .next()
        .ok_or_else(|| internal("a recurrence's destination has no part"))?;
    for out in &outs {
        let out = out
            .as_ref()
            .ok_or_else(|| internal("a recurrence item left no result"))?;
        let (h0, count) = (out.heads.start, out.heads.len());
        for (local_t, y) in out.y.chunks_exact((count * n).max(1)).enumerate() {
            let t = out.seq * wkv.seq_tokens + local_t;
            store_f32(part, t, h0 * n, y, &mut bytes)?;
        }
        if tokens == 0 {
            // ggml writes a sequence's state while scanning its tokens: none here
            continue;
        }
        // the state's flat position after the outputs, written row piece by row piece
        let mut flat = (out.seq * wkv.heads + h0) * n * n;
        let mut rest = out.state.as_slice();
        while !rest.is_empty() {
            let (row, col) = (tokens + flat / width, flat % width);
            let (piece, tail) = rest.split_at(rest.len().min(width - col));
            store_f32(part, row, col, piece, &mut bytes)?;
            flat += piece.len();
            rest = tail;
        }
    }
    Ok(())
}
