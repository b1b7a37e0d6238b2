//! Tests of the copy and row ops: CPY, DUP, CONCAT, REPEAT, GET_ROWS, SET_ROWS.

use super::*;

// --- copies --------------------------------------------------------------------------------

#[test]
fn cpy_converts_between_float_types_through_strided_views() {
    let mut rng = Rng::new(1);
    for (from, to) in [
        (ty::F32, ty::F16),
        (ty::F32, ty::BF16),
        (ty::F16, ty::F32),
        (ty::BF16, ty::F32),
        (ty::F16, ty::BF16),
        (ty::F32, ty::F32),
        (ty::F16, ty::F16),
        (ty::F32, ty::I32),
        (ty::I32, ty::F32),
    ] {
        let ne = random_shape(&mut rng, [9, 5, 3, 2]);
        let n: usize = ne.iter().product();
        let values: Vec<f32> = rng.values(n, 100.0);
        let mut g = G::new();
        let a = g.input(from, ne, &values);
        // a permuted (non-contiguous) view of the source, copied into a fresh tensor
        let p = g.permute(a, [2, 0, 1, 3]);
        let pne = g.tensors[p as usize].record.ne.map(|n| n as usize);
        let dst = g.zeros(to, pne);
        let cpy = g.node_into(Op::CPY, dst, &[p, dst], &[]);
        let out = g.run(2).unwrap();
        let src = stored(from, &values);
        // logical order of the permuted view: element (j0, j1, j2, j3) of p is a[j2, j0, j1, j3]
        let want: Vec<f64> = all(pne)
            .map(|[i0, i1, i2, i3]| src[at(ne, [i2, i0, i1, i3])])
            .map(|v| f64::from(stored(to, &[v])[0]))
            .collect();
        assert_close(
            &g.read(&out, cpy),
            &want,
            0.0,
            &format!("cpy {from} -> {to}"),
        );
    }
}

#[test]
fn cpy_follows_flat_element_order_between_shapes_and_into_views() {
    let mut rng = Rng::new(2);
    let values = rng.values(48, 1.0);
    let mut g = G::new();
    let a = g.input(ty::F32, [6, 8, 1, 1], &values);
    // CONT of a transposed view into [8, 6]
    let t = g.transpose(a);
    let cont = g.node(Op::CONT, ty::F32, [8, 6, 1, 1], &[t], &[]);
    // DUP to a different shape with the same element count, F16
    let dup = g.node(Op::DUP, ty::F16, [4, 3, 4, 1], &[a], &[]);
    // CPY into a strided view (every other row of a bigger tensor), different shape
    let big = g.zeros(ty::F32, [12, 8, 1, 1]);
    let rows = g.view(big, [12, 4, 1, 1], [4, 96, 384, 384], 48);
    let cpy = g.node_into(Op::CPY, rows, &[a, rows], &[]);
    let out = g.run(3).unwrap();
    let want_cont: Vec<f64> = all([8, 6, 1, 1])
        .map(|[i0, i1, ..]| f64::from(values[i1 + 6 * i0]))
        .collect();
    assert_close(&g.read(&out, cont), &want_cont, 0.0, "cont of transpose");
    assert_close(
        &g.read(&out, dup),
        &wide(&stored(ty::F16, &values)),
        0.0,
        "dup reshaped",
    );
    assert_close(&g.read(&out, cpy), &wide(&values), 0.0, "cpy into view");
    // the rows between the view's rows stay untouched
    let whole = g.read(&out, big);
    for i1 in 0..8 {
        let untouched = i1 % 2 == 0;
        let row = &whole[i1 * 12..(i1 + 1) * 12];
        assert_eq!(row.iter().all(|&v| v == 0.0), untouched, "row {i1}");
    }
}

