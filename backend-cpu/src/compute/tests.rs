//! Tests of the compute engine: each kernel against a naive reference written here (f64
//! accumulation), on random shapes, non-contiguous views and broadcast cases; the refusals;
//! run-time id checks; and thread-count independence.
//!
//! The harness ([`G`]) lays tensors out in one buffer of a real [`BufferPool`], builds the
//! [`Graph`] the decoder would hand over (records, links, locations), runs it through
//! [`super::run`] and reads the results back in logical (row-major) order.

use proto_core::backend::{BufferId, TensorLocation};
use proto_core::ggml::types::id as ty;
use proto_core::ggml::{flags, GluOp, Op, UnaryOp};
use proto_core::graph::{Graph, GraphTensor, TensorIndex};
use proto_core::wire::{RpcTensor, MAX_SRC};
use proto_core::{Error, ErrorKind, Result};

use super::ops::{gelu_exact, gelu_quick_exact};
use super::quant;
use super::view::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::buffers::BufferPool;

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
        super::run(&self.pool, &super::Pool::eager(threads), graph)?;
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
        quant::ty::Q2_K,
        quant::ty::Q3_K,
        quant::ty::Q4_K,
        quant::ty::Q5_K,
        quant::ty::Q6_K,
        quant::ty::IQ4_XS,
        quant::ty::TQ1_0,
        quant::ty::TQ2_0,
        quant::ty::Q1_0,
    ] {
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

// --- element-wise --------------------------------------------------------------------------

#[test]
fn binary_ops_broadcast_src1_over_every_dimension() {
    let mut rng = Rng::new(7);
    let ops = [(Op::ADD, 0), (Op::SUB, 1), (Op::MUL, 2), (Op::DIV, 3)];
    for round in 0..24 {
        let (op, which) = ops[round % 4];
        let ne = random_shape(&mut rng, [17, 6, 4, 3]);
        // src1 dims divide src0's
        let ne1 = ne.map(|n| {
            let divisors: Vec<usize> = (1..=n).filter(|d| n % d == 0).collect();
            divisors[rng.below(divisors.len())]
        });
        let types = [ty::F32, ty::F16, ty::BF16];
        let (t0, t1, td) = if round < 12 {
            (ty::F32, ty::F32, ty::F32)
        } else {
            (
                types[rng.below(3)],
                types[rng.below(3)],
                types[rng.below(3)],
            )
        };
        let x = rng.values(ne.iter().product(), 3.0);
        let mut y = rng.values(ne1.iter().product(), 3.0);
        if which == 3 {
            y.iter_mut().for_each(|v| *v = v.abs() + 0.5);
        }
        let mut g = G::new();
        let a = g.input(t0, ne, &x);
        let b = g.input(t1, ne1, &y);
        let node = g.node(op, td, ne, &[a, b], &[]);
        let out = g.run(1 + round % 3).unwrap();
        let (xs, ys) = (stored(t0, &x), stored(t1, &y));
        let want: Vec<f64> = all(ne)
            .map(|i| {
                let a = xs[at(ne, i)];
                let b = ys[at(
                    ne1,
                    [i[0] % ne1[0], i[1] % ne1[1], i[2] % ne1[2], i[3] % ne1[3]],
                )];
                let v = match which {
                    0 => a + b,
                    1 => a - b,
                    2 => a * b,
                    _ => a / b,
                };
                f64::from(stored(td, &[v])[0])
            })
            .collect();
        assert_close(
            &g.read(&out, node),
            &want,
            1e-12,
            &format!("{op:?} {ne:?} by {ne1:?} ({t0},{t1}->{td})"),
        );
    }
}

#[test]
fn binary_ops_read_non_contiguous_sources_and_run_in_place() {
    let mut rng = Rng::new(8);
    let x = rng.values(5 * 7 * 3, 1.0);
    let y = rng.values(7 * 5, 1.0);
    let mut g = G::new();
    let a = g.input(ty::F32, [5, 7, 3, 1], &x);
    let b = g.input(ty::F32, [7, 5, 1, 1], &y);
    // src0 permuted to [7, 5, 3], src1 transposed to [5, 7] and broadcast... as [7,5] view
    let ap = g.permute(a, [1, 0, 2, 3]);
    let add = g.node(Op::ADD, ty::F32, [7, 5, 3, 1], &[ap, b], &[]);
    // in place: mul(add, add) written over add, then scale in place
    let sq = g.node_into(Op::MUL, add, &[add, add], &[]);
    let scaled = g.node_into(Op::SCALE, sq, &[sq], &[f(0.5), f(0.25)]);
    let out = g.run(2).unwrap();
    let want: Vec<f64> = all([7, 5, 3, 1])
        .map(|[i0, i1, i2, _]| {
            let s = f64::from(
                x[at([5, 7, 3, 1], [i1, i0, i2, 0])] + y[at([7, 5, 1, 1], [i0, i1, 0, 0])],
            );
            s * s * 0.5 + 0.25
        })
        .collect();
    assert_close(&g.read(&out, scaled), &want, 1e-12, "in-place chain");
}

#[test]
fn add1_scale_sqr_sqrt_clamp_and_leaky_relu() {
    let mut rng = Rng::new(9);
    let x = rng.values(33 * 4, 4.0);
    let mut g = G::new();
    let a = g.input(ty::F32, [33, 4, 1, 1], &x);
    let s = g.input(ty::F32, [1, 1, 1, 1], &[1.5]);
    let add1 = g.node(Op::ADD1, ty::F32, [33, 4, 1, 1], &[a, s], &[]);
    let scale = g.node(Op::SCALE, ty::F32, [33, 4, 1, 1], &[a], &[f(-2.0), f(0.0)]);
    let sqr = g.node(Op::SQR, ty::F16, [33, 4, 1, 1], &[a], &[]);
    let abs = g.node(Op::UNARY, ty::F32, [33, 4, 1, 1], &[a], &[UnaryOp::ABS.0]);
    let sqrt = g.node(Op::SQRT, ty::F32, [33, 4, 1, 1], &[abs], &[]);
    let clamp = g.node(Op::CLAMP, ty::F32, [33, 4, 1, 1], &[a], &[f(-1.0), f(2.0)]);
    let leaky = g.node(Op::LEAKY_RELU, ty::F32, [33, 4, 1, 1], &[a], &[f(0.1)]);
    let out = g.run(2).unwrap();
    let map = |h: fn(f64) -> f64| x.iter().map(|&v| h(f64::from(v))).collect::<Vec<_>>();
    assert_close(&g.read(&out, add1), &map(|v| v + 1.5), 1e-14, "add1");
    assert_close(&g.read(&out, scale), &map(|v| -2.0 * v), 1e-14, "scale");
    assert_close(&g.read(&out, sqr), &map(|v| v * v), 1e-6, "sqr into f16");
    assert_close(&g.read(&out, sqrt), &map(|v| v.abs().sqrt()), 1e-13, "sqrt");
    assert_close(
        &g.read(&out, clamp),
        &map(|v| v.clamp(-1.0, 2.0)),
        0.0,
        "clamp",
    );
    assert_close(
        &g.read(&out, leaky),
        &map(|v| if v > 0.0 { v } else { 0.1 * v }),
        1e-14,
        "leaky relu",
    );
}

fn erf64(x: f64) -> f64 {
    // Abramowitz-Stegun is not precise enough for a reference; integrate instead.
    let n = 20_000;
    let h = x / n as f64;
    let mut sum = 0.0;
    for i in 0..=n {
        let t = i as f64 * h;
        let w = if i == 0 || i == n {
            1.0
        } else if i % 2 == 1 {
            4.0
        } else {
            2.0
        };
        sum += w * (-t * t).exp();
    }
    sum * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn unary_ops_match_their_definitions_in_every_float_type() {
    let mut rng = Rng::new(10);
    let silu = |v: f64| v / (1.0 + (-v).exp());
    let gelu = |v: f64| {
        0.5 * v
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * v * (1.0 + 0.044715 * v * v)).tanh())
    };
    let cases: Vec<UnaryCase> = vec![
        (UnaryOp::ABS, Box::new(f64::abs), 0.0),
        (
            UnaryOp::SGN,
            Box::new(|v: f64| {
                if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }),
            0.0,
        ),
        (UnaryOp::NEG, Box::new(|v: f64| -v), 0.0),
        (
            UnaryOp::STEP,
            Box::new(|v: f64| if v > 0.0 { 1.0 } else { 0.0 }),
            0.0,
        ),
        (UnaryOp::TANH, Box::new(f64::tanh), 1e-12),
        (
            UnaryOp::ELU,
            Box::new(|v: f64| if v > 0.0 { v } else { v.exp_m1() }),
            1e-12,
        ),
        (UnaryOp::RELU, Box::new(|v: f64| v.max(0.0)), 0.0),
        (
            UnaryOp::SIGMOID,
            Box::new(|v: f64| 1.0 / (1.0 + (-v).exp())),
            1e-12,
        ),
        (UnaryOp::GELU, Box::new(gelu), 1e-5),
        (
            UnaryOp::GELU_QUICK,
            Box::new(|v: f64| v / (1.0 + (-1.702 * v).exp())),
            1e-5,
        ),
        (UnaryOp::SILU, Box::new(silu), 1e-12),
        (
            UnaryOp::HARDSWISH,
            Box::new(|v: f64| v * ((v + 3.0) / 6.0).clamp(0.0, 1.0)),
            1e-12,
        ),
        (
            UnaryOp::HARDSIGMOID,
            Box::new(|v: f64| ((v + 3.0) / 6.0).clamp(0.0, 1.0)),
            1e-12,
        ),
        (UnaryOp::EXP, Box::new(f64::exp), 1e-12),
        (UnaryOp::EXPM1, Box::new(f64::exp_m1), 1e-10),
        (
            UnaryOp::SOFTPLUS,
            Box::new(|v: f64| (1.0 + v.exp()).ln()),
            1e-12,
        ),
        (
            UnaryOp::GELU_ERF,
            Box::new(|v: f64| 0.5 * v * (1.0 + erf64(v / 2f64.sqrt()))),
            1e-11,
        ),
        (UnaryOp::FLOOR, Box::new(f64::floor), 0.0),
        (UnaryOp::CEIL, Box::new(f64::ceil), 0.0),
        (UnaryOp::ROUND, Box::new(f64::round), 0.0),
        (UnaryOp::TRUNC, Box::new(f64::trunc), 0.0),
    ];
    for (op, reference, tolerance) in cases {
        for t in [ty::F32, ty::F16, ty::BF16] {
            let x = rng.values(40 * 3, 4.0);
            let mut g = G::new();
            let a = g.input(t, [40, 3, 1, 1], &x);
            let y = g.node(Op::UNARY, t, [40, 3, 1, 1], &[a], &[op.0]);
            let out = g.run(2).unwrap();
            let want: Vec<f64> = stored(t, &x)
                .iter()
                .map(|&v| f64::from(stored(t, &[reference(f64::from(v)) as f32])[0]))
                .collect();
            // storage rounding of the result dominates for f16/bf16
            let tolerance = match t {
                ty::F16 => tolerance.max(1e-6),
                ty::BF16 => tolerance.max(1e-4),
                _ => tolerance,
            };
            assert_close(
                &g.read(&out, y),
                &want,
                tolerance,
                &format!("unary {op:?} in type {t}"),
            );
        }
    }
}

