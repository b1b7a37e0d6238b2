//! Unit tests of [`CpuBackend`] through the [`Backend`] trait.

use std::sync::Arc;

use proto_core::ggml::types::id;
use proto_core::ggml::{flags, Op};
use proto_core::graph::GraphTensor;
use proto_core::wire::MAX_SRC;
use proto_core::ErrorKind;

use super::*;

fn backend() -> CpuBackend {
    CpuBackend::new(CpuConfig {
        threads: 2,
        ..CpuConfig::default()
    })
}

fn at(buffer: BufferId, offset: u64) -> TensorLocation {
    TensorLocation { buffer, offset }
}

fn alloc(backend: &CpuBackend, size: u64) -> BufferId {
    let buffer = backend.alloc_buffer(0, size).expect("allocation");
    assert_eq!(buffer.size, size);
    buffer.id
}

#[test]
fn answers_device_queries_like_ggml_cpu() {
    let backend = backend();
    assert_eq!(backend.device_count(), 1);
    assert_eq!(backend.device_name(), "CPU");
    assert_eq!(backend.alignment(0), 32);
    assert_eq!(backend.max_size(0), u64::MAX);
    let q4k = RpcTensor::contiguous(1, id::Q4_K, [512, 3, 1, 1]).unwrap();
    assert_eq!(backend.alloc_size(0, &q4k).unwrap(), 3 * 2 * 144);
    // Not a multiple of 512 elements: GPU backends pad these, the CPU does not.
    let q8 = RpcTensor::contiguous(1, id::Q8_0, [96, 5, 1, 1]).unwrap();
    assert_eq!(backend.alloc_size(0, &q8).unwrap(), 5 * 3 * 34);
    let mut strided = RpcTensor::contiguous(1, id::F32, [4, 2, 1, 1]).unwrap();
    strided.nb[1] = 64;
    assert_eq!(backend.alloc_size(0, &strided).unwrap(), 4 * 4 + 64);
    let memory = backend.device_memory(0);
    assert!(memory.free <= memory.total);
}

#[test]
fn the_capacity_bounds_allocations_and_free_memory() {
    let gib = 1u64 << 30;
    let host = DeviceMemory {
        free: 20 * gib,
        total: 24 * gib,
    };
    // A tenth of the total (at least 1 GiB) stays with the system and the server.
    let available = MemoryCapacity::Available.resolve(|| Some(host));
    assert_eq!(available, 20 * gib - 24 * gib / 10);
    let small = DeviceMemory {
        free: 3 * gib,
        total: 4 * gib,
    };
    assert_eq!(MemoryCapacity::Available.resolve(|| Some(small)), 2 * gib);
    assert_eq!(MemoryCapacity::Available.resolve(|| None), u64::MAX);
    assert_eq!(MemoryCapacity::Bytes(5).resolve(|| unreachable!()), 5);

    let backend = CpuBackend::new(CpuConfig {
        threads: 1,
        capacity: MemoryCapacity::Bytes(1 << 20),
        ..CpuConfig::default()
    });
    assert_eq!(backend.capacity(), 1 << 20);
    let first = alloc(&backend, 700 << 10);
    assert!(backend.device_memory(0).free <= 324 << 10);
    assert!(
        backend.alloc_buffer(0, 400 << 10).is_none(),
        "refused like a failed allocation"
    );
    backend.free_buffer(first);
    assert!(backend.device_memory(0).free <= 1 << 20);
    alloc(&backend, 1 << 20);
    assert_eq!(backend.device_memory(0).free, 0);
}

#[test]
fn threads_are_stored_and_never_zero() {
    assert_eq!(
        CpuBackend::new(CpuConfig {
            threads: 7,
            ..CpuConfig::default()
        })
        .threads(),
        7
    );
    assert_eq!(
        CpuBackend::new(CpuConfig {
            threads: 0,
            ..CpuConfig::default()
        })
        .threads(),
        1
    );
    assert!(CpuConfig::default().threads >= 1);
}

#[test]
fn write_read_fill_clear_round_trip() {
    let backend = backend();
    let buffer = alloc(&backend, 64);
    let mut out = [0xffu8; 64];
    backend.read(at(buffer, 0), &mut out).unwrap();
    assert_eq!(out, [0u8; 64], "buffers start zeroed");

    let data: Vec<u8> = (1..=16).collect();
    backend.write(at(buffer, 8), &data).unwrap();
    backend.fill(at(buffer, 30), 4, 0xee).unwrap();
    backend.read(at(buffer, 0), &mut out).unwrap();
    assert_eq!(&out[..8], &[0; 8]);
    assert_eq!(&out[8..24], &data[..]);
    assert_eq!(&out[24..30], &[0; 6]);
    assert_eq!(&out[30..34], &[0xee; 4]);

    backend.clear_buffer(buffer, 0x5a).unwrap();
    backend.read(at(buffer, 0), &mut out).unwrap();
    assert_eq!(out, [0x5a; 64]);

    // Empty regions, also at the very end.
    backend.write(at(buffer, 64), &[]).unwrap();
    backend.fill(at(buffer, 64), 0, 1).unwrap();
}

