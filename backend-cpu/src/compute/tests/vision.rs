//! Tests of IM2COL, CONV_2D_DW, POOL_1D, POOL_2D, UPSCALE and PAD_REFLECT_1D: results against
//! naive references written here (several shapes, strides, paddings, dilations, F16 where the
//! op has it, permuted sources and destinations), the same bytes from one and three threads,
//! and refusals of malformed nodes before anything is written.

use proto_core::ggml::types::id as ty;
use proto_core::ggml::Op;
use proto_core::graph::TensorIndex;
use proto_core::ErrorKind;

use super::{assert_close, assert_refused, Rng, G};
use crate::compute::view::round_f16;

/// Runs `g` on one and on three threads, checks that the bytes agree, returns them.
fn run_both(g: &G, what: &str) -> Vec<u8> {
    let one = g.run(1).unwrap();
    let three = g.run(3).unwrap();
    assert!(one == three, "{what}: 1 and 3 threads differ");
    one
}

/// Flat index of `[i0, i1, i2, i3]` in a contiguous tensor of sizes `ne`.
fn flat(ne: [usize; 4], [i0, i1, i2, i3]: [usize; 4]) -> usize {
    ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0
}

/// Input position of output `o`, tap `k`, or `None` outside `0..n`.
fn tap(o: usize, k: usize, stride: i64, pad: i64, dilation: i64, n: usize) -> Option<usize> {
    let at = o as i64 * stride + k as i64 * dilation - pad;
    (0..n as i64).contains(&at).then_some(at as usize)
}

/// ggml's convolution output size.
fn conv_out(n: usize, k: usize, stride: i64, pad: i64, dilation: i64) -> usize {
    ((n as i64 + 2 * pad - dilation * (k as i64 - 1) - 1) / stride + 1) as usize
}

// --- IM2COL ----------------------------------------------------------------------------------

