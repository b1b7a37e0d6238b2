//! Whole graphs through the public backend API (GRAPH_COMPUTE as a connection runs it):
//!
//! * `mul_mat/*`: MUL_MAT of 4096 x 4096 weights (F32, F16, Q8_0, Q4_0) by 1 and 64 activation
//!   rows (generation and prompt processing), in FLOP/s;
//! * `flash_attn/*`: FLASH_ATTN_EXT with 32 query heads over 8 F16 KV heads of 128, one query
//!   against 4096 keys and 128 queries against 512, and 4 query heads over 2 KV heads of 64,
//!   64 queries against 256 keys (the tiny conformance model's prompt in llama-bench);
//! * `node_overhead/*`: 300 chained SCALE nodes of 64 Ki elements on 1, 2, 4 and 8 threads: the
//!   cost of spreading small nodes over the threads.
//!
//! `cargo bench -p backend-cpu --bench graph` (add `-- --quick` for a short run).

mod common;

use std::hint::black_box;

use backend_cpu::bench::{quantize_row, row_size};
use backend_cpu::{CpuBackend, CpuConfig};
use criterion::{BenchmarkId, Criterion, Throughput};
use proto_core::backend::{Backend, TensorLocation};
use proto_core::ggml::types::id;
use proto_core::ggml::{flags, type_info, Op};
use proto_core::graph::{Graph, GraphTensor, TensorIndex};
use proto_core::wire::{RpcTensor, MAX_SRC};

/// Deterministic values in [-scale, scale) (xorshift64*).
fn values(n: usize, scale: f32, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed >> 12;
            *seed ^= *seed << 25;
            *seed ^= *seed >> 27;
            let bits = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            (bits as f32 / (1u64 << 23) as f32 - 1.0) * scale
        })
        .collect()
}

/// `values` stored in `type_id`, rows of `k` values (quantized types through the backend's
/// own quantizer).
fn encode(type_id: u32, values: &[f32], k: usize) -> Vec<u8> {
    let row = row_size(type_id, k).expect("whole blocks");
    let mut bytes = vec![0u8; values.len() / k * row];
    for (src, dst) in values.chunks(k).zip(bytes.chunks_mut(row)) {
        quantize_row(type_id, src, dst).expect("a quantizable type");
    }
    bytes
}

/// A graph under construction: contiguous tensors packed into one buffer image.
#[derive(Default)]
struct Net {
    image: Vec<u8>,
    tensors: Vec<GraphTensor>,
    /// Where each tensor's bytes start in the image (its location once the buffer exists).
    offsets: Vec<u64>,
    nodes: Vec<TensorIndex>,
}

