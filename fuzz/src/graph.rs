//! `graph_decode`: GRAPH_COMPUTE payloads through [`GraphComputeRequest::decode`] and
//! [`Graph::decode`], either as raw bytes or built from an arbitrary [`GraphSpec`] so that most
//! inputs get past the length checks and into the structural validation.
//!
//! Input layout: `mode: u8` (bit 0: protocol 8 else 7; bit 1: structured; bit 2: with bit 0, the
//! 8.0.1 op and type table else 8.0.0's), then either the raw
//! payload or the bytes a derived [`GraphSpec`] is read from.

use std::collections::{HashMap, HashSet};

use arbitrary::{Arbitrary, Unstructured};
use bytes::BytesMut;
use proto_core::backend::{BufferId, TensorLocation};
use proto_core::ggml::{flags, types::id as ty, GgmlTable, Op};
use proto_core::graph::{Graph, GraphLimits};
use proto_core::wire::{Dialect, GraphComputeRequest, RpcTensor};
use proto_core::{Error, Result};

use crate::byte;

/// Mode bits.
pub mod mode {
    /// Protocol 8.
    pub const V8: u8 = 1;
    /// Structured input.
    pub const STRUCTURED: u8 = 2;
    /// With [`V8`]: the 8.0.1 op and type table (else 8.0.0's).
    pub const V8_0_1: u8 = 4;
}

/// The buffers the fuzzed resolver knows: (handle, base, size).
pub const BUFFERS: [(u64, u64, u64); 2] = [(1, 0x1000, 0x1_0000), (2, 0x10_0000, 64)];
/// A handle the resolver does not know.
pub const UNKNOWN_BUFFER: u64 = 77;

/// One tensor of a structured graph, in small domains so links and shapes mostly make sense.
#[derive(Debug, Clone, Arbitrary)]
pub struct TensorSpec {
    /// Type selector (see [`TYPES`]).
    pub ty: u8,
    /// Dimension selectors: `d & 7 == 7` is 0 elements, else `1 + (d & 3)` (blocks for
    /// quantized types).
    pub ne: [u8; 4],
    /// Op selector: below 200 an op id of the table, else an id outside it.
    pub op: u8,
    /// `op_params[0]` (the UNARY / GLU sub-op).
    pub op_param0: i8,
    /// The COMPUTE flag.
    pub compute: bool,
    /// Other flag bits (low 4 used).
    pub other_flags: u8,
    /// Source links: 0 = none, 1..=249 = a tensor before this one, 250.. = the raw id `s - 249`
    /// (may be forward, dangling or cyclic).
    pub srcs: [u8; 3],
    /// `view_src`, encoded like a source link.
    pub view: u8,
    /// `view_offs` in 4-byte units.
    pub view_offs: u8,
    /// Storage selector: none, buffer 1, buffer 2, an unknown buffer, a stray address.
    pub storage: u8,
    /// Address offset inside the buffer.
    pub data: u16,
    /// Swap `nb[0]` and `nb[1]` (a transposed view).
    pub transpose: bool,
    /// Replaces the id when the graph's `raw_ids` is set (may repeat or be 0).
    pub raw_id: u8,
}

/// The tensor types a structured graph uses: common ones, a removed id and an invalid one.
pub const TYPES: [u32; 10] = [ty::F32, ty::F16, ty::Q4_0, ty::Q8_0, ty::Q4_K, ty::I32, ty::BF16, ty::F8_E4M3, 4, 999];

/// A structured GRAPH_COMPUTE request.
#[derive(Debug, Clone, Arbitrary)]
pub struct GraphSpec {
    /// Device index.
    pub device: u8,
    /// Graph uid (dropped in protocol 7).
    pub uid: u64,
    /// Use `raw_id` instead of `index + 1`.
    pub raw_ids: bool,
    /// Send the tensor list reversed (the decoder must not depend on list order).
    pub reverse: bool,
    /// Tiny limits instead of the defaults.
    pub small_limits: bool,
    /// Trailing bytes after the payload (ignored by the protocol).
    pub trailing: u8,
    /// Node selectors (indices modulo the tensor count); empty = every tensor, in order.
    pub nodes: Vec<u8>,
    /// The tensors.
    pub tensors: Vec<TensorSpec>,
}

fn link(position: usize, selector: u8, ids: &[u64]) -> u64 {
    match selector {
        0 => 0,
        1..=249 if position == 0 => 0,
        1..=249 => ids[position - 1 - usize::from(selector - 1) % position],
        raw => u64::from(raw - 249),
    }
}

