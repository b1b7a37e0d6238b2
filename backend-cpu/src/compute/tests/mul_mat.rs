//! Tests of MUL_MAT and MUL_MAT_ID in every weight type.

use super::*;

// --- matrix products -----------------------------------------------------------------------

/// Weights as the kernel's dot products see them, and the activations after ggml's conversion
/// to the weights' vec_dot_type.
fn mm_operands(w_type: u32, w: &[f32], k: usize, x: &[f32]) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (block, size) = type_size(w_type);
    if block == 1 {
        return (
            encode_values(w_type, w),
            stored(w_type, w),
            stored(w_type, x),
        );
    }
    let mut bytes = vec![0u8; w.len() / block * size];
    let mut wq = vec![0.0f32; w.len()];
    for ((row, dst), deq) in w
        .chunks(k)
        .zip(bytes.chunks_mut(k / block * size))
        .zip(wq.chunks_mut(k))
    {
        quant::quantize_row(w_type, row, dst).unwrap();
        quant::dequantize_row(w_type, dst, deq).unwrap();
    }
    let vdt = quant::vec_dot_type(w_type).unwrap();
    let (vb, vs) = type_size(vdt);
    let mut xq = vec![0.0f32; x.len()];
    for (row, deq) in x.chunks(k).zip(xq.chunks_mut(k)) {
        let mut q = vec![0u8; k / vb * vs];
        quant::quantize_row(vdt, row, &mut q).unwrap();
        quant::dequantize_row(vdt, &q, deq).unwrap();
    }
    (bytes, wq, xq)
}

#[test]
fn mul_mat_in_every_weight_type_with_broadcast_and_transposed_activations() {
    let mut rng = Rng::new(14);
    for (round, w_type) in [
        ty::F32,
        ty::F16,
        ty::BF16,
        ty::Q8_0,
        ty::Q4_0,
        3,
        6,
        7,
        20, /* IQ4_NL */
        23, /* IQ4_XS */
        34, /* TQ1_0 */
        35, /* TQ2_0 */
        39, /* MXFP4 */
        40, /* NVFP4 */
        41, /* Q1_0 */
        42, /* Q2_0 */
        ty::F32,
        ty::F16,
    ]
    .into_iter()
    .enumerate()
    {
        let k = type_size(w_type).0.max(64) * (1 + rng.below(3));
        let (m, n) = (1 + rng.below(40), 1 + rng.below(9));
        let (w2, w3) = (1 + rng.below(2), 1 + rng.below(2));
        let (x2, x3) = (w2 * (1 + rng.below(2)), w3 * (1 + rng.below(2)));
        let w = rng.values(k * m * w2 * w3, 1.0);
        let x = rng.values(k * n * x2 * x3, 1.0);
        let (w_bytes, wv, xv) = mm_operands(w_type, &w, k, &x);
        let mut g = G::new();
        let wt = g.input_bytes(w_type, [k, m, w2, w3], &w_bytes);
        // every other round: the activations as a transposed view of an [n, k] tensor
        let xt = if round % 2 == 1 {
            let mut xr = vec![0.0f32; x.len()];
            for b in 0..x2 * x3 {
                for i in 0..n {
                    for j in 0..k {
                        xr[b * n * k + j * n + i] = x[b * n * k + i * k + j];
                    }
                }
            }
            let base = g.input(ty::F32, [n, k, x2, x3], &xr);
            g.transpose(base)
        } else {
            g.input(ty::F32, [k, n, x2, x3], &x)
        };
        let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, x2, x3], &[wt, xt], &[]);
        let out = g.run(1 + round % 4).unwrap();
        let want: Vec<f64> = all([m, n, x2, x3])
            .map(|[i0, i1, i2, i3]| {
                let (j2, j3) = (i2 / (x2 / w2), i3 / (x3 / w3));
                (0..k)
                    .map(|kk| {
                        f64::from(wv[at([k, m, w2, w3], [kk, i0, j2, j3])])
                            * f64::from(xv[at([k, n, x2, x3], [kk, i1, i2, i3])])
                    })
                    .sum()
            })
            .collect();
        // Q4_1/Q5_1 dot products use the Q8_1 block sums, which ggml stores as f16
        let tolerance = if w_type == 3 || w_type == 7 {
            1e-6
        } else {
            1e-10
        };
        assert_close(
            &g.read(&out, mm),
            &want,
            tolerance,
            &format!("mul_mat type {w_type} k {k} m {m} n {n}"),
        );
    }
}

