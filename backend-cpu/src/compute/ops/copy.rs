//! DUP / CPY / CONT, CONCAT and REPEAT.
//!
//! Copies follow ggml's `ggml_compute_forward_dup`: element `e` of the source in row-major
//! order goes to element `e` of the destination in row-major order, whatever the two shapes and
//! strides. Per destination row the kernel gathers the row's flat range from the source:
//! * same type: the bytes, block by block (any type, quantized ones included: block order);
//! * F32/F16/BF16/I32 to one another: through f32 (`(int32_t)` casts for I32, as ggml's
//!   conversion table);
//! * float to a quantized type: through f32 and `quant::quantize_row` per destination row
//!   (block boundaries fall where they fall in ggml, which quantizes per source row: rows are
//!   whole blocks in both tensors);
//! * quantized to float: the source rows dequantized with `quant::dequantize_row`.

use proto_core::Result;

use crate::compute::memory::{Dst, DstPart};
use crate::compute::view::{encode_row, internal, Input, Scalar, SrcView};

use super::Node;

/// The source row last converted, so that consecutive destination elements from one source
/// row convert it once.
struct RowCache {
    row: Option<usize>,
    values: Vec<f32>,
}

impl RowCache {
    fn new(len: usize) -> RowCache {
        RowCache {
            row: None,
            values: vec![0.0; len],
        }
    }

    fn get(&mut self, src: &SrcView<'_>, row: usize) -> Result<&[f32]> {
        if self.row != Some(row) {
            src.load_f32(src.layout.row_index(row), &mut self.values)?;
            self.row = Some(row);
        }
        Ok(&self.values)
    }
}

/// Source values of flat elements `start..start + out.len()` as f32.
fn gather_f32(
    src: &SrcView<'_>,
    start: usize,
    out: &mut [f32],
    cache: &mut RowCache,
) -> Result<()> {
    let ne0 = src.layout.ne[0];
    let mut e = start;
    let mut o = 0;
    while o < out.len() {
        let (row, col) = (e / ne0, e % ne0);
        let n = (ne0 - col).min(out.len() - o);
        out[o..o + n].copy_from_slice(&cache.get(src, row)?[col..col + n]);
        o += n;
        e += n;
    }
    Ok(())
}

/// Source bytes of flat units (blocks; elements of plain types) `start..` into `out` (a whole
/// number of units).
fn gather_units(src: &SrcView<'_>, start: usize, out: &mut [u8]) {
    let l = &src.layout;
    let per_row = l.ne[0] / l.block;
    let size = l.type_size;
    let mut u = start;
    let mut o = 0;
    while o < out.len() {
        let (row, col) = (u / per_row, u % per_row);
        let n = (per_row - col).min((out.len() - o) / size);
        let base = l.row_offset(l.row_index(row));
        if l.dense_rows() {
            let from = base + col * size;
            out[o..o + n * size].copy_from_slice(&src.bytes[from..from + n * size]);
        } else {
            for k in 0..n {
                let from = base + (col + k) * l.nb[0];
                out[o + k * size..o + (k + 1) * size]
                    .copy_from_slice(&src.bytes[from..from + size]);
            }
        }
        o += n * size;
        u += n;
    }
}

pub(super) fn copy(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let src = match node.input(0)? {
        // Copying a tensor onto itself changes nothing.
        Input::Dst(_) => return Ok(()),
        Input::View(view) => view,
    };
    let layout = *dst.layout();
    let ne0 = layout.ne[0];
    let same_type = src.layout.type_id == layout.type_id;
    let chunk = node.pool.chunk(layout.rows(), ne0);
    let parts = dst.split_rows(chunk);
    if same_type {
        let units = ne0 / layout.block;
        return node.pool.run(parts, &|mut part: DstPart<'_>| {
            let mut bytes = vec![0u8; layout.row_bytes()];
            for r in part.rows() {
                gather_units(&src, r * units, &mut bytes);
                part.write(r, 0, &bytes)?;
            }
            Ok(())
        });
    }
    if Scalar::numeric(src.layout.type_id).is_none() && Scalar::float(layout.type_id).is_none() {
        return Err(internal("copy between two non-float types"));
    }
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut cache = RowCache::new(src.layout.ne[0]);
        let mut values = vec![0.0f32; ne0];
        let mut bytes = Vec::new();
        for r in part.rows() {
            gather_f32(&src, r * ne0, &mut values, &mut cache)?;
            encode_row(layout.type_id, &values, &mut bytes)?;
            part.write(r, 0, &bytes)?;
        }
        Ok(())
    })
}

/// CONCAT: each destination element (block, for quantized types: the plan checked that rows
/// are whole blocks in all three tensors, so a seam along dimension 0 falls between blocks)
/// from `a` or, past `a`'s extent along `dim`, from `b`.
pub(super) fn concat(node: &Node<'_>, mut dst: Dst<'_>, dim: usize) -> Result<()> {
    let (a, b) = (node.view(0)?, node.view(1)?);
    let layout = *dst.layout();
    let size = layout.type_size;
    let block = layout.block;
    let split = a.layout.ne[dim];
    let chunk = node.pool.chunk(layout.rows(), layout.ne[0]);
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut bytes = vec![0u8; layout.row_bytes()];
        for r in part.rows() {
            let [i1, i2, i3] = layout.row_index(r);
            for (u, out) in bytes.chunks_exact_mut(size).enumerate() {
                let mut i = [u * block, i1, i2, i3];
                let from = if i[dim] < split {
                    a.element(i)
                } else {
                    i[dim] -= split;
                    b.element(i)
                };
                out.copy_from_slice(from);
            }
            part.write(r, 0, &bytes)?;
        }
        Ok(())
    })
}

pub(super) fn repeat(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let a = node.view(0)?;
    let layout = *dst.layout();
    let size = layout.type_size;
    let ne = a.layout.ne;
    let chunk = node.pool.chunk(layout.rows(), layout.ne[0]);
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut bytes = vec![0u8; layout.row_bytes()];
        for r in part.rows() {
            let [i1, i2, i3] = layout.row_index(r);
            for i0 in 0..layout.ne[0] {
                let from = a.element([i0 % ne[0], i1 % ne[1], i2 % ne[2], i3 % ne[3]]);
                bytes[i0 * size..(i0 + 1) * size].copy_from_slice(from);
            }
            part.write(r, 0, &bytes)?;
        }
        Ok(())
    })
}
