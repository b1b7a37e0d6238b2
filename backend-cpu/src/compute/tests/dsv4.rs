//! Tests of LIGHTNING_INDEXER, DSV4_HC_COMB, DSV4_HC_PRE and DSV4_HC_POST: results against
//! naive f64 references written here (several shapes, key types, broadcast masks, strided and
//! transposed sources), the same bytes from one and three threads, and refusals of malformed
//! nodes before anything is written.

use proto_core::ggml::types::id as ty;
use proto_core::ggml::Op;
use proto_core::graph::TensorIndex;
use proto_core::ErrorKind;

use super::{assert_close, assert_refused, contiguous_nb, f, stored, Rng, G};
use crate::compute::quant;

/// Runs `g` on one and on three threads, checks that the bytes agree, returns them.
fn run_both(g: &G, what: &str) -> Vec<u8> {
    let one = g.run(1).unwrap();
    let three = g.run(3).unwrap();
    assert!(one == three, "{what}: 1 and 3 threads differ");
    one
}

/// Values `[n0, n1, n2, n3]` laid out in a tensor whose rows are `pad` elements longer, as a
/// view of the logical shape (strided rows; elements still adjacent).
fn padded_rows(g: &mut G, ne: [usize; 4], values: &[f32], pad: usize) -> TensorIndex {
    let wide = [ne[0] + pad, ne[1], ne[2], ne[3]];
    let mut backing = vec![9.0f32; wide.iter().product()];
    for (r, row) in values.chunks(ne[0]).enumerate() {
        backing[r * wide[0]..r * wide[0] + ne[0]].copy_from_slice(row);
    }
    let base = g.input(ty::F32, wide, &backing);
    g.view(base, ne, contiguous_nb(ty::F32, wide), 0)
}

// --- LIGHTNING_INDEXER -----------------------------------------------------------------------

/// One indexer node's sizes.
#[derive(Debug, Clone, Copy)]
struct Indexer {
    width: usize,
    heads: usize,
    n_kv: usize,
    tokens: usize,
    streams: usize,
    mask_streams: usize,
}

/// Keys as the graph stores them (bytes) and as their values (after rounding).
fn stored_keys(key_type: u32, values: &[f32], width: usize) -> (Vec<u8>, Vec<f32>) {
    match key_type {
        ty::F32 | ty::F16 | ty::BF16 => {
            let rounded = stored(key_type, values);
            let bytes = match key_type {
                ty::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                ty::F16 => values
                    .iter()
                    .flat_map(|&v| crate::compute::view::f32_to_f16(v).to_le_bytes())
                    .collect(),
                _ => values
                    .iter()
                    .flat_map(|&v| crate::compute::view::f32_to_bf16(v).to_le_bytes())
                    .collect(),
            };
            (bytes, rounded)
        }
        quantized => {
            let row_bytes = quant::row_size(quantized, width).expect("a quantized row");
            let mut bytes = vec![0u8; values.len() / width * row_bytes];
            let mut back = vec![0.0f32; values.len()];
            for ((row, out), dequantized) in values
                .chunks(width)
                .zip(bytes.chunks_mut(row_bytes))
                .zip(back.chunks_mut(width))
            {
                quant::quantize_row(quantized, row, out).unwrap();
                quant::dequantize_row(quantized, out, dequantized).unwrap();
            }
            (bytes, back)
        }
    }
}

/// `out[ik, t, s] = sum_h max(q[h, t, s] · k[ik, s], 0) * w[h, t, s] + mask[ik, t, s % S']`.
fn indexer_reference(p: &Indexer, q: &[f32], k: &[f32], w: &[f32], mask: &[f32]) -> Vec<f64> {
    let Indexer {
        width: d,
        heads,
        n_kv,
        tokens,
        streams,
        mask_streams,
        ..
    } = *p;
    let mut out = Vec::with_capacity(n_kv * tokens * streams);
    for s in 0..streams {
        for t in 0..tokens {
            for ik in 0..n_kv {
                let key = &k[(s * n_kv + ik) * d..][..d];
                let mut score = 0.0f64;
                for h in 0..heads {
                    let query = &q[((s * tokens + t) * heads + h) * d..][..d];
                    let qk: f64 = query
                        .iter()
                        .zip(key)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    score += qk.max(0.0) * f64::from(w[(s * tokens + t) * heads + h]);
                }
                let m = mask[((s % mask_streams) * tokens + t) * n_kv + ik];
                out.push(score + f64::from(m));
            }
        }
    }
    out
}

