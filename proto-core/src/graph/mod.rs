//! GRAPH_COMPUTE payloads decoded into an owned, validated graph.
//!
//! The reference server rebuilds a ggml graph by creating tensors by id, recursively through
//! `src[]` and `view_src` (PROTOCOL.md §5.17). That accepts node id 0, recurses without a depth
//! bound, tolerates reference cycles, runs any op id (custom ops included) and dereferences
//! memory it does not own (gaps G3, G6, G7, G8). [`Graph::decode`] does the same reconstruction
//! iteratively and rejects every one of those cases, so a backend that receives a [`Graph`] can
//! execute its nodes in list order, find every source by index, and touch only memory the
//! dispatcher's resolver vouched for.
//!
//! Invariants of a decoded [`Graph`]:
//! * `tensors` is the request's tensor list, in the same order, each id non-zero and unique;
//! * every `src`/`view_src` index and every node index is `< tensors.len()`;
//! * the `src`/`view_src` links form no cycle;
//! * `nodes` is non-empty, has no duplicates, and a node never reads a node listed after it
//!   (directly or through the `view_src` chain of what it reads or writes);
//! * every record has a valid type and shape, a byte size that fits in `u64`, an op inside
//!   ggml's table that is not a custom op, and a valid unary/GLU sub-op where applicable;
//! * a non-empty view lies inside its `view_src` (`view_offs + byte_size <= byte_size(view_src)`);
//! * every non-empty tensor that a node with the COMPUTE flag reads or writes has a location.

mod error;
mod validate;

use crate::backend::TensorLocation;
use crate::error::Result;
use crate::ggml::{flags, GgmlTable, Op};
use crate::wire::{GraphComputeRequest, RpcTensor, MAX_SRC};

pub use error::{GraphError, Link};

/// Index of a tensor in [`Graph::tensors`].
pub type TensorIndex = u32;

/// One tensor of a decoded graph: its wire record plus the links resolved to indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphTensor {
    /// The wire record, unchanged (op_params, flags, ne, nb, name, use_count, raw ids...) but
    /// for `op`, which holds the op in the newest numbering whatever table the client used.
    pub record: RpcTensor,
    /// `record.src[i]` resolved to an index (`None` where the wire id is 0). Slot positions are
    /// kept because ops give meaning to them.
    pub src: [Option<TensorIndex>; MAX_SRC],
    /// `record.view_src` resolved to an index (`None` when the tensor is not a view).
    pub view_src: Option<TensorIndex>,
    /// The tensor's byte extent ([`RpcTensor::byte_size`]).
    pub byte_size: u64,
    /// Where the tensor's bytes live, as the resolver mapped `(buffer, data)`; `None` for a
    /// tensor that is not in a buffer of this server.
    pub location: Option<TensorLocation>,
}

impl GraphTensor {
    /// The client's id of the tensor.
    pub fn id(&self) -> u64 {
        self.record.id
    }

    /// The tensor's op.
    pub fn op(&self) -> Op {
        Op(self.record.op)
    }

    /// Whether the COMPUTE flag is set (backends skip nodes without it).
    pub fn is_compute(&self) -> bool {
        self.record.flags & flags::COMPUTE != 0
    }

    /// The indices of the sources, in slot order, empty slots skipped.
    pub fn sources(&self) -> impl Iterator<Item = TensorIndex> + '_ {
        self.src.iter().flatten().copied()
    }

    /// Every link the graph's order depends on, for the tensor at index `own`: the sources,
    /// then `view_src`. A source naming the tensor itself is left out: `ggml_cast` builds a CPY
    /// whose `src[1]` is its own result (the copy's destination operand, never read), and the
    /// reference server accepts it; a `view_src` naming itself stays a cycle.
    fn links(&self, own: TensorIndex) -> impl Iterator<Item = TensorIndex> + '_ {
        self.sources()
            .filter(move |&source| source != own)
            .chain(self.view_src)
    }
}

/// Size limits checked before anything proportional to the request's counts is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphLimits {
    /// Most entries allowed in the node list.
    pub max_nodes: usize,
    /// Most records allowed in the tensor list.
    pub max_tensors: usize,
}

impl GraphLimits {
    /// The default limits: 262,144 nodes and 1,048,576 tensors. llama.cpp sizes its graphs at
    /// `max(1024, 8 · n_model_tensors)` nodes, far below this for any released model, and a
    /// tensor list this long is already a 310 MB payload.
    pub const DEFAULT: GraphLimits = GraphLimits {
        max_nodes: 1 << 18,
        max_tensors: 1 << 20,
    };
}

impl Default for GraphLimits {
    fn default() -> Self {
        GraphLimits::DEFAULT
    }
}

/// A decoded, validated GRAPH_COMPUTE graph (see the module documentation for its invariants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    /// The device the graph runs on (not range-checked here: the dispatcher knows the count).
    pub device: u32,
    /// The graph uid (protocol 8; 0 = not cacheable, always 0 in protocol 7).
    pub uid: u64,
    /// The nodes in execution order, as indices into `tensors`.
    pub nodes: Vec<TensorIndex>,
    /// Every tensor of the request, in request order.
    pub tensors: Vec<GraphTensor>,
}

