//! The kernels, one file per op family, and what they share.
//!
//! | file | ops |
//! |---|---|
//! | `copy.rs` | DUP, CPY, CONT (type conversion, quantization, dequantization), CONCAT, REPEAT |
//! | `rows.rs` | GET_ROWS, SET_ROWS |
//! | `elementwise.rs` | ADD, SUB, MUL, DIV (src1 broadcast), ADD1, ADD_ID, the element-wise maps |
//! | `unary.rs` | the maps' math: UNARY sub-ops, SQR, SQRT, LOG, SIN, COS, SCALE, CLAMP, LEAKY_RELU |
//! | `glu.rs` | GLU (REGLU, GEGLU, SWIGLU, SWIGLU_OAI, GEGLU_ERF, GEGLU_QUICK, SWIGLU_CLAMP) |
//! | `reduce.rs` | SUM_ROWS, MEAN, SUM, ARGMAX, ARGSORT, TOP_K, COUNT_EQUAL |
//! | `norm.rs` | NORM, RMS_NORM, L2_NORM, GROUP_NORM |
//! | `mul_mat.rs` | MUL_MAT, MUL_MAT_ID |
//! | `rope.rs` | ROPE (normal, neox, multi-section, vision; YaRN), ROPE_BACK |
//! | `out_prod.rs` | OUT_PROD |
//! | `backward.rs` | SILU_BACK, RMS_NORM_BACK, SOFT_MAX_BACK, GET_ROWS_BACK, REPEAT_BACK |
//! | `softmax.rs` | SOFT_MAX (mask, ALiBi, sinks), DIAG_MASK_INF, DIAG_MASK_ZERO |
//! | `attention.rs` | FLASH_ATTN_EXT |
//! | `ssm.rs` | SSM_CONV, SSM_SCAN (Mamba 1 and 2) |
//! | `rwkv.rs` | RWKV_WKV6, RWKV_WKV7, GATED_LINEAR_ATTN |
//! | `scan.rs` | CUMSUM, TRI, FILL, SOLVE_TRI, DIAG |
//! | `window.rs` | ACC, SET |
//! | `optim.rs` | CROSS_ENTROPY_LOSS, CROSS_ENTROPY_LOSS_BACK, OPT_STEP_ADAMW, OPT_STEP_SGD |
//! | `delta_net.rs` | GATED_DELTA_NET |
//! | `pad.rs` | PAD, ROLL, ARANGE, TIMESTEP_EMBEDDING |
//! | `conv.rs` | IM2COL, IM2COL_3D, CONV_2D_DW, CONV_2D, CONV_3D, CONV_TRANSPOSE_1D, CONV_TRANSPOSE_2D, COL2IM_1D |
//! | `pool.rs` | POOL_1D, POOL_2D, UPSCALE, PAD_REFLECT_1D |
//! | `deepseek.rs` | LIGHTNING_INDEXER, DSV4_HC_COMB, DSV4_HC_PRE, DSV4_HC_POST |
//!
//! A kernel gets its sources as [`Input`]s and its destination as a `memory::Dst`, splits the
//! destination into parts (rows, or row x column tiles), and gives the parts to the pool. Each
//! output element is computed the same way whatever the split, so any thread count gives the
//! same bytes. Arithmetic follows ggml's CPU backend: f32 compute for every storage type,
//! `f64` accumulation where ggml uses `ggml_float`, ggml's lookup tables for GELU.

mod attention;
mod backward;
mod conv;
mod copy;
mod deepseek;
mod delta_net;
mod elementwise;
// FLASH_ATTN_EXT's accumulators, with runtime-detected AVX2/FMA/F16C loops (see its docs).
#[allow(unsafe_code)]
mod fa_accumulate;
mod glu;
mod mul_mat;
mod norm;
mod optim;
mod out_prod;
mod pad;
mod pool;
mod reduce;
mod rope;
mod rows;
mod rwkv;
mod scan;
mod softmax;
mod sort;
mod ssm;
mod top_k_mask;
mod unary;
mod window;

#[cfg(test)]
pub(super) use unary::{gelu_exact, gelu_quick_exact};

use proto_core::wire::MAX_SRC;
use proto_core::Result;

use super::memory::{Arena, Dst, DstPart, NodeMemory, Src};
use super::plan::{Kernel, Step};
use super::pool::Pool;
use super::scratch::{self, Scratch};
use super::view::{encode, internal, Input, Layout, Scalar, SrcView};

/// What the nodes of one graph computation may reuse from earlier nodes of it.
#[derive(Debug, Default)]
pub(crate) struct GraphMemo {
    /// ROPE's `(cos, sin)` tables.
    rope: rope::RopeTables,
}

