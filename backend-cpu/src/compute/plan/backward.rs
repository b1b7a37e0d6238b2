//! Checks of the backward ops: SILU_BACK, RMS_NORM_BACK, SOFT_MAX_BACK, GET_ROWS_BACK, REPEAT_BACK, CROSS_ENTROPY_LOSS(_BACK).

use super::*;

impl Checker<'_> {
    /// SILU_BACK (`ggml_silu_back`): the gradient `dy` (src0) and the forward input `x` (src1),
    /// both of the destination's shape and float type; ggml may compute it in place of either.
    pub(super) fn silu_back(&self, dst: &Layout) -> Result<Planned> {
        let (dy, x) = (self.need(0)?, self.need(1)?);
        if !is_float(&dy) || dy.type_id != dst.type_id || x.type_id != dst.type_id {
            return Err(self.refuse("SILU_BACK takes and gives one float type"));
        }
        self.same_shape(&dy, dst, "the gradient and the destination")?;
        self.same_shape(&x, dst, "the forward input and the destination")?;
        Ok(Planned {
            kernel: Kernel::SiluBack,
            sources: vec![Some(dy), Some(x)],
            may_be_destination: vec![true, true],
        })
    }

    /// RMS_NORM_BACK (`ggml_rms_norm_back`): the gradient (src0) and the forward input (src1),
    /// F32 with packed rows, of the destination's shape; epsilon as RMS_NORM's.
    pub(super) fn rms_norm_back(&self, dst: &Layout) -> Result<Planned> {
        let (dz, x) = (self.need(0)?, self.need(1)?);
        if dz.type_id != ty::F32 || x.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("RMS_NORM_BACK takes and gives F32"));
        }
        self.same_shape(&dz, dst, "the gradient and the destination")?;
        self.same_shape(&x, dst, "the forward input and the destination")?;
        if !dz.dense_rows() || !x.dense_rows() {
            return Err(self.bad("RMS_NORM_BACK needs packed source rows"));
        }
        let eps = self.fparam(0);
        if eps.is_nan() || eps < 0.0 {
            return Err(self.refuse("negative or NaN epsilon"));
        }
        Ok(Planned {
            kernel: Kernel::RmsNormBack { eps },
            sources: vec![Some(dz), Some(x)],
            may_be_destination: vec![false, false],
        })
    }

    /// SOFT_MAX_BACK (`ggml_soft_max_ext_back`): the gradient `dy` (src0) and the forward output
    /// `y` (src1), contiguous F32 of the destination's shape; ggml-cpu has no ALiBi
    /// (`max_bias`, `op_params[1]`, must be 0). ggml may compute it in place of either source.
    pub(super) fn soft_max_back(&self, dst: &Layout) -> Result<Planned> {
        let (dy, y) = (self.need(0)?, self.need(1)?);
        if dy.type_id != ty::F32 || y.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("SOFT_MAX_BACK takes and gives F32"));
        }
        if self.fparam(1) != 0.0 {
            return Err(self.refuse("SOFT_MAX_BACK with ALiBi (max_bias) is not supported"));
        }
        self.same_shape(&dy, dst, "the gradient and the destination")?;
        self.same_shape(&y, dst, "the forward output and the destination")?;
        if !dy.is_contiguous() || !y.is_contiguous() || !dst.is_contiguous() {
            return Err(self.bad("SOFT_MAX_BACK needs contiguous tensors"));
        }
        Ok(Planned {
            kernel: Kernel::SoftMaxBack {
                scale: self.fparam(0),
            },
            sources: vec![Some(dy), Some(y)],
            may_be_destination: vec![true, true],
        })
    }

    /// GET_ROWS_BACK (`ggml_get_rows_back`): a matrix of gradient rows (src0, F32 or F16, packed
    /// rows) and a vector of I32 row ids (src1, at most as many as src0 has rows) give a
    /// contiguous F32 matrix as wide as src0. The ids are checked at run time.
    pub(super) fn get_rows_back(&self, dst: &Layout) -> Result<Planned> {
        let (grad, ids) = (self.need(0)?, self.need(1)?);
        if ids.type_id != ty::I32 {
            return Err(self.bad("row ids must be I32"));
        }
        if !(grad.type_id == ty::F32 || grad.type_id == ty::F16) || dst.type_id != ty::F32 {
            return Err(self.refuse("GET_ROWS_BACK takes F32 or F16 rows and gives F32"));
        }
        let shapes = grad.ne[2] == 1
            && grad.ne[3] == 1
            && ids.ne[1..] == [1, 1, 1]
            && ids.ne[0] <= grad.ne[1]
            && dst.ne[0] == grad.ne[0]
            && dst.ne[2..] == [1, 1];
        if !shapes {
            return Err(self.bad(format!(
                "rows {:?} with ids {:?} cannot go back into {:?}",
                grad.ne, ids.ne, dst.ne
            )));
        }
        if !grad.dense_rows() || !dst.is_contiguous() {
            return Err(self.bad("GET_ROWS_BACK needs packed source rows, a contiguous result"));
        }
        Ok(Planned {
            kernel: Kernel::GetRowsBack,
            sources: vec![Some(grad), Some(ids)],
            may_be_destination: vec![false, false],
        })
    }

    /// REPEAT_BACK (`ggml_repeat_back`): F32 src0 whose every dimension is a multiple of the
    /// destination's (same type), both packed along dimension 0.
    pub(super) fn repeat_back(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("REPEAT_BACK takes and gives F32"));
        }
        self.repeats(dst, &a, "the destination does not repeat into src0")?;
        if !a.dense_rows() || !dst.dense_rows() {
            return Err(self.bad("REPEAT_BACK needs src0 and the destination packed along ne[0]"));
        }
        Ok(Planned {
            kernel: Kernel::RepeatBack,
            sources: vec![Some(a)],
            may_be_destination: vec![false],
        })
    }

    /// CROSS_ENTROPY_LOSS (`ggml_cross_entropy_loss`): F32 logits and labels of one shape,
    /// packed along dimension 0, give an F32 scalar.
    pub(super) fn cross_entropy_loss(&self, dst: &Layout) -> Result<Planned> {
        let (logits, labels) = (self.need(0)?, self.need(1)?);
        if logits.type_id != ty::F32 || labels.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("CROSS_ENTROPY_LOSS takes and gives F32"));
        }
        self.same_shape(&logits, &labels, "logits and labels")?;
        if dst.ne != [1, 1, 1, 1] {
            return Err(self.bad("the destination of CROSS_ENTROPY_LOSS must be a scalar"));
        }
        if !logits.dense_rows() || !labels.dense_rows() {
            return Err(self.bad("CROSS_ENTROPY_LOSS needs rows packed along ne[0]"));
        }
        Ok(Planned {
            kernel: Kernel::CrossEntropyLoss,
            sources: vec![Some(logits), Some(labels)],
            may_be_destination: vec![false, false],
        })
    }

    /// CROSS_ENTROPY_LOSS_BACK (`ggml_cross_entropy_loss_back`): an F32 scalar gradient,
    /// contiguous F32 logits and labels of the destination's shape (contiguous too).
    pub(super) fn cross_entropy_loss_back(&self, dst: &Layout) -> Result<Planned> {
        let (grad, logits, labels) = (self.need(0)?, self.need(1)?, self.need(2)?);
        if [&grad, &logits, &labels, dst]
            .iter()
            .any(|t| t.type_id != ty::F32)
        {
            return Err(self.refuse("CROSS_ENTROPY_LOSS_BACK takes and gives F32"));
        }
        if grad.ne != [1, 1, 1, 1] {
            return Err(self.bad("the loss's gradient must be a scalar"));
        }
        self.same_shape(&logits, dst, "the logits and the destination")?;
        self.same_shape(&labels, dst, "the labels and the destination")?;
        if !logits.is_contiguous() || !labels.is_contiguous() || !dst.is_contiguous() {
            return Err(self.bad("CROSS_ENTROPY_LOSS_BACK needs contiguous tensors"));
        }
        Ok(Planned {
            kernel: Kernel::CrossEntropyLossBack,
            sources: vec![Some(grad), Some(logits), Some(labels)],
            may_be_destination: vec![false; 3],
        })
    }
}