/// IM2COL's 2-D reference: `[IC*KH*KW, OW, OH, N]`.
fn im2col_reference(
    image: &[f32],
    ne: [usize; 4],
    [kw, kh]: [usize; 2],
    [s0, s1, p0, p1, d0, d1]: [i64; 6],
) -> Vec<f64> {
    let [iw, ih, ic, n] = ne;
    let (ow, oh) = (conv_out(iw, kw, s0, p0, d0), conv_out(ih, kh, s1, p1, d1));
    let mut out = Vec::new();
    for b in 0..n {
        for y in 0..oh {
            for x in 0..ow {
                for c in 0..ic {
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let v = match (tap(y, ky, s1, p1, d1, ih), tap(x, kx, s0, p0, d0, iw)) {
                                (Some(yy), Some(xx)) => image[flat(ne, [xx, yy, c, b])],
                                _ => 0.0,
                            };
                            out.push(f64::from(v));
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn im2col_2d_lists_every_window_with_strides_padding_dilation_in_f32_and_f16() {
    let mut rng = Rng::new(11);
    // (image, kernel [KW, KH], s0, s1, p0, p1, d0, d1)
    let cases: [([usize; 4], [usize; 2], [i64; 6]); 5] = [
        ([10, 10, 3, 1], [3, 3], [1, 1, 1, 1, 1, 1]),
        ([9, 7, 2, 2], [3, 2], [2, 1, 0, 2, 1, 2]),
        ([5, 5, 1, 3], [3, 4], [1, 1, 0, 0, 1, 1]),
        ([12, 6, 4, 1], [2, 3], [3, 2, 1, 0, 2, 1]),
        ([4, 4, 2, 1], [5, 5], [1, 1, 2, 2, 1, 1]),
    ];
    for (ne, [kw, kh], params) in cases {
        for dst_type in [ty::F32, ty::F16] {
            let what = format!("im2col {ne:?} by {kw}x{kh} {params:?} to type {dst_type}");
            let image = rng.values(ne.iter().product(), 1.0);
            let [s0, s1, p0, p1, d0, d1] = params;
            let (ow, oh) = (
                conv_out(ne[0], kw, s0, p0, d0),
                conv_out(ne[1], kh, s1, p1, d1),
            );
            let mut g = G::new();
            let b = g.input(ty::F32, ne, &image);
            let k = g.zeros(ty::F16, [kw, kh, ne[2], 2]);
            let p: Vec<i32> = params.iter().map(|&v| v as i32).chain([1]).collect();
            let out = g.node(
                Op::IM2COL,
                dst_type,
                [ne[2] * kh * kw, ow, oh, ne[3]],
                &[k, b],
                &p,
            );
            let bytes = run_both(&g, &what);
            let mut want = im2col_reference(&image, ne, [kw, kh], params);
            if dst_type == ty::F16 {
                want.iter_mut()
                    .for_each(|v| *v = f64::from(round_f16(*v as f32)));
            }
            assert_close(&g.read(&bytes, out), &want, 0.0, &what);
        }
    }
}

#[test]
fn im2col_1d_reads_channels_of_rows_and_f16_images() {
    let mut rng = Rng::new(12);
    // image [IW, IC, N], kernel width, s0, p0, d0
    for (ne, kw, s0, p0, d0) in [
        ([30, 4, 2, 1], 3, 1, 1, 1),
        ([17, 3, 1, 1], 4, 2, 0, 3),
        ([8, 2, 3, 1], 1, 1, 2, 1),
    ] {
        let what = format!("im2col 1-D {ne:?} k {kw} s {s0} p {p0} d {d0}");
        let image = rng.values(ne.iter().product(), 1.0);
        let ow = conv_out(ne[0], kw, s0, p0, d0);
        // the 1-D form is the 2-D one over a one-row image
        let want = im2col_reference(
            &image,
            [ne[0], 1, ne[1], ne[2]],
            [kw, 1],
            [s0, 1, p0, 0, d0, 1],
        );
        for (src_type, dst_type) in [(ty::F32, ty::F32), (ty::F16, ty::F16)] {
            let mut g = G::new();
            let b = g.input(src_type, ne, &image);
            let k = g.zeros(ty::F32, [kw, ne[1], 5, 1]);
            let out = g.node(
                Op::IM2COL,
                dst_type,
                [ne[1] * kw, ow, ne[2], 1],
                &[k, b],
                &[s0 as i32, 0, p0 as i32, 0, d0 as i32, 0, 0],
            );
            let bytes = run_both(&g, &what);
            let want: Vec<f64> = if src_type == ty::F16 {
                want.iter()
                    .map(|&v| f64::from(round_f16(v as f32)))
                    .collect()
            } else {
                want.clone()
            };
            assert_close(&g.read(&bytes, out), &want, 0.0, &what);
        }
        // ggml's 1-D kernel reads row -p1 of its one-row image: all zeros when p1 != 0
        let mut g = G::new();
        let b = g.input(ty::F32, ne, &image);
        let k = g.zeros(ty::F32, [kw, ne[1], 1, 1]);
        let out = g.node(
            Op::IM2COL,
            ty::F32,
            [ne[1] * kw, ow, ne[2], 1],
            &[k, b],
            &[s0 as i32, 1, p0 as i32, 1, d0 as i32, 1, 0],
        );
        let bytes = run_both(&g, &what);
        assert!(
            g.read(&bytes, out).iter().all(|&v| v == 0.0),
            "{what}: p1 = 1"
        );
    }
}

#[test]
fn im2col_reads_a_permuted_image_through_its_strides() {
    let mut rng = Rng::new(13);
    let ne = [6, 5, 3, 2];
    let image = rng.values(ne.iter().product(), 1.0);
    // stored as [W, C, H, N]: the logical [W, H, C, N] is a permuted view
    let mut stored = vec![0.0f32; image.len()];
    let phys = [ne[0], ne[2], ne[1], ne[3]];
    for n in 0..ne[3] {
        for c in 0..ne[2] {
            for y in 0..ne[1] {
                for x in 0..ne[0] {
                    stored[flat(phys, [x, c, y, n])] = image[flat(ne, [x, y, c, n])];
                }
            }
        }
    }
    let mut g = G::new();
    let base = g.input(ty::F32, phys, &stored);
    let b = g.permute(base, [0, 2, 1, 3]);
    let k = g.zeros(ty::F32, [3, 3, 3, 1]);
    let params = [1i64, 2, 1, 1, 1, 1];
    let (ow, oh) = (conv_out(6, 3, 1, 1, 1), conv_out(5, 3, 2, 1, 1));
    let out = g.node(
        Op::IM2COL,
        ty::F32,
        [27, ow, oh, 2],
        &[k, b],
        &[1, 2, 1, 1, 1, 1, 1],
    );
    let bytes = run_both(&g, "permuted im2col");
    let want = im2col_reference(&image, ne, [3, 3], params);
    assert_close(&g.read(&bytes, out), &want, 0.0, "permuted im2col");
}

// --- CONV_2D_DW ------------------------------------------------------------------------------

/// CONV_2D_DW's reference in f64: `[OW, OH, C, N]`.
fn conv_dw_reference(
    image: &[f32],
    ne: [usize; 4],
    kernel: &[f32],
    [kw, kh]: [usize; 2],
    [s, p, d]: [i64; 3],
) -> Vec<f64> {
    let [w, h, c, n] = ne;
    let (ow, oh) = (conv_out(w, kw, s, p, d), conv_out(h, kh, s, p, d));
    let mut out = Vec::new();
    for b in 0..n {
        for ch in 0..c {
            for y in 0..oh {
                for x in 0..ow {
                    let mut sum = 0.0f64;
                    for ky in 0..kh {
                        for kx in 0..kw {
                            if let (Some(yy), Some(xx)) =
                                (tap(y, ky, s, p, d, h), tap(x, kx, s, p, d, w))
                            {
                                sum += f64::from(kernel[flat([kw, kh, 1, c], [kx, ky, 0, ch])])
                                    * f64::from(image[flat(ne, [xx, yy, ch, b])]);
                            }
                        }
                    }
                    out.push(sum);
                }
            }
        }
    }
    out
}

#[test]
fn conv_2d_dw_convolves_each_channel_in_whcn_and_cwhn_layouts() {
    let mut rng = Rng::new(21);
    // (image, kernel [KW, KH], stride, pad, dilation)
    for (ne, [kw, kh], spd) in [
        ([17, 34, 9, 1], [3, 3], [1, 0, 1]),
        ([32, 8, 16, 1], [3, 3], [2, 1, 1]),
        ([11, 9, 5, 2], [5, 3], [1, 2, 2]),
        ([3, 3, 2, 1], [4, 4], [1, 2, 1]),
    ] {
        let c = ne[2];
        let image = rng.values(ne.iter().product(), 1.0);
        for kernel_type in [ty::F32, ty::F16] {
            let mut kernel = rng.values(kw * kh * c, 1.0);
            if kernel_type == ty::F16 {
                kernel.iter_mut().for_each(|v| *v = round_f16(*v));
            }
            let want = conv_dw_reference(&image, ne, &kernel, [kw, kh], spd);
            let [s, p, d] = spd.map(|v| v as i32);
            let (ow, oh) = (
                conv_out(ne[0], kw, spd[0], spd[1], spd[2]),
                conv_out(ne[1], kh, spd[0], spd[1], spd[2]),
            );
            let dst_ne = [ow, oh, c, ne[3]];
            let params = [s, s, p, p, d, d];
            for cwhn in [false, true] {
                let what =
                    format!("conv_2d_dw {ne:?} {kw}x{kh} {spd:?} type {kernel_type} cwhn {cwhn}");
                let mut g = G::new();
                let out = if cwhn {
                    // channels innermost, as ggml's channel-last path stores them
                    let phys = [c, ne[0], ne[1], ne[3]];
                    let mut stored = vec![0.0f32; image.len()];
                    for n in 0..ne[3] {
                        for ch in 0..c {
                            for y in 0..ne[1] {
                                for x in 0..ne[0] {
                                    stored[flat(phys, [ch, x, y, n])] =
                                        image[flat(ne, [x, y, ch, n])];
                                }
                            }
                        }
                    }
                    let base = g.input(ty::F32, phys, &stored);
                    let b = g.permute(base, [2, 0, 1, 3]);
                    let kphys = [c, kw, kh, 1];
                    let mut kstored = vec![0.0f32; kernel.len()];
                    for ch in 0..c {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                kstored[flat(kphys, [ch, kx, ky, 0])] =
                                    kernel[flat([kw, kh, 1, c], [kx, ky, 0, ch])];
                            }
                        }
                    }
                    let kbase = g.input(kernel_type, kphys, &kstored);
                    let k = g.permute(kbase, [3, 0, 1, 2]);
                    let target = g.zeros(ty::F32, [c, ow, oh, ne[3]]);
                    let view = g.permute(target, [2, 0, 1, 3]);
                    g.node_into(Op::CONV_2D_DW, view, &[k, b], &params)
                } else {
                    let b = g.input(ty::F32, ne, &image);
                    let k = g.input(kernel_type, [kw, kh, 1, c], &kernel);
                    g.node(Op::CONV_2D_DW, ty::F32, dst_ne, &[k, b], &params)
                };
                let bytes = run_both(&g, &what);
                assert_close(&g.read(&bytes, out), &want, 1e-12, &what);
            }
        }
    }
}

// --- POOL_1D / POOL_2D -----------------------------------------------------------------------

/// POOL_2D's reference (ggml: padding counts in the average; max from -FLT_MAX).
fn pool_reference(
    src: &[f32],
    ne: [usize; 4],
    max: bool,
    [k0, k1]: [usize; 2],
    [s0, s1]: [i64; 2],
    [p0, p1]: [i64; 2],
    one_d: bool,
) -> Vec<f64> {
    let pooled =
        |n: usize, k: usize, s: i64, p: i64| ((n as i64 + 2 * p - k as i64) / s + 1) as usize;
    let ow = pooled(ne[0], k0, s0, p0);
    let oh = if one_d {
        ne[1]
    } else {
        pooled(ne[1], k1, s1, p1)
    };
    let mut out = Vec::new();
    for plane in 0..ne[2] * ne[3] {
        for y in 0..oh {
            for x in 0..ow {
                let mut values = Vec::new();
                for ky in 0..k1 {
                    let yy = if one_d {
                        Some(y)
                    } else {
                        tap(y, ky, s1, p1, 1, ne[1])
                    };
                    for kx in 0..k0 {
                        if let (Some(yy), Some(xx)) = (yy, tap(x, kx, s0, p0, 1, ne[0])) {
                            values.push(f64::from(src[(plane * ne[1] + yy) * ne[0] + xx]));
                        }
                    }
                }
                out.push(if max {
                    values.iter().copied().fold(-f64::from(f32::MAX), f64::max)
                } else if one_d {
                    if values.is_empty() {
                        0.0
                    } else {
                        values.iter().sum::<f64>() / values.len() as f64
                    }
                } else {
                    values.iter().sum::<f64>() / (k0 * k1) as f64
                });
            }
        }
    }
    out
}

#[test]
fn pool_2d_takes_max_and_padded_average_of_each_window() {
    let mut rng = Rng::new(31);
    for max in [false, true] {
        for (ne, k, s, p) in [
            ([10, 10, 3, 1], [3, 3], [1, 1], [1, 1]),
            ([10, 10, 3, 1], [1, 3], [2, 1], [0, 1]),
            ([7, 9, 2, 2], [2, 3], [2, 3], [1, 0]),
            ([4, 5, 1, 1], [6, 2], [1, 1], [2, 0]),
            ([10, 7, 2, 1], [2, 2], [2, 3], [3, 3]),
        ] {
            for src_type in [ty::F32, ty::F16] {
                let what =
                    format!("pool_2d max {max} {ne:?} k {k:?} s {s:?} p {p:?} type {src_type}");
                let mut values = rng.values(ne.iter().product(), 3.0);
                if src_type == ty::F16 {
                    values.iter_mut().for_each(|v| *v = round_f16(*v));
                }
                let want = pool_reference(&values, ne, max, k, s, p, false);
                let ow = ((ne[0] as i64 + 2 * p[0] - k[0] as i64) / s[0] + 1) as usize;
                let oh = ((ne[1] as i64 + 2 * p[1] - k[1] as i64) / s[1] + 1) as usize;
                let mut g = G::new();
                let a = g.input(src_type, ne, &values);
                let params = [
                    i32::from(!max),
                    k[0] as i32,
                    k[1] as i32,
                    s[0] as i32,
                    s[1] as i32,
                    p[0] as i32,
                    p[1] as i32,
                ];
                let out = g.node(Op::POOL_2D, ty::F32, [ow, oh, ne[2], ne[3]], &[a], &params);
                let bytes = run_both(&g, &what);
                assert_close(&g.read(&bytes, out), &want, 1e-12, &what);
            }
        }
    }
}

#[test]
fn pool_1d_averages_only_the_taps_inside_each_row() {
    let mut rng = Rng::new(32);
    for max in [false, true] {
        for (ne, k, s, p) in [
            ([10, 1, 1, 1], 3, 3, 0),
            ([11, 3, 2, 1], 4, 2, 2),
            ([5, 2, 1, 2], 7, 1, 3),
        ] {
            let what = format!("pool_1d max {max} {ne:?} k {k} s {s} p {p}");
            let values = rng.values(ne.iter().product(), 3.0);
            let want = pool_reference(&values, ne, max, [k, 1], [s, 1], [p, 0], true);
            let ow = ((ne[0] as i64 + 2 * p - k as i64) / s + 1) as usize;
            let mut g = G::new();
            let a = g.input(ty::F32, ne, &values);
            let out = g.node(
                Op::POOL_1D,
                ty::F32,
                [ow, ne[1], ne[2], ne[3]],
                &[a],
                &[i32::from(!max), k as i32, s as i32, p as i32],
            );
            let bytes = run_both(&g, &what);
            assert_close(&g.read(&bytes, out), &want, 1e-12, &what);
        }
    }
}

// --- UPSCALE ---------------------------------------------------------------------------------

/// UPSCALE's reference, straight from the definitions (f32 coordinates as ggml computes them,
/// f64 sums): mode 0 nearest, 1 bilinear, 2 bicubic, 3 bilinear with antialias.
fn upscale_reference(
    src: &[f32],
    ne_src: [usize; 4],
    ne: [usize; 4],
    mode: u32,
    align: bool,
) -> Vec<f64> {
    let sf = |d: usize| ne[d] as f32 / ne_src[d] as f32;
    let (mut sf0, mut sf1) = (sf(0), sf(1));
    let mut po = 0.5f32;
    if align {
        po = 0.0;
        if ne[0] > 1 && ne_src[0] > 1 {
            sf0 = (ne[0] - 1) as f32 / (ne_src[0] - 1) as f32;
        }
        if ne[1] > 1 && ne_src[1] > 1 {
            sf1 = (ne[1] - 1) as f32 / (ne_src[1] - 1) as f32;
        }
    }
    let near = |i: usize, sf: f32, n: usize| ((i as f32 / sf) as usize).min(n - 1);
    let mut out = Vec::new();
    for i3 in 0..ne[3] {
        let j3 = near(i3, sf(3), ne_src[3]);
        for i2 in 0..ne[2] {
            let j2 = near(i2, sf(2), ne_src[2]);
            let px = |x: i64, y: i64| {
                let x = x.clamp(0, ne_src[0] as i64 - 1) as usize;
                let y = y.clamp(0, ne_src[1] as i64 - 1) as usize;
                f64::from(src[flat(ne_src, [x, y, j2, j3])])
            };
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    let v = match mode {
                        0 => px(
                            near(i0, sf0, ne_src[0]) as i64,
                            near(i1, sf1, ne_src[1]) as i64,
                        ),
                        1 => {
                            let x = (i0 as f32 + po) / sf0 - po;
                            let y = (i1 as f32 + po) / sf1 - po;
                            let (x0, y0) = (x.floor() as i64, y.floor() as i64);
                            let cx = x0.clamp(0, ne_src[0] as i64 - 1);
                            let cy = y0.clamp(0, ne_src[1] as i64 - 1);
                            let dx = f64::from((x - cx as f32).clamp(0.0, 1.0));
                            let dy = f64::from((y - cy as f32).clamp(0.0, 1.0));
                            px(x0, y0) * (1.0 - dx) * (1.0 - dy)
                                + px(x0 + 1, y0) * dx * (1.0 - dy)
                                + px(x0, y0 + 1) * (1.0 - dx) * dy
                                + px(x0 + 1, y0 + 1) * dx * dy
                        }
                        2 => {
                            let x = (i0 as f32 + po) / sf0 - po;
                            let y = (i1 as f32 + po) / sf1 - po;
                            let (x0, y0) = (x.floor() as i64, y.floor() as i64);
                            let (dx, dy) = (f64::from(x - x0 as f32), f64::from(y - y0 as f32));
                            let w = |t: f64| {
                                let a = -0.75;
                                let t = t.abs();
                                if t <= 1.0 {
                                    (a + 2.0) * t * t * t - (a + 3.0) * t * t + 1.0
                                } else {
                                    a * t * t * t - 5.0 * a * t * t + 8.0 * a * t - 4.0 * a
                                }
                            };
                            let mut sum = 0.0;
                            for oy in -1..=2i64 {
                                for ox in -1..=2i64 {
                                    sum += px(x0 + ox, y0 + oy)
                                        * w(ox as f64 - dx)
                                        * w(oy as f64 - dy);
                                }
                            }
                            sum
                        }
                        _ => {
                            let tri = |t: f64| (1.0 - t.abs()).max(0.0);
                            let (sup0, sup1) = ((1.0 / sf0).max(1.0), (1.0 / sf1).max(1.0));
                            let x = (i0 as f32 + po) / sf0;
                            let y = (i1 as f32 + po) / sf1;
                            let (mut sum, mut total) = (0.0, 0.0);
                            for sy in 0..ne_src[1] {
                                for sx in 0..ne_src[0] {
                                    let w = tri(f64::from((sx as f32 - x + po) / sup0))
                                        * tri(f64::from((sy as f32 - y + po) / sup1));
                                    if w > 0.0 {
                                        sum += px(sx as i64, sy as i64) * w;
                                        total += w;
                                    }
                                }
                            }
                            if total > 0.0 {
                                sum / total
                            } else {
                                sum
                            }
                        }
                    };
                    out.push(v);
                }
            }
        }
    }
    out
}

#[test]
fn upscale_resamples_in_every_mode_with_and_without_align_corners() {
    let mut rng = Rng::new(41);
    let cases: [([usize; 4], [usize; 4]); 5] = [
        ([2, 5, 7, 3], [5, 7, 11, 4]),
        ([5, 7, 11, 3], [2, 5, 7, 2]),
        ([8, 6, 2, 1], [16, 12, 2, 1]),
        ([1, 4, 3, 2], [2, 8, 3, 2]),
        ([4, 1, 3, 2], [1, 1, 3, 2]),
    ];
    for (ne_src, ne) in cases {
        let values = rng.values(ne_src.iter().product(), 1.0);
        for (mode, flags) in [
            (0u32, 0i32),
            (1, 1),
            (2, 2),
            (3, 1 | 1 << 9),
            (1, 1 | 1 << 8),
            (2, 2 | 1 << 8),
        ] {
            let align = flags & (1 << 8) != 0;
            let what = format!("upscale {ne_src:?} -> {ne:?} mode {flags:#x}");
            let want = upscale_reference(&values, ne_src, ne, mode, align);
            let mut g = G::new();
            let a = g.input(ty::F32, ne_src, &values);
            let out = g.node(Op::UPSCALE, ty::F32, ne, &[a], &[flags]);
            let bytes = run_both(&g, &what);
            assert_close(&g.read(&bytes, out), &want, 1e-10, &what);
        }
    }
}

#[test]
fn upscale_reads_a_transposed_source() {
    let mut rng = Rng::new(42);
    let phys = [6, 4, 2, 1];
    let values = rng.values(48, 1.0);
    let mut logical = vec![0.0f32; 48];
    for c in 0..2 {
        for y in 0..4 {
            for x in 0..6 {
                logical[flat([4, 6, 2, 1], [y, x, c, 0])] = values[flat(phys, [x, y, c, 0])];
            }
        }
    }
    let want = upscale_reference(&logical, [4, 6, 2, 1], [8, 12, 2, 1], 1, false);
    let mut g = G::new();
    let base = g.input(ty::F32, phys, &values);
    let a = g.permute(base, [1, 0, 2, 3]);
    let out = g.node(Op::UPSCALE, ty::F32, [8, 12, 2, 1], &[a], &[1]);
    let bytes = run_both(&g, "transposed upscale");
    assert_close(&g.read(&bytes, out), &want, 1e-10, "transposed upscale");
}

// --- PAD_REFLECT_1D --------------------------------------------------------------------------

#[test]
fn pad_reflect_1d_mirrors_both_ends_of_every_row() {
    let mut rng = Rng::new(51);
    for (ne, p0, p1) in [
        ([12, 3, 2, 1], 10, 9),
        ([5, 2, 1, 2], 0, 4),
        ([1, 3, 1, 1], 0, 0),
        ([7, 1, 1, 1], 6, 0),
    ] {
        let what = format!("pad_reflect_1d {ne:?} {p0} {p1}");
        let values = rng.values(ne.iter().product(), 1.0);
        let mut want = Vec::new();
        for row in values.chunks(ne[0]) {
            let n = ne[0] as i64;
            for i in -(p0 as i64)..n + p1 as i64 {
                // reflection without repeating the edge
                let j = if i < 0 {
                    -i
                } else if i >= n {
                    2 * (n - 1) - i
                } else {
                    i
                };
                want.push(f64::from(row[j as usize]));
            }
        }
        let mut g = G::new();
        let a = g.input(ty::F32, ne, &values);
        let out = g.node(
            Op::PAD_REFLECT_1D,
            ty::F32,
            [ne[0] + p0 + p1, ne[1], ne[2], ne[3]],
            &[a],
            &[p0 as i32, p1 as i32],
        );
        let bytes = run_both(&g, &what);
        assert_close(&g.read(&bytes, out), &want, 0.0, &what);
    }
}

// --- refusals --------------------------------------------------------------------------------

/// A graph of one node of `op` over fresh sources, to be refused with `kind`.
fn refused(kind: ErrorKind, what: &str, build: impl Fn(&mut G) -> TensorIndex) {
    let mut g = G::new();
    build(&mut g);
    let error = g.run(2).expect_err(what);
    assert_eq!(error.kind(), kind, "{what}: {error}");
    assert_refused(&g, kind);
}

#[test]
fn malformed_vision_nodes_are_refused_before_anything_is_written() {
    use ErrorKind::{InvalidGraph as Bad, OpRefused as Refused};
    let image = |g: &mut G, ne: [usize; 4]| g.input(ty::F32, ne, &vec![1.0; ne.iter().product()]);
    let im2col = |params: [i32; 7], dst: [usize; 4], dst_type: u32| {
        move |g: &mut G| {
            let b = image(g, [10, 10, 3, 1]);
            let k = g.zeros(ty::F16, [3, 3, 3, 1]);
            g.node(Op::IM2COL, dst_type, dst, &[k, b], &params)
        }
    };
    let fine = [1, 1, 1, 1, 1, 1, 1];
    // the well-formed node runs
    {
        let mut g = G::new();
        im2col(fine, [27, 10, 10, 1], ty::F32)(&mut g);
        g.run(1).unwrap();
    }
    refused(
        Bad,
        "im2col output size",
        im2col(fine, [27, 9, 10, 1], ty::F32),
    );
    refused(
        Bad,
        "im2col row width",
        im2col(fine, [26, 10, 10, 1], ty::F32),
    );
    refused(
        Bad,
        "im2col zero stride",
        im2col([0, 1, 1, 1, 1, 1, 1], [27, 10, 10, 1], ty::F32),
    );
    refused(
        Bad,
        "im2col negative dilation",
        im2col([1, 1, 1, 1, -1, 1, 1], [27, 10, 10, 1], ty::F32),
    );
    refused(
        Bad,
        "im2col huge padding",
        im2col([1, 1, i32::MAX, 1, 1, 1, 1], [27, 10, 10, 1], ty::F32),
    );
    refused(
        Bad,
        "im2col is_2D flag",
        im2col([1, 1, 1, 1, 1, 1, 7], [27, 10, 10, 1], ty::F32),
    );
    refused(
        Refused,
        "im2col to I32",
        im2col(fine, [27, 10, 10, 1], ty::I32),
    );
    refused(Bad, "im2col channel mismatch", |g| {
        let b = image(g, [10, 10, 3, 1]);
        let k = g.zeros(ty::F16, [3, 3, 2, 1]);
        g.node(Op::IM2COL, ty::F32, [18, 10, 10, 1], &[k, b], &fine)
    });
    refused(Bad, "conv_2d_dw kernel channels", |g| {
        let b = image(g, [8, 8, 4, 1]);
        let k = image(g, [3, 3, 1, 3]);
        g.node(
            Op::CONV_2D_DW,
            ty::F32,
            [6, 6, 4, 1],
            &[k, b],
            &[1, 1, 0, 0, 1, 1],
        )
    });
    refused(Bad, "conv_2d_dw output size", |g| {
        let b = image(g, [8, 8, 4, 1]);
        let k = image(g, [3, 3, 1, 4]);
        g.node(
            Op::CONV_2D_DW,
            ty::F32,
            [7, 6, 4, 1],
            &[k, b],
            &[1, 1, 0, 0, 1, 1],
        )
    });
    refused(Refused, "conv_2d_dw F16 image", |g| {
        let b = g.input(ty::F16, [8, 8, 4, 1], &[1.0; 256]);
        let k = image(g, [3, 3, 1, 4]);
        g.node(
            Op::CONV_2D_DW,
            ty::F32,
            [6, 6, 4, 1],
            &[k, b],
            &[1, 1, 0, 0, 1, 1],
        )
    });
    refused(Bad, "conv_2d_dw missing kernel", |g| {
        let b = image(g, [8, 8, 4, 1]);
        g.node(
            Op::CONV_2D_DW,
            ty::F32,
            [6, 6, 4, 1],
            &[b],
            &[1, 1, 0, 0, 1, 1],
        )
    });
    let pool2 = |params: [i32; 7], dst: [usize; 4]| {
        move |g: &mut G| {
            let a = image(g, [10, 10, 3, 1]);
            g.node(Op::POOL_2D, ty::F32, dst, &[a], &params)
        }
    };
    refused(
        Bad,
        "pool_2d output size",
        pool2([0, 3, 3, 1, 1, 1, 1], [10, 9, 3, 1]),
    );
    refused(
        Bad,
        "pool_2d zero window",
        pool2([0, 0, 3, 1, 1, 1, 1], [12, 10, 3, 1]),
    );
    refused(
        Bad,
        "pool_2d unknown op",
        pool2([2, 3, 3, 1, 1, 1, 1], [10, 10, 3, 1]),
    );
    refused(
        Bad,
        "pool_2d negative stride",
        pool2([0, 3, 3, -1, 1, 1, 1], [10, 10, 3, 1]),
    );
    refused(
        Bad,
        "pool_2d channels",
        pool2([0, 3, 3, 1, 1, 1, 1], [10, 10, 2, 1]),
    );
    refused(Bad, "pool_1d huge window", |g| {
        let a = image(g, [10, 1, 1, 1]);
        g.node(
            Op::POOL_1D,
            ty::F32,
            [1, 1, 1, 1],
            &[a],
            &[0, i32::MAX, 1, 0],
        )
    });
    refused(Bad, "upscale unknown mode", |g| {
        let a = image(g, [4, 4, 1, 1]);
        g.node(Op::UPSCALE, ty::F32, [8, 8, 1, 1], &[a], &[3])
    });
    refused(Bad, "upscale antialiased nearest", |g| {
        let a = image(g, [4, 4, 1, 1]);
        g.node(Op::UPSCALE, ty::F32, [8, 8, 1, 1], &[a], &[1 << 9])
    });
    refused(Bad, "upscale of an empty source", |g| {
        let a = g.zeros(ty::F32, [4, 0, 1, 1]);
        g.node(Op::UPSCALE, ty::F32, [8, 8, 1, 1], &[a], &[0])
    });
    refused(Refused, "upscale F16", |g| {
        let a = g.input(ty::F16, [4, 4, 1, 1], &[1.0; 16]);
        g.node(Op::UPSCALE, ty::F16, [8, 8, 1, 1], &[a], &[0])
    });
    refused(Bad, "pad_reflect_1d pad as long as the row", |g| {
        let a = image(g, [5, 2, 1, 1]);
        g.node(Op::PAD_REFLECT_1D, ty::F32, [10, 2, 1, 1], &[a], &[5, 0])
    });
    refused(Bad, "pad_reflect_1d negative pad", |g| {
        let a = image(g, [5, 2, 1, 1]);
        g.node(Op::PAD_REFLECT_1D, ty::F32, [4, 2, 1, 1], &[a], &[-1, 0])
    });
    refused(Bad, "pad_reflect_1d width", |g| {
        let a = image(g, [5, 2, 1, 1]);
        g.node(Op::PAD_REFLECT_1D, ty::F32, [9, 2, 1, 1], &[a], &[2, 1])
    });
}

#[test]
fn huge_windows_pool_without_visiting_every_tap() {
    // a window of ~2^31 taps whose output fits: only the taps inside the row are visited
    let mut g = G::new();
    let values: Vec<f32> = (0..10).map(|v| v as f32).collect();
    let a = g.input(ty::F32, [10, 1, 1, 1], &values);
    let k = i32::MAX;
    let p = (i64::from(k) - 10).div_euclid(2) as i32 + 1;
    // stride 1
    let ow = (10 + 2 * i64::from(p) - i64::from(k) + 1) as usize;
    let out = g.node(Op::POOL_1D, ty::F32, [ow, 1, 1, 1], &[a], &[1, k, 1, p]);
    let bytes = run_both(&g, "huge pool window");
    let got = g.read(&bytes, out);
    assert!(got.iter().all(|&v| (v - 4.5).abs() < 1e-6), "{got:?}");
}

// --- CONV_2D ---------------------------------------------------------------------------------

/// CONV_2D's reference in f64 (an F16 kernel's patch values rounded to f16 first, as ggml
/// does): `[OW, OH, OC, N]`.
#[allow(clippy::too_many_arguments)]
fn conv_2d_reference(
    image: &[f32],
    ne: [usize; 4],
    kernel: &[f32],
    kne: [usize; 4],
    [s0, s1, p0, p1, d0, d1]: [i64; 6],
    f16: bool,
) -> Vec<f64> {
    let [w, h, ic, n] = ne;
    let [kw, kh, _, oc] = kne;
    let (ow, oh) = (conv_out(w, kw, s0, p0, d0), conv_out(h, kh, s1, p1, d1));
    let mut out = Vec::new();
    for b in 0..n {
        for o in 0..oc {
            for y in 0..oh {
                for x in 0..ow {
                    let mut sum = 0.0f64;
                    for c in 0..ic {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                if let (Some(yy), Some(xx)) =
                                    (tap(y, ky, s1, p1, d1, h), tap(x, kx, s0, p0, d0, w))
                                {
                                    let v = image[flat(ne, [xx, yy, c, b])];
                                    let v = if f16 { round_f16(v) } else { v };
                                    sum +=
                                        f64::from(kernel[flat(kne, [kx, ky, c, o])]) * f64::from(v);
                                }
                            }
                        }
                    }
                    out.push(sum);
                }
            }
        }
    }
    out
}