/// Random rows of a grid format (IQ2_XXS .. IQ1_M: any bytes are valid blocks) with small
/// finite f16 super-block scales (IQ1_M's spread over the top nibbles of its scale words).
fn random_grid_rows(rng: &mut Rng, type_id: u32, n: usize) -> Vec<u8> {
    let (block, size) = type_size(type_id);
    let mut bytes: Vec<u8> = (0..n / block * size).map(|_| rng.next() as u8).collect();
    for b in bytes.chunks_exact_mut(size) {
        let h = f32_to_f16(0.002 + 0.001 * rng.f32());
        if type_id == quant::id("iq1_m") {
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0F) | ((((h >> (4 * k)) & 15) as u8) << 4);
            }
        } else {
            b[..2].copy_from_slice(&h.to_le_bytes());
        }
    }
    bytes
}

/// The grid formats (no quantizer, as in ggml-cpu): GET_ROWS and CPY to F32 give
/// `dequantize_row` exactly, MUL_MAT the dot products with Q8_K activations; CPY and SET_ROWS
/// into them are refused.
#[test]
fn grid_formats_get_rows_cpy_and_mul_mat() {
    let mut rng = Rng::new(41);
    for w_type in [
        "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
    ]
    .map(quant::id)
    {
        let k = 256 * (1 + rng.below(2));
        let (m, n) = (1 + rng.below(20), 1 + rng.below(5));
        let w_bytes = random_grid_rows(&mut rng, w_type, k * m);
        let mut wv = vec![0.0f32; k * m];
        quant::dequantize_row(w_type, &w_bytes, &mut wv).unwrap();
        let x = rng.values(k * n, 1.0);
        // the activations as the dot product sees them: rows through Q8_K
        let mut xv = vec![0.0f32; k * n];
        for (row, deq) in x.chunks(k).zip(xv.chunks_mut(k)) {
            let mut q = vec![0u8; quant::row_size(quant::id("q8_K"), k).unwrap()];
            quant::quantize_row(quant::id("q8_K"), row, &mut q).unwrap();
            quant::dequantize_row(quant::id("q8_K"), &q, deq).unwrap();
        }

        let mut g = G::new();
        let wt = g.input_bytes(w_type, [k, m, 1, 1], &w_bytes);
        let xt = g.input(ty::F32, [k, n, 1, 1], &x);
        let ids: Vec<i64> = (0..3).map(|_| rng.below(m) as i64).collect();
        let rows = g.ids(ty::I32, [3, 1, 1, 1], &ids);
        let got_rows = g.node(Op::GET_ROWS, ty::F32, [k, 3, 1, 1], &[wt, rows], &[]);
        let copy = g.node(Op::CPY, ty::F32, [k, m, 1, 1], &[wt], &[]);
        let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, 1, 1], &[wt, xt], &[]);
        let out = g.run(2).unwrap();
        let what = format!("type {w_type} k {k} m {m} n {n}");
        let want_rows: Vec<f64> = ids
            .iter()
            .flat_map(|&r| wide(&wv[r as usize * k..(r as usize + 1) * k]))
            .collect();
        assert_close(&g.read(&out, got_rows), &want_rows, 0.0, &what);
        assert_close(&g.read(&out, copy), &wide(&wv), 0.0, &what);
        let want: Vec<f64> = all([m, n, 1, 1])
            .map(|[i0, i1, _, _]| {
                (0..k)
                    .map(|kk| f64::from(wv[i0 * k + kk]) * f64::from(xv[i1 * k + kk]))
                    .sum()
            })
            .collect();
        assert_close(&g.read(&out, mm), &want, 1e-10, &what);

        // no quantizer: CPY and SET_ROWS into the format are refused
        let mut g = G::new();
        let a = g.input(ty::F32, [256, 1, 1, 1], &x[..256]);
        let dst = g.zeros(w_type, [256, 1, 1, 1]);
        g.node_into(Op::CPY, dst, &[a], &[]);
        assert_refused(&g, ErrorKind::OpRefused);
        let mut g = G::new();
        let a = g.input(ty::F32, [256, 1, 1, 1], &x[..256]);
        let idx = g.ids(I64, [1, 1, 1, 1], &[0]);
        let cache = g.zeros(w_type, [256, 2, 1, 1]);
        g.node_into(Op::SET_ROWS, cache, &[a, idx], &[]);
        assert_refused(&g, ErrorKind::OpRefused);
    }
}