#[test]
fn lightning_indexer_adds_relu_scores_of_every_head_and_the_mask() {
    let mut rng = Rng::new(401);
    let cases = [
        (4, 1, 1, 1, 1, 1, ty::F32, false),
        (16, 3, 7, 5, 2, 1, ty::F16, true),
        (32, 4, 9, 3, 4, 2, ty::Q8_0, false),
        (64, 2, 5, 4, 3, 3, ty::BF16, true),
        (32, 5, 65, 2, 1, 1, ty::Q4_0, false),
        (64, 6, 12, 6, 2, 2, ty::F32, false),
        // empty rows: every dot product is 0, the scores are the mask
        (0, 2, 3, 2, 1, 1, ty::F32, false),
    ];
    for (width, heads, n_kv, tokens, streams, mask_streams, key_type, strided_q) in cases {
        let p = Indexer {
            width,
            heads,
            n_kv,
            tokens,
            streams,
            mask_streams,
        };
        let what = format!("{p:?}, keys of type {key_type}, strided q {strided_q}");
        let q_ne = [width, heads, tokens, streams];
        let q = rng.values(q_ne.iter().product(), 1.0);
        let (k_bytes, k) = stored_keys(key_type, &rng.values(width * n_kv * streams, 1.0), width);
        let w = rng.values(heads * tokens * streams, 1.0);
        // a causal-style mask: some keys hidden (-inf), the others biased
        let mask: Vec<f32> = (0..n_kv * tokens * mask_streams)
            .map(|i| {
                if rng.below(5) == 0 {
                    f32::NEG_INFINITY
                } else {
                    (i % 7) as f32 * 0.25 - 0.5
                }
            })
            .collect();
        let mut g = G::new();
        let q_t = if strided_q {
            padded_rows(&mut g, q_ne, &q, 3)
        } else {
            g.input(ty::F32, q_ne, &q)
        };
        let k_t = g.input_bytes(key_type, [width, 1, n_kv, streams], &k_bytes);
        let w_t = g.input(ty::F32, [heads, tokens, 1, streams], &w);
        let m_t = g.input(ty::F16, [n_kv, tokens, 1, mask_streams], &mask);
        let out = g.node(
            Op::LIGHTNING_INDEXER,
            ty::F32,
            [n_kv, tokens, 1, streams],
            &[q_t, k_t, w_t, m_t],
            &[],
        );
        let bytes = run_both(&g, &what);
        let want = indexer_reference(&p, &q, &k, &w, &stored(ty::F16, &mask));
        assert_close(&g.read(&bytes, out), &want, 1e-10, &what);
    }
}

// --- DSV4_HC_COMB ----------------------------------------------------------------------------

/// The mixing matrices `[dst + 4 * src]` of every token, in f64.
fn comb_reference(
    mixes: &[f32],
    scale: f32,
    base: &[f32],
    eps: f64,
    iterations: usize,
) -> Vec<f64> {
    let mut out = Vec::new();
    for token in mixes.chunks(24) {
        let mut m = [[0.0f64; 4]; 4]; // m[src][dst]
        for (src, column) in m.iter_mut().enumerate() {
            for (dst, v) in column.iter_mut().enumerate() {
                let i = 8 + dst + 4 * src;
                *v = f64::from(token[i]) * f64::from(scale) + f64::from(base[i]);
            }
            let max = column.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = column.iter().map(|v| (v - max).exp()).sum();
            for v in column.iter_mut() {
                *v = (*v - max).exp() / sum + eps;
            }
        }
        let over_src = |m: &mut [[f64; 4]; 4]| {
            for dst in 0..4 {
                let sum = eps + (0..4).map(|src| m[src][dst]).sum::<f64>();
                for column in m.iter_mut() {
                    column[dst] /= sum;
                }
            }
        };
        let over_dst = |m: &mut [[f64; 4]; 4]| {
            for column in m.iter_mut() {
                let sum = eps + column.iter().sum::<f64>();
                for v in column.iter_mut() {
                    *v /= sum;
                }
            }
        };
        over_src(&mut m);
        for _ in 1..iterations {
            over_dst(&mut m);
            over_src(&mut m);
        }
        out.extend(m.iter().flatten());
    }
    out
}