#[test]
fn gelu_matches_ggml_table_exactly() {
    let x: Vec<f32> = (-1200..1200).map(|i| i as f32 * 0.01).collect();
    let mut g = G::new();
    let a = g.input(ty::F32, [2400, 1, 1, 1], &x);
    let y = g.node(
        Op::UNARY,
        ty::F32,
        [2400, 1, 1, 1],
        &[a],
        &[UnaryOp::GELU.0],
    );
    let q = g.node(
        Op::UNARY,
        ty::F32,
        [2400, 1, 1, 1],
        &[a],
        &[UnaryOp::GELU_QUICK.0],
    );
    let out = g.run(1).unwrap();
    let table = |h: fn(f32) -> f32, v: f32| f16_to_f32(f32_to_f16(h(f16_to_f32(f32_to_f16(v)))));
    let want: Vec<f64> = x
        .iter()
        .map(|&v| {
            f64::from(if v <= -10.0 {
                0.0
            } else if v >= 10.0 {
                v
            } else {
                table(gelu_exact, v)
            })
        })
        .collect();
    assert_close(&g.read(&out, y), &want, 0.0, "gelu table");
    let want: Vec<f64> = x
        .iter()
        .map(|&v| f64::from(table(gelu_quick_exact, v)))
        .collect();
    assert_close(&g.read(&out, q), &want, 0.0, "gelu quick table");
}

#[test]
fn glu_variants_split_swapped_and_two_tensor_forms() {
    let mut rng = Rng::new(11);
    let silu = |v: f64| v / (1.0 + (-v).exp());
    let gelu = |v: f64| {
        0.5 * v
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * v * (1.0 + 0.044715 * v * v)).tanh())
    };
    let (alpha, limit) = (1.702f32, 7.0f32);
    let cases: Vec<GluCase> = vec![
        (
            GluOp::REGLU,
            Box::new(|x: f64, g: f64| x.max(0.0) * g),
            1e-13,
        ),
        (
            GluOp::GEGLU,
            Box::new(move |x: f64, g: f64| gelu(x) * g),
            1e-5,
        ),
        (
            GluOp::SWIGLU,
            Box::new(move |x: f64, g: f64| silu(x) * g),
            1e-12,
        ),
        (
            GluOp::SWIGLU_OAI,
            Box::new(move |x: f64, g: f64| {
                let x = x.min(f64::from(limit));
                let g = g.clamp(-f64::from(limit), f64::from(limit));
                x / (1.0 + (-f64::from(alpha) * x).exp()) * (g + 1.0)
            }),
            1e-12,
        ),
        (
            GluOp::GEGLU_ERF,
            Box::new(|x: f64, g: f64| 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())) * g),
            1e-11,
        ),
        (
            GluOp::SWIGLU_CLAMP,
            Box::new(move |x: f64, g: f64| {
                let x = x.min(f64::from(limit));
                let g = g.clamp(-f64::from(limit), f64::from(limit));
                silu(x) * g
            }),
            1e-12,
        ),
        (
            GluOp::GEGLU_QUICK,
            Box::new(|x: f64, g: f64| x / (1.0 + (-1.702 * x).exp()) * g),
            1e-5,
        ),
    ];
    for (op, reference, tolerance) in cases {
        for form in 0..3 {
            let nc = 24;
            let x = rng.values(2 * nc * 3 * 2, 8.0);
            let mut g = G::new();
            let params = [op.0, i32::from(form == 1), f(alpha), f(limit)];
            let (node, pairs): (TensorIndex, Vec<(f64, f64)>) = if form < 2 {
                let a = g.input(ty::F32, [2 * nc, 3, 2, 1], &x);
                let n = g.node(Op::GLU, ty::F32, [nc, 3, 2, 1], &[a], &params);
                let pairs = x
                    .chunks(2 * nc)
                    .flat_map(|row| {
                        (0..nc).map(move |i| {
                            let (a, b) = (f64::from(row[i]), f64::from(row[nc + i]));
                            if form == 1 {
                                (b, a)
                            } else {
                                (a, b)
                            }
                        })
                    })
                    .collect();
                (n, pairs)
            } else {
                let a = g.input(ty::F32, [nc, 3, 2, 1], &x[..nc * 6]);
                let b = g.input(ty::F32, [nc, 3, 2, 1], &x[nc * 6..]);
                let n = g.node(Op::GLU, ty::F32, [nc, 3, 2, 1], &[a, b], &params);
                let pairs = (0..nc * 6)
                    .map(|i| (f64::from(x[i]), f64::from(x[nc * 6 + i])))
                    .collect();
                (n, pairs)
            };
            let out = g.run(2).unwrap();
            let want: Vec<f64> = pairs.iter().map(|&(x, g)| reference(x, g)).collect();
            assert_close(
                &g.read(&out, node),
                &want,
                tolerance,
                &format!("glu {op:?} form {form}"),
            );
        }
    }
}