#[test]
fn cpy_quantizes_and_dequantizes_like_the_quant_module() {
    let mut rng = Rng::new(3);
    for qt in [
        ty::Q8_0,
        ty::Q4_0,
        3,  /* Q4_1 */
        6,  /* Q5_0 */
        7,  /* Q5_1 */
        20, /* IQ4_NL */
        39, /* MXFP4 */
        40, /* NVFP4 */
        42, /* Q2_0 */
    ] {
        let ne = [64, 3, 2, 1];
        let values = rng.values(384, 2.0);
        let mut g = G::new();
        let a = g.input(ty::F32, ne, &values);
        let q = g.node(Op::CPY, qt, ne, &[a], &[]);
        let back = g.node(Op::CPY, ty::F32, ne, &[q], &[]);
        let out = g.run(2).unwrap();
        let (block, size) = type_size(qt);
        let mut want_q = vec![0u8; 384 / block * size];
        for (row, dst) in values.chunks(64).zip(want_q.chunks_mut(64 / block * size)) {
            quant::quantize_row(qt, row, dst).unwrap();
        }
        assert_eq!(g.raw(&out, q), want_q, "quantized bytes of type {qt}");
        let mut want_back = vec![0.0f32; 384];
        for (src, dst) in want_q
            .chunks(64 / block * size)
            .zip(want_back.chunks_mut(64))
        {
            quant::dequantize_row(qt, src, dst).unwrap();
        }
        assert_close(&g.read(&out, back), &wide(&want_back), 0.0, "dequantized");
    }
}

/// F32 / F16 into each K-quant (and the other formats with blocks of 128 or 256) through CPY
/// and SET_ROWS: the bytes of `quant::quantize_row` (ggml's `quantize_row_*_ref`) per row, and
/// back through CPY within the format's error.
#[test]
fn cpy_and_set_rows_into_k_quants() {
    let mut rng = Rng::new(31);
    for qt in [
        "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_xs", "tq1_0", "tq2_0", "q1_0",
    ]
    .map(quant::id)
    {
        let (block, size) = type_size(qt);
        let k = 512;
        let ne = [k, 3, 2, 1];
        let values = rng.values(k * 6, 2.0);
        let mut g = G::new();
        let a = g.input(ty::F32, ne, &values);
        let h = g.input(ty::F16, ne, &values);
        let q = g.node(Op::CPY, qt, ne, &[a], &[]);
        let qh = g.node(Op::CPY, qt, ne, &[h], &[]);
        let back = g.node(Op::CPY, ty::F32, ne, &[q], &[]);
        let ids = g.ids(I64, [3, 2, 1, 1], &[2, 0, 1, 0, 3, 2]);
        let cache = g.zeros(qt, [k, 4, 2, 1]);
        let set = g.node_into(Op::SET_ROWS, cache, &[a, ids], &[]);
        let out = g.run(3).unwrap();
        let quantize = |rows: &[f32]| {
            let mut want = vec![0u8; rows.len() / block * size];
            for (row, dst) in rows.chunks(k).zip(want.chunks_mut(k / block * size)) {
                quant::quantize_row(qt, row, dst).unwrap();
            }
            want
        };
        let want_q = quantize(&values);
        assert_eq!(g.raw(&out, q), want_q, "CPY F32 -> type {qt}");
        let halves = stored(ty::F16, &values);
        assert_eq!(g.raw(&out, qh), quantize(&halves), "CPY F16 -> type {qt}");
        let mut want_back = vec![0.0f32; values.len()];
        for (src, dst) in want_q.chunks(k / block * size).zip(want_back.chunks_mut(k)) {
            quant::dequantize_row(qt, src, dst).unwrap();
        }
        assert_close(&g.read(&out, back), &wide(&want_back), 0.0, "dequantized");
        let row_bytes = k / block * size;
        let mut want_set = vec![0u8; 8 * row_bytes];
        for (n, id) in [2usize, 0, 1, 0, 3, 2].into_iter().enumerate() {
            let (i1, i2) = (n % 3, n / 3);
            let d = (i2 * 4 + id) * row_bytes;
            let row = &values[at(ne, [0, i1, i2, 0])..][..k];
            quant::quantize_row(qt, row, &mut want_set[d..d + row_bytes]).unwrap();
        }
        assert_eq!(g.raw(&out, set), want_set, "SET_ROWS -> type {qt}");
    }
}

