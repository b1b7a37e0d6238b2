//! Tests of the compute engine: each kernel against a naive reference written here (f64
//! accumulation), on random shapes, non-contiguous views and broadcast cases; the refusals;
//! run-time id checks; and thread-count independence.
//!
//! The harness ([`G`]) lays tensors out in one buffer of a real [`BufferPool`], builds the
//! [`Graph`] the decoder would hand over (records, links, locations), runs it through
//! [`crate::compute::run`] and reads the results back in logical (row-major) order.

use proto_core::backend::{BufferId, TensorLocation};
use proto_core::ggml::types::id as ty;
use proto_core::ggml::{flags, GluOp, Op, UnaryOp};
use proto_core::graph::{Graph, GraphTensor, TensorIndex};
use proto_core::wire::{RpcTensor, MAX_SRC};
use proto_core::{Error, ErrorKind, Result};

use crate::buffers::BufferPool;
use crate::compute::ops::{gelu_exact, gelu_quick_exact};
use crate::compute::quant;
use crate::compute::view::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

const I64: u32 = 27;
const BUFFER_SIZE: u64 = 256 << 20;

// --- harness -------------------------------------------------------------------------------

/// Deterministic pseudo-random numbers (xorshift64*).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub(super) fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub(super) fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

fn type_size(type_id: u32) -> (usize, usize) {
    let info = proto_core::ggml::type_info(type_id).expect("valid type");
    (info.block_size as usize, info.type_size as usize)
}

pub(super) fn contiguous_nb(type_id: u32, ne: [usize; 4]) -> [usize; 4] {
    let (block, size) = type_size(type_id);
    let nb1 = ne[0] / block * size;
    [size, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]]
}

/// Values as stored in `type_id` (F32, F16, BF16, I32), back as f32.
pub(super) fn stored(type_id: u32, values: &[f32]) -> Vec<f32> {
    values
        .iter()
        .map(|&v| match type_id {
            ty::F16 => f16_to_f32(f32_to_f16(v)),
            ty::BF16 => bf16_to_f32(f32_to_bf16(v)),
            ty::I32 => v as i32 as f32,
            ty::F8_E4M3 => quant::f8_e4m3_to_f32(quant::f32_to_f8_e4m3(v)),
            _ => v,
        })
        .collect()
}

fn encode_values(type_id: u32, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in values {
        match type_id {
            ty::F32 => out.extend_from_slice(&v.to_le_bytes()),
            ty::F16 => out.extend_from_slice(&f32_to_f16(v).to_le_bytes()),
            ty::BF16 => out.extend_from_slice(&f32_to_bf16(v).to_le_bytes()),
            ty::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            ty::F8_E4M3 => out.push(quant::f32_to_f8_e4m3(v)),
            other => panic!("cannot encode type {other}"),
        }
    }
    out
}

/// One graph in one buffer.
pub(super) struct G {
    pool: BufferPool,
    buffer: BufferId,
    image: Vec<u8>,
    pub(super) tensors: Vec<GraphTensor>,
    nodes: Vec<TensorIndex>,
}

impl G {
    pub(super) fn new() -> G {
        let pool = BufferPool::default();
        let buffer = pool.alloc(BUFFER_SIZE).expect("test buffer");
        G {
            pool,
            buffer,
            image: Vec::new(),
            tensors: Vec::new(),
            nodes: Vec::new(),
        }
    }

    fn alloc(&mut self, bytes: usize) -> usize {
        let offset = self.image.len().div_ceil(32) * 32;
        self.image.resize(offset + bytes, 0);
        offset
    }

    fn push(
        &mut self,
        mut record: RpcTensor,
        location: Option<usize>,
        srcs: &[TensorIndex],
        view_src: Option<TensorIndex>,
    ) -> TensorIndex {
        let index = self.tensors.len() as TensorIndex;
        record.id = u64::from(index) + 1;
        let mut src = [None; MAX_SRC];
        for (slot, &s) in srcs.iter().enumerate() {
            if s != NONE {
                src[slot] = Some(s);
                record.src[slot] = u64::from(s) + 1;
            }
        }
        if let Some(v) = view_src {
            record.view_src = u64::from(v) + 1;
        }
        self.tensors.push(GraphTensor {
            byte_size: record.byte_size().expect("valid record"),
            record,
            src,
            view_src,
            location: location.map(|offset| TensorLocation {
                buffer: self.buffer,
                offset: offset as u64,
            }),
        });
        index
    }

    fn record(type_id: u32, ne: [usize; 4], nb: [usize; 4]) -> RpcTensor {
        RpcTensor {
            type_id,
            buffer: 1,
            ne: ne.map(|n| n as u32),
            nb: nb.map(|n| n as u32),
            ..RpcTensor::default()
        }
    }

