//! ggml-cpu's tiled FLASH_ATTN_EXT path (`ggml_compute_forward_flash_attn_ext_tiled`): up to
//! [`TILE_Q`] queries of one head at a time against [`TILE_KV`] keys at a time, all in f32.
//!
//! For each tile of keys: the scores are one matrix product (queries × K tile, K transposed so
//! the keys are the vector lanes), scaled, soft-capped and masked; each query's running
//! maximum and exponential sum are updated once per tile (a new maximum rescales the value
//! sums), and the value sums gain the product of the tile's weights and V rows. The products
//! sum in ggml's order ([`gemm_acc`]); the exponential is `expf` exactly where ggml uses a
//! close vector approximation.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::quant;
use crate::compute::scratch as spare;
use crate::compute::view::{encode, Scalar};

use super::super::{alibi_slope, Node};
use super::gemm::gemm_acc;
use super::{Attention, KvRows};

/// Queries per tile (`GGML_FA_TILE_Q`).
const TILE_Q: usize = 64;
/// Keys per tile (`GGML_FA_TILE_KV`).
const TILE_KV: usize = 64;

/// One thread's working memory, reused for every tile it runs (and, through the thread's
/// spares, by the next node).
struct Scratch {
    /// The tile's queries, `TILE_Q × dk`.
    q: spare::Scratch<f32>,
    /// The K tile transposed, `dk × TILE_KV` (keys contiguous).
    k_t: spare::Scratch<f32>,
    /// Scores, then weights, `TILE_Q × TILE_KV`.
    kq: spare::Scratch<f32>,
    /// The mask tile (`slope` applied), `TILE_Q × TILE_KV`.
    mask_tile: spare::Scratch<f32>,
    /// The mask rows of the tile's queries (`slope` not applied), `TILE_Q × n_kv`, and for
    /// which (first query, queries, mask plane) they were loaded.
    mask: spare::Scratch<f32>,
    mask_of: Option<(usize, usize, [usize; 2])>,
    /// One mask row as the view loads it (`mask ne0` values).
    mask_row: spare::Scratch<f32>,
    /// The V tile, `TILE_KV × dv`.
    v: spare::Scratch<f32>,
    /// Value sums, `TILE_Q × dv`.
    acc: spare::Scratch<f32>,
    /// Each query's running maximum and exponential sum.
    max: [f32; TILE_Q],
    sum: [f32; TILE_Q],
    /// Rows converted from unwidened K / V.
    k_row: spare::Scratch<f32>,
    v_row: spare::Scratch<f32>,
    /// One output row as bytes.
    bytes: spare::Scratch<u8>,
}

/// Runs the node over `k` and `v` as f32 rows.
pub(super) fn run(
    att: &Attention<'_>,
    k: &KvRows<'_>,
    v: &KvRows<'_>,
    node: &Node<'_>,
    mut dst: Dst<'_>,
) -> Result<()> {
    let layout = *dst.layout();
    let (dk, dv) = (att.q.layout.ne[0], att.v.layout.ne[0]);
    let n_kv = att.k.layout.ne[1];
    let n_head = att.q.layout.ne[2].max(1);
    let mask_width = att.mask.map_or(0, |m| m.layout.ne[0]);
    // Parts of whole query positions (every head of a query), so that a part holds tiles of
    // consecutive queries of one head: destination rows run over heads first.
    let positions = layout.rows() / n_head;
    // A part's queries make its tiles, and every tile reloads (and transposes) its K/V tiles:
    // parts as short as the pool's usual share (a prompt of 64 queries cut into 8 parts) would
    // load each K/V tile 8 times per head. Parts hold at least a full tile, or an even share
    // of the queries between the threads when there are fewer (ggml's chunks, one head each,
    // give its tiles the same length).
    let share = positions.div_ceil(node.pool.threads()).clamp(1, TILE_Q);
    let chunk = node
        .pool
        .chunk(positions, n_head * n_kv * (dk + dv))
        .max(share);
    let parts = dst.split_rows(chunk * n_head);
    node.pool.run_with(
        parts,
        || Scratch {
            q: spare::zeroed(TILE_Q * dk),
            k_t: spare::zeroed(dk * TILE_KV),
            kq: spare::zeroed(TILE_Q * TILE_KV),
            mask_tile: spare::zeroed(TILE_Q * TILE_KV),
            mask: spare::with_capacity(att.mask.map_or(0, |_| TILE_Q * n_kv)),
            mask_of: None,
            mask_row: spare::zeroed(mask_width),
            v: spare::zeroed(TILE_KV * dv),
            acc: spare::zeroed(TILE_Q * dv),
            max: [f32::NEG_INFINITY; TILE_Q],
            sum: [0.0; TILE_Q],
            k_row: spare::zeroed(dk),
            v_row: spare::zeroed(dv),
            bytes: spare::zeroed(dv * 4),
        },
        |scratch, mut part: DstPart<'_>| {
            let rows = part.rows();
            let mut position = rows.start / n_head;
            let end = rows.end.div_ceil(n_head);
            while position < end {
                // queries `iq1..iq1 + count` of batch `iq3`, within the part and the batch
                let [_, iq1, iq3] = layout.row_index(position * n_head);
                let n_q = layout.ne[2];
                let count = TILE_Q.min(end - position).min(n_q - iq1);
                for h in 0..n_head {
                    tile(att, k, v, scratch, [h, iq1, iq3], count)?;
                    for t in 0..count {
                        let r = (position + t) * n_head + h;
                        encode(
                            Scalar::F32,
                            &scratch.acc[t * dv..][..dv],
                            &mut scratch.bytes,
                        );
                        part.write(r, 0, &scratch.bytes)?;
                    }
                }
                position += count;
            }
            Ok(())
        },
    )
}

