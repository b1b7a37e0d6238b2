//! MUL_MAT's tile and row kernels in isolation, the dispatched kernel next to the variants it
//! chooses between (each variant only where the CPU has its features):
//!
//! * `q0_one_row/<Q8_0|Q4_0>/*`: one Q8_0 activation row against 81,920 weight rows of 768
//!   (streaming from memory): tiles of 1, 4 and 8 weight rows, the AVX-512 zmm and one-row EVEX
//!   kernels, and row-by-row `vec_dot`;
//! * `q0_in_cache/*`: the same kernels on 256 weight rows that stay in cache;
//! * `q0_prompt/*`: 4 x 3 tiles over 63 activation rows (prompt processing), dispatched and
//!   AVX2 only;
//! * `float_row1/<F16|F32>/*`: one activation row against a 32,000 x 256 weight matrix (the tiny
//!   models' output projection, on huge pages), dispatched and for several row groups and
//!   prefetch distances (in rows), each warm and with cold caches (`_cold`);
//! * `float_gemm/<F16|F32>/*`: 256 x 256 weights by 64 activation rows, tiles of 3, 4 and 6
//!   activation rows over 128 or 32 weight rows, and `pairs`: `vec_dot` per pair, what
//!   MUL_MAT runs where the CPU has no register-blocked float kernel.
//!
//! Throughput is in weight bytes (`q0_*`, `float_row1`) or multiply-adds.
//! `cargo bench -p backend-cpu --bench tiles` (add `-- --quick` for a short run).

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use backend_cpu::bench::{
    dot_float_row1_variant, dot_float_rows, dot_tile, dot_tile_variant, dot_tile_vl1_variant,
    dot_tile_zmm_variant, quantize_row, type_id, vec_dot, FloatRows, Q8Row, Q8Rows, StridedRows,
    Q0,
};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};

/// Deterministic bytes below 64 (small quants and normal f16 scales).
fn bytes(n: usize, seed: &mut u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) as u8 & 0x3f
        })
        .collect()
}

/// `n` activation values, small and positive.
fn activations(n: usize, seed: &mut u64) -> Vec<f32> {
    bytes(n, seed)
        .iter()
        .map(|&b| f32::from(b) / 64.0)
        .collect()
}

/// `rows` weight rows of `k` values of `kind`, normal values only (random bits would make
/// subnormals, infinities and NaNs, which take slow paths in the multipliers).
fn float_weights(kind: FloatRows, rows: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let mut w = bytes(rows * kind.bytes() * k, seed);
    match kind {
        FloatRows::F16 => w.chunks_exact_mut(2).for_each(|h| h[1] &= 0x3b),
        FloatRows::F32 => w
            .chunks_exact_mut(4)
            .for_each(|v| v[3] = (v[3] & 0x80) | 0x3e),
    }
    w
}

/// Weight rows `c .. c + RM * step` by `step`, the order the MUL_MAT kernel walks a block of 64.
fn group<'w, const RM: usize>(
    row: &dyn Fn(usize) -> &'w [u8],
    c: usize,
    step: usize,
) -> [&'w [u8]; RM] {
    std::array::from_fn(|i| row(c + step * i))
}

/// A tile kernel of `RM` weight rows by one activation row.
type OneRowTile<'a, const RM: usize> = &'a dyn Fn(&[&[u8]; RM], &mut [[f32; 1]; RM]);