    /// A contiguous leaf holding `bytes`.
    pub(super) fn input_bytes(
        &mut self,
        type_id: u32,
        ne: [usize; 4],
        bytes: &[u8],
    ) -> TensorIndex {
        let record = Self::record(type_id, ne, contiguous_nb(type_id, ne));
        let size = record.byte_size().unwrap() as usize;
        assert_eq!(size, bytes.len(), "data size of {ne:?}");
        let offset = self.alloc(size);
        self.image[offset..offset + size].copy_from_slice(bytes);
        self.push(record, Some(offset), &[], None)
    }

    /// A contiguous leaf of F32/F16/BF16/I32 values.
    pub(super) fn input(&mut self, type_id: u32, ne: [usize; 4], values: &[f32]) -> TensorIndex {
        assert_eq!(values.len(), ne.iter().product::<usize>());
        self.input_bytes(type_id, ne, &encode_values(type_id, values))
    }

    pub(super) fn ids(&mut self, type_id: u32, ne: [usize; 4], ids: &[i64]) -> TensorIndex {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| {
                if type_id == I64 {
                    i.to_le_bytes().to_vec()
                } else {
                    (i as i32).to_le_bytes().to_vec()
                }
            })
            .collect();
        self.input_bytes(type_id, ne, &bytes)
    }

    /// A zeroed contiguous leaf.
    pub(super) fn zeros(&mut self, type_id: u32, ne: [usize; 4]) -> TensorIndex {
        let record = Self::record(type_id, ne, contiguous_nb(type_id, ne));
        let offset = self.alloc(record.byte_size().unwrap() as usize);
        self.push(record, Some(offset), &[], None)
    }

    /// A layout-only view of `of` (`ggml_view_4d`), not a node.
    pub(super) fn view(
        &mut self,
        of: TensorIndex,
        ne: [usize; 4],
        nb: [usize; 4],
        offset: usize,
    ) -> TensorIndex {
        let base = &self.tensors[of as usize];
        let mut record = Self::record(base.record.type_id, ne, nb);
        record.op = Op::VIEW.0;
        record.view_offs = offset as u64;
        let at = base.location.map(|l| l.offset as usize + offset);
        self.push(record, at, &[of], Some(of))
    }

    /// `ggml_permute(of, axes)`: dimension `i` of `of` becomes dimension `axes[i]`.
    pub(super) fn permute(&mut self, of: TensorIndex, axes: [usize; 4]) -> TensorIndex {
        let r = &self.tensors[of as usize].record;
        let (mut ne, mut nb) = ([0usize; 4], [0usize; 4]);
        for i in 0..4 {
            ne[axes[i]] = r.ne[i] as usize;
            nb[axes[i]] = r.nb[i] as usize;
        }
        self.view(of, ne, nb, 0)
    }

    fn transpose(&mut self, of: TensorIndex) -> TensorIndex {
        self.permute(of, [1, 0, 2, 3])
    }

    fn node_record(
        op: Op,
        type_id: u32,
        ne: [usize; 4],
        nb: [usize; 4],
        params: &[i32],
    ) -> RpcTensor {
        let mut record = Self::record(type_id, ne, nb);
        record.op = op.0;
        record.flags = flags::COMPUTE;
        record.op_params[..params.len()].copy_from_slice(params);
        record
    }

    /// A computed node with fresh contiguous storage.
    pub(super) fn node(
        &mut self,
        op: Op,
        type_id: u32,
        ne: [usize; 4],
        srcs: &[TensorIndex],
        params: &[i32],
    ) -> TensorIndex {
        let record = Self::node_record(op, type_id, ne, contiguous_nb(type_id, ne), params);
        let offset = self.alloc(record.byte_size().unwrap() as usize);
        let index = self.push(record, Some(offset), srcs, None);
        self.nodes.push(index);
        index
    }

    /// A computed node writing into the bytes (and layout) of `target`: in-place ops, CPY,
    /// SET_ROWS.
    pub(super) fn node_into(
        &mut self,
        op: Op,
        target: TensorIndex,
        srcs: &[TensorIndex],
        params: &[i32],
    ) -> TensorIndex {
        let t = &self.tensors[target as usize];
        let mut record = Self::node_record(
            op,
            t.record.type_id,
            t.record.ne.map(|n| n as usize),
            t.record.nb.map(|n| n as usize),
            params,
        );
        record.view_offs = 0;
        let at = t.location.map(|l| l.offset as usize);
        let index = self.push(record, at, srcs, Some(target));
        self.nodes.push(index);
        index
    }

    fn graph(&self) -> Graph {
        Graph {
            device: 0,
            uid: 0,
            nodes: self.nodes.clone(),
            tensors: self.tensors.clone(),
        }
    }

    /// Loads the initial image, runs the graph (every node split over `threads`), returns the
    /// buffer's bytes.
    fn run_graph(&self, graph: &Graph, threads: usize) -> Result<Vec<u8>> {
        let at = TensorLocation {
            buffer: self.buffer,
            offset: 0,
        };
        let len = self.image.len().max(1) as u64;
        self.pool.with_region_mut(at, len, |bytes| {
            bytes[..self.image.len()].copy_from_slice(&self.image);
        })?;
        // an eager pool splits even these small nodes, so the parallel paths run
        super::run(&self.pool, &crate::compute::Pool::eager(threads), graph)?;
        self.pool.with_region(at, len, <[u8]>::to_vec)
    }

    pub(super) fn run(&self, threads: usize) -> Result<Vec<u8>> {
        self.run_graph(&self.graph(), threads)
    }

    /// The values of tensor `t` in logical order, from `bytes` (a result of `run`).
    pub(super) fn read(&self, bytes: &[u8], t: TensorIndex) -> Vec<f32> {
        let g = &self.tensors[t as usize];
        let r = &g.record;
        let base = g.location.expect("stored").offset as usize;
        let ne = r.ne.map(|n| n as usize);
        let nb = r.nb.map(|n| n as usize);
        let mut out = Vec::with_capacity(ne.iter().product());
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        let at = base + i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                        let b = &bytes[at..];
                        out.push(match r.type_id {
                            ty::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                            ty::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
                            ty::BF16 => bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
                            ty::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
                            ty::F8_E4M3 => quant::f8_e4m3_to_f32(b[0]),
                            other => panic!("cannot read type {other}"),
                        });
                    }
                }
            }
        }
        out
    }

    /// The raw bytes of a contiguous tensor.
    pub(super) fn raw(&self, bytes: &[u8], t: TensorIndex) -> Vec<u8> {
        let g = &self.tensors[t as usize];
        let base = g.location.expect("stored").offset as usize;
        bytes[base..base + g.byte_size as usize].to_vec()
    }
}