/// CONCAT of quantized tensors (ggml-cpu's `concat_any`): whole blocks copied along every
/// dimension, with contiguous sources and strided views (as test-backend-ops builds them).
#[test]
fn concat_of_quantized_tensors_copies_blocks() {
    let mut rng = Rng::new(32);
    for qt in [ty::Q4_0, 3, 6, 7, ty::Q8_0, ty::Q4_K] {
        let (block, size) = type_size(qt);
        let ne_a = [2 * block, 3, 2, 2];
        for dim in 0..4 {
            for strided in [false, true] {
                let mut ne_b = ne_a;
                ne_b[dim] = if dim == 0 { 3 * block } else { 1 + dim % 2 };
                let mut ne = ne_a;
                ne[dim] += ne_b[dim];
                // b: the first ne_b of a tensor twice as large in dimensions 2 and 3
                let full_b = if strided {
                    [ne_b[0], ne_b[1], ne_b[2] * 2, ne_b[3] * 3]
                } else {
                    ne_b
                };
                let blocks = |n: [usize; 4]| n.iter().product::<usize>() / block;
                let a_bytes: Vec<u8> = (0..blocks(ne_a) * size).map(|_| rng.next() as u8).collect();
                let b_bytes: Vec<u8> = (0..blocks(full_b) * size)
                    .map(|_| rng.next() as u8)
                    .collect();
                let mut g = G::new();
                let a = g.input_bytes(qt, ne_a, &a_bytes);
                let mut b = g.input_bytes(qt, full_b, &b_bytes);
                if strided {
                    b = g.view(b, ne_b, contiguous_nb(qt, full_b), 0);
                }
                let c = g.node(Op::CONCAT, qt, ne, &[a, b], &[dim as i32]);
                let out = g.run(3).unwrap();
                // expected: block (u, i1, i2, i3) of the destination
                let units = |n: [usize; 4]| [n[0] / block, n[1], n[2], n[3]];
                let mut want = Vec::new();
                for i in all(units(ne)) {
                    let split = units(ne_a)[dim];
                    let (src, shape, mut j) = if i[dim] < split {
                        (&a_bytes, units(ne_a), i)
                    } else {
                        (&b_bytes, units(full_b), i)
                    };
                    if i[dim] >= split {
                        j[dim] -= split;
                    }
                    let u = at(shape, j);
                    want.extend_from_slice(&src[u * size..(u + 1) * size]);
                }
                assert_eq!(
                    g.raw(&out, c),
                    want,
                    "concat of type {qt} along {dim}, strided {strided}"
                );
            }
        }
    }
}

#[test]
fn dup_of_quantized_bytes_and_concat_and_repeat() {
    let mut rng = Rng::new(4);
    let values = rng.values(64 * 4, 1.0);
    let mut q = vec![0u8; 4 * 2 * 34];
    for (row, dst) in values.chunks(64).zip(q.chunks_mut(68)) {
        quant::quantize_row(ty::Q8_0, row, dst).unwrap();
    }
    let mut g = G::new();
    let a = g.input_bytes(ty::Q8_0, [64, 4, 1, 1], &q);
    let dup = g.node(Op::DUP, ty::Q8_0, [128, 2, 1, 1], &[a], &[]);
    // concat along each dimension
    let x = rng.values(2 * 3 * 2 * 2, 1.0);
    let y = rng.values(2 * 3 * 2 * 2, 1.0);
    let xt = g.input(ty::F32, [2, 3, 2, 2], &x);
    let yt = g.input(ty::F32, [2, 3, 2, 2], &y);
    let mut concats = Vec::new();
    for dim in 0..4 {
        let mut ne = [2, 3, 2, 2];
        ne[dim] *= 2;
        concats.push((
            dim,
            ne,
            g.node(Op::CONCAT, ty::F32, ne, &[xt, yt], &[dim as i32]),
        ));
    }
    let rep = g.node(Op::REPEAT, ty::F32, [4, 6, 2, 4], &[xt], &[]);
    let out = g.run(2).unwrap();
    assert_eq!(g.raw(&out, dup), q);
    for (dim, ne, c) in concats {
        let want: Vec<f64> = all(ne)
            .map(|mut i| {
                if i[dim] < [2, 3, 2, 2][dim] {
                    f64::from(x[at([2, 3, 2, 2], i)])
                } else {
                    i[dim] -= [2, 3, 2, 2][dim];
                    f64::from(y[at([2, 3, 2, 2], i)])
                }
            })
            .collect();
        assert_close(&g.read(&out, c), &want, 0.0, &format!("concat along {dim}"));
    }
    let want: Vec<f64> = all([4, 6, 2, 4])
        .map(|[a0, a1, a2, a3]| f64::from(x[at([2, 3, 2, 2], [a0 % 2, a1 % 3, a2 % 2, a3 % 2])]))
        .collect();
    assert_close(&g.read(&out, rep), &want, 0.0, "repeat");
}

