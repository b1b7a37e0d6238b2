//! Tests of the element-wise, unary, GLU, reduction and norm ops.

use super::*;

// --- element-wise --------------------------------------------------------------------------

#[test]
fn binary_ops_broadcast_src1_over_every_dimension() {
    let mut rng = Rng::new(7);
    let ops = [(Op::ADD, 0), (Op::SUB, 1), (Op::MUL, 2), (Op::DIV, 3)];
    for round in 0..24 {
        let (op, which) = ops[round % 4];
        let ne = random_shape(&mut rng, [17, 6, 4, 3]);
        // src1 dims divide src0's
        let ne1 = ne.map(|n| {
            let divisors: Vec<usize> = (1..=n).filter(|d| n % d == 0).collect();
            divisors[rng.below(divisors.len())]
        });
        let types = [ty::F32, ty::F16, ty::BF16];
        let (t0, t1, td) = if round < 12 {
            (ty::F32, ty::F32, ty::F32)
        } else {
            (
                types[rng.below(3)],
                types[rng.below(3)],
                types[rng.below(3)],
            )
        };
        let x = rng.values(ne.iter().product(), 3.0);
        let mut y = rng.values(ne1.iter().product(), 3.0);
        if which == 3 {
            y.iter_mut().for_each(|v| *v = v.abs() + 0.5);
        }
        let mut g = G::new();
        let a = g.input(t0, ne, &x);
        let b = g.input(t1, ne1, &y);
        let node = g.node(op, td, ne, &[a, b], &[]);
        let out = g.run(1 + round % 3).unwrap();
        let (xs, ys) = (stored(t0, &x), stored(t1, &y));
        let want: Vec<f64> = all(ne)
            .map(|i| {
                let a = xs[at(ne, i)];
                let b = ys[at(
                    ne1,
                    [i[0] % ne1[0], i[1] % ne1[1], i[2] % ne1[2], i[3] % ne1[3]],
                )];
                let v = match which {
                    0 => a + b,
                    1 => a - b,
                    2 => a * b,
                    _ => a / b,
                };
                f64::from(stored(td, &[v])[0])
            })
            .collect();
        assert_close(
            &g.read(&out, node),
            &want,
            1e-12,
            &format!("{op:?} {ne:?} by {ne1:?} ({t0},{t1}->{td})"),
        );
    }
}

#[test]
fn binary_ops_read_non_contiguous_sources_and_run_in_place() {
    let mut rng = Rng::new(8);
    let x = rng.values(5 * 7 * 3, 1.0);
    let y = rng.values(7 * 5, 1.0);
    let mut g = G::new();
    let a = g.input(ty::F32, [5, 7, 3, 1], &x);
    let b = g.input(ty::F32, [7, 5, 1, 1], &y);
    // src0 permuted to [7, 5, 3], src1 transposed to [5, 7] and broadcast... as [7,5] view
    let ap = g.permute(a, [1, 0, 2, 3]);
    let add = g.node(Op::ADD, ty::F32, [7, 5, 3, 1], &[ap, b], &[]);
    // in place: mul(add, add) written over add, then scale in place
    let sq = g.node_into(Op::MUL, add, &[add, add], &[]);
    let scaled = g.node_into(Op::SCALE, sq, &[sq], &[f(0.5), f(0.25)]);
    let out = g.run(2).unwrap();
    let want: Vec<f64> = all([7, 5, 3, 1])
        .map(|[i0, i1, i2, _]| {
            let s = f64::from(
                x[at([5, 7, 3, 1], [i1, i0, i2, 0])] + y[at([7, 5, 1, 1], [i0, i1, 0, 0])],
            );
            s * s * 0.5 + 0.25
        })
        .collect();
    assert_close(&g.read(&out, scaled), &want, 1e-12, "in-place chain");
}

