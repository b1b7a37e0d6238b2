//! GATED_DELTA_NET: the gated delta rule of Qwen3-Next / Qwen3.5 / Kimi-Linear, one
//! (head, sequence) at a time, token after token, as ggml's CPU kernel computes it (`ops.cpp`).
//!
//! The state of a head is an `S_v x S_v` matrix `S`, stored transposed: row `j` of the stored
//! matrix `M` is column `j` of `S` (`M[j][i] = S[i][j]`), so every step below walks rows. Per
//! token, with `q`, `k`, `v` rows of `S_v`, the gate `g` (one value, or one per row of `S`
//! for KDA) and `beta`:
//!
//! 1. decay: `M *= exp(g)`, or `M[j][i] *= exp(g[i])` for a per-row gate;
//! 2. `delta[j] = (v[j] - M[j] · k) * beta`;
//! 3. `M[j][i] += k[i] * delta[j]`;
//! 4. output `o[j] = (M[j] · q) / sqrt(S_v)`.
//!
//! The destination is `[S_v * H, T * B + K * S_v * B]`: the outputs, token rows of every
//! sequence, then `K` snapshot slots of states, slot `s` holding the state after token
//! `T - 1 - s` (slot 0: the final state). With fewer tokens than slots only the first `T`
//! slots are written; the others keep their bytes (ggml leaves them to the caller). With
//! `K = 1` slot 0 is the final state whatever `T` (the initial state when there are no
//! tokens).
//!
//! Heads are the unit of work: each computes into its own part of a scratch copy of its
//! outputs and snapshots (no bigger than the destination), written out once all are done, so
//! any thread count gives the same bytes.

use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::view::{encode, internal, Scalar, SrcView};

use super::{dot, Node};

/// The sources, in ggml's slot order.
struct Sources<'a> {
    q: SrcView<'a>,
    k: SrcView<'a>,
    v: SrcView<'a>,
    gate: SrcView<'a>,
    beta: SrcView<'a>,
    state: SrcView<'a>,
}

/// The sizes every head shares.
#[derive(Clone, Copy)]
struct Dims {
    /// Row length of q, k, v (and side of the state).
    s_v: usize,
    /// Heads of v (and of the state).
    heads: usize,
    /// Tokens per sequence.
    tokens: usize,
    /// Snapshot slots the destination has.
    snapshots: usize,
    /// Snapshot slots written: 1 for `K = 1`, otherwise `min(K, T)`.
    written: usize,
    /// One gate per row of the state (KDA) rather than one per token.
    gate_per_row: bool,
}

/// Scratch of one thread: the state, the rows of one token, the deltas.
struct Scratch {
    state: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    decay: Vec<f32>,
    delta: Vec<f32>,
}

pub(super) fn gated_delta_net(node: &Node<'_>, mut dst: Dst<'_>, snapshots: usize) -> Result<()> {
    let src = Sources {
        q: node.view(0)?,
        k: node.view(1)?,
        v: node.view(2)?,
        gate: node.view(3)?,
        beta: node.view(4)?,
        state: node.view(5)?,
    };
    let [s_v, heads, tokens, seqs] = src.v.layout.ne;
    let dims = Dims {
        s_v,
        heads,
        tokens,
        snapshots,
        written: if snapshots == 1 {
            1
        } else {
            snapshots.min(tokens)
        },
        // with S_v = 1 both gate forms are the same single value
        gate_per_row: src.gate.layout.ne[0] == s_v,
    };
    let units = heads * seqs;
    let out_len = tokens * s_v;
    let state_len = s_v * s_v;
    let snap_len = dims.written * state_len;
    if units == 0 || s_v == 0 {
        return Ok(());
    }
    // (the plan checked the destination's shape: these are at most its element count)
    let mut outputs = vec![0.0f32; units * out_len];
    let mut states = vec![0.0f32; units * snap_len];
    let per_unit = tokens.max(1).saturating_mul(state_len).saturating_mul(4);
    let chunk = node.pool.chunk(units, per_unit);
    let count = units.div_ceil(chunk);
    let items: Vec<(usize, &mut [f32], &mut [f32])> = pieces(&mut outputs, chunk * out_len, count)
        .into_iter()
        .zip(pieces(&mut states, chunk * snap_len, count))
        .enumerate()
        .map(|(n, (o, s))| (n * chunk, o, s))
        .collect();
    node.pool.run_with(
        items,
        || Scratch {
            state: vec![0.0; state_len],
            q: vec![0.0; s_v],
            k: vec![0.0; s_v],
            v: vec![0.0; s_v],
            decay: vec![0.0; s_v],
            delta: vec![0.0; s_v],
        },
        |scratch, (first, outs, snaps)| {
            let units_here = units.saturating_sub(first).min(chunk);
            for u in 0..units_here {
                let out = outs
                    .get_mut(u * out_len..(u + 1) * out_len)
                    .ok_or_else(|| internal("GATED_DELTA_NET output scratch too short"))?;
                let snap = snaps
                    .get_mut(u * snap_len..(u + 1) * snap_len)
                    .ok_or_else(|| internal("GATED_DELTA_NET state scratch too short"))?;
                let unit = first + u;
                run_head(&src, dims, unit % heads, unit / heads, scratch, out, snap)?;
            }
            Ok(())
        },
    )?;
    write_out(&mut dst, dims, seqs, &outputs, &states)
}

