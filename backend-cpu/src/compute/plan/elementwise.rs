//! Checks of the element-wise ops: binary ops, ADD1, the maps and UNARY, ADD_ID, GLU, DIAG, DIAG_MASK_*, TRI, FILL, ARANGE, TIMESTEP_EMBEDDING.

use super::*;

/// Which elements TRI keeps: element (column `i0`, row `i1`) is kept when the comparison of
/// `i0` with `i1` holds (ggml's `ggml_tri_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TriKeep {
    /// `GGML_TRI_TYPE_UPPER_DIAG` (0): `i0 >= i1`.
    UpperDiag,
    /// `GGML_TRI_TYPE_UPPER` (1): `i0 > i1`.
    Upper,
    /// `GGML_TRI_TYPE_LOWER_DIAG` (2): `i0 <= i1`.
    LowerDiag,
    /// `GGML_TRI_TYPE_LOWER` (3): `i0 < i1`.
    Lower,
}

impl TriKeep {
    /// Whether element (column `i0`, row `i1`) is kept.
    #[inline]
    pub(crate) fn keeps(self, i0: usize, i1: usize) -> bool {
        match self {
            TriKeep::UpperDiag => i0 >= i1,
            TriKeep::Upper => i0 > i1,
            TriKeep::LowerDiag => i0 <= i1,
            TriKeep::Lower => i0 < i1,
        }
    }
}

/// The four broadcasting binary ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

/// Element-wise maps `f32 -> f32` (computed in f32 whatever the storage type, as ggml does).
#[derive(Debug, Clone, Copy, PartialEq)]
#[allow(missing_docs)]
pub(crate) enum MapOp {
    Abs,
    Sgn,
    Neg,
    Step,
    Tanh,
    Elu,
    Relu,
    Sigmoid,
    /// ggml's tanh GELU through its f16 table (see `ops::unary`).
    Gelu,
    /// ggml's quick GELU through its f16 table.
    GeluQuick,
    Silu,
    HardSwish,
    HardSigmoid,
    Exp,
    Expm1,
    Softplus,
    GeluErf,
    Xielu {
        alpha_n: f32,
        alpha_p: f32,
        beta: f32,
        eps: f32,
    },
    Floor,
    Ceil,
    Round,
    Trunc,
    Sqr,
    Sqrt,
    Log,
    Sin,
    Cos,
    /// SCALE: `x * s + b`.
    Scale {
        s: f32,
        b: f32,
    },
    /// CLAMP.
    Clamp {
        min: f32,
        max: f32,
    },
    /// LEAKY_RELU.
    LeakyRelu {
        slope: f32,
    },
}

/// GLU's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GluParams {
    /// The gating function.
    pub op: GluOp,
    /// Single-tensor form: the gate is the first half instead of the second.
    pub swapped: bool,
    /// SWIGLU_OAI's alpha.
    pub alpha: f32,
    /// SWIGLU_OAI's and SWIGLU_CLAMP's limit.
    pub limit: f32,
}

