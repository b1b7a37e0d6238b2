//! `graph_compute`: small graphs of any op, type, shape, layout and `op_params` through the CPU
//! backend's planner and kernels (`backend_cpu::CpuBackend::graph_compute`).
//!
//! The backend must refuse a node it cannot run or compute it; it must never panic, read or
//! write outside the buffer, or hang. Its engine turns a kernel panic into an error so that a
//! server survives one: this harness reports that error as a crash instead.
//!
//! Input layout (integers little-endian, zero once the input runs out):
//! * `threads: u8` (compute threads, `1 + x % 3`), `fill: u64` (seed of the buffer's bytes);
//! * `count: u8` (tensors, `1 + x % MAX_TENSORS`), then per tensor a [`TensorSpec`]: `op: u8`
//!   (0 = a leaf; else op id `x - 1` modulo the op table, so ids past ggml's table are
//!   refused by the decoder), `ty: u8` (index into [`TYPES`]), `ne: [u8; 4]` (`ne0 = x % 33`,
//!   the others `x % 9`; quantized types count blocks in `ne0`), `layout: u8` (bits 0-6:
//!   contiguous or one of the permutations of [`PERMUTATIONS`]; bit 7: an op node takes its
//!   first source's `ne` instead), `offset: u16` (bytes into the buffer in
//!   16-byte steps; tensors may overlap or run past the end), `srcs: [u8; 4]` (0 = none, else
//!   tensor `(x - 1) % i` of the ones before it), `params: u8` (how `op_params` are read:
//!   bit 0 full `i32`s, else small integers, bit 1 then the floats `x / 8`), then the 16
//!   `op_params` as `i32` or `i8` accordingly.

use std::cell::RefCell;

use arbitrary::{Arbitrary, Unstructured};
use backend_cpu::{CpuBackend, CpuConfig, MemoryCapacity, PagePolicy};
use proto_core::backend::{Backend, BufferId, TensorLocation};
use proto_core::ggml::{flags, type_info, types::id as ty, GgmlTable, OP_COUNT};
use proto_core::graph::{Graph, GraphLimits};
use proto_core::wire::{GraphComputeRequest, RpcTensor};
use proto_core::{Error, Result};

use crate::byte;

/// Most tensors in one graph.
pub const MAX_TENSORS: usize = 8;
/// The one buffer every tensor lives in.
pub const BUFFER_SIZE: u64 = 1 << 20;
/// The buffer's handle on the wire and the address of its first byte.
const HANDLE: u64 = 1;
const BASE: u64 = 0x10_0000;

/// The tensor types a graph uses: the float and integer types, common quantized ones.
pub const TYPES: [u32; 10] = [
    ty::F32,
    ty::F16,
    ty::BF16,
    ty::I32,
    I64,
    ty::Q8_0,
    ty::Q4_0,
    ty::Q4_K,
    Q6_K,
    I16,
];
/// ggml type ids proto-core has no constant for.
const I64: u32 = 27;
const Q6_K: u32 = 14;
const I16: u32 = 25;

/// Dimension orders of a non-contiguous tensor: `ne`/`nb` of the contiguous layout, permuted.
pub const PERMUTATIONS: [[usize; 4]; 3] = [[1, 0, 2, 3], [0, 2, 1, 3], [2, 1, 0, 3]];

/// One tensor, as read from the input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorSpec {
    /// 0: a leaf; else `1 + op id`.
    pub op: u8,
    /// Index into [`TYPES`] (modulo).
    pub ty: u8,
    /// Dimension selectors.
    pub ne: [u8; 4],
    /// Bits 0-6: 0 contiguous, `1 + i` [`PERMUTATIONS`]`[i]` (modulo); bit 7: an op node
    /// takes its first source's `ne`.
    pub layout: u8,
    /// Offset in 16-byte steps.
    pub offset: u16,
    /// Source selectors.
    pub srcs: [u8; 4],
    /// `op_params`.
    pub params: [i32; 16],
}

