//! F8_E4M3 (8.0.1) through the graph: the ops where ggml-cpu (b12032+1) computes with it —
//! DUP / CPY to and from F32 / F16 / BF16, GET_ROWS, SET_ROWS, MUL_MAT (F32 activations) —
//! and the refusals where it does not.

use super::*;

/// Values covering F8's range, its saturation, subnormals, zeros of both signs and NaN.
fn f8_values(rng: &mut Rng, n: usize) -> Vec<f32> {
    let specials = [
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        448.0,
        464.0,
        -1000.0,
        0.001,
        -0.0009765625,
        1.0625,
        1.1875,
    ];
    (0..n)
        .map(|i| match specials.get(i) {
            Some(&v) => v,
            None => rng.f32() * 4.0f32.powi(rng.below(6) as i32 - 2),
        })
        .collect()
}

fn f8_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().map(|&v| quant::f32_to_f8_e4m3(v)).collect()
}

fn decoded(bytes: &[u8]) -> Vec<f64> {
    bytes
        .iter()
        .map(|&b| f64::from(quant::f8_e4m3_to_f32(b)))
        .collect()
}

#[test]
fn fp8_cpy_from_and_to_floats() {
    let mut rng = Rng::new(0xF8);
    let ne = [12, 5, 2, 1];
    let n = 120;
    let values = f8_values(&mut rng, n);
    let mut g = G::new();
    let a = g.input(ty::F32, ne, &values);
    let h = g.input(ty::F16, ne, &values);
    let b = g.input(ty::BF16, ne, &values);
    let q = g.node(Op::CPY, ty::F8_E4M3, ne, &[a], &[]);
    let qh = g.node(Op::CPY, ty::F8_E4M3, ne, &[h], &[]);
    let qb = g.node(Op::DUP, ty::F8_E4M3, ne, &[b], &[]);
    let back = [ty::F32, ty::F16, ty::BF16].map(|t| g.node(Op::CPY, t, ne, &[q], &[]));
    let same = g.node(Op::CONT, ty::F8_E4M3, ne, &[q], &[]);
    let out = g.run(3).unwrap();
    let want = f8_bytes(&values);
    assert_eq!(g.raw(&out, q), want, "F32 -> F8");
    assert_eq!(
        g.raw(&out, qh),
        f8_bytes(&stored(ty::F16, &values)),
        "F16 -> F8"
    );
    assert_eq!(
        g.raw(&out, qb),
        f8_bytes(&stored(ty::BF16, &values)),
        "BF16 -> F8"
    );
    assert_eq!(g.raw(&out, same), want, "F8 -> F8");
    // every F8 value is exact in F16 and BF16
    for (t, back) in back.into_iter().enumerate() {
        assert_close(
            &g.read(&out, back),
            &decoded(&want),
            0.0,
            &format!("F8 -> {t}"),
        );
    }
}

#[test]
fn fp8_cpy_through_strided_views() {
    let mut rng = Rng::new(0xF9);
    let ne = [6, 4, 3, 1];
    let values = f8_values(&mut rng, 72);
    let bytes = f8_bytes(&values);
    let mut g = G::new();
    let q = g.input_bytes(ty::F8_E4M3, ne, &bytes);
    // transposed F8 source (nb[0] = 6 bytes) into F32
    let t = g.transpose(q);
    let f = g.node(Op::CONT, ty::F32, [4, 6, 3, 1], &[t], &[]);
    // F32 into a transposed F8 destination
    let src = g.input(ty::F32, [4, 6, 3, 1], &values);
    let dst = g.zeros(ty::F8_E4M3, ne);
    let dst_t = g.transpose(dst);
    let c = g.node_into(Op::CPY, dst_t, &[src], &[]);
    let out = g.run(2).unwrap();
    let mut want_t = Vec::new();
    let mut want_c = vec![0u8; 72];
    for i2 in 0..3 {
        for i1 in 0..6 {
            for i0 in 0..4 {
                want_t.push(f64::from(quant::f8_e4m3_to_f32(
                    bytes[at(ne, [i1, i0, i2, 0])],
                )));
                let v = values[at([4, 6, 3, 1], [i0, i1, i2, 0])];
                want_c[at(ne, [i1, i0, i2, 0])] = quant::f32_to_f8_e4m3(v);
            }
        }
    }
    assert_close(&g.read(&out, f), &want_t, 0.0, "transposed F8 -> F32");
    let _ = c;
    assert_eq!(g.raw(&out, dst), want_c, "F32 -> transposed F8");
}