// --- rows ----------------------------------------------------------------------------------

#[test]
fn get_rows_of_float_and_quantized_sources() {
    let mut rng = Rng::new(5);
    for src_type in [
        ty::F32,
        ty::F16,
        ty::BF16,
        ty::Q8_0,
        ty::Q4_0,
        12, /* Q4_K */
    ] {
        let (block, size) = type_size(src_type);
        let k = 256;
        let ne = [k, 7, 3, 2];
        let values = rng.values(k * 42, 1.0);
        let (bytes, source): (Vec<u8>, Vec<f32>) = if block == 1 {
            (encode_values(src_type, &values), stored(src_type, &values))
        } else {
            let mut bytes = vec![0u8; 42 * k / block * size];
            let mut back = vec![0.0f32; k * 42];
            for ((row, dst), deq) in values
                .chunks(k)
                .zip(bytes.chunks_mut(k / block * size))
                .zip(back.chunks_mut(k))
            {
                if src_type == 12 {
                    // no quantizer for Q4_K here: random bytes with small scales are valid blocks
                    for b in dst.iter_mut() {
                        *b = rng.next() as u8;
                    }
                    dst[..2].copy_from_slice(&f32_to_f16(0.01).to_le_bytes());
                    dst[2..4].copy_from_slice(&f32_to_f16(0.001).to_le_bytes());
                } else {
                    quant::quantize_row(src_type, row, dst).unwrap();
                }
                quant::dequantize_row(src_type, dst, deq).unwrap();
            }
            (bytes, back)
        };
        let mut g = G::new();
        let a = g.input_bytes(src_type, ne, &bytes);
        let ids: Vec<i64> = (0..5 * 3 * 2).map(|_| rng.below(7) as i64).collect();
        let rows = g.ids(ty::I32, [5, 3, 2, 1], &ids);
        let got = g.node(Op::GET_ROWS, ty::F32, [k, 5, 3, 2], &[a, rows], &[]);
        let out = g.run(2).unwrap();
        let want: Vec<f64> = all([k, 5, 3, 2])
            .map(|[i0, i10, i11, i12]| {
                let id = ids[at([5, 3, 2, 1], [i10, i11, i12, 0])] as usize;
                f64::from(source[at(ne, [i0, id, i11, i12])])
            })
            .collect();
        assert_close(
            &g.read(&out, got),
            &want,
            0.0,
            &format!("get_rows of type {src_type}"),
        );
    }
}

#[test]
fn get_rows_with_an_out_of_range_id_fails_cleanly() {
    for bad in [7i64, -1, i64::from(i32::MAX), i64::from(i32::MIN)] {
        let mut g = G::new();
        let a = g.input(ty::F32, [4, 7, 1, 1], &[1.0; 28]);
        let rows = g.ids(ty::I32, [3, 1, 1, 1], &[0, bad, 2]);
        let got = g.node(Op::GET_ROWS, ty::F32, [4, 3, 1, 1], &[a, rows], &[]);
        let error = g.run(2).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::OutOfBounds, "id {bad}: {error}");
        // nothing was written by the failing node
        let bytes = g
            .pool
            .with_region(
                TensorLocation {
                    buffer: g.buffer,
                    offset: 0,
                },
                g.image.len() as u64,
                <[u8]>::to_vec,
            )
            .unwrap();
        assert!(g.read(&bytes, got).iter().all(|&v| v == 0.0));
    }
}

