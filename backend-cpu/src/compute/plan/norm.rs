//! Checks of the norms: NORM / RMS_NORM / L2_NORM, GROUP_NORM.

use super::*;

impl Checker<'_> {
    /// GROUP_NORM (`ggml_group_norm`): F32 with packed rows, the destination of src0's shape;
    /// op_params `n_groups` (positive) and `eps`. ggml may compute it in place.
    pub(super) fn group_norm(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("GROUP_NORM takes and gives F32"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if !a.dense_rows() || !dst.dense_rows() {
            return Err(self.bad("GROUP_NORM needs rows packed along ne[0]"));
        }
        let groups = usize::try_from(self.param(0))
            .ok()
            .filter(|&g| g > 0)
            .ok_or_else(|| self.bad(format!("{} groups", self.param(0))))?;
        // ggml takes any epsilon here (unlike NORM's, no assertion)
        let eps = self.fparam(1);
        Ok(Planned {
            kernel: Kernel::GroupNorm {
                per_group: a.ne[2].div_ceil(groups),
                eps,
            },
            sources: vec![Some(a)],
            may_be_destination: vec![true],
        })
    }

    /// NORM / RMS_NORM / L2_NORM.
    pub(super) fn norm(&self, dst: &Layout, op: Op) -> Result<Planned> {
        let a = self.need(0)?;
        if !is_float(&a) || !is_float(dst) {
            return Err(self.refuse("norms take F32, F16 or BF16 tensors"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        let eps = self.fparam(0);
        // ggml asserts eps >= 0 (which NaN fails as well).
        if eps.is_nan() || eps < 0.0 {
            return Err(self.refuse("negative or NaN epsilon"));
        }
        let kernel = match op {
            Op::NORM => Kernel::Norm { eps },
            Op::RMS_NORM => Kernel::RmsNorm { eps },
            _ => Kernel::L2Norm { eps },
        };
        Ok(Planned::one(kernel, a, true))
    }
}
