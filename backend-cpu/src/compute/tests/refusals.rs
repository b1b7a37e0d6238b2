//! Tests of the refusals, thread-count determinism and error paths.

use super::*;

// --- refusals and determinism --------------------------------------------------------------

#[test]
fn shape_rule_violations_are_refused_before_anything_is_written() {
    let bad_graphs: Vec<BadGraph> = vec![
        (
            "get_rows with mismatched batch dims",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 5, 2, 1], &[1.0; 40]);
                let r = g.ids(ty::I32, [2, 3, 1, 1], &[0; 6]);
                g.node(Op::GET_ROWS, ty::F32, [4, 2, 3, 1], &[a, r], &[]);
            }),
        ),
        (
            "get_rows with I64 ids",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 5, 1, 1], &[1.0; 20]);
                let r = g.ids(I64, [2, 1, 1, 1], &[0, 1]);
                g.node(Op::GET_ROWS, ty::F32, [4, 2, 1, 1], &[a, r], &[]);
            }),
        ),
        (
            "get_rows into a too short row",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [8, 5, 1, 1], &[1.0; 40]);
                let r = g.ids(ty::I32, [2, 1, 1, 1], &[0, 1]);
                g.node(Op::GET_ROWS, ty::F32, [4, 2, 1, 1], &[a, r], &[]);
            }),
        ),
        (
            "set_rows with more source rows than ids",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &[1.0; 12]);
                let r = g.ids(I64, [2, 1, 1, 1], &[0, 1]);
                let c = g.zeros(ty::F16, [4, 8, 1, 1]);
                g.node_into(Op::SET_ROWS, c, &[a, r], &[]);
            }),
        ),
        (
            "set_rows with a row width mismatch",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [8, 2, 1, 1], &[1.0; 16]);
                let r = g.ids(I64, [2, 1, 1, 1], &[0, 1]);
                let c = g.zeros(ty::F16, [4, 8, 1, 1]);
                g.node_into(Op::SET_ROWS, c, &[a, r], &[]);
            }),
        ),
        (
            "cpy with different element counts",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &[1.0; 12]);
                let c = g.zeros(ty::F32, [4, 4, 1, 1]);
                g.node_into(Op::CPY, c, &[a, c], &[]);
            }),
        ),
        (
            "mul_mat with different k",
            Box::new(|g: &mut G| {
                let w = g.input(ty::F32, [8, 3, 1, 1], &[1.0; 24]);
                let x = g.input(ty::F32, [4, 2, 1, 1], &[1.0; 8]);
                g.node(Op::MUL_MAT, ty::F32, [3, 2, 1, 1], &[w, x], &[]);
            }),
        ),
        (
            "mul_mat without broadcastable batches",
            Box::new(|g: &mut G| {
                let w = g.input(ty::F32, [4, 3, 2, 1], &[1.0; 24]);
                let x = g.input(ty::F32, [4, 2, 3, 1], &[1.0; 24]);
                g.node(Op::MUL_MAT, ty::F32, [3, 2, 3, 1], &[w, x], &[]);
            }),
        ),
        (
            "add with src1 not repeating into src0",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [6, 2, 1, 1], &[1.0; 12]);
                let b = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
                g.node(Op::ADD, ty::F32, [6, 2, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "add with a destination shape mismatch",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [6, 2, 1, 1], &[1.0; 12]);
                let b = g.input(ty::F32, [6, 1, 1, 1], &[1.0; 6]);
                g.node(Op::ADD, ty::F32, [6, 3, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "a source partially overlapping the destination",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 4, 1, 1], &[1.0; 16]);
                let rows = g.view(a, [4, 3, 1, 1], [4, 16, 48, 48], 0);
                let shifted = g.view(a, [4, 3, 1, 1], [4, 16, 48, 48], 16);
                g.node_into(Op::ADD, shifted, &[rows, rows], &[]);
            }),
        ),
        (
            "an in-place source for an op that cannot run in place",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 4, 1, 1], &[1.0; 16]);
                let b = g.input(ty::F32, [4, 4, 1, 1], &[1.0; 16]);
                g.node_into(Op::MUL_MAT, a, &[b, a], &[]);
            }),
        ),
        (
            "a destination whose elements overlap",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 4, 1, 1], &[1.0; 16]);
                let b = g.zeros(ty::F32, [4, 4, 1, 1]);
                let alias = g.view(b, [4, 4, 1, 1], [4, 0, 64, 64], 0);
                g.node_into(Op::CPY, alias, &[a, alias], &[]);
            }),
        ),
        (
            "soft_max with a short mask",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 4, 1, 1], &[1.0; 16]);
                let m = g.input(ty::F32, [4, 2, 1, 1], &[0.0; 8]);
                g.node(
                    Op::SOFT_MAX,
                    ty::F32,
                    [4, 4, 1, 1],
                    &[a, m],
                    &[f(1.0), f(0.0)],
                );
            }),
        ),
        (
            "rope with too few positions",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [8, 2, 4, 1], &[1.0; 64]);
                let p = g.ids(ty::I32, [3, 1, 1, 1], &[0, 1, 2]);
                g.node(
                    Op::ROPE,
                    ty::F32,
                    [8, 2, 4, 1],
                    &[a, p],
                    &[0, 8, 0, 0, 0, f(10000.0), f(1.0), 0, f(1.0), 0, 0],
                );
            }),
        ),
        (
            "rope with n_dims above ne0",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [8, 2, 1, 1], &[1.0; 16]);
                let p = g.ids(ty::I32, [1, 1, 1, 1], &[0]);
                g.node(
                    Op::ROPE,
                    ty::F32,
                    [8, 2, 1, 1],
                    &[a, p],
                    &[0, 10, 0, 0, 0, f(10000.0), f(1.0), 0, f(1.0), 0, 0],
                );
            }),
        ),
        (
            "flash attention with mismatched head sizes",
            Box::new(|g: &mut G| {
                let q = g.input(ty::F32, [8, 2, 2, 1], &[1.0; 32]);
                let k = g.input(ty::F16, [4, 3, 2, 1], &[1.0; 24]);
                let v = g.input(ty::F16, [8, 3, 2, 1], &[1.0; 48]);
                g.node(
                    Op::FLASH_ATTN_EXT,
                    ty::F32,
                    [8, 2, 2, 1],
                    &[q, k, v],
                    &[f(1.0), 0, 0, 0],
                );
            }),
        ),
        (
            "glu with a wrong output width",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [8, 2, 1, 1], &[1.0; 16]);
                g.node(Op::GLU, ty::F32, [8, 2, 1, 1], &[a], &[GluOp::SWIGLU.0, 0]);
            }),
        ),
        (
            "concat with mismatched sides",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 2, 1, 1], &[1.0; 8]);
                let b = g.input(ty::F32, [4, 3, 1, 1], &[1.0; 12]);
                g.node(Op::CONCAT, ty::F32, [8, 2, 1, 1], &[a, b], &[0]);
            }),
        ),
        (
            "concat of two quantized types",
            Box::new(|g: &mut G| {
                let a = g.input_bytes(ty::Q8_0, [32, 2, 1, 1], &[0; 68]);
                let b = g.input_bytes(ty::Q4_0, [32, 2, 1, 1], &[0; 36]);
                g.node(Op::CONCAT, ty::Q8_0, [64, 2, 1, 1], &[a, b], &[0]);
            }),
        ),
        (
            "quantized concat into another type",
            Box::new(|g: &mut G| {
                let a = g.input_bytes(ty::Q8_0, [32, 2, 1, 1], &[0; 68]);
                let b = g.input_bytes(ty::Q8_0, [32, 2, 1, 1], &[0; 68]);
                g.node(Op::CONCAT, ty::F32, [64, 2, 1, 1], &[a, b], &[0]);
            }),
        ),
        (
            "quantized concat with mismatched sides",
            Box::new(|g: &mut G| {
                let a = g.input_bytes(ty::Q8_0, [32, 2, 1, 1], &[0; 68]);
                let b = g.input_bytes(ty::Q8_0, [64, 2, 1, 1], &[0; 136]);
                g.node(Op::CONCAT, ty::Q8_0, [32, 4, 1, 1], &[a, b], &[1]);
            }),
        ),
        (
            "quantized concat with a wrong destination",
            Box::new(|g: &mut G| {
                let a = g.input_bytes(ty::Q8_0, [32, 2, 1, 1], &[0; 68]);
                let b = g.input_bytes(ty::Q8_0, [32, 2, 1, 1], &[0; 68]);
                g.node(Op::CONCAT, ty::Q8_0, [96, 2, 1, 1], &[a, b], &[0]);
            }),
        ),
        (
            "quantized concat of rows that are not whole blocks",
            Box::new(|g: &mut G| {
                let a = g.input_bytes(ty::Q8_0, [48, 1, 1, 1], &[0; 51]);
                let b = g.input_bytes(ty::Q8_0, [16, 1, 1, 1], &[0; 17]);
                g.node(Op::CONCAT, ty::Q8_0, [64, 1, 1, 1], &[a, b], &[0]);
            }),
        ),
        (
            "a missing source",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 2, 1, 1], &[1.0; 8]);
                g.node(Op::ADD, ty::F32, [4, 2, 1, 1], &[a], &[]);
            }),
        ),
        (
            "a negative epsilon",
            Box::new(|g: &mut G| {
                let a = g.input(ty::F32, [4, 2, 1, 1], &[1.0; 8]);
                g.node(Op::RMS_NORM, ty::F32, [4, 2, 1, 1], &[a], &[f(-1.0)]);
            }),
        ),
    ];
    for (what, build) in bad_graphs {
        let mut g = G::new();
        // a valid node first: the refusal must come before it runs
        let x = g.input(ty::F32, [4, 1, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
        g.node(Op::SQR, ty::F32, [4, 1, 1, 1], &[x], &[]);
        build(&mut g);
        let error = g.run(2).unwrap_err();
        assert!(
            matches!(error.kind(), ErrorKind::InvalidGraph | ErrorKind::OpRefused),
            "{what}: {error}"
        );
        assert_refused(&g, error.kind());
    }
}

#[test]
fn layouts_reaching_beyond_their_tensor_or_buffer_are_refused() {
    // a record whose byte size understates its strides (the decoder computes it, but the
    // engine does not rely on that)
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 4, 1, 1], &[1.0; 16]);
    let y = g.node(Op::SQR, ty::F32, [4, 4, 1, 1], &[a], &[]);
    g.tensors[a as usize].byte_size = 32;
    assert_refused(&g, ErrorKind::InvalidGraph);
    g.tensors[a as usize].byte_size = 64;
    // a tensor past the end of its buffer
    g.tensors[y as usize].location = Some(TensorLocation {
        buffer: g.buffer,
        offset: BUFFER_SIZE - 16,
    });
    assert_refused(&g, ErrorKind::InvalidGraph);
    // a tensor in memory the server does not own
    g.tensors[y as usize].location = None;
    assert_refused(&g, ErrorKind::InvalidGraph);
    // quantized blocks that are not adjacent
    let mut g = G::new();
    let w = g.input_bytes(ty::Q8_0, [64, 2, 1, 1], &[0u8; 136]);
    let x = g.input(ty::F32, [64, 1, 1, 1], &[1.0; 64]);
    g.tensors[w as usize].record.nb[0] = 17;
    g.node(Op::MUL_MAT, ty::F32, [2, 1, 1, 1], &[w, x], &[]);
    assert_refused(&g, ErrorKind::InvalidGraph);
}

