//! GET_ROWS and SET_ROWS.
//!
//! Both read row ids from a tensor at run time. The reference checks them with an assertion
//! (process abort) — and had out-of-bounds reads and writes through mismatched shapes. Here
//! every id the node will use is checked before the node writes anything, and again at use;
//! an id outside the rows fails the graph with [`Error::OutOfBounds`].
//!
//! * GET_ROWS (`ggml_compute_forward_get_rows_*`): destination row `(i10, i11, i12)` is source
//!   row `(rows[i10, i11, i12], i11, i12)`, converted to the destination type (dequantized for
//!   quantized sources; copied byte for byte when the types match);
//! * SET_ROWS (`ggml_compute_forward_set_rows_impl`): source row `(i, i02, i03)` goes to
//!   destination row `(ids[i, i02 % ne11, i03 % ne12], i02, i03)`, converted with the
//!   destination type's `from_float` (quantized when the destination is). Two ids may name the
//!   same row; the parts are whole (i2, i3) planes, so such rows are written by one thread, in
//!   source order (the last one wins, deterministically).

use proto_core::{Error, Result};

use crate::compute::memory::{Dst, DstPart};
use crate::compute::scratch::{self, Scratch};
use crate::compute::view::{encode_row, internal, Scalar, SrcView};
use proto_core::ggml::types::id as ty;

use super::Node;

/// Checks every id of `ids` against `rows` and returns them, flat in row-major order.
pub(super) fn checked_ids(
    ids: &SrcView<'_>,
    rows: usize,
    what: &'static str,
) -> Result<Scratch<usize>> {
    let l = &ids.layout;
    let mut out = scratch::with_capacity::<usize>(l.elements());
    for i3 in 0..l.ne[3] {
        for i2 in 0..l.ne[2] {
            for i1 in 0..l.ne[1] {
                if l.dense_rows() {
                    // a packed row of ids read in one pass (thousands of them in SET_ROWS
                    // into a transposed V cache)
                    let row = ids.row([i1, i2, i3]);
                    let ok = match l.type_size {
                        8 => push_checked(&mut out, row, rows, |b: [u8; 8]| i64::from_le_bytes(b)),
                        _ => push_checked(&mut out, row, rows, |b: [u8; 4]| {
                            i64::from(i32::from_le_bytes(b))
                        }),
                    };
                    if !ok {
                        return Err(Error::OutOfBounds(what));
                    }
                    continue;
                }
                for i0 in 0..l.ne[0] {
                    out.push(checked(ids.index_at([i0, i1, i2, i3]), rows, what)?);
                }
            }
        }
    }
    Ok(out)
}

/// Appends the ids of a packed row (`W`-byte little-endian integers read by `get`) to `out`;
/// false if one is outside `0..rows`.
fn push_checked<const W: usize>(
    out: &mut Vec<usize>,
    row: &[u8],
    rows: usize,
    get: impl Fn([u8; W]) -> i64,
) -> bool {
    let mut ok = true;
    out.extend(row.chunks_exact(W).map(|b| {
        let id = b.first_chunk::<W>().map_or(-1, |b| get(*b));
        ok &= usize::try_from(id).is_ok_and(|id| id < rows);
        id as usize
    }));
    ok
}

fn checked(id: i64, rows: usize, what: &'static str) -> Result<usize> {
    usize::try_from(id)
        .ok()
        .filter(|&id| id < rows)
        .ok_or(Error::OutOfBounds(what))
}

const GET_ROWS_ID: &str = "GET_ROWS row id outside the source's rows";
const SET_ROWS_ID: &str = "SET_ROWS row id outside the destination's rows";