/// A unary op, its reference, and the NMSE tolerance.
type UnaryCase = (UnaryOp, Box<dyn Fn(f64) -> f64>, f64);
/// A GLU op, its reference `(x, gate) -> y`, and the NMSE tolerance.
type GluCase = (GluOp, Box<dyn Fn(f64, f64) -> f64>, f64);
/// What a bad graph breaks, and how to build it.
type BadGraph = (&'static str, Box<dyn Fn(&mut G)>);

/// No tensor in a source slot.
const NONE: TensorIndex = TensorIndex::MAX;

pub(super) fn f(v: f32) -> i32 {
    v.to_bits() as i32
}

/// Normalized mean squared error, as test-backend-ops measures it; NaN positions must agree.
#[track_caller]
pub(super) fn assert_close(got: &[f32], want: &[f64], tolerance: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() || g.is_nan() {
            assert!(
                w.is_nan() && g.is_nan(),
                "{what}: element {i}: got {g}, want {w}"
            );
            continue;
        }
        if w.is_infinite() || g.is_infinite() {
            assert_eq!(f64::from(g), w, "{what}: element {i}");
            continue;
        }
        err += (f64::from(g) - w).powi(2);
        norm += w * w;
    }
    let nmse = if norm == 0.0 { err } else { err / norm };
    assert!(
        nmse <= tolerance,
        "{what}: NMSE {nmse:e} above {tolerance:e}"
    );
}

pub(super) fn at(ne: [usize; 4], i: [usize; 4]) -> usize {
    i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))
}

fn all(ne: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    (0..ne[3]).flat_map(move |i3| {
        (0..ne[2]).flat_map(move |i2| {
            (0..ne[1]).flat_map(move |i1| (0..ne[0]).map(move |i0| [i0, i1, i2, i3]))
        })
    })
}

pub(super) fn wide(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

fn random_shape(rng: &mut Rng, max: [usize; 4]) -> [usize; 4] {
    max.map(|m| 1 + rng.below(m))
}

/// Runs the graph, expects `kind`, and checks that no byte of the buffer changed.
#[track_caller]
pub(super) fn assert_refused(g: &G, kind: ErrorKind) {
    let error = g.run(2).unwrap_err();
    assert_eq!(error.kind(), kind, "{error}");
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
    assert!(bytes == g.image, "a refused graph wrote to the buffer");
}

mod attention;
mod copies;
mod dsv4;
mod elementwise;
mod fp8;
mod gdn;
mod mul_mat;
mod refusals;
mod ssm;
mod top_k_mask;
mod train;
mod vision;
