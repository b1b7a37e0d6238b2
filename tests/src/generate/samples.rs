//! Typed sample values the vectors are built from.

use proto_core::ggml::types::id as ty;
use proto_core::ggml::{flags, GgmlTable, GluOp, Op, UnaryOp};
use proto_core::wire::{GraphComputeRequest, RpcTensor};

/// The wire id of `op` in the 7.0.0/8.0.0 numbering that the v7 and v8 vectors use.
pub fn wire_op(op: Op) -> u32 {
    GgmlTable::V8_0_0
        .op_to_wire(op)
        .expect("an op that exists before 8.0.1")
}

/// A client tensor address (the reference uses the address of the client's tensor object as id).
pub fn client_id(n: u64) -> u64 {
    0x0000_7f3a_9c40_0000 + n * 0x150
}

/// A raw buffer handle as the reference server would send it (a server heap address).
pub const RAW_BUFFER: u64 = 0x0000_5581_2e4a_b000;
/// The base address of [`RAW_BUFFER`].
pub const RAW_BASE: u64 = 0x0000_7f1c_2000_0000;
/// A second raw buffer handle.
pub const RAW_BUFFER_2: u64 = 0x0000_5581_2e4a_c2a0;
/// The base address of [`RAW_BUFFER_2`].
pub const RAW_BASE_2: u64 = 0x0000_7f1c_6000_0000;

/// A contiguous tensor of `type_id` and shape `ne` at `data` in `buffer`, named `name`.
pub fn stored(
    id: u64,
    type_id: u32,
    ne: [u32; 4],
    buffer: u64,
    data: u64,
    name: &str,
) -> RpcTensor {
    let mut tensor = RpcTensor::contiguous(id, type_id, ne).expect("valid sample type");
    tensor.buffer = buffer;
    tensor.data = data;
    tensor.set_name(name);
    tensor
}

/// A contiguous f32 tensor.
pub fn f32_at(id: u64, ne: [u32; 4], buffer: u64, data: u64, name: &str) -> RpcTensor {
    stored(id, ty::F32, ne, buffer, data, name)
}

/// A plain f32 tensor in the raw sample buffer.
pub fn raw_f32(n: u64, ne: [u32; 4], offset: u64, name: &str) -> RpcTensor {
    f32_at(client_id(n), ne, RAW_BUFFER, RAW_BASE + offset, name)
}

/// An `rpc_tensor` in which every field is non-trivial (PROTOCOL.md §3.1).
pub fn realistic_tensor() -> RpcTensor {
    let mut t = stored(
        0x0000_7f3a_9c41_2e80,
        ty::Q4_K,
        [512, 3, 2, 2],
        RAW_BUFFER,
        RAW_BASE + 0x1000,
        "blk.17.ffn_down.weight",
    );
    // nb is [144, 288, 864, 1728]: a q4_K block of 256 elements takes 144 bytes.
    t.op = Op::MUL_MAT.0;
    for (i, slot) in t.op_params.iter_mut().enumerate() {
        let i = i as i32;
        *slot = if i % 2 == 0 { i + 1 } else { -(i + 1) * 1000 };
    }
    t.op_params[0] = 0.125f32.to_bits() as i32;
    t.flags = flags::INPUT | flags::OUTPUT | flags::COMPUTE;
    for (i, src) in t.src.iter_mut().enumerate() {
        *src = client_id(100 + i as u64);
    }
    t.view_src = client_id(99);
    t.view_offs = 0x1200;
    t.use_count = 3;
    t
}

/// The GRAPH_COMPUTE of PROTOCOL.md §8: 2 nodes, 5 tensors (`c = a + b`, `e = c * d`).
pub fn example_graph(uid: u64) -> GraphComputeRequest {
    let a = raw_f32(1, [16, 1, 1, 1], 0, "a");
    let b = raw_f32(2, [16, 1, 1, 1], 64, "b");
    let mut c = raw_f32(3, [16, 1, 1, 1], 128, "c");
    c.op = Op::ADD.0;
    c.src[..2].copy_from_slice(&[a.id, b.id]);
    c.flags = flags::COMPUTE;
    c.use_count = 1;
    let d = raw_f32(4, [16, 1, 1, 1], 192, "d");
    let mut e = raw_f32(5, [16, 1, 1, 1], 256, "e");
    e.op = Op::MUL.0;
    e.src[..2].copy_from_slice(&[c.id, d.id]);
    e.flags = flags::COMPUTE | flags::OUTPUT;
    GraphComputeRequest {
        device: 0,
        uid,
        node_ids: vec![c.id, e.id],
        tensors: vec![a, b, c, d, e],
    }
}

