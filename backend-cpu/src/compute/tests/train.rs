//! Tests of the training ops — OUT_PROD, ROPE_BACK, SILU_BACK, RMS_NORM_BACK, SOFT_MAX_BACK,
//! GET_ROWS_BACK, REPEAT_BACK, ACC, SET, COUNT_EQUAL, DIAG, GROUP_NORM, CROSS_ENTROPY_LOSS,
//! CROSS_ENTROPY_LOSS_BACK, OPT_STEP_ADAMW, OPT_STEP_SGD: results against naive f64 references written here (several
//! shapes, broadcast, transposed and permuted sources, in-place forms), ROPE then ROPE_BACK
//! giving the input back, the same bytes from one and three threads, and refusals of
//! malformed nodes before anything is written.

use proto_core::ggml::types::id as ty;
use proto_core::ggml::Op;
use proto_core::graph::TensorIndex;
use proto_core::ErrorKind;

use super::attention::{rope_params, rope_reference};
use super::{assert_close, assert_refused, at, f, stored, wide, Rng, G};
use crate::compute::quant;

/// Runs `g` on one and on three threads, checks that the bytes agree, returns them.
fn run_both(g: &G, what: &str) -> Vec<u8> {
    let one = g.run(1).unwrap();
    let three = g.run(3).unwrap();
    assert!(one == three, "{what}: 1 and 3 threads differ");
    one
}

/// `values` as the elements a tensor of `type_id` stores (rounded to F16; quantized and
/// dequantized row by row of `width` for block types), with the stored bytes.
fn stored_as(type_id: u32, values: &[f32], width: usize) -> (Vec<u8>, Vec<f32>) {
    match type_id {
        ty::F32 => (
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            values.to_vec(),
        ),
        ty::F16 => {
            let bits: Vec<u16> = values
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let back = bits
                .iter()
                .map(|&b| half::f16::from_bits(b).to_f32())
                .collect();
            (bits.iter().flat_map(|b| b.to_le_bytes()).collect(), back)
        }
        quantized => {
            let info = proto_core::ggml::type_info(quantized).unwrap();
            let row_bytes = width / info.block_size as usize * info.type_size as usize;
            let mut bytes = vec![0u8; values.len() / width * row_bytes];
            let mut back = vec![0.0f32; values.len()];
            for ((row, q), deq) in values
                .chunks(width)
                .zip(bytes.chunks_mut(row_bytes))
                .zip(back.chunks_mut(width))
            {
                quant::quantize_row(quantized, row, q).unwrap();
                quant::dequantize_row(quantized, q, deq).unwrap();
            }
            (bytes, back)
        }
    }
}

/// The values of `t` after running `g` on one and three threads.
fn result(g: &G, t: TensorIndex, what: &str) -> Vec<f32> {
    let bytes = run_both(g, what);
    g.read(&bytes, t)
}

// --- OUT_PROD --------------------------------------------------------------------------------

/// `dst[i0, i1, i2, i3] = Σ_k a[i0, k, i2 / r2, i3 / r3] · b[i1, k, i2, i3]` in f64, `b` given
/// in its logical order.
fn out_prod_reference(a: &[f32], a_ne: [usize; 4], b: &[f32], b_ne: [usize; 4]) -> Vec<f64> {
    let dst_ne = [a_ne[0], b_ne[0], b_ne[2], b_ne[3]];
    let (r2, r3) = (b_ne[2] / a_ne[2], b_ne[3] / a_ne[3]);
    let mut out = vec![0.0f64; dst_ne.iter().product()];
    for i3 in 0..dst_ne[3] {
        for i2 in 0..dst_ne[2] {
            for i1 in 0..dst_ne[1] {
                for i0 in 0..dst_ne[0] {
                    out[at(dst_ne, [i0, i1, i2, i3])] = (0..a_ne[1])
                        .map(|k| {
                            f64::from(a[at(a_ne, [i0, k, i2 / r2, i3 / r3])])
                                * f64::from(b[at(b_ne, [i1, k, i2, i3])])
                        })
                        .sum();
                }
            }
        }
    }
    out
}

#[test]
fn out_prod_of_every_src0_type_with_broadcast_and_transposed_src1() {
    let mut rng = Rng::new(401);
    // (src0 type, m, n, k, src0 planes, broadcast ratios, transposed src1)
    for (type_id, m, n, k, planes, ratios, transposed) in [
        (ty::F32, 5, 3, 4, [1, 1], [1, 1], false),
        (ty::F32, 64, 7, 9, [2, 3], [2, 1], false),
        (ty::F32, 33, 16, 1, [1, 2], [3, 2], true),
        (ty::F32, 256, 1, 16, [3, 1], [1, 2], true),
        (ty::F16, 40, 6, 5, [2, 2], [1, 1], false),
        (ty::F16, 8, 16, 16, [1, 3], [1, 1], true),
        (ty::Q8_0, 64, 5, 3, [2, 1], [1, 1], false),
        (ty::Q4_0, 32, 4, 7, [1, 2], [1, 1], true),
        (ty::Q4_K, 256, 3, 2, [1, 1], [1, 1], false),
    ] {
        let what = format!("OUT_PROD type {type_id}, m {m}, n {n}, k {k}, {planes:?} x {ratios:?}");
        let a_ne = [m, k, planes[0], planes[1]];
        let b_ne = [n, k, planes[0] * ratios[0], planes[1] * ratios[1]];
        let (a_bytes, a_values) = stored_as(type_id, &rng.values(a_ne.iter().product(), 1.0), m);
        let b_values = rng.values(b_ne.iter().product(), 1.0);
        let mut g = G::new();
        let a = g.input_bytes(type_id, a_ne, &a_bytes);
        let b = if transposed {
            // stored as [k, n, ...] and transposed: column i1 of the view is a stored row
            let mut stored = vec![0.0f32; b_values.len()];
            for i3 in 0..b_ne[3] {
                for i2 in 0..b_ne[2] {
                    for kk in 0..k {
                        for i1 in 0..n {
                            stored[at([k, n, b_ne[2], b_ne[3]], [kk, i1, i2, i3])] =
                                b_values[at(b_ne, [i1, kk, i2, i3])];
                        }
                    }
                }
            }
            let base = g.input(ty::F32, [k, n, b_ne[2], b_ne[3]], &stored);
            g.permute(base, [1, 0, 2, 3])
        } else {
            g.input(ty::F32, b_ne, &b_values)
        };
        let dst_ne = [m, n, b_ne[2], b_ne[3]];
        let out = g.node(Op::OUT_PROD, ty::F32, dst_ne, &[a, b], &[]);
        let got = result(&g, out, &what);
        let want = out_prod_reference(&a_values, a_ne, &b_values, b_ne);
        assert_close(&got, &want, 1e-10, &what);
    }
}