#[test]
fn hc_comb_gives_each_token_a_softmaxed_then_alternately_normalized_matrix() {
    let mut rng = Rng::new(402);
    // (tokens, iterations, eps, scale length, mixes through strided rows)
    for (tokens, iterations, eps, scale_len, strided) in [
        (1, 1, 1e-6f32, 3, false),
        (5, 4, 1e-6, 3, true),
        (17, 20, 1e-6, 5, false),
        (9, 2, 0.01, 3, true),
    ] {
        let what = format!("{tokens} tokens, {iterations} iterations, eps {eps}");
        let mixes = rng.values(24 * tokens, 2.0);
        let scale = rng.values(scale_len, 0.5);
        let base = rng.values(24, 0.25);
        let mut g = G::new();
        let mixes_t = if strided {
            padded_rows(&mut g, [24, tokens, 1, 1], &mixes, 5)
        } else {
            g.input(ty::F32, [24, tokens, 1, 1], &mixes)
        };
        let scale_t = g.input(ty::F32, [scale_len, 1, 1, 1], &scale);
        let base_t = g.input(ty::F32, [24, 1, 1, 1], &base);
        let out = g.node(
            Op::DSV4_HC_COMB,
            ty::F32,
            [4, 4, tokens, 1],
            &[mixes_t, scale_t, base_t],
            &[f(eps), iterations as i32],
        );
        let bytes = run_both(&g, &what);
        let want = comb_reference(&mixes, scale[2], &base, f64::from(eps), iterations);
        assert_close(&g.read(&bytes, out), &want, 1e-10, &what);
        // many rounds leave the matrix (nearly) doubly stochastic
        if iterations >= 20 {
            for matrix in g.read(&bytes, out).chunks(16) {
                for i in 0..4 {
                    let column: f32 = matrix[4 * i..4 * i + 4].iter().sum();
                    let row: f32 = (0..4).map(|j| matrix[i + 4 * j]).sum();
                    assert!((column - 1.0).abs() < 1e-3 && (row - 1.0).abs() < 1e-3);
                }
            }
        }
    }
}

// --- DSV4_HC_PRE -----------------------------------------------------------------------------

/// `out[i, t] = scale * sum_h x[i, h, t] * w`, `w = weights[h, t]` or `sigmoid(gate[i, h, t])`.
fn pre_reference(
    x: &[f32],
    weights: &[f32],
    [n_embd, streams, tokens]: [usize; 3],
    scale: f32,
    gated: bool,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(n_embd * tokens);
    for t in 0..tokens {
        for i in 0..n_embd {
            let sum: f64 = (0..streams)
                .map(|h| {
                    let at = (t * streams + h) * n_embd + i;
                    let w = if gated {
                        1.0 / (1.0 + (-f64::from(weights[at])).exp())
                    } else {
                        f64::from(weights[t * streams + h])
                    };
                    f64::from(x[at]) * w
                })
                .sum();
            out.push(f64::from(scale) * sum);
        }
    }
    out
}

