//! Tests of ROPE, SOFT_MAX, FLASH_ATTN_EXT and DIAG_MASK_INF.

use super::*;

// --- rope, softmax, attention --------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
pub(super) fn rope_reference(
    x: &[f32],
    ne: [usize; 4],
    pos: &[i64],
    n_dims: usize,
    mode: i32,
    base: f64,
    freq_scale: f64,
    ext_factor: f64,
    attn_factor: f64,
    n_ctx_orig: f64,
    beta: (f64, f64),
    factors: Option<&[f32]>,
    n_offs: usize,
) -> Vec<f64> {
    let corr = |n_rot: f64| {
        n_dims as f64 * (n_ctx_orig / (n_rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let low = corr(beta.0).floor().max(0.0);
    let high = corr(beta.1).ceil().min(n_dims as f64 - 1.0);
    let mut out = wide(x);
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for pair in 0..n_dims / 2 {
                    let ff = factors.map_or(1.0, |f| f64::from(f[pair]));
                    let theta_extrap =
                        pos[i2] as f64 * base.powf(-2.0 * pair as f64 / n_dims as f64) / ff;
                    let theta_interp = freq_scale * theta_extrap;
                    let (mut theta, mut mscale) = (theta_interp, attn_factor);
                    if ext_factor != 0.0 {
                        let y = (pair as f64 - low) / (high - low).max(0.001);
                        let ramp = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
                        theta = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
                        mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
                    }
                    let (c, s) = (theta.cos() * mscale, theta.sin() * mscale);
                    let (a, b) = if mode == 0 {
                        (n_offs + 2 * pair, n_offs + 2 * pair + 1)
                    } else {
                        (n_offs + pair, n_offs + pair + n_dims / 2)
                    };
                    let x0 = f64::from(x[at(ne, [a, i1, i2, i3])]);
                    let x1 = f64::from(x[at(ne, [b, i1, i2, i3])]);
                    out[at(ne, [a, i1, i2, i3])] = x0 * c - x1 * s;
                    out[at(ne, [b, i1, i2, i3])] = x0 * s + x1 * c;
                }
            }
        }
    }
    out
}

/// ROPE op_params for `n_dims` rotated dimensions from `n_offs` on (freq base 10000, no YaRN).
pub(super) fn rope_params(n_dims: usize, mode: i32, n_offs: i32) -> [i32; 16] {
    let mut params = [0i32; 16];
    params[1] = n_dims as i32;
    params[2] = mode;
    params[4] = 4096;
    params[5] = f(10000.0);
    params[6] = f(1.0);
    params[8] = f(1.0);
    params[9] = f(32.0);
    params[10] = f(1.0);
    params[15] = n_offs;
    params
}