#[test]
fn swiglu_clamp_f32_and_f16_in_every_form_match_the_scalar_formula() {
    let mut rng = Rng::new(61);
    // |values| up to 8 against a limit of 2: the gate is cut from above, the up half from both
    // sides; the exact limits and 0 are in there too
    let limit = 2.0f32;
    // ggml_compute_forward_swiglu_clamp_{f32,f16}, element by element in f32
    let reference = |x: f32, g: f32| {
        let x = x.min(limit);
        let g = g.clamp(-limit, limit);
        x / (1.0 + (-x).exp()) * g
    };
    let nc = 19;
    for t in [ty::F32, ty::F16] {
        for form in 0..3 {
            let mut x = rng.values(2 * nc * 4 * 3, 8.0);
            x[..6].copy_from_slice(&[limit, -limit, 0.0, limit, -limit, 0.0]);
            x[nc..nc + 6].copy_from_slice(&[-limit, limit, limit, 0.0, 3.0 * limit, -3.0 * limit]);
            // what the tensors hold
            let x = stored(t, &x);
            let mut g = G::new();
            let params = [GluOp::SWIGLU_CLAMP.0, i32::from(form == 1), 0, f(limit)];
            let (node, pairs): (TensorIndex, Vec<(f32, f32)>) = if form < 2 {
                let a = g.input(t, [2 * nc, 4, 3, 1], &x);
                let n = g.node(Op::GLU, t, [nc, 4, 3, 1], &[a], &params);
                let pairs = x
                    .chunks(2 * nc)
                    .flat_map(|row| {
                        (0..nc).map(move |i| {
                            if form == 1 {
                                (row[nc + i], row[i])
                            } else {
                                (row[i], row[nc + i])
                            }
                        })
                    })
                    .collect();
                (n, pairs)
            } else {
                let half = nc * 12;
                let a = g.input(t, [nc, 4, 3, 1], &x[..half]);
                let b = g.input(t, [nc, 4, 3, 1], &x[half..]);
                let n = g.node(Op::GLU, t, [nc, 4, 3, 1], &[a, b], &params);
                (n, (0..half).map(|i| (x[i], x[half + i])).collect())
            };
            assert!(
                pairs.iter().any(|&(x, _)| x > limit)
                    && pairs.iter().any(|&(_, g)| g > limit)
                    && pairs.iter().any(|&(_, g)| g < -limit),
                "the limit clamps"
            );
            let out = g.run(2).unwrap();
            let got = g.read(&out, node);
            // one f32 -> f16 rounding of the f32 result, as GGML_FP32_TO_FP16
            let want = stored(
                t,
                &pairs
                    .iter()
                    .map(|&(x, g)| reference(x, g))
                    .collect::<Vec<_>>(),
            );
            for (i, (got, want)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "type {t} form {form} element {i}: got {got}, want {want}"
                );
            }
        }
    }
    // ggml-cpu has no BF16 kernel of SWIGLU_CLAMP
    let mut g = G::new();
    let a = g.input(ty::BF16, [4, 1, 1, 1], &[1.0; 4]);
    g.node(
        Op::GLU,
        ty::BF16,
        [2, 1, 1, 1],
        &[a],
        &[GluOp::SWIGLU_CLAMP.0, 0, 0, f(limit)],
    );
    assert_refused(&g, ErrorKind::OpRefused);
}

// --- reductions and norms ------------------------------------------------------------------

#[test]
fn sum_rows_mean_sum_and_argmax() {
    let mut rng = Rng::new(12);
    let ne = [37, 5, 3, 2];
    let x = rng.values(37 * 30, 10.0);
    let mut m = rng.values(11 * 6, 1.0);
    m[3] = 5.0;
    m[7] = 5.0; // a tie: ggml keeps the last maximum
    let mut g = G::new();
    let a = g.input(ty::F32, ne, &x);
    let mx = g.input(ty::F32, [11, 6, 1, 1], &m);
    let sum_rows = g.node(Op::SUM_ROWS, ty::F32, [1, 5, 3, 2], &[a], &[]);
    let mean = g.node(Op::MEAN, ty::F32, [1, 5, 3, 2], &[a], &[]);
    let sum = g.node(Op::SUM, ty::F32, [1, 1, 1, 1], &[a], &[]);
    let argmax = g.node(Op::ARGMAX, ty::I32, [6, 1, 1, 1], &[mx], &[]);
    let out = g.run(2).unwrap();
    let rows: Vec<f64> = x
        .chunks(37)
        .map(|r| r.iter().map(|&v| f64::from(v)).sum())
        .collect();
    assert_close(&g.read(&out, sum_rows), &rows, 1e-13, "sum_rows");
    assert_close(
        &g.read(&out, mean),
        &rows.iter().map(|s| s / 37.0).collect::<Vec<_>>(),
        1e-13,
        "mean",
    );
    assert_close(&g.read(&out, sum), &[rows.iter().sum()], 1e-13, "sum");
    let want: Vec<f64> = m
        .chunks(11)
        .map(|r| {
            let max = r.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            r.iter().rposition(|&v| v == max).unwrap() as f64
        })
        .collect();
    assert_close(&g.read(&out, argmax), &want, 0.0, "argmax");
    // SUM of a transposed source adds its elements (ggml-cpu's release build reads each row as
    // packed floats whatever nb0: test-backend-ops' one transposed SUM case is a reference bug)
    let mut g = G::new();
    let values = rng.values(33 * 256, 1.0);
    let a = g.input(ty::F32, [33, 256, 1, 1], &values);
    let t = g.transpose(a);
    let sum = g.node(Op::SUM, ty::F32, [1, 1, 1, 1], &[t], &[]);
    let out = g.run(2).unwrap();
    let want: f64 = values.iter().map(|&v| f64::from(v)).sum();
    assert_close(
        &g.read(&out, sum),
        &[want],
        1e-6,
        "sum of a transposed source",
    );
}

#[test]
fn norm_and_rms_norm_over_strided_rows() {
    let mut rng = Rng::new(13);
    let x: Vec<f32> = rng.values(64 * 9, 3.0).iter().map(|v| v + 1.0).collect();
    let eps = 1e-5f32;
    let mut g = G::new();
    let a = g.input(ty::F32, [64, 9, 1, 1], &x);
    let norm = g.node(Op::NORM, ty::F32, [64, 9, 1, 1], &[a], &[f(eps)]);
    let rms = g.node(Op::RMS_NORM, ty::F32, [64, 9, 1, 1], &[a], &[f(eps)]);
    // a transposed source (strided rows)
    let t = g.transpose(a);
    let rms_t = g.node(Op::RMS_NORM, ty::F32, [9, 64, 1, 1], &[t], &[f(eps)]);
    let out = g.run(3).unwrap();
    let eps = f64::from(eps);
    let mut want_norm = Vec::new();
    let mut want_rms = Vec::new();
    for row in x.chunks(64) {
        let row = wide(row);
        let mean = row.iter().sum::<f64>() / 64.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 64.0;
        want_norm.extend(row.iter().map(|v| (v - mean) / (var + eps).sqrt()));
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 64.0;
        want_rms.extend(row.iter().map(|v| v / (ms + eps).sqrt()));
    }
    assert_close(&g.read(&out, norm), &want_norm, 1e-12, "norm");
    assert_close(&g.read(&out, rms), &want_rms, 1e-12, "rms_norm");
    let mut want_t = Vec::new();
    for i1 in 0..64 {
        let row: Vec<f64> = (0..9).map(|i0| f64::from(x[i1 + 64 * i0])).collect();
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 9.0;
        want_t.extend(row.iter().map(|v| v / (ms + eps).sqrt()));
    }
    assert_close(
        &g.read(&out, rms_t),
        &want_t,
        1e-12,
        "rms_norm of a transposed view",
    );
}

#[test]
fn l2_norm_add_id_argsort_and_top_k() {
    let mut rng = Rng::new(22);
    let x = rng.values(10 * 6, 2.0);
    let bias = rng.values(10 * 4, 1.0);
    let ids: Vec<i64> = vec![3, 0, 1, 1, 2, 0];
    let mut g = G::new();
    let a = g.input(ty::F32, [10, 3, 2, 1], &x);
    let b = g.input(ty::F32, [10, 4, 1, 1], &bias);
    let it = g.ids(ty::I32, [3, 2, 1, 1], &ids);
    let l2 = g.node(Op::L2_NORM, ty::F32, [10, 3, 2, 1], &[a], &[f(1e-6)]);
    let add_id = g.node(Op::ADD_ID, ty::F32, [10, 3, 2, 1], &[a, b, it], &[]);
    let asc = g.node(Op::ARGSORT, ty::I32, [10, 3, 2, 1], &[a], &[0]);
    let desc = g.node(Op::ARGSORT, ty::I32, [10, 3, 2, 1], &[a], &[1]);
    let top = g.node(Op::TOP_K, ty::I32, [4, 3, 2, 1], &[a], &[]);
    let out = g.run(2).unwrap();
    let mut want_l2 = Vec::new();
    let mut want_add = Vec::new();
    let (mut want_asc, mut want_desc, mut want_top) = (Vec::new(), Vec::new(), Vec::new());
    for (r, row) in x.chunks(10).enumerate() {
        let norm = row
            .iter()
            .map(|&v| f64::from(v).powi(2))
            .sum::<f64>()
            .sqrt();
        want_l2.extend(row.iter().map(|&v| f64::from(v) / norm));
        let id = ids[r] as usize;
        want_add.extend(
            row.iter()
                .zip(&bias[id * 10..id * 10 + 10])
                .map(|(&a, &b)| f64::from(a + b)),
        );
        let mut order: Vec<usize> = (0..10).collect();
        order.sort_by(|&p, &q| row[p].partial_cmp(&row[q]).unwrap());
        want_asc.extend(order.iter().map(|&i| i as f64));
        want_desc.extend(order.iter().rev().map(|&i| i as f64));
        let mut top: Vec<f64> = order.iter().rev().take(4).map(|&i| i as f64).collect();
        top.swap(0, 1);
        want_top.extend(top);
    }
    assert_close(&g.read(&out, l2), &want_l2, 1e-12, "l2_norm");
    assert_close(&g.read(&out, add_id), &want_add, 0.0, "add_id");
    assert_close(&g.read(&out, asc), &want_asc, 0.0, "argsort ascending");
    assert_close(&g.read(&out, desc), &want_desc, 0.0, "argsort descending");
    assert_close(&g.read(&out, top), &want_top, 0.0, "top_k");
    // an id past src1's rows fails the graph before ADD_ID writes
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
    let b = g.input(ty::F32, [4, 2, 1, 1], &[1.0; 8]);
    let it = g.ids(ty::I32, [1, 1, 1, 1], &[2]);
    g.node(Op::ADD_ID, ty::F32, [4, 1, 1, 1], &[a, b, it], &[]);
    assert_eq!(g.run(1).unwrap_err().kind(), ErrorKind::OutOfBounds);
}