// --- ROPE_BACK -------------------------------------------------------------------------------

#[test]
fn rope_back_rotates_by_the_opposite_angles_and_undoes_rope() {
    let mut rng = Rng::new(402);
    // (mode, type, shape, n_dims, n_offs)
    for (mode, type_id, ne, n_dims, n_offs) in [
        (0, ty::F32, [16, 3, 5, 2], 16, 0),
        (2, ty::F32, [40, 2, 4, 1], 16, 10),
        (0, ty::F16, [12, 4, 3, 1], 8, 2),
        (2, ty::F16, [64, 2, 6, 1], 64, 0),
    ] {
        let what = format!("ROPE_BACK mode {mode}, type {type_id}, {ne:?}");
        let x = rng.values(ne.iter().product(), 1.0);
        let x = stored(type_id, &x);
        let pos: Vec<i64> = (0..ne[2]).map(|_| rng.below(200) as i64).collect();
        let params = rope_params(n_dims, mode, n_offs as i32);
        let mut g = G::new();
        let a = g.input(type_id, ne, &x);
        let p = g.ids(ty::I32, [ne[2], 1, 1, 1], &pos);
        let back = g.node(Op::ROPE_BACK, type_id, ne, &[a, p], &params);
        let forward = g.node(Op::ROPE, type_id, ne, &[a, p], &params);
        let round_trip = g.node(Op::ROPE_BACK, type_id, ne, &[forward, p], &params);
        let bytes = run_both(&g, &what);
        // the inverse rotation is the rotation by -theta: ROPE at the negated positions
        let negated: Vec<i64> = pos.iter().map(|&p| -p).collect();
        let want = rope_reference(
            &x,
            ne,
            &negated,
            n_dims,
            mode,
            10000.0,
            1.0,
            0.0,
            1.0,
            4096.0,
            (32.0, 1.0),
            None,
            n_offs,
        );
        let tolerance = if type_id == ty::F16 { 1e-6 } else { 1e-10 };
        assert_close(&g.read(&bytes, back), &want, tolerance, &what);
        assert_close(
            &g.read(&bytes, round_trip),
            &wide(&x),
            tolerance,
            &format!("{what}: ROPE then ROPE_BACK"),
        );
    }
}

#[test]
fn rope_back_of_multi_section_modes_and_in_place_undoes_rope() {
    let mut rng = Rng::new(403);
    // (mode, shape, n_dims, sections)
    for (mode, ne, n_dims, sections) in [
        (8, [32, 2, 5, 1], 32, [6, 5, 5, 0]),
        (40, [24, 3, 4, 1], 24, [4, 4, 4, 0]),
        (24, [32, 2, 3, 1], 16, [2, 2, 2, 2]),
    ] {
        let what = format!("ROPE_BACK mode {mode}, {ne:?}");
        let x = rng.values(ne.iter().product(), 1.0);
        let pos: Vec<i64> = (0..4 * ne[2]).map(|_| rng.below(100) as i64).collect();
        let mut params = rope_params(n_dims, mode, 0);
        params[11..15].copy_from_slice(&sections);
        let mut g = G::new();
        let a = g.input(ty::F32, ne, &x);
        let p = g.ids(ty::I32, [4 * ne[2], 1, 1, 1], &pos);
        let forward = g.node(Op::ROPE, ty::F32, ne, &[a, p], &params);
        // ROPE_BACK in place over ROPE's result
        let back = g.node_into(Op::ROPE_BACK, forward, &[forward, p], &params);
        let got = result(&g, back, &what);
        assert_close(&got, &wide(&x), 1e-10, &what);
    }
}

// --- SILU_BACK, RMS_NORM_BACK, SOFT_MAX_BACK -------------------------------------------------

#[test]
fn silu_back_in_f32_and_f16_separately_and_in_place() {
    let mut rng = Rng::new(404);
    for (type_id, ne) in [
        (ty::F32, [7, 3, 2, 1]),
        (ty::F32, [64, 5, 1, 3]),
        (ty::F16, [10, 4, 3, 1]),
    ] {
        // 0: a fresh destination; 1: in place of dy; 2: in place of x
        for in_place in 0..3 {
            let what = format!("SILU_BACK type {type_id}, {ne:?}, in place {in_place}");
            let count = ne.iter().product();
            let dy = stored(type_id, &rng.values(count, 2.0));
            let x = stored(type_id, &rng.values(count, 4.0));
            let mut g = G::new();
            let dy_t = g.input(type_id, ne, &dy);
            let x_t = g.input(type_id, ne, &x);
            let out = match in_place {
                0 => g.node(Op::SILU_BACK, type_id, ne, &[dy_t, x_t], &[]),
                1 => g.node_into(Op::SILU_BACK, dy_t, &[dy_t, x_t], &[]),
                _ => g.node_into(Op::SILU_BACK, x_t, &[dy_t, x_t], &[]),
            };
            let got = result(&g, out, &what);
            let want: Vec<f64> = dy
                .iter()
                .zip(&x)
                .map(|(&dy, &x)| {
                    let (dy, x) = (f64::from(dy), f64::from(x));
                    let s = 1.0 / (1.0 + (-x).exp());
                    dy * s * (1.0 + x * (1.0 - s))
                })
                .collect();
            let tolerance = if type_id == ty::F16 { 1e-6 } else { 1e-12 };
            assert_close(&got, &want, tolerance, &what);
        }
    }
}