#[test]
fn hc_pre_folds_the_streams_by_weight_or_by_sigmoid_gate() {
    let mut rng = Rng::new(403);
    // (n_embd, streams, tokens, gated, scale, x stored token-major and permuted)
    for (n_embd, streams, tokens, gated, scale, permuted) in [
        (1, 4, 1, false, 1.0f32, false),
        (31, 4, 17, false, 1.0, true),
        (31, 4, 17, true, 0.25, false),
        (128, 1, 3, true, 1.0, true),
        (40, 3, 5, false, 0.5, false),
        (16, 65, 2, true, 1.0 / 65.0, true),
    ] {
        let what = format!("n_embd {n_embd}, {streams} streams, {tokens} tokens, gated {gated}");
        let x = rng.values(n_embd * streams * tokens, 1.0);
        let weights = if gated {
            rng.values(n_embd * streams * tokens, 4.0)
        } else {
            rng.values(streams * tokens, 1.0)
                .iter()
                .map(|v| v * 0.5 + 0.5)
                .collect()
        };
        let mut g = G::new();
        let x_ne = [n_embd, streams, tokens, 1];
        let x_t = if permuted {
            // stored [n_embd, tokens, streams], read through a permutation of it
            let mut swapped = vec![0.0f32; x.len()];
            for t in 0..tokens {
                for h in 0..streams {
                    let from = (t * streams + h) * n_embd;
                    let to = (h * tokens + t) * n_embd;
                    swapped[to..to + n_embd].copy_from_slice(&x[from..from + n_embd]);
                }
            }
            let base = g.input(ty::F32, [n_embd, tokens, streams, 1], &swapped);
            g.permute(base, [0, 2, 1, 3])
        } else {
            g.input(ty::F32, x_ne, &x)
        };
        let w_ne = if gated { x_ne } else { [streams, tokens, 1, 1] };
        let w_t = g.input(ty::F32, w_ne, &weights);
        let out = g.node(
            Op::DSV4_HC_PRE,
            ty::F32,
            [n_embd, tokens, 1, 1],
            &[x_t, w_t],
            &[f(scale), i32::from(gated)],
        );
        let bytes = run_both(&g, &what);
        let want = pre_reference(&x, &weights, [n_embd, streams, tokens], scale, gated);
        assert_close(&g.read(&bytes, out), &want, 1e-10, &what);
    }
}

// --- DSV4_HC_POST ----------------------------------------------------------------------------

/// `out[i, dst, t] = x[i, t] * post[dst, t] + sum_src residual[i, src, t] * comb[dst, src, t]`
/// (identity mixing without `comb`).
fn post_reference(
    x: &[f32],
    residual: &[f32],
    post: &[f32],
    comb: Option<&[f32]>,
    [n_embd, streams, tokens]: [usize; 3],
) -> Vec<f64> {
    let mut out = Vec::with_capacity(n_embd * streams * tokens);
    for t in 0..tokens {
        for dst in 0..streams {
            for i in 0..n_embd {
                let spread = f64::from(x[t * n_embd + i]) * f64::from(post[t * streams + dst]);
                let mixed: f64 = match comb {
                    Some(comb) => (0..streams)
                        .map(|src| {
                            f64::from(residual[(t * streams + src) * n_embd + i])
                                * f64::from(comb[(t * streams + src) * streams + dst])
                        })
                        .sum(),
                    None => f64::from(residual[(t * streams + dst) * n_embd + i]),
                };
                out.push(spread + mixed);
            }
        }
    }
    out
}

#[test]
fn hc_post_spreads_the_output_and_mixes_the_residual_streams() {
    let mut rng = Rng::new(404);
    // (n_embd, streams, tokens, with comb, comb stored transposed)
    for (n_embd, streams, tokens, with_comb, transposed) in [
        (1, 4, 1, true, false),
        (31, 4, 17, true, true),
        (31, 4, 17, false, false),
        (64, 1, 3, true, false),
        (20, 3, 6, true, true),
        (9, 5, 2, false, false),
    ] {
        let what = format!("n_embd {n_embd}, {streams} streams, {tokens} tokens, comb {with_comb}");
        let x = rng.values(n_embd * tokens, 1.0);
        let residual = rng.values(n_embd * streams * tokens, 1.0);
        let post: Vec<f32> = rng
            .values(streams * tokens, 1.0)
            .iter()
            .map(|v| v + 1.0)
            .collect();
        let comb: Vec<f32> = rng
            .values(streams * streams * tokens, 0.5)
            .iter()
            .map(|v| v + 0.5)
            .collect();
        let mut g = G::new();
        let x_t = g.input(ty::F32, [n_embd, tokens, 1, 1], &x);
        let r_t = g.input(ty::F32, [n_embd, streams, tokens, 1], &residual);
        let p_t = g.input(ty::F32, [streams, tokens, 1, 1], &post);
        let mut srcs = vec![x_t, r_t, p_t];
        if with_comb {
            let c_t = if transposed {
                let mut swapped = vec![0.0f32; comb.len()];
                for t in 0..tokens {
                    for src in 0..streams {
                        for dst in 0..streams {
                            swapped[(t * streams + dst) * streams + src] =
                                comb[(t * streams + src) * streams + dst];
                        }
                    }
                }
                let base = g.input(ty::F32, [streams, streams, tokens, 1], &swapped);
                g.permute(base, [1, 0, 2, 3])
            } else {
                g.input(ty::F32, [streams, streams, tokens, 1], &comb)
            };
            srcs.push(c_t);
        }
        let out = g.node(
            Op::DSV4_HC_POST,
            ty::F32,
            [n_embd, streams, tokens, 1],
            &srcs,
            &[],
        );
        let bytes = run_both(&g, &what);
        let comb = with_comb.then_some(comb.as_slice());
        let want = post_reference(&x, &residual, &post, comb, [n_embd, streams, tokens]);
        assert_close(&g.read(&bytes, out), &want, 1e-10, &what);
    }
}