/// A realistic split graph: token embedding lookup, RMS norm, Q projection, a view and SiLU/GLU,
/// with host inputs (`buffer = data = 0`), quantized weights and graph use counts.
pub fn transformer_graph(device: u32, uid: u64) -> GraphComputeRequest {
    let w = RAW_BUFFER;
    let c = RAW_BUFFER_2;
    let mut tokens = stored(client_id(10), ty::I32, [4, 1, 1, 1], 0, 0, "inp_tokens");
    tokens.flags = flags::INPUT;
    tokens.use_count = 1;
    let mut embd = stored(
        client_id(11),
        ty::Q8_0,
        [64, 32, 1, 1],
        w,
        RAW_BASE,
        "token_embd.weight",
    );
    embd.flags = flags::PARAM;
    embd.use_count = 1;
    let mut rows = stored(
        client_id(12),
        ty::F32,
        [64, 4, 1, 1],
        c,
        RAW_BASE_2,
        "inp_embd",
    );
    rows.op = Op::GET_ROWS.0;
    rows.src[..2].copy_from_slice(&[embd.id, tokens.id]);
    rows.flags = flags::COMPUTE;
    rows.use_count = 1;
    let mut norm = stored(
        client_id(13),
        ty::F32,
        [64, 4, 1, 1],
        c,
        RAW_BASE_2 + 1024,
        "norm-0",
    );
    norm.op = Op::RMS_NORM.0;
    norm.op_params[0] = 1e-5f32.to_bits() as i32;
    norm.src[0] = rows.id;
    norm.flags = flags::COMPUTE;
    norm.use_count = 1;
    let mut norm_w = stored(
        client_id(14),
        ty::F32,
        [64, 1, 1, 1],
        w,
        RAW_BASE + 2176,
        "blk.0.attn_norm.weight",
    );
    norm_w.flags = flags::PARAM;
    norm_w.use_count = 1;
    let mut scaled = stored(
        client_id(15),
        ty::F32,
        [64, 4, 1, 1],
        c,
        RAW_BASE_2 + 2048,
        "attn_norm-0",
    );
    scaled.op = Op::MUL.0;
    scaled.src[..2].copy_from_slice(&[norm.id, norm_w.id]);
    scaled.flags = flags::COMPUTE;
    scaled.use_count = 1;
    let mut wq = stored(
        client_id(16),
        ty::Q8_0,
        [64, 128, 1, 1],
        w,
        RAW_BASE + 2432,
        "blk.0.attn_q.weight",
    );
    wq.flags = flags::PARAM;
    wq.use_count = 1;
    let mut q = stored(
        client_id(17),
        ty::F32,
        [128, 4, 1, 1],
        c,
        RAW_BASE_2 + 3072,
        "Qcur-0",
    );
    q.op = Op::MUL_MAT.0;
    q.src[..2].copy_from_slice(&[wq.id, scaled.id]);
    q.flags = flags::COMPUTE;
    q.use_count = 1;
    let mut half = stored(
        client_id(18),
        ty::F32,
        [64, 4, 1, 1],
        c,
        RAW_BASE_2 + 3072,
        "Qcur-0 (view)",
    );
    half.op = Op::VIEW.0;
    half.nb = [4, 512, 2048, 2048];
    half.src[0] = q.id;
    half.view_src = q.id;
    half.view_offs = 0;
    half.flags = flags::COMPUTE;
    half.use_count = 1;
    let mut act = stored(
        client_id(19),
        ty::F32,
        [64, 4, 1, 1],
        c,
        RAW_BASE_2 + 5120,
        "ffn_silu-0",
    );
    act.op = wire_op(Op::UNARY);
    act.op_params[0] = UnaryOp::SILU.0;
    act.src[0] = half.id;
    act.flags = flags::COMPUTE;
    act.use_count = 1;
    let mut glu = stored(
        client_id(20),
        ty::F32,
        [32, 4, 1, 1],
        c,
        RAW_BASE_2 + 6144,
        "ffn_swiglu-0",
    );
    glu.op = wire_op(Op::GLU);
    glu.op_params[0] = GluOp::SWIGLU.0;
    glu.op_params[1] = 1;
    glu.src[0] = act.id;
    glu.flags = flags::COMPUTE | flags::OUTPUT;
    GraphComputeRequest {
        device,
        uid,
        node_ids: vec![rows.id, norm.id, scaled.id, q.id, half.id, act.id, glu.id],
        tensors: vec![
            embd, tokens, rows, norm, norm_w, scaled, wq, q, half, act, glu,
        ],
    }
}
