//! Planning: every check a node must pass, done for the whole graph before anything runs.
//!
//! [`build`] turns each node that the CPU backend executes into a [`Step`]: the kernel with its
//! decoded `op_params`, and the [`Layout`] of the destination and of every source the kernel
//! reads. A node is refused — and with it the whole graph, before a single byte is written —
//! when
//! * its op (or sub-op, or type combination, or parameter) has no kernel here:
//!   [`Error::OpRefused`];
//! * its shapes, strides or types break the op's rules as ggml states them (source counts,
//!   broadcast rules, matching `ne`, index types, ...), a layout reaches beyond its tensor or
//!   buffer, the destination overlaps itself, or a source overlaps the destination without
//!   being exactly it (the only aliasing ggml's in-place ops produce): [`Error::InvalidGraph`].
//!
//! A node is one step, but for OPT_STEP_ADAMW, which updates two of its sources (the moments)
//! besides its destination: it becomes three steps, each writing one tensor (see
//! `Checker::adamw`).
//!
//! What cannot be checked here are values read at run time (row ids of GET_ROWS / SET_ROWS,
//! expert ids of MUL_MAT_ID): their kernels check every id before writing anything.
//!
//! Upstream references (llama.cpp b11434): op constructors and their asserts in
//! `ggml/src/ggml.c`; the CPU kernels' asserts in `ggml/src/ggml-cpu/ops.cpp`, `binary-ops.cpp`,
//! `unary-ops.cpp` and `ggml-cpu.c`.

use std::ops::Range;

use proto_core::backend::BufferId;
use proto_core::ggml::types::id as ty;
use proto_core::ggml::{op_name, type_info, GluOp, Op, UnaryOp};
use proto_core::graph::{Graph, GraphTensor};
use proto_core::{Error, Result};

use super::memory::{extent, injective};
use super::quant;
use super::view::{Layout, Scalar, I64};

/// Why an op without a kernel is refused.
pub(crate) const NOT_IMPLEMENTED: &str = "not implemented by the CPU backend";

/// One node to execute.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    /// What to run.
    pub kernel: Kernel,
    /// Where the result goes.
    pub dst: Layout,
    /// The sources the kernel reads, by ggml source slot (`None`: absent, or not read — CPY's
    /// destination operand, for one).
    pub srcs: Vec<Option<Layout>>,
}

/// The kernels, with their decoded `op_params`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kernel {
    /// DUP / CPY / CONT: element-order copy with type conversion.
    Copy,
    /// GET_ROWS.
    GetRows,
    /// SET_ROWS.
    SetRows,
    /// ADD / SUB / MUL / DIV with broadcasting of src1.
    Binary(BinaryOp),
    /// ADD1: plus a scalar tensor.
    Add1,
    /// Element-wise maps: SQR, SQRT, LOG, SIN, COS, SCALE, CLAMP, LEAKY_RELU, UNARY.
    Map(MapOp),
    /// SUM_ROWS.
    SumRows,
    /// MEAN.
    Mean,
    /// SUM.
    Sum,
    /// ARGMAX.
    ArgMax,
    /// NORM.
    Norm {
        /// Epsilon.
        eps: f32,
    },
    /// RMS_NORM.
    RmsNorm {
        /// Epsilon.
        eps: f32,
    },
    /// L2_NORM.
    L2Norm {
        /// Epsilon.
        eps: f32,
    },
    /// ADD_ID: `src0 + src1[:, ids[i1, i2]]`.
    AddId,
    /// ARGSORT of each row.
    ArgSort {
        /// Largest first.
        descending: bool,
    },
    /// TOP_K: indices of each row's `ne0` largest values.
    TopK,
    /// MUL_MAT.
    MulMat,
    /// MUL_MAT_ID.
    MulMatId,
    /// ROPE.
    Rope(RopeParams),
    /// SOFT_MAX.
    SoftMax {
        /// Scale applied before the mask.
        scale: f32,
        /// ALiBi maximum bias (0 = off).
        max_bias: f32,
    },
    /// FLASH_ATTN_EXT.
    FlashAttn {
        /// Scale of `q·k`.
        scale: f32,
        /// ALiBi maximum bias (0 = off).
        max_bias: f32,
        /// Logit soft-capping (0 = off).
        softcap: f32,
    },
    /// GLU.
    Glu(GluParams),
    /// CONCAT along `dim`.
    Concat {
        /// The dimension.
        dim: usize,
    },
    /// DIAG_MASK_INF / DIAG_MASK_ZERO.
    DiagMask {
        /// Columns before the diagonal that stay visible.
        n_past: usize,
        /// The masking value (-inf or 0).
        value: f32,
    },
    /// REPEAT.
    Repeat,
    /// SSM_CONV: each channel's sliding-window dot product with its own `d_conv` weights.
    SsmConv,
    /// SSM_SCAN: the selective-scan recurrence of Mamba 1 (`A` per state, `A.ne0 == d_state`)
    /// or Mamba 2 (`A` per head, `A.ne0 == 1`).
    SsmScan {
        /// `K` (`op_params[0]`): how many states per sequence the destination holds after the
        /// outputs: the final one, then the states `1..K` tokens before the end (rollback
        /// snapshots, Mamba 2 only when above 1).
        snapshots: usize,
    },
    /// RWKV_WKV6, RWKV_WKV7 and GATED_LINEAR_ATTN: per-head `S x S` linear-attention
    /// recurrences over the tokens of each sequence.
    Wkv(WkvOp),
    /// CUMSUM: running sum along each row.
    CumSum,
    /// TRI: keeps one triangle of each square matrix, zeroes the rest.
    Tri(TriKeep),
    /// FILL: every element set to `value` (the source's values are not read).
    Fill {
        /// The value (rounded to f16 for an F16 destination).
        value: f32,
    },
    /// SOLVE_TRI: `X` with `A X = B`, `A` lower triangular, by forward substitution.
    SolveTri,
    /// GATED_DELTA_NET: the gated delta rule over each (head, sequence) token by token.
    GatedDeltaNet {
        /// Snapshot slots of the destination (`op_params[0]`, at least 1): slot `s` holds
        /// the state `s` tokens before the last.
        snapshots: usize,
    },
    /// PAD: zeros (or, circular, the source wrapped around) before and after each dimension.
    Pad(PadParams),
    /// ROLL: each dimension rotated by its shift (element `i` goes to `i + shift`, wrapped).
    Roll {
        /// The shift of each dimension, each less than its size in magnitude.
        shifts: [i64; 4],
    },
    /// ARANGE: `start + step * i` for element `i` (flat order); no source.
    Arange {
        /// The first value.
        start: f32,
        /// The increment.
        step: f32,
    },
    /// TIMESTEP_EMBEDDING: row `i` holds `cos` then `sin` of timestep `i` times `dim / 2`
    /// geometric frequencies.
    TimestepEmbedding {
        /// The embedding width (`op_params[0]`, the destination's `ne0`).
        dim: usize,
        /// The longest period (`op_params[1]`).
        max_period: i32,
    },
    /// OUT_PROD: `dst[i0, i1, i2, i3] = Σ_k src0[i0, k, i2 / r2, i3 / r3] · src1[i1, k, i2, i3]`
    /// (src0's planes broadcast by the ratios `r2`, `r3`).
    OutProd,
    /// ROPE_BACK: ROPE's rotation by the opposite angles (the transposed rotation matrix), as
    /// the gradient of ROPE.
    RopeBack(RopeParams),
    /// SILU_BACK: `dy · σ(x) · (1 + x (1 - σ(x)))` (src0 `dy`, src1 `x`).
    SiluBack,
    /// RMS_NORM_BACK: the gradient of RMS_NORM (src0 the output's gradient, src1 its input).
    RmsNormBack {
        /// The forward pass's epsilon.
        eps: f32,
    },
    /// SOFT_MAX_BACK: `scale · (dy - dot(y, dy)) · y` per row (src0 `dy`, src1 `y`).
    SoftMaxBack {
        /// The forward pass's scale.
        scale: f32,
    },
    /// GET_ROWS_BACK: destination row `ids[i]` accumulates source row `i`, the rest is zero.
    GetRowsBack,
    /// REPEAT_BACK: each destination element sums the source elements REPEAT copied it to.
    RepeatBack,
    /// ACC: src0 with src1 added to the elements of a window of it.
    Acc(Window),
    /// SET: src0 with the elements of a window of it replaced by src1's.
    Set(Window),
    /// COUNT_EQUAL: how many elements of src0 and src1 are equal (an I64 scalar).
    CountEqual,
    /// DIAG: each row vector of src0 becomes the diagonal of a square matrix.
    Diag,
    /// CROSS_ENTROPY_LOSS: `-Σ_rows Σ labels · log_softmax(logits) / rows`, an F32 scalar.
    CrossEntropyLoss,
    /// CROSS_ENTROPY_LOSS_BACK: `(softmax(logits) - labels) · grad / rows` per row (src0 the
    /// loss's gradient, src1 the logits, src2 the labels).
    CrossEntropyLossBack,
    /// The first two steps of OPT_STEP_ADAMW, updating a moment in place (src0, the
    /// destination) from the gradient (src1) and the optimizer's parameters (src2):
    /// `m = m β1 + g (1 - β1)`, or (`second`) `v = v β2 + g² (1 - β2)`.
    AdamwMoment {
        /// `v` (β2, the squared gradient) rather than `m`.
        second: bool,
    },
    /// The last step of OPT_STEP_ADAMW: the weights (src0, the destination) from the updated
    /// moments (src1 `m`, src2 `v`) and the parameters (src3).
    AdamwWeights,
    /// OPT_STEP_SGD: `w = w (1 - α wd) - α g` (src0 the weights, the destination; src1 the
    /// gradient; src2 `α, wd`).
    SgdStep,
    /// GROUP_NORM: NORM over groups of channels (`ne2`) of each batch entry.
    GroupNorm {
        /// Channels per group: `ceil(ne2 / n_groups)` (the last group may have fewer).
        per_group: usize,
        /// Epsilon.
        eps: f32,
    },
    /// IM2COL and IM2COL_3D: every output position's receptive field, one row per position
    /// (channel, then kernel depth, row and column), zeros where it reaches outside the image.
    Im2Col(Im2ColParams),
    /// CONV_2D_DW: each channel convolved with its own kernel (depthwise), in f32.
    ConvDepthwise(Conv2dParams),
    /// CONV_2D (direct) and CONV_3D: every output channel's kernel over all input channels,
    /// each output the dot product of the kernel with the image patch under it (zeros
    /// outside).
    Conv(ConvParams),
    /// CONV_TRANSPOSE_1D / CONV_TRANSPOSE_2D (no padding, no dilation): every input position
    /// scatters its channels' dot products with the kernel taps to `input * stride + tap`.
    ConvTranspose {
        /// The stride (`op_params[0]`, at least 1).
        stride: usize,
        /// CONV_TRANSPOSE_2D: kernel `[KW, KH, OC, IC]`, image `[W, H, IC, N]`; else kernel
        /// `[K, OC, IC]`, image `[L, IC]`.
        two_d: bool,
    },
    /// POOL_1D (one axis: `kernel[1] == 1`) and POOL_2D: maximum or average of each window.
    Pool(PoolParams),
    /// UPSCALE: resampling of dimensions 0 and 1 to the destination's size (dimensions 2 and 3
    /// by nearest index).
    Upscale {
        /// The interpolation.
        mode: ScaleMode,
        /// `GGML_SCALE_FLAG_ALIGN_CORNERS`: corner pixels map onto corner pixels.
        align_corners: bool,
    },
    /// COL2IM_1D: the overlap-add of columns `[K * OC, T_in]` into `OC` signals, cropped.
    Col2Im1d {
        /// Step between columns (`op_params[0]`, at least 1).
        stride: usize,
        /// Output channels (`op_params[1]`, at least 1, dividing the column height).
        channels: usize,
        /// Positions cropped from the start (`op_params[2]`).
        crop: usize,
    },
    /// PAD_REFLECT_1D: each row mirrored at both ends (the edge element not repeated).
    PadReflect1d {
        /// Elements added before each row (less than the row length).
        left: usize,
    },
    /// LIGHTNING_INDEXER (DeepSeek's sparse-attention indexer): the score of key `ik` for
    /// token `t` is `sum_h relu(q[h, t] · k[ik]) * weights[h, t] + mask[ik, t]`.
    LightningIndexer,
    /// DSV4_HC_COMB: each token's `4 x 4` hyper-connection mixing matrix, a softmax over its
    /// mixes followed by alternating (Sinkhorn) normalizations.
    HcComb {
        /// Added to every softmax output and to every normalization's sum (`op_params[0]`).
        eps: f32,
        /// Normalization rounds (`op_params[1]`, at least 1): the first normalizes over the
        /// source streams only, each further one over the destination streams, then the
        /// source streams.
        iterations: usize,
    },
    /// DSV4_HC_PRE: each token's streams folded into one row, weighted per stream (or gated
    /// per element by a sigmoid), times `scale`.
    HcPre {
        /// The factor on every sum (`op_params[0]`).
        scale: f32,
        /// `op_params[1] != 0`: the weights are gates `[n_embd, hc, n_tokens]`, each element
        /// weighted by `sigmoid(gate)`; else one weight per stream and token.
        gated: bool,
    },
    /// DSV4_HC_POST: each token's layer output spread back over the streams (`x * post`),
    /// plus the residual streams mixed by `comb` (or kept as they are without it).
    HcPost,
}

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