#[test]
fn add1_scale_sqr_sqrt_clamp_and_leaky_relu() {
    let mut rng = Rng::new(9);
    let x = rng.values(33 * 4, 4.0);
    let mut g = G::new();
    let a = g.input(ty::F32, [33, 4, 1, 1], &x);
    let s = g.input(ty::F32, [1, 1, 1, 1], &[1.5]);
    let add1 = g.node(Op::ADD1, ty::F32, [33, 4, 1, 1], &[a, s], &[]);
    let scale = g.node(Op::SCALE, ty::F32, [33, 4, 1, 1], &[a], &[f(-2.0), f(0.0)]);
    let sqr = g.node(Op::SQR, ty::F16, [33, 4, 1, 1], &[a], &[]);
    let abs = g.node(Op::UNARY, ty::F32, [33, 4, 1, 1], &[a], &[UnaryOp::ABS.0]);
    let sqrt = g.node(Op::SQRT, ty::F32, [33, 4, 1, 1], &[abs], &[]);
    let clamp = g.node(Op::CLAMP, ty::F32, [33, 4, 1, 1], &[a], &[f(-1.0), f(2.0)]);
    let leaky = g.node(Op::LEAKY_RELU, ty::F32, [33, 4, 1, 1], &[a], &[f(0.1)]);
    let out = g.run(2).unwrap();
    let map = |h: fn(f64) -> f64| x.iter().map(|&v| h(f64::from(v))).collect::<Vec<_>>();
    assert_close(&g.read(&out, add1), &map(|v| v + 1.5), 1e-14, "add1");
    assert_close(&g.read(&out, scale), &map(|v| -2.0 * v), 1e-14, "scale");
    assert_close(&g.read(&out, sqr), &map(|v| v * v), 1e-6, "sqr into f16");
    assert_close(&g.read(&out, sqrt), &map(|v| v.abs().sqrt()), 1e-13, "sqrt");
    assert_close(
        &g.read(&out, clamp),
        &map(|v| v.clamp(-1.0, 2.0)),
        0.0,
        "clamp",
    );
    assert_close(
        &g.read(&out, leaky),
        &map(|v| if v > 0.0 { v } else { 0.1 * v }),
        1e-14,
        "leaky relu",
    );
}

fn erf64(x: f64) -> f64 {
    // Abramowitz-Stegun is not precise enough for a reference; integrate instead.
    let n = 20_000;
    let h = x / n as f64;
    let mut sum = 0.0;
    for i in 0..=n {
        let t = i as f64 * h;
        let w = if i == 0 || i == n {
            1.0
        } else if i % 2 == 1 {
            4.0
        } else {
            2.0
        };
        sum += w * (-t * t).exp();
    }
    sum * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn unary_ops_match_their_definitions_in_every_float_type() {
    let mut rng = Rng::new(10);
    let silu = |v: f64| v / (1.0 + (-v).exp());
    let gelu = |v: f64| {
        0.5 * v
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * v * (1.0 + 0.044715 * v * v)).tanh())
    };
    let cases: Vec<UnaryCase> = vec![
        (UnaryOp::ABS, Box::new(f64::abs), 0.0),
        (
            UnaryOp::SGN,
            Box::new(|v: f64| {
                if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }),
            0.0,
        ),
        (UnaryOp::NEG, Box::new(|v: f64| -v), 0.0),
        (
            UnaryOp::STEP,
            Box::new(|v: f64| if v > 0.0 { 1.0 } else { 0.0 }),
            0.0,
        ),
        (UnaryOp::TANH, Box::new(f64::tanh), 1e-12),
        (
            UnaryOp::ELU,
            Box::new(|v: f64| if v > 0.0 { v } else { v.exp_m1() }),
            1e-12,
        ),
        (UnaryOp::RELU, Box::new(|v: f64| v.max(0.0)), 0.0),
        (
            UnaryOp::SIGMOID,
            Box::new(|v: f64| 1.0 / (1.0 + (-v).exp())),
            1e-12,
        ),
        (UnaryOp::GELU, Box::new(gelu), 1e-5),
        (
            UnaryOp::GELU_QUICK,
            Box::new(|v: f64| v / (1.0 + (-1.702 * v).exp())),
            1e-5,
        ),
        (UnaryOp::SILU, Box::new(silu), 1e-12),
        (
            UnaryOp::HARDSWISH,
            Box::new(|v: f64| v * ((v + 3.0) / 6.0).clamp(0.0, 1.0)),
            1e-12,
        ),
        (
            UnaryOp::HARDSIGMOID,
            Box::new(|v: f64| ((v + 3.0) / 6.0).clamp(0.0, 1.0)),
            1e-12,
        ),
        (UnaryOp::EXP, Box::new(f64::exp), 1e-12),
        (UnaryOp::EXPM1, Box::new(f64::exp_m1), 1e-10),
        (
            UnaryOp::SOFTPLUS,
            Box::new(|v: f64| (1.0 + v.exp()).ln()),
            1e-12,
        ),
        (
            UnaryOp::GELU_ERF,
            Box::new(|v: f64| 0.5 * v * (1.0 + erf64(v / 2f64.sqrt()))),
            1e-11,
        ),
        (UnaryOp::FLOOR, Box::new(f64::floor), 0.0),
        (UnaryOp::CEIL, Box::new(f64::ceil), 0.0),
        (UnaryOp::ROUND, Box::new(f64::round), 0.0),
        (UnaryOp::TRUNC, Box::new(f64::trunc), 0.0),
    ];
    for (op, reference, tolerance) in cases {
        for t in [ty::F32, ty::F16, ty::BF16] {
            let x = rng.values(40 * 3, 4.0);
            let mut g = G::new();
            let a = g.input(t, [40, 3, 1, 1], &x);
            let y = g.node(Op::UNARY, t, [40, 3, 1, 1], &[a], &[op.0]);
            let out = g.run(2).unwrap();
            let want: Vec<f64> = stored(t, &x)
                .iter()
                .map(|&v| f64::from(stored(t, &[reference(f64::from(v)) as f32])[0]))
                .collect();
            // storage rounding of the result dominates for f16/bf16
            let tolerance = match t {
                ty::F16 => tolerance.max(1e-6),
                ty::BF16 => tolerance.max(1e-4),
                _ => tolerance,
            };
            assert_close(
                &g.read(&out, y),
                &want,
                tolerance,
                &format!("unary {op:?} in type {t}"),
            );
        }
    }
}