#[test]
fn set_rows_with_i64_and_i32_ids_into_float_and_quantized_rows() {
    let mut rng = Rng::new(6);
    for (id_type, dst_type) in [
        (I64, ty::F32),
        (I64, ty::F16),
        (ty::I32, ty::BF16),
        (ty::I32, ty::F32),
        (I64, ty::Q8_0),
    ] {
        let k = 64;
        // 3 source rows per (i2, i3), ids broadcast over dim 2 (ne11 = 1) and dim 3 (ne12 = 2)
        let src_ne = [k, 3, 2, 2];
        let values = rng.values(k * 12, 1.0);
        let ids: Vec<i64> = vec![4, 0, 2, 1, 5, 3];
        let mut g = G::new();
        let a = g.input(ty::F32, src_ne, &values);
        let idx = g.ids(id_type, [3, 1, 2, 1], &ids);
        let cache = g.zeros(dst_type, [k, 6, 2, 2]);
        let set = g.node_into(Op::SET_ROWS, cache, &[a, idx], &[]);
        let out = g.run(3).unwrap();
        if dst_type == ty::Q8_0 {
            let mut want = vec![0u8; 24 * 68];
            for i3 in 0..2 {
                for i2 in 0..2 {
                    for i in 0..3 {
                        let id = ids[i + 3 * i3] as usize;
                        let row = &values[at(src_ne, [0, i, i2, i3])..][..k];
                        let d = ((i3 * 2 + i2) * 6 + id) * 68;
                        quant::quantize_row(ty::Q8_0, row, &mut want[d..d + 68]).unwrap();
                    }
                }
            }
            assert_eq!(g.raw(&out, set), want);
            continue;
        }
        let mut want = vec![0.0f64; k * 24];
        for i3 in 0..2 {
            for i2 in 0..2 {
                for i in 0..3 {
                    let id = ids[i + 3 * i3] as usize;
                    for i0 in 0..k {
                        let v = stored(dst_type, &[values[at(src_ne, [i0, i, i2, i3])]])[0];
                        want[at([k, 6, 2, 2], [i0, id, i2, i3])] = f64::from(v);
                    }
                }
            }
        }
        assert_close(
            &g.read(&out, set),
            &want,
            0.0,
            &format!("set_rows {id_type} -> {dst_type}"),
        );
    }
}

/// One-element rows (a transposed V cache: each value its own row), per plane, the ids
/// broadcast over dimension 2: each value lands at its id, converted, the rest untouched.
#[test]
fn set_rows_of_one_element_rows_like_a_transposed_v_cache() {
    let mut rng = Rng::new(8);
    for dst_type in [ty::F16, ty::F32, ty::BF16] {
        let src_ne = [1, 5, 2, 1];
        let values = rng.values(10, 4.0);
        let ids: Vec<i64> = vec![7, 0, 3, 6, 1];
        let mut g = G::new();
        let a = g.input(ty::F32, src_ne, &values);
        let idx = g.ids(I64, [5, 1, 1, 1], &ids);
        let cache = g.zeros(dst_type, [1, 8, 2, 1]);
        let set = g.node_into(Op::SET_ROWS, cache, &[a, idx], &[]);
        let out = g.run(2).unwrap();
        let mut want = vec![0.0f64; 16];
        for i2 in 0..2 {
            for (i, &id) in ids.iter().enumerate() {
                let v = stored(dst_type, &[values[at(src_ne, [0, i, i2, 0])]])[0];
                want[at([1, 8, 2, 1], [0, id as usize, i2, 0])] = f64::from(v);
            }
        }
        assert_close(&g.read(&out, set), &want, 0.0, &format!("-> {dst_type}"));
    }
}

#[test]
fn set_rows_with_an_out_of_range_id_writes_nothing() {
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 2, 1, 1], &[1.0; 8]);
    let idx = g.ids(I64, [2, 1, 1, 1], &[1, 3]);
    let cache = g.zeros(ty::F16, [4, 3, 1, 1]);
    g.node_into(Op::SET_ROWS, cache, &[a, idx], &[]);
    assert_eq!(g.run(1).unwrap_err().kind(), ErrorKind::OutOfBounds);
    let bytes = g
        .pool
        .with_region(
            TensorLocation {
                buffer: g.buffer,
                offset: 0,
            },
            g.image.len() as u64,
            <[u8]>::to_vec,
        )
        .unwrap();
    assert!(g.read(&bytes, cache).iter().all(|&v| v == 0.0));
}