// --- refusals --------------------------------------------------------------------------------

/// What a malformed node breaks, the error it gets, and how to build it.
type Malformed = (&'static str, ErrorKind, Box<dyn Fn(&mut G)>);

/// A well-formed indexer's sources with the given changes: q `{8, 2, 3, 2}`, k F16
/// `{8, 1, 5, 2}`, weights `{2, 3, 1, 2}`, mask F16 `{5, 3, 1, 1}`.
fn indexer_node(
    g: &mut G,
    k_ne: [usize; 4],
    mask_type: u32,
    mask_ne: [usize; 4],
    dst_ne: [usize; 4],
) {
    let q = g.input(ty::F32, [8, 2, 3, 2], &[0.5; 96]);
    let k = g.input(ty::F16, k_ne, &vec![0.5; k_ne.iter().product()]);
    let w = g.input(ty::F32, [2, 3, 1, 2], &[1.0; 12]);
    let m = g.input(mask_type, mask_ne, &vec![0.0; mask_ne.iter().product()]);
    g.node(Op::LIGHTNING_INDEXER, ty::F32, dst_ne, &[q, k, w, m], &[]);
}

/// A DSV4_HC_COMB node over `mixes` of shape `mixes_ne`, with `op_params` `params`.
fn comb_node(g: &mut G, mixes_ne: [usize; 4], dst_ne: [usize; 4], params: &[i32]) {
    let mixes = g.input(ty::F32, mixes_ne, &vec![0.1; mixes_ne.iter().product()]);
    let scale = g.input(ty::F32, [3, 1, 1, 1], &[1.0; 3]);
    let base = g.input(ty::F32, [mixes_ne[0], 1, 1, 1], &vec![0.0; mixes_ne[0]]);
    g.node(
        Op::DSV4_HC_COMB,
        ty::F32,
        dst_ne,
        &[mixes, scale, base],
        params,
    );
}

#[test]
fn malformed_dsv4_nodes_are_refused_before_anything_is_written() {
    let cases: Vec<Malformed> = vec![
        (
            "indexer: keys with two rows per position",
            ErrorKind::InvalidGraph,
            Box::new(|g| indexer_node(g, [8, 2, 5, 2], ty::F16, [5, 3, 1, 1], [5, 3, 1, 2])),
        ),
        (
            "indexer: keys of another width",
            ErrorKind::InvalidGraph,
            Box::new(|g| indexer_node(g, [4, 1, 5, 2], ty::F16, [5, 3, 1, 1], [5, 3, 1, 2])),
        ),
        (
            "indexer: mask shorter than the keys",
            ErrorKind::InvalidGraph,
            Box::new(|g| indexer_node(g, [8, 1, 5, 2], ty::F16, [4, 3, 1, 1], [5, 3, 1, 2])),
        ),
        (
            "indexer: mask streams not dividing the streams",
            ErrorKind::InvalidGraph,
            Box::new(|g| indexer_node(g, [8, 1, 5, 2], ty::F16, [5, 3, 1, 3], [5, 3, 1, 2])),
        ),
        (
            "indexer: destination of the wrong shape",
            ErrorKind::InvalidGraph,
            Box::new(|g| indexer_node(g, [8, 1, 5, 2], ty::F16, [5, 3, 1, 1], [5, 3, 2, 1])),
        ),
        (
            "indexer: F32 mask",
            ErrorKind::OpRefused,
            Box::new(|g| indexer_node(g, [8, 1, 5, 2], ty::F32, [5, 3, 1, 1], [5, 3, 1, 2])),
        ),
        (
            "indexer: I32 keys",
            ErrorKind::OpRefused,
            Box::new(|g| {
                let q = g.input(ty::F32, [8, 2, 3, 1], &[0.5; 48]);
                let k = g.input(ty::I32, [8, 1, 5, 1], &[1.0; 40]);
                let w = g.input(ty::F32, [2, 3, 1, 1], &[1.0; 6]);
                let m = g.input(ty::F16, [5, 3, 1, 1], &[0.0; 15]);
                g.node(
                    Op::LIGHTNING_INDEXER,
                    ty::F32,
                    [5, 3, 1, 1],
                    &[q, k, w, m],
                    &[],
                );
            }),
        ),
        (
            "indexer: queries with strided elements",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let base = g.input(ty::F32, [2, 8, 3, 1], &[0.5; 48]);
                let q = g.permute(base, [1, 0, 2, 3]);
                let k = g.input(ty::F16, [8, 1, 5, 1], &[0.5; 40]);
                let w = g.input(ty::F32, [2, 3, 1, 1], &[1.0; 6]);
                let m = g.input(ty::F16, [5, 3, 1, 1], &[0.0; 15]);
                g.node(
                    Op::LIGHTNING_INDEXER,
                    ty::F32,
                    [5, 3, 1, 1],
                    &[q, k, w, m],
                    &[],
                );
            }),
        ),
        (
            "indexer: no mask",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let q = g.input(ty::F32, [8, 2, 3, 1], &[0.5; 48]);
                let k = g.input(ty::F16, [8, 1, 5, 1], &[0.5; 40]);
                let w = g.input(ty::F32, [2, 3, 1, 1], &[1.0; 6]);
                g.node(
                    Op::LIGHTNING_INDEXER,
                    ty::F32,
                    [5, 3, 1, 1],
                    &[q, k, w],
                    &[],
                );
            }),
        ),
        (
            "comb: three streams (15 mixes)",
            ErrorKind::InvalidGraph,
            Box::new(|g| comb_node(g, [15, 2, 1, 1], [3, 3, 2, 1], &[f(1e-6), 4])),
        ),
        (
            "comb: zero iterations",
            ErrorKind::InvalidGraph,
            Box::new(|g| comb_node(g, [24, 2, 1, 1], [4, 4, 2, 1], &[f(1e-6), 0])),
        ),
        (
            "comb: negative iterations",
            ErrorKind::InvalidGraph,
            Box::new(|g| comb_node(g, [24, 2, 1, 1], [4, 4, 2, 1], &[f(1e-6), -3])),
        ),
        (
            "comb: 3-D mixes",
            ErrorKind::InvalidGraph,
            Box::new(|g| comb_node(g, [24, 2, 2, 1], [4, 4, 2, 1], &[f(1e-6), 4])),
        ),
        (
            "comb: a scale of two values",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let mixes = g.input(ty::F32, [24, 2, 1, 1], &[0.1; 48]);
                let scale = g.input(ty::F32, [2, 1, 1, 1], &[1.0; 2]);
                let base = g.input(ty::F32, [24, 1, 1, 1], &[0.0; 24]);
                g.node(
                    Op::DSV4_HC_COMB,
                    ty::F32,
                    [4, 4, 2, 1],
                    &[mixes, scale, base],
                    &[f(1e-6), 4],
                );
            }),
        ),
        (
            "comb: F16 mixes",
            ErrorKind::OpRefused,
            Box::new(|g| {
                let mixes = g.input(ty::F16, [24, 2, 1, 1], &[0.1; 48]);
                let scale = g.input(ty::F32, [3, 1, 1, 1], &[1.0; 3]);
                let base = g.input(ty::F32, [24, 1, 1, 1], &[0.0; 24]);
                g.node(
                    Op::DSV4_HC_COMB,
                    ty::F32,
                    [4, 4, 2, 1],
                    &[mixes, scale, base],
                    &[f(1e-6), 4],
                );
            }),
        ),
        (
            "pre: no streams",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let x = g.zeros(ty::F32, [8, 0, 3, 1]);
                let w = g.zeros(ty::F32, [0, 3, 1, 1]);
                g.node(
                    Op::DSV4_HC_PRE,
                    ty::F32,
                    [8, 3, 1, 1],
                    &[x, w],
                    &[f(1.0), 0],
                );
            }),
        ),
        (
            "pre: per-stream weights for a gated node",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let x = g.input(ty::F32, [8, 4, 3, 1], &[0.5; 96]);
                let w = g.input(ty::F32, [4, 3, 1, 1], &[0.5; 12]);
                g.node(
                    Op::DSV4_HC_PRE,
                    ty::F32,
                    [8, 3, 1, 1],
                    &[x, w],
                    &[f(1.0), 1],
                );
            }),
        ),
        (
            "pre: 4-D x",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let x = g.input(ty::F32, [8, 4, 3, 2], &[0.5; 192]);
                let w = g.input(ty::F32, [4, 3, 1, 1], &[0.5; 12]);
                g.node(
                    Op::DSV4_HC_PRE,
                    ty::F32,
                    [8, 3, 1, 1],
                    &[x, w],
                    &[f(1.0), 0],
                );
            }),
        ),
        (
            "pre: F16 destination",
            ErrorKind::OpRefused,
            Box::new(|g| {
                let x = g.input(ty::F32, [8, 4, 3, 1], &[0.5; 96]);
                let w = g.input(ty::F32, [4, 3, 1, 1], &[0.5; 12]);
                g.node(
                    Op::DSV4_HC_PRE,
                    ty::F16,
                    [8, 3, 1, 1],
                    &[x, w],
                    &[f(1.0), 0],
                );
            }),
        ),
        (
            "post: residual of other tokens",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let x = g.input(ty::F32, [8, 3, 1, 1], &[0.5; 24]);
                let r = g.input(ty::F32, [8, 4, 2, 1], &[0.5; 64]);
                let p = g.input(ty::F32, [4, 3, 1, 1], &[1.0; 12]);
                g.node(Op::DSV4_HC_POST, ty::F32, [8, 4, 3, 1], &[x, r, p], &[]);
            }),
        ),
        (
            "post: comb of other streams",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let x = g.input(ty::F32, [8, 3, 1, 1], &[0.5; 24]);
                let r = g.input(ty::F32, [8, 4, 3, 1], &[0.5; 96]);
                let p = g.input(ty::F32, [4, 3, 1, 1], &[1.0; 12]);
                let c = g.input(ty::F32, [3, 4, 3, 1], &[0.1; 36]);
                g.node(Op::DSV4_HC_POST, ty::F32, [8, 4, 3, 1], &[x, r, p, c], &[]);
            }),
        ),
        (
            "post: F16 comb",
            ErrorKind::OpRefused,
            Box::new(|g| {
                let x = g.input(ty::F32, [8, 3, 1, 1], &[0.5; 24]);
                let r = g.input(ty::F32, [8, 4, 3, 1], &[0.5; 96]);
                let p = g.input(ty::F32, [4, 3, 1, 1], &[1.0; 12]);
                let c = g.input(ty::F16, [4, 4, 3, 1], &[0.1; 48]);
                g.node(Op::DSV4_HC_POST, ty::F32, [8, 4, 3, 1], &[x, r, p, c], &[]);
            }),
        ),
        (
            "post: no post weights",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let x = g.input(ty::F32, [8, 3, 1, 1], &[0.5; 24]);
                let r = g.input(ty::F32, [8, 4, 3, 1], &[0.5; 96]);
                g.node(Op::DSV4_HC_POST, ty::F32, [8, 4, 3, 1], &[x, r], &[]);
            }),
        ),
        (
            "post: in place over the residual",
            ErrorKind::InvalidGraph,
            Box::new(|g| {
                let x = g.input(ty::F32, [8, 3, 1, 1], &[0.5; 24]);
                let r = g.input(ty::F32, [8, 4, 3, 1], &[0.5; 96]);
                let p = g.input(ty::F32, [4, 3, 1, 1], &[1.0; 12]);
                g.node_into(Op::DSV4_HC_POST, r, &[x, r, p], &[]);
            }),
        ),
    ];
    for (what, kind, build) in cases {
        let mut g = G::new();
        build(&mut g);
        let error = g.run(2).unwrap_err();
        assert_eq!(error.kind(), kind, "{what}: {error}");
        assert_refused(&g, kind);
    }
}