#[test]
fn gelu_matches_ggml_table_exactly() {
    let x: Vec<f32> = (-1200..1200).map(|i| i as f32 * 0.01).collect();
    let mut g = G::new();
    let a = g.input(ty::F32, [2400, 1, 1, 1], &x);
    let y = g.node(
        Op::UNARY,
        ty::F32,
        [2400, 1, 1, 1],
        &[a],
        &[UnaryOp::GELU.0],
    );
    let q = g.node(
        Op::UNARY,
        ty::F32,
        [2400, 1, 1, 1],
        &[a],
        &[UnaryOp::GELU_QUICK.0],
    );
    let out = g.run(1).unwrap();
    let table = |h: fn(f32) -> f32, v: f32| f16_to_f32(f32_to_f16(h(f16_to_f32(f32_to_f16(v)))));
    let want: Vec<f64> = x
        .iter()
        .map(|&v| {
            f64::from(if v <= -10.0 {
                0.0
            } else if v >= 10.0 {
                v
            } else {
                table(gelu_exact, v)
            })
        })
        .collect();
    assert_close(&g.read(&out, y), &want, 0.0, "gelu table");
    let want: Vec<f64> = x
        .iter()
        .map(|&v| f64::from(table(gelu_quick_exact, v)))
        .collect();
    assert_close(&g.read(&out, q), &want, 0.0, "gelu quick table");
}