#[test]
fn fp8_get_rows_and_set_rows() {
    let mut rng = Rng::new(0xFA);
    let k = 10;
    let values = f8_values(&mut rng, k * 4 * 2);
    let bytes = f8_bytes(&values);
    let mut g = G::new();
    let a = g.input_bytes(ty::F8_E4M3, [k, 4, 2, 1], &bytes);
    let rows = g.ids(ty::I32, [3, 2, 1, 1], &[3, 0, 3, 1, 2, 0]);
    let got = g.node(Op::GET_ROWS, ty::F32, [k, 3, 2, 1], &[a, rows], &[]);
    let src = g.input(ty::F32, [k, 3, 1, 1], &values[..3 * k]);
    let src_h = g.input(ty::F16, [k, 3, 1, 1], &values[..3 * k]);
    let ids = g.ids(I64, [3, 1, 1, 1], &[2, 0, 4]);
    let cache = g.zeros(ty::F8_E4M3, [k, 5, 1, 1]);
    g.node_into(Op::SET_ROWS, cache, &[src, ids], &[]);
    let cache_h = g.zeros(ty::F8_E4M3, [k, 5, 1, 1]);
    g.node_into(Op::SET_ROWS, cache_h, &[src_h, ids], &[]);
    let out = g.run(2).unwrap();
    let mut want = Vec::new();
    for (n, r) in [3usize, 0, 3, 1, 2, 0].into_iter().enumerate() {
        let plane = n / 3;
        want.extend(decoded(&bytes[(plane * 4 + r) * k..][..k]));
    }
    assert_close(&g.read(&out, got), &want, 0.0, "GET_ROWS F8 -> F32");
    let halves = stored(ty::F16, &values[..3 * k]);
    for (cache, src) in [(cache, &values[..3 * k]), (cache_h, &halves[..])] {
        let mut want = vec![0u8; 5 * k];
        for (n, r) in [2usize, 0, 4].into_iter().enumerate() {
            want[r * k..(r + 1) * k].copy_from_slice(&f8_bytes(&src[n * k..(n + 1) * k]));
        }
        assert_eq!(g.raw(&out, cache), want, "SET_ROWS -> F8");
    }
}

#[test]
fn fp8_mul_mat_with_f32_and_bf16_activations() {
    let mut rng = Rng::new(0xFB);
    let (k, m, n) = (70, 5, 4);
    // finite weights: NaN would poison whole rows
    let weights: Vec<f32> = rng.values(k * m * 2, 3.0);
    let w_bytes = f8_bytes(&weights);
    let x = rng.values(k * n * 2 * 2, 1.0);
    let mut g = G::new();
    let w = g.input_bytes(ty::F8_E4M3, [k, m, 2, 1], &w_bytes);
    let xf = g.input(ty::F32, [k, n, 2, 2], &x);
    let xb = g.input(ty::BF16, [k, n, 2, 2], &x);
    let yf = g.node(Op::MUL_MAT, ty::F32, [m, n, 2, 2], &[w, xf], &[]);
    let yb = g.node(Op::MUL_MAT, ty::F32, [m, n, 2, 2], &[w, xb], &[]);
    let out = g.run(3).unwrap();
    let wd = decoded(&w_bytes);
    for (y, xs) in [(yf, x.clone()), (yb, stored(ty::BF16, &x))] {
        let mut want = Vec::new();
        for i3 in 0..2 {
            for i2 in 0..2 {
                for j in 0..n {
                    for i in 0..m {
                        let wrow = &wd[(i2 * m + i) * k..][..k];
                        let xrow = &xs[((i3 * 2 + i2) * n + j) * k..][..k];
                        want.push(wrow.iter().zip(xrow).map(|(a, &b)| a * f64::from(b)).sum());
                    }
                }
            }
        }
        assert_close(&g.read(&out, y), &want, 1e-10, "MUL_MAT F8 x float");
    }
}

