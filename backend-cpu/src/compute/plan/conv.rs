//! Checks of the convolutions: IM2COL, IM2COL_3D, CONV_2D, CONV_2D_DW, CONV_3D, COL2IM_1D, CONV_TRANSPOSE_1D/2D, and the convolution axes they share with pooling.

use super::*;

/// One spatial axis of a convolution window: input position `o * stride + k * dilation - pad`
/// for output position `o` and kernel tap `k` (ggml's `ggml_calc_conv_output_size` rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConvAxis {
    /// Step between output positions (at least 1).
    pub stride: i64,
    /// Input positions before the first (zeros; negative: a crop).
    pub pad: i64,
    /// Step between kernel taps (at least 1).
    pub dilation: i64,
}

impl ConvAxis {
    /// The input position tap `k` of output `o` reads, if inside `0..len`. The plan bounds
    /// `o`, `k` and the parameters so that this cannot overflow.
    #[inline]
    pub(crate) fn source(&self, o: usize, k: usize, len: usize) -> Option<usize> {
        let at = o as i64 * self.stride + k as i64 * self.dilation - self.pad;
        usize::try_from(at).ok().filter(|&i| i < len)
    }

    /// The taps (of `0..taps`) of output `o` that read inside `0..len`, in order, and the
    /// input position of the first: tap `k` reads `first + (k - start) * dilation`. Computed
    /// in `i128`, so that windows far larger than the input cost nothing per skipped tap.
    pub(crate) fn inside(&self, o: usize, taps: usize, len: usize) -> (Range<usize>, usize) {
        let d = i128::from(self.dilation.max(1));
        let base = o as i128 * i128::from(self.stride) - i128::from(self.pad);
        // tap k reads base + k * d: inside when 0 <= base + k * d < len
        let ceil_div = |a: i128| (a + d - 1).div_euclid(d);
        let lo = ceil_div(-base).clamp(0, taps as i128);
        let hi = ceil_div(len as i128 - base).clamp(lo, taps as i128);
        // an empty range reads nothing: its first position is 0, a valid slice start
        let first = if lo < hi {
            usize::try_from(base + lo * d).unwrap_or(0)
        } else {
            0
        };
        (lo as usize..hi as usize, first)
    }
}

/// CONV_2D_DW's window: axis 0 (width), axis 1 (height).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conv2dParams {
    /// Width (`s0, p0, d0`) and height (`s1, p1, d1`) axes.
    pub axes: [ConvAxis; 2],
}

/// The forms of IM2COL: which dimensions the image and the destination rows have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Im2ColForm {
    /// IM2COL, `is_2D == 0`: image `[IW, IC, N]`, destination rows `(ow, n)`.
    OneD,
    /// IM2COL, `is_2D == 1`: image `[IW, IH, IC, N]`, destination rows `(ow, oh, n)`.
    TwoD,
    /// IM2COL_3D: image `[IW, IH, ID, N * IC]`, destination rows `(ow, oh, n * OD + od)`.
    ThreeD,
}

/// IM2COL's and IM2COL_3D's geometry. Dimensions the form lacks have one tap over one
/// position (IM2COL's 1-D form still reads its one image row at `-p1`, as ggml does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Im2ColParams {
    /// Width, height and depth axes.
    pub axes: [ConvAxis; 3],
    /// Kernel width, height and depth (`KW`, `KH`, `KD`).
    pub taps: [usize; 3],
    /// Input channels per image (`IC`).
    pub channels: usize,
    /// The form.
    pub form: Im2ColForm,
}

/// CONV_2D's and CONV_3D's geometry: kernel `[KW, KH, KD, OC * IC]`, image
/// `[W, H, D, N * IC]`, destination `[OW, OH, OD, N * OC]` (CONV_2D: depth 1, and its
/// `[.., IC, N]` dimensions are the same flat order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConvParams {
    /// Width, height and depth axes (CONV_2D: a unit depth axis).
    pub axes: [ConvAxis; 3],
    /// Input channels (`IC`).
    pub channels: usize,
    /// Output channels (`OC`).
    pub out_channels: usize,
    /// CONV_3D: destination rows `(oy, oz, n * OC + oc)`; else CONV_2D's `(oy, oc, n)`.
    pub three_d: bool,
}