/// A 4 x 3 tile kernel: four weight rows by three activation rows.
type PromptTile<'a> = &'a dyn Fn(&[&[u8]; 4], &[Q8Row<'_>; 3], &mut [[f32; 3]; 4]);

/// One activation row against every weight row, `RM` weight rows per call of `tile`.
fn one_row<'w, const RM: usize>(
    row: &dyn Fn(usize) -> &'w [u8],
    rows: usize,
    tile: OneRowTile<'_, RM>,
) -> f32 {
    let mut sink = 0f32;
    for c in (0..rows).step_by(RM) {
        let c = c / 64 * 64 + (c % 64) / RM;
        let mut out = [[0f32; 1]; RM];
        tile(&group::<RM>(row, c, 64 / RM), &mut out);
        sink += out[0][0];
    }
    sink
}

/// Benches `name` unless `available` says the CPU lacks the kernel's features.
fn bench_if(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    available: bool,
    mut f: impl FnMut() -> f32,
) {
    if available {
        g.bench_function(name, |b| b.iter(|| black_box(f())));
    }
}

fn q0_tiles(c: &mut Criterion) {
    let (k, rows) = (768, 8192 * 10);
    let mut seed = 1;
    for (kind, name) in [(Q0::Q8_0, "q8_0"), (Q0::Q4_0, "q4_0")] {
        let t = type_id(name).expect("a ggml type");
        // bytes of a block: Q8_0's d and 32 quants, Q4_0's d and 16 bytes of nibbles
        let block_bytes = match kind {
            Q0::Q8_0 => 34,
            Q0::Q4_0 => 18,
        };
        let rb = k / 32 * block_bytes;
        let w = bytes(rows * rb, &mut seed);
        let y8 = bytes(64 * k / 32 * 34, &mut seed);
        let y = Q8Rows::from_q8_0(kind, k, &y8).unwrap();
        let yr: Vec<Q8Row<'_>> = (0..64).map(|r| y.row(r).unwrap()).collect();
        let row = |c: usize| &w[c * rb..(c + 1) * rb];
        let y0 = [yr[0]];
        let probe = [row(0); 8];
        let zmm = dot_tile_zmm_variant(kind, &probe, &y0, &mut [[0f32; 1]; 8]).is_some();
        let vl1 = dot_tile_vl1_variant(kind, &probe, &yr[0], &mut [[0f32; 1]; 8]).is_some();

        let mut g = c.benchmark_group(format!("q0_one_row/{kind:?}"));
        g.throughput(Throughput::Bytes((rows * rb) as u64));
        bench_if(&mut g, "tile_1x1", true, || {
            one_row::<1>(&row, rows, &|w, o| dot_tile(kind, w, &y0, o).unwrap())
        });
        bench_if(&mut g, "tile_4x1", true, || {
            one_row::<4>(&row, rows, &|w, o| dot_tile(kind, w, &y0, o).unwrap())
        });
        bench_if(&mut g, "tile_8x1", true, || {
            one_row::<8>(&row, rows, &|w, o| dot_tile(kind, w, &y0, o).unwrap())
        });
        bench_if(&mut g, "zmm_4x1", zmm, || {
            one_row::<4>(&row, rows, &|w, o| {
                dot_tile_zmm_variant(kind, w, &y0, o);
            })
        });
        bench_if(&mut g, "zmm_8x1", zmm, || {
            one_row::<8>(&row, rows, &|w, o| {
                dot_tile_zmm_variant(kind, w, &y0, o);
            })
        });
        bench_if(&mut g, "vl1_4x1", vl1, || {
            one_row::<4>(&row, rows, &|w, o| {
                dot_tile_vl1_variant(kind, w, &yr[0], o);
            })
        });
        bench_if(&mut g, "vl1_8x1", vl1, || {
            one_row::<8>(&row, rows, &|w, o| {
                dot_tile_vl1_variant(kind, w, &yr[0], o);
            })
        });
        bench_if(&mut g, "vec_dot", true, || {
            (0..rows)
                .map(|c| vec_dot(t, k, row(c), &y8[..k / 32 * 34]).unwrap())
                .sum()
        });
        g.finish();

        // 256 rows, 100 times: they stay in cache
        let cached = 256;
        let in_cache = |tile: &dyn Fn(usize) -> f32| (0..100).map(|_| tile(cached)).sum::<f32>();
        let mut g = c.benchmark_group(format!("q0_in_cache/{kind:?}"));
        g.throughput(Throughput::Bytes((100 * cached * rb) as u64));
        bench_if(&mut g, "tile_4x1", true, || {
            in_cache(&|rows| one_row::<4>(&row, rows, &|w, o| dot_tile(kind, w, &y0, o).unwrap()))
        });
        bench_if(&mut g, "zmm_4x1", zmm, || {
            in_cache(&|rows| {
                one_row::<4>(&row, rows, &|w, o| {
                    dot_tile_zmm_variant(kind, w, &y0, o);
                })
            })
        });
        bench_if(&mut g, "zmm_8x1", zmm, || {
            in_cache(&|rows| {
                one_row::<8>(&row, rows, &|w, o| {
                    dot_tile_zmm_variant(kind, w, &y0, o);
                })
            })
        });
        bench_if(&mut g, "vl1_4x1", vl1, || {
            in_cache(&|rows| {
                one_row::<4>(&row, rows, &|w, o| {
                    dot_tile_vl1_variant(kind, w, &yr[0], o);
                })
            })
        });
        bench_if(&mut g, "vl1_8x1", vl1, || {
            in_cache(&|rows| {
                one_row::<8>(&row, rows, &|w, o| {
                    dot_tile_vl1_variant(kind, w, &yr[0], o);
                })
            })
        });
        g.finish();

        // 4 x 3 tiles over 63 activation rows and 32 weight rows
        let prompt = |tile: PromptTile<'_>| {
            let mut sink = 0f32;
            for j in (0..63).step_by(3) {
                for c in (0..32).step_by(4) {
                    let mut out = [[0f32; 3]; 4];
                    tile(
                        &group::<4>(&row, c, 1),
                        &[yr[j], yr[j + 1], yr[j + 2]],
                        &mut out,
                    );
                    sink += out[0][0];
                }
            }
            sink
        };
        let avx2 =
            dot_tile_variant(kind, false, &[row(0); 4], &[yr[0]; 3], &mut [[0f32; 3]; 4]).is_some();
        let mut g = c.benchmark_group(format!("q0_prompt/{kind:?}"));
        g.throughput(Throughput::Elements((63 * 32 * k) as u64));
        bench_if(&mut g, "tile_4x3", true, || {
            prompt(&|w, y, o| dot_tile(kind, w, y, o).unwrap())
        });
        bench_if(&mut g, "avx2_4x3", avx2, || {
            prompt(&|w, y, o| {
                dot_tile_variant(kind, false, w, y, o);
            })
        });
        g.finish();
    }
}