impl Checker<'_> {
    pub(super) fn map(&self, map: MapOp, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if !is_float(&a) || !is_float(dst) {
            return Err(self.refuse("element-wise ops take F32, F16 or BF16 tensors"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        Ok(Planned {
            kernel: Kernel::Map(map),
            sources: vec![Some(a)],
            may_be_destination: vec![true],
        })
    }

    pub(super) fn unary(&self, dst: &Layout) -> Result<Planned> {
        let map = match UnaryOp(self.param(0)) {
            UnaryOp::ABS => MapOp::Abs,
            UnaryOp::SGN => MapOp::Sgn,
            UnaryOp::NEG => MapOp::Neg,
            UnaryOp::STEP => MapOp::Step,
            UnaryOp::TANH => MapOp::Tanh,
            UnaryOp::ELU => MapOp::Elu,
            UnaryOp::RELU => MapOp::Relu,
            UnaryOp::SIGMOID => MapOp::Sigmoid,
            UnaryOp::GELU => MapOp::Gelu,
            UnaryOp::GELU_QUICK => MapOp::GeluQuick,
            UnaryOp::SILU => MapOp::Silu,
            UnaryOp::HARDSWISH => MapOp::HardSwish,
            UnaryOp::HARDSIGMOID => MapOp::HardSigmoid,
            UnaryOp::EXP => MapOp::Exp,
            UnaryOp::EXPM1 => MapOp::Expm1,
            UnaryOp::SOFTPLUS => MapOp::Softplus,
            UnaryOp::GELU_ERF => MapOp::GeluErf,
            UnaryOp::XIELU => MapOp::Xielu {
                alpha_n: self.fparam(1),
                alpha_p: self.fparam(2),
                beta: self.fparam(3),
                eps: self.fparam(4),
            },
            UnaryOp::FLOOR => MapOp::Floor,
            UnaryOp::CEIL => MapOp::Ceil,
            UnaryOp::ROUND => MapOp::Round,
            UnaryOp::TRUNC => MapOp::Trunc,
            _ => return Err(self.refuse("unary sub-op outside ggml's unary table")),
        };
        self.map(map, dst)
    }

    pub(super) fn glu(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        let b = self.src(1)?;
        let op = GluOp(self.param(0));
        if !op.is_valid() {
            return Err(self.refuse("GLU sub-op outside ggml's GLU table"));
        }
        if !is_float(&a) || a.type_id != dst.type_id {
            return Err(self.refuse("GLU takes and gives one float type"));
        }
        // ggml-cpu's SWIGLU_CLAMP has F32 and F16 kernels only (it aborts on anything else)
        if op == GluOp::SWIGLU_CLAMP && a.type_id != ty::F32 && a.type_id != ty::F16 {
            return Err(self.refuse("SWIGLU_CLAMP takes and gives F32 or F16"));
        }
        let nc = match &b {
            Some(b) => {
                if b.type_id != a.type_id || !b.same_shape(&a) {
                    return Err(self.bad("the two GLU halves differ in type or shape"));
                }
                a.ne[0]
            }
            None => a.ne[0] / 2,
        };
        if dst.ne != [nc, a.ne[1], a.ne[2], a.ne[3]] {
            return Err(self.bad(format!("GLU of {:?} cannot give {:?}", a.ne, dst.ne)));
        }
        let params = GluParams {
            op,
            swapped: self.param(1) != 0,
            alpha: self.fparam(2),
            limit: self.fparam(3),
        };
        Ok(Planned {
            kernel: Kernel::Glu(params),
            sources: vec![Some(a), b],
            may_be_destination: vec![false, false],
        })
    }

    /// DIAG (`ggml_diag`): F32 rows `{n, 1, ne2, ne3}` give `{n, n, ne2, ne3}`, both packed
    /// along dimension 0.
    pub(super) fn diag(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("DIAG takes and gives F32"));
        }
        if a.ne[1] != 1 || dst.ne != [a.ne[0], a.ne[0], a.ne[2], a.ne[3]] {
            return Err(self.bad(format!("DIAG of {:?} cannot give {:?}", a.ne, dst.ne)));
        }
        if !a.dense_rows() || !dst.dense_rows() {
            return Err(self.bad("DIAG needs rows packed along ne[0]"));
        }
        Ok(Planned {
            kernel: Kernel::Diag,
            sources: vec![Some(a)],
            may_be_destination: vec![false],
        })
    }

    /// ADD / SUB / MUL / DIV.
    pub(super) fn binary(&self, dst: &Layout, op: Op) -> Result<Planned> {
        let binary = match op {
            Op::ADD => BinaryOp::Add,
            Op::SUB => BinaryOp::Sub,
            Op::MUL => BinaryOp::Mul,
            _ => BinaryOp::Div,
        };
        let (a, b) = (self.need(0)?, self.need(1)?);
        if !is_float(&a) || !is_float(&b) || !is_float(dst) {
            return Err(self.refuse("binary ops take F32, F16 or BF16 tensors"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        self.repeats(&b, &a, "src1 does not broadcast to src0")?;
        Ok(Planned {
            kernel: Kernel::Binary(binary),
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![true, true],
        })
    }

    /// ADD1.
    pub(super) fn add1(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if !is_float(&a) || !is_float(&b) || !is_float(dst) {
            return Err(self.refuse("ADD1 takes F32, F16 or BF16 tensors"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if b.elements() != 1 {
            return Err(self.bad("src1 must be a scalar"));
        }
        Ok(Planned {
            kernel: Kernel::Add1,
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![true, true],
        })
    }

    /// ADD_ID.
    pub(super) fn add_id(&self, dst: &Layout) -> Result<Planned> {
        let (a, b, ids) = (self.need(0)?, self.need(1)?, self.need(2)?);
        if !is_float(&a) || !is_float(&b) || !is_float(dst) || ids.type_id != ty::I32 {
            return Err(self.refuse("ADD_ID takes float tensors and I32 ids"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        // ids are read by position: an empty tensor has none, whatever its ne[0]
        let shapes = a.ne[3] == 1
            && b.ne[0] == a.ne[0]
            && !ids.is_empty()
            && ids.ne[0] >= a.ne[1]
            && ids.ne[1] >= a.ne[2];
        if !shapes {
            return Err(self.bad(format!(
                "ADD_ID of {:?}, rows {:?}, ids {:?}",
                a.ne, b.ne, ids.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::AddId,
            sources: vec![Some(a), Some(b), Some(ids)],
            may_be_destination: vec![true, false, false],
        })
    }

    /// DIAG_MASK_INF / DIAG_MASK_ZERO.
    pub(super) fn diag_mask(&self, dst: &Layout, op: Op) -> Result<Planned> {
        let a = self.need(0)?;
        if !is_float(&a) || !is_float(dst) {
            return Err(self.refuse("diagonal masks take F32, F16 or BF16 tensors"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        let n_past = usize::try_from(self.param(0)).map_err(|_| self.bad("negative n_past"))?;
        let value = if op == Op::DIAG_MASK_INF {
            f32::NEG_INFINITY
        } else {
            0.0
        };
        Ok(Planned::one(Kernel::DiagMask { n_past, value }, a, true))
    }

    /// TRI.
    pub(super) fn tri(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("TRI takes and gives F32"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if !a.is_contiguous() || a.ne[0] != a.ne[1] {
            return Err(self.bad(format!(
                "TRI needs contiguous square matrices, not {:?}",
                a.ne
            )));
        }
        let keep = match self.param(0) {
            0 => TriKeep::UpperDiag,
            1 => TriKeep::Upper,
            2 => TriKeep::LowerDiag,
            3 => TriKeep::Lower,
            other => return Err(self.bad(format!("unknown triangle type {other}"))),
        };
        Ok(Planned::one(Kernel::Tri(keep), a, true))
    }

    /// FILL.
    pub(super) fn fill(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if !matches!(a.type_id, ty::F32 | ty::F16) || dst.type_id != a.type_id {
            return Err(self.refuse("FILL takes and gives F32 or F16"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if !a.is_contiguous() {
            return Err(self.bad("FILL needs a contiguous source"));
        }
        // src0 only gives the shape: the kernel writes without reading it
        Ok(Planned {
            kernel: Kernel::Fill {
                value: self.fparam(0),
            },
            sources: vec![None],
            may_be_destination: vec![true],
        })
    }

    /// ARANGE.
    pub(super) fn arange(&self, dst: &Layout) -> Result<Planned> {
        if dst.type_id != ty::F32 {
            return Err(self.refuse("ARANGE gives F32"));
        }
        let (start, stop, step) = (self.fparam(0), self.fparam(1), self.fparam(2));
        // ggml's count, in f32 (a NaN count matches nothing)
        let steps = ((stop - start) / step).ceil();
        if !(steps >= 0.0 && steps as f64 == dst.elements() as f64) {
            return Err(self.bad(format!(
                "{} elements for arange({start}, {stop}, {step})",
                dst.elements()
            )));
        }
        Ok(Planned {
            kernel: Kernel::Arange { start, step },
            sources: Vec::new(),
            may_be_destination: Vec::new(),
        })
    }

    /// TIMESTEP_EMBEDDING.
    pub(super) fn timestep_embedding(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("TIMESTEP_EMBEDDING takes and gives F32"));
        }
        if !a.dense_rows() {
            return Err(self.bad("the timesteps must be adjacent elements"));
        }
        let dim = usize::try_from(self.param(0)).map_err(|_| self.bad("negative dim"))?;
        if dst.ne != [dim, a.ne[0], 1, 1] {
            return Err(self.bad(format!(
                "embeddings {:?} of {} timesteps are not [{dim}, {}]",
                dst.ne, a.ne[0], a.ne[0]
            )));
        }
        Ok(Planned {
            kernel: Kernel::TimestepEmbedding {
                dim,
                max_period: self.param(1),
            },
            sources: vec![Some(a)],
            may_be_destination: vec![false],
        })
    }
}