// --- matrix products -----------------------------------------------------------------------

/// Weights as the kernel's dot products see them, and the activations after ggml's conversion
/// to the weights' vec_dot_type.
fn mm_operands(w_type: u32, w: &[f32], k: usize, x: &[f32]) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (block, size) = type_size(w_type);
    if block == 1 {
        return (
            encode_values(w_type, w),
            stored(w_type, w),
            stored(w_type, x),
        );
    }
    let mut bytes = vec![0u8; w.len() / block * size];
    let mut wq = vec![0.0f32; w.len()];
    for ((row, dst), deq) in w
        .chunks(k)
        .zip(bytes.chunks_mut(k / block * size))
        .zip(wq.chunks_mut(k))
    {
        quant::quantize_row(w_type, row, dst).unwrap();
        quant::dequantize_row(w_type, dst, deq).unwrap();
    }
    let vdt = quant::vec_dot_type(w_type).unwrap();
    let (vb, vs) = type_size(vdt);
    let mut xq = vec![0.0f32; x.len()];
    for (row, deq) in x.chunks(k).zip(xq.chunks_mut(k)) {
        let mut q = vec![0u8; k / vb * vs];
        quant::quantize_row(vdt, row, &mut q).unwrap();
        quant::dequantize_row(vdt, &q, deq).unwrap();
    }
    (bytes, wq, xq)
}

#[test]
fn mul_mat_in_every_weight_type_with_broadcast_and_transposed_activations() {
    let mut rng = Rng::new(14);
    for (round, w_type) in [
        ty::F32,
        ty::F16,
        ty::BF16,
        ty::Q8_0,
        ty::Q4_0,
        3,
        6,
        7,
        20, /* IQ4_NL */
        23, /* IQ4_XS */
        34, /* TQ1_0 */
        35, /* TQ2_0 */
        39, /* MXFP4 */
        40, /* NVFP4 */
        41, /* Q1_0 */
        42, /* Q2_0 */
        ty::F32,
        ty::F16,
    ]
    .into_iter()
    .enumerate()
    {
        let k = type_size(w_type).0.max(64) * (1 + rng.below(3));
        let (m, n) = (1 + rng.below(40), 1 + rng.below(9));
        let (w2, w3) = (1 + rng.below(2), 1 + rng.below(2));
        let (x2, x3) = (w2 * (1 + rng.below(2)), w3 * (1 + rng.below(2)));
        let w = rng.values(k * m * w2 * w3, 1.0);
        let x = rng.values(k * n * x2 * x3, 1.0);
        let (w_bytes, wv, xv) = mm_operands(w_type, &w, k, &x);
        let mut g = G::new();
        let wt = g.input_bytes(w_type, [k, m, w2, w3], &w_bytes);
        // every other round: the activations as a transposed view of an [n, k] tensor
        let xt = if round % 2 == 1 {
            let mut xr = vec![0.0f32; x.len()];
            for b in 0..x2 * x3 {
                for i in 0..n {
                    for j in 0..k {
                        xr[b * n * k + j * n + i] = x[b * n * k + i * k + j];
                    }
                }
            }
            let base = g.input(ty::F32, [n, k, x2, x3], &xr);
            g.transpose(base)
        } else {
            g.input(ty::F32, [k, n, x2, x3], &x)
        };
        let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, x2, x3], &[wt, xt], &[]);
        let out = g.run(1 + round % 4).unwrap();
        let want: Vec<f64> = all([m, n, x2, x3])
            .map(|[i0, i1, i2, i3]| {
                let (j2, j3) = (i2 / (x2 / w2), i3 / (x3 / w3));
                (0..k)
                    .map(|kk| {
                        f64::from(wv[at([k, m, w2, w3], [kk, i0, j2, j3])])
                            * f64::from(xv[at([k, n, x2, x3], [kk, i1, i2, i3])])
                    })
                    .sum()
            })
            .collect();
        // Q4_1/Q5_1 dot products use the Q8_1 block sums, which ggml stores as f16
        let tolerance = if w_type == 3 || w_type == 7 {
            1e-6
        } else {
            1e-10
        };
        assert_close(
            &g.read(&out, mm),
            &want,
            tolerance,
            &format!("mul_mat type {w_type} k {k} m {m} n {n}"),
        );
    }
}

/// Random rows of a grid format (IQ2_XXS .. IQ1_M: any bytes are valid blocks) with small
/// finite f16 super-block scales (IQ1_M's spread over the top nibbles of its scale words).
fn random_grid_rows(rng: &mut Rng, type_id: u32, n: usize) -> Vec<u8> {
    let (block, size) = type_size(type_id);
    let mut bytes: Vec<u8> = (0..n / block * size).map(|_| rng.next() as u8).collect();
    for b in bytes.chunks_exact_mut(size) {
        let h = f32_to_f16(0.002 + 0.001 * rng.f32());
        if type_id == quant::ty::IQ1_M {
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0F) | ((((h >> (4 * k)) & 15) as u8) << 4);
            }
        } else {
            b[..2].copy_from_slice(&h.to_le_bytes());
        }
    }
    bytes
}

/// The grid formats (no quantizer, as in ggml-cpu): GET_ROWS and CPY to F32 give
/// `dequantize_row` exactly, MUL_MAT the dot products with Q8_K activations; CPY and SET_ROWS
/// into them are refused.
#[test]
fn grid_formats_get_rows_cpy_and_mul_mat() {
    let mut rng = Rng::new(41);
    for w_type in [
        quant::ty::IQ2_XXS,
        quant::ty::IQ2_XS,
        quant::ty::IQ2_S,
        quant::ty::IQ3_XXS,
        quant::ty::IQ3_S,
        quant::ty::IQ1_S,
        quant::ty::IQ1_M,
    ] {
        let k = 256 * (1 + rng.below(2));
        let (m, n) = (1 + rng.below(20), 1 + rng.below(5));
        let w_bytes = random_grid_rows(&mut rng, w_type, k * m);
        let mut wv = vec![0.0f32; k * m];
        quant::dequantize_row(w_type, &w_bytes, &mut wv).unwrap();
        let x = rng.values(k * n, 1.0);
        // the activations as the dot product sees them: rows through Q8_K
        let mut xv = vec![0.0f32; k * n];
        for (row, deq) in x.chunks(k).zip(xv.chunks_mut(k)) {
            let mut q = vec![0u8; quant::row_size(quant::ty::Q8_K, k).unwrap()];
            quant::quantize_row(quant::ty::Q8_K, row, &mut q).unwrap();
            quant::dequantize_row(quant::ty::Q8_K, &q, deq).unwrap();
        }

        let mut g = G::new();
        let wt = g.input_bytes(w_type, [k, m, 1, 1], &w_bytes);
        let xt = g.input(ty::F32, [k, n, 1, 1], &x);
        let ids: Vec<i64> = (0..3).map(|_| rng.below(m) as i64).collect();
        let rows = g.ids(ty::I32, [3, 1, 1, 1], &ids);
        let got_rows = g.node(Op::GET_ROWS, ty::F32, [k, 3, 1, 1], &[wt, rows], &[]);
        let copy = g.node(Op::CPY, ty::F32, [k, m, 1, 1], &[wt], &[]);
        let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, 1, 1], &[wt, xt], &[]);
        let out = g.run(2).unwrap();
        let what = format!("type {w_type} k {k} m {m} n {n}");
        let want_rows: Vec<f64> = ids
            .iter()
            .flat_map(|&r| wide(&wv[r as usize * k..(r as usize + 1) * k]))
            .collect();
        assert_close(&g.read(&out, got_rows), &want_rows, 0.0, &what);
        assert_close(&g.read(&out, copy), &wide(&wv), 0.0, &what);
        let want: Vec<f64> = all([m, n, 1, 1])
            .map(|[i0, i1, _, _]| {
                (0..k)
                    .map(|kk| f64::from(wv[i0 * k + kk]) * f64::from(xv[i1 * k + kk]))
                    .sum()
            })
            .collect();
        assert_close(&g.read(&out, mm), &want, 1e-10, &what);

        // no quantizer: CPY and SET_ROWS into the format are refused
        let mut g = G::new();
        let a = g.input(ty::F32, [256, 1, 1, 1], &x[..256]);
        let dst = g.zeros(w_type, [256, 1, 1, 1]);
        g.node_into(Op::CPY, dst, &[a], &[]);
        assert_refused(&g, ErrorKind::OpRefused);
        let mut g = G::new();
        let a = g.input(ty::F32, [256, 1, 1, 1], &x[..256]);
        let idx = g.ids(I64, [1, 1, 1, 1], &[0]);
        let cache = g.zeros(w_type, [256, 2, 1, 1]);
        g.node_into(Op::SET_ROWS, cache, &[a, idx], &[]);
        assert_refused(&g, ErrorKind::OpRefused);
    }
}