#[test]
fn custom_and_unimplemented_ops_are_refused() {
    for op in [
        Op::MAP_CUSTOM1,
        Op::MAP_CUSTOM2,
        Op::MAP_CUSTOM3,
        Op::CUSTOM,
    ] {
        let mut g = G::new();
        let a = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
        g.node(op, ty::F32, [4, 1, 1, 1], &[a], &[]);
        assert_refused(&g, ErrorKind::OpRefused);
    }
    for op in [Op::WIN_UNPART, Op::GET_REL_POS, Op::WIN_PART, Op(1000)] {
        let mut g = G::new();
        let a = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
        g.node(op, ty::F32, [4, 1, 1, 1], &[a], &[]);
        assert_refused(&g, ErrorKind::OpRefused);
    }
    // unsupported type combinations and sub-ops
    let mut g = G::new();
    let a = g.input(ty::I32, [4, 1, 1, 1], &[1.0; 4]);
    g.node(Op::SOFT_MAX, ty::F32, [4, 1, 1, 1], &[a], &[f(1.0), 0]);
    assert_refused(&g, ErrorKind::OpRefused);
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
    g.node(
        Op::GLU,
        ty::F32,
        [2, 1, 1, 1],
        &[a],
        &[GluOp(7).0], // GGML_GLU_OP_COUNT: past ggml's GLU table
    );
    assert_refused(&g, ErrorKind::OpRefused);
    let mut g = G::new();
    let a = g.input(ty::F32, [32, 1, 1, 1], &[1.0; 32]);
    g.node(
        Op::CPY,
        12, /* Q4_K: no quantizer */
        [256, 1, 1, 1],
        &[a],
        &[],
    );
    assert_refused(&g, ErrorKind::InvalidGraph);
    // nodes without the COMPUTE flag are skipped, even with a custom op
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
    let c = g.node(Op::CUSTOM, ty::F32, [4, 1, 1, 1], &[a], &[]);
    g.tensors[c as usize].record.flags = 0;
    g.run(1).unwrap();
}