#[test]
fn rope_rotates_a_window_at_an_offset_and_copies_the_rest() {
    let mut rng = Rng::new(61);
    for (mode, t) in [(0, ty::F32), (2, ty::F32), (0, ty::F16), (2, ty::F16)] {
        let ne = [40, 3, 4, 1];
        let (n_dims, n_offs) = (16, 10);
        let x = rng.values(ne.iter().product(), 1.0);
        let pos: Vec<i64> = (0..4).map(|_| rng.below(100) as i64).collect();
        let mut g = G::new();
        let a = g.input(t, ne, &x);
        let p = g.ids(ty::I32, [4, 1, 1, 1], &pos);
        let r = g.node(
            Op::ROPE,
            t,
            ne,
            &[a, p],
            &rope_params(n_dims, mode, n_offs as i32),
        );
        let out = g.run(2).unwrap();
        let want = rope_reference(
            &stored(t, &x),
            ne,
            &pos,
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
        let got = g.read(&out, r);
        let tolerance = if t == ty::F16 { 1e-6 } else { 1e-9 };
        assert_close(
            &got,
            &want,
            tolerance,
            &format!("rope offset mode {mode} type {t}"),
        );
        // dimensions outside the window are copied unchanged
        let stored_x = stored(t, &x);
        for i in all(ne) {
            if !(n_offs..n_offs + n_dims).contains(&i[0]) {
                assert_eq!(got[at(ne, i)], stored_x[at(ne, i)], "{i:?}");
            }
        }
    }
}

#[test]
fn rope_window_offsets_outside_the_row_are_refused() {
    // (n_dims, mode, n_offs, ne0): odd, past the end, negative, vision with an offset
    for (n_dims, mode, n_offs, ne0) in [
        (8, 0, 3, 16),
        (8, 2, 10, 16),
        (8, 0, -2, 16),
        (8, 24, 2, 16),
    ] {
        let mut g = G::new();
        let ne = [ne0, 2, 3, 1];
        let a = g.input(ty::F32, ne, &vec![0.5; ne0 * 6]);
        let p = g.ids(ty::I32, [12, 1, 1, 1], &[0; 12]);
        let mut params = rope_params(n_dims, mode, n_offs);
        params[11] = 2;
        params[12] = 2;
        g.node(Op::ROPE, ty::F32, ne, &[a, p], &params);
        let error = g.run(1).unwrap_err();
        assert_eq!(
            error.kind(),
            ErrorKind::InvalidGraph,
            "n_dims {n_dims} mode {mode} offset {n_offs}: {error}"
        );
    }
}

#[test]
fn rope_positions_must_be_one_row_of_enough_values() {
    // long enough but empty (found by the graph_compute fuzz target: the kernel read past
    // the empty tensor), a matrix, and one value short
    for pos_ne in [[3, 1, 1, 0], [3, 2, 1, 1], [2, 1, 1, 1]] {
        let mut g = G::new();
        let ne = [32, 2, 3, 1];
        let a = g.input(ty::F32, ne, &vec![0.5; 32 * 6]);
        let count: usize = pos_ne.iter().product();
        let p = g.ids(ty::I32, pos_ne, &vec![0; count]);
        g.node(Op::ROPE, ty::F32, ne, &[a, p], &rope_params(32, 0, 0));
        let error = g.run(1).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidGraph, "{pos_ne:?}: {error}");
    }
}

/// Sources a kernel reads by position (sinks, frequency factors, ids) must hold those values:
/// an empty tensor whose `ne[0]` is large enough has none (found by the graph_compute fuzz
/// target: the kernels read past the empty tensors).
#[test]
fn empty_auxiliary_sources_are_refused() {
    // SOFT_MAX with empty sinks
    let mut g = G::new();
    let a = g.input(ty::F32, [8, 2, 3, 1], &[0.5; 48]);
    let sinks = g.input(ty::F32, [3, 0, 1, 1], &[]);
    g.node(
        Op::SOFT_MAX,
        ty::F32,
        [8, 2, 3, 1],
        &[a, NONE, sinks],
        &[f(1.0), 0],
    );
    assert_refused(&g, ErrorKind::InvalidGraph);
    // ROPE with empty frequency factors
    let mut g = G::new();
    let a = g.input(ty::F32, [32, 2, 3, 1], &[0.5; 192]);
    let p = g.ids(ty::I32, [3, 1, 1, 1], &[0, 1, 2]);
    let factors = g.input(ty::F32, [16, 1, 0, 1], &[]);
    g.node(
        Op::ROPE,
        ty::F32,
        [32, 2, 3, 1],
        &[a, p, factors],
        &rope_params(32, 0, 0),
    );
    assert_refused(&g, ErrorKind::InvalidGraph);
    // ADD_ID with empty ids
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 2, 2, 1], &[0.5; 16]);
    let b = g.input(ty::F32, [4, 3, 1, 1], &[0.5; 12]);
    let ids = g.ids(ty::I32, [2, 2, 0, 1], &[]);
    g.node(Op::ADD_ID, ty::F32, [4, 2, 2, 1], &[a, b, ids], &[]);
    assert_refused(&g, ErrorKind::InvalidGraph);
}