impl ConvAxis {
    /// The axis of a dimension a form lacks: one position, read as itself.
    pub(crate) const UNIT: ConvAxis = ConvAxis {
        stride: 1,
        pad: 0,
        dilation: 1,
    };
}

impl Checker<'_> {
    /// A convolution axis from `op_params[stride]`, `[pad]`, `[dilation]` (`dilation: None`:
    /// 1, a pooling window): stride and dilation at least 1, any padding.
    pub(super) fn conv_axis(
        &self,
        stride: usize,
        pad: usize,
        dilation: Option<usize>,
    ) -> Result<ConvAxis> {
        let axis = ConvAxis {
            stride: i64::from(self.param(stride)),
            pad: i64::from(self.param(pad)),
            dilation: dilation.map_or(1, |slot| i64::from(self.param(slot))),
        };
        if axis.stride < 1 || axis.dilation < 1 {
            return Err(self.bad(format!(
                "stride {} and dilation {} must be at least 1",
                axis.stride, axis.dilation
            )));
        }
        Ok(axis)
    }

    /// Checks that `out` outputs of a window of `taps` taps along `axis` over `input` elements
    /// are what ggml's constructor gives (`ggml_calc_conv_output_size`, C's truncating
    /// division), and that every position the kernel computes fits an `i64`.
    pub(super) fn conv_output(
        &self,
        input: usize,
        taps: usize,
        axis: ConvAxis,
        out: usize,
    ) -> Result<()> {
        let (input, taps, out) = (input as i128, taps as i128, out as i128);
        let (s, p, d) = (
            i128::from(axis.stride),
            i128::from(axis.pad),
            i128::from(axis.dilation),
        );
        let want = (input + 2 * p - d * (taps - 1) - 1) / s + 1;
        // a window of no taps is allowed (ggml gives zeros: sums of nothing)
        if want != out || !self.conv_output_bound(taps as usize, axis, out as usize) {
            return Err(self.bad(format!(
                "{out} outputs of a {taps}-tap window over {input} inputs with stride {s}, padding {p}, dilation {d} (expected {want})"
            )));
        }
        Ok(())
    }

    /// IM2COL (`ggml_im2col`): kernel `a` (only its shape is read) and image `b` give one row
    /// of `IC * KH * KW` values per output position. 2-D (`op_params[6] == 1`): `a
    /// [KW, KH, IC, ..]`, `b [IW, IH, IC, N]`, destination `[IC*KH*KW, OW, OH, N]`; 1-D:
    /// `a [KW, IC, ..]`, `b [IW, IC, N, 1]`, destination `[IC*KW, OW, N, 1]`. F32 images give
    /// F32 or F16, F16 images F16 (ggml-cpu's kernels).
    pub(super) fn im2col(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        let types_ok = matches!(
            (b.type_id, dst.type_id),
            (ty::F32, ty::F32 | ty::F16) | (ty::F16, ty::F16)
        );
        if !types_ok {
            return Err(self.refuse("IM2COL takes an F32 image (to F32 or F16) or F16 (to F16)"));
        }
        let two_d = match self.param(6) {
            0 => false,
            1 => true,
            other => return Err(self.bad(format!("is_2D flag {other} is neither 0 nor 1"))),
        };
        let width = self.conv_axis(0, 2, Some(4))?;
        let height = if two_d {
            self.conv_axis(1, 3, Some(5))?
        } else {
            // the 1-D form's one output row and kernel tap read image row `-p1`: s1 and d1
            // play no part (ggml's own 1-D graphs pass 0 for them)
            ConvAxis {
                stride: 1,
                pad: i64::from(self.param(3)),
                dilation: 1,
            }
        };
        // (channels, kernel height, kernel width, image height, batch)
        let (ic, kh, kw, ih, n) = if two_d {
            (b.ne[2], a.ne[1], a.ne[0], b.ne[1], b.ne[3])
        } else {
            (b.ne[1], 1, a.ne[0], 1, b.ne[2])
        };
        let sources_fit = if two_d {
            a.ne[2] == b.ne[2]
        } else {
            a.ne[1] == b.ne[1] && b.ne[3] == 1
        };
        let (ow, oh) = (dst.ne[1], if two_d { dst.ne[2] } else { 1 });
        let row = [ic, kh, kw]
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        let shape = if two_d {
            [row, Some(ow), Some(oh), Some(n)]
        } else {
            [row, Some(ow), Some(n), Some(1)]
        };
        if !sources_fit || shape != dst.ne.map(Some) {
            return Err(self.bad(format!(
                "IM2COL of kernel {:?} over image {:?} cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        }
        self.conv_output(b.ne[0], kw, width, ow)?;
        if two_d {
            self.conv_output(ih, kh, height, oh)?;
        } else if !self.conv_output_bound(1, height, 1) {
            return Err(self.bad("IM2COL height padding out of range"));
        }
        Ok(Planned {
            kernel: Kernel::Im2Col(Im2ColParams {
                axes: [width, height, ConvAxis::UNIT],
                taps: [kw, kh, 1],
                channels: ic,
                form: if two_d {
                    Im2ColForm::TwoD
                } else {
                    Im2ColForm::OneD
                },
            }),
            sources: vec![None, Some(b)],
            may_be_destination: vec![false, false],
        })
    }

    /// `op_params[slot]` as a count of at least 1 (`what` names it).
    pub(super) fn positive_param(&self, slot: usize, what: &str) -> Result<usize> {
        usize::try_from(self.param(slot))
            .ok()
            .filter(|&c| c >= 1)
            .ok_or_else(|| self.bad(format!("{what} {} below 1", self.param(slot))))
    }

    /// The width, height and depth axes of IM2COL_3D and CONV_3D (`op_params` 0..9: strides,
    /// paddings, dilations), checked against the image `b`, kernel `a` and the destination's
    /// output sizes `out`.
    pub(super) fn axes_3d(&self, a: &Layout, b: &Layout, out: [usize; 3]) -> Result<[ConvAxis; 3]> {
        let mut axes = [ConvAxis::UNIT; 3];
        for (d, axis) in axes.iter_mut().enumerate() {
            *axis = self.conv_axis(d, 3 + d, Some(6 + d))?;
            self.conv_output(b.ne[d], a.ne[d], *axis, out[d])?;
        }
        Ok(axes)
    }

    /// IM2COL_3D (`ggml_im2col_3d`): kernel `a [KW, KH, KD, OC * IC]` (only its shape is
    /// read), image `b [IW, IH, ID, N * IC]` (F32), `IC = op_params[9]`, give
    /// `[IC*KD*KH*KW, OW, OH, OD * N]` (F32 or F16).
    pub(super) fn im2col_3d(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if b.type_id != ty::F32 || !matches!(dst.type_id, ty::F32 | ty::F16) {
            return Err(self.refuse("IM2COL_3D takes an F32 image and gives F32 or F16"));
        }
        let ic = self.positive_param(9, "channel count")?;
        // ggml: N = ne13 / IC (integer division), destination depth OD * N
        let n = b.ne[3] / ic;
        let [kw, kh, kd, _] = a.ne;
        let row = [ic, kd, kh, kw]
            .iter()
            .try_fold(1usize, |p, &d| p.checked_mul(d));
        let od = dst.ne[3].checked_div(n);
        let shapes =
            row == Some(dst.ne[0]) && od.is_some_and(|od| od.checked_mul(n) == Some(dst.ne[3]));
        let Some(od) = od.filter(|_| shapes) else {
            return Err(self.bad(format!(
                "IM2COL_3D of kernel {:?} over image {:?} with {ic} channels cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        };
        let axes = self.axes_3d(&a, &b, [dst.ne[1], dst.ne[2], od])?;
        Ok(Planned {
            kernel: Kernel::Im2Col(Im2ColParams {
                axes,
                taps: [kw, kh, kd],
                channels: ic,
                form: Im2ColForm::ThreeD,
            }),
            sources: vec![None, Some(b)],
            may_be_destination: vec![false, false],
        })
    }

    /// CONV_2D_DW (`ggml_conv_2d_dw_direct`): kernel `[KW, KH, 1, C]` (F32 or F16) over
    /// image `[W, H, C, N]` (F32) gives `[OW, OH, C, N]` (F32), any strides (ggml's channel-
    /// first and channel-last layouts alike).
    pub(super) fn conv_2d_dw(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if !matches!(a.type_id, ty::F32 | ty::F16) || b.type_id != ty::F32 || dst.type_id != ty::F32
        {
            return Err(self.refuse("CONV_2D_DW takes an F32 or F16 kernel, an F32 image"));
        }
        let shapes =
            a.ne[2] == 1 && a.ne[3] == b.ne[2] && dst.ne[2] == b.ne[2] && dst.ne[3] == b.ne[3];
        if !shapes {
            return Err(self.bad(format!(
                "CONV_2D_DW of kernel {:?} over image {:?} cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        }
        let width = self.conv_axis(0, 2, Some(4))?;
        let height = self.conv_axis(1, 3, Some(5))?;
        self.conv_output(b.ne[0], a.ne[0], width, dst.ne[0])?;
        self.conv_output(b.ne[1], a.ne[1], height, dst.ne[1])?;
        Ok(Planned {
            kernel: Kernel::ConvDepthwise(Conv2dParams {
                axes: [width, height],
            }),
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![false, false],
        })
    }

    /// Whether every position of `out` windows of `taps` along `axis` fits an `i64`.
    pub(super) fn conv_output_bound(&self, taps: usize, axis: ConvAxis, out: usize) -> bool {
        let reach = (out as i128 - 1) * i128::from(axis.stride)
            + (taps as i128 - 1).max(0) * i128::from(axis.dilation)
            + i128::from(axis.pad).abs();
        reach <= i128::from(i64::MAX)
    }

    /// CONV_2D (`ggml_conv_2d_direct`): kernel `[KW, KH, IC, OC]` (F32 or F16) over image
    /// `[W, H, IC, N]` (F32) gives `[OW, OH, OC, N]` (F32).
    pub(super) fn conv_2d(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if !matches!(a.type_id, ty::F32 | ty::F16) || b.type_id != ty::F32 || dst.type_id != ty::F32
        {
            return Err(self.refuse("CONV_2D takes an F32 or F16 kernel, an F32 image"));
        }
        // one patch of the kernel's size per output position (checked: `a` may be empty)
        let patch = a.ne[..3].iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let shapes =
            patch.is_some() && a.ne[2] == b.ne[2] && dst.ne[2] == a.ne[3] && dst.ne[3] == b.ne[3];
        if !shapes {
            return Err(self.bad(format!(
                "CONV_2D of kernel {:?} over image {:?} cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        }
        let width = self.conv_axis(0, 2, Some(4))?;
        let height = self.conv_axis(1, 3, Some(5))?;
        self.conv_output(b.ne[0], a.ne[0], width, dst.ne[0])?;
        self.conv_output(b.ne[1], a.ne[1], height, dst.ne[1])?;
        Ok(Planned {
            kernel: Kernel::Conv(ConvParams {
                axes: [width, height, ConvAxis::UNIT],
                channels: a.ne[2],
                out_channels: a.ne[3],
                three_d: false,
            }),
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![false, false],
        })
    }

    /// CONV_3D (`ggml_conv_3d_direct`): kernel `[KW, KH, KD, OC * IC]` (F32 or F16) over image
    /// `[W, H, D, N * IC]` (F32) gives `[OW, OH, OD, N * OC]` (F32); `op_params` 9..12 are
    /// `IC`, `N`, `OC`.
    pub(super) fn conv_3d(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if !matches!(a.type_id, ty::F32 | ty::F16) || b.type_id != ty::F32 || dst.type_id != ty::F32
        {
            return Err(self.refuse("CONV_3D takes an F32 or F16 kernel, an F32 image"));
        }
        let (ic, n, oc) = (
            self.positive_param(9, "input channel count")?,
            self.positive_param(10, "batch size")?,
            self.positive_param(11, "output channel count")?,
        );
        let patch = a.ne[..3].iter().try_fold(ic, |p, &d| p.checked_mul(d));
        let shapes = patch.is_some()
            && ic.checked_mul(oc) == Some(a.ne[3])
            && ic.checked_mul(n) == Some(b.ne[3])
            && oc.checked_mul(n) == Some(dst.ne[3]);
        if !shapes {
            return Err(self.bad(format!(
                "CONV_3D of kernel {:?} over image {:?} (IC {ic}, N {n}, OC {oc}) cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        }
        let axes = self.axes_3d(&a, &b, [dst.ne[0], dst.ne[1], dst.ne[2]])?;
        Ok(Planned {
            kernel: Kernel::Conv(ConvParams {
                axes,
                channels: ic,
                out_channels: oc,
                three_d: true,
            }),
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![false, false],
        })
    }

    /// COL2IM_1D (`ggml_col2im_1d`): contiguous columns `[K * OC, T_in]` (F32, F16 or BF16)
    /// give `[(T_in - 1) * s + K - 2 * p, OC]` of the same type; `op_params` are `s, OC, p`.
    pub(super) fn col2im_1d(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        if !is_float(&a) || dst.type_id != a.type_id {
            return Err(self.refuse("COL2IM_1D takes and gives one float type"));
        }
        let stride = self.positive_param(0, "stride")?;
        let channels = self.positive_param(1, "channel count")?;
        let crop = usize::try_from(self.param(2))
            .map_err(|_| self.bad(format!("negative crop {}", self.param(2))))?;
        let taps = a.ne[0] / channels;
        // ggml: `(T_in - 1) * s + K - 2 * p`, exact
        let length = (a.ne[1] as i128 - 1) * stride as i128 + taps as i128 - 2 * crop as i128;
        let shapes = a.ne[2] == 1
            && a.ne[3] == 1
            && taps >= 1
            && taps * channels == a.ne[0]
            && dst.ne[1] == channels
            && dst.ne[2] == 1
            && dst.ne[3] == 1
            && length == dst.ne[0] as i128;
        if !shapes {
            return Err(self.bad(format!(
                "COL2IM_1D of {:?} with stride {stride}, {channels} channels, crop {crop} cannot give {:?}",
                a.ne, dst.ne
            )));
        }
        if !a.is_contiguous() || !dst.is_contiguous() {
            return Err(self.bad("COL2IM_1D needs contiguous columns and result"));
        }
        Ok(Planned {
            kernel: Kernel::Col2Im1d {
                stride,
                channels,
                crop,
            },
            sources: vec![Some(a)],
            may_be_destination: vec![false],
        })
    }

    /// CONV_TRANSPOSE_1D (`ggml_conv_transpose_1d`: kernel `[K, OC, IC, 1]`, image matrix
    /// `[L, IC]`, destination `[(L - 1) * s + K, OC, 1, 1]`, `op_params` `s, 0, 1`) and
    /// CONV_TRANSPOSE_2D (`ggml_conv_transpose_2d_p0`: kernel `[KW, KH, OC, IC]`, image
    /// `[W, H, IC, N]`, destination `[(W - 1) * s + KW, (H - 1) * s + KH, OC, N]`); F32 or F16
    /// kernels, F32 images and results.
    pub(super) fn conv_transpose(&self, dst: &Layout, two_d: bool) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if !matches!(a.type_id, ty::F32 | ty::F16) || b.type_id != ty::F32 || dst.type_id != ty::F32
        {
            return Err(self.refuse("transposed convolutions take an F32 or F16 kernel, F32 data"));
        }
        let stride = usize::try_from(self.param(0))
            .ok()
            .filter(|&s| s >= 1)
            .ok_or_else(|| self.bad(format!("stride {} below 1", self.param(0))))?;
        if !two_d && (self.param(1) != 0 || self.param(2) != 1) {
            return Err(self.bad("CONV_TRANSPOSE_1D takes no padding and no dilation"));
        }
        // ggml's `(ins - 1) * s + ks`, exact
        let size = |ins: usize, taps: usize| (ins as i128 - 1) * stride as i128 + taps as i128;
        let want = if two_d {
            [
                size(b.ne[0], a.ne[0]),
                size(b.ne[1], a.ne[1]),
                a.ne[2] as i128,
                b.ne[3] as i128,
            ]
        } else {
            [size(b.ne[0], a.ne[0]), a.ne[1] as i128, 1, 1]
        };
        let shapes = if two_d {
            a.ne[3] == b.ne[2]
        } else {
            a.ne[2] == b.ne[1] && a.ne[3] == 1 && b.ne[2] == 1 && b.ne[3] == 1
        };
        if !shapes || want != dst.ne.map(|n| n as i128) {
            return Err(self.bad(format!(
                "transposed convolution of kernel {:?} over {:?} with stride {stride} cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::ConvTranspose { stride, two_d },
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![false, false],
        })
    }
}