#[test]
fn glu_variants_split_swapped_and_two_tensor_forms() {
    let mut rng = Rng::new(11);
    let silu = |v: f64| v / (1.0 + (-v).exp());
    let gelu = |v: f64| {
        0.5 * v
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * v * (1.0 + 0.044715 * v * v)).tanh())
    };
    let (alpha, limit) = (1.702f32, 7.0f32);
    let cases: Vec<GluCase> = vec![
        (
            GluOp::REGLU,
            Box::new(|x: f64, g: f64| x.max(0.0) * g),
            1e-13,
        ),
        (
            GluOp::GEGLU,
            Box::new(move |x: f64, g: f64| gelu(x) * g),
            1e-5,
        ),
        (
            GluOp::SWIGLU,
            Box::new(move |x: f64, g: f64| silu(x) * g),
            1e-12,
        ),
        (
            GluOp::SWIGLU_OAI,
            Box::new(move |x: f64, g: f64| {
                let x = x.min(f64::from(limit));
                let g = g.clamp(-f64::from(limit), f64::from(limit));
                x / (1.0 + (-f64::from(alpha) * x).exp()) * (g + 1.0)
            }),
            1e-12,
        ),
        (
            GluOp::GEGLU_ERF,
            Box::new(|x: f64, g: f64| 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())) * g),
            1e-11,
        ),
        (
            GluOp::SWIGLU_CLAMP,
            Box::new(move |x: f64, g: f64| {
                let x = x.min(f64::from(limit));
                let g = g.clamp(-f64::from(limit), f64::from(limit));
                silu(x) * g
            }),
            1e-12,
        ),
        (
            GluOp::GEGLU_QUICK,
            Box::new(|x: f64, g: f64| x / (1.0 + (-1.702 * x).exp()) * g),
            1e-5,
        ),
    ];
    for (op, reference, tolerance) in cases {
        for form in 0..3 {
            let nc = 24;
            let x = rng.values(2 * nc * 3 * 2, 8.0);
            let mut g = G::new();
            let params = [op.0, i32::from(form == 1), f(alpha), f(limit)];
            let (node, pairs): (TensorIndex, Vec<(f64, f64)>) = if form < 2 {
                let a = g.input(ty::F32, [2 * nc, 3, 2, 1], &x);
                let n = g.node(Op::GLU, ty::F32, [nc, 3, 2, 1], &[a], &params);
                let pairs = x
                    .chunks(2 * nc)
                    .flat_map(|row| {
                        (0..nc).map(move |i| {
                            let (a, b) = (f64::from(row[i]), f64::from(row[nc + i]));
                            if form == 1 {
                                (b, a)
                            } else {
                                (a, b)
                            }
                        })
                    })
                    .collect();
                (n, pairs)
            } else {
                let a = g.input(ty::F32, [nc, 3, 2, 1], &x[..nc * 6]);
                let b = g.input(ty::F32, [nc, 3, 2, 1], &x[nc * 6..]);
                let n = g.node(Op::GLU, ty::F32, [nc, 3, 2, 1], &[a, b], &params);
                let pairs = (0..nc * 6)
                    .map(|i| (f64::from(x[i]), f64::from(x[nc * 6 + i])))
                    .collect();
                (n, pairs)
            };
            let out = g.run(2).unwrap();
            let want: Vec<f64> = pairs.iter().map(|&(x, g)| reference(x, g)).collect();
            assert_close(
                &g.read(&out, node),
                &want,
                tolerance,
                &format!("glu {op:?} form {form}"),
            );
        }
    }
}

#[test]
fn swiglu_clamp_f32_and_f16_in_every_form_match_the_scalar_formula() {
    let mut rng = Rng::new(61);
    // |values| up to 8 against a limit of 2: the gate is cut from above, the up half from both
    // sides; the exact limits and 0 are in there too
    let limit = 2.0f32;
    // ggml_compute_forward_swiglu_clamp_{f32,f16}, element by element in f32
    let reference = |x: f32, g: f32| {
        let x = x.min(limit);
        let g = g.clamp(-limit, limit);
        x / (1.0 + (-x).exp()) * g
    };
    let nc = 19;
    for t in [ty::F32, ty::F16] {
        for form in 0..3 {
            let mut x = rng.values(2 * nc * 4 * 3, 8.0);
            x[..6].copy_from_slice(&[limit, -limit, 0.0, limit, -limit, 0.0]);
            x[nc..nc + 6].copy_from_slice(&[-limit, limit, limit, 0.0, 3.0 * limit, -3.0 * limit]);
            // what the tensors hold
            let x = stored(t, &x);
            let mut g = G::new();
            let params = [GluOp::SWIGLU_CLAMP.0, i32::from(form == 1), 0, f(limit)];
            let (node, pairs): (TensorIndex, Vec<(f32, f32)>) = if form < 2 {
                let a = g.input(t, [2 * nc, 4, 3, 1], &x);
                let n = g.node(Op::GLU, t, [nc, 4, 3, 1], &[a], &params);
                let pairs = x
                    .chunks(2 * nc)
                    .flat_map(|row| {
                        (0..nc).map(move |i| {
                            if form == 1 {
                                (row[nc + i], row[i])
                            } else {
                                (row[i], row[nc + i])
                            }
                        })
                    })
                    .collect();
                (n, pairs)
            } else {
                let half = nc * 12;
                let a = g.input(t, [nc, 4, 3, 1], &x[..half]);
                let b = g.input(t, [nc, 4, 3, 1], &x[half..]);
                let n = g.node(Op::GLU, t, [nc, 4, 3, 1], &[a, b], &params);
                (n, (0..half).map(|i| (x[i], x[half + i])).collect())
            };
            assert!(
                pairs.iter().any(|&(x, _)| x > limit)
                    && pairs.iter().any(|&(_, g)| g > limit)
                    && pairs.iter().any(|&(_, g)| g < -limit),
                "the limit clamps"
            );
            let out = g.run(2).unwrap();
            let got = g.read(&out, node);
            // one f32 -> f16 rounding of the f32 result, as GGML_FP32_TO_FP16
            let want = stored(
                t,
                &pairs
                    .iter()
                    .map(|&(x, g)| reference(x, g))
                    .collect::<Vec<_>>(),
            );
            for (i, (got, want)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "type {t} form {form} element {i}: got {got}, want {want}"
                );
            }
        }
    }
    // ggml-cpu has no BF16 kernel of SWIGLU_CLAMP
    let mut g = G::new();
    let a = g.input(ty::BF16, [4, 1, 1, 1], &[1.0; 4]);
    g.node(
        Op::GLU,
        ty::BF16,
        [2, 1, 1, 1],
        &[a],
        &[GluOp::SWIGLU_CLAMP.0, 0, 0, f(limit)],
    );
    assert_refused(&g, ErrorKind::OpRefused);
}