fn float_row1(c: &mut Criterion) {
    let (k, rows) = (256usize, 32000usize);
    let mut seed = 5;
    let y = activations(k, &mut seed);
    // Written between cold passes, outside the timing: more than the caches a VM's share of a
    // large L3 keeps of it (64 MiB left most of the matrix in a 480 MiB L3).
    let mut junk = vec![1u8; 768 << 20];
    for kind in [FloatRows::F16, FloatRows::F32] {
        let rb = kind.bytes() * k;
        // on huge pages and 64-byte aligned (page-aligned), as the server's large buffers are
        let values = float_weights(kind, rows, k, &mut seed);
        let mut map = memmap2::MmapOptions::new()
            .len(values.len())
            .map_anon()
            .expect("anonymous mapping");
        // refused only without transparent huge pages: then base pages, as the server has
        let _ = map.advise(memmap2::Advice::HugePage);
        map.copy_from_slice(&values);
        let sw = StridedRows::new(&map, rb, rb, rows).unwrap();
        let mut out = vec![0f32; rows];
        let mut g = c.benchmark_group(format!("float_row1/{kind:?}"));
        g.throughput(Throughput::Bytes((rows * rb) as u64));
        let yr = [&y[..]];
        let mut pass = 0u8;
        let mut timed = |b: &mut criterion::Bencher, cold: bool, run: &mut dyn FnMut()| {
            b.iter_custom(|passes| {
                let mut total = Duration::ZERO;
                for _ in 0..passes {
                    if cold {
                        pass = pass.wrapping_add(1);
                        junk.iter_mut().step_by(64).for_each(|b| *b = pass);
                    }
                    let start = Instant::now();
                    run();
                    total += start.elapsed();
                }
                total
            })
        };
        for cold in [false, true] {
            let suffix = if cold { "_cold" } else { "" };
            g.bench_function(format!("dispatched{suffix}"), |b| {
                timed(b, cold, &mut || {
                    let (o, _) = out.as_chunks_mut::<1>();
                    dot_float_rows(kind, sw, &yr, o).unwrap();
                })
            });
            macro_rules! variant {
                ($($g:literal, $ahead:literal);*) => {$(
                    if dot_float_row1_variant::<$g>(kind, sw, &y, $ahead, &mut out).is_some() {
                        let name = format!("g{}_ahead{}{suffix}", $g, $ahead);
                        g.bench_function(name, |b| {
                            timed(b, cold, &mut || {
                                dot_float_row1_variant::<$g>(kind, sw, &y, $ahead, &mut out);
                            })
                        });
                    }
                )*};
            }
            variant!(1, 0; 1, 1; 1, 2; 1, 4; 1, 8; 2, 0; 2, 2; 4, 0);
        }
        g.finish();
    }
}