#[test]
fn rms_norm_back_is_the_gradient_of_rms_norm() {
    let mut rng = Rng::new(405);
    for (ne, eps, permuted) in [
        ([8, 3, 1, 1], 1e-6f32, false),
        ([65, 4, 3, 2], 1e-5, false),
        ([33, 5, 2, 1], 0.1, true),
    ] {
        let what = format!("RMS_NORM_BACK {ne:?}, eps {eps}, permuted {permuted}");
        let count: usize = ne.iter().product();
        let dz = rng.values(count, 1.0);
        let x = rng.values(count, 3.0);
        let mut g = G::new();
        let dz_t = g.input(ty::F32, ne, &dz);
        let x_t = if permuted {
            // x stored with dimensions 1 and 2 swapped, read through a permuted view
            let stored_ne = [ne[0], ne[2], ne[1], ne[3]];
            let mut stored = vec![0.0f32; count];
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        stored[at(stored_ne, [i0, i2, i1, 0])] = x[at(ne, [i0, i1, i2, 0])];
                    }
                }
            }
            let base = g.input(ty::F32, stored_ne, &stored);
            g.permute(base, [0, 2, 1, 3])
        } else {
            g.input(ty::F32, ne, &x)
        };
        let out = g.node(Op::RMS_NORM_BACK, ty::F32, ne, &[dz_t, x_t], &[f(eps)]);
        let got = result(&g, out, &what);
        let n = ne[0];
        let mut want = Vec::with_capacity(count);
        for (xr, dr) in x.chunks(n).zip(dz.chunks(n)) {
            // y = x / rms, rms = sqrt(Σx²/n + eps): dx = (dz - x Σ(x dz) / (n rms²)) / rms
            let sum_xx: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let sum_xdz: f64 = xr
                .iter()
                .zip(dr)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let rms2 = sum_xx / n as f64 + f64::from(eps);
            for (&xv, &dv) in xr.iter().zip(dr) {
                let (xv, dv) = (f64::from(xv), f64::from(dv));
                want.push((dv - xv * sum_xdz / (n as f64 * rms2)) / rms2.sqrt());
            }
        }
        assert_close(&got, &want, 1e-10, &what);
    }
}

#[test]
fn soft_max_back_with_scale_separately_and_in_place() {
    let mut rng = Rng::new(406);
    for (ne, scale) in [
        ([5, 3, 1, 1], 1.0f32),
        ([32, 4, 2, 3], 0.25),
        ([1, 7, 1, 1], 2.0),
    ] {
        for in_place in 0..3 {
            let what = format!("SOFT_MAX_BACK {ne:?}, scale {scale}, in place {in_place}");
            let count: usize = ne.iter().product();
            let dy = rng.values(count, 1.0);
            // y: rows of a softmax
            let mut y = rng.values(count, 3.0);
            for row in y.chunks_mut(ne[0]) {
                let sum: f32 = row.iter().map(|v| v.exp()).sum();
                row.iter_mut().for_each(|v| *v = v.exp() / sum);
            }
            let mut g = G::new();
            let dy_t = g.input(ty::F32, ne, &dy);
            let y_t = g.input(ty::F32, ne, &y);
            let out = match in_place {
                0 => g.node(Op::SOFT_MAX_BACK, ty::F32, ne, &[dy_t, y_t], &[f(scale), 0]),
                1 => g.node_into(Op::SOFT_MAX_BACK, dy_t, &[dy_t, y_t], &[f(scale), 0]),
                _ => g.node_into(Op::SOFT_MAX_BACK, y_t, &[dy_t, y_t], &[f(scale), 0]),
            };
            let got = result(&g, out, &what);
            let mut want = Vec::with_capacity(count);
            for (dr, yr) in dy.chunks(ne[0]).zip(y.chunks(ne[0])) {
                let dot: f64 = dr
                    .iter()
                    .zip(yr)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                for (&d, &yv) in dr.iter().zip(yr) {
                    want.push(f64::from(scale) * (f64::from(d) - dot) * f64::from(yv));
                }
            }
            assert_close(&got, &want, 1e-10, &what);
        }
    }
}

// --- GET_ROWS_BACK, REPEAT_BACK --------------------------------------------------------------

#[test]
fn get_rows_back_sums_the_gradient_rows_of_each_id() {
    let mut rng = Rng::new(407);
    // (type, width, destination rows, ids, gradient rows beyond the ids, strided ids)
    for (type_id, width, rows, count, spare, strided) in [
        (ty::F32, 1, 8, 2, 0, false),
        (ty::F32, 16, 5, 12, 0, false),
        (ty::F32, 7, 70, 30, 3, true),
        (ty::F16, 256, 5, 4, 2, false),
    ] {
        let what = format!("GET_ROWS_BACK type {type_id}, {width} x {rows}, {count} ids");
        let grad_ne = [width, count + spare, 1, 1];
        let grad = stored(type_id, &rng.values(grad_ne.iter().product(), 1.0));
        let ids: Vec<i64> = (0..count).map(|_| rng.below(rows) as i64).collect();
        let mut g = G::new();
        let grad_t = g.input(type_id, grad_ne, &grad);
        let ids_t = if strided {
            // every other element of a twice-as-long vector
            let spread: Vec<i64> = ids.iter().flat_map(|&i| [i, 9999]).collect();
            let base = g.ids(ty::I32, [2 * count, 1, 1, 1], &spread);
            g.view(
                base,
                [count, 1, 1, 1],
                [8, 8 * count, 8 * count, 8 * count],
                0,
            )
        } else {
            g.ids(ty::I32, [count, 1, 1, 1], &ids)
        };
        let out = g.node(
            Op::GET_ROWS_BACK,
            ty::F32,
            [width, rows, 1, 1],
            &[grad_t, ids_t],
            &[],
        );
        let got = result(&g, out, &what);
        let mut want = vec![0.0f64; width * rows];
        for (i, &id) in ids.iter().enumerate() {
            for c in 0..width {
                want[id as usize * width + c] += f64::from(grad[i * width + c]);
            }
        }
        assert_close(&got, &want, 1e-12, &what);
    }
}

#[test]
fn get_rows_back_with_an_out_of_range_id_writes_nothing() {
    for bad in [5i64, -1, i64::from(i32::MAX)] {
        let mut g = G::new();
        let grad = g.input(ty::F32, [4, 3, 1, 1], &[1.0; 12]);
        let ids = g.ids(ty::I32, [3, 1, 1, 1], &[0, bad, 2]);
        g.node(Op::GET_ROWS_BACK, ty::F32, [4, 5, 1, 1], &[grad, ids], &[]);
        assert_refused(&g, ErrorKind::OutOfBounds);
    }
}