/// Where ACC and SET put src1: element `(i0, i1, i2, i3)` of src1 goes to flat element
/// `offset + i0 + i1 strides[0] + i2 strides[1] + i3 strides[2]` of the (contiguous)
/// destination. The plan proved every such element inside the destination, and no two the
/// same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// The first element (`op_params[3]` in bytes, divided by the element size).
    pub offset: usize,
    /// Element strides of dimensions 1..3 (`op_params[0..3]` in bytes, divided likewise).
    pub strides: [usize; 3],
}

/// The linear-attention recurrences of [`Kernel::Wkv`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum WkvOp {
    /// RWKV_WKV6: sources `k, v, r, time_first, time_decay, state`.
    Rwkv6,
    /// RWKV_WKV7: sources `r, w, k, v, a, b, state`.
    Rwkv7,
    /// GATED_LINEAR_ATTN: sources `k, v, q, g, state`.
    GatedLinearAttn {
        /// The factor of `q` (`op_params[0]`).
        scale: f32,
    },
}

/// PAD's parameters (`op_params` 0..=8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PadParams {
    /// Elements added before each dimension (`lp0, lp1, lp2, lp3`).
    pub before: [i64; 4],
    /// Wrap around the source (a torus) instead of padding with zeros.
    pub circular: bool,
}

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

/// ROPE's parameters (`op_params` 1..=14).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RopeParams {
    /// Rotated dimensions (even, at most `ne0`).
    pub n_dims: usize,
    /// ggml rope mode: 0 normal, 2 neox, 8 mrope, 24 vision, 40 imrope.
    pub mode: i32,
    /// Original context length (YaRN).
    pub n_ctx_orig: i32,
    /// Base frequency.
    pub freq_base: f32,
    /// Frequency scale.
    pub freq_scale: f32,
    /// YaRN extrapolation mix.
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN low correction dimension parameter.
    pub beta_fast: f32,
    /// YaRN high correction dimension parameter.
    pub beta_slow: f32,
    /// M-RoPE sections.
    pub sections: [i32; 4],
    /// First rotated dimension (`op_params[15]`, `ggml_rope_set_offset`): the rotated window
    /// is `n_offs..n_offs + n_dims`, everything else is copied.
    pub n_offs: usize,
}

