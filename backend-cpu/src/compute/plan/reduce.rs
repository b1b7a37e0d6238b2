//! Checks of the reductions: SUM_ROWS / MEAN, SUM, ARGMAX, ARGSORT / TOP_K, CUMSUM, COUNT_EQUAL.

use super::*;

impl Checker<'_> {
    /// COUNT_EQUAL (`ggml_count_equal`): two I32 tensors of one shape give an I64 scalar.
    pub(super) fn count_equal(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if a.type_id != ty::I32 || b.type_id != ty::I32 || dst.type_id != I64 {
            return Err(self.refuse("COUNT_EQUAL takes I32 tensors and gives I64"));
        }
        self.same_shape(&a, &b, "the two sources")?;
        if dst.ne != [1, 1, 1, 1] {
            return Err(self.bad("the destination of COUNT_EQUAL must be a scalar"));
        }
        Ok(Planned {
            kernel: Kernel::CountEqual,
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![false, false],
        })
    }

    /// SUM_ROWS / MEAN.
    pub(super) fn sum_rows(&self, dst: &Layout, op: Op) -> Result<Planned> {
        let a = self.need(0)?;
        if !is_float(&a) || !is_float(dst) {
            return Err(self.refuse("row sums take F32, F16 or BF16 tensors"));
        }
        if dst.ne != [1, a.ne[1], a.ne[2], a.ne[3]] {
            return Err(self.bad(format!(
                "destination shape {:?} is not [1, ne1, ne2, ne3] of {:?}",
                dst.ne, a.ne
            )));
        }
        let kernel = if op == Op::MEAN {
            Kernel::Mean
        } else {
            Kernel::SumRows
        };
        Ok(Planned::one(kernel, a, false))
    }

    /// SUM.
    pub(super) fn sum(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if !is_float(&a) || !is_float(dst) {
            return Err(self.refuse("SUM takes F32, F16 or BF16 tensors"));
        }
        if dst.elements() != 1 {
            return Err(self.bad("the destination of SUM must be a scalar"));
        }
        Ok(Planned::one(Kernel::Sum, a, false))
    }

    /// ARGMAX.
    pub(super) fn argmax(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if !is_float(&a) || dst.type_id != ty::I32 {
            return Err(self.refuse("ARGMAX takes a float matrix and gives I32"));
        }
        if a.ne[2] != 1 || a.ne[3] != 1 || dst.ne != [a.ne[1], 1, 1, 1] {
            return Err(self.bad(format!("ARGMAX of {:?} into {:?}", a.ne, dst.ne)));
        }
        Ok(Planned::one(Kernel::ArgMax, a, false))
    }

    /// ARGSORT / TOP_K.
    pub(super) fn argsort(&self, dst: &Layout, op: Op) -> Result<Planned> {
        let a = self.need(0)?;
        if !is_float(&a) || dst.type_id != ty::I32 {
            return Err(self.refuse("sorting takes a float tensor and gives I32"));
        }
        let fits = if op == Op::ARGSORT {
            a.same_shape(dst)
        } else {
            dst.ne[0] <= a.ne[0] && dst.ne[1..] == a.ne[1..]
        };
        if !fits {
            return Err(self.bad(format!("sorting {:?} into {:?}", a.ne, dst.ne)));
        }
        let kernel = if op == Op::TOP_K {
            Kernel::TopK
        } else {
            match self.param(0) {
                0 => Kernel::ArgSort { descending: false },
                1 => Kernel::ArgSort { descending: true },
                _ => return Err(self.refuse("unknown sort order")),
            }
        };
        Ok(Planned::one(kernel, a, false))
    }

    /// CUMSUM.
    pub(super) fn cumsum(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("CUMSUM takes and gives F32"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if !a.dense_rows() || !dst.dense_rows() {
            return Err(self.bad("CUMSUM needs rows of adjacent elements"));
        }
        Ok(Planned::one(Kernel::CumSum, a, true))
    }
}
