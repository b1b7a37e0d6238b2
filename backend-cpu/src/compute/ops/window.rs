//! ACC and SET (`ggml_compute_forward_acc_f32`, `ggml_compute_forward_set_f32` / `_i32`): the
//! destination is src0 (copied, unless it is the destination already) with a window of it —
//! src1's shape at the strides and offset of the op's parameters — added to (ACC, in f32) or
//! overwritten by (SET, bit for bit) src1's elements.
//!
//! Rows of src1 are runs of adjacent elements of the contiguous destination. They are sorted
//! by start once (the plan proved them inside the destination and disjoint); each
//! destination row then finds the runs that cross it by binary search, so the destination can
//! be split by rows like any other, whatever the window's strides.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::plan::Window;
use crate::compute::view::{internal, Input};

use super::Node;

/// ACC (`add`) or SET.
pub(super) fn acc_or_set(
    node: &Node<'_>,
    mut dst: Dst<'_>,
    window: Window,
    add: bool,
) -> Result<()> {
    let (a, b) = (node.input(0)?, node.view(1)?);
    let layout = *dst.layout();
    let (width, size) = (layout.ne[0], layout.type_size);
    let run_len = b.layout.ne[0];
    // (first flat element, src1 row) of every row of src1, by first element
    let mut runs: Vec<(usize, [usize; 3])> = if b.layout.is_empty() {
        Vec::new()
    } else {
        (0..b.layout.rows())
            .map(|r| {
                let idx = b.layout.row_index(r);
                let [s1, s2, s3] = window.strides;
                (window.offset + idx[0] * s1 + idx[1] * s2 + idx[2] * s3, idx)
            })
            .collect()
    };
    runs.sort_unstable();
    let chunk = node.pool.chunk(layout.rows(), width);
    let parts = dst.split_rows(chunk);
    node.pool.run_with(
        parts,
        || vec![0u8; width * size],
        |row, mut part: DstPart<'_>| {
            for r in part.rows() {
                let idx = layout.row_index(r);
                match a {
                    Input::View(view) => row.copy_from_slice(view.row(idx)),
                    Input::Dst(_) => part.read(r, 0, row)?,
                }
                let (lo, hi) = (r * width, (r + 1) * width);
                // runs are disjoint and sorted: their ends are sorted too
                let first = runs.partition_point(|&(start, _)| start + run_len <= lo);
                for &(start, [i1, i2, i3]) in runs[first..].iter().take_while(|(s, _)| *s < hi) {
                    for e in start.max(lo)..(start + run_len).min(hi) {
                        let value = b.element([e - start, i1, i2, i3]);
                        let at = (e - lo) * size;
                        let out = row
                            .get_mut(at..at + size)
                            .ok_or_else(|| internal("ACC/SET element beyond the row"))?;
                        if add {
                            let sum = f32::from_le_bytes([out[0], out[1], out[2], out[3]])
                                + f32::from_le_bytes([value[0], value[1], value[2], value[3]]);
                            out.copy_from_slice(&sum.to_le_bytes());
                        } else {
                            out.copy_from_slice(value);
                        }
                    }
                }
                part.write(r, 0, row)?;
            }
            Ok(())
        },
    )
}