/// A graph of most kernels, big enough to be split across threads.
fn mixed_graph(rng: &mut Rng) -> G {
    let mut g = G::new();
    let (k, n, m, heads) = (128, 24, 96, 4);
    let x = g.input(ty::F32, [k, n, 1, 1], &rng.values(k * n, 1.0));
    let norm_w = g.input(ty::F32, [k, 1, 1, 1], &rng.values(k, 1.0));
    let h = g.node(Op::RMS_NORM, ty::F32, [k, n, 1, 1], &[x], &[f(1e-6)]);
    let h = g.node(Op::MUL, ty::F32, [k, n, 1, 1], &[h, norm_w], &[]);
    let wq = g.input(ty::F16, [k, k, 1, 1], &rng.values(k * k, 0.2));
    let q = g.node(Op::MUL_MAT, ty::F32, [k, n, 1, 1], &[wq, h], &[]);
    let mut q8 = vec![0u8; k * m / 32 * 34];
    for row in q8.chunks_mut(k / 32 * 34) {
        quant::quantize_row(ty::Q8_0, &rng.values(k, 0.2), row).unwrap();
    }
    let wk = g.input_bytes(ty::Q8_0, [k, m, 1, 1], &q8);
    let kk = g.node(Op::MUL_MAT, ty::F32, [m, n, 1, 1], &[wk, h], &[]);
    let pos: Vec<i64> = (0..n as i64).collect();
    let p = g.ids(ty::I32, [n, 1, 1, 1], &pos);
    let q_heads = g.view(
        q,
        [k / heads, heads, n, 1],
        [4, k / heads * 4, k * 4, k * n * 4],
        0,
    );
    let q_rope = g.node(
        Op::ROPE,
        ty::F32,
        [k / heads, heads, n, 1],
        &[q_heads, p],
        &[
            0,
            32,
            2,
            0,
            4096,
            f(10000.0),
            f(1.0),
            0,
            f(1.0),
            f(32.0),
            f(1.0),
        ],
    );
    let k_heads = g.view(
        kk,
        [k / heads, 3, n, 1],
        [4, k / heads * 4, m * 4, m * n * 4],
        0,
    );
    let k_rope = g.node(
        Op::ROPE,
        ty::F32,
        [k / heads, 3, n, 1],
        &[k_heads, p],
        &[
            0,
            32,
            0,
            0,
            4096,
            f(10000.0),
            f(1.0),
            0,
            f(1.0),
            f(32.0),
            f(1.0),
        ],
    );
    let k_cache = g.zeros(ty::F16, [k / heads, n, 3, 1]);
    let kp = g.permute(k_rope, [0, 2, 1, 3]);
    let kc = g.node_into(Op::CPY, k_cache, &[kp, k_cache], &[]);
    let qp = g.permute(q_rope, [0, 2, 1, 3]);
    let mut mask = vec![0.0f32; n * n];
    for i in 0..n {
        for j in i + 1..n {
            mask[i * n + j] = f32::NEG_INFINITY;
        }
    }
    let mt = g.input(ty::F16, [n, n, 1, 1], &mask);
    // grouped-query attention: 4 query heads over the first 2 of the 3 cached K/V heads
    let kv2 = g.view(
        kc,
        [k / heads, n, 2, 1],
        [2, k / heads * 2, k / heads * n * 2, k / heads * n * 6],
        0,
    );
    let fa = g.node(
        Op::FLASH_ATTN_EXT,
        ty::F32,
        [k / heads, heads, n, 1],
        &[qp, kv2, kv2, mt],
        &[f(0.2), 0, 0, 0],
    );
    let scores = g.node(Op::MUL_MAT, ty::F32, [n, n, heads, 1], &[kv2, qp], &[]);
    g.node(
        Op::SOFT_MAX,
        ty::F32,
        [n, n, heads, 1],
        &[scores, mt],
        &[f(0.2), f(0.0)],
    );
    let flat = g.view(fa, [k, n, 1, 1], [4, k * 4, k * n * 4, k * n * 4], 0);
    let wu = g.input(ty::BF16, [k, 2 * m, 1, 1], &rng.values(k * 2 * m, 0.2));
    let up = g.node(Op::MUL_MAT, ty::F32, [2 * m, n, 1, 1], &[wu, flat], &[]);
    let act = g.node(Op::GLU, ty::F32, [m, n, 1, 1], &[up], &[GluOp::SWIGLU.0, 0]);
    let emb = g.input(ty::F16, [m, 50, 1, 1], &rng.values(m * 50, 1.0));
    let ids: Vec<i64> = (0..n).map(|_| rng.below(50) as i64).collect();
    let idt = g.ids(ty::I32, [n, 1, 1, 1], &ids);
    let rows = g.node(Op::GET_ROWS, ty::F32, [m, n, 1, 1], &[emb, idt], &[]);
    let sum = g.node(Op::ADD, ty::F32, [m, n, 1, 1], &[act, rows], &[]);
    g.node(Op::UNARY, ty::F32, [m, n, 1, 1], &[sum], &[UnaryOp::GELU.0]);
    g
}

