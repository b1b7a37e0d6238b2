//! Protocol 8.0.1 vectors (llama.cpp b12032+1): 8.0.0's commands and layouts with ggml's newer
//! op and type numbering (`TOP_K_MASK` inserted at op 91, so `UNARY` … `GLU` moved up by one,
//! and type 43 `f8_e4m3`, PROTOCOL.md §1.4, §12.1, §12.2). Every graph of these vectors uses the
//! 8.0.1 numbering. Cross-version vectors (an 8.0.1 client's ids sent to an 8.0.0 server) are
//! written into the 8.0.0 folders with `"protocol": "8.0.0"`.
//!
//! A child module of `sessions` (it reuses the session builder and its placeholders).

use proto_core::ggml::types::id as ty;
use proto_core::ggml::{flags, GgmlTable, GluOp, Op, UnaryOp};
use proto_core::wire::{
    AllocSizeRequest, GraphComputeRequest, ProtocolVersion, Request, Response, RpcTensor,
};

use super::super::samples::{client_id, stored, RAW_BASE, RAW_BUFFER};
use super::super::{valid_request, valid_response, V8, V801};
use super::{base, buffer, compute, data, get, pattern, set, Session};
use crate::vector::Vector;

/// The 8.0.1 wire id of `op`.
pub(crate) fn wire_op_801(op: Op) -> u32 {
    GgmlTable::V8_0_1
        .op_to_wire(op)
        .expect("an op of the 8.0.1 table")
}

/// Where the tensors of a sample graph live: `(buffer, data)` of a byte offset.
type Place<'a> = &'a dyn Fn(i64) -> (u64, u64);

/// Builds graph records with ids `client_id(base_id + k)` at consecutive 32-byte aligned offsets.
struct Builder<'a> {
    place: Place<'a>,
    next_id: u64,
    next_offset: i64,
    tensors: Vec<RpcTensor>,
    nodes: Vec<u64>,
}