#[test]
fn rope_normal_and_neox_with_yarn_and_frequency_factors() {
    let mut rng = Rng::new(16);
    for (round, (mode, t)) in [
        (0, ty::F32),
        (2, ty::F32),
        (0, ty::F16),
        (2, ty::F16),
        (2, ty::F32),
        (0, ty::F32),
    ]
    .into_iter()
    .enumerate()
    {
        let ne = [32, 3, 5, 2];
        let n_dims = if round % 2 == 0 { 32 } else { 24 };
        let x = rng.values(ne.iter().product(), 1.0);
        let pos: Vec<i64> = (0..5).map(|_| rng.below(40) as i64).collect();
        let (freq_scale, ext_factor) = if round >= 4 {
            (0.25f32, 1.0f32)
        } else {
            (1.0, 0.0)
        };
        let factors: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + i as f32 * 0.1).collect();
        let use_factors = round == 5 || round == 1;
        let mut g = G::new();
        // even rounds: src0 as a permuted view of a [32, 5, 3, 2] tensor (strided rows)
        let a = if round % 2 == 0 {
            let mut xp = vec![0.0f32; x.len()];
            for i in all(ne) {
                xp[at([ne[0], ne[2], ne[1], ne[3]], [i[0], i[2], i[1], i[3]])] = x[at(ne, i)];
            }
            let base = g.input(t, [ne[0], ne[2], ne[1], ne[3]], &xp);
            g.permute(base, [0, 2, 1, 3])
        } else {
            g.input(t, ne, &x)
        };
        let p = g.ids(ty::I32, [5, 1, 1, 1], &pos);
        let ff = if use_factors {
            g.input(ty::F32, [n_dims / 2, 1, 1, 1], &factors)
        } else {
            NONE
        };
        let params = [
            0,
            n_dims as i32,
            mode,
            0,
            4096,
            f(10000.0),
            f(freq_scale),
            f(ext_factor),
            f(1.0),
            f(32.0),
            f(1.0),
        ];
        let r = g.node(Op::ROPE, t, ne, &[a, p, ff], &params);
        let out = g.run(2).unwrap();
        let want = rope_reference(
            &stored(t, &x),
            ne,
            &pos,
            n_dims,
            mode,
            10000.0,
            f64::from(freq_scale),
            f64::from(ext_factor),
            1.0,
            4096.0,
            (32.0, 1.0),
            use_factors.then_some(&factors[..]),
            0,
        );
        let tolerance = if t == ty::F16 { 1e-6 } else { 1e-9 };
        assert_close(
            &g.read(&out, r),
            &want,
            tolerance,
            &format!("rope mode {mode} type {t} round {round}"),
        );
    }
}

#[test]
fn rope_tables_are_shared_only_by_nodes_with_the_same_positions_and_parameters() {
    // One graph: ROPE twice with the same positions and parameters (the second takes the
    // first's table), once with another base and once with frequency factors (tables of
    // their own), then ARGMAX overwrites the positions and ROPE runs again with the first
    // parameters: it must see the new positions, not the kept table.
    let mut rng = Rng::new(62);
    let ne = [32, 3, 5, 1];
    let n_dims = 32;
    let x = rng.values(ne.iter().product(), 1.0);
    let pos: Vec<i64> = (0..5).map(|_| rng.below(50) as i64).collect();
    // ARGMAX of row i: the position of its largest value, here 7 * i % 8
    let mut scores = vec![0.0f32; 8 * 5];
    for i in 0..5 {
        scores[i * 8 + 7 * i % 8] = 1.0;
    }
    let new_pos: Vec<i64> = (0..5).map(|i| (7 * i % 8) as i64).collect();
    assert_ne!(pos, new_pos);
    let factors: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + i as f32 * 0.05).collect();

    let mut g = G::new();
    let a = g.input(ty::F32, ne, &x);
    let p = g.ids(ty::I32, [5, 1, 1, 1], &pos);
    let ff = g.input(ty::F32, [n_dims / 2, 1, 1, 1], &factors);
    let s = g.input(ty::F32, [8, 5, 1, 1], &scores);
    let base_params = rope_params(n_dims, 2, 0);
    let mut other_base = base_params;
    other_base[5] = f(500.0);
    let first = g.node(Op::ROPE, ty::F32, ne, &[a, p], &base_params);
    let again = g.node(Op::ROPE, ty::F32, ne, &[a, p], &base_params);
    let other = g.node(Op::ROPE, ty::F32, ne, &[a, p], &other_base);
    let with_factors = g.node(Op::ROPE, ty::F32, ne, &[a, p, ff], &base_params);
    g.node_into(Op::ARGMAX, p, &[s], &[]);
    let moved = g.node(Op::ROPE, ty::F32, ne, &[a, p], &base_params);

    let want = |positions: &[i64], base: f64, factors: Option<&[f32]>| {
        rope_reference(
            &x,
            ne,
            positions,
            n_dims,
            2,
            base,
            1.0,
            0.0,
            1.0,
            4096.0,
            (32.0, 1.0),
            factors,
            0,
        )
    };
    for threads in [1, 3] {
        let out = g.run(threads).unwrap();
        let check = |node, want: Vec<f64>, what: &str| {
            assert_close(
                &g.read(&out, node),
                &want,
                1e-9,
                &format!("{what}, {threads} threads"),
            );
        };
        check(first, want(&pos, 10000.0, None), "first");
        check(again, want(&pos, 10000.0, None), "same key");
        check(other, want(&pos, 500.0, None), "other base");
        check(
            with_factors,
            want(&pos, 10000.0, Some(&factors)),
            "frequency factors",
        );
        check(moved, want(&new_pos, 10000.0, None), "positions rewritten");
        assert_eq!(g.read(&out, first), g.read(&out, again));
    }
}