impl Net {
    fn tensor(&mut self, type_id: u32, ne: [usize; 4], op: Op, srcs: &[TensorIndex]) -> usize {
        let info = type_info(type_id).expect("a ggml type");
        let (block, size) = (info.block_size as usize, info.type_size as usize);
        let nb1 = ne[0] / block * size;
        let nb = [size, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]];
        let mut record = RpcTensor {
            id: self.tensors.len() as u64 + 1,
            type_id,
            buffer: 1,
            ne: ne.map(|n| n as u32),
            nb: nb.map(|n| n as u32),
            op: op.0,
            ..RpcTensor::default()
        };
        let mut src = [None; MAX_SRC];
        for (slot, &s) in srcs.iter().enumerate() {
            src[slot] = Some(s);
            record.src[slot] = u64::from(s) + 1;
        }
        let byte_size = record.byte_size().expect("a valid record");
        // 64-byte aligned, as ggml's allocator places tensors
        let offset = self.image.len().div_ceil(64) * 64;
        self.image.resize(offset + byte_size as usize, 0);
        self.tensors.push(GraphTensor {
            record,
            src,
            view_src: None,
            byte_size,
            location: None,
        });
        self.offsets.push(offset as u64);
        offset
    }

    /// A leaf holding `bytes`.
    fn input(&mut self, type_id: u32, ne: [usize; 4], bytes: &[u8]) -> TensorIndex {
        let offset = self.tensor(type_id, ne, Op::NONE, &[]);
        self.image[offset..offset + bytes.len()].copy_from_slice(bytes);
        self.tensors.len() as TensorIndex - 1
    }

    /// A computed node.
    fn node(
        &mut self,
        op: Op,
        ne: [usize; 4],
        srcs: &[TensorIndex],
        params: &[i32],
    ) -> TensorIndex {
        self.tensor(id::F32, ne, op, srcs);
        let index = self.tensors.len() as TensorIndex - 1;
        let record = &mut self.tensors[index as usize].record;
        record.flags = flags::COMPUTE;
        record.op_params[..params.len()].copy_from_slice(params);
        self.nodes.push(index);
        index
    }

    /// A backend of `threads` threads holding the image, and the graph over it.
    fn load(mut self, threads: usize) -> (CpuBackend, Graph) {
        let backend = CpuBackend::new(CpuConfig {
            threads,
            ..CpuConfig::default()
        });
        let buffer = backend
            .alloc_buffer(0, self.image.len() as u64)
            .expect("memory for the benchmark")
            .id;
        let at = TensorLocation { buffer, offset: 0 };
        backend.write(at, &self.image).expect("the image fits");
        for (tensor, &offset) in self.tensors.iter_mut().zip(&self.offsets) {
            tensor.location = Some(TensorLocation { buffer, offset });
        }
        let graph = Graph {
            device: 0,
            uid: 0,
            nodes: self.nodes,
            tensors: self.tensors,
        };
        (backend, graph)
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn mul_mat(c: &mut Criterion) {
    let mut group = c.benchmark_group("mul_mat");
    let mut seed = 20;
    let (k, m) = (4096, 4096);
    let weights = values(k * m, 0.1, &mut seed);
    for (w_type, n) in [
        (id::F32, 1),
        (id::F16, 1),
        (id::Q8_0, 1),
        (id::Q4_0, 1),
        (id::F16, 64),
        (id::Q4_0, 64),
    ] {
        let mut net = Net::default();
        let w = net.input(w_type, [k, m, 1, 1], &encode(w_type, &weights, k));
        let x = values(k * n, 1.0, &mut seed);
        let x = net.input(id::F32, [k, n, 1, 1], &encode(id::F32, &x, k));
        net.node(Op::MUL_MAT, [m, n, 1, 1], &[w, x], &[]);
        let (backend, graph) = net.load(threads());
        group.throughput(Throughput::Elements((2 * k * m * n) as u64));
        let name = type_info(w_type).expect("a ggml type").name;
        group.bench_function(BenchmarkId::new(name, format!("n{n}")), |b| {
            b.iter(|| backend.graph_compute(0, black_box(&graph)).unwrap())
        });
    }
    group.finish();
}

fn flash_attn(c: &mut Criterion) {
    let mut group = c.benchmark_group("flash_attn");
    let mut seed = 21;
    for (d, heads, kv_heads, n_q, n_kv) in [
        (128, 32, 8, 1, 4096),
        (128, 32, 8, 128, 512),
        // the tiny conformance model's prompt of 64 in llama-bench's cache of 256
        (64, 4, 2, 64, 256),
    ] {
        let mut net = Net::default();
        let q = values(d * n_q * heads, 1.0, &mut seed);
        let q = net.input(id::F32, [d, n_q, heads, 1], &encode(id::F32, &q, d));
        let kv = values(d * n_kv * kv_heads, 1.0, &mut seed);
        let k = net.input(id::F16, [d, n_kv, kv_heads, 1], &encode(id::F16, &kv, d));
        let v = net.input(id::F16, [d, n_kv, kv_heads, 1], &encode(id::F16, &kv, d));
        let mask = encode(id::F16, &vec![0.0; n_kv * n_q], n_kv);
        let mask = net.input(id::F16, [n_kv, n_q, 1, 1], &mask);
        let scale = 0.1f32.to_bits() as i32;
        net.node(
            Op::FLASH_ATTN_EXT,
            [d, heads, n_q, 1],
            &[q, k, v, mask],
            &[scale, 0, 0, 0],
        );
        let (backend, graph) = net.load(threads());
        group.bench_function(format!("d{d}_h{heads}_q{n_q}_kv{n_kv}"), |b| {
            b.iter(|| backend.graph_compute(0, black_box(&graph)).unwrap())
        });
    }
    group.finish();
}

fn node_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("node_overhead");
    let mut seed = 23;
    let ne = [4096, 16, 1, 1];
    let x = values(4096 * 16, 1.0, &mut seed);
    let one = 1.0f32.to_bits() as i32;
    for threads in [1, 2, 4, 8] {
        let mut net = Net::default();
        let mut h = net.input(id::F32, ne, &encode(id::F32, &x, 4096));
        for _ in 0..300 {
            h = net.node(Op::SCALE, ne, &[h], &[one, 0]);
        }
        let (backend, graph) = net.load(threads);
        group.bench_function(BenchmarkId::new("300_scale_nodes", threads), |b| {
            b.iter(|| backend.graph_compute(0, black_box(&graph)).unwrap())
        });
    }
    group.finish();
}

fn main() {
    common::run(10, 500, 3000, &[mul_mat, flash_attn, node_overhead]);
}