impl<'a> Builder<'a> {
    fn new(place: Place<'a>, first_id: u64) -> Builder<'a> {
        Builder {
            place,
            next_id: first_id,
            next_offset: 1024,
            tensors: Vec::new(),
            nodes: Vec::new(),
        }
    }

    fn record(&mut self, type_id: u32, ne: [u32; 4], name: &str) -> RpcTensor {
        let (buf, dat) = (self.place)(self.next_offset);
        let tensor = stored(client_id(self.next_id), type_id, ne, buf, dat, name);
        self.next_id += 1;
        let bytes = i64::from(tensor.nb[3]) * i64::from(ne[3]);
        self.next_offset += (bytes + 31) / 32 * 32;
        tensor
    }

    /// A leaf (input or parameter) tensor.
    fn leaf(&mut self, type_id: u32, ne: [u32; 4], tensor_flags: i32, name: &str) -> u64 {
        let mut t = self.record(type_id, ne, name);
        t.flags = tensor_flags;
        t.use_count = 1;
        let id = t.id;
        self.tensors.push(t);
        id
    }

    /// A computed node of `op` (8.0.1 numbering) reading `srcs`; `edit` sets op_params or views.
    fn node(
        &mut self,
        type_id: u32,
        ne: [u32; 4],
        op: Op,
        srcs: &[u64],
        name: &str,
        edit: &dyn Fn(&mut RpcTensor),
    ) -> u64 {
        let mut t = self.record(type_id, ne, name);
        t.op = wire_op_801(op);
        t.src[..srcs.len()].copy_from_slice(srcs);
        t.flags = flags::COMPUTE;
        t.use_count = 1;
        edit(&mut t);
        let id = t.id;
        self.nodes.push(id);
        self.tensors.push(t);
        id
    }

    /// `ggml_view_tensor(of)` computed by `op`: the result shares `of`'s storage (the optimizer
    /// steps update their parameter in place).
    fn in_place(&mut self, of: u64, op: Op, srcs: &[u64], name: &str) -> u64 {
        let source = self
            .tensors
            .iter()
            .find(|t| t.id == of)
            .expect("source")
            .clone();
        let mut t = source.clone();
        t.id = client_id(self.next_id);
        self.next_id += 1;
        t.set_name(name);
        t.op = wire_op_801(op);
        t.op_params = [0; 16];
        t.src = [0; 10];
        t.src[..srcs.len()].copy_from_slice(srcs);
        t.view_src = of;
        t.view_offs = 0;
        t.flags = flags::COMPUTE | flags::OUTPUT;
        t.use_count = 0;
        let id = t.id;
        self.nodes.push(id);
        self.tensors.push(t);
        id
    }

    fn output(&mut self) {
        if let Some(last) = self.tensors.last_mut() {
            last.flags |= flags::OUTPUT;
            last.use_count = 0;
        }
    }

    fn finish(mut self, uid: u64) -> GraphComputeRequest {
        self.output();
        GraphComputeRequest {
            device: 0,
            uid,
            node_ids: self.nodes,
            tensors: self.tensors,
        }
    }
}

/// The ops whose wire id differs between the 7.0.0/8.0.0 and the 8.0.1 numbering, with a small
/// graph computing each (8.0.1 ids), as `(slug, op, graph)`.
fn moved_op_graphs(place: Place<'_>, uid: u64) -> Vec<(&'static str, Op, GraphComputeRequest)> {
    let mut out = Vec::new();
    // TOP_K_MASK (§12.2.1): mask [16, 1], top_k [4, 2] i32, score [16, 2]; result f16 [16, 2],
    // no op_params.
    let mut b = Builder::new(place, 200);
    let mask = b.leaf(ty::F16, [16, 1, 1, 1], flags::INPUT, "kq_mask");
    let top_k = b.leaf(ty::I32, [4, 2, 1, 1], flags::INPUT, "top_k");
    let score = b.leaf(ty::F32, [16, 2, 1, 1], flags::INPUT, "score");
    b.node(
        ty::F16,
        [16, 2, 1, 1],
        Op::TOP_K_MASK,
        &[mask, top_k, score],
        "kq_mask_top_k",
        &|_| {},
    );
    out.push(("top_k_mask", Op::TOP_K_MASK, b.finish(uid)));
    // UNARY (SILU).
    let mut b = Builder::new(place, 210);
    let x = b.leaf(ty::F32, [8, 2, 1, 1], flags::INPUT, "x");
    b.node(ty::F32, [8, 2, 1, 1], Op::UNARY, &[x], "silu", &|t| {
        t.op_params[0] = UnaryOp::SILU.0;
    });
    out.push(("unary", Op::UNARY, b.finish(uid)));
    // CROSS_ENTROPY_LOSS: logits, labels -> a scalar.
    let mut b = Builder::new(place, 220);
    let logits = b.leaf(ty::F32, [8, 4, 1, 1], flags::INPUT, "logits");
    let labels = b.leaf(ty::F32, [8, 4, 1, 1], flags::INPUT, "labels");
    b.node(
        ty::F32,
        [1, 1, 1, 1],
        Op::CROSS_ENTROPY_LOSS,
        &[logits, labels],
        "loss",
        &|_| {},
    );
    out.push(("cross_entropy_loss", Op::CROSS_ENTROPY_LOSS, b.finish(uid)));
    // CROSS_ENTROPY_LOSS_BACK: grad of the loss, logits, labels -> grad of the logits.
    let mut b = Builder::new(place, 230);
    let grad = b.leaf(ty::F32, [1, 1, 1, 1], flags::INPUT, "loss (grad)");
    let logits = b.leaf(ty::F32, [8, 4, 1, 1], flags::INPUT, "logits");
    let labels = b.leaf(ty::F32, [8, 4, 1, 1], flags::INPUT, "labels");
    b.node(
        ty::F32,
        [8, 4, 1, 1],
        Op::CROSS_ENTROPY_LOSS_BACK,
        &[grad, logits, labels],
        "logits (grad)",
        &|_| {},
    );
    out.push((
        "cross_entropy_loss_back",
        Op::CROSS_ENTROPY_LOSS_BACK,
        b.finish(uid),
    ));
    // OPT_STEP_ADAMW: param, grad, m, v, adamw params [7]; the result is a view of param.
    let mut b = Builder::new(place, 240);
    let param = b.leaf(ty::F32, [8, 4, 1, 1], flags::PARAM, "weight");
    let grad = b.leaf(ty::F32, [8, 4, 1, 1], flags::INPUT, "weight (grad)");
    let m = b.leaf(ty::F32, [8, 4, 1, 1], flags::INPUT, "weight (m)");
    let v = b.leaf(ty::F32, [8, 4, 1, 1], flags::INPUT, "weight (v)");
    let params = b.leaf(ty::F32, [7, 1, 1, 1], flags::INPUT, "adamw_params");
    b.in_place(
        param,
        Op::OPT_STEP_ADAMW,
        &[param, grad, m, v, params],
        "weight (view)",
    );
    out.push(("opt_step_adamw", Op::OPT_STEP_ADAMW, b.finish(uid)));
    // OPT_STEP_SGD: param, grad, sgd params [2]; the result is a view of param.
    let mut b = Builder::new(place, 250);
    let param = b.leaf(ty::F32, [8, 4, 1, 1], flags::PARAM, "weight");
    let grad = b.leaf(ty::F32, [8, 4, 1, 1], flags::INPUT, "weight (grad)");
    let params = b.leaf(ty::F32, [2, 1, 1, 1], flags::INPUT, "sgd_params");
    b.in_place(
        param,
        Op::OPT_STEP_SGD,
        &[param, grad, params],
        "weight (view)",
    );
    out.push(("opt_step_sgd", Op::OPT_STEP_SGD, b.finish(uid)));
    // GLU (SWIGLU of the two halves of one tensor).
    let mut b = Builder::new(place, 260);
    let x = b.leaf(ty::F32, [16, 2, 1, 1], flags::INPUT, "ffn_up");
    b.node(ty::F32, [8, 2, 1, 1], Op::GLU, &[x], "ffn_swiglu", &|t| {
        t.op_params[0] = GluOp::SWIGLU.0;
    });
    out.push(("glu", Op::GLU, b.finish(uid)));
    out
}

/// A graph with an f8_e4m3 weight (type 43): `y = w · x`, `w` of 32 × 2 f8 elements.
fn f8_graph(place: Place<'_>, uid: u64) -> GraphComputeRequest {
    let mut b = Builder::new(place, 280);
    let w = b.leaf(ty::F8_E4M3, [32, 2, 1, 1], flags::PARAM, "w_f8");
    let x = b.leaf(ty::F32, [32, 1, 1, 1], flags::INPUT, "x");
    b.node(ty::F32, [2, 1, 1, 1], Op::MUL_MAT, &[w, x], "y", &|_| {});
    b.finish(uid)
}

fn raw_place(offset: i64) -> (u64, u64) {
    (RAW_BUFFER, RAW_BASE.wrapping_add_signed(offset))
}

fn session_place(offset: i64) -> (u64, u64) {
    (buffer(0), base(0, offset))
}

fn spec(section: &str) -> String {
    super::super::spec(section)
}

/// Request and response frame vectors of 8.0.1.
fn frames(out: &mut Vec<Vector>) {
    let version = V801;
    for (slug, op, graph) in moved_op_graphs(&raw_place, 0x801) {
        let id = wire_op_801(op);
        let old = GgmlTable::V8_0_0.op_to_wire(op).map_or_else(
            || "not in the 7.0.0/8.0.0 table".to_owned(),
            |o| format!("{o} in 7.0.0/8.0.0"),
        );
        out.push(valid_request(
            format!("v8.0.1/requests/graph_compute_op_{id}_{slug}"),
            version,
            spec("§1.4, §5.17, §12.2"),
            &format!(
                "GRAPH_COMPUTE of a graph whose node computes {}: op id {id} in 8.0.1 ({old})",
                GgmlTable::V8_0_1.op_name(id).unwrap_or("?")
            ),
            &compute(graph),
        ));
    }
    out.push(valid_request(
        "v8.0.1/requests/graph_compute_f8_e4m3".into(),
        version,
        spec("§5.17, §12.1"),
        "GRAPH_COMPUTE of y = w · x with an f8_e4m3 weight (type 43, block 1, 1 byte per element; 8.0.1 only)",
        &compute(f8_graph(&raw_place, 0x802)),
    ));
    let f8 = stored(
        client_id(300),
        ty::F8_E4M3,
        [32, 2, 1, 1],
        RAW_BUFFER,
        RAW_BASE + 0x100,
        "w_f8",
    );
    out.push(valid_request(
        "v8.0.1/requests/set_tensor_f8_e4m3".into(),
        version,
        spec("§5.10, §12.1"),
        "SET_TENSOR of the 64 bytes of an f8_e4m3 tensor of 32 × 2 elements (nb = [1, 32, 64, 64])",
        &set(&f8, 0, &pattern(64, 0x38)),
    ));
    out.push(valid_request(
        "v8.0.1/requests/get_tensor_f8_e4m3".into(),
        version,
        spec("§5.12, §12.1"),
        "GET_TENSOR of the second row (32 bytes) of an f8_e4m3 tensor",
        &get(&f8, 32, 32),
    ));
    let hello = Request::Hello { caps: [0; 24] };
    out.push(valid_response(
        "v8.0.1/responses/hello".into(),
        version,
        spec("§5.1, §1.4, §1.6"),
        "HELLO response of an 8.0.1 server to an 8.0.1 client",
        &hello,
        &Response::Hello {
            version,
            flags: 0,
            caps: [0; 24],
        },
    ));
    out.push(valid_response(
        "v8.0.1/responses/hello_from_8_0_0".into(),
        version,
        spec("§1.6"),
        "HELLO response of an 8.0.0 server to an 8.0.1 client: accepted (the patch is never compared), although the two number ggml's ops differently from 91 on",
        &hello,
        &Response::Hello {
            version: ProtocolVersion::V8_0_0,
            flags: 0,
            caps: [0; 24],
        },
    ));
    out.push(valid_response(
        "v8/responses/hello_from_8_0_1".into(),
        V8,
        spec("§1.6"),
        "HELLO response of an 8.0.1 server to an 8.0.0 client: accepted (the patch is never compared), although the two number ggml's ops differently from 91 on",
        &hello,
        &Response::Hello {
            version: ProtocolVersion::V8_0_1,
            flags: 0,
            caps: [0; 24],
        },
    ));
}

/// Valid and invalid sessions of an 8.0.1 server, and an 8.0.1 client's ids sent to an 8.0.0
/// server.
fn sessions(out: &mut Vec<Vector>) {
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, V801, section, description)
    };
    // Every moved op, computed (validated) by an 8.0.1 server, then recomputed.
    let mut s = new(
        "moved_ops",
        "§1.4, §5.17, §5.18, §12.2",
        "GRAPH_COMPUTE of one graph per op whose id moved in 8.0.1 (TOP_K_MASK 91, UNARY 92, CROSS_ENTROPY_LOSS 97, CROSS_ENTROPY_LOSS_BACK 98, OPT_STEP_ADAMW 99, OPT_STEP_SGD 100, GLU 101), each stored under its own uid, then GRAPH_RECOMPUTE of the first",
    )
    .with_buffer(4096);
    for (i, (_, _, graph)) in moved_op_graphs(&session_place, 0).into_iter().enumerate() {
        let mut graph = graph;
        graph.uid = 0x801 + i as u64;
        s.cast(&compute(graph));
    }
    s.cast(&Request::GraphRecompute {
        device: 0,
        uid: 0x801,
    });
    out.push(s.done());
    // An f8_e4m3 tensor: SET_TENSOR / GET_TENSOR round trip, GET_ALLOC_SIZE, GRAPH_COMPUTE.
    let mut s = new(
        "f8_e4m3_tensor",
        "§5.10, §5.12, §5.14, §5.17, §12.1",
        "An f8_e4m3 tensor (type 43) of 32 × 2 elements: SET_TENSOR of its 64 bytes, GET_TENSOR of all and of the second row, GET_ALLOC_SIZE (64), then GRAPH_COMPUTE of y = w · x with it as the weight",
    )
    .with_buffer(4096);
    let graph = f8_graph(&session_place, 0x8f8);
    let w = graph.tensors[0].clone();
    let content = pattern(64, 0x38);
    s.cast(&set(&w, 0, &content));
    s.call(&get(&w, 0, 64), Some(&data(&content)));
    s.call(&get(&w, 32, 32), Some(&data(&content[32..])));
    s.call(
        &Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: w.clone(),
            srcs: Default::default(),
        })),
        Some(&Response::AllocSize(64)),
    );
    s.cast(&compute(graph));
    out.push(s.done());

    // Invalid 8.0.1 graphs: the small UNARY graph with its node's op replaced.
    let unary_graph = || {
        moved_op_graphs(&session_place, 0x77)
            .into_iter()
            .find(|(slug, _, _)| *slug == "unary")
            .expect("unary graph")
            .2
    };
    let graph_fail = |version: ProtocolVersion,
                      name: &str,
                      section: &str,
                      description: &str,
                      graph: GraphComputeRequest,
                      rule: &str| {
        Session::new(name, version, section, description)
            .with_buffer(4096)
            .fail(&compute(graph), rule)
    };
    let with_op = |op: u32, param: i32| {
        let mut g = unary_graph();
        g.tensors[1].op = op;
        g.tensors[1].op_params[0] = param;
        g
    };
    let refused: Vec<(&str, &str, u32, i32)> = vec![
        (
            "graph_op_93_map_custom1",
            "op 93 (MAP_CUSTOM1 in 8.0.1: op_params carry a client function pointer)",
            93,
            0,
        ),
        (
            "graph_op_94_map_custom2",
            "op 94 (MAP_CUSTOM2 in 8.0.1)",
            94,
            0,
        ),
        (
            "graph_op_95_map_custom3",
            "op 95 (MAP_CUSTOM3 in 8.0.1)",
            95,
            0,
        ),
        ("graph_op_96_custom", "op 96 (CUSTOM in 8.0.1)", 96, 0),
        (
            "graph_op_102",
            "op 102 (GGML_OP_COUNT of 8.0.1, outside the table)",
            102,
            0,
        ),
        ("graph_op_max", "op 2^32 - 1", u32::MAX, 0),
        (
            "graph_unary_op_22",
            "a UNARY node (op 92 in 8.0.1) with sub-op 22 (GGML_UNARY_OP_COUNT)",
            92,
            22,
        ),
        (
            "graph_glu_op_7",
            "a GLU node (op 101 in 8.0.1) with sub-op 7 (GGML_GLU_OP_COUNT)",
            101,
            7,
        ),
    ];
    for (name, what, op, param) in refused {
        out.push(graph_fail(
            V801,
            name,
            "G6, G7, §12.2-§12.4",
            &format!("GRAPH_COMPUTE to an 8.0.1 server with {what}"),
            with_op(op, param),
            "graph_op",
        ));
    }
    let mut bad_type = unary_graph();
    bad_type.tensors[0].type_id = 44;
    out.push(graph_fail(
        V801,
        "graph_type_44",
        "§3.3 step 1, §12.1",
        "GRAPH_COMPUTE to an 8.0.1 server with a tensor of type 44 (GGML_TYPE_COUNT of 8.0.1)",
        bad_type,
        "type_id",
    ));
    let typed = |type_id: u32| {
        let mut tensor = stored(
            client_id(1),
            ty::F8_E4M3,
            [4, 1, 1, 1],
            buffer(0),
            base(0, 0),
            "t1",
        );
        tensor.type_id = type_id;
        tensor
    };
    out.push(
        new(
            "set_tensor_type_44",
            "§3.3 step 1, §12.1",
            "SET_TENSOR to an 8.0.1 server into a tensor of type 44 (GGML_TYPE_COUNT of 8.0.1)",
        )
        .with_buffer(4096)
        .fail(&set(&typed(44), 0, &[0; 4]), "type_id"),
    );

    // An 8.0.1 client's ids sent to an 8.0.0 server (written with protocol 8.0.0).
    let cross: Vec<(&str, &str, u32, i32)> = vec![
        (
            "graph_op_92_unary_from_8_0_1",
            "op 92 with sub-op SILU: an 8.0.1 client's UNARY, MAP_CUSTOM1 (a custom op) in 8.0.0",
            92,
            UnaryOp::SILU.0,
        ),
        (
            "graph_op_101_glu_from_8_0_1",
            "op 101 with sub-op SWIGLU: an 8.0.1 client's GLU, past the 8.0.0 table",
            101,
            GluOp::SWIGLU.0,
        ),
    ];
    for (name, what, op, param) in cross {
        out.push(graph_fail(
            V8,
            name,
            "§1.6, G6, G7, §12.2",
            &format!("GRAPH_COMPUTE to an 8.0.0 server with {what}"),
            with_op(op, param),
            "graph_op",
        ));
    }
    // The 8.0.1 f8 graph keeps its op ids below 91 (MUL_MAT), so only its type differs.
    out.push(graph_fail(
        V8,
        "graph_f8_e4m3_from_8_0_1",
        "§1.6, §3.3 step 1, §12.1",
        "GRAPH_COMPUTE to an 8.0.0 server with an f8_e4m3 weight (type 43, which 8.0.0 does not have)",
        f8_graph(&session_place, 0x8f8),
        "type_id",
    ));
    out.push(
        Session::new(
            "get_tensor_f8_e4m3_from_8_0_1",
            V8,
            "§1.6, §3.3 step 1, §12.1",
            "GET_TENSOR from an 8.0.0 server of an f8_e4m3 tensor (type 43, which 8.0.0 does not have)",
        )
        .with_buffer(4096)
        .fail(&get(&typed(ty::F8_E4M3), 0, 4), "type_id"),
    );
}

pub(super) fn generate(out: &mut Vec<Vector>) {
    frames(out);
    sessions(out);
}