/// `count` consecutive pieces of `buf` of `len` values each (the last may be shorter), for
/// the items of the pool; `count` empty pieces when each is empty (`chunks_mut` refuses a
/// zero length).
fn pieces(buf: &mut [f32], len: usize, count: usize) -> Vec<&mut [f32]> {
    if len == 0 {
        return (0..count).map(|_| <&mut [f32]>::default()).collect();
    }
    buf.chunks_mut(len).collect()
}

/// `len` values of `buf` from `at`.
fn segment(buf: &[f32], at: usize, len: usize) -> Result<&[f32]> {
    at.checked_add(len)
        .and_then(|end| buf.get(at..end))
        .ok_or_else(|| internal("GATED_DELTA_NET scratch too short"))
}

/// Runs head `h` of sequence `seq` over its tokens: its outputs into `out` (`T` rows of `S_v`),
/// its snapshots into `snap` (`written` states, slot order).
fn run_head(
    src: &Sources<'_>,
    dims: Dims,
    h: usize,
    seq: usize,
    scratch: &mut Scratch,
    out: &mut [f32],
    snap: &mut [f32],
) -> Result<()> {
    let Dims {
        s_v,
        tokens,
        snapshots,
        written,
        gate_per_row,
        ..
    } = dims;
    let Scratch {
        state,
        q,
        k,
        v,
        decay,
        delta,
    } = scratch;
    // q and k may have fewer heads (taken modulo) and fewer sequences (each shared by
    // `seqs / ne3` consecutive sequences), as ggml indexes them
    let seqs = src.v.layout.ne[3];
    let (qh, qs) = (h % src.q.layout.ne[1], seq / (seqs / src.q.layout.ne[3]));
    let (kh, ks) = (h % src.k.layout.ne[1], seq / (seqs / src.k.layout.ne[3]));
    for (j, row) in state.chunks_exact_mut(s_v).enumerate() {
        src.state.load_f32([j, h, seq], row)?;
    }
    let scale = 1.0 / (s_v as f32).sqrt();
    for t in 0..tokens {
        src.q.load_f32([qh, t, qs], q)?;
        src.k.load_f32([kh, t, ks], k)?;
        src.v.load_f32([h, t, seq], v)?;
        let beta = src.beta.value([0, h, t, seq]);
        if gate_per_row {
            src.gate.load_f32([h, t, seq], decay)?;
            decay.iter_mut().for_each(|g| *g = g.exp());
            for row in state.chunks_exact_mut(s_v) {
                row.iter_mut().zip(decay.iter()).for_each(|(m, d)| *m *= d);
            }
        } else {
            let d = src.gate.value([0, h, t, seq]).exp();
            state.iter_mut().for_each(|m| *m *= d);
        }
        for ((d, row), &v) in delta.iter_mut().zip(state.chunks_exact(s_v)).zip(v.iter()) {
            *d = (v - dot(row, k)) * beta;
        }
        for (row, &d) in state.chunks_exact_mut(s_v).zip(delta.iter()) {
            row.iter_mut().zip(k.iter()).for_each(|(m, &k)| *m += k * d);
        }
        let o = &mut out[t * s_v..(t + 1) * s_v];
        for (o, row) in o.iter_mut().zip(state.chunks_exact(s_v)) {
            *o = dot(row, q) * scale;
        }
        // slot `T - 1 - t`, if the destination has it (K > 1: every recent state is kept)
        let slot = tokens - 1 - t;
        if snapshots > 1 && slot < written {
            snap[slot * state.len()..(slot + 1) * state.len()].copy_from_slice(state);
        }
    }
    if snapshots == 1 {
        snap.copy_from_slice(state);
    }
    Ok(())
}

/// Writes every head's outputs and snapshots into the destination rows they belong to.
fn write_out(
    dst: &mut Dst<'_>,
    dims: Dims,
    seqs: usize,
    outputs: &[f32],
    states: &[f32],
) -> Result<()> {
    let Dims {
        s_v,
        heads,
        tokens,
        written,
        ..
    } = dims;
    let width = s_v * heads;
    let (out_len, state_len) = (tokens * s_v, s_v * s_v);
    let snap_len = written * state_len;
    let rows = dst.layout().rows();
    let mut parts = dst.split_rows(rows);
    let part = &mut parts
        .next()
        .ok_or_else(|| internal("GATED_DELTA_NET without a destination part"))?;
    let mut row = vec![0.0f32; width];
    let mut bytes = vec![0u8; width * 4];
    // outputs: row `seq * T + t`, head `h` at columns `h * S_v ..`
    for seq in 0..seqs {
        for t in 0..tokens {
            for (h, cols) in row.chunks_exact_mut(s_v).enumerate() {
                let unit = seq * heads + h;
                cols.copy_from_slice(segment(outputs, unit * out_len + t * s_v, s_v)?);
            }
            encode(Scalar::F32, &row, &mut bytes);
            part.write(seq * tokens + t, 0, &bytes)?;
        }
    }
    // snapshots: slot `s` of sequence `seq` is `S_v` rows holding the heads' states one after
    // the other
    let first_state_row = tokens * seqs;
    let mut plane = vec![0.0f32; heads * state_len];
    for slot in 0..written {
        for seq in 0..seqs {
            for (h, state) in plane.chunks_exact_mut(state_len).enumerate() {
                let unit = seq * heads + h;
                state.copy_from_slice(segment(
                    states,
                    unit * snap_len + slot * state_len,
                    state_len,
                )?);
            }
            let base = first_state_row + (slot * seqs + seq) * s_v;
            for (i, values) in plane.chunks_exact(width).enumerate() {
                encode(Scalar::F32, values, &mut bytes);
                part.write(base + i, 0, &bytes)?;
            }
        }
    }
    Ok(())
}