// --- reductions and norms ------------------------------------------------------------------

#[test]
fn sum_rows_mean_sum_and_argmax() {
    let mut rng = Rng::new(12);
    let ne = [37, 5, 3, 2];
    let x = rng.values(37 * 30, 10.0);
    let mut m = rng.values(11 * 6, 1.0);
    m[3] = 5.0;
    m[7] = 5.0; // a tie: ggml keeps the last maximum
    let mut g = G::new();
    let a = g.input(ty::F32, ne, &x);
    let mx = g.input(ty::F32, [11, 6, 1, 1], &m);
    let sum_rows = g.node(Op::SUM_ROWS, ty::F32, [1, 5, 3, 2], &[a], &[]);
    let mean = g.node(Op::MEAN, ty::F32, [1, 5, 3, 2], &[a], &[]);
    let sum = g.node(Op::SUM, ty::F32, [1, 1, 1, 1], &[a], &[]);
    let argmax = g.node(Op::ARGMAX, ty::I32, [6, 1, 1, 1], &[mx], &[]);
    let out = g.run(2).unwrap();
    let rows: Vec<f64> = x
        .chunks(37)
        .map(|r| r.iter().map(|&v| f64::from(v)).sum())
        .collect();
    assert_close(&g.read(&out, sum_rows), &rows, 1e-13, "sum_rows");
    assert_close(
        &g.read(&out, mean),
        &rows.iter().map(|s| s / 37.0).collect::<Vec<_>>(),
        1e-13,
        "mean",
    );
    assert_close(&g.read(&out, sum), &[rows.iter().sum()], 1e-13, "sum");
    let want: Vec<f64> = m
        .chunks(11)
        .map(|r| {
            let max = r.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            r.iter().rposition(|&v| v == max).unwrap() as f64
        })
        .collect();
    assert_close(&g.read(&out, argmax), &want, 0.0, "argmax");
    // SUM of a transposed source adds its elements (ggml-cpu's release build reads each row as
    // packed floats whatever nb0: test-backend-ops' one transposed SUM case is a reference bug)
    let mut g = G::new();
    let values = rng.values(33 * 256, 1.0);
    let a = g.input(ty::F32, [33, 256, 1, 1], &values);
    let t = g.transpose(a);
    let sum = g.node(Op::SUM, ty::F32, [1, 1, 1, 1], &[t], &[]);
    let out = g.run(2).unwrap();
    let want: f64 = values.iter().map(|&v| f64::from(v)).sum();
    assert_close(
        &g.read(&out, sum),
        &[want],
        1e-6,
        "sum of a transposed source",
    );
}

