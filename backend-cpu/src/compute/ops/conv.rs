//! The convolution ops of multimodal encoders (llama.cpp's clip/mtmd projectors, audio
//! encoders and decoders), as ggml-cpu defines them (`ops.cpp`):
//!
//! * IM2COL / IM2COL_3D: destination row (`ow`, `oh`, `od`, `n`) lists, channel by channel,
//!   then kernel depth, row and column, the image values under each kernel tap (image column
//!   `ow * s0 + kx * d0 - p0`, row `oh * s1 + ky * d1 - p1`, slice `od * s2 + kz * d2 - p2`),
//!   or 0 outside the image. IM2COL's 2-D form has no depth, its 1-D form neither height (a
//!   one-row image whose row `-p1` is read: zeros unless `p1` is 0, as in ggml). Values are
//!   copied (rounded once to f16 for an F16 destination);
//! * CONV_2D_DW: output (`ox`, `oy`, `c`, `n`) is the sum over kernel rows, then columns, of
//!   `kernel[kx, ky, c] * image[x, y, c, n]` for the taps inside the image, in f32 (ggml's own
//!   order; its channel-last SIMD path fuses the multiply-adds, a rounding difference well
//!   inside test-backend-ops' tolerance);
//! * CONV_2D / CONV_3D: output (`ox`, `oy`, `oz`, `oc`, `n`) is the dot product of kernel
//!   `oc` (`IC x KD x KH x KW`) with the image patch under it, zeros outside (ggml's im2col +
//!   matrix product; an F16 kernel takes the patch rounded to f16). The dot products use
//!   [`dot`]'s eight partial sums, as ggml's vectorized ones use lanes;
//! * CONV_TRANSPOSE_1D / _2D: output (`x`, `y`, `oc`, `n`) sums, over the inputs (`ix`, `iy`)
//!   with `x = ix * s + kx`, `y = iy * s + ky` for a kernel tap (`kx`, `ky`), in input order,
//!   the dot product over input channels of the input with kernel tap (`kx`, `ky`, `oc`);
//! * COL2IM_1D: the overlap-add of columns into signals (the inverse of a 1-D im2col), in f32,
//!   the columns added in order.
//!
//! Sources are read through their strides, so ggml's channel-first (WHCN) and channel-last
//! (CWHN) layouts are the same computation here. Threads: destination rows (CONV_2D / _3D:
//! output rows of each image, then the rows are stored).

use proto_core::ggml::types::id as ty;
use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::plan::{Conv2dParams, ConvParams, Im2ColForm, Im2ColParams};
use crate::compute::view::round_f16;

use super::ssm::span;
use super::{dot, fill_rows, widen_all, widen_all_then, Node};

/// IM2COL and IM2COL_3D of the image in slot 1 (slot 0, the kernel, only gave the shape).
pub(super) fn im2col(node: &Node<'_>, dst: Dst<'_>, params: Im2ColParams) -> Result<()> {
    let b = node.view(1)?;
    let ne = b.layout.ne;
    let Im2ColParams {
        axes: [across, down, deep],
        taps: [kw, kh, kd],
        channels: ic,
        form,
    } = params;
    // image width, height and depth; each (image, channel) is one plane of them, in flat order
    let (iw, ih, id) = match form {
        Im2ColForm::OneD => (ne[0], 1, 1),
        Im2ColForm::TwoD => (ne[0], ne[1], 1),
        Im2ColForm::ThreeD => (ne[0], ne[1], ne[2]),
    };
    let od = match form {
        Im2ColForm::ThreeD => dst.layout().ne[3] / (ne[3] / ic).max(1),
        _ => 1,
    };
    let image = widen_all(node, &b)?;
    let volume = iw * ih * id;
    fill_rows(
        node,
        dst,
        1,
        || (),
        |_, [ow, i2, i3], row| {
            let (oh, oz, n) = match form {
                Im2ColForm::OneD => (0, 0, i2),
                Im2ColForm::TwoD => (i2, 0, i3),
                Im2ColForm::ThreeD => (i2, i3 % od, i3 / od),
            };
            for (c, taps) in row
                .chunks_exact_mut((kd * kh * kw).max(1))
                .take(ic)
                .enumerate()
            {
                let channel = span(&image, (n * ic + c) * volume, volume)?;
                for (kz, taps) in taps.chunks_exact_mut((kh * kw).max(1)).enumerate() {
                    let z = deep.source(oz, kz, id);
                    for (ky, taps) in taps.chunks_exact_mut(kw.max(1)).enumerate() {
                        let y = down.source(oh, ky, ih);
                        for (kx, value) in taps.iter_mut().enumerate() {
                            *value = match (z, y, across.source(ow, kx, iw)) {
                                (Some(z), Some(y), Some(x)) => channel[(z * ih + y) * iw + x],
                                _ => 0.0,
                            };
                        }
                    }
                }
            }
            Ok(())
        },
    )
}

