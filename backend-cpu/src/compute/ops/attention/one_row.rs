//! ggml-cpu's one-query-row path of FLASH_ATTN_EXT (see the parent module's docs).

use proto_core::ggml::types::id as ty;
use proto_core::{Error, Result};

use crate::compute::memory::{Dst, DstPart};
use crate::compute::quant;
use crate::compute::scratch;
use crate::compute::view::{encode, f16_to_f32, Scalar};

use super::super::fa_accumulate::{mad_f16, mad_f32, scale_f16};
use super::super::{alibi_slope, Node};
use super::Attention;

/// Runs the node: each destination row (one query of one head) on its own, `vdt` being K's
/// `vec_dot_type` that the query is converted to.
pub(super) fn run(att: &Attention<'_>, vdt: u32, node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let layout = *dst.layout();
    let (dk, dv) = (att.q.layout.ne[0], att.v.layout.ne[0]);
    let n_kv = att.k.layout.ne[1];
    let n_head = att.q.layout.ne[2];
    let invalid = |type_id| Error::InvalidType { type_id };
    let k_type = att.k.layout.type_id;
    let q_bytes = quant::row_size(vdt, dk).ok_or(invalid(vdt))?;
    // One score per key: the kernel runs without `quant::vec_dot`'s per-call checks, so the
    // lengths (every K row has the same) are checked once here.
    let kq_dot = quant::row_dot_kernel(k_type).ok_or(invalid(k_type))?;
    if n_kv > 0 {
        quant::vec_dot(k_type, dk, att.k.row([0, 0, 0]), &vec![0u8; q_bytes])?;
    }
    let v_f16 = att.v.layout.type_id == ty::F16 && att.v.layout.dense_rows();
    let chunk = node.pool.chunk(layout.rows(), n_kv * (dk + dv));
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut qrow = scratch::zeroed::<f32>(dk);
        let mut qconv = scratch::zeroed::<u8>(q_bytes);
        let mut vrow = scratch::zeroed::<f32>(dv);
        let mut mrow = scratch::zeroed::<f32>(att.mask.map_or(0, |m| m.layout.ne[0]));
        let mut acc16 = scratch::zeroed::<u16>(if v_f16 { dv } else { 0 });
        let mut acc = scratch::zeroed::<f32>(dv);
        let mut bytes = scratch::zeroed::<u8>(dv * 4);
        // the mask row in `mrow`, and the live key count for it at a slope (bits)
        let mut mask_at: Option<[usize; 3]> = None;
        let mut live_for: Option<(u32, usize)> = None;
        for r in part.rows() {
            let [h, iq1, iq3] = layout.row_index(r);
            att.q.load_f32([iq1, h, iq3], &mut qrow)?;
            quant::quantize_row(vdt, &qrow, &mut qconv)?;
            let slope = alibi_slope(att.max_bias, n_head, h);
            // The heads of one query share its mask row (usually): loaded and searched once.
            let mut fresh = false;
            if let Some(m) = &att.mask {
                let at = [iq1, h % m.layout.ne[2], iq3 % m.layout.ne[3]];
                if mask_at != Some(at) {
                    m.load_f32(at, &mut mrow)?;
                    mask_at = Some(at);
                    fresh = true;
                }
            }
            let (ik2, ik3) = (h / att.rk[0], iq3 / att.rk[1]);
            let (iv2, iv3) = (h / att.rv[0], iq3 / att.rv[1]);
            acc16.fill(0);
            acc.fill(0.0);
            let mut max = f32::NEG_INFINITY;
            let mut sum = 0.0f32;
            // Keys after the last one the mask lets through are skipped below anyway (the
            // KV cache is padded well past the context in generation): stop there.
            let live = match live_for {
                Some((s, live)) if !fresh && s == slope.to_bits() => live,
                _ => {
                    let live = if mrow.len() < n_kv {
                        n_kv
                    } else {
                        mrow[..n_kv]
                            .iter()
                            .rposition(|&m| slope * m != f32::NEG_INFINITY)
                            .map_or(0, |last| last + 1)
                    };
                    live_for = Some((slope.to_bits(), live));
                    live
                }
            };
            for c in 0..live {
                // (no mask: `mrow` is empty)
                let mv = mrow.get(c).map_or(0.0, |&m| slope * m);
                if mv == f32::NEG_INFINITY {
                    continue;
                }
                let kq = kq_dot(att.k.row([c, ik2, ik3]), &qconv);
                let s = if att.softcap != 0.0 {
                    att.softcap.mul_add((kq * att.scale).tanh(), mv)
                } else {
                    // ggml's `s = s*scale; ... s += mv`, contracted by its compiler
                    kq.mul_add(att.scale, mv)
                };
                let (mut ms, mut vs) = (1.0f32, 1.0f32);
                if s > max {
                    // a new maximum: rescale what was summed so far
                    ms = (max - s).exp();
                    // The first key seen: nothing summed yet, and zeros scale to zeros.
                    let first = max == f32::NEG_INFINITY;
                    max = s;
                    if !first {
                        if v_f16 {
                            scale_f16(&mut acc16, ms);
                        } else {
                            acc.iter_mut().for_each(|a| *a *= ms);
                        }
                    }
                } else {
                    vs = (s - max).exp();
                }
                if v_f16 {
                    mad_f16(&mut acc16, att.v.row([c, iv2, iv3]), vs);
                } else {
                    att.v.load_f32([c, iv2, iv3], &mut vrow)?;
                    mad_f32(&mut acc, &vrow, vs);
                }
                sum = sum.mul_add(ms, vs);
            }
            if v_f16 {
                acc.iter_mut()
                    .zip(acc16.iter())
                    .for_each(|(a, &h)| *a = f16_to_f32(h));
            }
            if let Some(sinks) = &att.sinks {
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