#[test]
fn thread_count_does_not_change_a_single_byte() {
    let mut rng = Rng::new(19);
    let g = mixed_graph(&mut rng);
    let one = g.run(1).unwrap();
    let graph = g.graph();
    let at = TensorLocation {
        buffer: g.buffer,
        offset: 0,
    };
    for threads in [2, 3, 4, 7, 16] {
        assert!(
            g.run(threads).unwrap() == one,
            "{threads} threads differ from one"
        );
        // every node split into as many parts as it has rows
        g.run(1).unwrap();
        g.pool
            .with_region_mut(at, g.image.len() as u64, |b| b.copy_from_slice(&g.image))
            .unwrap();
        crate::compute::run(&g.pool, &crate::compute::Pool::eager(threads), &graph).unwrap();
        let eager = g
            .pool
            .with_region(at, g.image.len() as u64, <[u8]>::to_vec)
            .unwrap();
        assert!(eager == one, "{threads} eager threads differ from one");
    }
}

#[test]
fn graphs_of_views_only_touch_nothing_and_empty_nodes_are_skipped() {
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 4, 1, 1], &[2.0; 16]);
    let v = g.view(a, [4, 2, 1, 1], [4, 16, 32, 32], 0);
    g.tensors[v as usize].record.flags = flags::COMPUTE;
    g.nodes.push(v);
    let t = g.transpose(a);
    g.tensors[t as usize].record.op = Op::TRANSPOSE.0;
    g.tensors[t as usize].record.flags = flags::COMPUTE;
    g.nodes.push(t);
    // an empty node: nothing to compute, no storage needed
    let e = g.node(Op::ADD, ty::F32, [0, 4, 1, 1], &[a, a], &[]);
    g.tensors[e as usize].location = None;
    let out = g.run(2).unwrap();
    assert!(out == g.image);
}

#[test]
fn errors_are_errors_not_panics() {
    // a kernel fed a graph built by hand with inconsistent links still answers with an error
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
    let y = g.node(Op::SQR, ty::F32, [4, 1, 1, 1], &[a], &[]);
    g.tensors[y as usize].src[0] = None;
    let error: Error = g.run(1).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidGraph);
}