impl Graph {
    /// Decodes and validates a GRAPH_COMPUTE request.
    ///
    /// `resolve(record, byte_size)` maps a record's `(buffer, data)` to a location. It is called
    /// exactly once per tensor, in list order, after every structural check has passed. It must
    /// return `Ok(None)` when `buffer == 0 && data == 0`, and an error for an unknown buffer, for
    /// `buffer == 0` with `data != 0`, and for an extent `[data, data + byte_size)` outside the
    /// buffer (the dispatcher implements it against its buffer table). Its errors are returned
    /// unchanged.
    ///
    /// Errors: [`Error::InvalidGraph`](crate::Error::InvalidGraph) with a [`GraphError`] for
    /// structural problems (limits, empty node list, zero/duplicate/unknown ids, dangling links, cycles, views
    /// outside their source, nodes out of order, computed tensors without storage);
    /// [`Error::OpOutsideTable`](crate::Error::OpOutsideTable) for op ids outside `table`;
    /// [`Error::OpRefused`](crate::Error::OpRefused) for custom ops and unknown unary/GLU
    /// sub-ops; the errors of [`RpcTensor::validate_shape`] and
    /// [`RpcTensor::byte_size`] for bad records. Never panics and never recurses, whatever the
    /// input; runs in time linear in the request size.
    pub fn decode(
        request: &GraphComputeRequest,
        limits: &GraphLimits,
        table: GgmlTable,
        resolve: &mut dyn FnMut(&RpcTensor, u64) -> Result<Option<TensorLocation>>,
    ) -> Result<Graph> {
        validate::decode(request, limits, table, resolve)
    }

    /// The tensor at `index`.
    ///
    /// # Panics
    /// If `index` is out of range; indices stored in a decoded graph never are. [`Graph::get`]
    /// is the checked form.
    // A documented panicking accessor, like slice indexing; the checked form is `get`.
    #[allow(clippy::indexing_slicing)]
    pub fn tensor(&self, index: TensorIndex) -> &GraphTensor {
        &self.tensors[slot(index)]
    }

    /// The tensor at `index`, or `None` if `index` is out of range.
    pub fn get(&self, index: TensorIndex) -> Option<&GraphTensor> {
        self.tensors.get(slot(index))
    }

    /// The node tensors in execution order, including those without the COMPUTE flag.
    pub fn node_tensors(&self) -> impl Iterator<Item = &GraphTensor> + '_ {
        self.nodes.iter().map(|&index| self.tensor(index))
    }

    /// The nodes whose COMPUTE flag is set, in execution order, with their indices (backends
    /// skip the others).
    pub fn compute_nodes(&self) -> impl Iterator<Item = (TensorIndex, &GraphTensor)> + '_ {
        self.nodes
            .iter()
            .map(|&index| (index, self.tensor(index)))
            .filter(|(_, tensor)| tensor.is_compute())
    }
}

