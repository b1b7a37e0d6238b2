//! SSM_CONV and SSM_SCAN, the state-space layers of Mamba 1 / 2 and their relatives (Jamba,
//! Falcon-H1, Granite 4, LFM2's short convolution), with ggml-cpu's arithmetic (`ops.cpp`,
//! `ggml_compute_forward_ssm_conv_f32` / `..._ssm_scan_f32`), all in f32:
//!
//! * SSM_CONV: output `(i1, t, s)` is `sum(sx[t + i0, i1, s] * c[i0, i1])` over the `d_conv`
//!   taps, added in tap order from 0 (ggml's own loop, not its f64 dot product);
//! * SSM_SCAN: per sequence, head and token, `dt' = softplus(dt)`, then for every row `i1` of
//!   the head's state and every state element `i0`:
//!   `state = state * exp(dt' * A) + B[i0] * (x[i1] * dt')` and `y[i1] = sum(state * C)`.
//!   `A` is one value per head (Mamba 2, `A.ne0 == 1`) or one per state element (Mamba 1);
//!   `B` and `C` are shared by the `n_head / n_group` consecutive heads of a group. A
//!   sequence starts from state `ids[s]` of `s`; the destination holds the outputs, then the
//!   final state of every sequence, then for `K > 1` the states `1..K` tokens before the end
//!   (slot `k` of sequence `s` at state index `k * n_seqs + s`), written only for tokens that
//!   exist (ggml leaves the other slots as they were).
//!
//! ggml adds Mamba 2's `sum(state * C)` in SIMD partial sums and Mamba 1's in order; here the
//! former is [`dot`] (eight partial sums), the latter in order too. The states themselves are
//! element-wise, the same bits as ggml's.
//!
//! Threads: SSM_CONV splits the output rows (tokens); SSM_SCAN splits every sequence's heads,
//! each item scanning its heads over all tokens into its own buffers, which are then stored
//! (the outputs of a head are not one tile of the 1-D destination). Every value is computed
//! the same way whatever the split.

use proto_core::{Error, Result};

use crate::compute::memory::{Dst, DstPart};
use crate::compute::scratch::Scratch;
use crate::compute::view::{encode, internal, Scalar, SrcView};

use super::{dot, widen_all, Node};

/// Stores f32 values at column `col` of row `row` of an F32 destination.
pub(super) fn store_f32(
    part: &mut DstPart<'_>,
    row: usize,
    col: usize,
    values: &[f32],
    bytes: &mut Vec<u8>,
) -> Result<()> {
    if cfg!(target_endian = "little") {
        // F32 little-endian is the values' own bytes: no encoding copy
        return part.write(row, col, bytemuck::cast_slice(values));
    }
    bytes.resize(values.len() * 4, 0);
    encode(Scalar::F32, values, bytes);
    part.write(row, col, bytes)
}

/// `values[start..start + len]`, or an internal error (the plan's shape checks make every
/// range used here valid).
pub(super) fn span(values: &[f32], start: usize, len: usize) -> Result<&[f32]> {
    start
        .checked_add(len)
        .and_then(|end| values.get(start..end))
        .ok_or_else(|| internal("an SSM index outside its checked source"))
}

/// `values[i]`, or an internal error.
fn value(values: &[f32], i: usize) -> Result<f32> {
    values
        .get(i)
        .copied()
        .ok_or_else(|| internal("an SSM index outside its checked source"))
}

/// ggml's `ggml_compute_softplus_f32`: `log(1 + exp(x))`, or `x` itself above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// SSM_CONV: sources `sx {d_conv - 1 + n_t, d_inner, n_s}` and `c {d_conv, d_inner}`.
pub(super) fn ssm_conv(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (sx, c) = (node.view(0)?, node.view(1)?);
    let (window, d_conv, d_inner) = (sx.layout.ne[0], c.layout.ne[0], c.layout.ne[1]);
    // every row of both is read once per output token: widened once
    let sx = widen_all(node, &sx)?;
    let c = widen_all(node, &c)?;
    let layout = *dst.layout();
    let chunk = node
        .pool
        .chunk(layout.rows(), d_inner.saturating_mul(d_conv));
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || (vec![0.0f32; d_inner], Vec::new()),
        |(out, bytes), mut part: DstPart<'_>| {
            for r in part.rows() {
                let [token, seq, _] = layout.row_index(r);
                for (channel, value) in out.iter_mut().enumerate() {
                    // the channel's row of sx, from this token's first tap
                    let row = (seq * d_inner + channel) * window;
                    let taps = span(&sx, row + token, d_conv)?;
                    let weights = span(&c, channel * d_conv, d_conv)?;
                    *value = taps
                        .iter()
                        .zip(weights)
                        .fold(0.0f32, |sum, (x, w)| sum + x * w);
                }
                store_f32(&mut part, r, 0, out, bytes)?;
            }
            Ok(())
        },
    )
}