impl GraphSpec {
    /// The request this spec describes.
    pub fn to_request(
        &self,
        dialect: Dialect,
        table: GgmlTable,
    ) -> (GraphComputeRequest, GraphLimits) {
        let ids: Vec<u64> = self
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| if self.raw_ids { u64::from(t.raw_id) } else { i as u64 + 1 })
            .collect();
        let mut tensors: Vec<RpcTensor> = self
            .tensors
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let type_id = TYPES[usize::from(spec.ty) % TYPES.len()];
                let block = proto_core::ggml::type_info(type_id).map_or(1, |info| info.block_size);
                let dim = |d: u8| if d & 7 == 7 { 0 } else { 1 + u32::from(d & 3) };
                let mut ne = spec.ne.map(dim);
                ne[0] *= block;
                let mut tensor = RpcTensor::contiguous(ids[i], type_id, ne)
                    .unwrap_or(RpcTensor { id: ids[i], type_id, ne, ..RpcTensor::default() });
                if spec.transpose {
                    tensor.nb.swap(0, 1);
                }
                tensor.op = if spec.op < 200 {
                    u32::from(spec.op) % table.op_count()
                } else {
                    table.op_count() + u32::from(spec.op)
                };
                tensor.op_params[0] = spec.op_param0.into();
                tensor.flags = i32::from(spec.other_flags & 0xf)
                    | if spec.compute { flags::COMPUTE } else { 0 };
                for (slot, &selector) in spec.srcs.iter().enumerate() {
                    tensor.src[slot] = link(i, selector, &ids);
                }
                tensor.view_src = link(i, spec.view, &ids);
                tensor.view_offs = u64::from(spec.view_offs) * 4;
                let data = u64::from(spec.data);
                (tensor.buffer, tensor.data) = match spec.storage % 5 {
                    0 => (0, 0),
                    1 => (BUFFERS[0].0, BUFFERS[0].1 + data),
                    2 => (BUFFERS[1].0, BUFFERS[1].1 + data % 64),
                    3 => (UNKNOWN_BUFFER, data),
                    _ => (0, data | 1),
                };
                tensor.set_name(&format!("t{i}"));
                tensor
            })
            .collect();
        let node_ids = if self.nodes.is_empty() || tensors.is_empty() {
            ids.clone()
        } else {
            self.nodes.iter().map(|&n| ids[usize::from(n) % ids.len()]).collect()
        };
        if self.reverse {
            tensors.reverse();
        }
        let uid = if dialect.has_graph_uid() { self.uid } else { 0 };
        let limits = if self.small_limits {
            GraphLimits { max_nodes: 3, max_tensors: 6 }
        } else {
            GraphLimits::default()
        };
        (GraphComputeRequest { device: self.device.into(), uid, node_ids, tensors }, limits)
    }
}

/// The dispatcher's resolver contract over [`BUFFERS`].
pub fn resolve(record: &RpcTensor, byte_size: u64) -> Result<Option<TensorLocation>> {
    match (record.buffer, record.data) {
        (0, 0) => Ok(None),
        (0, _) => Err(Error::MissingBuffer),
        (handle, data) => {
            let &(_, base, size) = BUFFERS
                .iter()
                .find(|(h, _, _)| *h == handle)
                .ok_or(Error::UnknownBuffer { handle })?;
            let end = base + size;
            let inside = data >= base
                && data.checked_add(byte_size).is_some_and(|e| e <= end)
                && (byte_size > 0 || data <= end);
            if !inside {
                return Err(Error::OutOfBounds("tensor outside its buffer"));
            }
            Ok(Some(TensorLocation { buffer: BufferId(handle), offset: data - base }))
        }
    }
}

/// Decodes and validates; on success checks every documented invariant of [`Graph`].
pub fn decode_and_check(
    request: &GraphComputeRequest,
    limits: &GraphLimits,
    table: GgmlTable,
) -> Result<Graph> {
    let mut calls = Vec::new();
    let result = Graph::decode(request, limits, table, &mut |record, size| {
        calls.push((record.id, size));
        resolve(record, size)
    });
    let graph = result?;
    check_invariants(request, limits, table, &graph, &calls);
    Ok(graph)
}

