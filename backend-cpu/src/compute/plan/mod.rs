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

mod attention;
mod backward;
mod conv;
mod copy;
mod deepseek;
mod elementwise;
mod mask;
mod mul_mat;
mod norm;
mod optim;
mod pad;
mod pool;
mod reduce;
mod rope;
mod ssm;
mod window;

pub(crate) use conv::{Conv2dParams, ConvAxis, ConvParams, Im2ColForm, Im2ColParams};
pub(crate) use deepseek::{HC_MIX_LEN, HC_STREAMS};
pub(crate) use elementwise::{BinaryOp, GluParams, MapOp, TriKeep};
pub(crate) use pad::PadParams;
pub(crate) use pool::{PoolOp, PoolParams, ScaleMode};
pub(crate) use rope::{rope_mode, RopeParams};
pub(crate) use ssm::WkvOp;
pub(crate) use window::Window;

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
    /// TOP_K_MASK (8.0.1): each row −∞ but the (broadcast) mask's cells of the row's picks
    /// (through scores and blocks when present) and extra cells.
    TopKMask,
}

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

/// What a checker decides for a node: its kernel and the sources that kernel reads.
struct Planned {
    /// What the step runs.
    kernel: Kernel,
    /// The layout of each source slot the kernel reads, by slot; `None` for a slot it does
    /// not read.
    sources: Vec<Option<Layout>>,
    /// Per source slot, whether that source may be the destination itself (the kernel runs
    /// in place); a missing entry means no.
    may_be_destination: Vec<bool>,
}

impl Planned {
    /// A kernel reading one source, `src0`.
    fn one(kernel: Kernel, src0: Layout, may_be_destination: bool) -> Planned {
        Planned {
            kernel,
            sources: vec![Some(src0)],
            may_be_destination: vec![may_be_destination],
        }
    }
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

/// ggml-cpu's `ggml_is_quantized(t) || t == GGML_TYPE_F8_E4M3`: the types its kernels read
/// through `to_float` / `vec_dot` and write through `from_float` rather than as plain
/// numbers. F8_E4M3 (8.0.1) is not "quantized" in ggml's sense but takes the quantized paths
/// of DUP / CPY, GET_ROWS, SET_ROWS, MUL_MAT and FLASH_ATTN_EXT.
fn is_encoded(type_id: u32) -> bool {
    is_quantized(type_id) || type_id == ty::F8_E4M3
}

/// Whether rows of `type_id` can be read as f32 (plain numeric, or a quantized type — or
/// F8_E4M3 — the quant module dequantizes).
fn readable(type_id: u32) -> bool {
    Scalar::numeric(type_id).is_some() || (is_encoded(type_id) && quant::supports(type_id))
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
        let planned = self.kernel(&dst)?;
        self.check_aliasing(&dst, &planned.sources, &planned.may_be_destination)?;
        Ok(vec![self.step(planned.kernel, dst, planned.sources)])
    }

    /// The kernel of the node, the sources it reads, and which of them may be the destination:
    /// the dispatch from op to its checker.
    fn kernel(&self, dst: &Layout) -> Result<Planned> {
        let op = Op(self.op());
        match op {
            Op::DUP | Op::CONT | Op::CPY => self.copy(dst),
            Op::GET_ROWS => self.get_rows(dst),
            Op::SET_ROWS => self.set_rows(dst),
            Op::ADD | Op::SUB | Op::MUL | Op::DIV => self.binary(dst, op),
            Op::ADD1 => self.add1(dst),
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
            Op::SUM_ROWS | Op::MEAN => self.sum_rows(dst, op),
            Op::SUM => self.sum(dst),
            Op::ARGMAX => self.argmax(dst),
            Op::NORM | Op::RMS_NORM | Op::L2_NORM => self.norm(dst, op),
            Op::ADD_ID => self.add_id(dst),
            Op::ARGSORT | Op::TOP_K => self.argsort(dst, op),
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
            Op::CONCAT => self.concat(dst),
            Op::DIAG_MASK_INF | Op::DIAG_MASK_ZERO => self.diag_mask(dst, op),
            Op::REPEAT => self.repeat(dst),
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
            Op::CUMSUM => self.cumsum(dst),
            Op::TRI => self.tri(dst),
            Op::FILL => self.fill(dst),
            Op::SOLVE_TRI => self.solve_tri(dst),
            Op::GATED_DELTA_NET => self.gated_delta_net(dst),
            Op::PAD => self.pad(dst),
            Op::ROLL => self.roll(dst),
            Op::ARANGE => self.arange(dst),
            Op::TIMESTEP_EMBEDDING => self.timestep_embedding(dst),
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
            Op::TOP_K_MASK => self.top_k_mask(dst),
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
}
