//! Checks of PAD, PAD_REFLECT_1D and ROLL.

use super::*;

/// PAD's parameters (`op_params` 0..=8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PadParams {
    /// Elements added before each dimension (`lp0, lp1, lp2, lp3`).
    pub before: [i64; 4],
    /// Wrap around the source (a torus) instead of padding with zeros.
    pub circular: bool,
}

impl Checker<'_> {
    /// PAD: `dst.ne[d] = ne[d] + before[d] + after[d]` in every dimension (pads may be
    /// negative: a crop); circular padding wraps around a non-empty source.
    pub(super) fn pad(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("PAD takes and gives F32"));
        }
        let before = [0, 1, 2, 3].map(|d| i64::from(self.param(2 * d)));
        let after = [0, 1, 2, 3].map(|d| i64::from(self.param(2 * d + 1)));
        // checked: an empty source passes the buffer check whatever its other sizes
        let padded = |d: usize| {
            i64::try_from(a.ne[d])
                .ok()
                .and_then(|n| n.checked_add(before[d])?.checked_add(after[d]))
        };
        let fits =
            (0..4).all(|d| padded(d).is_some() && padded(d) == i64::try_from(dst.ne[d]).ok());
        if !fits {
            return Err(self.bad(format!(
                "{:?} padded by {before:?} / {after:?} is not {:?}",
                a.ne, dst.ne
            )));
        }
        let circular = self.param(8) != 0;
        if circular && a.is_empty() {
            return Err(self.bad("circular padding of an empty tensor"));
        }
        Ok(Planned {
            kernel: Kernel::Pad(PadParams { before, circular }),
            sources: vec![Some(a)],
            may_be_destination: vec![false],
        })
    }

    /// PAD_REFLECT_1D (`ggml_pad_reflect_1d`): F32 rows padded by `p0` and `p1` mirrored
    /// elements, each in `0..ne0`.
    pub(super) fn pad_reflect_1d(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("PAD_REFLECT_1D takes and gives F32"));
        }
        let pads = [self.param(0), self.param(1)].map(|p| usize::try_from(p).ok());
        let [Some(left), Some(right)] = pads else {
            return Err(self.bad(format!("negative padding {pads:?}")));
        };
        let width = a.ne[0].checked_add(left).and_then(|n| n.checked_add(right));
        let fits = left < a.ne[0]
            && right < a.ne[0]
            && width.is_some_and(|w| dst.ne == [w, a.ne[1], a.ne[2], a.ne[3]]);
        if !fits {
            return Err(self.bad(format!(
                "{:?} reflected by {left} / {right} cannot give {:?}",
                a.ne, dst.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::PadReflect1d { left },
            sources: vec![Some(a)],
            may_be_destination: vec![false],
        })
    }

    /// ROLL.
    pub(super) fn roll(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("ROLL takes and gives F32"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if !a.dense_rows() {
            return Err(self.bad("ROLL needs rows of adjacent elements"));
        }
        let shifts = [0, 1, 2, 3].map(|d| i64::from(self.param(d)));
        // ggml asserts |shift| < ne in every dimension
        if (0..4).any(|d| shifts[d].unsigned_abs() >= a.ne[d] as u64) {
            return Err(self.bad(format!("shifts {shifts:?} for {:?}", a.ne)));
        }
        Ok(Planned::one(Kernel::Roll { shifts }, a, false))
    }
}