#[test]
fn rope_over_more_tokens_than_a_table_holds_builds_each_cache_per_token() {
    // Two rotated dimensions: four floats per token in a table, so just over 2^20 tokens
    // pass the 2^22-float bound and each thread builds one token's cache at a time.
    let mut rng = Rng::new(64);
    let ne = [2, 1, (1 << 20) + 1, 1];
    let x = rng.values(ne.iter().product(), 1.0);
    let pos: Vec<i64> = (0..ne[2]).map(|_| rng.below(1000) as i64).collect();
    let mut g = G::new();
    let a = g.input(ty::F32, ne, &x);
    let p = g.ids(ty::I32, [ne[2], 1, 1, 1], &pos);
    let r = g.node(Op::ROPE, ty::F32, ne, &[a, p], &rope_params(2, 0, 0));
    let out = g.run(2).unwrap();
    let want = rope_reference(
        &x,
        ne,
        &pos,
        2,
        0,
        10000.0,
        1.0,
        0.0,
        1.0,
        4096.0,
        (32.0, 1.0),
        None,
        0,
    );
    assert_close(&g.read(&out, r), &want, 1e-9, "rope over 2^20 + 1 tokens");
}

#[test]
fn soft_max_with_mask_broadcast_alibi_and_sinks() {
    let mut rng = Rng::new(17);
    for round in 0..6 {
        let ne = [19, 4, 6, 2];
        let x = rng.values(ne.iter().product(), 4.0);
        let scale = 0.7f32;
        let max_bias = if round >= 3 { 8.0f32 } else { 0.0 };
        let mask_type = if round % 2 == 0 { ty::F16 } else { ty::F32 };
        let (m2, m3) = [(1, 1), (3, 2), (6, 1)][round % 3];
        let mne = [19, 5, m2, m3];
        let mut mask: Vec<f32> = rng.values(mne.iter().product(), 2.0);
        mask[3] = f32::NEG_INFINITY;
        let sinks = rng.values(6, 1.0);
        let mut g = G::new();
        let a = g.input(ty::F32, ne, &x);
        let mt = g.input(mask_type, mne, &mask);
        let st = if round >= 2 {
            g.input(ty::F32, [6, 1, 1, 1], &sinks)
        } else {
            NONE
        };
        let sm = g.node(
            Op::SOFT_MAX,
            ty::F32,
            ne,
            &[a, mt, st],
            &[f(scale), f(max_bias)],
        );
        let out = g.run(3).unwrap();
        let mask = stored(mask_type, &mask);
        let n_head_log2 = 4.0f64; // 1 << floor(log2(6))
        let mut want = vec![0.0f64; x.len()];
        for i3 in 0..2 {
            for i2 in 0..6 {
                let slope = if max_bias > 0.0 {
                    let h = i2 as f64;
                    if h < n_head_log2 {
                        2f64.powf(-f64::from(max_bias) / n_head_log2).powf(h + 1.0)
                    } else {
                        2f64.powf(-f64::from(max_bias) / 2.0 / n_head_log2)
                            .powf(2.0 * (h - n_head_log2) + 1.0)
                    }
                } else {
                    1.0
                };
                for i1 in 0..4 {
                    let w: Vec<f64> = (0..19)
                        .map(|i0| {
                            f64::from(x[at(ne, [i0, i1, i2, i3])]) * f64::from(scale)
                                + slope * f64::from(mask[at(mne, [i0, i1, i2 % m2, i3 % m3])])
                        })
                        .collect();
                    let sink = (round >= 2).then(|| f64::from(sinks[i2]));
                    let max = w
                        .iter()
                        .cloned()
                        .chain(sink)
                        .fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = w.iter().map(|v| (v - max).exp()).sum::<f64>()
                        + sink.map_or(0.0, |s| (s - max).exp());
                    for i0 in 0..19 {
                        want[at(ne, [i0, i1, i2, i3])] = (w[i0] - max).exp() / sum;
                    }
                }
            }
        }
        assert_close(
            &g.read(&out, sm),
            &want,
            1e-11,
            &format!("soft_max round {round}"),
        );
    }
}