fn check_invariants(
    request: &GraphComputeRequest,
    limits: &GraphLimits,
    table: GgmlTable,
    graph: &Graph,
    calls: &[(u64, u64)],
) {
    let n = graph.tensors.len();
    assert_eq!((graph.device, graph.uid), (request.device, request.uid));
    assert_eq!(n, request.tensors.len());
    assert!(n <= limits.max_tensors && graph.nodes.len() <= limits.max_nodes);
    // The resolver ran exactly once per tensor, in list order.
    let expected_calls: Vec<(u64, u64)> = graph.tensors.iter().map(|t| (t.id(), t.byte_size)).collect();
    assert_eq!(calls, &expected_calls[..]);
    let mut ids = HashMap::new();
    for (i, (tensor, record)) in graph.tensors.iter().zip(&request.tensors).enumerate() {
        let op = table.op_from_wire(record.op).expect("accepted op is in the table");
        let renumbered = RpcTensor { op: op.0, ..record.clone() };
        assert_eq!(tensor.record, renumbered, "records are kept in order, verbatim but the op");
        assert_ne!(tensor.id(), 0);
        assert!(ids.insert(tensor.id(), i).is_none(), "duplicate id accepted");
        assert_eq!(Ok(tensor.byte_size), record.byte_size());
        record.validate_shape(table).expect("accepted record has a valid shape");
        let op = tensor.op();
        assert!(op.is_valid() && !op.is_custom(), "op {op:?} accepted");
    }
    for tensor in &graph.tensors {
        for (slot, &link) in tensor.src.iter().enumerate() {
            let wire = tensor.record.src[slot];
            match link {
                None => assert_eq!(wire, 0),
                Some(index) => assert_eq!(graph.tensors[index as usize].id(), wire),
            }
        }
        match tensor.view_src {
            None => assert_eq!(tensor.record.view_src, 0),
            Some(index) => {
                let source = &graph.tensors[index as usize];
                assert_eq!(source.id(), tensor.record.view_src);
                if tensor.byte_size > 0 {
                    let end = tensor.record.view_offs.checked_add(tensor.byte_size);
                    assert!(end.is_some_and(|e| e <= source.byte_size), "view outside its source");
                }
            }
        }
        let (buffer, data) = (tensor.record.buffer, tensor.record.data);
        assert_eq!(tensor.location.is_some(), buffer != 0 || data != 0);
    }
    // No cycles: Kahn's algorithm over src/view_src must order everything. A source naming its
    // own tensor (ggml_cast's CPY) is no dependency; a view of itself is a cycle.
    let links = |t: usize| {
        let tensor = &graph.tensors[t];
        let sources = tensor.src.iter().flatten().map(|&i| i as usize).filter(|&i| i != t);
        sources.chain(tensor.view_src.iter().map(|&i| i as usize)).collect::<Vec<_>>()
    };
    let mut pending: Vec<usize> = (0..n).map(|t| links(t).len()).collect();
    let mut users = vec![Vec::new(); n];
    for t in 0..n {
        for target in links(t) {
            users[target].push(t);
        }
    }
    let mut queue: Vec<usize> = (0..n).filter(|&t| pending[t] == 0).collect();
    let mut ordered = 0;
    while let Some(t) = queue.pop() {
        ordered += 1;
        for &user in &users[t] {
            pending[user] -= 1;
            if pending[user] == 0 {
                queue.push(user);
            }
        }
    }
    assert_eq!(ordered, n, "a cyclic graph was accepted");
    // Nodes: non-empty, unique, the request's ids, never reading a later node.
    assert!(!graph.nodes.is_empty());
    assert_eq!(graph.nodes.len(), request.node_ids.len());
    let mut position = HashMap::new();
    for (p, (&node, &id)) in graph.nodes.iter().zip(&request.node_ids).enumerate() {
        assert_eq!(graph.tensors[node as usize].id(), id);
        assert!(position.insert(node as usize, p).is_none(), "duplicate node accepted");
    }
    // latest(t): the last node position among t and its view_src chain.
    let latest = |mut t: usize| {
        let mut best = None;
        let mut seen = HashSet::new();
        loop {
            best = best.max(position.get(&t).copied());
            if !seen.insert(t) {
                break;
            }
            match graph.tensors[t].view_src {
                Some(source) => t = source as usize,
                None => break,
            }
        }
        best
    };
    for (p, &node) in graph.nodes.iter().enumerate() {
        for read in links(node as usize) {
            if let Some(producer) = latest(read) {
                assert!(producer < p, "node #{p} reads what node #{producer} produces later");
            }
        }
        let tensor = &graph.tensors[node as usize];
        if tensor.is_compute() {
            for used in std::iter::once(node).chain(tensor.sources()) {
                let used = &graph.tensors[used as usize];
                assert!(used.byte_size == 0 || used.location.is_some(), "computed tensor without storage");
            }
        }
    }
}