/// A whole input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputeInput {
    /// Threads selector.
    pub threads: u8,
    /// Seed of the buffer's bytes.
    pub fill: u64,
    /// The tensors, sources before users.
    pub tensors: Vec<TensorSpec>,
}

impl ComputeInput {
    /// Reads an input.
    pub fn read(data: &[u8]) -> ComputeInput {
        let mut u = Unstructured::new(data);
        let threads = byte(&mut u);
        let fill = u64::arbitrary(&mut u).unwrap_or(0);
        let count = 1 + usize::from(byte(&mut u)) % MAX_TENSORS;
        let tensors = (0..count)
            .map(|_| {
                let mut t = TensorSpec {
                    op: byte(&mut u),
                    ty: byte(&mut u),
                    ne: [byte(&mut u), byte(&mut u), byte(&mut u), byte(&mut u)],
                    layout: byte(&mut u),
                    offset: u16::arbitrary(&mut u).unwrap_or(0),
                    srcs: [byte(&mut u), byte(&mut u), byte(&mut u), byte(&mut u)],
                    params: [0; 16],
                };
                let how = byte(&mut u);
                for p in &mut t.params {
                    *p = if how & 1 == 1 {
                        i32::arbitrary(&mut u).unwrap_or(0)
                    } else {
                        let small = i32::from(i8::arbitrary(&mut u).unwrap_or(0));
                        if how & 2 == 2 {
                            (small as f32 / 8.0).to_bits() as i32
                        } else {
                            small
                        }
                    };
                }
                t
            })
            .collect();
        ComputeInput {
            threads,
            fill,
            tensors,
        }
    }

    /// The input's bytes (full `i32` parameters), for seeds.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.threads];
        out.extend_from_slice(&self.fill.to_le_bytes());
        out.push(self.tensors.len().saturating_sub(1) as u8);
        for t in &self.tensors {
            out.push(t.op);
            out.push(t.ty);
            out.extend_from_slice(&t.ne);
            out.push(t.layout);
            out.extend_from_slice(&t.offset.to_le_bytes());
            out.extend_from_slice(&t.srcs);
            out.push(1);
            for p in t.params {
                out.extend_from_slice(&p.to_le_bytes());
            }
        }
        out
    }

    /// The GRAPH_COMPUTE request: tensor `i` has id `i + 1`; every op tensor is a node.
    pub fn request(&self) -> GraphComputeRequest {
        let mut tensors = Vec::new();
        let mut node_ids = Vec::new();
        for (i, spec) in self.tensors.iter().enumerate() {
            let type_id = TYPES[usize::from(spec.ty) % TYPES.len()];
            let block = type_info(type_id).map_or(1, |info| info.block_size);
            let ne = [
                u32::from(spec.ne[0] % 33) * block,
                u32::from(spec.ne[1] % 9),
                u32::from(spec.ne[2] % 9),
                u32::from(spec.ne[3] % 9),
            ];
            // layout bit 7: an op node takes its first source's shape (most ops keep it)
            let first = spec.srcs[0];
            let ne = if spec.op > 0 && spec.layout & 0x80 != 0 && first > 0 && i > 0 {
                tensors
                    .get(usize::from(first - 1) % i)
                    .map_or(ne, |src: &RpcTensor| src.ne)
            } else {
                ne
            };
            let mut tensor = RpcTensor::contiguous(i as u64 + 1, type_id, ne)
                .unwrap_or_else(|| RpcTensor::contiguous(i as u64 + 1, ty::F32, ne).expect("F32"));
            if spec.layout & 0x7f > 0 {
                let axes = PERMUTATIONS[usize::from((spec.layout & 0x7f) - 1) % PERMUTATIONS.len()];
                let (ne, nb) = (tensor.ne, tensor.nb);
                for d in 0..4 {
                    tensor.ne[axes[d]] = ne[d];
                    tensor.nb[axes[d]] = nb[d];
                }
            }
            tensor.buffer = HANDLE;
            tensor.data = BASE + u64::from(spec.offset) * 16;
            if spec.op > 0 {
                tensor.op = (u32::from(spec.op) - 1) % OP_COUNT;
                tensor.flags = flags::COMPUTE;
                for (slot, &s) in spec.srcs.iter().enumerate() {
                    if s > 0 && i > 0 {
                        tensor.src[slot] = (usize::from(s - 1) % i) as u64 + 1;
                    }
                }
                node_ids.push(tensor.id);
            }
            tensor.op_params = spec.params;
            tensors.push(tensor);
        }
        GraphComputeRequest {
            device: 0,
            uid: 0,
            node_ids,
            tensors,
        }
    }
}

