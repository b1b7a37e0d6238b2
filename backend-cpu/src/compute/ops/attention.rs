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
//! adds `exp(sink_h - max)` to the denominator only. A row with every key masked gives zeros,
//! as in ggml.
//!
//! ggml-cpu computes this two ways, and so does this kernel, picking as ggml does:
//! * **one query row at a time** (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`; ggml's
//!   choice unless the tiled path applies — generation and short prompts): the query is
//!   converted to K's `vec_dot_type` (F16 for F16 K, Q8_0 for Q8_0 K, ...), each score is
//!   `quant::vec_dot` of a K row with it, the softmax is online (a new maximum rescales what
//!   was summed), and V sums are kept as ggml keeps them — in F16 for F16 V, each step rounded
//!   ([`fa_accumulate`](super::fa_accumulate)) — so greedy decoding picks the tokens llama.cpp's
//!   CPU backend picks;
//! * **tiles** (ggml's path for F32 Q, F32/F16 K and V of one type and at least 64 queries):
//!   all in f32 with K and V widened to f32, the exponential sum in f64.

use proto_core::ggml::types::id as ty;
use proto_core::{Error, Result};

use crate::compute::memory::{Dst, DstPart};
use crate::compute::quant;
use crate::compute::view::{encode, f16_to_f32, Scalar, SrcView};

use super::fa_accumulate::{mad_f16, mad_f32, scale_f16};
use super::{alibi_slope, dot, widen_all, Node};

/// Queries from which ggml-cpu takes its tiled path (`GGML_FA_TILE_Q`).
const GGML_TILE_QUERIES: usize = 64;

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
    let tiled = q.layout.type_id == ty::F32
        && matches!(k.layout.type_id, ty::F32 | ty::F16)
        && k.layout.type_id == v.layout.type_id
        && q.layout.ne[1] >= GGML_TILE_QUERIES;
    if !tiled && k.layout.dense_rows() {
        if let Some(vdt) = quant::vec_dot_type(k.layout.type_id) {
            let rows = OneRow {
                q,
                k,
                v,
                mask,
                sinks,
                vdt,
                scale,
                max_bias,
                softcap,
                rk: [rk2, rk3],
                rv: [rv2, rv3],
            };
            return rows.run(node, dst);
        }
    }
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

/// ggml-cpu's one-query-row path (see the module docs).
struct OneRow<'a> {
    q: SrcView<'a>,
    k: SrcView<'a>,
    v: SrcView<'a>,
    mask: Option<SrcView<'a>>,
    sinks: Option<SrcView<'a>>,
    /// K's `vec_dot_type`, which the query is converted to.
    vdt: u32,
    /// The score scale (already divided by `softcap` when soft-capping).
    scale: f32,
    max_bias: f32,
    softcap: f32,
    /// Query heads per K head, batches per K batch.
    rk: [usize; 2],
    /// Query heads per V head, batches per V batch.
    rv: [usize; 2],
}

impl OneRow<'_> {
    fn run(&self, node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
        let layout = *dst.layout();
        let (dk, dv) = (self.q.layout.ne[0], self.v.layout.ne[0]);
        let n_kv = self.k.layout.ne[1];
        let n_head = self.q.layout.ne[2];
        let invalid = |type_id| Error::InvalidType { type_id };
        let k_type = self.k.layout.type_id;
        let q_bytes = quant::row_size(self.vdt, dk).ok_or(invalid(self.vdt))?;
        // One score per key: the kernel runs without `quant::vec_dot`'s per-call checks, so the
        // lengths (every K row has the same) are checked once here.
        let kq_dot = quant::row_dot_kernel(k_type).ok_or(invalid(k_type))?;
        if n_kv > 0 {
            quant::vec_dot(k_type, dk, self.k.row([0, 0, 0]), &vec![0u8; q_bytes])?;
        }
        let v_f16 = self.v.layout.type_id == ty::F16 && self.v.layout.dense_rows();
        let chunk = node.pool.chunk(layout.rows(), n_kv * (dk + dv));
        let parts = dst.split_rows(chunk);
        node.pool.run(parts, &|mut part: DstPart<'_>| {
            let mut qrow = vec![0.0f32; dk];
            let mut qconv = vec![0u8; q_bytes];
            let mut vrow = vec![0.0f32; dv];
            let mut mrow = vec![0.0f32; self.mask.map_or(0, |m| m.layout.ne[0])];
            let mut acc16 = vec![0u16; if v_f16 { dv } else { 0 }];
            let mut acc = vec![0.0f32; dv];
            let mut bytes = vec![0u8; dv * 4];
            for r in part.rows() {
                let [h, iq1, iq3] = layout.row_index(r);
                self.q.load_f32([iq1, h, iq3], &mut qrow)?;
                quant::quantize_row(self.vdt, &qrow, &mut qconv)?;
                let slope = alibi_slope(self.max_bias, n_head, h);
                if let Some(m) = &self.mask {
                    m.load_f32([iq1, h % m.layout.ne[2], iq3 % m.layout.ne[3]], &mut mrow)?;
                }
                let (ik2, ik3) = (h / self.rk[0], iq3 / self.rk[1]);
                let (iv2, iv3) = (h / self.rv[0], iq3 / self.rv[1]);
                acc16.fill(0);
                acc.fill(0.0);
                let mut max = f32::NEG_INFINITY;
                let mut sum = 0.0f32;
                for c in 0..n_kv {
                    // (no mask: `mrow` is empty)
                    let mv = mrow.get(c).map_or(0.0, |&m| slope * m);
                    if mv == f32::NEG_INFINITY {
                        continue;
                    }
                    let kq = kq_dot(self.k.row([c, ik2, ik3]), &qconv);
                    let s = if self.softcap != 0.0 {
                        self.softcap.mul_add((kq * self.scale).tanh(), mv)
                    } else {
                        // ggml's `s = s*scale; ... s += mv`, contracted by its compiler
                        kq.mul_add(self.scale, mv)
                    };
                    let (mut ms, mut vs) = (1.0f32, 1.0f32);
                    if s > max {
                        // a new maximum: rescale what was summed so far
                        ms = (max - s).exp();
                        max = s;
                        if v_f16 {
                            scale_f16(&mut acc16, ms);
                        } else {
                            acc.iter_mut().for_each(|a| *a *= ms);
                        }
                    } else {
                        vs = (s - max).exp();
                    }
                    if v_f16 {
                        mad_f16(&mut acc16, self.v.row([c, iv2, iv3]), vs);
                    } else {
                        self.v.load_f32([c, iv2, iv3], &mut vrow)?;
                        mad_f32(&mut acc, &vrow, vs);
                    }
                    sum = sum.mul_add(ms, vs);
                }
                if v_f16 {
                    acc.iter_mut()
                        .zip(&acc16)
                        .for_each(|(a, &h)| *a = f16_to_f32(h));
                }
                if let Some(sinks) = &self.sinks {
                    let sink = sinks.value([h, 0, 0, 0]);
                    let (mut ms, mut vs) = (1.0f32, 1.0f32);
                    if sink > max {
                        ms = (max - sink).exp();
                        acc.iter_mut().for_each(|a| *a *= ms);
                    } else {
                        vs = (sink - max).exp();
                    }
                    sum = sum.mul_add(ms, vs);
                }
                let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                acc.iter_mut().for_each(|a| *a *= inv);
                encode(Scalar::F32, &acc, &mut bytes);
                part.write(r, 0, &bytes)?;
            }
            Ok(())
        })
    }
}