#[test]
fn conv_2d_sums_every_input_channel_under_each_output_channel_kernel() {
    let mut rng = Rng::new(61);
    // (image, kernel [KW, KH, IC, OC], s0, s1, p0, p1, d0, d1)
    let cases: [([usize; 4], [usize; 4], [i64; 6]); 4] = [
        ([9, 8, 3, 1], [3, 3, 3, 4], [1, 1, 0, 0, 1, 1]),
        ([12, 7, 2, 2], [3, 2, 2, 5], [2, 1, 1, 2, 1, 2]),
        ([5, 5, 4, 1], [4, 4, 4, 2], [1, 2, 2, 1, 2, 1]),
        ([16, 4, 1, 3], [1, 1, 1, 3], [3, 1, 0, 0, 1, 1]),
    ];
    for (ne, kne, params) in cases {
        let image = rng.values(ne.iter().product(), 1.0);
        for kernel_type in [ty::F32, ty::F16] {
            let f16 = kernel_type == ty::F16;
            let mut kernel = rng.values(kne.iter().product(), 1.0);
            if f16 {
                kernel.iter_mut().for_each(|v| *v = round_f16(*v));
            }
            let what = format!("conv_2d {ne:?} by {kne:?} {params:?} type {kernel_type}");
            let want = conv_2d_reference(&image, ne, &kernel, kne, params, f16);
            let [s0, s1, p0, p1, d0, d1] = params;
            let (ow, oh) = (
                conv_out(ne[0], kne[0], s0, p0, d0),
                conv_out(ne[1], kne[1], s1, p1, d1),
            );
            let mut g = G::new();
            let b = g.input(ty::F32, ne, &image);
            let k = g.input(kernel_type, kne, &kernel);
            let p: Vec<i32> = params.iter().map(|&v| v as i32).collect();
            let out = g.node(Op::CONV_2D, ty::F32, [ow, oh, kne[3], ne[3]], &[k, b], &p);
            let bytes = run_both(&g, &what);
            assert_close(&g.read(&bytes, out), &want, 1e-12, &what);
        }
    }
}