/// What a run reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphOutcome {
    /// The payload itself did not decode.
    Undecodable(Error),
    /// The payload decoded; the graph failed validation.
    Invalid(Error),
    /// A valid graph with this many nodes.
    Valid(usize),
}

/// Runs one input. Panics on a broken invariant.
pub fn run(data: &[u8]) -> Option<GraphOutcome> {
    let mut u = Unstructured::new(data);
    let mode = byte(&mut u);
    let dialect = if mode & mode::V8 != 0 { Dialect::V8 } else { Dialect::V7 };
    let table = if dialect == Dialect::V8 && mode & mode::V8_0_1 != 0 {
        GgmlTable::V8_0_1
    } else {
        GgmlTable::V8_0_0
    };
    let (request, limits) = if mode & mode::STRUCTURED == 0 {
        let payload = u.take_rest();
        let request = match GraphComputeRequest::decode(dialect, payload) {
            Ok(request) => request,
            Err(error) => return Some(GraphOutcome::Undecodable(error)),
        };
        // Re-encoding reproduces the payload up to the ignored trailing bytes.
        let mut encoded = BytesMut::new();
        request.encode(dialect, &mut encoded);
        assert_eq!(encoded.len(), request.encoded_len(dialect));
        assert_eq!(&encoded[..], &payload[..encoded.len()], "re-encoding differs");
        (request, GraphLimits::default())
    } else {
        let spec = GraphSpec::arbitrary_take_rest(u).ok()?;
        let (request, limits) = spec.to_request(dialect, table);
        let mut payload = BytesMut::new();
        request.encode(dialect, &mut payload);
        payload.extend_from_slice(&vec![0xee; usize::from(spec.trailing % 16)]);
        let decoded =
            GraphComputeRequest::decode(dialect, &payload).expect("an encoded request decodes");
        assert_eq!(decoded, request, "encode/decode round trip");
        (decoded, limits)
    };
    Some(match decode_and_check(&request, &limits, table) {
        Ok(graph) => GraphOutcome::Valid(graph.nodes.len()),
        Err(error) => GraphOutcome::Invalid(error),
    })
}

/// A valid graph for seeds: `layers` blocks of a small transformer-like chain, every tensor at
/// `base` in buffer `handle` (at least 1,088 bytes), sources before users, nodes in order; ops
/// in 7.0.0/8.0.0 numbering.
pub fn sample_graph(dialect: Dialect, layers: u64, handle: u64, base: u64) -> GraphComputeRequest {
    let unary = GgmlTable::V8_0_0.op_to_wire(Op::UNARY).expect("UNARY is in every table");
    let mut tensors = Vec::new();
    let mut nodes = Vec::new();
    let mut next_id = 1u64;
    let mut new = |type_id: u32, ne: [u32; 4], op: u32, src: &[u64], compute: bool| {
        let mut t = RpcTensor::contiguous(next_id, type_id, ne).expect("valid");
        next_id += 1;
        t.buffer = handle;
        t.data = base;
        t.op = op;
        t.src[..src.len()].copy_from_slice(src);
        if compute {
            t.flags = flags::COMPUTE;
        }
        t
    };
    let input = new(ty::F32, [32, 4, 1, 1], 0, &[], false);
    let mut x = input.id;
    tensors.push(input);
    for _ in 0..layers {
        let w = new(ty::Q8_0, [32, 32, 1, 1], 0, &[], false);
        let mm = new(ty::F32, [32, 4, 1, 1], proto_core::ggml::Op::MUL_MAT.0, &[w.id, x], true);
        let mut act = new(ty::F32, [32, 4, 1, 1], unary, &[mm.id], true);
        act.op_params[0] = proto_core::ggml::UnaryOp::SILU.0;
        let add = new(ty::F32, [32, 4, 1, 1], proto_core::ggml::Op::ADD.0, &[act.id, x], true);
        nodes.extend([mm.id, act.id, add.id]);
        x = add.id;
        tensors.extend([w, mm, act, add]);
    }
    let uid = if dialect.has_graph_uid() { 42 } else { 0 };
    GraphComputeRequest { device: 0, uid, node_ids: nodes, tensors }
}