#[test]
fn mul_mat_reads_f32_activation_rows_in_place_or_converts_misaligned_ones() {
    // F32 weights take the activation rows where they are when every row is aligned f32s;
    // padded rows (a row stride beyond k) stay in place, rows at an odd byte offset or with
    // an odd stride are converted first. Every case must give the same sums.
    let mut rng = Rng::new(63);
    let (k, m, n) = (64, 21, 7);
    let w = rng.values(k * m, 1.0);
    let x = rng.values((k + 1) * n + 1, 1.0);
    // (byte offset of the first row, row stride in bytes)
    for (offset, stride) in [(0, 4 * k), (0, 4 * (k + 1)), (2, 4 * k), (0, 4 * k + 2)] {
        let mut g = G::new();
        let wt = g.input(ty::F32, [k, m, 1, 1], &w);
        let mut bytes = vec![0u8; (offset + stride * (n - 1) + 4 * k).div_ceil(4) * 4];
        for i in 0..n {
            for j in 0..k {
                let at = offset + i * stride + 4 * j;
                bytes[at..at + 4].copy_from_slice(&x[i * (k + 1) + j].to_le_bytes());
            }
        }
        let base = g.input_bytes(ty::F32, [bytes.len() / 4, 1, 1, 1], &bytes);
        let xt = g.view(
            base,
            [k, n, 1, 1],
            [4, stride, stride * n, stride * n],
            offset,
        );
        let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, 1, 1], &[wt, xt], &[]);
        let out = g.run(2).unwrap();
        let want: Vec<f64> = all([m, n, 1, 1])
            .map(|[i0, i1, ..]| {
                (0..k)
                    .map(|j| f64::from(w[i0 * k + j]) * f64::from(x[i1 * (k + 1) + j]))
                    .sum()
            })
            .collect();
        assert_close(
            &g.read(&out, mm),
            &want,
            1e-10,
            &format!("activations at offset {offset}, stride {stride}"),
        );
    }
}

#[test]
fn mul_mat_with_strided_float_weights_widens_them() {
    let mut rng = Rng::new(21);
    for w_type in [ty::F32, ty::F16, ty::BF16] {
        let (k, m, n) = (40, 9, 5);
        // weights stored as [m, k] and used through a transposed view [k, m]
        let wt_values = rng.values(k * m, 1.0);
        let x = rng.values(k * n, 1.0);
        let mut g = G::new();
        let base = g.input(w_type, [m, k, 1, 1], &wt_values);
        let w = g.transpose(base);
        let xt = g.input(ty::F32, [k, n, 1, 1], &x);
        let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, 1, 1], &[w, xt], &[]);
        let out = g.run(2).unwrap();
        let (wv, xv) = (stored(w_type, &wt_values), stored(w_type, &x));
        let want: Vec<f64> = all([m, n, 1, 1])
            .map(|[i0, i1, ..]| {
                (0..k)
                    .map(|kk| f64::from(wv[i0 + m * kk]) * f64::from(xv[kk + k * i1]))
                    .sum()
            })
            .collect();
        assert_close(
            &g.read(&out, mm),
            &want,
            1e-10,
            &format!("strided weights of type {w_type}"),
        );
    }
}