/// SSM_SCAN's sources as f32, and its sizes.
struct Scan<'a> {
    /// The initial states, read per row (`{d_state, head_dim, n_head, n_rs}`): only the rows
    /// of the sequences' states are read, the rest of a recurrent-state cache is not copied.
    states: SrcView<'a>,
    /// `{head_dim, n_head, n_tokens, n_seqs}`, flat.
    x: Scratch<f32>,
    /// `{n_head, n_tokens, n_seqs}`, flat.
    dt: Scratch<f32>,
    /// `{1 or d_state, n_head}`, flat.
    a: Scratch<f32>,
    /// `{d_state, n_group, n_tokens, n_seqs}`, flat.
    b: Scratch<f32>,
    /// Same shape as `b`.
    c: Scratch<f32>,
    d_state: usize,
    head_dim: usize,
    n_head: usize,
    n_group: usize,
    n_tokens: usize,
    n_seqs: usize,
    /// Mamba 1: `A` holds one decay rate per state element instead of one per head.
    per_state_decay: bool,
}

/// What one work item (one sequence, a run of heads) computed.
struct ScanOut {
    seq: usize,
    heads: std::ops::Range<usize>,
    /// The outputs, `[token][head][row]`.
    y: Vec<f32>,
    /// The final states of the heads, `[head][row][state]`.
    last: Vec<f32>,
    /// The states `k` tokens before the end, `k = 1..` (same layout each).
    snapshots: Vec<Vec<f32>>,
}

impl Scan<'_> {
    /// Scans the heads `heads` of sequence `seq`, starting from state `first` of `s`, over every
    /// token; keeps the states `1..snapshots` tokens before the end.
    fn run(
        &self,
        seq: usize,
        first: usize,
        heads: std::ops::Range<usize>,
        snapshots: usize,
    ) -> Result<ScanOut> {
        let (nc, nr, nh, nt) = (self.d_state, self.head_dim, self.n_head, self.n_tokens);
        let count = heads.len();
        let head_state = nr * nc;
        let mut state = vec![0.0f32; count * head_state];
        for (local, h) in heads.clone().enumerate() {
            for row in 0..nr {
                let at = (local * nr + row) * nc;
                self.states
                    .load_f32([row, h, first], span_mut(&mut state, at, nc)?)?;
            }
        }
        let mut y = vec![0.0f32; nt * count * nr];
        let mut kept = Vec::new();
        let mut decay = vec![0.0f32; nc];
        let heads_per_group = nh / self.n_group;
        for token in 0..nt {
            let step = seq * nt + token;
            for (local, h) in heads.clone().enumerate() {
                let dt = softplus(value(&self.dt, step * nh + h)?);
                let group = step * self.n_group + h / heads_per_group;
                let b = span(&self.b, group * nc, nc)?;
                let c = span(&self.c, group * nc, nc)?;
                let x = span(&self.x, (step * nh + h) * nr, nr)?;
                let out = span_mut(&mut y, (token * count + local) * nr, nr)?;
                let head = span_mut(&mut state, local * head_state, head_state)?;
                if self.per_state_decay {
                    // the same exp(dt * A) for every row of the head
                    let a = span(&self.a, h * nc, nc)?;
                    for (d, &a) in decay.iter_mut().zip(a) {
                        *d = (dt * a).exp();
                    }
                    for ((y, &x), row) in out.iter_mut().zip(x).zip(head.chunks_exact_mut(nc)) {
                        let x_dt = x * dt;
                        let mut sum = 0.0f32;
                        for (((s, &d), &b), &c) in row.iter_mut().zip(&decay).zip(b).zip(c) {
                            *s = *s * d + b * x_dt;
                            sum += *s * c;
                        }
                        *y = sum;
                    }
                } else {
                    let d = (dt * value(&self.a, h)?).exp();
                    for ((y, &x), row) in out.iter_mut().zip(x).zip(head.chunks_exact_mut(nc)) {
                        let x_dt = x * dt;
                        for (s, &b) in row.iter_mut().zip(b) {
                            *s = *s * d + b * x_dt;
                        }
                        *y = dot(row, c);
                    }
                }
            }
            // ggml's slot `nt - 1 - token`: the state this many tokens before the end
            let back = nt - 1 - token;
            if back > 0 && back < snapshots {
                kept.push(state.clone());
            }
        }
        // kept in token order: nearest the end last
        kept.reverse();
        Ok(ScanOut {
            seq,
            heads,
            y,
            last: state,
            snapshots: kept,
        })
    }
}