fn float_gemm(c: &mut Criterion) {
    let (k, rows, acts) = (256usize, 256usize, 64usize);
    let mut seed = 3;
    let y = activations(k * acts, &mut seed);
    for kind in [FloatRows::F32, FloatRows::F16] {
        let rb = kind.bytes() * k;
        let w = float_weights(kind, rows, k, &mut seed);
        let yrow = |r: usize| &y[r * k..(r + 1) * k];
        let mut g = c.benchmark_group(format!("float_gemm/{kind:?}"));
        macro_rules! tiles {
            ($($n:literal, $cols:literal);*) => {$(
                let mut out = vec![[0f32; $n]; $cols];
                g.throughput(Throughput::Elements((k * rows * (acts - acts % $n)) as u64));
                g.bench_function(concat!("n", $n, "_cols", $cols), |b| {
                    b.iter(|| {
                        for c0 in (0..rows).step_by($cols) {
                            let weights = &w[c0 * rb..(c0 + $cols) * rb];
                            let sw = StridedRows::new(weights, rb, rb, $cols).unwrap();
                            for r in (0..acts - acts % $n).step_by($n) {
                                let yr: [&[f32]; $n] = std::array::from_fn(|j| yrow(r + j));
                                dot_float_rows(kind, sw, &yr, &mut out).unwrap();
                            }
                        }
                    })
                });
            )*};
        }
        tiles!(3, 128; 4, 128; 6, 128; 3, 32; 4, 32);
        // what MUL_MAT does without a register-blocked kernel: `vec_dot` per pair, on the
        // activations converted once to the weights' vec_dot type (F16 for F16 weights)
        let t = type_id(&format!("{kind:?}").to_lowercase()).unwrap();
        let mut yb = vec![0u8; kind.bytes() * k * acts];
        quantize_row(t, &y, &mut yb).unwrap();
        g.throughput(Throughput::Elements((k * rows * acts) as u64));
        g.bench_function("pairs", |b| {
            b.iter(|| {
                let mut sum = 0f32;
                for c in 0..rows {
                    for r in 0..acts {
                        let yr = &yb[r * rb..(r + 1) * rb];
                        sum += vec_dot(t, k, &w[c * rb..(c + 1) * rb], yr).unwrap();
                    }
                }
                black_box(sum)
            })
        });
        g.finish();
    }
}

fn main() {
    common::run(20, 300, 2000, &[q0_tiles, float_row1, float_gemm]);
}