/// Queries `iq1..iq1 + count` of head `h`, batch `iq3`: their outputs into `scratch.acc`.
fn tile(
    att: &Attention<'_>,
    k: &KvRows<'_>,
    v: &KvRows<'_>,
    s: &mut Scratch,
    [h, iq1, iq3]: [usize; 3],
    count: usize,
) -> Result<()> {
    let (dk, dv) = (att.q.layout.ne[0], att.v.layout.ne[0]);
    let n_kv = att.k.layout.ne[1];
    let slope = alibi_slope(att.max_bias, att.q.layout.ne[2], h);
    let (ik2, ik3) = (h / att.rk[0], iq3 / att.rk[1]);
    let (iv2, iv3) = (h / att.rv[0], iq3 / att.rv[1]);
    for t in 0..count {
        att.q
            .load_f32([iq1 + t, h, iq3], &mut s.q[t * dk..][..dk])?;
    }
    if let Some(mask) = &att.mask {
        let plane = [h % mask.layout.ne[2], iq3 % mask.layout.ne[3]];
        // the same rows serve every head when the mask is broadcast over heads
        if s.mask_of != Some((iq1, count, plane)) {
            s.mask.resize(count * n_kv, 0.0);
            for t in 0..count {
                mask.load_f32([iq1 + t, plane[0], plane[1]], &mut s.mask_row)?;
                s.mask[t * n_kv..][..n_kv].copy_from_slice(&s.mask_row[..n_kv]);
            }
            s.mask_of = Some((iq1, count, plane));
        }
    }
    s.acc[..count * dv].fill(0.0);
    s.max[..count].fill(f32::NEG_INFINITY);
    s.sum[..count].fill(0.0);
    for first in (0..n_kv).step_by(TILE_KV) {
        let keys = TILE_KV.min(n_kv - first);
        let masked = &mut s.mask_tile[..count * TILE_KV];
        // the mask first: a tile that every query masks is skipped
        let mut any = att.mask.is_none();
        if att.mask.is_some() {
            for (t, row) in masked.chunks_exact_mut(TILE_KV).enumerate() {
                let mask = &s.mask[t * n_kv + first..][..keys];
                for (out, &m) in row.iter_mut().zip(mask) {
                    *out = slope * m;
                    any |= *out != f32::NEG_INFINITY;
                }
            }
            if !any {
                continue;
            }
        }
        // K tile, transposed; lanes past the last key zero
        for c in 0..keys {
            let row = k.row([first + c, ik2, ik3], &mut s.k_row)?;
            for (d, &x) in row.iter().enumerate() {
                s.k_t[d * TILE_KV + c] = x;
            }
        }
        if keys < TILE_KV {
            for d in 0..dk {
                s.k_t[d * TILE_KV + keys..][..TILE_KV - keys].fill(0.0);
            }
        }
        let scores = &mut s.kq[..count * TILE_KV];
        scores.fill(0.0);
        gemm_acc(scores, &s.q, &s.k_t, count, dk, TILE_KV);
        for (t, (row, masked)) in scores
            .chunks_exact_mut(TILE_KV)
            .zip(masked.chunks_exact(TILE_KV))
            .enumerate()
        {
            for x in row.iter_mut() {
                *x *= att.scale;
            }
            if att.softcap != 0.0 {
                for x in row.iter_mut() {
                    *x = x.tanh() * att.softcap;
                }
            }
            row[keys..].fill(f32::NEG_INFINITY);
            if att.mask.is_some() {
                for (x, &m) in row[..keys].iter_mut().zip(masked) {
                    *x += m;
                }
            }
            // online softmax: this tile's maximum, then the weights
            let tile_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if tile_max == f32::NEG_INFINITY {
                row.fill(0.0);
                continue;
            }
            let old = s.max[t];
            if tile_max > old {
                let ms = (old - tile_max).exp();
                s.acc[t * dv..][..dv].iter_mut().for_each(|a| *a *= ms);
                s.sum[t] *= ms;
                s.max[t] = tile_max;
            }
            let max = s.max[t];
            row.iter_mut().for_each(|x| *x -= max);
            quant::exp_in_place(row);
            s.sum[t] += row.iter().map(|&w| f64::from(w)).sum::<f64>() as f32;
        }
        // V tile; rows past the last key zero (their weights are zero too)
        for c in 0..keys {
            let row = v.row([first + c, iv2, iv3], &mut s.v_row)?;
            s.v[c * dv..][..dv].copy_from_slice(row);
        }
        s.v[keys * dv..].fill(0.0);
        gemm_acc(&mut s.acc, scores, &s.v, count, TILE_KV, dv);
    }
    if let Some(sinks) = &att.sinks {
        let sink = sinks.value([h, 0, 0, 0]);
        for t in 0..count {
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            if sink > s.max[t] {
                ms = (s.max[t] - sink).exp();
                s.acc[t * dv..][..dv].iter_mut().for_each(|a| *a *= ms);
            } else {
                vs = (sink - s.max[t]).exp();
            }
            s.sum[t] = s.sum[t] * ms + vs;
        }
    }
    for t in 0..count {
        let inv = if s.sum[t] == 0.0 { 0.0 } else { 1.0 / s.sum[t] };
        s.acc[t * dv..][..dv].iter_mut().for_each(|a| *a *= inv);
    }
    Ok(())
}