/// Runs one planned node.
pub(crate) fn execute(
    step: &Step,
    arena: &mut Arena<'_>,
    pool: &Pool,
    memo: &mut GraphMemo,
) -> Result<()> {
    let NodeMemory { dst, srcs } = arena.node(&step.dst, &step.srcs)?;
    // Filled where it lies: the array is a kilobyte, worth not moving for every node.
    let mut node = Node {
        pool,
        inputs: [None; MAX_SRC],
    };
    for ((input, layout), src) in node.inputs.iter_mut().zip(&step.srcs).zip(srcs) {
        *input = match (layout, src) {
            (Some(layout), Some(Src::Bytes(bytes))) => Some(Input::View(SrcView {
                bytes,
                layout: *layout,
            })),
            (Some(layout), Some(Src::Dst)) => Some(Input::Dst(*layout)),
            _ => None,
        };
    }
    match step.kernel {
        Kernel::Copy => copy::copy(&node, dst),
        Kernel::Concat { dim } => copy::concat(&node, dst, dim),
        Kernel::Repeat => copy::repeat(&node, dst),
        Kernel::GetRows => rows::get_rows(&node, dst),
        Kernel::SetRows => rows::set_rows(&node, dst),
        Kernel::Binary(op) => elementwise::binary(&node, dst, op),
        Kernel::Add1 => elementwise::add1(&node, dst),
        Kernel::Map(op) => elementwise::map(&node, dst, op),
        Kernel::Glu(params) => glu::glu(&node, dst, params),
        Kernel::SumRows => reduce::sum_rows(&node, dst, false),
        Kernel::Mean => reduce::sum_rows(&node, dst, true),
        Kernel::Sum => reduce::sum(&node, dst),
        Kernel::ArgMax => reduce::argmax(&node, dst),
        Kernel::Norm { eps } => norm::norm(&node, dst, eps),
        Kernel::RmsNorm { eps } => norm::rms_norm(&node, dst, eps),
        Kernel::L2Norm { eps } => norm::l2_norm(&node, dst, eps),
        Kernel::AddId => elementwise::add_id(&node, dst),
        Kernel::ArgSort { descending } => reduce::argsort(&node, dst, descending),
        Kernel::TopK => reduce::top_k(&node, dst),
        Kernel::MulMat => mul_mat::mul_mat(&node, dst),
        Kernel::MulMatId => mul_mat::mul_mat_id(&node, dst),
        Kernel::Rope(params) => rope::rope(&node, dst, params, false, &mut memo.rope),
        Kernel::RopeBack(params) => rope::rope(&node, dst, params, true, &mut memo.rope),
        Kernel::OutProd => out_prod::out_prod(&node, dst),
        Kernel::SiluBack => backward::silu_back(&node, dst),
        Kernel::RmsNormBack { eps } => backward::rms_norm_back(&node, dst, eps),
        Kernel::SoftMaxBack { scale } => backward::soft_max_back(&node, dst, scale),
        Kernel::GetRowsBack => backward::get_rows_back(&node, dst),
        Kernel::RepeatBack => backward::repeat_back(&node, dst),
        Kernel::Acc(window) => window::acc_or_set(&node, dst, window, true),
        Kernel::Set(window) => window::acc_or_set(&node, dst, window, false),
        Kernel::CountEqual => reduce::count_equal(&node, dst),
        Kernel::Diag => scan::diag(&node, dst),
        Kernel::GroupNorm { per_group, eps } => norm::group_norm(&node, dst, per_group, eps),
        Kernel::CrossEntropyLoss => optim::cross_entropy_loss(&node, dst),
        Kernel::CrossEntropyLossBack => optim::cross_entropy_loss_back(&node, dst),
        Kernel::AdamwMoment { second } => optim::adamw_moment(&node, dst, second),
        Kernel::AdamwWeights => optim::adamw_weights(&node, dst),
        Kernel::SgdStep => optim::sgd_step(&node, dst),
        Kernel::SoftMax { scale, max_bias } => softmax::soft_max(&node, dst, scale, max_bias),
        Kernel::DiagMask { n_past, value } => softmax::diag_mask(&node, dst, n_past, value),
        Kernel::FlashAttn {
            scale,
            max_bias,
            softcap,
        } => attention::flash_attn(&node, dst, scale, max_bias, softcap),
        Kernel::SsmConv => ssm::ssm_conv(&node, dst),
        Kernel::SsmScan { snapshots } => ssm::ssm_scan(&node, dst, snapshots),
        Kernel::Wkv(op) => rwkv::wkv(&node, dst, op),
        Kernel::CumSum => scan::cumsum(&node, dst),
        Kernel::Tri(keep) => scan::tri(&node, dst, keep),
        Kernel::Fill { value } => scan::fill(&node, dst, value),
        Kernel::SolveTri => scan::solve_tri(&node, dst),
        Kernel::GatedDeltaNet { snapshots } => delta_net::gated_delta_net(&node, dst, snapshots),
        Kernel::Pad(params) => pad::pad(&node, dst, params),
        Kernel::Roll { shifts } => pad::roll(&node, dst, shifts),
        Kernel::Arange { start, step } => pad::arange(&node, dst, start, step),
        Kernel::TimestepEmbedding { dim, max_period } => {
            pad::timestep_embedding(&node, dst, dim, max_period)
        }
        Kernel::Im2Col(params) => conv::im2col(&node, dst, params),
        Kernel::ConvDepthwise(window) => conv::conv_2d_dw(&node, dst, window),
        Kernel::Conv(params) => conv::conv(&node, dst, params),
        Kernel::Col2Im1d {
            stride,
            channels,
            crop,
        } => conv::col2im_1d(&node, dst, stride, channels, crop),
        Kernel::ConvTranspose { stride, two_d } => conv::conv_transpose(&node, dst, stride, two_d),
        Kernel::Pool(params) => pool::pool(&node, dst, params),
        Kernel::Upscale {
            mode,
            align_corners,
        } => pool::upscale(&node, dst, mode, align_corners),
        Kernel::PadReflect1d { left } => pool::pad_reflect_1d(&node, dst, left),
        Kernel::LightningIndexer => deepseek::lightning_indexer(&node, dst),
        Kernel::HcComb { eps, iterations } => deepseek::hc_comb(&node, dst, eps, iterations),
        Kernel::HcPre { scale, gated } => deepseek::hc_pre(&node, dst, scale, gated),
        Kernel::HcPost => deepseek::hc_post(&node, dst),
        Kernel::TopKMask => top_k_mask::top_k_mask(&node, dst),
    }
}