/// ggml rope modes.
pub(crate) mod rope_mode {
    /// `GGML_ROPE_TYPE_NORMAL`.
    pub const NORMAL: i32 = 0;
    /// `GGML_ROPE_TYPE_NEOX`.
    pub const NEOX: i32 = 2;
    /// `GGML_ROPE_TYPE_MROPE`.
    pub const MROPE: i32 = 8;
    /// `GGML_ROPE_TYPE_VISION`.
    pub const VISION: i32 = 24;
    /// `GGML_ROPE_TYPE_IMROPE`.
    pub const IMROPE: i32 = 40;
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

/// Streams of DeepSeek V4's hyper-connections: the only count DSV4_HC_COMB takes (its
/// mixing matrices are `4 x 4`).
pub(crate) const HC_STREAMS: usize = 4;
/// Mixes per token that DSV4_HC_COMB reads from: `(2 + hc) * hc` (pre weights, post weights,
/// then the `hc x hc` matrix).
pub(crate) const HC_MIX_LEN: usize = (2 + HC_STREAMS) * HC_STREAMS;

/// `GGML_PREC_DEFAULT` and `GGML_PREC_F32`, the precisions FLASH_ATTN_EXT accepts.
const PREC_DEFAULT: i32 = 0;
const PREC_F32: i32 = 10;

/// The buffers holding the bytes of computed nodes and their sources, ascending, each once:
/// the buffers `run` locks.
pub(crate) fn buffers(graph: &Graph) -> Vec<BufferId> {
    let mut ids = Vec::new();
    for (index, node) in graph.compute_nodes() {
        if node.op().is_view() {
            continue;
        }
        for used in std::iter::once(index).chain(node.sources()) {
            if let Some(location) = graph.tensor(used).location {
                ids.push(location.buffer);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Plans every node of `graph`; the first node that cannot run refuses the graph.
/// `buffer_len` answers the size of each locked buffer.
pub(crate) fn build(
    graph: &Graph,
    buffer_len: &dyn Fn(BufferId) -> Option<usize>,
) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    for (_, node) in graph.compute_nodes() {
        // G7, again: whatever the decoder let through, a custom op never runs here.
        if node.op().is_custom() {
            return Err(Error::OpRefused {
                op: node.record.op,
                reason: "custom ops carry client function pointers",
            });
        }
        // ggml_op_is_empty: layout-only ops need no work; their bytes are their source's.
        if node.op().is_view() {
            continue;
        }
        let checker = Checker {
            graph,
            node,
            buffer_len,
        };
        steps.extend(checker.plan()?);
    }
    Ok(steps)
}

/// Checks of one node.
struct Checker<'g> {
    graph: &'g Graph,
    node: &'g GraphTensor,
    buffer_len: &'g dyn Fn(BufferId) -> Option<usize>,
}

fn f32_param(raw: i32) -> f32 {
    f32::from_bits(raw as u32)
}

fn is_float(l: &Layout) -> bool {
    Scalar::float(l.type_id).is_some()
}

fn is_quantized(type_id: u32) -> bool {
    type_info(type_id).is_some_and(|info| info.block_size > 1)
}

/// Whether `type_id` has a quantizer (`quant::quantize_row` accepts it), probed on one block.
fn can_quantize(type_id: u32) -> bool {
    let Some(info) = type_info(type_id) else {
        return false;
    };
    let zeros = vec![0.0f32; info.block_size as usize];
    let mut out = vec![0u8; info.type_size as usize];
    quant::quantize_row(type_id, &zeros, &mut out).is_ok()
}

/// Whether rows of `type_id` can be read as f32 (plain numeric, or a quantized type the quant
/// module dequantizes).
fn readable(type_id: u32) -> bool {
    Scalar::numeric(type_id).is_some() || (is_quantized(type_id) && quant::supports(type_id))
}

/// How a source relates to the destination's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alias {
    Disjoint,
    Same,
    Partial,
}

fn alias(dst: &Layout, src: &Layout) -> Alias {
    match (dst.at, src.at) {
        (Some((db, d)), Some((sb, s))) if db == sb && dst.size > 0 && src.size > 0 => {
            if d < s + src.size && s < d + dst.size {
                if dst.same_layout(src) {
                    Alias::Same
                } else {
                    Alias::Partial
                }
            } else {
                Alias::Disjoint
            }
        }
        _ => Alias::Disjoint,
    }
}

impl Checker<'_> {
    fn op(&self) -> u32 {
        self.node.record.op
    }

    fn refuse(&self, reason: &'static str) -> Error {
        Error::OpRefused {
            op: self.op(),
            reason,
        }
    }

    fn bad(&self, what: impl std::fmt::Display) -> Error {
        Error::InvalidGraph(proto_core::graph::GraphError::BadNode {
            node: self.node.record.id,
            op: op_name(self.op()).unwrap_or("?"),
            reason: what.to_string(),
        })
    }

    fn param(&self, slot: usize) -> i32 {
        self.node.record.op_params[slot]
    }

    fn fparam(&self, slot: usize) -> f32 {
        f32_param(self.param(slot))
    }

    /// The layout of a tensor, checked against its buffer.
    fn layout(&self, tensor: &GraphTensor) -> Result<Layout> {
        let r = &tensor.record;
        let info = type_info(r.type_id).ok_or(Error::InvalidType { type_id: r.type_id })?;
        let to_usize =
            |v: u64| usize::try_from(v).map_err(|_| self.bad("a size beyond the address space"));
        let size = to_usize(tensor.byte_size)?;
        let layout = Layout {
            at: match tensor.location {
                Some(location) => Some((location.buffer, to_usize(location.offset)?)),
                None => None,
            },
            size,
            type_id: r.type_id,
            block: info.block_size as usize,
            type_size: info.type_size as usize,
            ne: r.ne.map(|n| n as usize),
            nb: r.nb.map(|n| n as usize),
        };
        if layout.is_empty() {
            return Ok(layout);
        }
        let Some((buffer, offset)) = layout.at else {
            return Err(self.bad(format!("tensor {:#x} has no storage", r.id)));
        };
        let fits = (self.buffer_len)(buffer)
            .zip(offset.checked_add(size))
            .is_some_and(|(len, end)| end <= len);
        if !fits {
            return Err(self.bad(format!("tensor {:#x} lies outside its buffer", r.id)));
        }
        if layout.block > 1 && layout.nb[0] != layout.type_size {
            return Err(self.bad(format!(
                "tensor {:#x}: blocks of a quantized type must be adjacent (nb[0] = {})",
                r.id, layout.nb[0]
            )));
        }
        Ok(layout)
    }

    /// Source slot `slot`, if present.
    fn src(&self, slot: usize) -> Result<Option<Layout>> {
        match self.node.src[slot] {
            Some(index) => self.layout(self.graph.tensor(index)).map(Some),
            None => Ok(None),
        }
    }

    /// Source slot `slot`, which the op requires.
    fn need(&self, slot: usize) -> Result<Layout> {
        self.src(slot)?
            .ok_or_else(|| self.bad(format!("source {slot} is missing")))
    }

    fn step(&self, kernel: Kernel, dst: Layout, srcs: Vec<Option<Layout>>) -> Step {
        Step { kernel, dst, srcs }
    }

    /// Checks how each read source relates to the destination: in-place (`Same`) only where
    /// the kernel supports it (`in_place[slot]`), never a partial overlap.
    fn check_aliasing(
        &self,
        dst: &Layout,
        srcs: &[Option<Layout>],
        in_place: &[bool],
    ) -> Result<()> {
        for (slot, src) in srcs.iter().enumerate() {
            let Some(src) = src else { continue };
            match alias(dst, src) {
                Alias::Disjoint => {}
                Alias::Same if in_place.get(slot).copied().unwrap_or(false) => {}
                Alias::Same => {
                    return Err(self.bad(format!(
                        "source {slot} is the destination, but the op cannot run in place"
                    )))
                }
                Alias::Partial => {
                    return Err(
                        self.bad(format!("source {slot} partially overlaps the destination"))
                    )
                }
            }
        }
        Ok(())
    }

    /// The steps of the node: none for an empty destination, one for most ops.
    fn plan(&self) -> Result<Vec<Step>> {
        let dst = self.layout(self.node)?;
        if dst.is_empty() {
            // Nothing to compute, nothing to touch.
            return Ok(Vec::new());
        }
        if !injective(&dst) {
            return Err(self.bad("the destination's elements overlap each other"));
        }
        if Op(self.op()) == Op::OPT_STEP_ADAMW {
            // the one op here that writes into its sources: a step per tensor it updates
            return self.adamw(&dst);
        }
        let (kernel, srcs, in_place) = self.kernel(&dst)?;
        self.check_aliasing(&dst, &srcs, &in_place)?;
        Ok(vec![self.step(kernel, dst, srcs)])
    }

    /// The kernel of the node, the sources it reads, and which of them may be the destination.
    #[allow(clippy::type_complexity)]
    fn kernel(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let op = Op(self.op());
        let one = |k: Kernel, a: Layout, in_place: bool| Ok((k, vec![Some(a)], vec![in_place]));
        match op {
            Op::DUP | Op::CONT | Op::CPY => {
                let a = self.need(0)?;
                self.check_copy(&a, dst)?;
                // CPY's src[1] is the destination operand (dst is a view of it): written, not
                // read, so it is not a source here.
                one(Kernel::Copy, a, true)
            }
            Op::GET_ROWS => self.get_rows(dst),
            Op::SET_ROWS => self.set_rows(dst),
            Op::ADD | Op::SUB | Op::MUL | Op::DIV => {
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
                Ok((
                    Kernel::Binary(binary),
                    vec![Some(a), Some(b)],
                    vec![true, true],
                ))
            }
            Op::ADD1 => {
                let (a, b) = (self.need(0)?, self.need(1)?);
                if !is_float(&a) || !is_float(&b) || !is_float(dst) {
                    return Err(self.refuse("ADD1 takes F32, F16 or BF16 tensors"));
                }
                self.same_shape(&a, dst, "src0 and the destination")?;
                if b.elements() != 1 {
                    return Err(self.bad("src1 must be a scalar"));
                }
                Ok((Kernel::Add1, vec![Some(a), Some(b)], vec![true, true]))
            }
            Op::SQR => self.map(MapOp::Sqr, dst),
            Op::SQRT => self.map(MapOp::Sqrt, dst),
            Op::LOG => self.map(MapOp::Log, dst),
            Op::SIN => self.map(MapOp::Sin, dst),
            Op::COS => self.map(MapOp::Cos, dst),
            Op::SCALE => self.map(
                MapOp::Scale {
                    s: self.fparam(0),
                    b: self.fparam(1),
                },
                dst,
            ),
            Op::CLAMP => self.map(
                MapOp::Clamp {
                    min: self.fparam(0),
                    max: self.fparam(1),
                },
                dst,
            ),
            Op::LEAKY_RELU => self.map(
                MapOp::LeakyRelu {
                    slope: self.fparam(0),
                },
                dst,
            ),
            Op::UNARY => self.unary(dst),
            Op::SUM_ROWS | Op::MEAN => {
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
                one(kernel, a, false)
            }
            Op::SUM => {
                let a = self.need(0)?;
                if !is_float(&a) || !is_float(dst) {
                    return Err(self.refuse("SUM takes F32, F16 or BF16 tensors"));
                }
                if dst.elements() != 1 {
                    return Err(self.bad("the destination of SUM must be a scalar"));
                }
                one(Kernel::Sum, a, false)
            }
            Op::ARGMAX => {
                let a = self.need(0)?;
                if !is_float(&a) || dst.type_id != ty::I32 {
                    return Err(self.refuse("ARGMAX takes a float matrix and gives I32"));
                }
                if a.ne[2] != 1 || a.ne[3] != 1 || dst.ne != [a.ne[1], 1, 1, 1] {
                    return Err(self.bad(format!("ARGMAX of {:?} into {:?}", a.ne, dst.ne)));
                }
                one(Kernel::ArgMax, a, false)
            }
            Op::NORM | Op::RMS_NORM | Op::L2_NORM => {
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
                one(kernel, a, true)
            }
            Op::ADD_ID => {
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
                Ok((
                    Kernel::AddId,
                    vec![Some(a), Some(b), Some(ids)],
                    vec![true, false, false],
                ))
            }
            Op::ARGSORT | Op::TOP_K => {
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
                one(kernel, a, false)
            }
            Op::MUL_MAT => self.mul_mat(dst),
            Op::MUL_MAT_ID => self.mul_mat_id(dst),
            Op::ROPE => self.rope(dst, false),
            Op::ROPE_BACK => self.rope(dst, true),
            Op::OUT_PROD => self.out_prod(dst),
            Op::SILU_BACK => self.silu_back(dst),
            Op::RMS_NORM_BACK => self.rms_norm_back(dst),
            Op::SOFT_MAX_BACK => self.soft_max_back(dst),
            Op::GET_ROWS_BACK => self.get_rows_back(dst),
            Op::REPEAT_BACK => self.repeat_back(dst),
            Op::ACC => self.acc_or_set(dst, true),
            Op::SET => self.acc_or_set(dst, false),
            Op::COUNT_EQUAL => self.count_equal(dst),
            Op::DIAG => self.diag(dst),
            Op::GROUP_NORM => self.group_norm(dst),
            Op::CROSS_ENTROPY_LOSS => self.cross_entropy_loss(dst),
            Op::CROSS_ENTROPY_LOSS_BACK => self.cross_entropy_loss_back(dst),
            Op::OPT_STEP_SGD => self.sgd(dst),
            Op::SOFT_MAX => self.soft_max(dst),
            Op::FLASH_ATTN_EXT => self.flash_attn(dst),
            Op::GLU => self.glu(dst),
            Op::CONCAT => {
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
                Ok((
                    Kernel::Concat { dim },
                    vec![Some(a), Some(b)],
                    vec![false, false],
                ))
            }
            Op::DIAG_MASK_INF | Op::DIAG_MASK_ZERO => {
                let a = self.need(0)?;
                if !is_float(&a) || !is_float(dst) {
                    return Err(self.refuse("diagonal masks take F32, F16 or BF16 tensors"));
                }
                self.same_shape(&a, dst, "src0 and the destination")?;
                let n_past =
                    usize::try_from(self.param(0)).map_err(|_| self.bad("negative n_past"))?;
                let value = if op == Op::DIAG_MASK_INF {
                    f32::NEG_INFINITY
                } else {
                    0.0
                };
                one(Kernel::DiagMask { n_past, value }, a, true)
            }
            Op::REPEAT => {
                let a = self.need(0)?;
                if a.type_id != dst.type_id || a.block != 1 {
                    return Err(self.refuse("REPEAT keeps one plain type"));
                }
                self.repeats(&a, dst, "src0 does not repeat into the destination")?;
                one(Kernel::Repeat, a, false)
            }
            Op::SSM_CONV => self.ssm_conv(dst),
            Op::SSM_SCAN => self.ssm_scan(dst),
            Op::RWKV_WKV6 => self.wkv(dst, WkvOp::Rwkv6),
            Op::RWKV_WKV7 => self.wkv(dst, WkvOp::Rwkv7),
            Op::GATED_LINEAR_ATTN => self.wkv(
                dst,
                WkvOp::GatedLinearAttn {
                    scale: self.fparam(0),
                },
            ),
            Op::CUMSUM => {
                let a = self.need(0)?;
                if a.type_id != ty::F32 || dst.type_id != ty::F32 {
                    return Err(self.refuse("CUMSUM takes and gives F32"));
                }
                self.same_shape(&a, dst, "src0 and the destination")?;
                if !a.dense_rows() || !dst.dense_rows() {
                    return Err(self.bad("CUMSUM needs rows of adjacent elements"));
                }
                one(Kernel::CumSum, a, true)
            }
            Op::TRI => {
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
                one(Kernel::Tri(keep), a, true)
            }
            Op::FILL => {
                let a = self.need(0)?;
                if !matches!(a.type_id, ty::F32 | ty::F16) || dst.type_id != a.type_id {
                    return Err(self.refuse("FILL takes and gives F32 or F16"));
                }
                self.same_shape(&a, dst, "src0 and the destination")?;
                if !a.is_contiguous() {
                    return Err(self.bad("FILL needs a contiguous source"));
                }
                // src0 only gives the shape: the kernel writes without reading it
                Ok((
                    Kernel::Fill {
                        value: self.fparam(0),
                    },
                    vec![None],
                    vec![true],
                ))
            }
            Op::SOLVE_TRI => self.solve_tri(dst),
            Op::GATED_DELTA_NET => self.gated_delta_net(dst),
            Op::PAD => self.pad(dst),
            Op::ROLL => {
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
                one(Kernel::Roll { shifts }, a, false)
            }
            Op::ARANGE => {
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
                Ok((Kernel::Arange { start, step }, Vec::new(), Vec::new()))
            }
            Op::TIMESTEP_EMBEDDING => {
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
                Ok((
                    Kernel::TimestepEmbedding {
                        dim,
                        max_period: self.param(1),
                    },
                    vec![Some(a)],
                    vec![false],
                ))
            }
            Op::IM2COL => self.im2col(dst),
            Op::CONV_2D_DW => self.conv_2d_dw(dst),
            Op::CONV_2D => self.conv_2d(dst),
            Op::IM2COL_3D => self.im2col_3d(dst),
            Op::CONV_3D => self.conv_3d(dst),
            Op::COL2IM_1D => self.col2im_1d(dst),
            Op::CONV_TRANSPOSE_1D => self.conv_transpose(dst, false),
            Op::CONV_TRANSPOSE_2D => self.conv_transpose(dst, true),
            Op::POOL_1D | Op::POOL_2D => self.pool(dst, op == Op::POOL_1D),
            Op::UPSCALE => self.upscale(dst),
            Op::PAD_REFLECT_1D => self.pad_reflect_1d(dst),
            Op::LIGHTNING_INDEXER => self.lightning_indexer(dst),
            Op::DSV4_HC_COMB => self.hc_comb(dst),
            Op::DSV4_HC_PRE => self.hc_pre(dst),
            Op::DSV4_HC_POST => self.hc_post(dst),
            _ => Err(self.refuse(NOT_IMPLEMENTED)),
        }
    }

    fn same_shape(&self, a: &Layout, b: &Layout, what: &str) -> Result<()> {
        if a.same_shape(b) {
            Ok(())
        } else {
            Err(self.bad(format!("{what} differ in shape ({:?} vs {:?})", a.ne, b.ne)))
        }
    }

    /// ggml_can_repeat(small, big): every dimension of `big` a multiple of `small`'s.
    fn repeats(&self, small: &Layout, big: &Layout, what: &str) -> Result<()> {
        let ok = (0..4).all(|d| small.ne[d] > 0 && big.ne[d].is_multiple_of(small.ne[d]));
        if ok {
            Ok(())
        } else {
            Err(self.bad(format!("{what} ({:?} vs {:?})", small.ne, big.ne)))
        }
    }

    #[allow(clippy::type_complexity)]
    fn map(&self, map: MapOp, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let a = self.need(0)?;
        if !is_float(&a) || !is_float(dst) {
            return Err(self.refuse("element-wise ops take F32, F16 or BF16 tensors"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        Ok((Kernel::Map(map), vec![Some(a)], vec![true]))
    }

    #[allow(clippy::type_complexity)]
    fn unary(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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

    /// DUP / CPY / CONT: same element count, and a conversion the copy kernel has.
    fn check_copy(&self, a: &Layout, dst: &Layout) -> Result<()> {
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
            || (Scalar::float(from).is_some() && is_quantized(to) && can_quantize(to))
            || (is_quantized(from) && quant::supports(from) && Scalar::float(to).is_some());
        if !supported {
            return Err(self.refuse("copy between these types is not supported"));
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn get_rows(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::GetRows,
            vec![Some(a), Some(rows)],
            vec![false, false],
        ))
    }

    #[allow(clippy::type_complexity)]
    fn set_rows(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (a, rows) = (self.need(0)?, self.need(1)?);
        if rows.type_id != ty::I32 && rows.type_id != I64 {
            return Err(self.bad("row ids must be I32 or I64"));
        }
        if !is_float(&a) {
            return Err(self.refuse("SET_ROWS takes F32, F16 or BF16 rows"));
        }
        if !(is_float(dst) || (is_quantized(dst.type_id) && can_quantize(dst.type_id))) {
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
        Ok((
            Kernel::SetRows,
            vec![Some(a), Some(rows)],
            vec![false, false],
        ))
    }

    /// The weight types MUL_MAT / MUL_MAT_ID take: plain floats, or quantized types with a dot
    /// product whose activation type the quant module can produce.
    fn check_weights(&self, w: &Layout, k: usize) -> Result<()> {
        if is_float(w) {
            return Ok(());
        }
        let vdt = if is_quantized(w.type_id) && quant::supports(w.type_id) {
            quant::vec_dot_type(w.type_id)
        } else {
            None
        };
        let Some(vdt) = vdt.filter(|&t| can_quantize(t)) else {
            return Err(self.refuse("weights of this type are not supported"));
        };
        let block = type_info(vdt).map_or(0, |i| i.block_size as usize);
        if block == 0 || !k.is_multiple_of(block) {
            return Err(self.bad(format!(
                "ne[0] = {k} is not a multiple of the activation block"
            )));
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn mul_mat(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (w, x) = (self.need(0)?, self.need(1)?);
        if !is_float(&x) || dst.type_id != ty::F32 {
            return Err(self.refuse("MUL_MAT takes float activations and gives F32"));
        }
        self.check_weights(&w, w.ne[0])?;
        let shapes = w.ne[0] == x.ne[0]
            && w.ne[2] > 0
            && w.ne[3] > 0
            && x.ne[2] % w.ne[2] == 0
            && x.ne[3] % w.ne[3] == 0
            && dst.ne == [w.ne[1], x.ne[1], x.ne[2], x.ne[3]];
        if !shapes {
            return Err(self.bad(format!("{:?} x {:?} cannot give {:?}", w.ne, x.ne, dst.ne)));
        }
        Ok((Kernel::MulMat, vec![Some(w), Some(x)], vec![false, false]))
    }

    #[allow(clippy::type_complexity)]
    fn mul_mat_id(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (w, x, ids) = (self.need(0)?, self.need(1)?, self.need(2)?);
        if !is_float(&x) || dst.type_id != ty::F32 {
            return Err(self.refuse("MUL_MAT_ID takes float activations and gives F32"));
        }
        if ids.type_id != ty::I32 {
            return Err(self.bad("expert ids must be I32"));
        }
        self.check_weights(&w, w.ne[0])?;
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
        Ok((
            Kernel::MulMatId,
            vec![Some(w), Some(x), Some(ids)],
            vec![false, false, false],
        ))
    }

    /// ROPE and ROPE_BACK (same sources and parameters; `backward` rotates the other way).
    #[allow(clippy::type_complexity)]
    fn rope(
        &self,
        dst: &Layout,
        backward: bool,
    ) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (a, pos) = (self.need(0)?, self.need(1)?);
        let factors = self.src(2)?;
        if !is_float(&a) || a.type_id != dst.type_id {
            return Err(self.refuse("ROPE takes and gives one float type"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if pos.type_id != ty::I32 {
            return Err(self.bad("positions must be I32"));
        }
        let mut sections = [0i32; 4];
        sections.copy_from_slice(&self.node.record.op_params[11..15]);
        let params = RopeParams {
            n_dims: usize::try_from(self.param(1)).map_err(|_| self.bad("negative n_dims"))?,
            mode: self.param(2),
            n_ctx_orig: self.param(4),
            freq_base: self.fparam(5),
            freq_scale: self.fparam(6),
            ext_factor: self.fparam(7),
            attn_factor: self.fparam(8),
            beta_fast: self.fparam(9),
            beta_slow: self.fparam(10),
            sections,
            n_offs: usize::try_from(self.param(15))
                .map_err(|_| self.bad("negative rotated-window offset (op_params[15])"))?,
        };
        use rope_mode::*;
        let mrope = match params.mode {
            NORMAL | NEOX => false,
            MROPE | VISION | IMROPE => true,
            _ => return Err(self.refuse("unknown rope mode")),
        };
        let ne0 = a.ne[0];
        if !params.n_dims.is_multiple_of(2) || params.n_dims > ne0 {
            return Err(self.bad(format!("n_dims = {} with ne[0] = {ne0}", params.n_dims)));
        }
        if params.mode == VISION && params.n_dims * 2 != ne0 {
            return Err(self.bad("vision rope rotates half of ne[0]"));
        }
        // The rotated window `n_offs..n_offs + n_dims` must lie inside the row, start on a
        // pair, and vision mode (which rotates the whole row) takes none.
        let n_offs = params.n_offs;
        if !n_offs.is_multiple_of(2)
            || n_offs
                .checked_add(params.n_dims)
                .is_none_or(|end| end > ne0)
            || (params.mode == VISION && n_offs != 0)
        {
            return Err(self.bad(format!(
                "rotated window offset {n_offs} with n_dims = {} and ne[0] = {ne0}",
                params.n_dims
            )));
        }
        if mrope {
            let total: i64 = sections.iter().map(|&s| i64::from(s)).sum();
            if sections.iter().any(|&s| s < 0) || total <= 0 || total as usize > ne0 {
                return Err(self.bad(format!("invalid m-rope sections {sections:?}")));
            }
        }
        let per_token = if mrope { 4 } else { 1 };
        // ggml_is_vector(b): one row of positions (an empty one has none to read)
        if pos.ne[1..] != [1, 1, 1] || pos.ne[0] < per_token * a.ne[2] {
            return Err(self.bad(format!("{} positions for {} tokens", pos.ne[0], a.ne[2])));
        }
        if let Some(f) = &factors {
            if !is_float(f) || f.is_empty() || f.ne[0] < params.n_dims / 2 {
                return Err(self.bad("frequency factors must be floats, n_dims/2 of them"));
            }
        }
        let kernel = if backward {
            Kernel::RopeBack(params)
        } else {
            Kernel::Rope(params)
        };
        Ok((
            kernel,
            vec![Some(a), Some(pos), factors],
            vec![true, false, false],
        ))
    }

    #[allow(clippy::type_complexity)]
    fn soft_max(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let a = self.need(0)?;
        let (mask, sinks) = (self.src(1)?, self.src(2)?);
        if !is_float(&a) || !is_float(dst) {
            return Err(self.refuse("SOFT_MAX takes F32, F16 or BF16 tensors"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if let Some(m) = &mask {
            let ok = is_float(m)
                && m.ne[0] == a.ne[0]
                && m.ne[1] >= a.ne[1]
                && m.ne[2] > 0
                && m.ne[3] > 0
                && a.ne[2] % m.ne[2] == 0
                && a.ne[3] % m.ne[3] == 0;
            if !ok {
                return Err(self.bad(format!("mask {:?} does not fit {:?}", m.ne, a.ne)));
            }
        }
        if let Some(s) = &sinks {
            if !is_float(s) || s.is_empty() || s.ne[0] < a.ne[2] {
                return Err(self.bad("sinks must be floats, one per head"));
            }
        }
        Ok((
            Kernel::SoftMax {
                scale: self.fparam(0),
                max_bias: self.fparam(1),
            },
            vec![Some(a), mask, sinks],
            vec![true, true, false],
        ))
    }

    #[allow(clippy::type_complexity)]
    fn flash_attn(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (q, k, v) = (self.need(0)?, self.need(1)?, self.need(2)?);
        let (mask, sinks) = (self.src(3)?, self.src(4)?);
        if !is_float(&q) || dst.type_id != ty::F32 || !readable(k.type_id) || !readable(v.type_id) {
            return Err(self.refuse("FLASH_ATTN_EXT takes float Q, readable K/V, and gives F32"));
        }
        if Scalar::numeric(k.type_id) == Some(Scalar::I32)
            || Scalar::numeric(v.type_id) == Some(Scalar::I32)
        {
            return Err(self.refuse("FLASH_ATTN_EXT does not take integer K/V"));
        }
        let prec = self.param(3);
        if prec != PREC_DEFAULT && prec != PREC_F32 {
            return Err(self.refuse("unknown precision"));
        }
        let (dk, dv, n_kv, n_q, n_head) = (q.ne[0], v.ne[0], k.ne[1], q.ne[1], q.ne[2]);
        let kv_fits = |t: &Layout| {
            t.ne[2] > 0 && t.ne[3] > 0 && n_head % t.ne[2] == 0 && q.ne[3] % t.ne[3] == 0
        };
        let shapes = dk > 0
            && dv > 0
            && k.ne[0] == dk
            && v.ne[1] == n_kv
            && kv_fits(&k)
            && kv_fits(&v)
            && dst.ne == [dv, n_head, n_q, q.ne[3]];
        if !shapes {
            return Err(self.bad(format!(
                "q {:?}, k {:?}, v {:?} cannot give {:?}",
                q.ne, k.ne, v.ne, dst.ne
            )));
        }
        if let Some(m) = &mask {
            let ok = is_float(m)
                && m.ne[0] >= n_kv
                && m.ne[1] >= n_q
                && m.ne[2] > 0
                && m.ne[3] > 0
                && n_head % m.ne[2] == 0
                && q.ne[3] % m.ne[3] == 0;
            if !ok {
                return Err(self.bad(format!(
                    "mask {:?} does not fit q {:?}, k {:?}",
                    m.ne, q.ne, k.ne
                )));
            }
        }
        if let Some(s) = &sinks {
            if !is_float(s) || s.is_empty() || s.ne[0] < n_head {
                return Err(self.bad("sinks must be floats, one per head"));
            }
        }
        Ok((
            Kernel::FlashAttn {
                scale: self.fparam(0),
                max_bias: self.fparam(1),
                softcap: self.fparam(2),
            },
            vec![Some(q), Some(k), Some(v), mask, sinks],
            vec![false; 5],
        ))
    }

    /// PAD: `dst.ne[d] = ne[d] + before[d] + after[d]` in every dimension (pads may be
    /// negative: a crop); circular padding wraps around a non-empty source.
    #[allow(clippy::type_complexity)]
    fn pad(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::Pad(PadParams { before, circular }),
            vec![Some(a)],
            vec![false],
        ))
    }

    #[allow(clippy::type_complexity)]
    fn solve_tri(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if a.type_id != ty::F32 || b.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("SOLVE_TRI takes and gives F32"));
        }
        let shapes = a.ne[0] == a.ne[1]
            && a.ne[1] == b.ne[1]
            && a.ne[2] == b.ne[2]
            && a.ne[3] == b.ne[3]
            && dst.ne == b.ne;
        if !shapes {
            return Err(self.bad(format!(
                "A {:?} and B {:?} cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        }
        if !a.is_contiguous() || !b.is_contiguous() {
            return Err(self.bad("SOLVE_TRI needs contiguous A and B"));
        }
        Ok((Kernel::SolveTri, vec![Some(a), Some(b)], vec![false, false]))
    }

    /// GATED_DELTA_NET: q, k, v `[S_v, heads, tokens, seqs]` (q and k with fewer heads or
    /// sequences, taken modulo and by ratio as ggml does), gate `[1 or S_v, H, T, B]`, beta
    /// `[1, H, T, B]`, state `[S_v, S_v, H, B]`; the destination holds the outputs
    /// `[S_v * H, T * B]` followed by `snapshots` states of `S_v` rows per sequence.
    #[allow(clippy::type_complexity)]
    fn gated_delta_net(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let srcs = [
            self.need(0)?,
            self.need(1)?,
            self.need(2)?,
            self.need(3)?,
            self.need(4)?,
            self.need(5)?,
        ];
        if srcs.iter().any(|s| s.type_id != ty::F32) || dst.type_id != ty::F32 {
            return Err(self.refuse("GATED_DELTA_NET takes and gives F32"));
        }
        let [q, k, v, gate, beta, state] = srcs;
        let [s_v, heads, tokens, seqs] = v.ne;
        // q and k: same row length and tokens; heads taken modulo, sequences by ratio
        let shares = |t: &Layout| {
            t.ne[0] == s_v
                && t.ne[2] == tokens
                && t.ne[1] > 0
                && t.ne[3] > 0
                && seqs.is_multiple_of(t.ne[3])
        };
        let gate_ok = (gate.ne[0] == 1 || gate.ne[0] == s_v) && gate.ne[1..] == v.ne[1..];
        let shapes = shares(&q)
            && shares(&k)
            && gate_ok
            && beta.ne == [1, heads, tokens, seqs]
            && state.ne == [s_v, s_v, heads, seqs];
        if !shapes {
            return Err(self.bad(format!(
                "q {:?}, k {:?}, v {:?}, g {:?}, beta {:?}, state {:?} do not fit",
                q.ne, k.ne, v.ne, gate.ne, beta.ne, state.ne
            )));
        }
        if !(q.dense_rows() && k.dense_rows() && v.dense_rows()) {
            return Err(self.bad("q, k and v need rows of adjacent elements"));
        }
        if !(gate.is_contiguous() && beta.is_contiguous() && state.is_contiguous()) {
            return Err(self.bad("g, beta and the state must be contiguous"));
        }
        let snapshots = usize::try_from(self.param(0))
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| self.bad(format!("snapshot count {} below 1", self.param(0))))?;
        let rows = snapshots
            .checked_mul(s_v)
            .and_then(|n| n.checked_mul(seqs))
            .and_then(|n| n.checked_add(tokens.checked_mul(seqs)?));
        let width = s_v.checked_mul(heads);
        if width
            .zip(rows)
            .is_none_or(|(width, rows)| dst.ne != [width, rows, 1, 1])
        {
            return Err(self.bad(format!(
                "destination {:?} is not [S_v * H, T * B + {snapshots} * S_v * B]",
                dst.ne
            )));
        }
        Ok((
            Kernel::GatedDeltaNet { snapshots },
            srcs.map(Some).to_vec(),
            vec![false; 6],
        ))
    }

    #[allow(clippy::type_complexity)]
    fn glu(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((Kernel::Glu(params), vec![Some(a), b], vec![false, false]))
    }

    /// SSM_CONV (`ggml_ssm_conv`): `sx {d_conv - 1 + n_t, d_inner, n_s}` and
    /// `c {d_conv, d_inner}` give `{d_inner, n_t, n_s}`, all F32 (the only type ggml-cpu has),
    /// with the element strides ggml-cpu asserts.
    #[allow(clippy::type_complexity)]
    fn ssm_conv(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (sx, c) = (self.need(0)?, self.need(1)?);
        if sx.type_id != ty::F32 || c.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("SSM_CONV takes and gives F32"));
        }
        let (d_conv, d_inner) = (c.ne[0], c.ne[1]);
        // ggml_is_3d(sx), ggml_is_matrix(c), and at least one window per sequence
        let tokens = sx.ne[0].saturating_add(1).checked_sub(d_conv);
        let shapes = sx.ne[3] == 1
            && c.ne[2] == 1
            && c.ne[3] == 1
            && sx.ne[1] == d_inner
            && tokens.is_some_and(|n_t| dst.ne == [d_inner, n_t, sx.ne[2], 1]);
        if !shapes {
            return Err(self.bad(format!(
                "SSM_CONV of {:?} with weights {:?} cannot give {:?}",
                sx.ne, c.ne, dst.ne
            )));
        }
        if sx.nb[0] != 4 || c.nb[0] != 4 || sx.ne[0].checked_mul(4) != Some(sx.nb[1]) {
            return Err(self.bad("SSM_CONV needs packed rows of sx (and of c's elements)"));
        }
        Ok((Kernel::SsmConv, vec![Some(sx), Some(c)], vec![false, false]))
    }

    /// SSM_SCAN (`ggml_ssm_scan`): `s {d_state, head_dim, n_head, n_rs}`,
    /// `x {head_dim, n_head, n_t, n_s}`, `dt {n_head, n_t, n_s}`, `A {1 or d_state, n_head}`,
    /// `B`, `C {d_state, n_group, n_t, n_s}`, `ids {n_s}` (I32, which state of `s` each
    /// sequence starts from: checked at run time) give a 1-D F32 tensor of the outputs (`x`'s
    /// shape) followed by `K` states per sequence.
    #[allow(clippy::type_complexity)]
    fn ssm_scan(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let [s, x, dt, a, b, c, ids] = [0, 1, 2, 3, 4, 5, 6].map(|slot| self.need(slot));
        let (s, x, dt, a, b, c, ids) = (s?, x?, dt?, a?, b?, c?, ids?);
        if ids.type_id != ty::I32 {
            return Err(self.bad("sequence ids must be I32"));
        }
        if [&s, &x, &dt, &a, &b, &c, dst]
            .iter()
            .any(|t| t.type_id != ty::F32)
        {
            return Err(self.refuse("SSM_SCAN takes and gives F32"));
        }
        let snapshots = usize::try_from(self.param(0))
            .ok()
            .filter(|&k| k >= 1)
            .ok_or_else(|| self.bad("K (op_params[0]) must be at least 1"))?;
        let (d_state, head_dim, n_head, n_tokens, n_seqs) =
            (s.ne[0], x.ne[0], x.ne[1], x.ne[2], x.ne[3]);
        let n_group = b.ne[1];
        let shapes = dt.ne == [n_head, n_tokens, n_seqs, 1]
            && s.ne[1] == head_dim
            && s.ne[2] == n_head
            && b.same_shape(&c)
            && b.ne[0] == d_state
            && b.ne[2] == n_tokens
            && b.ne[3] == n_seqs
            && d_state > 0
            && n_group > 0
            && n_head.is_multiple_of(n_group)
            && ids.ne == [n_seqs, 1, 1, 1]
            && a.ne[1] == n_head
            && a.ne[2] == 1
            && a.ne[3] == 1
            && (a.ne[0] == 1 || (a.ne[0] == d_state && snapshots == 1));
        if !shapes {
            return Err(self.bad(format!(
                "SSM_SCAN of s {:?}, x {:?}, dt {:?}, A {:?}, B {:?}, C {:?}, ids {:?} with K = {snapshots}",
                s.ne, x.ne, dt.ne, a.ne, b.ne, c.ne, ids.ne
            )));
        }
        let total = [d_state, head_dim, n_head, n_seqs]
            .iter()
            .try_fold(snapshots, |n, &d| n.checked_mul(d))
            .and_then(|states| states.checked_add(x.elements()));
        if total.is_none_or(|total| dst.ne != [total, 1, 1, 1]) {
            return Err(self.bad(format!(
                "SSM_SCAN of x {:?} and s {:?} with K = {snapshots} cannot give {:?}",
                x.ne, s.ne, dst.ne
            )));
        }
        // the layouts ggml asserts (its kernel walks them as packed runs)
        let packed_rows = |t: &Layout| t.nb[0] == 4 && t.ne[0].checked_mul(4) == Some(t.nb[1]);
        let strides = s.is_contiguous()
            && dt.is_contiguous()
            && a.is_contiguous()
            && packed_rows(&x)
            && packed_rows(&b)
            && packed_rows(&c)
            && ids.nb[0] == 4;
        if !strides {
            return Err(
                self.bad("SSM_SCAN needs contiguous s, dt and A, packed rows of x, B and C")
            );
        }
        Ok((
            Kernel::SsmScan { snapshots },
            [s, x, dt, a, b, c, ids].map(Some).to_vec(),
            vec![false; 7],
        ))
    }

    /// RWKV_WKV6 / RWKV_WKV7 / GATED_LINEAR_ATTN (`ggml_rwkv_wkv6`, `ggml_rwkv_wkv7`,
    /// `ggml_gated_linear_attn`): contiguous F32 sources, the per-token ones
    /// `{S, H, n_tokens}`, RWKV 6's `time_first` `S * H` values, the state `S * S * H` values per
    /// sequence (`state.ne1` sequences, which share the tokens evenly), giving
    /// `{S * H, n_tokens + S * n_seqs}`: the outputs, then the final states.
    #[allow(clippy::type_complexity)]
    fn wkv(&self, dst: &Layout, op: WkvOp) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let count = match op {
            WkvOp::Rwkv6 => 6,
            WkvOp::Rwkv7 => 7,
            WkvOp::GatedLinearAttn { .. } => 5,
        };
        let srcs = (0..count)
            .map(|slot| self.need(slot))
            .collect::<Result<Vec<_>>>()?;
        if srcs.iter().chain([dst]).any(|t| t.type_id != ty::F32) {
            return Err(self.refuse("linear-attention recurrences take and give F32"));
        }
        if !srcs.iter().all(Layout::is_contiguous) {
            return Err(self.bad("linear-attention recurrences need contiguous sources"));
        }
        // k sets the sizes (slot 0 in RWKV 6 and GLA, 2 in RWKV 7); the state is last
        let key = if op == WkvOp::Rwkv7 { 2 } else { 0 };
        let (head_size, heads, tokens) = (srcs[key].ne[0], srcs[key].ne[1], srcs[key].ne[2]);
        let state = srcs[count - 1];
        let n_seqs = state.ne[1];
        let per_token = [head_size, heads, tokens, 1];
        // an empty k passes the buffer check whatever its sizes: their products are checked
        let width = head_size.checked_mul(heads);
        let token_inputs_fit =
            srcs[..count - 1]
                .iter()
                .enumerate()
                .all(|(slot, t)| match (op, slot) {
                    // RWKV 6's time_first: one value per head and key, read flat
                    (WkvOp::Rwkv6, 3) => Some(t.elements()) == width,
                    _ => t.ne == per_token,
                });
        let state_len = [head_size, head_size, heads, n_seqs]
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        let rows = head_size
            .checked_mul(n_seqs)
            .and_then(|n| n.checked_add(tokens));
        let shapes = token_inputs_fit
            && n_seqs > 0
            && tokens.is_multiple_of(n_seqs)
            && state_len == Some(state.elements())
            && width
                .zip(rows)
                .is_some_and(|(width, rows)| dst.ne == [width, rows, 1, 1]);
        if !shapes {
            let ne: Vec<_> = srcs.iter().map(|t| t.ne).collect();
            return Err(self.bad(format!(
                "sources {ne:?} cannot give {:?} (S = {head_size}, H = {heads}, {tokens} tokens, {n_seqs} sequences)",
                dst.ne
            )));
        }
        let in_place = vec![false; count];
        Ok((
            Kernel::Wkv(op),
            srcs.into_iter().map(Some).collect(),
            in_place,
        ))
    }

    /// OUT_PROD (`ggml_out_prod`): `a {m, k, ne2, ne3}` and `b {n, k, ne2·r2, ne3·r3}` give
    /// F32 `{m, n, ne2·r2, ne3·r3}`. ggml-cpu takes F32 `b`, and F32 `a` (broadcast over the
    /// last two dimensions) or F16 / quantized `a` (without broadcast); rows of `a` and of the
    /// destination are packed along dimension 0, `b` may have any strides (a transposed `b`).
    #[allow(clippy::type_complexity)]
    fn out_prod(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((Kernel::OutProd, vec![Some(a), Some(b)], vec![false, false]))
    }

    /// SILU_BACK (`ggml_silu_back`): the gradient `dy` (src0) and the forward input `x` (src1),
    /// both of the destination's shape and float type; ggml may compute it in place of either.
    #[allow(clippy::type_complexity)]
    fn silu_back(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (dy, x) = (self.need(0)?, self.need(1)?);
        if !is_float(&dy) || dy.type_id != dst.type_id || x.type_id != dst.type_id {
            return Err(self.refuse("SILU_BACK takes and gives one float type"));
        }
        self.same_shape(&dy, dst, "the gradient and the destination")?;
        self.same_shape(&x, dst, "the forward input and the destination")?;
        Ok((Kernel::SiluBack, vec![Some(dy), Some(x)], vec![true, true]))
    }

    /// RMS_NORM_BACK (`ggml_rms_norm_back`): the gradient (src0) and the forward input (src1),
    /// F32 with packed rows, of the destination's shape; epsilon as RMS_NORM's.
    #[allow(clippy::type_complexity)]
    fn rms_norm_back(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::RmsNormBack { eps },
            vec![Some(dz), Some(x)],
            vec![false, false],
        ))
    }

    /// SOFT_MAX_BACK (`ggml_soft_max_ext_back`): the gradient `dy` (src0) and the forward output
    /// `y` (src1), contiguous F32 of the destination's shape; ggml-cpu has no ALiBi
    /// (`max_bias`, `op_params[1]`, must be 0). ggml may compute it in place of either source.
    #[allow(clippy::type_complexity)]
    fn soft_max_back(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::SoftMaxBack {
                scale: self.fparam(0),
            },
            vec![Some(dy), Some(y)],
            vec![true, true],
        ))
    }

    /// GET_ROWS_BACK (`ggml_get_rows_back`): a matrix of gradient rows (src0, F32 or F16, packed
    /// rows) and a vector of I32 row ids (src1, at most as many as src0 has rows) give a
    /// contiguous F32 matrix as wide as src0. The ids are checked at run time.
    #[allow(clippy::type_complexity)]
    fn get_rows_back(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::GetRowsBack,
            vec![Some(grad), Some(ids)],
            vec![false, false],
        ))
    }

    /// REPEAT_BACK (`ggml_repeat_back`): F32 src0 whose every dimension is a multiple of the
    /// destination's (same type), both packed along dimension 0.
    #[allow(clippy::type_complexity)]
    fn repeat_back(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let a = self.need(0)?;
        if a.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("REPEAT_BACK takes and gives F32"));
        }
        self.repeats(dst, &a, "the destination does not repeat into src0")?;
        if !a.dense_rows() || !dst.dense_rows() {
            return Err(self.bad("REPEAT_BACK needs src0 and the destination packed along ne[0]"));
        }
        Ok((Kernel::RepeatBack, vec![Some(a)], vec![false]))
    }

    /// ACC (`acc == true`) and SET (`ggml_acc_impl`, `ggml_set_impl`): src0 and the destination
    /// contiguous, same shape and type (F32; SET also I32); src1 of that type with packed rows,
    /// no more elements than src0; op_params `nb1, nb2, nb3, offset` (bytes) place src1 in the
    /// destination. They are client values: each must be a non-negative multiple of the
    /// element size, the whole window inside the destination, and its elements distinct (ggml
    /// checks less: where it writes past the tensor or races, this refuses). `op_params[4]`
    /// (ggml's "in place") needs no decoding: src0 is copied unless it is the destination.
    #[allow(clippy::type_complexity)]
    fn acc_or_set(
        &self,
        dst: &Layout,
        acc: bool,
    ) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        let type_ok = if acc {
            a.type_id == ty::F32
        } else {
            a.type_id == ty::F32 || a.type_id == ty::I32
        };
        if !type_ok || b.type_id != a.type_id || dst.type_id != a.type_id {
            return Err(self.refuse(if acc {
                "ACC takes and gives F32"
            } else {
                "SET takes and gives F32 or I32"
            }));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if !a.is_contiguous() || !dst.is_contiguous() || !b.dense_rows() {
            return Err(self.bad("src0 and the destination must be contiguous, src1 packed"));
        }
        if b.elements() > a.elements() {
            return Err(self.bad("src1 has more elements than src0"));
        }
        let size = a.type_size;
        let bytes = [0, 1, 2, 3].map(|slot| self.param(slot));
        let in_elements = bytes.map(|v| {
            usize::try_from(v)
                .ok()
                .filter(|v| v.is_multiple_of(size))
                .map(|v| v / size)
        });
        let [Some(s1), Some(s2), Some(s3), Some(offset)] = in_elements else {
            return Err(self.bad(format!(
                "window strides and offset {bytes:?} must be non-negative multiples of {size}"
            )));
        };
        let window = Layout {
            ne: b.ne,
            nb: [size, s1 * size, s2 * size, s3 * size],
            ..*dst
        };
        if !b.is_empty() {
            let inside = extent(&window)
                .and_then(|end| end.checked_add(offset * size))
                .is_some_and(|end| end <= dst.size);
            if !inside {
                return Err(self.bad(format!(
                    "a window of {:?} at strides {bytes:?} reaches beyond the destination",
                    b.ne
                )));
            }
            if !injective(&window) {
                return Err(self.bad("the window's elements overlap each other"));
            }
        }
        let window = Window {
            offset,
            strides: [s1, s2, s3],
        };
        let kernel = if acc {
            Kernel::Acc(window)
        } else {
            Kernel::Set(window)
        };
        Ok((kernel, vec![Some(a), Some(b)], vec![true, false]))
    }

    /// COUNT_EQUAL (`ggml_count_equal`): two I32 tensors of one shape give an I64 scalar.
    #[allow(clippy::type_complexity)]
    fn count_equal(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if a.type_id != ty::I32 || b.type_id != ty::I32 || dst.type_id != I64 {
            return Err(self.refuse("COUNT_EQUAL takes I32 tensors and gives I64"));
        }
        self.same_shape(&a, &b, "the two sources")?;
        if dst.ne != [1, 1, 1, 1] {
            return Err(self.bad("the destination of COUNT_EQUAL must be a scalar"));
        }
        Ok((
            Kernel::CountEqual,
            vec![Some(a), Some(b)],
            vec![false, false],
        ))
    }

    /// DIAG (`ggml_diag`): F32 rows `{n, 1, ne2, ne3}` give `{n, n, ne2, ne3}`, both packed
    /// along dimension 0.
    #[allow(clippy::type_complexity)]
    fn diag(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((Kernel::Diag, vec![Some(a)], vec![false]))
    }

    /// GROUP_NORM (`ggml_group_norm`): F32 with packed rows, the destination of src0's shape;
    /// op_params `n_groups` (positive) and `eps`. ggml may compute it in place.
    #[allow(clippy::type_complexity)]
    fn group_norm(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::GroupNorm {
                per_group: a.ne[2].div_ceil(groups),
                eps,
            },
            vec![Some(a)],
            vec![true],
        ))
    }

    /// CROSS_ENTROPY_LOSS (`ggml_cross_entropy_loss`): F32 logits and labels of one shape,
    /// packed along dimension 0, give an F32 scalar.
    #[allow(clippy::type_complexity)]
    fn cross_entropy_loss(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::CrossEntropyLoss,
            vec![Some(logits), Some(labels)],
            vec![false, false],
        ))
    }

    /// CROSS_ENTROPY_LOSS_BACK (`ggml_cross_entropy_loss_back`): an F32 scalar gradient,
    /// contiguous F32 logits and labels of the destination's shape (contiguous too).
    #[allow(clippy::type_complexity)]
    fn cross_entropy_loss_back(
        &self,
        dst: &Layout,
    ) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::CrossEntropyLossBack,
            vec![Some(grad), Some(logits), Some(labels)],
            vec![false; 3],
        ))
    }

    /// The optimizer steps' common rules: the destination is the weights (src0) themselves
    /// (ggml's result is a view of them, and it writes the weights), F32; the per-element
    /// tensors `others` share the weights' shape and strides (ggml's kernel walks them all
    /// with the weights' strides), rows packed; `params` holds `count` contiguous F32 values.
    fn optimizer_operands(
        &self,
        dst: &Layout,
        weights: &Layout,
        others: &[Layout],
        params: &Layout,
        count: usize,
    ) -> Result<()> {
        if weights.type_id != ty::F32 || others.iter().any(|t| t.type_id != ty::F32) {
            return Err(self.refuse("optimizer steps take F32 tensors"));
        }
        if params.type_id != ty::F32 {
            return Err(self.bad("optimizer parameters must be F32"));
        }
        if alias(dst, weights) != Alias::Same {
            return Err(self.bad("the destination must be the weights (src0) themselves"));
        }
        if others
            .iter()
            .any(|t| t.ne != weights.ne || t.nb != weights.nb)
        {
            return Err(
                self.bad("the optimizer's tensors differ from the weights in shape or strides")
            );
        }
        if !weights.dense_rows() {
            return Err(self.bad("optimizer steps need rows packed along ne[0]"));
        }
        if params.elements() != count || !params.is_contiguous() {
            return Err(self.bad(format!("the optimizer needs {count} contiguous parameters")));
        }
        Ok(())
    }

    /// OPT_STEP_SGD (`ggml_opt_step_sgd`): weights, gradient, and `α, wd`.
    #[allow(clippy::type_complexity)]
    fn sgd(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (w, g, params) = (self.need(0)?, self.need(1)?, self.need(2)?);
        self.optimizer_operands(dst, &w, &[g], &params, 2)?;
        Ok((
            Kernel::SgdStep,
            vec![Some(w), Some(g), Some(params)],
            vec![true, false, false],
        ))
    }

    /// OPT_STEP_ADAMW (`ggml_opt_step_adamw`): weights, gradient, moments `m` and `v`, and the
    /// seven parameters `α, β1, β2, eps, wd, β1h, β2h`. ggml updates `m`, `v` and the weights
    /// element by element, each weight from its element's new moments; here three steps do
    /// the same arithmetic one tensor at a time (`m`, then `v`, then the weights), each
    /// writing only its own destination. Every tensor must be apart from the others (checked
    /// per step: the gradient and the parameters are sources of all three, so no step
    /// overwrites what a later one reads).
    fn adamw(&self, dst: &Layout) -> Result<Vec<Step>> {
        let [w, g, m, v, params] = [0, 1, 2, 3, 4].map(|slot| self.need(slot));
        let (w, g, m, v, params) = (w?, g?, m?, v?, params?);
        self.optimizer_operands(dst, &w, &[g, m, v], &params, 7)?;
        // the moments are destinations of their steps: as any destination, injective
        if !injective(&m) || !injective(&v) {
            return Err(self.bad("a moment's elements overlap each other"));
        }
        let moment = |second: bool, target: Layout| -> Result<Step> {
            let srcs = vec![Some(target), Some(g), Some(params), Some(w)];
            // the weights are listed (not read) so that this step may not write them
            self.check_aliasing(&target, &srcs, &[true, false, false, false])?;
            Ok(self.step(Kernel::AdamwMoment { second }, target, srcs))
        };
        let first = moment(false, m)?;
        let second = moment(true, v)?;
        // the moments must not overlap each other either
        self.check_aliasing(&v, &[Some(m)], &[false])?;
        let srcs = vec![Some(w), Some(m), Some(v), Some(params), Some(g)];
        self.check_aliasing(dst, &srcs, &[true, false, false, false, false])?;
        let weights = self.step(Kernel::AdamwWeights, *dst, srcs);
        Ok(vec![first, second, weights])
    }

    /// A convolution axis from `op_params[stride]`, `[pad]`, `[dilation]` (`dilation: None`:
    /// 1, a pooling window): stride and dilation at least 1, any padding.
    fn conv_axis(&self, stride: usize, pad: usize, dilation: Option<usize>) -> Result<ConvAxis> {
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
    fn conv_output(&self, input: usize, taps: usize, axis: ConvAxis, out: usize) -> Result<()> {
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
    #[allow(clippy::type_complexity)]
    fn im2col(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::Im2Col(Im2ColParams {
                axes: [width, height, ConvAxis::UNIT],
                taps: [kw, kh, 1],
                channels: ic,
                form: if two_d {
                    Im2ColForm::TwoD
                } else {
                    Im2ColForm::OneD
                },
            }),
            vec![None, Some(b)],
            vec![false, false],
        ))
    }

    /// `op_params[slot]` as a count of at least 1 (`what` names it).
    fn positive_param(&self, slot: usize, what: &str) -> Result<usize> {
        usize::try_from(self.param(slot))
            .ok()
            .filter(|&c| c >= 1)
            .ok_or_else(|| self.bad(format!("{what} {} below 1", self.param(slot))))
    }

    /// The width, height and depth axes of IM2COL_3D and CONV_3D (`op_params` 0..9: strides,
    /// paddings, dilations), checked against the image `b`, kernel `a` and the destination's
    /// output sizes `out`.
    fn axes_3d(&self, a: &Layout, b: &Layout, out: [usize; 3]) -> Result<[ConvAxis; 3]> {
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
    #[allow(clippy::type_complexity)]
    fn im2col_3d(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::Im2Col(Im2ColParams {
                axes,
                taps: [kw, kh, kd],
                channels: ic,
                form: Im2ColForm::ThreeD,
            }),
            vec![None, Some(b)],
            vec![false, false],
        ))
    }

    /// CONV_2D_DW (`ggml_conv_2d_dw_direct`): kernel `[KW, KH, 1, C]` (F32 or F16) over
    /// image `[W, H, C, N]` (F32) gives `[OW, OH, C, N]` (F32), any strides (ggml's channel-
    /// first and channel-last layouts alike).
    #[allow(clippy::type_complexity)]
    fn conv_2d_dw(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::ConvDepthwise(Conv2dParams {
                axes: [width, height],
            }),
            vec![Some(a), Some(b)],
            vec![false, false],
        ))
    }

    /// POOL_1D (`op_params`: op, k0, s0, p0) and POOL_2D (op, k0, k1, s0, s1, p0, p1): an F32
    /// or F16 source gives F32 windows of `(n + 2p - k) / s + 1` per pooled axis (ggml's
    /// `ggml_calc_pool_output_size`, in floating point), other dimensions kept.
    #[allow(clippy::type_complexity)]
    fn pool(&self, dst: &Layout, one_d: bool) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::Pool(PoolParams {
                op,
                kernel: [k0, k1],
                axes,
                one_d,
            }),
            vec![Some(a)],
            vec![false],
        ))
    }

    /// Whether every position of `out` windows of `taps` along `axis` fits an `i64`.
    fn conv_output_bound(&self, taps: usize, axis: ConvAxis, out: usize) -> bool {
        let reach = (out as i128 - 1) * i128::from(axis.stride)
            + (taps as i128 - 1).max(0) * i128::from(axis.dilation)
            + i128::from(axis.pad).abs();
        reach <= i128::from(i64::MAX)
    }

    /// UPSCALE (`ggml_interpolate`): F32 to F32 of any non-empty sizes; `op_params[0]` is the
    /// mode (low byte) with the align-corners and antialias flags (antialias only bilinear).
    #[allow(clippy::type_complexity)]
    fn upscale(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::Upscale {
                mode,
                align_corners: flags & ALIGN_CORNERS != 0,
            },
            vec![Some(a)],
            vec![false],
        ))
    }

    /// PAD_REFLECT_1D (`ggml_pad_reflect_1d`): F32 rows padded by `p0` and `p1` mirrored
    /// elements, each in `0..ne0`.
    #[allow(clippy::type_complexity)]
    fn pad_reflect_1d(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((Kernel::PadReflect1d { left }, vec![Some(a)], vec![false]))
    }

    /// CONV_2D (`ggml_conv_2d_direct`): kernel `[KW, KH, IC, OC]` (F32 or F16) over image
    /// `[W, H, IC, N]` (F32) gives `[OW, OH, OC, N]` (F32).
    #[allow(clippy::type_complexity)]
    fn conv_2d(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::Conv(ConvParams {
                axes: [width, height, ConvAxis::UNIT],
                channels: a.ne[2],
                out_channels: a.ne[3],
                three_d: false,
            }),
            vec![Some(a), Some(b)],
            vec![false, false],
        ))
    }

    /// CONV_3D (`ggml_conv_3d_direct`): kernel `[KW, KH, KD, OC * IC]` (F32 or F16) over image
    /// `[W, H, D, N * IC]` (F32) gives `[OW, OH, OD, N * OC]` (F32); `op_params` 9..12 are
    /// `IC`, `N`, `OC`.
    #[allow(clippy::type_complexity)]
    fn conv_3d(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::Conv(ConvParams {
                axes,
                channels: ic,
                out_channels: oc,
                three_d: true,
            }),
            vec![Some(a), Some(b)],
            vec![false, false],
        ))
    }

    /// COL2IM_1D (`ggml_col2im_1d`): contiguous columns `[K * OC, T_in]` (F32, F16 or BF16)
    /// give `[(T_in - 1) * s + K - 2 * p, OC]` of the same type; `op_params` are `s, OC, p`.
    #[allow(clippy::type_complexity)]
    fn col2im_1d(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::Col2Im1d {
                stride,
                channels,
                crop,
            },
            vec![Some(a)],
            vec![false],
        ))
    }

    /// CONV_TRANSPOSE_1D (`ggml_conv_transpose_1d`: kernel `[K, OC, IC, 1]`, image matrix
    /// `[L, IC]`, destination `[(L - 1) * s + K, OC, 1, 1]`, `op_params` `s, 0, 1`) and
    /// CONV_TRANSPOSE_2D (`ggml_conv_transpose_2d_p0`: kernel `[KW, KH, OC, IC]`, image
    /// `[W, H, IC, N]`, destination `[(W - 1) * s + KW, (H - 1) * s + KH, OC, N]`); F32 or F16
    /// kernels, F32 images and results.
    #[allow(clippy::type_complexity)]
    fn conv_transpose(
        &self,
        dst: &Layout,
        two_d: bool,
    ) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
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
        Ok((
            Kernel::ConvTranspose { stride, two_d },
            vec![Some(a), Some(b)],
            vec![false, false],
        ))
    }

    /// LIGHTNING_INDEXER (`ggml_lightning_indexer`): `q {D, H, T, S}` (F32), keys
    /// `k {D, 1, n_kv, S}` (F32, F16, BF16 or a quantized type ggml can dequantize), `weights
    /// {H, T, 1, S}` (F32) and `mask {n_kv, T, 1, S'}` (F16, `S'` dividing `S`: the streams
    /// share masks by `s % S'`) give F32 `{n_kv, T, 1, S}`. ggml-cpu asserts packed elements
    /// along dimension 0 of every tensor; the other strides are free.
    #[allow(clippy::type_complexity)]
    fn lightning_indexer(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (q, k, weights, mask) = (self.need(0)?, self.need(1)?, self.need(2)?, self.need(3)?);
        if q.type_id != ty::F32
            || weights.type_id != ty::F32
            || mask.type_id != ty::F16
            || dst.type_id != ty::F32
        {
            return Err(self.refuse(
                "LIGHTNING_INDEXER takes F32 queries and weights, an F16 mask, and gives F32",
            ));
        }
        if !(is_float(&k) || (is_quantized(k.type_id) && quant::supports(k.type_id))) {
            return Err(self.refuse("LIGHTNING_INDEXER keys of this type are not supported"));
        }
        let [width, heads, tokens, streams] = q.ne;
        let n_kv = k.ne[2];
        let shapes = k.ne == [width, 1, n_kv, streams]
            && weights.ne == [heads, tokens, 1, streams]
            && mask.ne[..3] == [n_kv, tokens, 1]
            && mask.ne[3] > 0
            && streams.is_multiple_of(mask.ne[3])
            && dst.ne == [n_kv, tokens, 1, streams];
        if !shapes {
            return Err(self.bad(format!(
                "q {:?}, k {:?}, weights {:?}, mask {:?} cannot give {:?}",
                q.ne, k.ne, weights.ne, mask.ne, dst.ne
            )));
        }
        if ![&q, &k, &weights, &mask, dst]
            .iter()
            .all(|t| t.dense_rows())
        {
            return Err(self.bad("LIGHTNING_INDEXER needs packed elements along dimension 0"));
        }
        Ok((
            Kernel::LightningIndexer,
            [q, k, weights, mask].map(Some).to_vec(),
            vec![false; 4],
        ))
    }

    /// DSV4_HC_COMB (`ggml_dsv4_hc_comb`): `mixes {(2 + hc) * hc, n_tokens}`, `scale {>= 3}`
    /// and `base {(2 + hc) * hc}`, all F32, give F32 `{hc, hc, n_tokens}`; ggml takes only
    /// `hc = 4` (24 mixes per token, of which the last 16 are the matrix). Any strides.
    #[allow(clippy::type_complexity)]
    fn hc_comb(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (mixes, scale, base) = (self.need(0)?, self.need(1)?, self.need(2)?);
        if [&mixes, &scale, &base, dst]
            .iter()
            .any(|t| t.type_id != ty::F32)
        {
            return Err(self.refuse("DSV4_HC_COMB takes and gives F32"));
        }
        let (streams, mix_len) = (HC_STREAMS, HC_MIX_LEN);
        let tokens = mixes.ne[1];
        let shapes = mixes.ne == [mix_len, tokens, 1, 1]
            && scale.ne[0] >= 3
            && scale.ne[1..] == [1, 1, 1]
            && base.ne == [mix_len, 1, 1, 1]
            && dst.ne == [streams, streams, tokens, 1];
        if !shapes {
            return Err(self.bad(format!(
                "mixes {:?}, scale {:?}, base {:?} cannot give {:?} ({streams} streams: \
                 {mix_len} mixes per token)",
                mixes.ne, scale.ne, base.ne, dst.ne
            )));
        }
        let iterations = usize::try_from(self.param(1))
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| self.bad(format!("iteration count {} below 1", self.param(1))))?;
        Ok((
            Kernel::HcComb {
                eps: self.fparam(0),
                iterations,
            },
            vec![Some(mixes), Some(scale), Some(base)],
            vec![false; 3],
        ))
    }

    /// DSV4_HC_PRE (`ggml_dsv4_hc_pre` / `ggml_dsv4_hc_pre_gated`): `x {n_embd, hc, n_tokens}`
    /// with `weights {hc, n_tokens}` (or gates `{n_embd, hc, n_tokens}` when `op_params[1]`
    /// is not 0), all F32, give F32 `{n_embd, n_tokens}`, `hc` at least 1. Any strides.
    #[allow(clippy::type_complexity)]
    fn hc_pre(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (x, weights) = (self.need(0)?, self.need(1)?);
        if [&x, &weights, dst].iter().any(|t| t.type_id != ty::F32) {
            return Err(self.refuse("DSV4_HC_PRE takes and gives F32"));
        }
        let gated = self.param(1) != 0;
        let [n_embd, streams, tokens, _] = x.ne;
        let weights_fit = if gated {
            weights.ne == [n_embd, streams, tokens, 1]
        } else {
            weights.ne == [streams, tokens, 1, 1]
        };
        let shapes = streams > 0 && x.ne[3] == 1 && weights_fit && dst.ne == [n_embd, tokens, 1, 1];
        if !shapes {
            return Err(self.bad(format!(
                "x {:?} with {} {:?} cannot give {:?}",
                x.ne,
                if gated { "gates" } else { "weights" },
                weights.ne,
                dst.ne
            )));
        }
        Ok((
            Kernel::HcPre {
                scale: self.fparam(0),
                gated,
            },
            vec![Some(x), Some(weights)],
            vec![false; 2],
        ))
    }

    /// DSV4_HC_POST (`ggml_dsv4_hc_post`): `x {n_embd, n_tokens}`, `residual {n_embd, hc,
    /// n_tokens}`, `post {hc, n_tokens}` and the optional `comb {hc, hc, n_tokens}`, all F32,
    /// give F32 `{n_embd, hc, n_tokens}`, `hc` at least 1. Any strides.
    #[allow(clippy::type_complexity)]
    fn hc_post(&self, dst: &Layout) -> Result<(Kernel, Vec<Option<Layout>>, Vec<bool>)> {
        let (x, residual, post) = (self.need(0)?, self.need(1)?, self.need(2)?);
        let comb = self.src(3)?;
        if [&x, &residual, &post, dst]
            .into_iter()
            .chain(&comb)
            .any(|t| t.type_id != ty::F32)
        {
            return Err(self.refuse("DSV4_HC_POST takes and gives F32"));
        }
        let [n_embd, tokens, _, _] = x.ne;
        let streams = residual.ne[1];
        let shapes = streams > 0
            && x.ne[2..] == [1, 1]
            && residual.ne == [n_embd, streams, tokens, 1]
            && post.ne == [streams, tokens, 1, 1]
            && comb
                .as_ref()
                .is_none_or(|c| c.ne == [streams, streams, tokens, 1])
            && dst.ne == [n_embd, streams, tokens, 1];
        if !shapes {
            return Err(self.bad(format!(
                "x {:?}, residual {:?}, post {:?}, comb {:?} cannot give {:?}",
                x.ne,
                residual.ne,
                post.ne,
                comb.map(|c| c.ne),
                dst.ne
            )));
        }
        Ok((
            Kernel::HcPost,
            vec![Some(x), Some(residual), Some(post), comb],
            vec![false; 4],
        ))
    }
}