#[test]
fn mul_mat_reads_f32_activation_rows_in_place_or_converts_misaligned_ones() {
    // F32 weights take the activation rows where they are when every row is aligned f32s;
    // padded rows (a row stride beyond k) stay in place, rows at an odd byte offset or with
    // an odd stride are converted first. Every case must give the same sums.
    let mut rng = Rng::new(63);
    let (k, m, n) = (64, 21, 7);
    let w = rng.values(k * m, 1.0);
    let x = rng.values((k + 1) * n + 1, 1.0);
    // (byte offset of the first row, row stride in bytes)
    for (offset, stride) in [(0, 4 * k), (0, 4 * (k + 1)), (2, 4 * k), (0, 4 * k + 2)] {
        let mut g = G::new();
        let wt = g.input(ty::F32, [k, m, 1, 1], &w);
        let mut bytes = vec![0u8; (offset + stride * (n - 1) + 4 * k).div_ceil(4) * 4];
        for i in 0..n {
            for j in 0..k {
                let at = offset + i * stride + 4 * j;
                bytes[at..at + 4].copy_from_slice(&x[i * (k + 1) + j].to_le_bytes());
            }
        }
        let base = g.input_bytes(ty::F32, [bytes.len() / 4, 1, 1, 1], &bytes);
        let xt = g.view(
            base,
            [k, n, 1, 1],
            [4, stride, stride * n, stride * n],
            offset,
        );
        let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, 1, 1], &[wt, xt], &[]);
        let out = g.run(2).unwrap();
        let want: Vec<f64> = all([m, n, 1, 1])
            .map(|[i0, i1, ..]| {
                (0..k)
                    .map(|j| f64::from(w[i0 * k + j]) * f64::from(x[i1 * (k + 1) + j]))
                    .sum()
            })
            .collect();
        assert_close(
            &g.read(&out, mm),
            &want,
            1e-10,
            &format!("activations at offset {offset}, stride {stride}"),
        );
    }
}

#[test]
fn mul_mat_with_strided_float_weights_widens_them() {
    let mut rng = Rng::new(21);
    for w_type in [ty::F32, ty::F16, ty::BF16] {
        let (k, m, n) = (40, 9, 5);
        // weights stored as [m, k] and used through a transposed view [k, m]
        let wt_values = rng.values(k * m, 1.0);
        let x = rng.values(k * n, 1.0);
        let mut g = G::new();
        let base = g.input(w_type, [m, k, 1, 1], &wt_values);
        let w = g.transpose(base);
        let xt = g.input(ty::F32, [k, n, 1, 1], &x);
        let mm = g.node(Op::MUL_MAT, ty::F32, [m, n, 1, 1], &[w, xt], &[]);
        let out = g.run(2).unwrap();
        let (wv, xv) = (stored(w_type, &wt_values), stored(w_type, &x));
        let want: Vec<f64> = all([m, n, 1, 1])
            .map(|[i0, i1, ..]| {
                (0..k)
                    .map(|kk| f64::from(wv[i0 + m * kk]) * f64::from(xv[kk + k * i1]))
                    .sum()
            })
            .collect();
        assert_close(
            &g.read(&out, mm),
            &want,
            1e-10,
            &format!("strided weights of type {w_type}"),
        );
    }
}

#[test]
fn mul_mat_id_routes_tokens_to_experts() {
    let mut rng = Rng::new(15);
    for w_type in [ty::F32, ty::F16, ty::Q8_0] {
        let (k, m, n_exp, n_used, n_tok) = (64, 13, 4, 2, 5);
        for ne11 in [1, n_used] {
            let w = rng.values(k * m * n_exp, 1.0);
            let x = rng.values(k * ne11 * n_tok, 1.0);
            let (w_bytes, wv, xv) = mm_operands(w_type, &w, k, &x);
            let ids: Vec<i64> = (0..n_used * n_tok)
                .map(|_| rng.below(n_exp) as i64)
                .collect();
            let mut g = G::new();
            let wt = g.input_bytes(w_type, [k, m, n_exp, 1], &w_bytes);
            let xt = g.input(ty::F32, [k, ne11, n_tok, 1], &x);
            let it = g.ids(ty::I32, [n_used, n_tok, 1, 1], &ids);
            let mm = g.node(
                Op::MUL_MAT_ID,
                ty::F32,
                [m, n_used, n_tok, 1],
                &[wt, xt, it],
                &[],
            );
            let out = g.run(2).unwrap();
            let want: Vec<f64> = all([m, n_used, n_tok, 1])
                .map(|[i0, e, t, _]| {
                    let expert = ids[e + n_used * t] as usize;
                    (0..k)
                        .map(|kk| {
                            f64::from(wv[at([k, m, n_exp, 1], [kk, i0, expert, 0])])
                                * f64::from(xv[at([k, ne11, n_tok, 1], [kk, e % ne11, t, 0])])
                        })
                        .sum()
                })
                .collect();
            assert_close(
                &g.read(&out, mm),
                &want,
                1e-10,
                &format!("mul_mat_id type {w_type} ne11 {ne11}"),
            );
        }
    }
    // an expert id out of range fails the graph
    let mut g = G::new();
    let wt = g.input(ty::F32, [32, 4, 2, 1], &[0.5; 256]);
    let xt = g.input(ty::F32, [32, 1, 1, 1], &[1.0; 32]);
    let it = g.ids(ty::I32, [1, 1, 1, 1], &[2]);
    g.node(Op::MUL_MAT_ID, ty::F32, [4, 1, 1, 1], &[wt, xt, it], &[]);
    assert_eq!(g.run(1).unwrap_err().kind(), ErrorKind::OutOfBounds);
}

// --- rope, softmax, attention --------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
pub(super) fn rope_reference(
    x: &[f32],
    ne: [usize; 4],
    pos: &[i64],
    n_dims: usize,
    mode: i32,
    base: f64,
    freq_scale: f64,
    ext_factor: f64,
    attn_factor: f64,
    n_ctx_orig: f64,
    beta: (f64, f64),
    factors: Option<&[f32]>,
    n_offs: usize,
) -> Vec<f64> {
    let corr = |n_rot: f64| {
        n_dims as f64 * (n_ctx_orig / (n_rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let low = corr(beta.0).floor().max(0.0);
    let high = corr(beta.1).ceil().min(n_dims as f64 - 1.0);
    let mut out = wide(x);
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for pair in 0..n_dims / 2 {
                    let ff = factors.map_or(1.0, |f| f64::from(f[pair]));
                    let theta_extrap =
                        pos[i2] as f64 * base.powf(-2.0 * pair as f64 / n_dims as f64) / ff;
                    let theta_interp = freq_scale * theta_extrap;
                    let (mut theta, mut mscale) = (theta_interp, attn_factor);
                    if ext_factor != 0.0 {
                        let y = (pair as f64 - low) / (high - low).max(0.001);
                        let ramp = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
                        theta = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
                        mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
                    }
                    let (c, s) = (theta.cos() * mscale, theta.sin() * mscale);
                    let (a, b) = if mode == 0 {
                        (n_offs + 2 * pair, n_offs + 2 * pair + 1)
                    } else {
                        (n_offs + pair, n_offs + pair + n_dims / 2)
                    };
                    let x0 = f64::from(x[at(ne, [a, i1, i2, i3])]);
                    let x1 = f64::from(x[at(ne, [b, i1, i2, i3])]);
                    out[at(ne, [a, i1, i2, i3])] = x0 * c - x1 * s;
                    out[at(ne, [b, i1, i2, i3])] = x0 * s + x1 * c;
                }
            }
        }
    }
    out
}

/// ROPE op_params for `n_dims` rotated dimensions from `n_offs` on (freq base 10000, no YaRN).
pub(super) fn rope_params(n_dims: usize, mode: i32, n_offs: i32) -> [i32; 16] {
    let mut params = [0i32; 16];
    params[1] = n_dims as i32;
    params[2] = mode;
    params[4] = 4096;
    params[5] = f(10000.0);
    params[6] = f(1.0);
    params[8] = f(1.0);
    params[9] = f(32.0);
    params[10] = f(1.0);
    params[15] = n_offs;
    params
}