/// What a kernel gets besides its destination.
pub(super) struct Node<'a> {
    /// The threads.
    pub pool: &'a Pool,
    /// The sources, by slot (`None` past the node's last).
    pub inputs: [Option<Input<'a>>; MAX_SRC],
}

impl<'a> Node<'a> {
    /// Source `slot` (read in place or not).
    pub fn input(&self, slot: usize) -> Result<Input<'a>> {
        self.inputs
            .get(slot)
            .copied()
            .flatten()
            .ok_or_else(|| internal("a planned source is missing"))
    }

    /// Source `slot`, which the plan guarantees is not the destination.
    pub fn view(&self, slot: usize) -> Result<SrcView<'a>> {
        match self.input(slot)? {
            Input::View(view) => Ok(view),
            Input::Dst(_) => Err(internal(
                "a source that must not alias the destination does",
            )),
        }
    }

    /// Optional source `slot`, never the destination.
    pub fn optional_view(&self, slot: usize) -> Result<Option<SrcView<'a>>> {
        match self.inputs.get(slot).copied().flatten() {
            None => Ok(None),
            Some(_) => self.view(slot).map(Some),
        }
    }
}

/// The destination's element type as a [`Scalar`] (float kernels only write those).
fn dst_scalar(layout: &Layout) -> Result<Scalar> {
    Scalar::numeric(layout.type_id)
        .ok_or_else(|| internal("a float kernel with a non-float destination"))
}

/// The common shape of row kernels: every destination row `idx` is computed from row `idx` of
/// `src` (same shape as the destination; read in place if it is the destination) by
/// `f(state, part, idx, src_row, out_row)`, all in f32, and stored in the destination type.
/// `state` is per work item (`init`), for scratch space and caches. `cost` estimates the work
/// per element, to decide whether the node is worth spreading over threads.
pub(super) fn map_rows<S>(
    node: &Node<'_>,
    mut dst: Dst<'_>,
    src: Input<'_>,
    cost: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &DstPart<'_>, [usize; 3], &[f32], &mut [f32]) -> Result<()> + Sync,
) -> Result<()> {
    let layout = *dst.layout();
    let scalar = dst_scalar(&layout)?;
    let ne0 = layout.ne[0];
    let chunk = node.pool.chunk(layout.rows(), ne0.saturating_mul(cost));
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || {
            let (x, y) = (scratch::zeroed::<f32>(ne0), scratch::zeroed::<f32>(ne0));
            (init(), x, y, scratch::zeroed::<u8>(0))
        },
        |(state, x, y, bytes), mut part: DstPart<'_>| {
            for r in part.rows() {
                let idx = layout.row_index(r);
                src.load_f32(&part, idx, x, bytes)?;
                f(state, &part, idx, x, y)?;
                if scalar == Scalar::F32 && cfg!(target_endian = "little") {
                    // F32 little-endian is the values' own bytes: no encoding copy
                    part.write_at(idx, 0, bytemuck::cast_slice(y))?;
                    continue;
                }
                bytes.resize(ne0 * scalar.size(), 0);
                encode(scalar, y, bytes);
                part.write_at(idx, 0, bytes)?;
            }
            Ok(())
        },
    )
}