#[test]
fn regions_outside_the_buffer_are_errors_not_panics() {
    let backend = backend();
    let buffer = alloc(&backend, 32);
    let out_of_bounds = |r: Result<()>| assert_eq!(r.unwrap_err().kind(), ErrorKind::OutOfBounds);
    out_of_bounds(backend.write(at(buffer, 30), &[0; 3]));
    out_of_bounds(backend.write(at(buffer, 33), &[]));
    out_of_bounds(backend.read(at(buffer, u64::MAX), &mut [0; 1]));
    out_of_bounds(backend.fill(at(buffer, 1), u64::MAX, 0));
    out_of_bounds(backend.fill(at(buffer, 0), 33, 0));
    out_of_bounds(backend.copy(at(buffer, 0), at(buffer, 17), 16).map(|_| ()));
    out_of_bounds(backend.copy(at(buffer, 17), at(buffer, 0), 16).map(|_| ()));
    let tensor = RpcTensor::contiguous(1, id::F32, [4, 1, 1, 1]).unwrap();
    out_of_bounds(backend.init_tensor(at(buffer, 17), &tensor));
    backend.init_tensor(at(buffer, 16), &tensor).unwrap();
    // Nothing was written by the refused calls.
    let mut out = [1u8; 32];
    backend.read(at(buffer, 0), &mut out).unwrap();
    assert_eq!(out, [0; 32]);
}

#[test]
fn lends_exactly_the_region_in_place_and_bounds_checks_it() {
    let backend = backend();
    let buffer = alloc(&backend, 64);
    let filled = backend
        .write_in_place(at(buffer, 8), 16, &mut |dst| {
            assert_eq!(dst.len(), 16);
            dst[..10].copy_from_slice(&[5; 10]);
            10
        })
        .unwrap();
    assert_eq!(filled, Some(10));
    let mut seen = Vec::new();
    let drained = backend
        .read_in_place(at(buffer, 4), 24, &mut |src| {
            seen.extend_from_slice(src);
            src.len()
        })
        .unwrap();
    assert_eq!(drained, Some(24));
    let mut expected = vec![0u8; 24];
    expected[4..14].fill(5);
    assert_eq!(seen, expected);
    for (offset, len) in [(60, 8), (64, 1), (u64::MAX, 1)] {
        let error = backend
            .write_in_place(at(buffer, offset), len, &mut |_| unreachable!())
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::OutOfBounds, "{offset} {len}");
        let error = backend
            .read_in_place(at(buffer, offset), len, &mut |_| unreachable!())
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::OutOfBounds, "{offset} {len}");
    }
}

#[test]
fn unknown_and_freed_buffers_are_backend_errors() {
    let backend = backend();
    let buffer = alloc(&backend, 8);
    backend.free_buffer(buffer);
    let unknown = |r: Result<()>| assert_eq!(r.unwrap_err().kind(), ErrorKind::Backend);
    unknown(backend.write(at(buffer, 0), &[1]));
    unknown(backend.read(at(buffer, 0), &mut [0]));
    unknown(backend.clear_buffer(buffer, 0));
    unknown(backend.fill(at(BufferId(0), 0), 1, 0));
    let other = alloc(&backend, 8);
    unknown(backend.copy(at(buffer, 0), at(other, 0), 1).map(|_| ()));
    unknown(backend.copy(at(other, 0), at(buffer, 0), 1).map(|_| ()));
    // Freeing an unknown buffer is a no-op.
    backend.free_buffer(buffer);
    assert_eq!(backend.live_buffers(), 1);
}