/// A [`TensorIndex`] as a slice position (lossless: indices are u32 and usize is at least that
/// wide on every target this crate supports).
fn slot(index: TensorIndex) -> usize {
    index as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEWEST: GgmlTable = GgmlTable::V8_0_1;
    use crate::backend::BufferId;
    use crate::error::{Error, ErrorKind};
    use crate::ggml::types::id as ty;
    use crate::ggml::{GluOp, UnaryOp};
    use proptest::prelude::*;
    use proptest::sample::Index;

    const BUFFER: u64 = 7;

    /// A contiguous tensor of `type_id` stored in `BUFFER`.
    fn typed(id: u64, type_id: u32, ne: [u32; 4]) -> RpcTensor {
        let mut tensor = RpcTensor::contiguous(id, type_id, ne).expect("valid type and shape");
        tensor.buffer = BUFFER;
        tensor.data = 0x1000;
        tensor
    }

    /// A contiguous f32 tensor stored in `BUFFER`.
    fn leaf(id: u64, ne: [u32; 4]) -> RpcTensor {
        typed(id, ty::F32, ne)
    }

    /// A computed f32 node with the given sources.
    fn node(id: u64, op: Op, srcs: &[u64], ne: [u32; 4]) -> RpcTensor {
        let mut tensor = leaf(id, ne);
        tensor.op = op.0;
        tensor.src[..srcs.len()].copy_from_slice(srcs);
        tensor.flags = flags::COMPUTE;
        tensor
    }

    /// A VIEW of `source` as ggml builds it (`src[0]` and `view_src` both name the source).
    fn view(id: u64, source: &RpcTensor, ne: [u32; 4], offset: u64) -> RpcTensor {
        let mut tensor = node(id, Op::VIEW, &[source.id], ne);
        tensor.view_src = source.id;
        tensor.view_offs = offset;
        tensor.buffer = source.buffer;
        tensor.data = source.data.wrapping_add(offset);
        tensor
    }

    fn request(nodes: &[u64], tensors: Vec<RpcTensor>) -> GraphComputeRequest {
        GraphComputeRequest {
            device: 1,
            uid: 42,
            node_ids: nodes.to_vec(),
            tensors,
        }
    }

    /// The dispatcher's contract, against a buffer table that knows only `BUFFER`.
    fn resolver(record: &RpcTensor, _byte_size: u64) -> Result<Option<TensorLocation>> {
        match (record.buffer, record.data) {
            (0, 0) => Ok(None),
            (0, _) => Err(Error::MissingBuffer),
            (BUFFER, data) => Ok(Some(TensorLocation {
                buffer: BufferId(BUFFER),
                offset: data,
            })),
            (handle, _) => Err(Error::UnknownBuffer { handle }),
        }
    }

    fn decode(request: &GraphComputeRequest) -> Result<Graph> {
        decode_in(NEWEST, request)
    }

    fn decode_in(table: GgmlTable, request: &GraphComputeRequest) -> Result<Graph> {
        Graph::decode(request, &GraphLimits::default(), table, &mut resolver)
    }

    /// Asserts an `InvalidGraph` error whose message contains `needle`.
    #[track_caller]
    fn assert_invalid(result: Result<Graph>, needle: &str) {
        match result {
            Err(Error::InvalidGraph(error)) => {
                let message = error.to_string();
                assert!(message.contains(needle), "{message:?} lacks {needle:?}")
            }
            other => panic!("expected InvalidGraph({needle:?}), got {other:?}"),
        }
    }

    #[track_caller]
    fn assert_refused(result: Result<Graph>, op: u32) {
        match result {
            Err(
                Error::OpRefused { op: refused, .. } | Error::OpOutsideTable { op: refused, .. },
            ) => {
                assert_eq!(refused, op)
            }
            other => panic!("expected OpRefused for op {op}, got {other:?}"),
        }
    }

    /// A one-node graph made of `record` alone.
    fn single(record: RpcTensor) -> GraphComputeRequest {
        request(&[record.id], vec![record])
    }

    fn index_of(graph: &Graph, id: u64) -> TensorIndex {
        let position = graph
            .tensors
            .iter()
            .position(|t| t.id() == id)
            .expect("id present");
        TensorIndex::try_from(position).expect("small")
    }

    #[test]
    fn graph_decodes_small_valid_graph() {
        let mut weight = typed(0x10, ty::Q8_0, [64, 16, 1, 1]);
        weight.use_count = 1;
        weight.flags = flags::PARAM;
        let mut input = leaf(0x20, [64, 8, 1, 1]);
        input.flags = flags::INPUT;
        input.data = 0x8000;
        // rows 2..6 of the input
        let mut rows = view(0x30, &input, [64, 4, 1, 1], 2 * 64 * 4);
        rows.use_count = 1;
        let mut matmul = node(0x40, Op::MUL_MAT, &[weight.id, rows.id], [16, 4, 1, 1]);
        matmul.use_count = 1;
        let mut silu = node(0x50, Op::UNARY, &[matmul.id], [16, 4, 1, 1]);
        silu.op_params[0] = UnaryOp::SILU.0;
        silu.flags |= flags::OUTPUT;
        // a node the backend skips: not computed, so it needs no storage
        let mut reshape = node(0x60, Op::RESHAPE, &[silu.id], [64, 1, 1, 1]);
        reshape.flags = 0;
        reshape.buffer = 0;
        reshape.data = 0;
        let nodes = [rows.id, matmul.id, silu.id, reshape.id];
        // deliberately not in post-order: the decoder must not rely on list order
        let tensors = vec![
            matmul.clone(),
            weight.clone(),
            silu.clone(),
            rows.clone(),
            reshape.clone(),
            input.clone(),
        ];
        let graph = decode(&request(&nodes, tensors.clone())).expect("valid graph");

        assert_eq!((graph.device, graph.uid), (1, 42));
        assert_eq!(graph.tensors.len(), 6);
        for (decoded, sent) in graph.tensors.iter().zip(&tensors) {
            assert_eq!(
                &decoded.record, sent,
                "records are kept verbatim, use counts included"
            );
        }
        let ids: Vec<u64> = graph.node_tensors().map(GraphTensor::id).collect();
        assert_eq!(ids, nodes);
        let computed: Vec<u64> = graph.compute_nodes().map(|(_, t)| t.id()).collect();
        assert_eq!(computed, [rows.id, matmul.id, silu.id]);
        for (index, tensor) in graph.compute_nodes() {
            assert_eq!(graph.tensor(index), tensor);
        }

        let mm = graph.tensor(index_of(&graph, matmul.id));
        assert_eq!(mm.src[0], Some(index_of(&graph, weight.id)));
        assert_eq!(mm.src[1], Some(index_of(&graph, rows.id)));
        assert!(mm.src[2..].iter().all(Option::is_none));
        assert_eq!(mm.sources().count(), 2);
        assert_eq!(mm.op(), Op::MUL_MAT);
        assert_eq!(mm.byte_size, 16 * 4 * 4);
        assert_eq!(mm.record.use_count, 1);
        let v = graph.tensor(index_of(&graph, rows.id));
        assert_eq!(v.view_src, Some(index_of(&graph, input.id)));
        assert_eq!(v.byte_size, 64 * 4 * 4);
        assert_eq!(
            v.location,
            Some(TensorLocation {
                buffer: BufferId(BUFFER),
                offset: 0x8000 + 2 * 64 * 4
            })
        );
        let w = graph.tensor(index_of(&graph, weight.id));
        assert_eq!(w.byte_size, 16 * 2 * 34);
        assert_eq!(w.record.use_count, 1);
        assert_eq!(graph.tensor(index_of(&graph, reshape.id)).location, None);
    }

    #[test]
    fn graph_resolver_runs_once_per_tensor_in_list_order_and_its_errors_propagate() {
        let a = leaf(1, [4, 1, 1, 1]);
        let b = node(2, Op::SQR, &[1], [4, 1, 1, 1]);
        let req = request(&[2], vec![b.clone(), a.clone()]);
        let mut seen = Vec::new();
        let graph = Graph::decode(
            &req,
            &GraphLimits::default(),
            NEWEST,
            &mut |record, size| {
                seen.push((record.id, size));
                resolver(record, size)
            },
        )
        .expect("valid");
        assert_eq!(seen, [(2, 16), (1, 16)]);
        assert!(graph.tensors.iter().all(|t| t.location.is_some()));

        let failing = Graph::decode(&req, &GraphLimits::default(), NEWEST, &mut |_, _| {
            Err(Error::OutOfBounds("tensor outside its buffer"))
        });
        assert_eq!(
            failing,
            Err(Error::OutOfBounds("tensor outside its buffer"))
        );

        // buffer 0 with data != 0: the dispatcher's resolver refuses it (reference: "invalid data ptr")
        let mut stray = a;
        stray.buffer = 0;
        assert_eq!(
            decode(&request(&[2], vec![stray, b])),
            Err(Error::MissingBuffer)
        );
    }

    #[test]
    fn graph_rejects_empty_node_list() {
        assert_invalid(decode(&request(&[], vec![leaf(1, [1, 1, 1, 1])])), "empty");
    }

    #[test]
    fn graph_rejects_counts_over_limits() {
        let a = leaf(1, [1, 1, 1, 1]);
        let b = node(2, Op::SQR, &[1], [1, 1, 1, 1]);
        let req = request(&[1, 2], vec![a, b]);
        let nodes = GraphLimits {
            max_nodes: 1,
            ..GraphLimits::default()
        };
        assert_invalid(Graph::decode(&req, &nodes, NEWEST, &mut resolver), "limit");
        let tensors = GraphLimits {
            max_tensors: 1,
            ..GraphLimits::default()
        };
        assert_invalid(
            Graph::decode(&req, &tensors, NEWEST, &mut resolver),
            "limit",
        );
        let exact = GraphLimits {
            max_nodes: 2,
            max_tensors: 2,
        };
        assert!(Graph::decode(&req, &exact, NEWEST, &mut resolver).is_ok());
    }

    #[test]
    fn graph_rejects_zero_tensor_id() {
        let zero = node(0, Op::SQR, &[], [1, 1, 1, 1]);
        assert_invalid(
            decode(&request(&[1], vec![leaf(1, [1, 1, 1, 1]), zero])),
            "id 0",
        );
    }

    #[test]
    fn graph_rejects_duplicate_tensor_id() {
        let a = leaf(1, [1, 1, 1, 1]);
        let b = node(2, Op::SQR, &[1], [1, 1, 1, 1]);
        assert_invalid(
            decode(&request(&[2], vec![a.clone(), b, a])),
            "appears twice",
        );
    }

    #[test]
    fn graph_rejects_zero_node_id() {
        let a = node(1, Op::SQR, &[], [1, 1, 1, 1]);
        assert_invalid(decode(&request(&[1, 0], vec![a])), "node #1 has id 0");
    }

    #[test]
    fn graph_rejects_unknown_node_id() {
        let a = node(1, Op::SQR, &[], [1, 1, 1, 1]);
        assert_invalid(decode(&request(&[1, 9], vec![a])), "not among the tensors");
    }

    #[test]
    fn graph_rejects_duplicate_node_id() {
        let a = node(1, Op::SQR, &[], [1, 1, 1, 1]);
        assert_invalid(decode(&request(&[1, 1], vec![a])), "listed twice");
    }

    #[test]
    fn graph_rejects_dangling_links() {
        let a = leaf(1, [4, 1, 1, 1]);
        let mut b = node(2, Op::ADD, &[1, 3], [4, 1, 1, 1]);
        assert_invalid(
            decode(&request(&[2], vec![a.clone(), b.clone()])),
            "src[1] = 0x3",
        );
        b.src[1] = 0;
        b.src[9] = 0xdead;
        assert_invalid(
            decode(&request(&[2], vec![a.clone(), b])),
            "src[9] = 0xdead",
        );
        let mut v = view(2, &a, [4, 1, 1, 1], 0);
        v.view_src = 5;
        assert_invalid(decode(&request(&[2], vec![a, v])), "view_src = 0x5");
    }

    #[test]
    fn graph_accepts_a_source_naming_its_own_tensor_as_ggml_cast_builds_it() {
        // ggml_cast: a CPY whose src[1] is its own result (llama.cpp's test-backend-ops
        // TOPK_QSA sends one; the reference accepts it)
        let mask = leaf(1, [4, 2, 1, 1]);
        let cast = node(2, Op::CPY, &[1, 2], [4, 2, 1, 1]);
        let add = node(3, Op::ADD, &[2, 2], [4, 2, 1, 1]);
        let graph = decode(&request(&[2, 3], vec![mask, cast, add])).expect("accepted");
        let cast_index = graph.nodes[0];
        let cast = graph.tensor(cast_index);
        assert_eq!(cast.src[0], Some(0));
        assert_eq!(
            cast.src[1],
            Some(cast_index),
            "the self link is kept for backends"
        );
        assert_eq!(graph.tensor(graph.nodes[1]).src[0], Some(cast_index));
        // a node reading itself is no later node; reading a later node still is refused
        let early = node(4, Op::SQR, &[5], [4, 1, 1, 1]);
        let late = node(5, Op::CPY, &[1, 5], [4, 1, 1, 1]);
        let mask = leaf(1, [4, 1, 1, 1]);
        assert_invalid(decode(&request(&[4, 5], vec![mask, early, late])), "later");
    }

    #[test]
    fn graph_rejects_cycles() {
        // self loop through view_src
        let mut own_view = leaf(1, [4, 1, 1, 1]);
        own_view.view_src = 1;
        assert_invalid(decode(&single(own_view)), "cycle");
        // two-tensor cycle through src, plus a tensor hanging off it
        let a = node(1, Op::SQR, &[2], [4, 1, 1, 1]);
        let b = node(2, Op::SQR, &[1], [4, 1, 1, 1]);
        let c = node(3, Op::SQR, &[2], [4, 1, 1, 1]);
        assert_invalid(decode(&request(&[3], vec![c, a, b])), "cycle");
        // a cycle mixing src and view_src
        let base = leaf(1, [4, 1, 1, 1]);
        let mut v = view(2, &base, [4, 1, 1, 1], 0);
        let mut w = node(3, Op::SQR, &[2], [4, 1, 1, 1]);
        v.view_src = 3;
        v.src[0] = 0;
        w.flags = flags::COMPUTE;
        assert_invalid(decode(&request(&[3], vec![base, v, w])), "cycle");
    }

    #[test]
    fn graph_rejects_bad_records() {
        let mut bad_type = node(1, Op::SQR, &[], [4, 1, 1, 1]);
        bad_type.type_id = 4;
        assert_eq!(
            decode(&single(bad_type)),
            Err(Error::InvalidType { type_id: 4 })
        );
        let mut out_of_table = node(1, Op::SQR, &[], [4, 1, 1, 1]);
        out_of_table.type_id = 44;
        assert_eq!(
            decode(&single(out_of_table.clone())),
            Err(Error::InvalidType { type_id: 44 })
        );
        // f8_e4m3 (43) is 8.0.1's: past the table a 7.0.0/8.0.0 server serves
        out_of_table.type_id = 43;
        assert!(decode(&single(out_of_table.clone())).is_ok());
        assert_eq!(
            decode_in(GgmlTable::V8_0_0, &single(out_of_table)),
            Err(Error::InvalidType { type_id: 43 })
        );
        let mut misaligned = typed(1, ty::Q8_0, [32, 1, 1, 1]);
        misaligned.ne[0] = 48;
        assert_eq!(
            decode(&single(misaligned)),
            Err(Error::BlockMisaligned {
                ne0: 48,
                block_size: 32
            })
        );
        let mut huge = node(1, Op::SQR, &[], [4, 1, 1, 1]);
        huge.ne = [u32::MAX; 4];
        assert_eq!(
            decode(&single(huge)).unwrap_err().kind(),
            ErrorKind::SizeOverflow
        );
        // element count fits i64, but (ne - 1) * nb summed over the dimensions overflows u64
        let mut wide = node(1, Op::SQR, &[], [4, 1, 1, 1]);
        wide.ne = [u32::MAX, 1 << 30, 1, 1];
        wide.nb = [u32::MAX; 4];
        assert_eq!(wide.validate_shape(NEWEST), Ok(()));
        assert_eq!(decode(&single(wide)), Err(Error::SizeOverflow("byte size")));
        // a bad record that no node reaches is still rejected
        let mut unused = leaf(2, [4, 1, 1, 1]);
        unused.type_id = 1000;
        let ok = node(1, Op::SQR, &[], [4, 1, 1, 1]);
        assert_eq!(
            decode(&request(&[1], vec![ok, unused])),
            Err(Error::InvalidType { type_id: 1000 })
        );
    }

    #[test]
    fn graph_rejects_unknown_and_custom_ops() {
        for op in [crate::ggml::OP_COUNT, 1000, u32::MAX] {
            let mut t = node(1, Op::SQR, &[], [4, 1, 1, 1]);
            t.op = op;
            assert_refused(decode(&single(t)), op);
        }
        for op in [
            Op::MAP_CUSTOM1,
            Op::MAP_CUSTOM2,
            Op::MAP_CUSTOM3,
            Op::CUSTOM,
        ] {
            let t = node(1, op, &[], [4, 1, 1, 1]);
            assert_refused(decode(&single(t)), op.0);
            // also when it is only a source, never computed here
            let mut custom_leaf = leaf(2, [4, 1, 1, 1]);
            custom_leaf.op = op.0;
            let user = node(1, Op::SQR, &[2], [4, 1, 1, 1]);
            assert_refused(decode(&request(&[1], vec![custom_leaf, user])), op.0);
        }
        for op in 0..crate::ggml::OP_COUNT {
            let t = node(1, Op(op), &[], [4, 1, 1, 1]);
            assert_eq!(decode(&single(t)).is_ok(), !Op(op).is_custom(), "op {op}");
        }
    }

    #[test]
    fn older_clients_ops_are_renumbered_and_newer_ones_named() {
        let old = GgmlTable::V8_0_0;
        // 7.0.0/8.0.0 number UNARY 91 and GLU 100; the decoded graph holds the newest numbering
        for (wire, op) in [(91, Op::UNARY), (100, Op::GLU), (90, Op::DSV4_HC_POST)] {
            let mut t = node(1, Op::SQR, &[], [4, 1, 1, 1]);
            t.op = wire;
            let graph = decode_in(old, &single(t)).unwrap();
            assert_eq!(graph.tensors[0].op(), op, "wire op {wire}");
        }
        // an 8.0.1 client's GLU (101) and UNARY (92) sent to an 8.0.0 server
        for (wire, name) in [(101, "GLU"), (92, "UNARY")] {
            let mut t = node(1, Op::SQR, &[], [4, 1, 1, 1]);
            t.op = wire;
            let error = decode_in(old, &single(t)).unwrap_err();
            assert_eq!(
                error,
                Error::OpOutsideTable {
                    op: wire,
                    table: old,
                    likely_client: Some(GgmlTable::V8_0_1)
                }
            );
            let message = error.to_string();
            assert!(
                message.contains("is the client 8.0.1")
                    && message.contains(&format!("op {wire} is {name}")),
                "{message}"
            );
        }
        let mut newest_past = node(1, Op::SQR, &[], [4, 1, 1, 1]);
        newest_past.op = 102;
        let message = decode(&single(newest_past)).unwrap_err().to_string();
        assert_eq!(
            message,
            "op 102 is past protocol 8.0.1's op table (102 ops)"
        );
    }

    #[test]
    fn graph_checks_unary_and_glu_sub_ops() {
        for (op, count) in [(Op::UNARY, 22), (Op::GLU, 7)] {
            for sub in [-1, i32::MIN, count, count + 1, i32::MAX] {
                let mut t = node(1, op, &[], [4, 1, 1, 1]);
                t.op_params[0] = sub;
                assert_refused(decode(&single(t)), op.0);
            }
            for sub in 0..count {
                let mut t = node(1, op, &[], [4, 1, 1, 1]);
                t.op_params[0] = sub;
                assert!(decode(&single(t)).is_ok(), "{op:?} sub-op {sub}");
            }
        }
        assert!(GluOp(6).is_valid() && !GluOp(7).is_valid());
        assert!(UnaryOp(21).is_valid() && !UnaryOp(22).is_valid());
    }

    #[test]
    fn graph_checks_view_bounds() {
        let base = leaf(1, [8, 2, 1, 1]); // 64 bytes
        let user = |v: &RpcTensor| node(3, Op::SQR, &[v.id], v.ne);
        let ok = view(2, &base, [8, 1, 1, 1], 32); // bytes 32..64
        assert!(decode(&request(&[2, 3], vec![base.clone(), ok.clone(), user(&ok)])).is_ok());
        let past = view(2, &base, [8, 1, 1, 1], 36);
        assert_invalid(
            decode(&request(
                &[2, 3],
                vec![base.clone(), past.clone(), user(&past)],
            )),
            "exceeds its view_src",
        );
        let mut wrap = view(2, &base, [8, 1, 1, 1], 0);
        wrap.view_offs = u64::MAX - 8;
        assert_invalid(
            decode(&request(&[2], vec![base.clone(), wrap])),
            "exceeds its view_src",
        );
        // larger than the source, even at offset 0
        let big = view(2, &base, [8, 3, 1, 1], 0);
        assert_invalid(
            decode(&request(&[2], vec![base.clone(), big])),
            "exceeds its view_src",
        );
        // strides count: a transposed view of the same bytes fits, an over-strided one does not
        let mut transposed = view(2, &base, [2, 8, 1, 1], 0);
        transposed.nb = [32, 4, 64, 64];
        assert!(decode(&request(&[2], vec![base.clone(), transposed])).is_ok());
        let mut strided = view(2, &base, [8, 2, 1, 1], 0);
        strided.nb[1] = 40;
        assert_invalid(
            decode(&request(&[2], vec![base.clone(), strided])),
            "exceeds",
        );
        // an empty view is exempt, as in ggml
        let mut empty = view(2, &base, [8, 0, 1, 1], u64::MAX);
        empty.data = base.data;
        assert!(decode(&request(&[2], vec![base, empty])).is_ok());
    }

    #[test]
    fn graph_rejects_nodes_that_use_later_nodes() {
        let a = node(1, Op::SQR, &[], [4, 1, 1, 1]);
        let b = node(2, Op::SQR, &[1], [4, 1, 1, 1]);
        assert!(decode(&request(&[1, 2], vec![a.clone(), b.clone()])).is_ok());
        assert_invalid(
            decode(&request(&[2, 1], vec![a.clone(), b.clone()])),
            "produces later",
        );
        // through a view that is not a node: the view's bytes are the later node's
        let v = {
            let mut v = view(3, &a, [4, 1, 1, 1], 0);
            v.op = Op::NONE.0;
            v.src[0] = 0;
            v.flags = 0;
            v
        };
        let reader = node(4, Op::SQR, &[3], [4, 1, 1, 1]);
        let tensors = vec![a.clone(), v.clone(), reader.clone()];
        assert!(decode(&request(&[1, 4], tensors.clone())).is_ok());
        assert_invalid(decode(&request(&[4, 1], tensors)), "produces later");
        // an in-place node writing into a node listed after it
        let mut inplace = view(5, &a, [4, 1, 1, 1], 0);
        inplace.op = Op::SCALE.0;
        inplace.src[0] = 0;
        let tensors = vec![a.clone(), inplace];
        assert!(decode(&request(&[1, 5], tensors.clone())).is_ok());
        assert_invalid(decode(&request(&[5, 1], tensors)), "produces later");
    }

    #[test]
    fn graph_requires_storage_for_computed_tensors() {
        let unstored = |t: &RpcTensor| RpcTensor {
            buffer: 0,
            data: 0,
            ..t.clone()
        };
        let a = leaf(1, [4, 1, 1, 1]);
        let b = node(2, Op::SQR, &[1], [4, 1, 1, 1]);
        // a source in memory the server does not own
        assert_invalid(
            decode(&request(&[2], vec![unstored(&a), b.clone()])),
            "no storage",
        );
        // the node itself
        assert_invalid(
            decode(&request(&[2], vec![a.clone(), unstored(&b)])),
            "no storage",
        );
        // a view without storage of a stored tensor
        let mut v = unstored(&view(3, &a, [4, 1, 1, 1], 0));
        v.flags = 0;
        let c = node(4, Op::SQR, &[3], [4, 1, 1, 1]);
        assert_invalid(decode(&request(&[4], vec![a.clone(), v, c])), "no storage");
        // a node without COMPUTE is skipped, so neither it nor its sources need storage
        let skipped = RpcTensor {
            flags: 0,
            ..unstored(&b)
        };
        assert!(decode(&request(&[2], vec![unstored(&a), skipped])).is_ok());
        // empty tensors occupy no bytes
        let empty = unstored(&leaf(1, [0, 1, 1, 1]));
        let d = node(2, Op::ADD, &[1], [4, 1, 1, 1]);
        assert!(decode(&request(&[2], vec![empty, d])).is_ok());
        // a leaf nobody computes with may live elsewhere
        let unused = unstored(&leaf(9, [4, 1, 1, 1]));
        assert!(decode(&request(&[2], vec![a, b, unused])).is_ok());
    }

    const CHAIN: u64 = 100_000;

    #[test]
    fn graph_decodes_100k_src_chain() {
        // users listed before their sources, the worst order for a naive decoder
        let mut tensors: Vec<RpcTensor> = (1..=CHAIN)
            .map(|id| {
                let srcs: &[u64] = if id == 1 { &[] } else { &[id - 1] };
                node(id, Op::SQR, srcs, [4, 1, 1, 1])
            })
            .collect();
        tensors.reverse();
        let nodes: Vec<u64> = (1..=CHAIN).collect();
        let graph = decode(&request(&nodes, tensors)).expect("a long chain is valid");
        assert_eq!(graph.nodes.len(), CHAIN as usize);
        let last = graph.tensor(graph.nodes[graph.nodes.len() - 1]);
        assert_eq!(last.id(), CHAIN);
        assert_eq!(graph.tensor(last.src[0].expect("linked")).id(), CHAIN - 1);
    }

    #[test]
    fn graph_decodes_100k_view_chain() {
        let base = leaf(1, [4, 1, 1, 1]);
        let mut tensors = vec![base.clone()];
        for id in 2..=CHAIN {
            let mut v = leaf(id, [4, 1, 1, 1]);
            v.view_src = id - 1;
            tensors.push(v);
        }
        tensors.reverse();
        tensors.push(node(CHAIN + 1, Op::SQR, &[CHAIN], [4, 1, 1, 1]));
        let graph = decode(&request(&[CHAIN + 1], tensors)).expect("a long view chain is valid");
        assert_eq!(graph.tensors.len(), CHAIN as usize + 1);
        assert_eq!(graph.tensor(0).view_src, Some(1));
    }

    #[test]
    fn graph_rejects_100k_cycle() {
        let tensors: Vec<RpcTensor> = (1..=CHAIN)
            .map(|id| {
                node(
                    id,
                    Op::SQR,
                    &[if id == 1 { CHAIN } else { id - 1 }],
                    [4, 1, 1, 1],
                )
            })
            .collect();
        assert_invalid(decode(&request(&[CHAIN], tensors)), "cycle");
    }

    /// One generated tensor: sources and view source as picks among earlier tensors, whether it
    /// is a node, whether it is computed.
    type Spec = (Vec<Index>, Option<Index>, bool, bool);

    /// A random DAG in generation (topological) order, listed in `permutation` order.
    fn random_dag(
        specs: &[Spec],
        salt: u64,
        permutation: &[usize],
    ) -> (GraphComputeRequest, Vec<Vec<usize>>) {
        let id = |i: usize| (salt >> 1) + i as u64 + 1; // unique, non-zero
        let mut records = Vec::with_capacity(specs.len());
        let mut links = Vec::with_capacity(specs.len());
        let mut nodes = Vec::new();
        for (i, (srcs, view_source, is_node, compute)) in specs.iter().enumerate() {
            let mut record = leaf(id(i), [4, 2, 1, 1]);
            record.data = 0x1000 + 0x100 * i as u64;
            let mut targets = Vec::new();
            if i > 0 {
                for (slot, pick) in srcs.iter().enumerate() {
                    let target = pick.index(i);
                    record.src[slot] = id(target);
                    targets.push(target);
                }
                if let Some(pick) = view_source {
                    let target = pick.index(i);
                    record.view_src = id(target);
                    record.op = Op::VIEW.0;
                    targets.push(target);
                }
            }
            if record.op == 0 && !targets.is_empty() {
                record.op = Op::ADD.0;
            }
            if *compute {
                record.flags = flags::COMPUTE;
            }
            if *is_node || i + 1 == specs.len() {
                nodes.push(id(i));
            }
            records.push(record);
            links.push(targets);
        }
        let tensors = permutation.iter().map(|&i| records[i].clone()).collect();
        (request(&nodes, tensors), links)
    }

    fn dag_strategy() -> impl Strategy<Value = (Vec<Spec>, u64, Vec<usize>)> {
        let spec = (
            proptest::collection::vec(any::<Index>(), 0..4),
            proptest::option::weighted(0.2, any::<Index>()),
            any::<bool>(),
            any::<bool>(),
        );
        (proptest::collection::vec(spec, 1..40), any::<u64>()).prop_flat_map(|(specs, salt)| {
            let permutation = Just((0..specs.len()).collect::<Vec<_>>()).prop_shuffle();
            (Just(specs), Just(salt), permutation)
        })
    }

    proptest! {
        #[test]
        fn graph_random_dags_decode((specs, salt, permutation) in dag_strategy()) {
            let (req, links) = random_dag(&specs, salt, &permutation);
            let graph = decode(&req).expect("a DAG in topological node order is valid");
            prop_assert_eq!(graph.tensors.len(), specs.len());
            for (decoded, sent) in graph.tensors.iter().zip(&req.tensors) {
                prop_assert_eq!(&decoded.record, sent);
                for (slot, source) in decoded.src.iter().enumerate() {
                    let expected = (sent.src[slot] != 0).then_some(sent.src[slot]);
                    prop_assert_eq!(source.map(|s| graph.tensor(s).id()), expected);
                }
                prop_assert_eq!(
                    decoded.view_src.map(|s| graph.tensor(s).id()),
                    (sent.view_src != 0).then_some(sent.view_src)
                );
                prop_assert!(decoded.location.is_some());
            }
            let ids: Vec<u64> = graph.node_tensors().map(GraphTensor::id).collect();
            prop_assert_eq!(ids, req.node_ids.clone());
            prop_assert_eq!(links.len(), specs.len());
        }

        #[test]
        fn graph_random_cycles_fail(
            (specs, salt, permutation) in dag_strategy(),
            start in any::<Index>(),
            walk in proptest::collection::vec(any::<Index>(), 0..8),
        ) {
            let (mut req, links) = random_dag(&specs, salt, &permutation);
            // walk from `start` down its links to some `end`, then link `end` back to `start`
            let first = start.index(specs.len());
            let mut end = first;
            for step in &walk {
                if links[end].is_empty() {
                    break;
                }
                end = links[end][step.index(links[end].len())];
            }
            let start_id = (salt >> 1) + first as u64 + 1;
            let end_id = (salt >> 1) + end as u64 + 1;
            let record = req.tensors.iter_mut().find(|t| t.id == end_id).expect("present");
            if end == first {
                // a source naming its own tensor is ggml_cast's CPY, accepted; a view of
                // itself is a cycle
                record.view_src = start_id;
            } else {
                record.src[MAX_SRC - 1] = start_id; // generated tensors use at most 3 slots
            }
            assert_invalid(decode(&req), "cycle");
        }

        #[test]
        fn graph_random_dangling_links_fail(
            (specs, salt, permutation) in dag_strategy(),
            victim in any::<Index>(),
            slot in 0..=MAX_SRC,
        ) {
            let (mut req, _) = random_dag(&specs, salt, &permutation);
            let record = &mut req.tensors[victim.index(specs.len())];
            // ids are at most 2^63 + 40, so u64::MAX names no tensor
            if slot == MAX_SRC {
                record.view_src = u64::MAX;
            } else {
                record.src[slot] = u64::MAX;
            }
            assert_invalid(decode(&req), "not among the tensors");
        }

        #[test]
        fn graph_random_duplicate_ids_fail(
            (specs, salt, permutation) in dag_strategy(),
            copied in any::<Index>(),
            at in any::<Index>(),
        ) {
            let (mut req, _) = random_dag(&specs, salt, &permutation);
            let duplicate = req.tensors[copied.index(specs.len())].clone();
            req.tensors.insert(at.index(specs.len() + 1), duplicate);
            assert_invalid(decode(&req), "appears twice");
        }
    }
}
