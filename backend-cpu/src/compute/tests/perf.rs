//! timings (to become benches)

use super::*;

/// Timings of the heavy kernels at llama-like sizes (`cargo test --release -- --ignored
/// perf --nocapture`); asserts nothing but that they run.
#[test]
#[ignore]
fn perf_smoke() {
    let mut rng = Rng::new(20);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (w_type, k, m, n) in [
        (ty::F32, 4096, 4096, 1),
        (ty::F16, 4096, 4096, 1),
        (ty::Q8_0, 4096, 4096, 1),
        (ty::Q4_0, 4096, 4096, 1),
        (ty::F16, 4096, 4096, 64),
        (ty::Q4_0, 4096, 4096, 64),
    ] {
        let w = rng.values(k * m, 0.1);
        let (block, size) = type_size(w_type);
        let bytes = if block == 1 {
            encode_values(w_type, &w)
        } else {
            let mut b = vec![0u8; k * m / block * size];
            for (row, dst) in w.chunks(k).zip(b.chunks_mut(k / block * size)) {
                quant::quantize_row(w_type, row, dst).unwrap();
            }
            b
        };
        let mut g = G::new();
        let wt = g.input_bytes(w_type, [k, m, 1, 1], &bytes);
        let xt = g.input(ty::F32, [k, n, 1, 1], &rng.values(k * n, 1.0));
        g.node(Op::MUL_MAT, ty::F32, [m, n, 1, 1], &[wt, xt], &[]);
        g.run(threads).unwrap();
        let graph = g.graph();
        let workers = crate::compute::Pool::new(threads);
        crate::compute::run(&g.pool, &workers, &graph).unwrap();
        let start = std::time::Instant::now();
        crate::compute::run(&g.pool, &workers, &graph).unwrap();
        let s = start.elapsed().as_secs_f64();
        println!(
            "mul_mat type {w_type:2} {k}x{m} n={n:3}: {:8.2} ms, {:6.2} GFLOP/s ({threads} threads)",
            s * 1e3,
            2.0 * (k * m * n) as f64 / s / 1e9
        );
    }
    for (n_q, n_kv) in [(1, 4096), (128, 512)] {
        let (d, heads, kv_heads) = (128, 32, 8);
        let mut g = G::new();
        let q = g.input(
            ty::F32,
            [d, n_q, heads, 1],
            &rng.values(d * n_q * heads, 1.0),
        );
        let k = g.input(
            ty::F16,
            [d, n_kv, kv_heads, 1],
            &rng.values(d * n_kv * kv_heads, 1.0),
        );
        let v = g.input(
            ty::F16,
            [d, n_kv, kv_heads, 1],
            &rng.values(d * n_kv * kv_heads, 1.0),
        );
        let m = g.input(ty::F16, [n_kv, n_q, 1, 1], &vec![0.0; n_kv * n_q]);
        g.node(
            Op::FLASH_ATTN_EXT,
            ty::F32,
            [d, heads, n_q, 1],
            &[q, k, v, m],
            &[f(0.1), 0, 0, 0],
        );
        g.run(threads).unwrap();
        let graph = g.graph();
        let workers = crate::compute::Pool::new(threads);
        crate::compute::run(&g.pool, &workers, &graph).unwrap();
        let start = std::time::Instant::now();
        crate::compute::run(&g.pool, &workers, &graph).unwrap();
        println!(
            "flash_attn n_q={n_q} n_kv={n_kv}: {:8.2} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// Per-node overhead of spreading work over threads (`cargo test --release -- --ignored
/// overhead --nocapture`).
#[test]
#[ignore]
fn perf_node_overhead() {
    let mut rng = Rng::new(23);
    let mut g = G::new();
    let x = g.input(ty::F32, [4096, 16, 1, 1], &rng.values(4096 * 16, 1.0));
    let mut h = x;
    for _ in 0..300 {
        h = g.node(
            Op::SCALE,
            ty::F32,
            [4096, 16, 1, 1],
            &[h],
            &[f(1.0), f(0.0)],
        );
    }
    let graph = g.graph();
    for threads in [1, 2, 4, 8] {
        g.run(threads).unwrap();
        let workers = crate::compute::Pool::new(threads);
        crate::compute::run(&g.pool, &workers, &graph).unwrap();
        let start = std::time::Instant::now();
        crate::compute::run(&g.pool, &workers, &graph).unwrap();
        println!(
            "300 nodes of 64 Ki elements, {threads} threads: {:.2} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}
