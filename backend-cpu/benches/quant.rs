//! Row kernels of every type the CPU backend handles, on rows of 4096 elements:
//!
//! * `vec_dot/<type>`: a weight row times an activation row in its `vec_dot_type`;
//! * `dequantize/<type>`: a weight row to f32;
//! * `quantize/<type>`: f32 to an activation type (`from_float`: Q8_0, Q8_1, Q8_K, F16, BF16).
//!
//! Throughput is in elements. `cargo bench -p backend-cpu --bench quant` (add `-- --quick` for
//! a short run).

mod common;

use std::hint::black_box;

use backend_cpu::bench::{
    dequantize_row, format, quantize_row, quantize_row_ref, row_size, type_id, vec_dot,
};
use criterion::{Criterion, Throughput};
use proto_core::ggml::{type_info, TYPE_COUNT};

const N: usize = 4096;

/// Deterministic values in [-1, 1) (xorshift64*).
fn floats(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed >> 12;
            *seed ^= *seed << 25;
            *seed ^= *seed >> 27;
            let bits = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            bits as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A row of `N` weights of `t`: quantized random values, or for the formats without a
/// quantizer (the grid formats) random blocks with a small finite f16 scale up front.
fn weights(t: u32, seed: &mut u64) -> Vec<u8> {
    let mut row = vec![0u8; row_size(t, N).expect("whole blocks")];
    if quantize_row_ref(t, &floats(N, seed), &mut row).is_ok() {
        return row;
    }
    let block_bytes = format(t).expect("a known type").block_bytes;
    let noise = floats(row.len(), seed);
    for (byte, v) in row.iter_mut().zip(noise) {
        *byte = (v.to_bits() >> 7) as u8;
    }
    for block in row.chunks_exact_mut(block_bytes) {
        block[..2].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
    }
    row
}

fn name(t: u32) -> &'static str {
    type_info(t).expect("a ggml type").name
}

fn row_kernels(c: &mut Criterion) {
    let mut seed = 1;
    let mut dots = c.benchmark_group("vec_dot");
    dots.throughput(Throughput::Elements(N as u64));
    let weight_types: Vec<u32> = (0..TYPE_COUNT)
        .filter(|&t| format(t).is_some_and(|f| f.dot.is_some()))
        .collect();
    let rows: Vec<(u32, Vec<u8>)> = weight_types
        .iter()
        .map(|&t| (t, weights(t, &mut seed)))
        .collect();
    for (t, x) in &rows {
        let vdt = format(*t)
            .and_then(|f| f.vec_dot_type)
            .expect("a vec_dot_type");
        let mut y = vec![0u8; row_size(vdt, N).expect("whole blocks")];
        quantize_row(vdt, &floats(N, &mut seed), &mut y).expect("an activation type");
        dots.bench_function(name(*t), |b| {
            b.iter(|| vec_dot(*t, N, black_box(x), black_box(&y)).unwrap())
        });
    }
    dots.finish();

    let mut dequantize = c.benchmark_group("dequantize");
    dequantize.throughput(Throughput::Elements(N as u64));
    let mut out = vec![0f32; N];
    for (t, x) in &rows {
        dequantize.bench_function(name(*t), |b| {
            b.iter(|| dequantize_row(*t, black_box(x), black_box(&mut out)).unwrap())
        });
    }
    dequantize.finish();

    let mut quantize = c.benchmark_group("quantize");
    quantize.throughput(Throughput::Elements(N as u64));
    let src = floats(N, &mut seed);
    for t in ["q8_0", "q8_1", "q8_K", "f16", "bf16"].map(|n| type_id(n).expect("a ggml type")) {
        let mut dst = vec![0u8; row_size(t, N).expect("whole blocks")];
        quantize.bench_function(name(t), |b| {
            b.iter(|| quantize_row(t, black_box(&src), black_box(&mut dst)).unwrap())
        });
    }
    quantize.finish();
}

fn main() {
    common::run(100, 200, 1000, &[row_kernels]);
}