#[test]
fn rope_rotates_a_window_at_an_offset_and_copies_the_rest() {
    let mut rng = Rng::new(61);
    for (mode, t) in [(0, ty::F32), (2, ty::F32), (0, ty::F16), (2, ty::F16)] {
        let ne = [40, 3, 4, 1];
        let (n_dims, n_offs) = (16, 10);
        let x = rng.values(ne.iter().product(), 1.0);
        let pos: Vec<i64> = (0..4).map(|_| rng.below(100) as i64).collect();
        let mut g = G::new();
        let a = g.input(t, ne, &x);
        let p = g.ids(ty::I32, [4, 1, 1, 1], &pos);
        let r = g.node(
            Op::ROPE,
            t,
            ne,
            &[a, p],
            &rope_params(n_dims, mode, n_offs as i32),
        );
        let out = g.run(2).unwrap();
        let want = rope_reference(
            &stored(t, &x),
            ne,
            &pos,
            n_dims,
            mode,
            10000.0,
            1.0,
            0.0,
            1.0,
            4096.0,
            (32.0, 1.0),
            None,
            n_offs,
        );
        let got = g.read(&out, r);
        let tolerance = if t == ty::F16 { 1e-6 } else { 1e-9 };
        assert_close(
            &got,
            &want,
            tolerance,
            &format!("rope offset mode {mode} type {t}"),
        );
        // dimensions outside the window are copied unchanged
        let stored_x = stored(t, &x);
        for i in all(ne) {
            if !(n_offs..n_offs + n_dims).contains(&i[0]) {
                assert_eq!(got[at(ne, i)], stored_x[at(ne, i)], "{i:?}");
            }
        }
    }
}

#[test]
fn rope_window_offsets_outside_the_row_are_refused() {
    // (n_dims, mode, n_offs, ne0): odd, past the end, negative, vision with an offset
    for (n_dims, mode, n_offs, ne0) in [
        (8, 0, 3, 16),
        (8, 2, 10, 16),
        (8, 0, -2, 16),
        (8, 24, 2, 16),
    ] {
        let mut g = G::new();
        let ne = [ne0, 2, 3, 1];
        let a = g.input(ty::F32, ne, &vec![0.5; ne0 * 6]);
        let p = g.ids(ty::I32, [12, 1, 1, 1], &[0; 12]);
        let mut params = rope_params(n_dims, mode, n_offs);
        params[11] = 2;
        params[12] = 2;
        g.node(Op::ROPE, ty::F32, ne, &[a, p], &params);
        let error = g.run(1).unwrap_err();
        assert_eq!(
            error.kind(),
            ErrorKind::InvalidGraph,
            "n_dims {n_dims} mode {mode} offset {n_offs}: {error}"
        );
    }
}

#[test]
fn rope_positions_must_be_one_row_of_enough_values() {
    // long enough but empty (found by the graph_compute fuzz target: the kernel read past
    // the empty tensor), a matrix, and one value short
    for pos_ne in [[3, 1, 1, 0], [3, 2, 1, 1], [2, 1, 1, 1]] {
        let mut g = G::new();
        let ne = [32, 2, 3, 1];
        let a = g.input(ty::F32, ne, &vec![0.5; 32 * 6]);
        let count: usize = pos_ne.iter().product();
        let p = g.ids(ty::I32, pos_ne, &vec![0; count]);
        g.node(Op::ROPE, ty::F32, ne, &[a, p], &rope_params(32, 0, 0));
        let error = g.run(1).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidGraph, "{pos_ne:?}: {error}");
    }
}

/// Sources a kernel reads by position (sinks, frequency factors, ids) must hold those values:
/// an empty tensor whose `ne[0]` is large enough has none (found by the graph_compute fuzz
/// target: the kernels read past the empty tensors).
#[test]
fn empty_auxiliary_sources_are_refused() {
    // SOFT_MAX with empty sinks
    let mut g = G::new();
    let a = g.input(ty::F32, [8, 2, 3, 1], &[0.5; 48]);
    let sinks = g.input(ty::F32, [3, 0, 1, 1], &[]);
    g.node(
        Op::SOFT_MAX,
        ty::F32,
        [8, 2, 3, 1],
        &[a, NONE, sinks],
        &[f(1.0), 0],
    );
    assert_refused(&g, ErrorKind::InvalidGraph);
    // ROPE with empty frequency factors
    let mut g = G::new();
    let a = g.input(ty::F32, [32, 2, 3, 1], &[0.5; 192]);
    let p = g.ids(ty::I32, [3, 1, 1, 1], &[0, 1, 2]);
    let factors = g.input(ty::F32, [16, 1, 0, 1], &[]);
    g.node(
        Op::ROPE,
        ty::F32,
        [32, 2, 3, 1],
        &[a, p, factors],
        &rope_params(32, 0, 0),
    );
    assert_refused(&g, ErrorKind::InvalidGraph);
    // ADD_ID with empty ids
    let mut g = G::new();
    let a = g.input(ty::F32, [4, 2, 2, 1], &[0.5; 16]);
    let b = g.input(ty::F32, [4, 3, 1, 1], &[0.5; 12]);
    let ids = g.ids(ty::I32, [2, 2, 0, 1], &[]);
    g.node(Op::ADD_ID, ty::F32, [4, 2, 2, 1], &[a, b, ids], &[]);
    assert_refused(&g, ErrorKind::InvalidGraph);
}

#[test]
fn rope_normal_and_neox_with_yarn_and_frequency_factors() {
    let mut rng = Rng::new(16);
    for (round, (mode, t)) in [
        (0, ty::F32),
        (2, ty::F32),
        (0, ty::F16),
        (2, ty::F16),
        (2, ty::F32),
        (0, ty::F32),
    ]
    .into_iter()
    .enumerate()
    {
        let ne = [32, 3, 5, 2];
        let n_dims = if round % 2 == 0 { 32 } else { 24 };
        let x = rng.values(ne.iter().product(), 1.0);
        let pos: Vec<i64> = (0..5).map(|_| rng.below(40) as i64).collect();
        let (freq_scale, ext_factor) = if round >= 4 {
            (0.25f32, 1.0f32)
        } else {
            (1.0, 0.0)
        };
        let factors: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + i as f32 * 0.1).collect();
        let use_factors = round == 5 || round == 1;
        let mut g = G::new();
        // even rounds: src0 as a permuted view of a [32, 5, 3, 2] tensor (strided rows)
        let a = if round % 2 == 0 {
            let mut xp = vec![0.0f32; x.len()];
            for i in all(ne) {
                xp[at([ne[0], ne[2], ne[1], ne[3]], [i[0], i[2], i[1], i[3]])] = x[at(ne, i)];
            }
            let base = g.input(t, [ne[0], ne[2], ne[1], ne[3]], &xp);
            g.permute(base, [0, 2, 1, 3])
        } else {
            g.input(t, ne, &x)
        };
        let p = g.ids(ty::I32, [5, 1, 1, 1], &pos);
        let ff = if use_factors {
            g.input(ty::F32, [n_dims / 2, 1, 1, 1], &factors)
        } else {
            NONE
        };
        let params = [
            0,
            n_dims as i32,
            mode,
            0,
            4096,
            f(10000.0),
            f(freq_scale),
            f(ext_factor),
            f(1.0),
            f(32.0),
            f(1.0),
        ];
        let r = g.node(Op::ROPE, t, ne, &[a, p, ff], &params);
        let out = g.run(2).unwrap();
        let want = rope_reference(
            &stored(t, &x),
            ne,
            &pos,
            n_dims,
            mode,
            10000.0,
            f64::from(freq_scale),
            f64::from(ext_factor),
            1.0,
            4096.0,
            (32.0, 1.0),
            use_factors.then_some(&factors[..]),
            0,
        );
        let tolerance = if t == ty::F16 { 1e-6 } else { 1e-9 };
        assert_close(
            &g.read(&out, r),
            &want,
            tolerance,
            &format!("rope mode {mode} type {t} round {round}"),
        );
    }
}