#[test]
fn mul_mat_id_routes_tokens_to_experts() {
    let mut rng = Rng::new(15);
    for w_type in [ty::F32, ty::F16, ty::Q8_0] {
        let (k, m, n_exp, n_used, n_tok) = (64, 13, 4, 2, 5);
        for ne11 in [1, n_used] {
            let w = rng.values(k * m * n_exp, 1.0);
            let x = rng.values(k * ne11 * n_tok, 1.0);
            let (w_bytes, wv, xv) = mm_operands(w_type, &w, k, &x);
            let ids: Vec<i64> = (0..n_used * n_tok)
                .map(|_| rng.below(n_exp) as i64)
                .collect();
            let mut g = G::new();
            let wt = g.input_bytes(w_type, [k, m, n_exp, 1], &w_bytes);
            let xt = g.input(ty::F32, [k, ne11, n_tok, 1], &x);
            let it = g.ids(ty::I32, [n_used, n_tok, 1, 1], &ids);
            let mm = g.node(
                Op::MUL_MAT_ID,
                ty::F32,
                [m, n_used, n_tok, 1],
                &[wt, xt, it],
                &[],
            );
            let out = g.run(2).unwrap();
            let want: Vec<f64> = all([m, n_used, n_tok, 1])
                .map(|[i0, e, t, _]| {
                    let expert = ids[e + n_used * t] as usize;
                    (0..k)
                        .map(|kk| {
                            f64::from(wv[at([k, m, n_exp, 1], [kk, i0, expert, 0])])
                                * f64::from(xv[at([k, ne11, n_tok, 1], [kk, e % ne11, t, 0])])
                        })
                        .sum()
                })
                .collect();
            assert_close(
                &g.read(&out, mm),
                &want,
                1e-10,
                &format!("mul_mat_id type {w_type} ne11 {ne11}"),
            );
        }
    }
    // an expert id out of range fails the graph
    let mut g = G::new();
    let wt = g.input(ty::F32, [32, 4, 2, 1], &[0.5; 256]);
    let xt = g.input(ty::F32, [32, 1, 1, 1], &[1.0; 32]);
    let it = g.ids(ty::I32, [1, 1, 1, 1], &[2]);
    g.node(Op::MUL_MAT_ID, ty::F32, [4, 1, 1, 1], &[wt, xt, it], &[]);
    assert_eq!(g.run(1).unwrap_err().kind(), ErrorKind::OutOfBounds);
}

#[test]
fn mul_mat_float_weights_give_the_bits_of_vec_dot_per_output() {
    // F16 and F32 weights with many activation rows per weight matrix (F16 tiles widened to
    // f32 once for them, and not: `quant::widen_f16_tiles` picks per CPU), with few (one
    // group, then single rows), broadcast over dim 2, on one and several threads: every
    // output is `quant::vec_dot` of its weight row with its activation row in the
    // vec_dot_type, to the bit.
    let mut rng = Rng::new(77);
    for w_type in [ty::F16, ty::F32] {
        for (k, m, n) in [(256, 37, 20), (64, 256, 7), (96, 5, 3), (32, 70, 1)] {
            let (w2, x2) = (2, 4);
            let w = rng.values(k * m * w2, 1.0);
            let x = rng.values(k * n * x2, 1.0);
            let w_bytes = encode_values(w_type, &w);
            let mut g = G::new();
            let wt = g.input_bytes(w_type, [k, m, w2, 1], &w_bytes);
            let xt = g.input(ty::F32, [k, n, x2, 1], &x);
            let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, x2, 1], &[wt, xt], &[]);
            let vdt = quant::vec_dot_type(w_type).unwrap();
            let (_, size) = type_size(w_type);
            let xq: Vec<Vec<u8>> = x
                .chunks(k)
                .map(|row| {
                    let mut q = vec![0u8; k * size];
                    quant::quantize_row(vdt, row, &mut q).unwrap();
                    q
                })
                .collect();
            let want: Vec<u32> = all([m, n, x2, 1])
                .map(|[i0, i1, i2, _]| {
                    let wr = (i2 / 2) * m + i0;
                    let row = &w_bytes[wr * k * size..(wr + 1) * k * size];
                    quant::vec_dot(w_type, k, row, &xq[i2 * n + i1])
                        .unwrap()
                        .to_bits()
                })
                .collect();
            for widen in [false, true] {
                quant::force_widen_f16_tiles(Some(widen));
                for threads in [1, 3] {
                    let out = g.run(threads).unwrap();
                    let got: Vec<u32> = g.read(&out, mm).iter().map(|v| v.to_bits()).collect();
                    assert_eq!(
                        got, want,
                        "type {w_type} k {k} m {m} n {n} widen {widen} threads {threads}"
                    );
                }
            }
            quant::force_widen_f16_tiles(None);
        }
    }
}
