//! NORM, RMS_NORM and L2_NORM, row by row, with ggml's precision choices (`ops.cpp`):
//!
//! * RMS_NORM: `sum(x*x)` accumulated in f64 (each square in f32), `mean = sum / n` rounded to
//!   f32, `scale = 1 / sqrt(mean + eps)`, `y = x * scale`;
//! * NORM: `sum(x)` in f64 rounded to f32, `mean = sum / n` in f32, the centred squares summed
//!   in f64 and divided by `n` (`ggml_vec_cvar_f32`), rounded to f32, then
//!   `y = (x - mean) / sqrt(variance + eps)`;
//! * L2_NORM: `sum(x*x)` in f64, `y = x / max(sqrt(sum), eps)` in f32.

use proto_core::Result;

use crate::compute::memory::Dst;

use super::{map_rows, Node};

pub(super) fn rms_norm(node: &Node<'_>, dst: Dst<'_>, eps: f32) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        2,
        || (),
        |_, _, _, x, y| {
            let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
            let mean = (sum / x.len() as f64) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * scale);
            Ok(())
        },
    )
}

pub(super) fn norm(node: &Node<'_>, dst: Dst<'_>, eps: f32) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        3,
        || (),
        |_, _, _, x, y| {
            let sum = x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
            let mean = sum / x.len() as f32;
            let mut squares = 0.0f64;
            for (y, &x) in y.iter_mut().zip(x) {
                let centred = x - mean;
                *y = centred;
                squares += f64::from(centred * centred);
            }
            let variance = (squares / x.len() as f64) as f32;
            let scale = 1.0 / (variance + eps).sqrt();
            y.iter_mut().for_each(|y| *y *= scale);
            Ok(())
        },
    )
}

pub(super) fn l2_norm(node: &Node<'_>, dst: Dst<'_>, eps: f32) -> Result<()> {
    let a = node.input(0)?;
    map_rows(
        node,
        dst,
        a,
        2,
        || (),
        |_, _, _, x, y| {
            let sum = x.iter().map(|&v| f64::from(v * v)).sum::<f64>() as f32;
            let scale = 1.0 / sum.sqrt().max(eps);
            y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * scale);
            Ok(())
        },
    )
}