/// Runs `fill(state, idx, row)` for every destination row `idx` (`ne0` f32 values), split
/// over the pool, and stores each row in the destination's type (rounded once, as ggml stores
/// its f32 results): the shape of kernels whose rows gather from anywhere in their sources.
/// `cost` estimates the work per element.
pub(super) fn fill_rows<S>(
    node: &Node<'_>,
    mut dst: Dst<'_>,
    cost: usize,
    init: impl Fn() -> S + Sync + Send,
    fill: impl Fn(&mut S, [usize; 3], &mut [f32]) -> Result<()> + Sync + Send,
) -> Result<()> {
    let layout = *dst.layout();
    let scalar = dst_scalar(&layout)?;
    let ne0 = layout.ne[0];
    let chunk = node.pool.chunk(layout.rows(), ne0.saturating_mul(cost));
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || {
            let row = scratch::zeroed::<f32>(ne0);
            (init(), row, scratch::zeroed::<u8>(ne0 * scalar.size()))
        },
        |(state, row, bytes), mut part: DstPart<'_>| {
            for r in part.rows() {
                let idx = layout.row_index(r);
                fill(state, idx, row)?;
                encode(scalar, row, bytes);
                part.write_at(idx, 0, bytes)?;
            }
            Ok(())
        },
    )
}

/// Every row of `view` as f32, `ne0` values per row in flat row order, converted on the
/// threads (for sources whose rows are read many times).
pub(super) fn widen_all(node: &Node<'_>, view: &SrcView<'_>) -> Result<Scratch<f32>> {
    widen_all_then(node, view, |_| {})
}

/// [`widen_all`], with `finish` run on each row right after it is converted (on the same
/// thread, while the row is in cache).
pub(super) fn widen_all_then(
    node: &Node<'_>,
    view: &SrcView<'_>,
    finish: impl Fn(&mut [f32]) + Sync,
) -> Result<Scratch<f32>> {
    let width = view.layout.ne[0];
    let rows = view.layout.rows();
    let mut values = scratch::zeroed::<f32>(rows * width);
    if values.is_empty() {
        return Ok(values);
    }
    let chunk = node.pool.chunk(rows, width * 2);
    let items: Vec<(usize, &mut [f32])> = values
        .chunks_mut(chunk * width)
        .enumerate()
        .map(|(i, c)| (i * chunk, c))
        .collect();
    node.pool.run(items, &|(first, out): (usize, &mut [f32])| {
        for (n, row) in out.chunks_mut(width).enumerate() {
            view.load_f32(view.layout.row_index(first + n), row)?;
            finish(row);
        }
        Ok(())
    })?;
    Ok(values)
}

/// C's `MAX(a, b)` macro (`a > b ? a : b`), whose NaN behaviour ggml's results depend on.
#[inline]
pub(super) fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// C's `MIN(a, b)` macro (`a < b ? a : b`).
#[inline]
pub(super) fn c_min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// ALiBi slope of head `h` (ggml's formula in SOFT_MAX and FLASH_ATTN_EXT); 1 without bias.
pub(super) fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1u32 << (n_head as f64).log2().floor() as u32;
    let m0 = 2.0f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2.0f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    let h = h as u32;
    if h < n_head_log2 {
        m0.powf((h + 1) as f32)
    } else {
        m1.powf((2 * (h - n_head_log2) + 1) as f32)
    }
}

/// Partial sums per dot product: eight f32 lanes (two SSE registers, one AVX register).
pub(super) const LANES: usize = 8;

/// Adds the lanes pairwise (a fixed order, so results are reproducible).
#[inline]
pub(super) fn reduce_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

/// Dot product in f32 with [`LANES`] independent partial sums (the compiler vectorizes it),
/// added pairwise, then the tail: deterministic for given inputs.
#[inline]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    reduce_lanes(acc) + tail
}
