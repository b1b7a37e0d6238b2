//! Checks of POOL_1D / POOL_2D and UPSCALE.

use super::*;

/// `ggml_op_pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolOp {
    /// `GGML_OP_POOL_MAX` (0).
    Max,
    /// `GGML_OP_POOL_AVG` (1).
    Avg,
}

/// POOL_1D's and POOL_2D's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolParams {
    /// Maximum or average.
    pub op: PoolOp,
    /// Window size per axis (width, height; height 1 for POOL_1D), each at least 1.
    pub kernel: [usize; 2],
    /// Window placement per axis (dilation 1).
    pub axes: [ConvAxis; 2],
    /// POOL_1D: an average divides by the taps inside the row (POOL_2D: by the window size).
    pub one_d: bool,
}

/// UPSCALE's interpolations (`ggml_scale_mode`, with the antialias flag folded in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScaleMode {
    /// `GGML_SCALE_MODE_NEAREST`.
    Nearest,
    /// `GGML_SCALE_MODE_BILINEAR`.
    Bilinear,
    /// `GGML_SCALE_MODE_BILINEAR | GGML_SCALE_FLAG_ANTIALIAS`: a triangle filter as wide as the
    /// downscaling factor.
    BilinearAntialias,
    /// `GGML_SCALE_MODE_BICUBIC` (a = -0.75).
    Bicubic,
}

impl Checker<'_> {
    /// POOL_1D (`op_params`: op, k0, s0, p0) and POOL_2D (op, k0, k1, s0, s1, p0, p1): an F32
    /// or F16 source gives F32 windows of `(n + 2p - k) / s + 1` per pooled axis (ggml's
    /// `ggml_calc_pool_output_size`, in floating point), other dimensions kept.
    pub(super) fn pool(&self, dst: &Layout, one_d: bool) -> Result<Planned> {
        let a = self.need(0)?;
        if !matches!(a.type_id, ty::F32 | ty::F16) || dst.type_id != ty::F32 {
            return Err(self.refuse("pooling takes F32 or F16 and gives F32"));
        }
        let op = match self.param(0) {
            0 => PoolOp::Max,
            1 => PoolOp::Avg,
            other => return Err(self.bad(format!("unknown pooling op {other}"))),
        };
        let (kernel, axes) = if one_d {
            let unit = ConvAxis {
                stride: 1,
                pad: 0,
                dilation: 1,
            };
            ([self.param(1), 1], [self.conv_axis(2, 3, None)?, unit])
        } else {
            (
                [self.param(1), self.param(2)],
                [self.conv_axis(3, 5, None)?, self.conv_axis(4, 6, None)?],
            )
        };
        let kernel = kernel.map(|k| usize::try_from(k).ok().filter(|&k| k >= 1));
        let [Some(k0), Some(k1)] = kernel else {
            return Err(self.bad(format!("window sizes {kernel:?} must be at least 1")));
        };
        let pooled = if one_d { 1 } else { 2 };
        for d in 0..4 {
            let fits = if d < pooled {
                let (k, axis) = ([k0, k1][d], axes[d]);
                // ggml: `(ins + 2 * p - ks) / s + 1` with a float p, truncated to an integer
                let want = ((a.ne[d] as f64 + 2.0 * axis.pad as f64 - k as f64)
                    / axis.stride as f64
                    + 1.0)
                    .trunc();
                want == dst.ne[d] as f64 && self.conv_output_bound(k, axis, dst.ne[d])
            } else {
                a.ne[d] == dst.ne[d]
            };
            if !fits {
                return Err(self.bad(format!(
                    "pooling {:?} by {:?} windows with {axes:?} cannot give {:?}",
                    a.ne,
                    [k0, k1],
                    dst.ne
                )));
            }
        }
        Ok(Planned {
            kernel: Kernel::Pool(PoolParams {
                op,
                kernel: [k0, k1],
                axes,
                one_d,
            }),
            sources: vec![Some(a)],
            may_be_destination: vec![false],
        })
    }

    /// UPSCALE (`ggml_interpolate`): F32 to F32 of any non-empty sizes; `op_params[0]` is the
    /// mode (low byte) with the align-corners and antialias flags (antialias only bilinear).
    pub(super) fn upscale(&self, dst: &Layout) -> Result<Planned> {
        /// `GGML_SCALE_FLAG_ALIGN_CORNERS`.
        const ALIGN_CORNERS: i32 = 1 << 8;
        /// `GGML_SCALE_FLAG_ANTIALIAS`.
        const ANTIALIAS: i32 = 1 << 9;
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("UPSCALE takes and gives F32"));
        }
        if a.is_empty() {
            return Err(self.bad("UPSCALE of an empty tensor into a non-empty one"));
        }
        let flags = self.param(0);
        let antialias = flags & ANTIALIAS != 0;
        let mode = match (flags & 0xff, antialias) {
            (0, false) => ScaleMode::Nearest,
            (1, false) => ScaleMode::Bilinear,
            (1, true) => ScaleMode::BilinearAntialias,
            (2, false) => ScaleMode::Bicubic,
            _ => return Err(self.bad(format!("unknown scale mode {flags:#x}"))),
        };
        Ok(Planned {
            kernel: Kernel::Upscale {
                mode,
                align_corners: flags & ALIGN_CORNERS != 0,
            },
            sources: vec![Some(a)],
            may_be_destination: vec![false],
        })
    }
}
