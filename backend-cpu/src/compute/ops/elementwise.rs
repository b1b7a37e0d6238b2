//! ADD, SUB, MUL, DIV (with ggml's broadcasting of src1), ADD1, ADD_ID and the element-wise
//! maps.
//!
//! As in ggml's `binary-ops.cpp`: each destination row `(i1, i2, i3)` combines row
//! `(i1, i2, i3)` of src0 with row `(i1 % ne11, i2 % ne12, i3 % ne13)` of src1, element `i0`
//! with element `i0 % ne10`; both are read as f32, combined in f32 and stored in the
//! destination type. Either source may be the destination itself (in-place ops).

use proto_core::{Error, Result};

use crate::compute::memory::Dst;
use crate::compute::plan::{BinaryOp, MapOp};
use crate::compute::scratch;

use super::{map_rows, Node};

pub(super) fn binary(node: &Node<'_>, dst: Dst<'_>, op: BinaryOp) -> Result<()> {
    let a = node.input(0)?;
    let b = node.input(1)?;
    let bl = *b.layout();
    let ne10 = bl.ne[0];
    map_rows(
        node,
        dst,
        a,
        1,
        || (scratch::zeroed::<f32>(ne10), scratch::zeroed::<u8>(0)),
        |(row, scratch), part, [i1, i2, i3], x, y| {
            b.load_f32(
                part,
                [i1 % bl.ne[1], i2 % bl.ne[2], i3 % bl.ne[3]],
                row,
                scratch,
            )?;
            for (ys, xs) in y.chunks_mut(ne10).zip(x.chunks(ne10)) {
                let pairs = ys.iter_mut().zip(xs).zip(row.iter());
                match op {
                    BinaryOp::Add => pairs.for_each(|((y, &a), &b)| *y = a + b),
                    BinaryOp::Sub => pairs.for_each(|((y, &a), &b)| *y = a - b),
                    BinaryOp::Mul => pairs.for_each(|((y, &a), &b)| *y = a * b),
                    BinaryOp::Div => pairs.for_each(|((y, &a), &b)| *y = a / b),
                }
            }
            Ok(())
        },
    )
}

pub(super) fn add1(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let a = node.input(0)?;
    let b = node.input(1)?;
    map_rows(
        node,
        dst,
        a,
        1,
        || (scratch::zeroed::<f32>(1), scratch::zeroed::<u8>(0)),
        |(scalar, scratch), part, _, x, y| {
            // the scalar is re-read per row: it may be the (one-element) destination itself
            b.load_f32(part, [0, 0, 0], scalar, scratch)?;
            let v = scalar[0];
            y.iter_mut().zip(x).for_each(|(y, &x)| *y = x + v);
            Ok(())
        },
    )
}

pub(super) fn map(node: &Node<'_>, dst: Dst<'_>, op: MapOp) -> Result<()> {
    let a = node.input(0)?;
    // transcendental maps cost more per element than a multiply
    let cost = match op {
        MapOp::Abs | MapOp::Neg | MapOp::Sqr | MapOp::Relu | MapOp::Scale { .. } => 1,
        _ => 8,
    };
    map_rows(
        node,
        dst,
        a,
        cost,
        || (),
        |_, _, _, x, y| {
            op.apply(x, y);
            Ok(())
        },
    )
}

/// ADD_ID (`ggml_compute_forward_add_id_f32`): row `(i1, i2)` of src0 plus row
/// `ids[i1, i2]` of src1 (per-expert biases). Every id is checked before anything is written.
pub(super) fn add_id(node: &Node<'_>, dst: Dst<'_>) -> Result<()> {
    let a = node.input(0)?;
    let b = node.view(1)?;
    let ids = node.view(2)?;
    let al = *a.layout();
    let rows = b.layout.ne[1];
    let id_of = |i1: usize, i2: usize| {
        usize::try_from(ids.index_at([i1, i2, 0, 0]))
            .ok()
            .filter(|&id| id < rows)
            .ok_or(Error::OutOfBounds("ADD_ID id outside src1's rows"))
    };
    for i2 in 0..al.ne[2] {
        for i1 in 0..al.ne[1] {
            id_of(i1, i2)?;
        }
    }
    let ne0 = al.ne[0];
    map_rows(
        node,
        dst,
        a,
        1,
        || scratch::zeroed::<f32>(ne0),
        |row, _, [i1, i2, _], x, y| {
            b.load_f32([id_of(i1, i2)?, 0, 0], row)?;
            y.iter_mut()
                .zip(x)
                .zip(row.iter())
                .for_each(|((y, &x), &b)| *y = x + b);
            Ok(())
        },
    )
}