#[test]
fn fp8_refusals_follow_ggml_cpu() {
    let q8 = |g: &mut G, ne: [usize; 4]| {
        let n: usize = ne.iter().product();
        g.input_bytes(ty::F8_E4M3, ne, &vec![0x38; n])
    };
    // MUL_MAT: F16 activations (supports_op takes F32, or BF16 for an F32 vec_dot_type)
    let mut g = G::new();
    let w = q8(&mut g, [8, 2, 1, 1]);
    let x = g.input(ty::F16, [8, 3, 1, 1], &[1.0; 24]);
    g.node(Op::MUL_MAT, ty::F32, [2, 3, 1, 1], &[w, x], &[]);
    assert_refused(&g, ErrorKind::OpRefused);
    // MUL_MAT: strided F8 weights (ggml-cpu asserts nb00 == type size)
    let mut g = G::new();
    let w = q8(&mut g, [2, 8, 1, 1]);
    let wt = g.transpose(w);
    let x = g.input(ty::F32, [8, 3, 1, 1], &[1.0; 24]);
    g.node(Op::MUL_MAT, ty::F32, [2, 3, 1, 1], &[wt, x], &[]);
    assert_refused(&g, ErrorKind::InvalidGraph);
    // OUT_PROD: supports_op refuses F8 src0 (not ggml_is_quantized)
    let mut g = G::new();
    let a = q8(&mut g, [4, 3, 1, 1]);
    let b = g.input(ty::F32, [2, 3, 1, 1], &[1.0; 6]);
    g.node(Op::OUT_PROD, ty::F32, [4, 2, 1, 1], &[a, b], &[]);
    assert_refused(&g, ErrorKind::OpRefused);
    // copies ggml's dup has no case for
    for (from, to) in [
        (ty::F8_E4M3, ty::I32),
        (ty::I32, ty::F8_E4M3),
        (ty::Q8_0, ty::F8_E4M3),
        (ty::F8_E4M3, ty::Q8_0),
    ] {
        let mut g = G::new();
        let a = if from == ty::F8_E4M3 {
            q8(&mut g, [32, 1, 1, 1])
        } else if from == ty::Q8_0 {
            g.input_bytes(ty::Q8_0, [32, 1, 1, 1], &[0; 34])
        } else {
            g.input(from, [32, 1, 1, 1], &[1.0; 32])
        };
        g.node(Op::CPY, to, [32, 1, 1, 1], &[a], &[]);
        assert_refused(&g, ErrorKind::OpRefused);
    }
    // element-wise ops, REPEAT, ACC, CLAMP, SET_ROWS from F8 rows: ggml-cpu aborts
    let mut g = G::new();
    let a = q8(&mut g, [4, 2, 1, 1]);
    let b = g.input(ty::F32, [4, 2, 1, 1], &[1.0; 8]);
    g.node(Op::ADD, ty::F8_E4M3, [4, 2, 1, 1], &[a, b], &[]);
    assert_refused(&g, ErrorKind::OpRefused);
    let mut g = G::new();
    let a = q8(&mut g, [4, 1, 1, 1]);
    g.node(Op::REPEAT, ty::F8_E4M3, [4, 2, 1, 1], &[a], &[]);
    assert_refused(&g, ErrorKind::OpRefused);
    let mut g = G::new();
    let a = q8(&mut g, [4, 1, 1, 1]);
    g.node(
        Op::CLAMP,
        ty::F8_E4M3,
        [4, 1, 1, 1],
        &[a],
        &[f(0.0), f(1.0)],
    );
    assert_refused(&g, ErrorKind::OpRefused);
    let mut g = G::new();
    let a = q8(&mut g, [4, 2, 1, 1]);
    let ids = g.ids(ty::I32, [2, 1, 1, 1], &[0, 1]);
    let cache = g.zeros(ty::F32, [4, 2, 1, 1]);
    g.node_into(Op::SET_ROWS, cache, &[a, ids], &[]);
    assert_refused(&g, ErrorKind::OpRefused);
}
