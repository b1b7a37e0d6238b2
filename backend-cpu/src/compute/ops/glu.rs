//! GLU: `y = act(x) * g` row by row (`ggml_compute_forward_{reglu,geglu,swiglu,...}`).
//!
//! With one source, a row of `2 nc` values holds `x` in its first half and the gate `g` in its
//! second (`swapped` exchanges them); with two sources (the "split" form) `x` comes from src0
//! and `g` from src1, and `swapped` plays no part. The activations are those of `unary.rs`
//! (GEGLU and GEGLU_QUICK with ggml's f16 tables). SWIGLU_OAI and SWIGLU_CLAMP clamp
//! `x = min(x, limit)`, `g = clamp(g, -limit, limit)`; SWIGLU_OAI then computes
//! `x / (1 + exp(-alpha x)) * (g + 1)`, SWIGLU_CLAMP `x / (1 + exp(-x)) * g` (F16 rows widened
//! to f32 and each result rounded back once, as `ggml_compute_forward_swiglu_clamp_f16` does).

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::plan::GluParams;
use crate::compute::quant;
use crate::compute::scratch;
use crate::compute::view::encode;
use proto_core::ggml::GluOp;

use super::unary::{gelu, gelu_erf, gelu_quick};
use super::{dst_scalar, Node};

/// `std::min(a, b)`: `b < a ? b : a`.
fn std_min(a: f32, b: f32) -> f32 {
    if b < a {
        b
    } else {
        a
    }
}

/// `std::clamp(v, lo, hi)`: `v < lo ? lo : hi < v ? hi : v`.
fn std_clamp(v: f32, lo: f32, hi: f32) -> f32 {
    if v < lo {
        lo
    } else if hi < v {
        hi
    } else {
        v
    }
}

fn gate(params: GluParams, x: &[f32], g: &[f32], y: &mut [f32]) {
    let it = y.iter_mut().zip(x.iter().zip(g));
    match params.op {
        GluOp::REGLU => it.for_each(|(y, (&x, &g))| *y = if x > 0.0 { x * g } else { 0.0 }),
        GluOp::GEGLU => it.for_each(|(y, (&x, &g))| {
            // ggml_vec_geglu_f32: 0 below -10, x*g above 10, the table in between
            *y = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x * g
            } else {
                gelu(x) * g
            }
        }),
        GluOp::SWIGLU => {
            // `silu(x) * g` = `x / (1 + exp(-x)) * g`, the exponentials of the row together
            // (the same bits as `silu`'s one by one)
            y.iter_mut().zip(x).for_each(|(y, &x)| *y = -x);
            quant::exp_in_place(y);
            y.iter_mut()
                .zip(x.iter().zip(g))
                .for_each(|(y, (&x, &g))| *y = x / (1.0 + *y) * g);
        }
        GluOp::SWIGLU_OAI => {
            let (alpha, limit) = (params.alpha, params.limit);
            it.for_each(|(y, (&x, &g))| {
                let x = std_min(x, limit);
                let g = std_clamp(g, -limit, limit);
                *y = x / (1.0 + (alpha * -x).exp()) * (g + 1.0);
            })
        }
        GluOp::SWIGLU_CLAMP => {
            let limit = params.limit;
            it.for_each(|(y, (&x, &g))| {
                let x = std_min(x, limit);
                let g = std_clamp(g, -limit, limit);
                // ggml-cpu calls the C library's expf element by element here (not SWIGLU's
                // vectorized ggml_v_expf); `f32::exp` is that same expf
                *y = x / (1.0 + (-x).exp()) * g;
            })
        }
        GluOp::GEGLU_ERF => it.for_each(|(y, (&x, &g))| *y = gelu_erf(x) * g),
        GluOp::GEGLU_QUICK => it.for_each(|(y, (&x, &g))| *y = gelu_quick(x) * g),
        // refused by the plan
        _ => y.iter_mut().for_each(|y| *y = f32::NAN),
    }
}

pub(super) fn glu(node: &Node<'_>, mut dst: Dst<'_>, params: GluParams) -> Result<()> {
    let a = node.view(0)?;
    let b = node.optional_view(1)?;
    let layout = *dst.layout();
    let scalar = dst_scalar(&layout)?;
    let nc = layout.ne[0];
    let ne00 = a.layout.ne[0];
    let chunk = node.pool.chunk(layout.rows(), nc * 8);
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut row_a = scratch::zeroed::<f32>(ne00);
        let mut row_b = scratch::zeroed::<f32>(if b.is_some() { ne00 } else { 0 });
        let mut y = scratch::zeroed::<f32>(nc);
        let mut bytes = scratch::zeroed::<u8>(nc * scalar.size());
        for r in part.rows() {
            let idx = layout.row_index(r);
            a.load_f32(idx, &mut row_a)?;
            let (x, g) = match &b {
                Some(b) => {
                    b.load_f32(idx, &mut row_b)?;
                    (&row_a[..nc], &row_b[..nc])
                }
                None if params.swapped => (&row_a[nc..2 * nc], &row_a[..nc]),
                None => (&row_a[..nc], &row_a[nc..2 * nc]),
            };
            gate(params, x, g, &mut y);
            encode(scalar, &y, &mut bytes);
            part.write_at(idx, 0, &bytes)?;
        }
        Ok(())
    })
}