/// A valid 8.0.1 graph for seeds: one node of every op whose id moved in 8.0.1 (`TOP_K_MASK` 91,
/// `UNARY` 92, `CROSS_ENTROPY_LOSS` 97, `CROSS_ENTROPY_LOSS_BACK` 98, `OPT_STEP_ADAMW` 99,
/// `OPT_STEP_SGD` 100, `GLU` 101), ops in 8.0.1 numbering, every tensor at `base` in buffer
/// `handle` (at least 128 bytes). An 8.0.0 table refuses it (92 is a custom op there).
pub fn moved_ops_graph(handle: u64, base: u64) -> GraphComputeRequest {
    let table = GgmlTable::V8_0_1;
    let op = |op: Op| table.op_to_wire(op).expect("an 8.0.1 op");
    let mut tensors = Vec::new();
    let mut next_id = 1u64;
    let mut add = |type_id: u32, ne: [u32; 4], op: u32, src: &[u64], param0: i32| {
        let mut t = RpcTensor::contiguous(next_id, type_id, ne).expect("valid");
        next_id += 1;
        t.buffer = handle;
        t.data = base;
        t.op = op;
        t.op_params[0] = param0;
        t.src[..src.len()].copy_from_slice(src);
        if op != 0 {
            t.flags = flags::COMPUTE;
        }
        let id = t.id;
        tensors.push(t);
        id
    };
    let mask = add(ty::F16, [16, 1, 1, 1], 0, &[], 0);
    let top_k = add(ty::I32, [4, 2, 1, 1], 0, &[], 0);
    let x = add(ty::F32, [8, 4, 1, 1], 0, &[], 0);
    let labels = add(ty::F32, [8, 4, 1, 1], 0, &[], 0);
    let adamw = add(ty::F32, [7, 1, 1, 1], 0, &[], 0);
    let sgd = add(ty::F32, [2, 1, 1, 1], 0, &[], 0);
    let nodes = vec![
        add(ty::F16, [16, 2, 1, 1], op(Op::TOP_K_MASK), &[mask, top_k], 0),
        add(ty::F32, [8, 4, 1, 1], op(Op::UNARY), &[x], proto_core::ggml::UnaryOp::SILU.0),
        add(ty::F32, [1, 1, 1, 1], op(Op::CROSS_ENTROPY_LOSS), &[x, labels], 0),
    ];
    let loss = nodes[2];
    let mut nodes = nodes;
    nodes.push(add(ty::F32, [8, 4, 1, 1], op(Op::CROSS_ENTROPY_LOSS_BACK), &[loss, x, labels], 0));
    let grad = nodes[3];
    nodes.push(add(ty::F32, [8, 4, 1, 1], op(Op::OPT_STEP_ADAMW), &[x, grad, labels, labels, adamw], 0));
    nodes.push(add(ty::F32, [8, 4, 1, 1], op(Op::OPT_STEP_SGD), &[x, grad, sgd], 0));
    nodes.push(add(ty::F32, [4, 4, 1, 1], op(Op::GLU), &[x], proto_core::ggml::GluOp::SWIGLU.0));
    GraphComputeRequest { device: 0, uid: 0x801, node_ids: nodes, tensors }
}

/// A valid 8.0.1 graph for seeds: `y = w · x` with an f8_e4m3 weight (type 43, 8.0.1 only), at
/// `base` in buffer `handle` (at least 128 bytes).
pub fn f8_graph(handle: u64, base: u64) -> GraphComputeRequest {
    let record = |id: u64, type_id: u32, ne: [u32; 4]| {
        let mut t = RpcTensor::contiguous(id, type_id, ne).expect("valid");
        t.buffer = handle;
        t.data = base;
        t
    };
    let w = record(1, ty::F8_E4M3, [32, 2, 1, 1]);
    let x = record(2, ty::F32, [32, 1, 1, 1]);
    let mut y = record(3, ty::F32, [2, 1, 1, 1]);
    y.op = Op::MUL_MAT.0;
    y.src[..2].copy_from_slice(&[w.id, x.id]);
    y.flags = flags::COMPUTE;
    GraphComputeRequest { device: 0, uid: 0x8f8, node_ids: vec![y.id], tensors: vec![w, x, y] }
}