#[test]
fn repeat_back_sums_every_repetition_including_permuted_sources() {
    let mut rng = Rng::new(408);
    // (destination shape, repetitions, permuted source)
    for (ne, reps, permuted) in [
        ([8, 6, 4, 2], [1, 1, 1, 1], false),
        ([4, 6, 4, 2], [2, 1, 1, 1], false),
        ([8, 3, 2, 2], [1, 2, 2, 1], false),
        ([2, 3, 1, 1], [3, 2, 4, 2], false),
        ([5, 2, 3, 1], [2, 3, 1, 2], true),
    ] {
        let what = format!("REPEAT_BACK {ne:?} x {reps:?}, permuted {permuted}");
        let src_ne = [0, 1, 2, 3].map(|d| ne[d] * reps[d]);
        let src: Vec<f32> = rng.values(src_ne.iter().product(), 1.0);
        let mut g = G::new();
        let a = if permuted {
            // stored with dimensions 1 and 3 swapped
            let stored_ne = [src_ne[0], src_ne[3], src_ne[2], src_ne[1]];
            let mut stored = vec![0.0f32; src.len()];
            for i3 in 0..src_ne[3] {
                for i2 in 0..src_ne[2] {
                    for i1 in 0..src_ne[1] {
                        for i0 in 0..src_ne[0] {
                            stored[at(stored_ne, [i0, i3, i2, i1])] =
                                src[at(src_ne, [i0, i1, i2, i3])];
                        }
                    }
                }
            }
            let base = g.input(ty::F32, stored_ne, &stored);
            g.permute(base, [0, 3, 2, 1])
        } else {
            g.input(ty::F32, src_ne, &src)
        };
        let out = g.node(Op::REPEAT_BACK, ty::F32, ne, &[a], &[]);
        let got = result(&g, out, &what);
        let mut want = vec![0.0f64; ne.iter().product()];
        for i3 in 0..src_ne[3] {
            for i2 in 0..src_ne[2] {
                for i1 in 0..src_ne[1] {
                    for i0 in 0..src_ne[0] {
                        let target = [i0 % ne[0], i1 % ne[1], i2 % ne[2], i3 % ne[3]];
                        want[at(ne, target)] += f64::from(src[at(src_ne, [i0, i1, i2, i3])]);
                    }
                }
            }
        }
        assert_close(&got, &want, 1e-12, &what);
    }
}

// --- ACC, SET --------------------------------------------------------------------------------

/// op_params of ACC / SET: byte strides of dimensions 1..3, byte offset, ggml's in-place flag.
fn window_params(strides: [usize; 3], offset: usize, in_place: bool) -> [i32; 5] {
    [
        strides[0] as i32,
        strides[1] as i32,
        strides[2] as i32,
        offset as i32,
        i32::from(in_place),
    ]
}

/// src0 with src1 placed (added or set) at element `offset + i0 + Σ i_d strides[d - 1]`.
fn window_reference(
    a: &[f32],
    b: &[f32],
    b_ne: [usize; 4],
    strides: [usize; 3],
    offset: usize,
    add: bool,
) -> Vec<f64> {
    let mut out = wide(a);
    for i3 in 0..b_ne[3] {
        for i2 in 0..b_ne[2] {
            for i1 in 0..b_ne[1] {
                for i0 in 0..b_ne[0] {
                    let e = offset + i0 + i1 * strides[0] + i2 * strides[1] + i3 * strides[2];
                    let v = f64::from(b[at(b_ne, [i0, i1, i2, i3])]);
                    // ACC adds in f32
                    out[e] = if add { f64::from(a[e] + v as f32) } else { v };
                }
            }
        }
    }
    out
}

/// Element type, src0 shape, src1 shape, window strides and offset in elements.
type WindowCase = (u32, [usize; 4], [usize; 4], [usize; 3], usize);

#[test]
fn acc_and_set_place_src1_in_a_window_separately_and_in_place() {
    let mut rng = Rng::new(409);
    let cases: [WindowCase; 5] = [
        (ty::F32, [16, 5, 1, 1], [16, 4, 1, 1], [16, 64, 64], 16),
        (ty::F32, [12, 5, 4, 3], [6, 5, 4, 3], [6, 30, 120], 3),
        (ty::F32, [10, 7, 3, 1], [3, 2, 2, 1], [10, 70, 210], 12),
        // rows of the window cross destination rows
        (ty::F32, [5, 8, 1, 1], [7, 3, 1, 1], [9, 27, 27], 4),
        (ty::I32, [12, 5, 4, 3], [6, 5, 4, 3], [6, 30, 120], 3),
    ];
    for (type_id, a_ne, b_ne, strides, offset) in cases {
        for add in [false, true] {
            if add && type_id != ty::F32 {
                continue;
            }
            for in_place in [false, true] {
                let op = if add { Op::ACC } else { Op::SET };
                let what =
                    format!("{op:?} type {type_id}, {a_ne:?} <- {b_ne:?}, in place {in_place}");
                let mut a_values = rng.values(a_ne.iter().product(), 4.0);
                let mut b_values = rng.values(b_ne.iter().product(), 4.0);
                if type_id == ty::I32 {
                    // large integers, which an f32 round trip would not keep
                    for v in a_values.iter_mut().chain(b_values.iter_mut()) {
                        *v = (*v * 1e3).round();
                    }
                }
                let size = 4;
                let params = window_params(strides.map(|s| s * size), offset * size, in_place);
                let mut g = G::new();
                let a = g.input(type_id, a_ne, &a_values);
                let b = g.input(type_id, b_ne, &b_values);
                let out = if in_place {
                    g.node_into(op, a, &[a, b], &params)
                } else {
                    g.node(op, type_id, a_ne, &[a, b], &params)
                };
                let got = result(&g, out, &what);
                let want = window_reference(&a_values, &b_values, b_ne, strides, offset, add);
                assert_close(&got, &want, 0.0, &what);
            }
        }
    }
}