/// `values[start..start + len]` for writing, or an internal error.
pub(super) fn span_mut(values: &mut [f32], start: usize, len: usize) -> Result<&mut [f32]> {
    start
        .checked_add(len)
        .and_then(|end| values.get_mut(start..end))
        .ok_or_else(|| internal("an SSM index outside its scratch buffer"))
}

/// SSM_SCAN: sources `s, x, dt, A, B, C, ids`; `snapshots` is `K`.
pub(super) fn ssm_scan(node: &Node<'_>, mut dst: Dst<'_>, snapshots: usize) -> Result<()> {
    let states = node.view(0)?;
    let (x, b) = (node.view(1)?, node.view(4)?);
    let a = node.view(3)?;
    let ids = node.view(6)?;
    let (n_head, n_tokens, n_seqs) = (x.layout.ne[1], x.layout.ne[2], x.layout.ne[3]);
    // every sequence's starting state, checked before anything is written
    let firsts = (0..n_seqs)
        .map(|seq| {
            usize::try_from(ids.index_at([seq, 0, 0, 0]))
                .ok()
                .filter(|&id| id < states.layout.ne[3])
                .ok_or(Error::OutOfBounds(
                    "SSM_SCAN sequence id outside the states",
                ))
        })
        .collect::<Result<Vec<_>>>()?;
    let scan = Scan {
        states,
        x: widen_all(node, &x)?,
        dt: widen_all(node, &node.view(2)?)?,
        a: widen_all(node, &a)?,
        b: widen_all(node, &b)?,
        c: widen_all(node, &node.view(5)?)?,
        d_state: states.layout.ne[0],
        head_dim: x.layout.ne[0],
        n_head,
        n_group: b.layout.ne[1],
        n_tokens,
        n_seqs,
        per_state_decay: a.layout.ne[0] != 1,
    };
    let head_cost = n_tokens
        .saturating_mul(scan.head_dim)
        .saturating_mul(scan.d_state);
    let chunk = node.pool.chunk(n_head, head_cost);
    let mut outs: Vec<Option<ScanOut>> = Vec::new();
    let mut items = Vec::new();
    for (seq, &first) in firsts.iter().enumerate() {
        for start in (0..n_head).step_by(chunk.max(1)) {
            items.push((seq, first, start..(start + chunk).min(n_head)));
        }
    }
    outs.resize_with(items.len(), || None);
    let work: Vec<_> = items.into_iter().zip(outs.iter_mut()).collect();
    node.pool.run(work, &|((seq, first, heads), out)| {
        *out = Some(scan.run(seq, first, heads, snapshots)?);
        Ok(())
    })?;
    store_scan(&scan, &mut dst, outs)
}

/// Writes the items' outputs and states where ggml puts them in the 1-D destination.
fn store_scan(scan: &Scan<'_>, dst: &mut Dst<'_>, outs: Vec<Option<ScanOut>>) -> Result<()> {
    let (nr, nc, nh, nt) = (scan.head_dim, scan.d_state, scan.n_head, scan.n_tokens);
    let outputs = nr * nh * nt * scan.n_seqs;
    let sequence_states = nc * nr * nh;
    let mut bytes = Vec::new();
    for mut part in dst.split_rows(1) {
        for out in &outs {
            let out = out
                .as_ref()
                .ok_or_else(|| internal("an SSM_SCAN item left no result"))?;
            let (seq, h0, count) = (out.seq, out.heads.start, out.heads.len());
            for (token, y) in out.y.chunks_exact((count * nr).max(1)).enumerate() {
                let col = ((seq * nt + token) * nh + h0) * nr;
                store_f32(&mut part, 0, col, y, &mut bytes)?;
            }
            if nt == 0 {
                // ggml writes a sequence's states while scanning its tokens: none here
                continue;
            }
            let states = std::iter::once(&out.last).chain(&out.snapshots);
            for (slot, state) in states.enumerate() {
                let at = (slot * scan.n_seqs + seq) * sequence_states + h0 * nr * nc;
                store_f32(&mut part, 0, outputs + at, state, &mut bytes)?;
            }
        }
    }
    Ok(())
}