#[test]
fn soft_max_may_write_over_its_mask() {
    // ggml's allocator may give SOFT_MAX the mask's bytes when they have its layout
    let x: Vec<f32> = (0..24).map(|i| (i % 7) as f32 * 0.3).collect();
    let m: Vec<f32> = (0..24)
        .map(|i| {
            if i % 5 == 0 {
                f32::NEG_INFINITY
            } else {
                i as f32 * 0.01
            }
        })
        .collect();
    let mut g = G::new();
    let a = g.input(ty::F32, [6, 4, 1, 1], &x);
    let mt = g.input(ty::F32, [6, 4, 1, 1], &m);
    let sm = g.node_into(Op::SOFT_MAX, mt, &[a, mt], &[f(0.5), f(0.0)]);
    let out = g.run(2).unwrap();
    let mut want = Vec::new();
    for (xr, mr) in x.chunks(6).zip(m.chunks(6)) {
        let w: Vec<f64> = xr
            .iter()
            .zip(mr)
            .map(|(&x, &m)| f64::from(x) * 0.5 + f64::from(m))
            .collect();
        let max = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = w.iter().map(|v| (v - max).exp()).sum();
        want.extend(w.iter().map(|v| (v - max).exp() / sum));
    }
    assert_close(&g.read(&out, sm), &want, 1e-12, "soft_max over its mask");
}

#[allow(clippy::too_many_arguments)]
fn attention_reference(
    q: &[f32],
    qne: [usize; 4],
    k: &[f32],
    kne: [usize; 4],
    v: &[f32],
    vne: [usize; 4],
    mask: Option<(&[f32], [usize; 4])>,
    sinks: Option<&[f32]>,
    scale: f64,
    max_bias: f64,
    softcap: f64,
) -> Vec<f64> {
    let (dk, n_q, n_head, ne3) = (qne[0], qne[1], qne[2], qne[3]);
    let (dv, n_kv) = (vne[0], kne[1]);
    let dne = [dv, n_head, n_q, ne3];
    let mut out = vec![0.0; dv * n_head * n_q * ne3];
    let n_head_log2 = 1usize << (n_head as f64).log2().floor() as u32;
    for i3 in 0..ne3 {
        for h in 0..n_head {
            let slope = if max_bias > 0.0 {
                let hl = n_head_log2 as f64;
                if h < n_head_log2 {
                    2f64.powf(-max_bias / hl).powf(h as f64 + 1.0)
                } else {
                    2f64.powf(-max_bias / 2.0 / hl)
                        .powf(2.0 * (h - n_head_log2) as f64 + 1.0)
                }
            } else {
                1.0
            };
            let (kh, k3) = (h / (n_head / kne[2]), i3 / (ne3 / kne[3]));
            let (vh, v3) = (h / (n_head / vne[2]), i3 / (ne3 / vne[3]));
            for iq in 0..n_q {
                let mut s = vec![f64::NEG_INFINITY; n_kv];
                for (c, sc) in s.iter_mut().enumerate() {
                    let mv = mask.map_or(0.0, |(m, mne)| {
                        slope * f64::from(m[at(mne, [c, iq, h % mne[2], i3 % mne[3]])])
                    });
                    if mv == f64::NEG_INFINITY {
                        continue;
                    }
                    let mut d: f64 = (0..dk)
                        .map(|j| {
                            f64::from(q[at(qne, [j, iq, h, i3])])
                                * f64::from(k[at(kne, [j, c, kh, k3])])
                        })
                        .sum::<f64>()
                        * scale;
                    if softcap != 0.0 {
                        d = softcap * (d / softcap).tanh();
                    }
                    *sc = d + mv;
                }
                let sink = sinks.map(|s| f64::from(s[h]));
                let max = s
                    .iter()
                    .cloned()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let sum: f64 = s.iter().map(|x| (x - max).exp()).sum::<f64>()
                    + sink.map_or(0.0, |x| (x - max).exp());
                for d in 0..dv {
                    let acc: f64 = (0..n_kv)
                        .map(|c| (s[c] - max).exp() * f64::from(v[at(vne, [d, c, vh, v3])]))
                        .sum();
                    out[at(dne, [d, h, iq, i3])] = acc / sum;
                }
            }
        }
    }
    out
}

