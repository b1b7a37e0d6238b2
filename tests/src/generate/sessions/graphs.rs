//! Sessions that break the graph rules: structure, ops, types, sizes.

use super::*;

pub(super) fn graph_rules(version: ProtocolVersion, out: &mut Vec<Vector>) {
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    let u = uid(version, 0x77);
    let graph_fail =
        |name: &str, section: &str, description: &str, graph: GraphComputeRequest, rule: &str| {
            new(name, section, description)
                .with_buffer(4096)
                .fail(&compute(graph), rule)
        };
    let with = |edit: &dyn Fn(&mut GraphComputeRequest)| {
        let mut graph = mini_graph(u);
        edit(&mut graph);
        graph
    };
    // Indices into mini_graph's tensors: 0 x, 1 w, 2 mm, 3 act, 4 view, 5 y.
    let structure: Vec<(&str, &str, GraphComputeRequest)> = vec![
        ("graph_cycle", "a reference cycle: mm.src[0] = act and act.src[0] = mm",
            with(&|g| { g.tensors[2].src[0] = g.tensors[3].id; })),
        ("graph_self_reference", "a view that is its own view source (a node naming itself as a source, as ggml_cast's CPY does, is accepted)",
            with(&|g| { g.tensors[4].view_src = g.tensors[4].id; })),
        ("graph_dangling_src", "act.src[1] names an id that is not among the tensors",
            with(&|g| { g.tensors[3].src[1] = 0x0bad_0bad; })),
        ("graph_dangling_view_src", "view.view_src names an id that is not among the tensors",
            with(&|g| { g.tensors[4].view_src = 0x0bad_0bad; })),
        ("graph_node_id_zero", "node id 0 in the node list (the reference leaves an empty slot)",
            with(&|g| { g.node_ids.insert(1, 0); })),
        ("graph_unknown_node", "a node id that is not among the tensors",
            with(&|g| { g.node_ids.push(0x0bad_0bad); })),
        ("graph_duplicate_node", "the same node listed twice",
            with(&|g| { let id = g.node_ids[1]; g.node_ids.insert(2, id); })),
        ("graph_duplicate_tensor_id", "two records with the same id (the reference silently takes the first)",
            with(&|g| { let x = g.tensors[0].clone(); g.tensors.push(x); })),
        ("graph_tensor_id_zero", "a record with id 0",
            with(&|g| { let mut extra = g.tensors[0].clone(); extra.id = 0; g.tensors.push(extra); })),
        ("graph_no_nodes", "an empty node list (the reference client asserts n_nodes > 0)",
            with(&|g| { g.node_ids.clear(); })),
        ("graph_node_order", "a node listed before the node it reads (act before mm)",
            with(&|g| { g.node_ids.swap(0, 1); })),
        ("graph_view_outside_source", "a 16-byte view at offset 32 of a 32-byte tensor",
            with(&|g| { g.tensors[4].view_offs = 32; })),
        ("graph_compute_node_without_storage", "a computed node reads a tensor with buffer = data = 0 (memory the server does not own)",
            with(&|g| { g.tensors[0].buffer = 0; g.tensors[0].data = 0; })),
    ];
    for (name, what, graph) in structure {
        out.push(graph_fail(
            name,
            "§5.17, G8",
            &format!("GRAPH_COMPUTE with {what}"),
            graph,
            "graph_structure",
        ));
    }
    let ops: Vec<(&str, &str, GraphComputeRequest)> = vec![
        (
            "graph_op_map_custom1",
            "op 92 (MAP_CUSTOM1: op_params carry a client function pointer)",
            with(&|g| {
                g.tensors[5].op = wire_op(Op::MAP_CUSTOM1);
            }),
        ),
        (
            "graph_op_map_custom2",
            "op 93 (MAP_CUSTOM2)",
            with(&|g| {
                g.tensors[5].op = wire_op(Op::MAP_CUSTOM2);
            }),
        ),
        (
            "graph_op_map_custom3",
            "op 94 (MAP_CUSTOM3)",
            with(&|g| {
                g.tensors[5].op = wire_op(Op::MAP_CUSTOM3);
            }),
        ),
        (
            "graph_op_custom",
            "op 95 (CUSTOM)",
            with(&|g| {
                g.tensors[5].op = wire_op(Op::CUSTOM);
            }),
        ),
        (
            "graph_op_101",
            "op 101 (GGML_OP_COUNT, outside the table)",
            with(&|g| {
                g.tensors[5].op = 101;
            }),
        ),
        (
            "graph_op_max",
            "op 2^32 - 1",
            with(&|g| {
                g.tensors[5].op = u32::MAX;
            }),
        ),
        (
            "graph_unary_op_22",
            "a UNARY node with sub-op 22 (GGML_UNARY_OP_COUNT)",
            with(&|g| {
                g.tensors[3].op_params[0] = 22;
            }),
        ),
        (
            "graph_unary_op_negative",
            "a UNARY node with sub-op -1",
            with(&|g| {
                g.tensors[3].op_params[0] = -1;
            }),
        ),
        (
            "graph_glu_op_7",
            "a GLU node with sub-op 7 (GGML_GLU_OP_COUNT)",
            with(&|g| {
                g.tensors[3].op = wire_op(Op::GLU);
                g.tensors[3].op_params[0] = 7;
            }),
        ),
    ];
    for (name, what, graph) in ops {
        out.push(graph_fail(
            name,
            "G6, G7, §12.2-§12.4",
            &format!("GRAPH_COMPUTE with {what}"),
            graph,
            "graph_op",
        ));
    }
    // Two halves (the same tensor twice): the result keeps the source's shape. With one source
    // ggml halves ne[0], and its kernel aborts on this graph's shape (found by `ggml-rpc
    // conformance` against llama.cpp).
    let glu_ok = with(&|g| {
        g.tensors[3].op = wire_op(Op::GLU);
        g.tensors[3].op_params[0] = GluOp::SWIGLU_CLAMP.0;
        g.tensors[3].src[1] = g.tensors[3].src[0];
    });
    let mut s = new(
        "graph_glu_then_invalid_type",
        "§3.3 step 1, §5.17",
        "A valid GLU graph (sub-op 6), then a graph with a tensor of type 36 (removed)",
    )
    .with_buffer(4096);
    s.cast(&compute(glu_ok));
    out.push(s.fail(
        &compute(with(&|g| {
            g.tensors[0].type_id = 36;
        })),
        "type_id",
    ));
    out.push(graph_fail(
        "graph_block_misaligned",
        "G3, §5.17",
        "GRAPH_COMPUTE with a q8_0 weight of ne[0] = 33",
        with(&|g| {
            g.tensors[1].type_id = ty::Q8_0;
            g.tensors[1].ne[0] = 33;
        }),
        "block_multiple",
    ));
    out.push(graph_fail(
        "graph_data_without_buffer",
        "§5.17 step 5",
        "GRAPH_COMPUTE with a tensor of buffer 0 but data != 0 (reference: \"invalid data ptr\")",
        with(&|g| {
            g.tensors[0].buffer = 0;
        }),
        "tensor_needs_buffer",
    ));
    out.push(graph_fail(
        "graph_tensor_outside_buffer",
        "§3.3 step 5, §5.17",
        "GRAPH_COMPUTE with a node extending past its buffer",
        with(&|g| {
            g.tensors[5].data = base(0, 4090);
        }),
        "tensor_inside_buffer",
    ));
    let mut s = new(
        "graph_freed_buffer",
        "§3.3 step 4, §5.17",
        "GRAPH_COMPUTE with a tensor in a freed buffer",
    )
    .with_buffer(4096);
    s.alloc(1, 0, 256);
    s.cast(&Request::FreeBuffer { buffer: buffer(1) });
    out.push(s.fail(
        &compute(with(&|g| {
            g.tensors[0] = t32(1, [8, 2, 1, 1], 1, 0);
        })),
        "buffer_handle",
    ));

    // Stored graphs.
    out.push(
        new(
            "recompute_without_compute",
            "§5.18",
            "GRAPH_RECOMPUTE before any GRAPH_COMPUTE",
        )
        .with_buffer(4096)
        .fail(
            &Request::GraphRecompute { device: 0, uid: u },
            "stored_graph",
        ),
    );
    let mut s = new("recompute_after_free_buffer", "§5.8, §5.18, G20", "GRAPH_COMPUTE, GRAPH_RECOMPUTE, FREE_BUFFER of another buffer (invalidates every stored graph), GRAPH_RECOMPUTE")
        .with_buffer(4096);
    s.cast(&compute(mini_graph(u)));
    s.cast(&Request::GraphRecompute { device: 0, uid: u });
    s.alloc(1, 0, 64);
    s.cast(&Request::FreeBuffer { buffer: buffer(1) });
    out.push(s.fail(
        &Request::GraphRecompute { device: 0, uid: u },
        "stored_graph",
    ));
    let mut s = new(
        "recompute_other_device",
        "§5.18",
        "GRAPH_COMPUTE on device 0, GRAPH_RECOMPUTE on device 1 (graphs are stored per device)",
    )
    .devices(2)
    .with_buffer(4096);
    s.cast(&compute(mini_graph(u)));
    out.push(s.fail(
        &Request::GraphRecompute { device: 1, uid: u },
        "stored_graph",
    ));
    let mut s = new(
        "recompute_after_freeing_graph_buffer",
        "§5.8, §5.18",
        "GRAPH_COMPUTE, FREE_BUFFER of the buffer the graph lives in, GRAPH_RECOMPUTE",
    )
    .with_buffer(4096);
    s.cast(&compute(mini_graph(u)));
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    out.push(s.fail(
        &Request::GraphRecompute { device: 0, uid: u },
        "stored_graph",
    ));
}