#[test]
fn copies_between_buffers_and_within_one() {
    let backend = backend();
    let a = alloc(&backend, 16);
    let b = alloc(&backend, 16);
    let pattern: Vec<u8> = (0..16).collect();
    backend.write(at(a, 0), &pattern).unwrap();
    // Both id orders take the two-lock path.
    assert!(backend.copy(at(a, 2), at(b, 0), 8).unwrap());
    assert!(backend.copy(at(b, 0), at(a, 8), 8).unwrap());
    let mut out = [0u8; 16];
    backend.read(at(b, 0), &mut out).unwrap();
    assert_eq!(&out[..8], &pattern[2..10]);
    assert_eq!(&out[8..], &[0; 8]);
    backend.read(at(a, 0), &mut out).unwrap();
    assert_eq!(&out[..8], &pattern[..8]);
    assert_eq!(&out[8..], &pattern[2..10]);
    // Overlapping within one buffer behaves like memmove.
    backend.write(at(a, 0), &pattern).unwrap();
    backend.copy(at(a, 0), at(a, 1), 15).unwrap();
    backend.read(at(a, 0), &mut out).unwrap();
    assert_eq!(out, [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    assert!(backend.copy(at(a, 16), at(b, 16), 0).unwrap());
}

#[test]
fn allocation_failures_are_soft_and_accounting_balances() {
    let backend = backend();
    assert!(backend.alloc_buffer(0, u64::MAX).is_none());
    assert!(backend.alloc_buffer(0, 1 << 63).is_none());
    assert!(backend.alloc_buffer(1, 16).is_none());
    assert_eq!((backend.used_bytes(), backend.live_buffers()), (0, 0));

    let empty = alloc(&backend, 0);
    let a = alloc(&backend, 1000);
    let b = alloc(&backend, 24);
    assert_ne!(a, b);
    assert_eq!((backend.used_bytes(), backend.live_buffers()), (1024, 3));
    backend.clear_buffer(empty, 7).unwrap();
    for id in [empty, a, b] {
        backend.free_buffer(id);
    }
    assert_eq!((backend.used_bytes(), backend.live_buffers()), (0, 0));
}

#[test]
fn many_threads_with_their_own_buffers() {
    let backend = Arc::new(backend());
    let workers: Vec<_> = (0..8u8)
        .map(|n| {
            let backend = backend.clone();
            std::thread::spawn(move || {
                for round in 0..50u8 {
                    let buffer = alloc(&backend, 4096);
                    let data = vec![n ^ round; 4096];
                    backend.write(at(buffer, 0), &data).unwrap();
                    let mut out = vec![0u8; 4096];
                    backend.read(at(buffer, 0), &mut out).unwrap();
                    assert_eq!(out, data);
                    backend.free_buffer(buffer);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!((backend.used_bytes(), backend.live_buffers()), (0, 0));
}

// --- graphs -------------------------------------------------------------------------------

/// A graph tensor located in `buffer` at `offset`.
fn tensor(id: u64, op: Op, compute: bool, location: Option<TensorLocation>) -> GraphTensor {
    let mut record = RpcTensor::contiguous(id, id::F32, [4, 4, 1, 1]).unwrap();
    record.op = op.0;
    if compute {
        record.flags = flags::COMPUTE;
    }
    GraphTensor {
        byte_size: record.byte_size().unwrap(),
        record,
        src: [None; MAX_SRC],
        view_src: None,
        location,
    }
}

fn graph(tensors: Vec<GraphTensor>, nodes: Vec<u32>) -> Graph {
    Graph {
        device: 0,
        uid: 0,
        nodes,
        tensors,
    }
}

#[test]
fn graphs_of_layout_ops_succeed_without_touching_memory() {
    let backend = backend();
    let buffer = alloc(&backend, 64);
    backend.write(at(buffer, 0), &[9; 64]).unwrap();
    let mut tensors = vec![tensor(1, Op::NONE, false, Some(at(buffer, 0)))];
    for (n, op) in [Op::RESHAPE, Op::VIEW, Op::PERMUTE, Op::TRANSPOSE, Op::NONE]
        .into_iter()
        .enumerate()
    {
        let mut view = tensor(n as u64 + 2, op, true, Some(at(buffer, 0)));
        view.src[0] = Some(0);
        view.view_src = Some(0);
        tensors.push(view);
    }
    let g = graph(tensors, vec![1, 2, 3, 4, 5]);
    backend.graph_compute(0, &g).unwrap();
    let mut out = [0u8; 64];
    backend.read(at(buffer, 0), &mut out).unwrap();
    assert_eq!(out, [9; 64]);
}

#[test]
fn mul_mat_runs_and_unsupported_ops_are_refused_unless_skipped() {
    let backend = backend();
    let buffer = alloc(&backend, 192);
    // a = [[1..4], [5..8], ...] (4 rows of 4), b = the identity plus 1 everywhere
    let a_values: Vec<f32> = (1..=16).map(|v| v as f32).collect();
    let b_values: Vec<f32> = (0..16)
        .map(|i| if i % 5 == 0 { 2.0 } else { 1.0 })
        .collect();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    backend.write(at(buffer, 0), &bytes(&a_values)).unwrap();
    backend.write(at(buffer, 64), &bytes(&b_values)).unwrap();
    let a = tensor(1, Op::NONE, false, Some(at(buffer, 0)));
    let b = tensor(2, Op::NONE, false, Some(at(buffer, 64)));
    let mut product = tensor(3, Op::MUL_MAT, true, Some(at(buffer, 128)));
    product.src[0] = Some(0);
    product.src[1] = Some(1);
    let mut reshape = tensor(4, Op::RESHAPE, true, Some(at(buffer, 128)));
    reshape.src[0] = Some(2);
    reshape.view_src = Some(2);

    // dst[i, j] = row i of a . row j of b (ggml's MUL_MAT): row_i . (1, ..., 1) + a[i][j]
    let g = graph(
        vec![a.clone(), b.clone(), product.clone(), reshape.clone()],
        vec![2, 3],
    );
    backend.graph_compute(0, &g).unwrap();
    let mut out = [0u8; 64];
    backend.read(at(buffer, 128), &mut out).unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for j in 0..4 {
        for i in 0..4 {
            let row = &a_values[i * 4..i * 4 + 4];
            let want = row.iter().sum::<f32>() + row[j];
            assert_eq!(got[j * 4 + i], want, "dst[{i}, {j}]");
        }
    }

    // An op without a kernel after a computable node: refused as a whole, before anything
    // runs (the product's bytes are not rewritten).
    backend.fill(at(buffer, 128), 64, 0).unwrap();
    let mut conv = tensor(5, Op::WIN_PART, true, Some(at(buffer, 128)));
    conv.src[0] = Some(0);
    conv.src[1] = Some(1);
    let g = graph(
        vec![a.clone(), b.clone(), product.clone(), reshape, conv],
        vec![2, 3, 4],
    );
    let err = backend.graph_compute(0, &g).unwrap_err();
    assert_eq!(
        err,
        Error::OpRefused {
            op: Op::WIN_PART.0,
            reason: compute::NOT_IMPLEMENTED
        }
    );
    backend.read(at(buffer, 128), &mut out).unwrap();
    assert_eq!(out, [0u8; 64]);

    // Without the COMPUTE flag the node is skipped, as ggml's CPU backend does.
    let mut skipped = tensor(5, Op::CONV_2D, false, Some(at(buffer, 128)));
    skipped.src[0] = Some(0);
    backend
        .graph_compute(0, &graph(vec![a, b, skipped], vec![2]))
        .unwrap();

    // An ADD without its sources breaks the op's rules.
    let g = graph(vec![tensor(1, Op::ADD, true, Some(at(buffer, 0)))], vec![0]);
    assert_eq!(
        backend.graph_compute(0, &g).unwrap_err().kind(),
        ErrorKind::InvalidGraph
    );
    assert_eq!(
        backend.graph_compute(1, &g).unwrap_err().kind(),
        ErrorKind::InvalidDevice
    );
}

#[test]
fn layout_ops_are_ggml_op_is_empty() {
    // ggml_op_is_empty (ggml-impl.h): NONE, RESHAPE, TRANSPOSE, VIEW, PERMUTE; nothing else.
    let empty: Vec<u32> = (0..proto_core::ggml::OP_COUNT)
        .filter(|&op| Op(op).is_view())
        .collect();
    assert_eq!(empty, vec![0, 36, 37, 38, 39]);
}

#[test]
fn a_stored_plan_is_never_trusted_past_its_buffers() {
    let backend = backend();
    let buffer = alloc(&backend, 192);
    let a = tensor(1, Op::NONE, false, Some(at(buffer, 0)));
    let b = tensor(2, Op::NONE, false, Some(at(buffer, 64)));
    let mut product = tensor(3, Op::MUL_MAT, true, Some(at(buffer, 128)));
    product.src[0] = Some(0);
    product.src[1] = Some(1);
    let g = graph(vec![a, b, product], vec![2]);
    let mut slot = None;
    backend.graph_compute_stored(0, &g, &mut slot).unwrap();
    backend.graph_compute_stored(0, &g, &mut slot).unwrap();
    assert_eq!(backend.plans_built(), 1);
    // The dispatcher drops the slot on FREE_BUFFER; even a slot kept past it (a dispatcher
    // bug) only reaches the freed buffer by id, which fails instead of touching freed memory.
    backend.free_buffer(buffer);
    let refused = backend.graph_compute_stored(0, &g, &mut slot).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Backend);
    // A slot prepared for another backend (or holding something else) is planned afresh.
    let other = alloc(&backend, 192);
    let mut moved = g.clone();
    for tensor in &mut moved.tensors {
        tensor.location = tensor.location.map(|l| at(other, l.offset));
    }
    let mut foreign: Option<proto_core::backend::PreparedGraph> = Some(Box::new(7u32));
    backend
        .graph_compute_stored(0, &moved, &mut foreign)
        .unwrap();
    assert_eq!(backend.plans_built(), 2);
}