pub(super) fn get_rows(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (a, rows) = (node.view(0)?, node.view(1)?);
    let layout = *dst.layout();
    let ne01 = a.layout.ne[1];
    // every id checked before anything is written
    checked_ids(&rows, ne01, GET_ROWS_ID)?;
    let same_type = a.layout.type_id == layout.type_id;
    let ne0 = layout.ne[0];
    let chunk = node.pool.chunk(layout.rows(), ne0);
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let mut values = scratch::zeroed::<f32>(ne0);
        let mut bytes = scratch::zeroed::<u8>(layout.row_bytes());
        for r in part.rows() {
            let [i10, i11, i12] = layout.row_index(r);
            let id = checked(rows.index_at([i10, i11, i12, 0]), ne01, GET_ROWS_ID)?;
            let idx = [id, i11, i12];
            if same_type {
                if a.layout.dense_rows() {
                    bytes.copy_from_slice(a.row(idx));
                } else {
                    let size = layout.type_size;
                    for i0 in 0..ne0 {
                        bytes[i0 * size..(i0 + 1) * size]
                            .copy_from_slice(a.element([i0, id, i11, i12]));
                    }
                }
            } else {
                a.load_f32(idx, &mut values)?;
                encode_row(layout.type_id, &values, &mut bytes)?;
            }
            part.write(r, 0, &bytes)?;
        }
        Ok(())
    })
}

/// Plane `(i2, i3)` of `a` as f32 values, every row in order, where it is one aligned run of
/// little-endian F32 (and `scalar`, the destination type converting element by element).
/// SET_ROWS into a transposed V cache has one-element rows: converting them one by one
/// costs far more than the conversion itself.
fn whole_plane<'a>(a: &SrcView<'a>, [i2, i3]: [usize; 2], scalar: bool) -> Option<&'a [f32]> {
    let l = &a.layout;
    let packed = l.type_id == ty::F32 && l.nb[0] == 4 && (l.ne[1] == 1 || l.nb[1] == 4 * l.ne[0]);
    if !scalar || !packed || !cfg!(target_endian = "little") {
        return None;
    }
    let start = l.row_offset([0, i2, i3]);
    let bytes = a.bytes.get(start..start + 4 * l.ne[0] * l.ne[1])?;
    bytemuck::try_cast_slice(bytes).ok()
}

pub(super) fn set_rows(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (a, ids) = (node.view(0)?, node.view(1)?);
    let layout = *dst.layout();
    let al = a.layout;
    if al.is_empty() {
        return Ok(());
    }
    let ne1 = layout.ne[1];
    // checked once here; the kernel takes them from this flat copy
    let flat = checked_ids(&ids, ne1, SET_ROWS_ID)?;
    let il = ids.layout;
    // element-wise conversions (plain destination types) may take a plane at once
    let scalar = Scalar::float(layout.type_id).is_some();
    let planes = layout.ne[2] * layout.ne[3];
    let chunk = node.pool.chunk(planes, al.ne[1] * al.ne[0]) * ne1;
    let parts = dst.split_rows(chunk);
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        let rows = part.rows();
        if !rows.start.is_multiple_of(ne1) || !rows.end.is_multiple_of(ne1) {
            return Err(internal("SET_ROWS part not made of whole planes"));
        }
        let mut values = scratch::zeroed::<f32>(al.ne[0]);
        let mut bytes = scratch::zeroed::<u8>(0);
        for plane in rows.start / ne1..rows.end / ne1 {
            let (i02, i03) = (plane % layout.ne[2], plane / layout.ne[2]);
            // the ids of this plane: `ids[i, i02 % ne11, i03 % ne12]` for every `i`, in the
            // flat (row-major) order of `checked_ids`
            let first = il.ne[0] * (i02 % il.ne[1] + il.ne[1] * (i03 % il.ne[2]));
            let plane_ids = flat
                .get(first..first + al.ne[1])
                .ok_or_else(|| internal("SET_ROWS ids shorter than the source rows"))?;
            if let Some(plane) = whole_plane(&a, [i02, i03], scalar) {
                // the plane's rows are one run of f32s: converted in one call (what each row's
                // conversion gives, the types being plain), then written row by row
                encode_row(layout.type_id, plane, &mut bytes)?;
                part.write_plane_rows([i02, i03], plane_ids, &bytes)?;
                continue;
            }
            for (i, &id) in plane_ids.iter().enumerate() {
                a.load_f32([i, i02, i03], &mut values)?;
                encode_row(layout.type_id, &values, &mut bytes)?;
                part.write_at([id, i02, i03], 0, &bytes)?;
            }
        }
        Ok(())
    })
}