#[test]
fn rope_tables_are_shared_only_by_nodes_with_the_same_positions_and_parameters() {
    // One graph: ROPE twice with the same positions and parameters (the second takes the
    // first's table), once with another base and once with frequency factors (tables of
    // their own), then ARGMAX overwrites the positions and ROPE runs again with the first
    // parameters: it must see the new positions, not the kept table.
    let mut rng = Rng::new(62);
    let ne = [32, 3, 5, 1];
    let n_dims = 32;
    let x = rng.values(ne.iter().product(), 1.0);
    let pos: Vec<i64> = (0..5).map(|_| rng.below(50) as i64).collect();
    // ARGMAX of row i: the position of its largest value, here 7 * i % 8
    let mut scores = vec![0.0f32; 8 * 5];
    for i in 0..5 {
        scores[i * 8 + 7 * i % 8] = 1.0;
    }
    let new_pos: Vec<i64> = (0..5).map(|i| (7 * i % 8) as i64).collect();
    assert_ne!(pos, new_pos);
    let factors: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + i as f32 * 0.05).collect();

    let mut g = G::new();
    let a = g.input(ty::F32, ne, &x);
    let p = g.ids(ty::I32, [5, 1, 1, 1], &pos);
    let ff = g.input(ty::F32, [n_dims / 2, 1, 1, 1], &factors);
    let s = g.input(ty::F32, [8, 5, 1, 1], &scores);
    let base_params = rope_params(n_dims, 2, 0);
    let mut other_base = base_params;
    other_base[5] = f(500.0);
    let first = g.node(Op::ROPE, ty::F32, ne, &[a, p], &base_params);
    let again = g.node(Op::ROPE, ty::F32, ne, &[a, p], &base_params);
    let other = g.node(Op::ROPE, ty::F32, ne, &[a, p], &other_base);
    let with_factors = g.node(Op::ROPE, ty::F32, ne, &[a, p, ff], &base_params);
    g.node_into(Op::ARGMAX, p, &[s], &[]);
    let moved = g.node(Op::ROPE, ty::F32, ne, &[a, p], &base_params);

    let want = |positions: &[i64], base: f64, factors: Option<&[f32]>| {
        rope_reference(
            &x,
            ne,
            positions,
            n_dims,
            2,
            base,
            1.0,
            0.0,
            1.0,
            4096.0,
            (32.0, 1.0),
            factors,
            0,
        )
    };
    for threads in [1, 3] {
        let out = g.run(threads).unwrap();
        let check = |node, want: Vec<f64>, what: &str| {
            assert_close(
                &g.read(&out, node),
                &want,
                1e-9,
                &format!("{what}, {threads} threads"),
            );
        };
        check(first, want(&pos, 10000.0, None), "first");
        check(again, want(&pos, 10000.0, None), "same key");
        check(other, want(&pos, 500.0, None), "other base");
        check(
            with_factors,
            want(&pos, 10000.0, Some(&factors)),
            "frequency factors",
        );
        check(moved, want(&new_pos, 10000.0, None), "positions rewritten");
        assert_eq!(g.read(&out, first), g.read(&out, again));
    }
}

#[test]
fn rope_over_more_tokens_than_a_table_holds_builds_each_cache_per_token() {
    // Two rotated dimensions: four floats per token in a table, so just over 2^20 tokens
    // pass the 2^22-float bound and each thread builds one token's cache at a time.
    let mut rng = Rng::new(64);
    let ne = [2, 1, (1 << 20) + 1, 1];
    let x = rng.values(ne.iter().product(), 1.0);
    let pos: Vec<i64> = (0..ne[2]).map(|_| rng.below(1000) as i64).collect();
    let mut g = G::new();
    let a = g.input(ty::F32, ne, &x);
    let p = g.ids(ty::I32, [ne[2], 1, 1, 1], &pos);
    let r = g.node(Op::ROPE, ty::F32, ne, &[a, p], &rope_params(2, 0, 0));
    let out = g.run(2).unwrap();
    let want = rope_reference(
        &x,
        ne,
        &pos,
        2,
        0,
        10000.0,
        1.0,
        0.0,
        1.0,
        4096.0,
        (32.0, 1.0),
        None,
        0,
    );
    assert_close(&g.read(&out, r), &want, 1e-9, "rope over 2^20 + 1 tokens");
}

#[test]
fn soft_max_with_mask_broadcast_alibi_and_sinks() {
    let mut rng = Rng::new(17);
    for round in 0..6 {
        let ne = [19, 4, 6, 2];
        let x = rng.values(ne.iter().product(), 4.0);
        let scale = 0.7f32;
        let max_bias = if round >= 3 { 8.0f32 } else { 0.0 };
        let mask_type = if round % 2 == 0 { ty::F16 } else { ty::F32 };
        let (m2, m3) = [(1, 1), (3, 2), (6, 1)][round % 3];
        let mne = [19, 5, m2, m3];
        let mut mask: Vec<f32> = rng.values(mne.iter().product(), 2.0);
        mask[3] = f32::NEG_INFINITY;
        let sinks = rng.values(6, 1.0);
        let mut g = G::new();
        let a = g.input(ty::F32, ne, &x);
        let mt = g.input(mask_type, mne, &mask);
        let st = if round >= 2 {
            g.input(ty::F32, [6, 1, 1, 1], &sinks)
        } else {
            NONE
        };
        let sm = g.node(
            Op::SOFT_MAX,
            ty::F32,
            ne,
            &[a, mt, st],
            &[f(scale), f(max_bias)],
        );
        let out = g.run(3).unwrap();
        let mask = stored(mask_type, &mask);
        let n_head_log2 = 4.0f64; // 1 << floor(log2(6))
        let mut want = vec![0.0f64; x.len()];
        for i3 in 0..2 {
            for i2 in 0..6 {
                let slope = if max_bias > 0.0 {
                    let h = i2 as f64;
                    if h < n_head_log2 {
                        2f64.powf(-f64::from(max_bias) / n_head_log2).powf(h + 1.0)
                    } else {
                        2f64.powf(-f64::from(max_bias) / 2.0 / n_head_log2)
                            .powf(2.0 * (h - n_head_log2) + 1.0)
                    }
                } else {
                    1.0
                };
                for i1 in 0..4 {
                    let w: Vec<f64> = (0..19)
                        .map(|i0| {
                            f64::from(x[at(ne, [i0, i1, i2, i3])]) * f64::from(scale)
                                + slope * f64::from(mask[at(mne, [i0, i1, i2 % m2, i3 % m3])])
                        })
                        .collect();
                    let sink = (round >= 2).then(|| f64::from(sinks[i2]));
                    let max = w
                        .iter()
                        .cloned()
                        .chain(sink)
                        .fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = w.iter().map(|v| (v - max).exp()).sum::<f64>()
                        + sink.map_or(0.0, |s| (s - max).exp());
                    for i0 in 0..19 {
                        want[at(ne, [i0, i1, i2, i3])] = (w[i0] - max).exp() / sum;
                    }
                }
            }
        }
        assert_close(
            &g.read(&out, sm),
            &want,
            1e-11,
            &format!("soft_max round {round}"),
        );
    }
}

#[test]
fn soft_max_may_write_over_its_mask() {
    // ggml's allocator may give SOFT_MAX the mask's bytes when they have its layout
    let x: Vec<f32> = (0..24).map(|i| (i % 7) as f32 * 0.3).collect();
    let m: Vec<f32> = (0..24)
        .map(|i| {
            if i % 5 == 0 {
                f32::NEG_INFINITY
            } else {
                i as f32 * 0.01
            }
        })
        .collect();
    let mut g = G::new();
    let a = g.input(ty::F32, [6, 4, 1, 1], &x);
    let mt = g.input(ty::F32, [6, 4, 1, 1], &m);
    let sm = g.node_into(Op::SOFT_MAX, mt, &[a, mt], &[f(0.5), f(0.0)]);
    let out = g.run(2).unwrap();
    let mut want = Vec::new();
    for (xr, mr) in x.chunks(6).zip(m.chunks(6)) {
        let w: Vec<f64> = xr
            .iter()
            .zip(mr)
            .map(|(&x, &m)| f64::from(x) * 0.5 + f64::from(m))
            .collect();
        let max = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = w.iter().map(|v| (v - max).exp()).sum();
        want.extend(w.iter().map(|v| (v - max).exp() / sum));
    }
    assert_close(&g.read(&out, sm), &want, 1e-12, "soft_max over its mask");
}

#[allow(clippy::too_many_arguments)]
fn attention_reference(
    q: &[f32],
    qne: [usize; 4],
    k: &[f32],
    kne: [usize; 4],
    v: &[f32],
    vne: [usize; 4],
    mask: Option<(&[f32], [usize; 4])>,
    sinks: Option<&[f32]>,
    scale: f64,
    max_bias: f64,
    softcap: f64,
) -> Vec<f64> {
    let (dk, n_q, n_head, ne3) = (qne[0], qne[1], qne[2], qne[3]);
    let (dv, n_kv) = (vne[0], kne[1]);
    let dne = [dv, n_head, n_q, ne3];
    let mut out = vec![0.0; dv * n_head * n_q * ne3];
    let n_head_log2 = 1usize << (n_head as f64).log2().floor() as u32;
    for i3 in 0..ne3 {
        for h in 0..n_head {
            let slope = if max_bias > 0.0 {
                let hl = n_head_log2 as f64;
                if h < n_head_log2 {
                    2f64.powf(-max_bias / hl).powf(h as f64 + 1.0)
                } else {
                    2f64.powf(-max_bias / 2.0 / hl)
                        .powf(2.0 * (h - n_head_log2) as f64 + 1.0)
                }
            } else {
                1.0
            };
            let (kh, k3) = (h / (n_head / kne[2]), i3 / (ne3 / kne[3]));
            let (vh, v3) = (h / (n_head / vne[2]), i3 / (ne3 / vne[3]));
            for iq in 0..n_q {
                let mut s = vec![f64::NEG_INFINITY; n_kv];
                for (c, sc) in s.iter_mut().enumerate() {
                    let mv = mask.map_or(0.0, |(m, mne)| {
                        slope * f64::from(m[at(mne, [c, iq, h % mne[2], i3 % mne[3]])])
                    });
                    if mv == f64::NEG_INFINITY {
                        continue;
                    }
                    let mut d: f64 = (0..dk)
                        .map(|j| {
                            f64::from(q[at(qne, [j, iq, h, i3])])
                                * f64::from(k[at(kne, [j, c, kh, k3])])
                        })
                        .sum::<f64>()
                        * scale;
                    if softcap != 0.0 {
                        d = softcap * (d / softcap).tanh();
                    }
                    *sc = d + mv;
                }
                let sink = sinks.map(|s| f64::from(s[h]));
                let max = s
                    .iter()
                    .cloned()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let sum: f64 = s.iter().map(|x| (x - max).exp()).sum::<f64>()
                    + sink.map_or(0.0, |x| (x - max).exp());
                for d in 0..dv {
                    let acc: f64 = (0..n_kv)
                        .map(|c| (s[c] - max).exp() * f64::from(v[at(vne, [d, c, vh, v3])]))
                        .sum();
                    out[at(dne, [d, h, iq, i3])] = acc / sum;
                }
            }
        }
    }
    out
}

