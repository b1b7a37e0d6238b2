//! FLASH_ATTN_EXT, one query row per destination row.
//!
//! Layouts (ggml's `ggml_flash_attn_ext`): `q [DK, n_q, n_head, ne3]`, `k [DK, n_kv, n_head_kv,
//! ne3_kv]`, `v [DV, n_kv, ...]`, mask `[>= n_kv, >= n_q, m2, m3]`, sinks `[n_head]`; the result
//! is `[DV, n_head, n_q, ne3]` (heads and queries swapped: `permute(0, 2, 1, 3)`). K/V heads
//! broadcast over query heads (`n_head / n_head_kv` query heads per KV head).
//!
//! For query `(iq1, head h, iq3)`: `s_c = softcap · tanh(q·k_c · scale / softcap) + slope(h) ·
//! mask[c, iq1]` (without soft-capping `q·k_c · scale + slope · mask`), entries whose mask is
//! -inf skipped; the output is the softmax-weighted sum of the `v_c`, where an attention sink
//! adds `exp(sink_h - max)` to the denominator only. A row with every key masked gives zeros,
//! as in ggml.
//!
//! ggml-cpu computes this two ways, and so does this kernel, picking as ggml does:
//! * **one query row at a time** (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`; ggml's
//!   choice unless the tiled path applies — generation and short prompts): the query is
//!   converted to K's `vec_dot_type` (F16 for F16 K, Q8_0 for Q8_0 K, ...), each score is
//!   `quant::vec_dot` of a K row with it, the softmax is online (a new maximum rescales what
//!   was summed), and V sums are kept as ggml keeps them — in F16 for F16 V, each step rounded
//!   ([`fa_accumulate`](super::fa_accumulate)) — so greedy decoding picks the tokens llama.cpp's
//!   CPU backend picks;
//! * **tiles** (ggml's path for F32 Q, F32/F16 K and V of one type and at least 64 queries,
//!   module `tiled`): up to 64 queries of one head against 64 keys at a time, all in f32 — the
//!   scores and the value sums are small matrix products (module `gemm`) whose sums run in the
//!   order ggml's run, and the softmax is online per tile of keys, as in ggml.

use std::sync::OnceLock;

use proto_core::ggml::types::id as ty;
use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::quant;
use crate::compute::view::{internal, SrcView};

use super::Node;

#[allow(unsafe_code)]
mod gemm;
mod one_row;
mod tiled;

/// Queries from which ggml-cpu takes its tiled path (`GGML_FA_TILE_Q`).
const GGML_TILE_QUERIES: usize = 64;

/// Most f32 values that K and V may be widened to (256 MiB), block by block as tiles read them.
const WIDEN_LIMIT: usize = 64 << 20;

/// One FLASH_ATTN_EXT node's inputs and parameters.
struct Attention<'a> {
    q: SrcView<'a>,
    k: SrcView<'a>,
    v: SrcView<'a>,
    mask: Option<SrcView<'a>>,
    sinks: Option<SrcView<'a>>,
    /// The score scale (already divided by `softcap` when soft-capping).
    scale: f32,
    max_bias: f32,
    softcap: f32,
    /// Query heads per K head, batches per K batch.
    rk: [usize; 2],
    /// Query heads per V head, batches per V batch.
    rv: [usize; 2],
}

/// Flat K/V rows per block of [`KvRows::Widened`] (one tile of keys).
const WIDEN_BLOCK: usize = 64;

/// K or V rows as f32: widened once for the node when each row is read by many queries,
/// converted at each use otherwise (a cache too large to copy).
enum KvRows<'a> {
    /// Widened at first use, [`WIDEN_BLOCK`] flat rows at a time, each block once for the node
    /// (by whichever thread needs it first): the tiles that every query masks (a KV cache's
    /// unused cells) are never read, so their rows are never converted.
    Widened {
        blocks: Vec<OnceLock<Vec<f32>>>,
        view: SrcView<'a>,
    },
    Direct(SrcView<'a>),
}

impl<'a> KvRows<'a> {
    /// `view`'s rows, widened block by block as they are first read, unless `widen` is false.
    fn new(view: SrcView<'a>, widen: bool) -> KvRows<'a> {
        if widen {
            let blocks = view.layout.rows().div_ceil(WIDEN_BLOCK);
            KvRows::Widened {
                blocks: (0..blocks).map(|_| OnceLock::new()).collect(),
                view,
            }
        } else {
            KvRows::Direct(view)
        }
    }

    /// Row `idx`, borrowed from the widened copy or converted into `scratch`.
    fn row<'s>(&'s self, idx: [usize; 3], scratch: &'s mut [f32]) -> Result<&'s [f32]> {
        match self {
            KvRows::Widened { blocks, view } => {
                let width = view.layout.ne[0];
                let row = view.layout.row_number(idx);
                let cell = blocks
                    .get(row / WIDEN_BLOCK)
                    .ok_or_else(|| internal("FLASH_ATTN_EXT K/V row outside its tensor"))?;
                let block = match cell.get() {
                    Some(block) => block,
                    None => {
                        let first = row - row % WIDEN_BLOCK;
                        let rows = WIDEN_BLOCK.min(view.layout.rows() - first);
                        let mut values = vec![0.0f32; rows * width];
                        for (n, out) in values.chunks_exact_mut(width.max(1)).enumerate() {
                            view.load_f32(view.layout.row_index(first + n), out)?;
                        }
                        // Another thread may have set it meanwhile: the same values.
                        cell.get_or_init(|| values)
                    }
                };
                let start = (row % WIDEN_BLOCK) * width;
                block
                    .get(start..start + width)
                    .ok_or_else(|| internal("FLASH_ATTN_EXT K/V row outside its block"))
            }
            KvRows::Direct(view) => {
                view.load_f32(idx, scratch)?;
                Ok(&scratch[..view.layout.ne[0]])
            }
        }
    }
}

pub(super) fn flash_attn(
    node: &Node<'_>,
    dst: Dst<'_>,
    scale: f32,
    max_bias: f32,
    softcap: f32,
) -> Result<()> {
    let (q, k, v) = (node.view(0)?, node.view(1)?, node.view(2)?);
    let n_head = q.layout.ne[2];
    let att = Attention {
        q,
        k,
        v,
        mask: node.optional_view(3)?,
        sinks: node.optional_view(4)?,
        scale: if softcap != 0.0 {
            scale / softcap
        } else {
            scale
        },
        max_bias,
        softcap,
        rk: [n_head / k.layout.ne[2], q.layout.ne[3] / k.layout.ne[3]],
        rv: [n_head / v.layout.ne[2], q.layout.ne[3] / v.layout.ne[3]],
    };
    let tiled = q.layout.type_id == ty::F32
        && matches!(k.layout.type_id, ty::F32 | ty::F16)
        && k.layout.type_id == v.layout.type_id
        && q.layout.ne[1] >= GGML_TILE_QUERIES;
    if !tiled && k.layout.dense_rows() {
        if let Some(vdt) = quant::vec_dot_type(k.layout.type_id) {
            return one_row::run(&att, vdt, node, dst);
        }
    }
    // Widened once, each K/V row then serves every query of the heads sharing it (tiles), or
    // every query one by one (types without a `vec_dot_type`, strided K rows).
    let uses = q.layout.ne[1] * att.rk[0];
    let widen = uses >= 8 && (k.layout.elements() + v.layout.elements()) <= WIDEN_LIMIT;
    let k_rows = KvRows::new(k, widen);
    let v_rows = KvRows::new(v, widen);
    tiled::run(&att, &k_rows, &v_rows, node, dst)
}
