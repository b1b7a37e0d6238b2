//! OUT_PROD (`ggml_compute_forward_out_prod_*`): for every plane `(i2, i3)` of the
//! destination, `dst[i0, i1] = Σ_k a[i0, k] · b[i1, k]`, with `a`'s plane
//! `(i2 / r2, i3 / r3)` (its planes broadcast by the ratios of the last two dimensions).
//!
//! `a` is widened to f32 once (F16 converted, quantized types dequantized, as ggml does per
//! row); `b` is read element by element (a transposed `b` is common: the gradient of a
//! MUL_MAT). Each destination row accumulates in f32 over ascending `k`, starting from zero,
//! as ggml's `ggml_vec_mad_f32` loop does; rows are the unit of work.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::view::{encode, Scalar};

use super::{widen_all, Node};

pub(super) fn out_prod(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (a, b) = (node.view(0)?, node.view(1)?);
    let layout = *dst.layout();
    let width = layout.ne[0];
    let depth = a.layout.ne[1];
    // the plan checked that a's last two sizes are non-zero divisors of the destination's
    let ratio2 = layout.ne[2] / a.layout.ne[2].max(1);
    let ratio3 = layout.ne[3] / a.layout.ne[3].max(1);
    let a_rows = widen_all(node, &a)?;
    let chunk = node
        .pool
        .chunk(layout.rows(), width.saturating_mul(depth).max(1));
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || (vec![0.0f32; width], Vec::new()),
        |(acc, bytes), mut part: DstPart<'_>| {
            for r in part.rows() {
                let [i1, i2, i3] = layout.row_index(r);
                let (a2, a3) = (i2 / ratio2.max(1), i3 / ratio3.max(1));
                acc.fill(0.0);
                for k in 0..depth {
                    let weight = b.value([i1, k, i2, i3]);
                    let first = a.layout.row_number([k, a2, a3]) * width;
                    let a_row = &a_rows[first..first + width];
                    for (d, &x) in acc.iter_mut().zip(a_row) {
                        *d += x * weight;
                    }
                }
                bytes.resize(width * 4, 0);
                encode(Scalar::F32, acc, bytes);
                part.write_at([i1, i2, i3], 0, bytes)?;
            }
            Ok(())
        },
    )
}