#[test]
fn set_of_i32_keeps_every_bit() {
    let big = [16_777_217i64, -2_147_483_648, 2_147_483_647, 5];
    let mut g = G::new();
    let a = g.ids(ty::I32, [4, 1, 1, 1], &[0, 0, 0, 0]);
    let b = g.ids(ty::I32, [4, 1, 1, 1], &big);
    let out = g.node(
        Op::SET,
        ty::I32,
        [4, 1, 1, 1],
        &[a, b],
        &window_params([16, 16, 16], 0, false),
    );
    let bytes = run_both(&g, "SET I32");
    let want: Vec<u8> = big.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
    assert_eq!(g.raw(&bytes, out), want);
}

// --- COUNT_EQUAL, DIAG, GROUP_NORM -----------------------------------------------------------

#[test]
fn count_equal_counts_over_every_element_of_strided_sources() {
    let mut rng = Rng::new(410);
    for ne in [[4, 1, 1, 1], [500, 1, 1, 1], [7, 5, 3, 2]] {
        let count: usize = ne.iter().product();
        let a: Vec<i64> = (0..count).map(|_| rng.below(4) as i64).collect();
        let b: Vec<i64> = (0..count).map(|_| rng.below(4) as i64).collect();
        let want = a.iter().zip(&b).filter(|(x, y)| x == y).count() as i64;
        let mut g = G::new();
        let a_t = g.ids(ty::I32, ne, &a);
        // b stored transposed in dimensions 0 and 1, read through a permuted view
        let mut stored = vec![0i64; count];
        let stored_ne = [ne[1], ne[0], ne[2], ne[3]];
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        stored[at(stored_ne, [i1, i0, i2, i3])] = b[at(ne, [i0, i1, i2, i3])];
                    }
                }
            }
        }
        let base = g.ids(ty::I32, stored_ne, &stored);
        let b_t = g.permute(base, [1, 0, 2, 3]);
        let out = g.node(
            Op::COUNT_EQUAL,
            crate::compute::view::I64,
            [1, 1, 1, 1],
            &[a_t, b_t],
            &[],
        );
        let bytes = run_both(&g, "COUNT_EQUAL");
        assert_eq!(g.raw(&bytes, out), want.to_le_bytes(), "COUNT_EQUAL {ne:?}");
    }
}

#[test]
fn diag_puts_each_vector_on_a_diagonal() {
    let mut rng = Rng::new(411);
    for ne in [[1, 1, 1, 1], [10, 1, 4, 3], [79, 1, 19, 2]] {
        let x = rng.values(ne.iter().product(), 1.0);
        let mut g = G::new();
        let a = g.input(ty::F32, ne, &x);
        let dst_ne = [ne[0], ne[0], ne[2], ne[3]];
        let out = g.node(Op::DIAG, ty::F32, dst_ne, &[a], &[]);
        let got = result(&g, out, "DIAG");
        let mut want = vec![0.0f64; dst_ne.iter().product()];
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i in 0..ne[0] {
                    want[at(dst_ne, [i, i, i2, i3])] = f64::from(x[at(ne, [i, 0, i2, i3])]);
                }
            }
        }
        assert_close(&got, &want, 0.0, &format!("DIAG {ne:?}"));
    }
}

#[test]
fn group_norm_normalizes_groups_of_channels_separately_and_in_place() {
    let mut rng = Rng::new(412);
    // (shape, groups): uneven groups, more groups than channels, batches
    for (ne, groups) in [
        ([4, 3, 8, 1], 2usize),
        ([5, 2, 7, 2], 3),
        ([3, 3, 2, 1], 5),
        ([9, 9, 12, 1], 4),
    ] {
        for in_place in [false, true] {
            let what = format!("GROUP_NORM {ne:?}, {groups} groups, in place {in_place}");
            let x = rng.values(ne.iter().product(), 3.0);
            let eps = 1e-6f32;
            let params = [groups as i32, f(eps)];
            let mut g = G::new();
            let a = g.input(ty::F32, ne, &x);
            let out = if in_place {
                g.node_into(Op::GROUP_NORM, a, &[a], &params)
            } else {
                g.node(Op::GROUP_NORM, ty::F32, ne, &[a], &params)
            };
            let got = result(&g, out, &what);
            let per = ne[2].div_ceil(groups);
            let mut want = vec![0.0f64; x.len()];
            for i3 in 0..ne[3] {
                for start in (0..ne[2]).step_by(per) {
                    let channels = start..(start + per).min(ne[2]);
                    let members: Vec<usize> = channels
                        .flat_map(|i2| {
                            (0..ne[1]).flat_map(move |i1| {
                                (0..ne[0]).map(move |i0| at(ne, [i0, i1, i2, i3]))
                            })
                        })
                        .collect();
                    let n = members.len() as f64;
                    let mean = members.iter().map(|&e| f64::from(x[e])).sum::<f64>() / n;
                    let var = members
                        .iter()
                        .map(|&e| (f64::from(x[e]) - mean).powi(2))
                        .sum::<f64>()
                        / n;
                    for &e in &members {
                        want[e] = (f64::from(x[e]) - mean) / (var + f64::from(eps)).sqrt();
                    }
                }
            }
            assert_close(&got, &want, 1e-10, &what);
        }
    }
}

// --- CROSS_ENTROPY_LOSS, CROSS_ENTROPY_LOSS_BACK, OPT_STEP_ADAMW, OPT_STEP_SGD --------------

/// Rows of softmax probabilities (labels that add up to 1).
fn softmax_rows(values: &mut [f32], width: usize) {
    for row in values.chunks_mut(width) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
        row.iter_mut().for_each(|v| *v = (*v - max).exp() / sum);
    }
}