/// CONV_2D_DW: kernel `[KW, KH, 1, C]` in slot 0, image `[W, H, C, N]` in slot 1.
pub(super) fn conv_2d_dw(node: &Node<'_>, dst: Dst<'_>, window: Conv2dParams) -> Result<()> {
    let (k, b) = (node.view(0)?, node.view(1)?);
    let [kw, kh, _, _] = k.layout.ne;
    let [w, h, channels, _] = b.layout.ne;
    // every kernel and image value is read by many outputs: widened once
    let kernel = widen_all(node, &k)?;
    let image = widen_all(node, &b)?;
    let [across, down] = window.axes;
    fill_rows(
        node,
        dst,
        kw.saturating_mul(kh),
        || (),
        |_, [oy, c, n], row| {
            let plane = span(&image, (n * channels + c) * w * h, w * h)?;
            let weights = span(&kernel, c * kw * kh, kw * kh)?;
            let (rows, y0) = down.inside(oy, kh, h);
            let dy = down.dilation as usize;
            for (ox, out) in row.iter_mut().enumerate() {
                let (cols, x0) = across.inside(ox, kw, w);
                let dx = across.dilation as usize;
                let mut sum = 0.0f32;
                for (ry, ky) in rows.clone().enumerate() {
                    let image_row = &plane[(y0 + ry * dy) * w..][..w];
                    let weight_row = &weights[ky * kw..][..kw];
                    for (rx, kx) in cols.clone().enumerate() {
                        sum += weight_row[kx] * image_row[x0 + rx * dx];
                    }
                }
                *out = sum;
            }
            Ok(())
        },
    )
}

/// CONV_2D and CONV_3D: kernel in slot 0, image in slot 1 (shapes in [`ConvParams`]).
///
/// As ggml does, each output is the dot product of the kernel of its channel with the patch
/// under it (the values rounded to f16 for an F16 kernel); here each work item builds the
/// patches of one output row (`oy`, `oz`, `n`) once and takes the dot products for every
/// output channel, then the rows are stored.
pub(super) fn conv(node: &Node<'_>, dst: Dst<'_>, params: ConvParams) -> Result<()> {
    let (k, b) = (node.view(0)?, node.view(1)?);
    let ConvParams {
        axes: [across, down, deep],
        channels: ic,
        out_channels: oc,
        three_d,
    } = params;
    // CONV_2D's kernel `[KW, KH, IC, OC]` and image `[W, H, IC, N]` have depth 1
    let (kw, kh, kd) = if three_d {
        (k.layout.ne[0], k.layout.ne[1], k.layout.ne[2])
    } else {
        (k.layout.ne[0], k.layout.ne[1], 1)
    };
    let (w, h, depth) = if three_d {
        (b.layout.ne[0], b.layout.ne[1], b.layout.ne[2])
    } else {
        (b.layout.ne[0], b.layout.ne[1], 1)
    };
    let [ow, oh, ne2, ne3] = dst.layout().ne;
    let (od, n) = if three_d { (ne2, ne3 / oc) } else { (1, ne3) };
    let f16 = k.layout.type_id == ty::F16;
    // the patch values in the kernel's type, as ggml's im2col step stores them
    let image = widen_all_then(node, &b, |row| {
        if f16 {
            row.iter_mut().for_each(|v| *v = round_f16(*v));
        }
    })?;
    // one row of `IC * KD * KH * KW` weights per output channel
    let kernel = widen_all(node, &k)?;
    let patch = ic * kd * kh * kw;
    let volume = w * h * depth;
    // [n][oz][oy][oc][ox]: one block of `OC * OW` per output row of an image
    let mut out = vec![0.0f32; n * od * oh * oc * ow];
    let blocks: Vec<(usize, &mut [f32])> = out.chunks_mut((oc * ow).max(1)).enumerate().collect();
    node.pool.run_with(
        blocks,
        || vec![0.0f32; ow * patch],
        |patches, (line, block)| {
            let (oy, rest) = (line % oh, line / oh);
            let (oz, image_n) = (rest % od, rest / od);
            for (ox, values) in patches.chunks_exact_mut(patch.max(1)).enumerate() {
                for (c, values) in values.chunks_exact_mut((kd * kh * kw).max(1)).enumerate() {
                    let channel = span(&image, (image_n * ic + c) * volume, volume)?;
                    for (kz, values) in values.chunks_exact_mut((kh * kw).max(1)).enumerate() {
                        let z = deep.source(oz, kz, depth);
                        for (ky, values) in values.chunks_exact_mut(kw.max(1)).enumerate() {
                            let y = down.source(oy, ky, h);
                            for (kx, value) in values.iter_mut().enumerate() {
                                *value = match (z, y, across.source(ox, kx, w)) {
                                    (Some(z), Some(y), Some(x)) => channel[(z * h + y) * w + x],
                                    _ => 0.0,
                                };
                            }
                        }
                    }
                }
            }
            for (o, outputs) in block.chunks_exact_mut(ow.max(1)).enumerate() {
                let weights = span(&kernel, o * patch, patch)?;
                for (ox, value) in outputs.iter_mut().enumerate() {
                    *value = dot(span(patches, ox * patch, patch)?, weights);
                }
            }
            Ok(())
        },
    )?;
    fill_rows(
        node,
        dst,
        1,
        || (),
        |_, [oy, i2, i3], row| {
            let (oz, o, image_n) = if three_d {
                (i2, i3 % oc, i3 / oc)
            } else {
                (0, i2, i3)
            };
            let line = (image_n * od + oz) * oh + oy;
            row.copy_from_slice(span(&out, (line * oc + o) * ow, ow)?);
            Ok(())
        },
    )
}