// --- CONV_TRANSPOSE_1D / _2D -----------------------------------------------------------------

/// The transposed convolution's reference, scattering each input as its definition says:
/// kernel `[KW, KH, OC, IC]`, image `[W, H, IC, N]`, `[(W-1)s+KW, (H-1)s+KH, OC, N]`.
fn conv_transpose_reference(
    image: &[f32],
    ne: [usize; 4],
    kernel: &[f32],
    kne: [usize; 4],
    s: usize,
    f16: bool,
) -> Vec<f64> {
    let [w, h, ic, n] = ne;
    let [kw, kh, oc, _] = kne;
    let (ow, oh) = ((w - 1) * s + kw, (h - 1) * s + kh);
    let mut out = vec![0.0f64; ow * oh * oc * n];
    for b in 0..n {
        for o in 0..oc {
            for iy in 0..h {
                for ix in 0..w {
                    for ky in 0..kh {
                        for kx in 0..kw {
                            for c in 0..ic {
                                let v = image[flat(ne, [ix, iy, c, b])];
                                let v = if f16 { round_f16(v) } else { v };
                                out[flat([ow, oh, oc, n], [ix * s + kx, iy * s + ky, o, b])] +=
                                    f64::from(v) * f64::from(kernel[flat(kne, [kx, ky, o, c])]);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn conv_transpose_2d_scatters_every_input_through_the_kernel() {
    let mut rng = Rng::new(71);
    // (image [W, H, IC, N], kernel [KW, KH, OC, IC], stride)
    for (ne, kne, s) in [
        ([10, 10, 3, 1], [3, 3, 2, 3], 1),
        ([5, 4, 2, 2], [3, 2, 3, 2], 2),
        ([4, 6, 4, 1], [2, 5, 1, 4], 3),
        ([3, 2, 1, 1], [1, 1, 2, 1], 4),
    ] {
        let image = rng.values(ne.iter().product(), 1.0);
        for kernel_type in [ty::F32, ty::F16] {
            let f16 = kernel_type == ty::F16;
            let mut kernel = rng.values(kne.iter().product(), 1.0);
            if f16 {
                kernel.iter_mut().for_each(|v| *v = round_f16(*v));
            }
            let what = format!("conv_transpose_2d {ne:?} by {kne:?} stride {s} type {kernel_type}");
            let want = conv_transpose_reference(&image, ne, &kernel, kne, s, f16);
            let mut g = G::new();
            let b = g.input(ty::F32, ne, &image);
            let k = g.input(kernel_type, kne, &kernel);
            let dst = [
                (ne[0] - 1) * s + kne[0],
                (ne[1] - 1) * s + kne[1],
                kne[2],
                ne[3],
            ];
            let out = g.node(Op::CONV_TRANSPOSE_2D, ty::F32, dst, &[k, b], &[s as i32]);
            let bytes = run_both(&g, &what);
            assert_close(&g.read(&bytes, out), &want, 1e-12, &what);
        }
    }
}

#[test]
fn conv_transpose_1d_scatters_every_position_through_the_kernel() {
    let mut rng = Rng::new(72);
    // (length, in channels, kernel width, out channels, stride)
    for (len, ic, k, oc, s) in [
        (197, 4, 16, 3, 1),
        (9, 2, 3, 5, 2),
        (5, 3, 2, 2, 7),
        (1, 1, 4, 1, 1),
    ] {
        let image = rng.values(len * ic, 1.0);
        for kernel_type in [ty::F32, ty::F16] {
            let f16 = kernel_type == ty::F16;
            let mut kernel = rng.values(k * oc * ic, 1.0);
            if f16 {
                kernel.iter_mut().for_each(|v| *v = round_f16(*v));
            }
            let what = format!(
                "conv_transpose_1d len {len} ic {ic} k {k} oc {oc} s {s} type {kernel_type}"
            );
            // the 2-D reference over a one-row image and kernel
            let want =
                conv_transpose_reference(&image, [len, 1, ic, 1], &kernel, [k, 1, oc, ic], s, f16);
            let mut g = G::new();
            let b = g.input(ty::F32, [len, ic, 1, 1], &image);
            let kt = g.input(kernel_type, [k, oc, ic, 1], &kernel);
            let out = g.node(
                Op::CONV_TRANSPOSE_1D,
                ty::F32,
                [(len - 1) * s + k, oc, 1, 1],
                &[kt, b],
                &[s as i32, 0, 1],
            );
            let bytes = run_both(&g, &what);
            assert_close(&g.read(&bytes, out), &want, 1e-12, &what);
        }
    }
}

#[test]
fn malformed_convolutions_are_refused_before_anything_is_written() {
    use ErrorKind::{InvalidGraph as Bad, OpRefused as Refused};
    let values =
        |g: &mut G, t: u32, ne: [usize; 4]| g.input(t, ne, &vec![0.5; ne.iter().product()]);
    let conv = |kne: [usize; 4], dst: [usize; 4], params: [i32; 6], kt: u32| {
        move |g: &mut G| {
            let b = values(g, ty::F32, [8, 8, 3, 1]);
            let k = values(g, kt, kne);
            g.node(Op::CONV_2D, ty::F32, dst, &[k, b], &params)
        }
    };
    {
        let mut g = G::new();
        conv([3, 3, 3, 2], [6, 6, 2, 1], [1, 1, 0, 0, 1, 1], ty::F32)(&mut g);
        g.run(1).unwrap();
    }
    refused(
        Bad,
        "conv_2d channels",
        conv([3, 3, 2, 2], [6, 6, 2, 1], [1, 1, 0, 0, 1, 1], ty::F32),
    );
    refused(
        Bad,
        "conv_2d out channels",
        conv([3, 3, 3, 2], [6, 6, 3, 1], [1, 1, 0, 0, 1, 1], ty::F32),
    );
    refused(
        Bad,
        "conv_2d output size",
        conv([3, 3, 3, 2], [6, 5, 2, 1], [1, 1, 0, 0, 1, 1], ty::F32),
    );
    refused(
        Bad,
        "conv_2d zero dilation",
        conv([3, 3, 3, 2], [8, 6, 2, 1], [1, 1, 0, 0, 0, 1], ty::F32),
    );
    refused(Refused, "conv_2d Q8_0 kernel", |g| {
        let b = values(g, ty::F32, [8, 8, 3, 1]);
        let k = g.zeros(ty::Q8_0, [32, 1, 3, 2]);
        g.node(
            Op::CONV_2D,
            ty::F32,
            [1, 8, 2, 1],
            &[k, b],
            &[1, 1, 0, 0, 1, 1],
        )
    });
    let transpose_1d = |dst: [usize; 4], params: [i32; 3]| {
        move |g: &mut G| {
            let b = values(g, ty::F32, [9, 2, 1, 1]);
            let k = values(g, ty::F32, [3, 4, 2, 1]);
            g.node(Op::CONV_TRANSPOSE_1D, ty::F32, dst, &[k, b], &params)
        }
    };
    {
        let mut g = G::new();
        transpose_1d([19, 4, 1, 1], [2, 0, 1])(&mut g);
        g.run(1).unwrap();
    }
    refused(
        Bad,
        "conv_transpose_1d length",
        transpose_1d([18, 4, 1, 1], [2, 0, 1]),
    );
    refused(
        Bad,
        "conv_transpose_1d padding",
        transpose_1d([19, 4, 1, 1], [2, 1, 1]),
    );
    refused(
        Bad,
        "conv_transpose_1d dilation",
        transpose_1d([19, 4, 1, 1], [2, 0, 2]),
    );
    refused(
        Bad,
        "conv_transpose_1d zero stride",
        transpose_1d([3, 4, 1, 1], [0, 0, 1]),
    );
    refused(
        Bad,
        "conv_transpose_1d negative stride",
        transpose_1d([3, 4, 1, 1], [-4, 0, 1]),
    );
    refused(
        Bad,
        "conv_transpose_1d huge stride",
        transpose_1d([3, 4, 1, 1], [i32::MAX, 0, 1]),
    );
    refused(Bad, "conv_transpose_2d channels", |g| {
        let b = values(g, ty::F32, [4, 4, 3, 1]);
        let k = values(g, ty::F32, [3, 3, 2, 2]);
        g.node(Op::CONV_TRANSPOSE_2D, ty::F32, [6, 6, 2, 1], &[k, b], &[1])
    });
    refused(Refused, "conv_transpose_2d F16 image", |g| {
        let b = values(g, ty::F16, [4, 4, 2, 1]);
        let k = values(g, ty::F32, [3, 3, 2, 2]);
        g.node(Op::CONV_TRANSPOSE_2D, ty::F32, [6, 6, 2, 1], &[k, b], &[1])
    });
}

// --- IM2COL_3D / CONV_3D ---------------------------------------------------------------------

/// An IM2COL_3D case: image `[IW, IH, ID, N * IC]`, `IC`, kernel `[KW, KH, KD]`, strides,
/// paddings and dilations.
type Case3d = ([usize; 4], usize, [usize; 3], [i64; 9]);
/// A CONV_3D case: image, `IC`, `N`, `OC`, kernel `[KW, KH, KD]`, strides, paddings and
/// dilations.
type Conv3dCase = ([usize; 4], usize, usize, usize, [usize; 3], [i64; 9]);

/// IM2COL_3D's reference: image `[IW, IH, ID, N * IC]`, kernel `[KW, KH, KD]`, strides,
/// paddings, dilations `[s0, s1, s2, p0, p1, p2, d0, d1, d2]`; rows `(ow, oh, n * OD + od)`
/// of `IC * KD * KH * KW` values.
fn im2col_3d_reference(
    image: &[f32],
    ne: [usize; 4],
    ic: usize,
    k: [usize; 3],
    p: [i64; 9],
) -> Vec<f64> {
    let [iw, ih, id, nic] = ne;
    let out = |d: usize, n: usize| conv_out(n, k[d], p[d], p[3 + d], p[6 + d]);
    let (ow, oh, od) = (out(0, iw), out(1, ih), out(2, id));
    let mut rows = Vec::new();
    for n in 0..nic / ic {
        for z in 0..od {
            for y in 0..oh {
                for x in 0..ow {
                    for c in 0..ic {
                        for kz in 0..k[2] {
                            for ky in 0..k[1] {
                                for kx in 0..k[0] {
                                    let at = (
                                        tap(x, kx, p[0], p[3], p[6], iw),
                                        tap(y, ky, p[1], p[4], p[7], ih),
                                        tap(z, kz, p[2], p[5], p[8], id),
                                    );
                                    rows.push(match at {
                                        (Some(xx), Some(yy), Some(zz)) => {
                                            f64::from(image[flat(ne, [xx, yy, zz, n * ic + c])])
                                        }
                                        _ => 0.0,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    rows
}

#[test]
fn im2col_3d_lists_every_volume_window_in_f32_and_f16() {
    let mut rng = Rng::new(81);
    // (image [IW, IH, ID, N * IC], IC, kernel [KW, KH, KD], params)
    let cases: [Case3d; 3] = [
        ([6, 5, 4, 2], 2, [3, 3, 2], [1, 1, 1, 1, 1, 0, 1, 1, 1]),
        ([7, 4, 5, 6], 3, [2, 2, 3], [2, 1, 2, 0, 1, 1, 1, 2, 1]),
        ([4, 4, 4, 1], 1, [1, 2, 2], [1, 2, 1, 0, 0, 2, 1, 1, 2]),
    ];
    for (ne, ic, k, p) in cases {
        let image = rng.values(ne.iter().product(), 1.0);
        let want = im2col_3d_reference(&image, ne, ic, k, p);
        let out = |d: usize| conv_out(ne[d], k[d], p[d], p[3 + d], p[6 + d]);
        let dst_ne = [
            ic * k[0] * k[1] * k[2],
            out(0),
            out(1),
            out(2) * (ne[3] / ic),
        ];
        for dst_type in [ty::F32, ty::F16] {
            let what = format!("im2col_3d {ne:?} ic {ic} k {k:?} {p:?} type {dst_type}");
            let mut g = G::new();
            let b = g.input(ty::F32, ne, &image);
            let kt = g.zeros(ty::F16, [k[0], k[1], k[2], ic * 2]);
            let params: Vec<i32> = p.iter().map(|&v| v as i32).chain([ic as i32]).collect();
            let node = g.node(Op::IM2COL_3D, dst_type, dst_ne, &[kt, b], &params);
            let bytes = run_both(&g, &what);
            let want: Vec<f64> = if dst_type == ty::F16 {
                want.iter()
                    .map(|&v| f64::from(round_f16(v as f32)))
                    .collect()
            } else {
                want.clone()
            };
            assert_close(&g.read(&bytes, node), &want, 0.0, &what);
        }
    }
}

#[test]
fn conv_3d_is_im2col_3d_times_the_kernel() {
    let mut rng = Rng::new(82);
    // (image [W, H, D, N * IC], IC, N, OC, kernel [KW, KH, KD], params)
    let cases: [Conv3dCase; 3] = [
        (
            [6, 5, 4, 2],
            2,
            1,
            3,
            [3, 3, 2],
            [1, 1, 1, 1, 1, 0, 1, 1, 1],
        ),
        (
            [7, 4, 5, 6],
            3,
            2,
            2,
            [2, 2, 3],
            [2, 1, 2, 0, 1, 1, 1, 2, 1],
        ),
        (
            [4, 4, 4, 3],
            1,
            3,
            4,
            [1, 2, 2],
            [1, 2, 1, 0, 0, 2, 1, 1, 2],
        ),
    ];
    for (ne, ic, n, oc, k, p) in cases {
        let image = rng.values(ne.iter().product(), 1.0);
        let patch = ic * k[0] * k[1] * k[2];
        for kernel_type in [ty::F32, ty::F16] {
            let f16 = kernel_type == ty::F16;
            let mut kernel = rng.values(patch * oc, 1.0);
            if f16 {
                kernel.iter_mut().for_each(|v| *v = round_f16(*v));
            }
            let what =
                format!("conv_3d {ne:?} ic {ic} n {n} oc {oc} k {k:?} {p:?} type {kernel_type}");
            // patches [n][oz][oy][ox] x patch, the kernel [oc] x patch
            let patches = im2col_3d_reference(&image, ne, ic, k, p);
            let out = |d: usize| conv_out(ne[d], k[d], p[d], p[3 + d], p[6 + d]);
            let (ow, oh, od) = (out(0), out(1), out(2));
            let mut want = vec![0.0f64; ow * oh * od * oc * n];
            for (at, row) in patches.chunks(patch).enumerate() {
                let (x, rest) = (at % ow, at / ow);
                let (y, rest) = (rest % oh, rest / oh);
                let (z, b) = (rest % od, rest / od);
                for o in 0..oc {
                    let sum: f64 = row
                        .iter()
                        .zip(&kernel[o * patch..(o + 1) * patch])
                        .map(|(&v, &w)| {
                            let v = if f16 {
                                f64::from(round_f16(v as f32))
                            } else {
                                v
                            };
                            v * f64::from(w)
                        })
                        .sum();
                    want[flat([ow, oh, od, oc * n], [x, y, z, b * oc + o])] = sum;
                }
            }
            let mut g = G::new();
            let b = g.input(ty::F32, ne, &image);
            let kt = g.input(kernel_type, [k[0], k[1], k[2], ic * oc], &kernel);
            let params: Vec<i32> = p
                .iter()
                .map(|&v| v as i32)
                .chain([ic as i32, n as i32, oc as i32])
                .collect();
            let node = g.node(
                Op::CONV_3D,
                ty::F32,
                [ow, oh, od, oc * n],
                &[kt, b],
                &params,
            );
            let bytes = run_both(&g, &what);
            assert_close(&g.read(&bytes, node), &want, 1e-12, &what);
        }
    }
}

// --- COL2IM_1D -------------------------------------------------------------------------------

#[test]
fn col2im_1d_overlap_adds_columns_and_crops_in_every_float_type() {
    let mut rng = Rng::new(91);
    // (K, OC, T_in, stride, crop)
    for (k, oc, t_in, s, p) in [
        (4, 3, 7, 2, 0),
        (5, 1, 9, 3, 2),
        (1, 2, 4, 1, 0),
        (6, 2, 3, 4, 1),
    ] {
        for t in [ty::F32, ty::F16, ty::BF16] {
            let what = format!("col2im_1d K {k} OC {oc} T_in {t_in} s {s} p {p} type {t}");
            let columns = rng.values(k * oc * t_in, 1.0);
            let t_out = (t_in - 1) * s + k - 2 * p;
            let mut g = G::new();
            let a = g.input(t, [k * oc, t_in, 1, 1], &columns);
            let stored = g.read(&g.run(1).unwrap(), a);
            // scatter every column onto the uncropped signal, then crop
            let mut full = vec![0.0f64; oc * ((t_in - 1) * s + k)];
            let len = (t_in - 1) * s + k;
            for ti in 0..t_in {
                for o in 0..oc {
                    for kk in 0..k {
                        full[o * len + ti * s + kk] += f64::from(stored[ti * k * oc + o * k + kk]);
                    }
                }
            }
            let want: Vec<f64> = (0..oc)
                .flat_map(|o| full[o * len + p..o * len + p + t_out].to_vec())
                .map(|v| match t {
                    ty::F16 => f64::from(round_f16(v as f32)),
                    ty::BF16 => f64::from(crate::compute::view::round_bf16(v as f32)),
                    _ => v,
                })
                .collect();
            let out = g.node(
                Op::COL2IM_1D,
                t,
                [t_out, oc, 1, 1],
                &[a],
                &[s as i32, oc as i32, p as i32],
            );
            let bytes = run_both(&g, &what);
            let tolerance = if t == ty::F32 { 1e-12 } else { 1e-5 };
            assert_close(&g.read(&bytes, out), &want, tolerance, &what);
        }
    }
}

#[test]
fn malformed_3d_convolutions_and_col2im_are_refused_before_anything_is_written() {
    use ErrorKind::{InvalidGraph as Bad, OpRefused as Refused};
    let values =
        |g: &mut G, t: u32, ne: [usize; 4]| g.input(t, ne, &vec![0.5; ne.iter().product()]);
    let good = [1, 1, 1, 0, 0, 0, 1, 1, 1];
    let im2col_3d = |p: [i32; 9], ic: i32, dst: [usize; 4]| {
        move |g: &mut G| {
            let b = values(g, ty::F32, [5, 5, 5, 4]);
            let k = g.zeros(ty::F32, [2, 2, 2, 4]);
            let params: Vec<i32> = p.iter().copied().chain([ic]).collect();
            g.node(Op::IM2COL_3D, ty::F32, dst, &[k, b], &params)
        }
    };
    {
        let mut g = G::new();
        im2col_3d(good, 2, [16, 4, 4, 8])(&mut g);
        g.run(1).unwrap();
    }
    refused(
        Bad,
        "im2col_3d zero channels",
        im2col_3d(good, 0, [16, 4, 4, 8]),
    );
    refused(Bad, "im2col_3d row width", im2col_3d(good, 2, [8, 4, 4, 8]));
    refused(Bad, "im2col_3d depth", im2col_3d(good, 2, [16, 4, 4, 6]));
    refused(
        Bad,
        "im2col_3d zero stride",
        im2col_3d([1, 1, 0, 0, 0, 0, 1, 1, 1], 2, [16, 4, 4, 8]),
    );
    refused(
        Bad,
        "im2col_3d huge dilation",
        im2col_3d([1, 1, 1, 0, 0, 0, 1, 1, i32::MAX], 2, [16, 4, 4, 8]),
    );
    let conv_3d = |ic: i32, n: i32, oc: i32, dst: [usize; 4]| {
        move |g: &mut G| {
            let b = values(g, ty::F32, [5, 5, 5, 4]);
            let k = values(g, ty::F32, [2, 2, 2, 6]);
            let params: Vec<i32> = good.iter().copied().chain([ic, n, oc]).collect();
            g.node(Op::CONV_3D, ty::F32, dst, &[k, b], &params)
        }
    };
    {
        let mut g = G::new();
        conv_3d(2, 2, 3, [4, 4, 4, 6])(&mut g);
        g.run(1).unwrap();
    }
    refused(Bad, "conv_3d channel split", conv_3d(2, 2, 2, [4, 4, 4, 4]));
    refused(Bad, "conv_3d batch split", conv_3d(2, 1, 3, [4, 4, 4, 3]));
    refused(
        Bad,
        "conv_3d negative channels",
        conv_3d(-2, -2, -3, [4, 4, 4, 6]),
    );
    refused(Bad, "conv_3d output size", conv_3d(2, 2, 3, [4, 4, 3, 6]));
    refused(Refused, "conv_3d F16 image", |g| {
        let b = values(g, ty::F16, [5, 5, 5, 4]);
        let k = values(g, ty::F32, [2, 2, 2, 6]);
        let params: Vec<i32> = good.iter().copied().chain([2, 2, 3]).collect();
        g.node(Op::CONV_3D, ty::F32, [4, 4, 4, 6], &[k, b], &params)
    });
    let col2im = |dst: [usize; 4], p: [i32; 3], t: u32| {
        move |g: &mut G| {
            let a = values(g, ty::F32, [12, 7, 1, 1]);
            g.node(Op::COL2IM_1D, t, dst, &[a], &p)
        }
    };
    {
        let mut g = G::new();
        col2im([16, 3, 1, 1], [2, 3, 0], ty::F32)(&mut g);
        g.run(1).unwrap();
    }
    refused(
        Bad,
        "col2im_1d length",
        col2im([15, 3, 1, 1], [2, 3, 0], ty::F32),
    );
    refused(
        Bad,
        "col2im_1d channels not dividing",
        col2im([15, 5, 1, 1], [2, 5, 0], ty::F32),
    );
    refused(
        Bad,
        "col2im_1d zero stride",
        col2im([4, 3, 1, 1], [0, 3, 0], ty::F32),
    );
    refused(
        Bad,
        "col2im_1d negative crop",
        col2im([18, 3, 1, 1], [2, 3, -1], ty::F32),
    );
    refused(
        Bad,
        "col2im_1d crop past the signal",
        col2im([1, 3, 1, 1], [2, 3, 8], ty::F32),
    );
    refused(
        Refused,
        "col2im_1d type change",
        col2im([16, 3, 1, 1], [2, 3, 0], ty::F16),
    );
}

#[test]
fn convolutions_with_an_empty_kernel_give_zeros() {
    // ggml's sizes allow a kernel dimension of 0: every output is a sum of nothing
    for kernel_ne in [[0, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0, 1]] {
        let what = format!("conv_3d kernel {kernel_ne:?}");
        let mut g = G::new();
        let b = g.input(ty::F32, [2, 2, 2, 1], &[1.0; 8]);
        let k = g.zeros(ty::F32, kernel_ne);
        let out_ne = kernel_ne.map(|n| if n == 0 { 3 } else { 2 });
        let params = [1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1];
        let target = g.input(
            ty::F32,
            [out_ne[0], out_ne[1], out_ne[2], 1],
            &vec![7.0; out_ne[..3].iter().product()],
        );
        let out = g.node_into(Op::CONV_3D, target, &[k, b], &params);
        let bytes = run_both(&g, &what);
        assert!(g.read(&bytes, out).iter().all(|&v| v == 0.0), "{what}");
    }
    let mut g = G::new();
    let b = g.input(ty::F32, [4, 4, 2, 1], &[1.0; 32]);
    let k = g.zeros(ty::F32, [0, 3, 2, 2]);
    let target = g.input(ty::F32, [5, 2, 2, 1], &[7.0; 20]);
    let out = g.node_into(Op::CONV_2D, target, &[k, b], &[1, 1, 0, 0, 1, 1]);
    let bytes = run_both(&g, "conv_2d of an empty kernel");
    assert!(g.read(&bytes, out).iter().all(|&v| v == 0.0));
}