/// f64 softmax of one row.
fn softmax64(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let exps: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

#[test]
fn cross_entropy_loss_and_its_gradient() {
    let mut rng = Rng::new(413);
    for (ne, spread) in [
        ([10, 5, 4, 3], 100.0f32),
        ([3000, 1, 1, 1], 10.0),
        ([7, 2, 1, 1], 1.0),
    ] {
        let what = format!("CROSS_ENTROPY_LOSS {ne:?}");
        let count: usize = ne.iter().product();
        let width = ne[0];
        let rows = count / width;
        let logits = rng.values(count, spread);
        let mut labels = rng.values(count, 3.0);
        softmax_rows(&mut labels, width);
        let grad = 0.75f32;
        let mut g = G::new();
        let logits_t = g.input(ty::F32, ne, &logits);
        let labels_t = g.input(ty::F32, ne, &labels);
        let grad_t = g.input(ty::F32, [1, 1, 1, 1], &[grad]);
        let loss = g.node(
            Op::CROSS_ENTROPY_LOSS,
            ty::F32,
            [1, 1, 1, 1],
            &[logits_t, labels_t],
            &[],
        );
        let back = g.node(
            Op::CROSS_ENTROPY_LOSS_BACK,
            ty::F32,
            ne,
            &[grad_t, logits_t, labels_t],
            &[],
        );
        let bytes = run_both(&g, &what);
        let mut want_loss = 0.0f64;
        let mut want_back = Vec::with_capacity(count);
        for (x, y) in logits.chunks(width).zip(labels.chunks(width)) {
            let p = softmax64(x);
            for (pi, &yi) in p.iter().zip(y) {
                want_loss -= f64::from(yi) * pi.ln();
                want_back.push((pi - f64::from(yi)) * f64::from(grad) / rows as f64);
            }
        }
        want_loss /= rows as f64;
        assert_close(&g.read(&bytes, loss), &[want_loss], 1e-10, &what);
        assert_close(
            &g.read(&bytes, back),
            &want_back,
            1e-10,
            &format!("{what} back"),
        );
    }
}

#[test]
fn opt_step_adamw_updates_moments_and_weights_in_place() {
    let mut rng = Rng::new(414);
    for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [33, 7, 1, 1]] {
        let count: usize = ne.iter().product();
        let positive = |rng: &mut Rng, n: usize| -> Vec<f32> {
            rng.values(n, 1.0).iter().map(|v| v.abs()).collect()
        };
        let (w, grad, m, v) = (
            rng.values(count, 1.0),
            rng.values(count, 1.0),
            rng.values(count, 1.0),
            positive(&mut rng, count),
        );
        // alpha, beta1, beta2, eps, wd, beta1h, beta2h
        let params = [
            1e-3f32,
            0.9,
            0.999,
            1e-8,
            0.1,
            1.0 / (1.0 - 0.9),
            1.0 / (1.0 - 0.999),
        ];
        let mut g = G::new();
        let w_t = g.input(ty::F32, ne, &w);
        let g_t = g.input(ty::F32, ne, &grad);
        let m_t = g.input(ty::F32, ne, &m);
        let v_t = g.input(ty::F32, ne, &v);
        let p_t = g.input(ty::F32, [7, 1, 1, 1], &params);
        let out = g.node_into(Op::OPT_STEP_ADAMW, w_t, &[w_t, g_t, m_t, v_t, p_t], &[]);
        let bytes = run_both(&g, &format!("OPT_STEP_ADAMW {ne:?}"));
        let [alpha, beta1, beta2, eps, wd, beta1h, beta2h] = params.map(f64::from);
        let (mut want_w, mut want_m, mut want_v) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..count {
            let gi = f64::from(grad[i]);
            let mi = f64::from(m[i]) * beta1 + gi * (1.0 - beta1);
            let vi = f64::from(v[i]) * beta2 + gi * gi * (1.0 - beta2);
            let step = alpha * (mi * beta1h) / ((vi * beta2h).sqrt() + eps);
            want_w.push(f64::from(w[i]) * (1.0 - alpha * wd) - step);
            want_m.push(mi);
            want_v.push(vi);
        }
        assert_close(&g.read(&bytes, out), &want_w, 1e-12, "ADAMW weights");
        assert_close(&g.read(&bytes, m_t), &want_m, 1e-12, "ADAMW m");
        assert_close(&g.read(&bytes, v_t), &want_v, 1e-12, "ADAMW v");
        assert_eq!(g.read(&bytes, g_t), grad, "the gradient is not written");
    }
}

#[test]
fn opt_step_sgd_updates_the_weights_in_place() {
    let mut rng = Rng::new(415);
    for ne in [[10, 5, 4, 3], [64, 3, 1, 1]] {
        let count: usize = ne.iter().product();
        let (w, grad) = (rng.values(count, 1.0), rng.values(count, 1.0));
        let params = [0.05f32, 0.01];
        let mut g = G::new();
        let w_t = g.input(ty::F32, ne, &w);
        let g_t = g.input(ty::F32, ne, &grad);
        let p_t = g.input(ty::F32, [2, 1, 1, 1], &params);
        let out = g.node_into(Op::OPT_STEP_SGD, w_t, &[w_t, g_t, p_t], &[]);
        let got = result(&g, out, "OPT_STEP_SGD");
        let (alpha, wd) = (f64::from(params[0]), f64::from(params[1]));
        let want: Vec<f64> = w
            .iter()
            .zip(&grad)
            .map(|(&w, &g)| f64::from(w) * (1.0 - alpha * wd) - alpha * f64::from(g))
            .collect();
        assert_close(&got, &want, 1e-12, &format!("OPT_STEP_SGD {ne:?}"));
    }
}

// --- refusals --------------------------------------------------------------------------------

