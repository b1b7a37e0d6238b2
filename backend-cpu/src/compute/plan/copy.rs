//! Checks of the copies and row ops: DUP / CONT / CPY, GET_ROWS, SET_ROWS, CONCAT, REPEAT.

use super::*;

impl Checker<'_> {
    /// DUP / CPY / CONT: same element count, and a conversion the copy kernel has.
    pub(super) fn check_copy(&self, a: &Layout, dst: &Layout) -> Result<()> {
        if a.elements() != dst.elements() {
            return Err(self.bad(format!(
                "copy of {:?} ({} elements) into {:?}",
                a.ne,
                a.elements(),
                dst.ne
            )));
        }
        let (from, to) = (a.type_id, dst.type_id);
        let supported = from == to
            || (Scalar::numeric(from).is_some() && Scalar::numeric(to).is_some())
            || (Scalar::float(from).is_some() && is_encoded(to) && quant::can_quantize(to))
            || (is_encoded(from) && quant::supports(from) && Scalar::float(to).is_some());
        if !supported {
            return Err(self.refuse("copy between these types is not supported"));
        }
        Ok(())
    }

    pub(super) fn get_rows(&self, dst: &Layout) -> Result<Planned> {
        let (a, rows) = (self.need(0)?, self.need(1)?);
        if rows.type_id != ty::I32 {
            return Err(self.bad("row ids must be I32"));
        }
        let same = a.type_id == dst.type_id;
        let convert = readable(a.type_id) && is_float(dst);
        if !(same || convert) {
            return Err(self.refuse("GET_ROWS between these types is not supported"));
        }
        if rows.ne[3] != 1
            || a.ne[2] != rows.ne[1]
            || a.ne[3] != rows.ne[2]
            || dst.ne != [a.ne[0], rows.ne[0], rows.ne[1], rows.ne[2]]
        {
            return Err(self.bad(format!(
                "rows {:?} of {:?} cannot give {:?}",
                rows.ne, a.ne, dst.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::GetRows,
            sources: vec![Some(a), Some(rows)],
            may_be_destination: vec![false, false],
        })
    }

    pub(super) fn set_rows(&self, dst: &Layout) -> Result<Planned> {
        let (a, rows) = (self.need(0)?, self.need(1)?);
        if rows.type_id != ty::I32 && rows.type_id != I64 {
            return Err(self.bad("row ids must be I32 or I64"));
        }
        if !is_float(&a) {
            return Err(self.refuse("SET_ROWS takes F32, F16 or BF16 rows"));
        }
        if !(is_float(dst) || (is_encoded(dst.type_id) && quant::can_quantize(dst.type_id))) {
            return Err(self.refuse("SET_ROWS into this type is not supported"));
        }
        let shapes = dst.ne[0] == a.ne[0]
            && dst.ne[2] == a.ne[2]
            && dst.ne[3] == a.ne[3]
            && a.ne[1] == rows.ne[0]
            && rows.ne[3] == 1
            && (a.is_empty()
                || (rows.ne[1] > 0
                    && rows.ne[2] > 0
                    && a.ne[2] % rows.ne[1] == 0
                    && a.ne[3] % rows.ne[2] == 0));
        if !shapes {
            return Err(self.bad(format!(
                "rows {:?} with ids {:?} cannot go into {:?}",
                a.ne, rows.ne, dst.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::SetRows,
            sources: vec![Some(a), Some(rows)],
            may_be_destination: vec![false, false],
        })
    }

    /// DUP / CONT / CPY.
    pub(super) fn copy(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        self.check_copy(&a, dst)?;
        // CPY's src[1] is the destination operand (dst is a view of it): written, not
        // read, so it is not a source here.
        Ok(Planned::one(Kernel::Copy, a, true))
    }

    /// CONCAT.
    pub(super) fn concat(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        let dim = usize::try_from(self.param(0))
            .ok()
            .filter(|&d| d < 4)
            .ok_or_else(|| self.bad("concat dimension outside 0..4"))?;
        if a.type_id != b.type_id || a.type_id != dst.type_id {
            return Err(self.refuse("CONCAT takes two tensors of one type"));
        }
        // Quantized tensors are copied block by block (ggml-cpu's
        // `concat_any`): every row must be whole blocks, which also keeps the seam of a
        // concatenation along dimension 0 on a block boundary.
        if [a.ne[0], b.ne[0], dst.ne[0]]
            .iter()
            .any(|&n| n % a.block != 0)
        {
            return Err(self.bad(format!(
                "CONCAT of {:?} and {:?}: rows are not whole {}-element blocks",
                a.ne, b.ne, a.block
            )));
        }
        for d in 0..4 {
            let want = if d == dim { a.ne[d] + b.ne[d] } else { a.ne[d] };
            if (d != dim && b.ne[d] != a.ne[d]) || dst.ne[d] != want {
                return Err(self.bad(format!(
                    "cannot concatenate {:?} and {:?} along {dim} into {:?}",
                    a.ne, b.ne, dst.ne
                )));
            }
        }
        Ok(Planned {
            kernel: Kernel::Concat { dim },
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![false, false],
        })
    }

    /// REPEAT.
    pub(super) fn repeat(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        // ggml-cpu's REPEAT aborts for F8_E4M3 (no case for it)
        if a.type_id != dst.type_id || a.block != 1 || a.type_id == ty::F8_E4M3 {
            return Err(self.refuse("REPEAT keeps one plain type"));
        }
        self.repeats(&a, dst, "src0 does not repeat into the destination")?;
        Ok(Planned::one(Kernel::Repeat, a, false))
    }
}