#[test]
fn flash_attn_ext_with_gqa_mask_softcap_alibi_and_sinks() {
    let mut rng = Rng::new(18);
    // few queries (one query row at a time), then 64 or more: ggml's tiled path, with tiles
    // of queries and of keys that end early (130 queries over threads, 150 keys)
    for (round, tiled) in (0..6).flat_map(|round| [(round, false), (round, true)]) {
        let (n_q, n_kv) = if tiled {
            (64 + 13 * round, 150)
        } else {
            (3 + round, 17)
        };
        let (dk, dv, n_head, n_head_kv) = (32, 24, 4, if round % 2 == 0 { 2 } else { 4 });
        let kv_type = if round < 4 { ty::F16 } else { ty::F32 };
        let qne = [dk, n_q, n_head, 1];
        let kne = [dk, n_kv, n_head_kv, 1];
        let vne = [dv, n_kv, n_head_kv, 1];
        let mne = [n_kv + 3, n_q + 1, 1, 1];
        let q = rng.values(qne.iter().product(), 1.0);
        let k = rng.values(kne.iter().product(), 1.0);
        let v = rng.values(vne.iter().product(), 1.0);
        let mut mask = rng.values(mne.iter().product(), 1.0);
        // causal-style -inf entries, one fully masked query row
        for iq in 0..n_q {
            for c in (n_kv - 4 + iq).min(n_kv)..n_kv {
                mask[at(mne, [c, iq, 0, 0])] = f32::NEG_INFINITY;
            }
        }
        for c in 0..n_kv {
            mask[at(mne, [c, 1, 0, 0])] = f32::NEG_INFINITY;
        }
        let sinks = rng.values(n_head, 1.0);
        let scale = 1.0 / (dk as f32).sqrt();
        let (max_bias, softcap) = match round {
            1 => (0.0, 5.0),
            2 => (8.0, 0.0),
            3 => (4.0, 20.0),
            _ => (0.0, 0.0),
        };
        let with_sinks = round >= 3;
        let mut g = G::new();
        // odd rounds read Q as llama.cpp passes it (a permuted [dk, n_head, n_q] tensor) and
        // K/V as views of a larger cache (row stride of two rows)
        let (qt, kt, vt) = if round % 2 == 1 {
            let mut qp = vec![0.0f32; q.len()];
            for h in 0..n_head {
                for iq in 0..n_q {
                    for j in 0..dk {
                        qp[j + dk * (h + n_head * iq)] = q[at(qne, [j, iq, h, 0])];
                    }
                }
            }
            let base = g.input(ty::F32, [dk, n_head, n_q, 1], &qp);
            let qt = g.permute(base, [0, 2, 1, 3]);
            let cache = |g: &mut G, t: u32, ne: [usize; 4], values: &[f32]| {
                let mut wide = vec![0.0f32; 2 * values.len()];
                for (r, row) in values.chunks(ne[0]).enumerate() {
                    wide[2 * r * ne[0]..(2 * r + 1) * ne[0]].copy_from_slice(row);
                }
                let big = g.input(t, [ne[0], 2 * ne[1], ne[2], 1], &wide);
                let es = type_size(t).1;
                g.view(
                    big,
                    ne,
                    [
                        es,
                        2 * ne[0] * es,
                        2 * ne[0] * ne[1] * es,
                        2 * ne[0] * ne[1] * ne[2] * es,
                    ],
                    0,
                )
            };
            let kt = cache(&mut g, kv_type, kne, &k);
            let vt = cache(&mut g, kv_type, vne, &v);
            (qt, kt, vt)
        } else {
            let qt = g.input(ty::F32, qne, &q);
            let kt = g.input(kv_type, kne, &k);
            let vt = g.input(kv_type, vne, &v);
            (qt, kt, vt)
        };
        let mt = g.input(ty::F16, mne, &mask);
        let st = if with_sinks {
            g.input(ty::F32, [n_head, 1, 1, 1], &sinks)
        } else {
            NONE
        };
        let fa = g.node(
            Op::FLASH_ATTN_EXT,
            ty::F32,
            [dv, n_head, n_q, 1],
            &[qt, kt, vt, mt, st],
            &[f(scale), f(max_bias), f(softcap), 0],
        );
        let out = g.run(2).unwrap();
        let want = attention_reference(
            &q,
            qne,
            &stored(kv_type, &k),
            kne,
            &stored(kv_type, &v),
            vne,
            Some((&stored(ty::F16, &mask), mne)),
            with_sinks.then_some(&sinks[..]),
            f64::from(scale),
            f64::from(max_bias),
            f64::from(softcap),
        );
        // F16 K/V with few queries take ggml's one-row path: the query rounded to F16, V sums
        // kept in F16; everything else runs in f32
        let tolerance = if kv_type == ty::F16 && !tiled {
            1e-6
        } else {
            1e-10
        };
        assert_close(
            &g.read(&out, fa),
            &want,
            tolerance,
            &format!("flash_attn_ext round {round}, {n_q} queries"),
        );
    }
}