/// The inputs `i` (of `0..len`) that reach output position `pos` through a tap of
/// `0..taps` at stride `stride` (`pos = i * stride + tap`), ascending.
fn scattered_from(pos: usize, taps: usize, len: usize, stride: usize) -> std::ops::Range<usize> {
    let first = if pos >= taps {
        (pos - taps) / stride + 1
    } else {
        0
    };
    let end = (pos / stride + 1).min(len);
    first..end.max(first)
}

/// CONV_TRANSPOSE_1D / CONV_TRANSPOSE_2D: kernel in slot 0, image in slot 1 (shapes in
/// [`crate::compute::plan::Kernel::ConvTranspose`]).
///
/// ggml scatters `dot(input[ix, iy, :], kernel[kx, ky, oc, :])` onto output
/// `(ix * s + kx, iy * s + ky)` in input order (rows, then columns); gathering the same
/// products per output in the same input order gives the same sums, and no two threads
/// write one output. An F16 kernel's products take the input rounded to f16, as ggml's do.
pub(super) fn conv_transpose(
    node: &Node<'_>,
    dst: Dst<'_>,
    stride: usize,
    two_d: bool,
) -> Result<()> {
    let (k, b) = (node.view(0)?, node.view(1)?);
    // the 1-D form in 2-D terms: a one-row image and kernel, one image
    let [kw, kh, oc, ic] = if two_d {
        k.layout.ne
    } else {
        [k.layout.ne[0], 1, k.layout.ne[1], k.layout.ne[2]]
    };
    let [w, h, _, _] = if two_d {
        b.layout.ne
    } else {
        [b.layout.ne[0], 1, b.layout.ne[1], 1]
    };
    let f16 = k.layout.type_id == ty::F16;
    // channels innermost, so that each product is one dot product of adjacent values
    let image = widen_all(node, &b)?;
    let mut inputs = vec![0.0f32; image.len()];
    for (at, &v) in image.iter().enumerate() {
        let (x, rest) = (at % w, at / w);
        let (y, rest) = (rest % h, rest / h);
        let (c, image_n) = (rest % ic, rest / ic);
        inputs[((image_n * h + y) * w + x) * ic + c] = if f16 { round_f16(v) } else { v };
    }
    let weights = widen_all(node, &k)?;
    let mut taps = vec![0.0f32; weights.len()];
    for (at, &v) in weights.iter().enumerate() {
        let (kx, rest) = (at % kw, at / kw);
        let (ky, rest) = (rest % kh, rest / kh);
        let (o, c) = (rest % oc, rest / oc);
        taps[((o * kh + ky) * kw + kx) * ic + c] = v;
    }
    fill_rows(
        node,
        dst,
        kw.saturating_mul(kh).saturating_mul(ic) / stride.max(1),
        || (),
        |_, idx, row| {
            let (y, o, image_n) = if two_d {
                (idx[0], idx[1], idx[2])
            } else {
                (0, idx[0], 0)
            };
            for (x, out) in row.iter_mut().enumerate() {
                let mut sum = 0.0f32;
                for iy in scattered_from(y, kh, h, stride) {
                    let ky = y - iy * stride;
                    for ix in scattered_from(x, kw, w, stride) {
                        let kx = x - ix * stride;
                        let input = span(&inputs, ((image_n * h + iy) * w + ix) * ic, ic)?;
                        let tap = span(&taps, ((o * kh + ky) * kw + kx) * ic, ic)?;
                        sum += dot(input, tap);
                    }
                }
                *out = sum;
            }
            Ok(())
        },
    )
}

/// COL2IM_1D: columns `[K * OC, T_in]` in slot 0. Output `(t, oc)` sums, over the columns
/// `t_in` ascending that reach position `t + crop` through tap `k = t + crop - t_in * s`,
/// the column values `(oc * K + k, t_in)`, in f32, stored in the columns' type.
pub(super) fn col2im_1d(
    node: &Node<'_>,
    dst: Dst<'_>,
    stride: usize,
    channels: usize,
    crop: usize,
) -> Result<()> {
    let a = node.view(0)?;
    let [height, columns, _, _] = a.layout.ne;
    let taps = height / channels;
    let values = widen_all(node, &a)?;
    fill_rows(
        node,
        dst,
        taps.div_ceil(stride),
        || (),
        |_, [o, _, _], row| {
            for (t, out) in row.iter_mut().enumerate() {
                let at = t + crop;
                let mut sum = 0.0f32;
                for column in scattered_from(at, taps, columns, stride) {
                    let k = at - column * stride;
                    sum += values[column * height + o * taps + k];
                }
                *out = sum;
            }
            Ok(())
        },
    )
}