#[test]
fn flash_attn_ext_with_gqa_mask_softcap_alibi_and_sinks() {
    let mut rng = Rng::new(18);
    // few queries (one query row at a time), then 64 or more: ggml's tiled path, with tiles
    // of queries and of keys that end early (130 queries over threads, 150 keys)
    for (round, tiled) in (0..6).flat_map(|round| [(round, false), (round, true)]) {
        let (n_q, n_kv) = if tiled {
            (64 + 13 * round, 150)
        } else {
            (3 + round, 17)
        };
        let (dk, dv, n_head, n_head_kv) = (32, 24, 4, if round % 2 == 0 { 2 } else { 4 });
        let kv_type = if round < 4 { ty::F16 } else { ty::F32 };
        let qne = [dk, n_q, n_head, 1];
        let kne = [dk, n_kv, n_head_kv, 1];
        let vne = [dv, n_kv, n_head_kv, 1];
        let mne = [n_kv + 3, n_q + 1, 1, 1];
        let q = rng.values(qne.iter().product(), 1.0);
        let k = rng.values(kne.iter().product(), 1.0);
        let v = rng.values(vne.iter().product(), 1.0);
        let mut mask = rng.values(mne.iter().product(), 1.0);
        // causal-style -inf entries, one fully masked query row
        for iq in 0..n_q {
            for c in (n_kv - 4 + iq).min(n_kv)..n_kv {
                mask[at(mne, [c, iq, 0, 0])] = f32::NEG_INFINITY;
            }
        }
        for c in 0..n_kv {
            mask[at(mne, [c, 1, 0, 0])] = f32::NEG_INFINITY;
        }
        let sinks = rng.values(n_head, 1.0);
        let scale = 1.0 / (dk as f32).sqrt();
        let (max_bias, softcap) = match round {
            1 => (0.0, 5.0),
            2 => (8.0, 0.0),
            3 => (4.0, 20.0),
            _ => (0.0, 0.0),
        };
        let with_sinks = round >= 3;
        let mut g = G::new();
        // odd rounds read Q as llama.cpp passes it (a permuted [dk, n_head, n_q] tensor) and
        // K/V as views of a larger cache (row stride of two rows)
        let (qt, kt, vt) = if round % 2 == 1 {
            let mut qp = vec![0.0f32; q.len()];
            for h in 0..n_head {
                for iq in 0..n_q {
                    for j in 0..dk {
                        qp[j + dk * (h + n_head * iq)] = q[at(qne, [j, iq, h, 0])];
                    }
                }
            }
            let base = g.input(ty::F32, [dk, n_head, n_q, 1], &qp);
            let qt = g.permute(base, [0, 2, 1, 3]);
            let cache = |g: &mut G, t: u32, ne: [usize; 4], values: &[f32]| {
                let mut wide = vec![0.0f32; 2 * values.len()];
                for (r, row) in values.chunks(ne[0]).enumerate() {
                    wide[2 * r * ne[0]..(2 * r + 1) * ne[0]].copy_from_slice(row);
                }
                let big = g.input(t, [ne[0], 2 * ne[1], ne[2], 1], &wide);
                let es = type_size(t).1;
                g.view(
                    big,
                    ne,
                    [
                        es,
                        2 * ne[0] * es,
                        2 * ne[0] * ne[1] * es,
                        2 * ne[0] * ne[1] * ne[2] * es,
                    ],
                    0,
                )
            };
            let kt = cache(&mut g, kv_type, kne, &k);
            let vt = cache(&mut g, kv_type, vne, &v);
            (qt, kt, vt)
        } else {
            let qt = g.input(ty::F32, qne, &q);
            let kt = g.input(kv_type, kne, &k);
            let vt = g.input(kv_type, vne, &v);
            (qt, kt, vt)
        };
        let mt = g.input(ty::F16, mne, &mask);
        let st = if with_sinks {
            g.input(ty::F32, [n_head, 1, 1, 1], &sinks)
        } else {
            NONE
        };
        let fa = g.node(
            Op::FLASH_ATTN_EXT,
            ty::F32,
            [dv, n_head, n_q, 1],
            &[qt, kt, vt, mt, st],
            &[f(scale), f(max_bias), f(softcap), 0],
        );
        let out = g.run(2).unwrap();
        let want = attention_reference(
            &q,
            qne,
            &stored(kv_type, &k),
            kne,
            &stored(kv_type, &v),
            vne,
            Some((&stored(ty::F16, &mask), mne)),
            with_sinks.then_some(&sinks[..]),
            f64::from(scale),
            f64::from(max_bias),
            f64::from(softcap),
        );
        // F16 K/V with few queries take ggml's one-row path: the query rounded to F16, V sums
        // kept in F16; everything else runs in f32
        let tolerance = if kv_type == ty::F16 && !tiled {
            1e-6
        } else {
            1e-10
        };
        assert_close(
            &g.read(&out, fa),
            &want,
            tolerance,
            &format!("flash_attn_ext round {round}, {n_q} queries"),
        );
    }
}

#[test]
fn flash_attn_ext_keeps_f16_value_sums_like_ggml_for_few_queries() {
    // Every key scores 0, every value is 1: the exact output is 1. ggml's one-row path (fewer
    // than 64 queries) sums V in F16, which stops growing at 2048 (2048 + 1 rounds back to
    // 2048), while the weights' sum reaches n_kv in f32: it gives 2048 / n_kv. Its tiled path
    // (64 queries or more) sums in f32 and gives 1.
    let (d, n_kv) = (8, 3000);
    for (n_q, want) in [(1, 2048.0 / 3000.0), (63, 2048.0 / 3000.0), (64, 1.0)] {
        let mut g = G::new();
        let q = g.input(ty::F32, [d, n_q, 1, 1], &vec![0.0; d * n_q]);
        let k = g.input(ty::F16, [d, n_kv, 1, 1], &vec![0.5; d * n_kv]);
        let v = g.input(ty::F16, [d, n_kv, 1, 1], &vec![1.0; d * n_kv]);
        let fa = g.node(
            Op::FLASH_ATTN_EXT,
            ty::F32,
            [d, 1, n_q, 1],
            &[q, k, v],
            &[f(1.0), f(0.0), f(0.0), 0],
        );
        let out = g.run(2).unwrap();
        for (i, got) in g.read(&out, fa).into_iter().enumerate() {
            assert!(
                (got - want).abs() < 1e-6,
                "n_q {n_q} element {i}: {got} != {want}"
            );
        }
    }
}

#[test]
fn diag_mask_inf_in_place() {
    let x: Vec<f32> = (0..6 * 4 * 2).map(|i| i as f32).collect();
    let mut g = G::new();
    let a = g.input(ty::F32, [6, 4, 2, 1], &x);
    let masked = g.node_into(Op::DIAG_MASK_INF, a, &[a], &[1]);
    let out = g.run(1).unwrap();
    let want: Vec<f64> = all([6, 4, 2, 1])
        .map(|[i0, i1, i2, _]| {
            if i0 > 1 + i1 {
                f64::NEG_INFINITY
            } else {
                f64::from(x[at([6, 4, 2, 1], [i0, i1, i2, 0])])
            }
        })
        .collect();
    assert_close(&g.read(&out, masked), &want, 0.0, "diag_mask_inf");
}

// --- refusals and determinism --------------------------------------------------------------

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
        super::run(&g.pool, &super::Pool::eager(threads), &graph).unwrap();
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
        let workers = super::Pool::new(threads);
        super::run(&g.pool, &workers, &graph).unwrap();
        let start = std::time::Instant::now();
        super::run(&g.pool, &workers, &graph).unwrap();
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
        let workers = super::Pool::new(threads);
        super::run(&g.pool, &workers, &graph).unwrap();
        let start = std::time::Instant::now();
        super::run(&g.pool, &workers, &graph).unwrap();
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
        let workers = super::Pool::new(threads);
        super::run(&g.pool, &workers, &graph).unwrap();
        let start = std::time::Instant::now();
        super::run(&g.pool, &workers, &graph).unwrap();
        println!(
            "300 nodes of 64 Ki elements, {threads} threads: {:.2} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}