#[test]
fn flash_attn_ext_keeps_f16_value_sums_like_ggml_for_few_queries() {
    // Every key scores 0, every value is 1: the exact output is 1. ggml's one-row path (fewer
    // than 64 queries) sums V in F16, which stops growing at 2048 (2048 + 1 rounds back to
    // 2048), while the weights' sum reaches n_kv in f32: it gives 2048 / n_kv. Its tiled path
    // (64 queries or more) sums in f32 and gives 1.
    let (d, n_kv) = (8, 3000);
    for (n_q, want) in [(1, 2048.0 / 3000.0), (63, 2048.0 / 3000.0), (64, 1.0)] {
        let mut g = G::new();
        let q = g.input(ty::F32, [d, n_q, 1, 1], &vec![0.0; d * n_q]);
        let k = g.input(ty::F16, [d, n_kv, 1, 1], &vec![0.5; d * n_kv]);
        let v = g.input(ty::F16, [d, n_kv, 1, 1], &vec![1.0; d * n_kv]);
        let fa = g.node(
            Op::FLASH_ATTN_EXT,
            ty::F32,
            [d, 1, n_q, 1],
            &[q, k, v],
            &[f(1.0), f(0.0), f(0.0), 0],
        );
        let out = g.run(2).unwrap();
        for (i, got) in g.read(&out, fa).into_iter().enumerate() {
            assert!(
                (got - want).abs() < 1e-6,
                "n_q {n_q} element {i}: {got} != {want}"
            );
        }
    }
}

#[test]
fn diag_mask_inf_in_place() {
    let x: Vec<f32> = (0..6 * 4 * 2).map(|i| i as f32).collect();
    let mut g = G::new();
    let a = g.input(ty::F32, [6, 4, 2, 1], &x);
    let masked = g.node_into(Op::DIAG_MASK_INF, a, &[a], &[1]);
    let out = g.run(1).unwrap();
    let want: Vec<f64> = all([6, 4, 2, 1])
        .map(|[i0, i1, i2, _]| {
            if i0 > 1 + i1 {
                f64::NEG_INFINITY
            } else {
                f64::from(x[at([6, 4, 2, 1], [i0, i1, i2, 0])])
            }
        })
        .collect();
    assert_close(&g.read(&out, masked), &want, 0.0, "diag_mask_inf");
}
