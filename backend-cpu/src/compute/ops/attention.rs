//! FLASH_ATTN_EXT, one query row per destination row.
//!
//! Layouts (ggml's `ggml_flash_attn_ext`): `q [DK, n_q, n_head, ne3]`, `k [DK, n_kv, n_head_kv,
//! ne3_kv]`, `v [DV, n_kv, ...]`, mask `[>= n_kv, >= n_q, m2, m3]`, sinks `[n_head]`; the result
//! is `[DV, n_head, n_q, ne3]` (heads and queries swapped: `permute(0, 2, 1, 3)`). K/V heads
//! broadcast over query heads (`n_head / n_head_kv` query heads per KV head).
//!
//! For query `(iq1, head h, iq3)`: `s_c = softcap · tanh(q·k_c · scale / softcap) + slope(h) ·
//! mask[c, iq1]` (without soft-capping `q·k_c · scale + slope · mask`), entries whose mask is
//! -inf skipped; the output is the softmax-weighted sum of the `v_c`, where an attention sink
//! adds `exp(sink_h - max)` to the denominator only. All in f32 with K and V widened to f32
//! (the precision of ggml's tiled path; its one-row path keeps V sums in f16 for F16 V, within
//! the same tolerance); the exponential sum in f64. A row with every key masked gives zeros, as
//! in ggml.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::view::{encode, Scalar, SrcView};

use super::{alibi_slope, dot, widen_all, Node};

/// Most f32 values that K and V may be widened to up front (256 MiB).
const WIDEN_LIMIT: usize = 64 << 20;

/// K or V rows as f32: widened once for the node when each row is read by many queries,
/// converted at each use otherwise (one query, or a cache too large to copy).
enum KvRows<'a> {
    Widened { values: Vec<f32>, view: SrcView<'a> },
    Direct(SrcView<'a>),
}

impl KvRows<'_> {
    /// Row `idx`, borrowed from the widened copy or converted into `scratch`.
    fn row<'s>(&'s self, idx: [usize; 3], scratch: &'s mut [f32]) -> Result<&'s [f32]> {
        match self {
            KvRows::Widened { values, view } => {
                let width = view.layout.ne[0];
                let start = view.layout.row_number(idx) * width;
                Ok(&values[start..start + width])
            }
            KvRows::Direct(view) => {
                view.load_f32(idx, scratch)?;
                Ok(scratch)
            }
        }
    }
}

pub(super) fn flash_attn(
    node: &Node<'_>,
    mut dst: Dst<'_>,
    scale: f32,
    max_bias: f32,
    softcap: f32,
) -> Result<()> {
    let (q, k, v) = (node.view(0)?, node.view(1)?, node.view(2)?);
    let mask = node.optional_view(3)?;
    let sinks = node.optional_view(4)?;
    let layout = *dst.layout();
    let (dk, dv) = (q.layout.ne[0], v.layout.ne[0]);
    let n_kv = k.layout.ne[1];
    let n_head = q.layout.ne[2];
    let scale = if softcap != 0.0 {
        scale / softcap
    } else {
        scale
    };
    // query heads per K/V head, batches per K/V batch
    let (rk2, rk3) = (n_head / k.layout.ne[2], q.layout.ne[3] / k.layout.ne[3]);
    let (rv2, rv3) = (n_head / v.layout.ne[2], q.layout.ne[3] / v.layout.ne[3]);
    // each K/V row serves every query of the heads sharing it
    let uses = q.layout.ne[1] * rk2;
    let widen = uses >= 8 && (k.layout.elements() + v.layout.elements()) <= WIDEN_LIMIT;
    let (k, v) = if widen {
        (
            KvRows::Widened {
                values: widen_all(node, &k)?,
                view: k,
            },
            KvRows::Widened {
                values: widen_all(node, &v)?,
                view: v,
            },
        )
    } else {
        (KvRows::Direct(k), KvRows::Direct(v))
    };
    let chunk = node.pool.chunk(layout.rows(), n_kv * (dk + dv));
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut qrow = vec![0.0f32; dk];
        let mut krow = vec![0.0f32; dk];
        let mut vrow = vec![0.0f32; dv];
        let mut mrow = vec![0.0f32; mask.map_or(0, |m| m.layout.ne[0])];
        let mut scores = vec![f32::NEG_INFINITY; n_kv];
        let mut acc = vec![0.0f32; dv];
        let mut bytes = vec![0u8; dv * 4];
        for r in part.rows() {
            // destination row (head, query, batch)
            let [h, iq1, iq3] = layout.row_index(r);
            q.load_f32([iq1, h, iq3], &mut qrow)?;
            let slope = alibi_slope(max_bias, n_head, h);
            if let Some(m) = &mask {
                m.load_f32([iq1, h % m.layout.ne[2], iq3 % m.layout.ne[3]], &mut mrow)?;
            }
            let (ik2, ik3) = (h / rk2, iq3 / rk3);
            let mut max = f32::NEG_INFINITY;
            for (c, score) in scores.iter_mut().enumerate() {
                let mv = if mask.is_some() { slope * mrow[c] } else { 0.0 };
                if mv == f32::NEG_INFINITY {
                    *score = f32::NEG_INFINITY;
                    continue;
                }
                let krow = k.row([c, ik2, ik3], &mut krow)?;
                let mut s = dot(&qrow, krow) * scale;
                if softcap != 0.0 {
                    s = softcap * s.tanh();
                }
                s += mv;
                *score = s;
                if s > max {
                    max = s;
                }
            }
            let (iv2, iv3) = (h / rv2, iq3 / rv3);
            acc.iter_mut().for_each(|a| *a = 0.0);
            let mut sum = 0.0f64;
            if max != f32::NEG_INFINITY {
                for (c, &s) in scores.iter().enumerate() {
                    if s == f32::NEG_INFINITY {
                        continue;
                    }
                    let weight = (s - max).exp();
                    sum += f64::from(weight);
                    let vrow = v.row([c, iv2, iv3], &mut vrow)?;
                    acc.iter_mut()
                        .zip(vrow)
                        .for_each(|(a, &v)| *a += weight * v);
                }
            }
            if let Some(sinks) = &sinks {
                let sink = sinks.value([h, 0, 0, 0]);
                if sink > max {
                    // the sink is the new maximum: rescale what was summed so far
                    let ms = (max - sink).exp();
                    acc.iter_mut().for_each(|a| *a *= ms);
                    sum = sum * f64::from(ms) + 1.0;
                } else {
                    sum += f64::from((sink - max).exp());
                }
            }
            let inv = if sum == 0.0 { 0.0 } else { (1.0 / sum) as f32 };
            acc.iter_mut().for_each(|a| *a *= inv);
            encode(Scalar::F32, &acc, &mut bytes);
            part.write(r, 0, &bytes)?;
        }
        Ok(())
    })
}
