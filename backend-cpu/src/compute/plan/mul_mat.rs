//! Checks of the matrix products: MUL_MAT, MUL_MAT_ID, OUT_PROD.

use super::*;

impl Checker<'_> {
    /// The weight types MUL_MAT / MUL_MAT_ID take: plain floats, or quantized types with a dot
    /// product whose activation type the quant module can produce.
    pub(super) fn check_weights(&self, w: &Layout, k: usize) -> Result<()> {
        if is_float(w) {
            return Ok(());
        }
        let vdt = if is_encoded(w.type_id) && quant::supports(w.type_id) {
            quant::vec_dot_type(w.type_id)
        } else {
            None
        };
        let Some(vdt) = vdt.filter(|&t| quant::can_quantize(t)) else {
            return Err(self.refuse("weights of this type are not supported"));
        };
        // ggml-cpu asserts `nb00 == type_size`; the plan already holds quantized blocks to
        // it, one-byte F8_E4M3 elements could be strided
        if !w.dense_rows() {
            return Err(self.bad("weights of this type must be packed along ne[0]"));
        }
        let block = type_info(vdt).map_or(0, |i| i.block_size as usize);
        if block == 0 || !k.is_multiple_of(block) {
            return Err(self.bad(format!(
                "ne[0] = {k} is not a multiple of the activation block"
            )));
        }
        Ok(())
    }

    /// F8_E4M3 weights take F32 activations (their `vec_dot_type`) or BF16 ones (widened to
    /// F32), as ggml-cpu's `supports_op`; its kernel would read F16 activations as F32.
    fn check_f8_activations(&self, w: &Layout, x: &Layout) -> Result<()> {
        if w.type_id == ty::F8_E4M3 && x.type_id != ty::F32 && x.type_id != ty::BF16 {
            return Err(self.refuse("F8_E4M3 weights take F32 or BF16 activations"));
        }
        Ok(())
    }

    pub(super) fn mul_mat(&self, dst: &Layout) -> Result<Planned> {
        let (w, x) = (self.need(0)?, self.need(1)?);
        if !is_float(&x) || dst.type_id != ty::F32 {
            return Err(self.refuse("MUL_MAT takes float activations and gives F32"));
        }
        self.check_weights(&w, w.ne[0])?;
        self.check_f8_activations(&w, &x)?;
        let shapes = w.ne[0] == x.ne[0]
            && w.ne[2] > 0
            && w.ne[3] > 0
            && x.ne[2] % w.ne[2] == 0
            && x.ne[3] % w.ne[3] == 0
            && dst.ne == [w.ne[1], x.ne[1], x.ne[2], x.ne[3]];
        if !shapes {
            return Err(self.bad(format!("{:?} x {:?} cannot give {:?}", w.ne, x.ne, dst.ne)));
        }
        Ok(Planned {
            kernel: Kernel::MulMat,
            sources: vec![Some(w), Some(x)],
            may_be_destination: vec![false, false],
        })
    }

    pub(super) fn mul_mat_id(&self, dst: &Layout) -> Result<Planned> {
        let (w, x, ids) = (self.need(0)?, self.need(1)?, self.need(2)?);
        if !is_float(&x) || dst.type_id != ty::F32 {
            return Err(self.refuse("MUL_MAT_ID takes float activations and gives F32"));
        }
        if ids.type_id != ty::I32 {
            return Err(self.bad("expert ids must be I32"));
        }
        self.check_weights(&w, w.ne[0])?;
        self.check_f8_activations(&w, &x)?;
        let shapes = w.ne[0] == x.ne[0]
            && w.ne[3] == 1
            && x.ne[3] == 1
            && x.ne[1] > 0
            && ids.ne[1] == x.ne[2]
            && ids.ne[2] == 1
            && ids.ne[3] == 1
            && dst.ne == [w.ne[1], ids.ne[0], x.ne[2], 1];
        if !shapes {
            return Err(self.bad(format!(
                "experts {:?}, activations {:?}, ids {:?} cannot give {:?}",
                w.ne, x.ne, ids.ne, dst.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::MulMatId,
            sources: vec![Some(w), Some(x), Some(ids)],
            may_be_destination: vec![false, false, false],
        })
    }

    /// OUT_PROD (`ggml_out_prod`): `a {m, k, ne2, ne3}` and `b {n, k, ne2·r2, ne3·r3}` give
    /// F32 `{m, n, ne2·r2, ne3·r3}`. ggml-cpu takes F32 `b`, and F32 `a` (broadcast over the
    /// last two dimensions) or F16 / quantized `a` (without broadcast); rows of `a` and of the
    /// destination are packed along dimension 0, `b` may have any strides (a transposed `b`).
    /// F8_E4M3 `a` is refused: ggml-cpu's kernel has a case for it, but its `supports_op`
    /// (`ggml_is_quantized`, false for F8_E4M3) refuses it.
    pub(super) fn out_prod(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if b.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("OUT_PROD takes an F32 src1 and gives F32"));
        }
        let broadcast = a.ne[2] != b.ne[2] || a.ne[3] != b.ne[3];
        let a_ok = a.type_id == ty::F32
            || (!broadcast
                && (a.type_id == ty::F16
                    || (is_quantized(a.type_id) && quant::supports(a.type_id))));
        if !a_ok {
            return Err(
                self.refuse("OUT_PROD takes src0 as F32, or F16 / quantized without broadcast")
            );
        }
        let shapes = a.ne[1] == b.ne[1]
            && a.ne[2] > 0
            && a.ne[3] > 0
            && b.ne[2].is_multiple_of(a.ne[2])
            && b.ne[3].is_multiple_of(a.ne[3])
            && dst.ne == [a.ne[0], b.ne[0], b.ne[2], b.ne[3]];
        if !shapes {
            return Err(self.bad(format!(
                "outer product of {:?} and {:?} cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        }
        if !a.dense_rows() || !dst.dense_rows() {
            return Err(self.bad("OUT_PROD needs src0 and the destination packed along ne[0]"));
        }
        Ok(Planned {
            kernel: Kernel::OutProd,
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![false, false],
        })
    }
}