/// How one input ended.
#[derive(Debug)]
pub enum ComputeOutcome {
    /// The decoder refused the graph (a shape, link or storage the protocol forbids).
    Undecodable(Error),
    /// The backend refused or failed it cleanly.
    Refused(Error),
    /// It ran.
    Computed,
}

/// Runs one input: decode against the one buffer, then compute.
///
/// # Panics
/// When the engine reports a panicked kernel, or the buffer's size changed.
pub fn run(data: &[u8]) -> ComputeOutcome {
    let input = ComputeInput::read(data);
    let threads = 1 + usize::from(input.threads) % 3;
    BACKENDS.with_borrow_mut(|backends| {
        let (backend, buffer) = backends[threads - 1].get_or_insert_with(|| {
            let backend = CpuBackend::new(CpuConfig {
                threads,
                pages: PagePolicy::Base,
                capacity: MemoryCapacity::Bytes(u64::MAX),
            });
            let buffer = backend
                .alloc_buffer(0, BUFFER_SIZE)
                .expect("a 1 MiB buffer")
                .id;
            (backend, buffer)
        });
        compute(&input, backend, *buffer)
    })
}

thread_local! {
    /// One backend per thread count with its one buffer, kept from input to input: a fresh
    /// backend and buffer per input spent most of the run in page faults. Every input fills
    /// the whole buffer first, so none sees another's bytes.
    static BACKENDS: RefCell<[Option<(CpuBackend, BufferId)>; 3]> =
        const { RefCell::new([None, None, None]) };
}

/// [`run`] on `backend`, whose `buffer` is the graph's.
fn compute(input: &ComputeInput, backend: &CpuBackend, buffer: BufferId) -> ComputeOutcome {
    // Arbitrary bytes (NaNs, huge ids, ...) where the graph's values come from.
    let mut state = input.fill | 1;
    let pattern: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for offset in (0..BUFFER_SIZE).step_by(pattern.len()) {
        backend
            .write(TensorLocation { buffer, offset }, &pattern)
            .expect("fill the buffer");
    }
    let request = input.request();
    let mut resolve = |record: &RpcTensor, size: u64| -> Result<Option<TensorLocation>> {
        if record.buffer == 0 && record.data == 0 {
            return Ok(None);
        }
        let offset = record.data.wrapping_sub(BASE);
        let inside = record.buffer == HANDLE
            && record.data >= BASE
            && offset
                .checked_add(size)
                .is_some_and(|end| end <= BUFFER_SIZE);
        if !inside {
            return Err(Error::InvalidGraph(
                proto_core::graph::GraphError::OutsideBuffer { tensor: record.id },
            ));
        }
        Ok(Some(TensorLocation { buffer, offset }))
    };
    let graph = match Graph::decode(&request, &GraphLimits::DEFAULT, GgmlTable::V8_0_1, &mut resolve)
    {
        Ok(graph) => graph,
        Err(error) => return ComputeOutcome::Undecodable(error),
    };
    let outcome = match backend.graph_compute(0, &graph) {
        Ok(()) => ComputeOutcome::Computed,
        Err(Error::Backend(message)) if message.contains("panicked") => {
            panic!("a kernel panicked on {request:?}")
        }
        Err(error) => ComputeOutcome::Refused(error),
    };
    assert_eq!(
        backend.used_bytes(),
        BUFFER_SIZE,
        "the buffer is still there"
    );
    outcome
}