#[test]
fn malformed_training_nodes_are_refused_before_anything_is_written() {
    type Build = Box<dyn Fn(&mut G)>;
    let cases: Vec<(&str, ErrorKind, Build)> = vec![
        (
            "OUT_PROD with different k",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [4, 3, 1, 1]);
                let b = g.zeros(ty::F32, [5, 2, 1, 1]);
                g.node(Op::OUT_PROD, ty::F32, [4, 5, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "OUT_PROD into the wrong shape",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [4, 3, 2, 1]);
                let b = g.zeros(ty::F32, [5, 3, 3, 1]);
                g.node(Op::OUT_PROD, ty::F32, [4, 5, 3, 1], &[a, b], &[]);
            }),
        ),
        (
            "OUT_PROD of a quantized src0 broadcast",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::Q8_0, [32, 3, 1, 1]);
                let b = g.zeros(ty::F32, [5, 3, 2, 1]);
                g.node(Op::OUT_PROD, ty::F32, [32, 5, 2, 1], &[a, b], &[]);
            }),
        ),
        (
            "OUT_PROD with an F16 src1",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [4, 3, 1, 1]);
                let b = g.zeros(ty::F16, [5, 3, 1, 1]);
                g.node(Op::OUT_PROD, ty::F32, [4, 5, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "OUT_PROD with a transposed src0",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let base = g.zeros(ty::F32, [3, 4, 1, 1]);
                let a = g.permute(base, [1, 0, 2, 3]);
                let b = g.zeros(ty::F32, [5, 3, 1, 1]);
                g.node(Op::OUT_PROD, ty::F32, [4, 5, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "ROPE_BACK with odd n_dims",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [8, 2, 3, 1]);
                let p = g.ids(ty::I32, [3, 1, 1, 1], &[0, 1, 2]);
                g.node(
                    Op::ROPE_BACK,
                    ty::F32,
                    [8, 2, 3, 1],
                    &[a, p],
                    &rope_params(5, 0, 0),
                );
            }),
        ),
        (
            "ROPE_BACK with too few positions",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [8, 2, 3, 1]);
                let p = g.ids(ty::I32, [2, 1, 1, 1], &[0, 1]);
                g.node(
                    Op::ROPE_BACK,
                    ty::F32,
                    [8, 2, 3, 1],
                    &[a, p],
                    &rope_params(8, 0, 0),
                );
            }),
        ),
        (
            "SILU_BACK of different shapes",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let dy = g.zeros(ty::F32, [4, 3, 1, 1]);
                let x = g.zeros(ty::F32, [4, 2, 1, 1]);
                g.node(Op::SILU_BACK, ty::F32, [4, 3, 1, 1], &[dy, x], &[]);
            }),
        ),
        (
            "SILU_BACK of mixed types",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let dy = g.zeros(ty::F32, [4, 3, 1, 1]);
                let x = g.zeros(ty::F16, [4, 3, 1, 1]);
                g.node(Op::SILU_BACK, ty::F32, [4, 3, 1, 1], &[dy, x], &[]);
            }),
        ),
        (
            "RMS_NORM_BACK in F16",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let dz = g.zeros(ty::F16, [4, 3, 1, 1]);
                let x = g.zeros(ty::F16, [4, 3, 1, 1]);
                g.node(Op::RMS_NORM_BACK, ty::F16, [4, 3, 1, 1], &[dz, x], &[0]);
            }),
        ),
        (
            "RMS_NORM_BACK with a missing source",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let dz = g.zeros(ty::F32, [4, 3, 1, 1]);
                g.node(Op::RMS_NORM_BACK, ty::F32, [4, 3, 1, 1], &[dz], &[0]);
            }),
        ),
        (
            "SOFT_MAX_BACK with ALiBi",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let dy = g.zeros(ty::F32, [4, 3, 1, 1]);
                let y = g.zeros(ty::F32, [4, 3, 1, 1]);
                g.node(
                    Op::SOFT_MAX_BACK,
                    ty::F32,
                    [4, 3, 1, 1],
                    &[dy, y],
                    &[f(1.0), f(8.0)],
                );
            }),
        ),
        (
            "SOFT_MAX_BACK of a transposed y",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let dy = g.zeros(ty::F32, [4, 4, 1, 1]);
                let base = g.zeros(ty::F32, [4, 4, 1, 1]);
                let y = g.permute(base, [1, 0, 2, 3]);
                g.node(
                    Op::SOFT_MAX_BACK,
                    ty::F32,
                    [4, 4, 1, 1],
                    &[dy, y],
                    &[f(1.0), 0],
                );
            }),
        ),
        (
            "GET_ROWS_BACK with more ids than gradient rows",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let grad = g.zeros(ty::F32, [4, 2, 1, 1]);
                let ids = g.ids(ty::I32, [3, 1, 1, 1], &[0, 1, 2]);
                g.node(Op::GET_ROWS_BACK, ty::F32, [4, 5, 1, 1], &[grad, ids], &[]);
            }),
        ),
        (
            "GET_ROWS_BACK with a matrix of ids",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let grad = g.zeros(ty::F32, [4, 6, 1, 1]);
                let ids = g.ids(ty::I32, [3, 2, 1, 1], &[0; 6]);
                g.node(Op::GET_ROWS_BACK, ty::F32, [4, 5, 1, 1], &[grad, ids], &[]);
            }),
        ),
        (
            "GET_ROWS_BACK into a different width",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let grad = g.zeros(ty::F32, [4, 3, 1, 1]);
                let ids = g.ids(ty::I32, [3, 1, 1, 1], &[0, 1, 2]);
                g.node(Op::GET_ROWS_BACK, ty::F32, [5, 5, 1, 1], &[grad, ids], &[]);
            }),
        ),
        (
            "GET_ROWS_BACK of BF16 rows",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let grad = g.zeros(ty::BF16, [4, 3, 1, 1]);
                let ids = g.ids(ty::I32, [3, 1, 1, 1], &[0, 1, 2]);
                g.node(Op::GET_ROWS_BACK, ty::F32, [4, 5, 1, 1], &[grad, ids], &[]);
            }),
        ),
        (
            "REPEAT_BACK into a shape that does not divide the source",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [6, 4, 1, 1]);
                g.node(Op::REPEAT_BACK, ty::F32, [4, 4, 1, 1], &[a], &[]);
            }),
        ),
        (
            "REPEAT_BACK of a transposed source",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let base = g.zeros(ty::F32, [4, 6, 1, 1]);
                let a = g.permute(base, [1, 0, 2, 3]);
                g.node(Op::REPEAT_BACK, ty::F32, [3, 2, 1, 1], &[a], &[]);
            }),
        ),
        (
            "ACC with a window beyond the destination",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [8, 4, 1, 1]);
                let b = g.zeros(ty::F32, [8, 2, 1, 1]);
                g.node(
                    Op::ACC,
                    ty::F32,
                    [8, 4, 1, 1],
                    &[a, b],
                    &window_params([32, 64, 64], 96, false),
                );
            }),
        ),
        (
            "ACC with a negative offset",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [8, 4, 1, 1]);
                let b = g.zeros(ty::F32, [8, 2, 1, 1]);
                g.node(
                    Op::ACC,
                    ty::F32,
                    [8, 4, 1, 1],
                    &[a, b],
                    &[32, 64, 64, -4, 0],
                );
            }),
        ),
        (
            "SET with a stride that is not a whole element",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [8, 4, 1, 1]);
                let b = g.zeros(ty::F32, [4, 2, 1, 1]);
                g.node(Op::SET, ty::F32, [8, 4, 1, 1], &[a, b], &[34, 64, 64, 0, 0]);
            }),
        ),
        (
            "SET with window rows overlapping each other",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [8, 4, 1, 1]);
                let b = g.zeros(ty::F32, [4, 3, 1, 1]);
                g.node(
                    Op::SET,
                    ty::F32,
                    [8, 4, 1, 1],
                    &[a, b],
                    &window_params([8, 64, 64], 0, false),
                );
            }),
        ),
        (
            "SET of F16",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F16, [8, 4, 1, 1]);
                let b = g.zeros(ty::F16, [4, 2, 1, 1]);
                g.node(
                    Op::SET,
                    ty::F16,
                    [8, 4, 1, 1],
                    &[a, b],
                    &window_params([16, 16, 16], 0, false),
                );
            }),
        ),
        (
            "ACC of a transposed src0",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let base = g.zeros(ty::F32, [4, 8, 1, 1]);
                let a = g.permute(base, [1, 0, 2, 3]);
                let b = g.zeros(ty::F32, [4, 2, 1, 1]);
                g.node(
                    Op::ACC,
                    ty::F32,
                    [8, 4, 1, 1],
                    &[a, b],
                    &window_params([32, 64, 64], 0, false),
                );
            }),
        ),
        (
            "COUNT_EQUAL of different shapes",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.ids(ty::I32, [4, 1, 1, 1], &[0; 4]);
                let b = g.ids(ty::I32, [5, 1, 1, 1], &[0; 5]);
                g.node(
                    Op::COUNT_EQUAL,
                    crate::compute::view::I64,
                    [1, 1, 1, 1],
                    &[a, b],
                    &[],
                );
            }),
        ),
        (
            "COUNT_EQUAL into I32",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let a = g.ids(ty::I32, [4, 1, 1, 1], &[0; 4]);
                let b = g.ids(ty::I32, [4, 1, 1, 1], &[0; 4]);
                g.node(Op::COUNT_EQUAL, ty::I32, [1, 1, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "DIAG of a matrix",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [4, 2, 1, 1]);
                g.node(Op::DIAG, ty::F32, [4, 4, 1, 1], &[a], &[]);
            }),
        ),
        (
            "GROUP_NORM with no groups",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [4, 2, 6, 1]);
                g.node(Op::GROUP_NORM, ty::F32, [4, 2, 6, 1], &[a], &[0, f(1e-6)]);
            }),
        ),
        (
            "GROUP_NORM of F16",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F16, [4, 2, 6, 1]);
                g.node(Op::GROUP_NORM, ty::F16, [4, 2, 6, 1], &[a], &[2, f(1e-6)]);
            }),
        ),
        (
            "CROSS_ENTROPY_LOSS of different shapes",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let a = g.zeros(ty::F32, [4, 3, 1, 1]);
                let b = g.zeros(ty::F32, [4, 2, 1, 1]);
                g.node(Op::CROSS_ENTROPY_LOSS, ty::F32, [1, 1, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "CROSS_ENTROPY_LOSS_BACK with a vector gradient",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let grad = g.zeros(ty::F32, [2, 1, 1, 1]);
                let a = g.zeros(ty::F32, [4, 3, 1, 1]);
                let b = g.zeros(ty::F32, [4, 3, 1, 1]);
                g.node(
                    Op::CROSS_ENTROPY_LOSS_BACK,
                    ty::F32,
                    [4, 3, 1, 1],
                    &[grad, a, b],
                    &[],
                );
            }),
        ),
        (
            "OPT_STEP_SGD into a tensor other than the weights",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let w = g.zeros(ty::F32, [4, 3, 1, 1]);
                let grad = g.zeros(ty::F32, [4, 3, 1, 1]);
                let p = g.zeros(ty::F32, [2, 1, 1, 1]);
                g.node(Op::OPT_STEP_SGD, ty::F32, [4, 3, 1, 1], &[w, grad, p], &[]);
            }),
        ),
        (
            "OPT_STEP_SGD with three parameters",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let w = g.zeros(ty::F32, [4, 3, 1, 1]);
                let grad = g.zeros(ty::F32, [4, 3, 1, 1]);
                let p = g.zeros(ty::F32, [3, 1, 1, 1]);
                g.node_into(Op::OPT_STEP_SGD, w, &[w, grad, p], &[]);
            }),
        ),
        (
            "OPT_STEP_ADAMW with m being the gradient",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let w = g.zeros(ty::F32, [4, 3, 1, 1]);
                let grad = g.zeros(ty::F32, [4, 3, 1, 1]);
                let v = g.zeros(ty::F32, [4, 3, 1, 1]);
                let p = g.zeros(ty::F32, [7, 1, 1, 1]);
                g.node_into(Op::OPT_STEP_ADAMW, w, &[w, grad, grad, v, p], &[]);
            }),
        ),
        (
            "OPT_STEP_ADAMW with a moment of another shape",
            ErrorKind::InvalidGraph,
            Box::new(|g: &mut G| {
                let w = g.zeros(ty::F32, [4, 3, 1, 1]);
                let grad = g.zeros(ty::F32, [4, 3, 1, 1]);
                let m = g.zeros(ty::F32, [3, 4, 1, 1]);
                let v = g.zeros(ty::F32, [4, 3, 1, 1]);
                let p = g.zeros(ty::F32, [7, 1, 1, 1]);
                g.node_into(Op::OPT_STEP_ADAMW, w, &[w, grad, m, v, p], &[]);
            }),
        ),
        (
            "OPT_STEP_ADAMW of F16 weights",
            ErrorKind::OpRefused,
            Box::new(|g: &mut G| {
                let w = g.zeros(ty::F16, [4, 3, 1, 1]);
                let grad = g.zeros(ty::F16, [4, 3, 1, 1]);
                let m = g.zeros(ty::F16, [4, 3, 1, 1]);
                let v = g.zeros(ty::F16, [4, 3, 1, 1]);
                let p = g.zeros(ty::F32, [7, 1, 1, 1]);
                g.node_into(Op::OPT_STEP_ADAMW, w, &[w, grad, m, v, p], &[]);
            }),
        ),
    ];
    for (what, kind, build) in cases {
        let mut g = G::new();
        build(&mut g);
        // the image is written back first: a refusal leaves it as it was
        let error = g.run(2).unwrap_err();
        assert_eq!(error.kind(), kind, "{what}: {error}");
        assert_refused(&g, kind);
    }
}
