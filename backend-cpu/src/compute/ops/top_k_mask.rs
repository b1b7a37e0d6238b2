//! TOP_K_MASK (8.0.1, llama.cpp b12032+1's `ggml_compute_forward_top_k_mask`): each result row
//! starts as −∞ and gets back the (broadcast) mask's cells of the row's picks.
//!
//! For row `(i1, i2, i3)`: `n_pick` is `blocks.ne[1]` with blocks, else `score.ne[0]` with
//! scores, else `n_kv`. Every pick `p` of the row (`top_k[.., i1, i2, i3]`) with `0 <= p <
//! n_pick` and, with scores, `score[p, i1, i2, i3] > −∞` (not −∞, not NaN) keeps cell `p`, or
//! with blocks the cells `blocks[0..n_blk, p]`; then every extra cell of the row is kept.
//! Keeping cell `c` copies the bytes of element `c` of mask row `(i1 % m1, i2 % m2, i3 % m3)`
//! when `0 <= c < n_kv` (other cells are ignored). Rows are independent: split over the pool.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::view::SrcView;

use super::Node;
use proto_core::ggml::types::id as ty;

pub(super) fn top_k_mask(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (mask, top_k) = (node.view(0)?, node.view(1)?);
    let (score, blocks, extra) = (
        node.optional_view(2)?,
        node.optional_view(3)?,
        node.optional_view(4)?,
    );
    let layout = *dst.layout();
    let ts = layout.type_size;
    let n_kv = layout.ne[0];
    let n_top = top_k.layout.ne[0];
    let n_blk = blocks.map_or(1, |b| b.layout.ne[0]);
    let n_pick = match (&blocks, &score) {
        (Some(b), _) => b.layout.ne[1],
        (None, Some(s)) => s.layout.ne[0],
        (None, None) => n_kv,
    };
    let n_extra = extra.map_or(0, |e| e.layout.ne[0]);
    // −∞ in the result's type (F16 or F32, checked by the plan), little-endian
    let minus_inf: &[u8] = if layout.type_id == ty::F16 {
        &[0x00, 0xFC]
    } else {
        &[0x00, 0x00, 0x80, 0xFF]
    };
    let m = mask.layout.ne;
    let cost = 1 + (n_top * n_blk + n_extra) / n_kv.max(1);
    let chunk = node.pool.chunk(layout.rows(), n_kv.saturating_mul(cost));
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || vec![0u8; n_kv * ts],
        |row: &mut Vec<u8>, mut part: DstPart<'_>| {
            for r in part.rows() {
                let [i1, i2, i3] = layout.row_index(r);
                for cell in row.chunks_exact_mut(ts) {
                    cell.copy_from_slice(minus_inf);
                }
                let mask_row = [i1 % m[1], i2 % m[2], i3 % m[3]];
                let mut keep = |c: i64| keep_cell(row, &mask, mask_row, c, n_kv, ts);
                for j in 0..n_top {
                    let p = top_k.index_at([j, i1, i2, i3]);
                    let Some(p) = usize::try_from(p).ok().filter(|&p| p < n_pick) else {
                        continue;
                    };
                    if let Some(score) = &score {
                        // ggml's `!(s > -INFINITY)`: −∞ itself, or NaN
                        let s = score.value([p, i1, i2, i3]);
                        if s.is_nan() || s == f32::NEG_INFINITY {
                            continue;
                        }
                    }
                    match &blocks {
                        None => keep(p as i64),
                        Some(blocks) => {
                            for k in 0..n_blk {
                                keep(blocks.index_at([k, p, 0, 0]));
                            }
                        }
                    }
                }
                if let Some(extra) = &extra {
                    for j in 0..n_extra {
                        keep(extra.index_at([j, i1, i2, i3]));
                    }
                }
                part.write_at([i1, i2, i3], 0, row)?;
            }
            Ok(())
        },
    )
}

/// Copies element `c` of mask row `mask_row` into `row` if `0 <= c < n_kv`.
#[inline]
fn keep_cell(
    row: &mut [u8],
    mask: &SrcView<'_>,
    mask_row: [usize; 3],
    c: i64,
    n_kv: usize,
    ts: usize,
) {
    if let Some(c) = usize::try_from(c).ok().filter(|&c| c < n_kv) {
        let [i1, i2, i3] = mask_row;
        row[c * ts..(c + 1) * ts].copy_from_slice(mask.element([c, i1, i2, i3]));
    }
}