#[test]
fn norm_and_rms_norm_over_strided_rows() {
    let mut rng = Rng::new(13);
    let x: Vec<f32> = rng.values(64 * 9, 3.0).iter().map(|v| v + 1.0).collect();
    let eps = 1e-5f32;
    let mut g = G::new();
    let a = g.input(ty::F32, [64, 9, 1, 1], &x);
    let norm = g.node(Op::NORM, ty::F32, [64, 9, 1, 1], &[a], &[f(eps)]);
    let rms = g.node(Op::RMS_NORM, ty::F32, [64, 9, 1, 1], &[a], &[f(eps)]);
    // a transposed source (strided rows)
    let t = g.transpose(a);
    let rms_t = g.node(Op::RMS_NORM, ty::F32, [9, 64, 1, 1], &[t], &[f(eps)]);
    let out = g.run(3).unwrap();
    let eps = f64::from(eps);
    let mut want_norm = Vec::new();
    let mut want_rms = Vec::new();
    for row in x.chunks(64) {
        let row = wide(row);
        let mean = row.iter().sum::<f64>() / 64.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 64.0;
        want_norm.extend(row.iter().map(|v| (v - mean) / (var + eps).sqrt()));
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 64.0;
        want_rms.extend(row.iter().map(|v| v / (ms + eps).sqrt()));
    }
    assert_close(&g.read(&out, norm), &want_norm, 1e-12, "norm");
    assert_close(&g.read(&out, rms), &want_rms, 1e-12, "rms_norm");
    let mut want_t = Vec::new();
    for i1 in 0..64 {
        let row: Vec<f64> = (0..9).map(|i0| f64::from(x[i1 + 64 * i0])).collect();
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 9.0;
        want_t.extend(row.iter().map(|v| v / (ms + eps).sqrt()));
    }
    assert_close(
        &g.read(&out, rms_t),
        &want_t,
        1e-12,
        "rms_norm of a transposed view",
    );
}

#[test]
fn l2_norm_add_id_argsort_and_top_k() {
    let mut rng = Rng::new(22);
    let x = rng.values(10 * 6, 2.0);
    let bias = rng.values(10 * 4, 1.0);
    let ids: Vec<i64> = vec![3, 0, 1, 1, 2, 0];
    let mut g = G::new();
    let a = g.input(ty::F32, [10, 3, 2, 1], &x);
    let b = g.input(ty::F32, [10, 4, 1, 1], &bias);
    let it = g.ids(ty::I32, [3, 2, 1, 1], &ids);
    let l2 = g.node(Op::L2_NORM, ty::F32, [10, 3, 2, 1], &[a], &[f(1e-6)]);
    let add_id = g.node(Op::ADD_ID, ty::F32, [10, 3, 2, 1], &[a, b, it], &[]);
    let asc = g.node(Op::ARGSORT, ty::I32, [10, 3, 2, 1], &[a], &[0]);
    let desc = g.node(Op::ARGSORT, ty::I32, [10, 3, 2, 1], &[a], &[1]);
    let top = g.node(Op::TOP_K, ty::I32, [4, 3, 2, 1], &[a], &[]);
    let out = g.run(2).unwrap();
    let mut want_l2 = Vec::new();
    let mut want_add = Vec::new();
    let (mut want_asc, mut want_desc, mut want_top) = (Vec::new(), Vec::new(), Vec::new());
    for (r, row) in x.chunks(10).enumerate() {
        let norm = row
            .iter()
            .map(|&v| f64::from(v).powi(2))
            .sum::<f64>()
            .sqrt();
        want_l2.extend(row.iter().map(|&v| f64::from(v) / norm));
        let id = ids[r] as usize;
        want_add.extend(
            row.iter()
                .zip(&bias[id * 10..id * 10 + 10])
                .map(|(&a, &b)| f64::from(a + b)),
        );
        let mut order: Vec<usize> = (0..10).collect();
        order.sort_by(|&p, &q| row[p].partial_cmp(&row[q]).unwrap());
        want_asc.extend(order.iter().map(|&i| i as f64));
        want_desc.extend(order.iter().rev().map(|&i| i as f64));
        let mut top: Vec<f64> = order.iter().rev().take(4).map(|&i| i as f64).collect();
        top.swap(0, 1);
        want_top.extend(top);
    }
    assert_close(&g.read(&out, l2), &want_l2, 1e-12, "l2_norm");
    assert_close(&g.read(&out, add_id), &want_add, 0.0, "add_id");
    assert_close(&g.read(&out, asc), &want_asc, 0.0, "argsort ascending");
    assert_close(&g.read(&out, desc), &want_desc, 0.0, "argsort descending");
    assert_close(&g.read(&out, top), &want_top, 0.0, "top_k");
    // an id past src1's rows fails the graph before ADD_ID writes
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
    let b = g.input(ty::F32, [4, 2, 1, 1], &[1.0; 8]);
    let it = g.ids(ty::I32, [1, 1, 1, 1], &[2]);
    g.node(Op::ADD_ID, ty::F32, [4, 1, 1, 1], &[a, b, it], &[]);
    assert_eq!(g.run(1).unwrap_err().kind(), ErrorKind::OutOfBounds);
}
