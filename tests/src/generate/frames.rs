//! Valid frames: every request and every response of both versions, and the byte examples of
//! PROTOCOL.md §5.1 and §8.

use bytes::Bytes;
use proto_core::ggml::types::id as ty;
use proto_core::tensor_cache::fnv1a64;
use proto_core::wire::{
    AllocSizeRequest, CommInitRequest, Dialect, ProtocolVersion, RemoteCopyRequest, Request,
    Response, RpcTensor, SetTensorHeader, Tensor2dHeader, COMM_HOST_SIZE, EXTENSION_REMOTE_COPY,
};

use super::samples::{
    client_id, example_graph, f32_at, raw_f32, realistic_tensor, stored, transformer_graph,
    RAW_BASE, RAW_BASE_2, RAW_BUFFER, RAW_BUFFER_2,
};
use super::{
    dialect, folder, request_frame, spec, valid_request, valid_response, V7, V8, VERSIONS,
};
use crate::hex;
use crate::vector::Vector;

pub(super) fn generate(out: &mut Vec<Vector>) {
    for version in VERSIONS {
        for (slug, section, description, request) in requests(version) {
            let name = format!("{}/requests/{slug}", folder(version));
            out.push(valid_request(
                name,
                version,
                spec(section),
                description,
                &request,
            ));
        }
        for (slug, section, description, request, response) in responses(version) {
            let name = format!("{}/responses/{slug}", folder(version));
            out.push(valid_response(
                name,
                version,
                spec(section),
                description,
                &request,
                &response,
            ));
        }
    }
    examples(out);
    for version in VERSIONS {
        out.push(trailing_bytes(version));
    }
}

/// GRAPH_COMPUTE with 7 bytes after the last record: accepted, the bytes are ignored (§5.17).
fn trailing_bytes(version: ProtocolVersion) -> Vector {
    let graph = Request::GraphCompute(Box::new(single_node_graph(
        if dialect(version) == Dialect::V8 {
            9
        } else {
            0
        },
    )));
    let canonical = request_frame(version, &graph);
    let mut frame = canonical.clone();
    frame.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
    let size = (frame.len() - 9) as u64;
    frame[1..9].copy_from_slice(&size.to_le_bytes());
    let name = format!("{}/requests/graph_compute_trailing_bytes", folder(version));
    let mut v = valid_request(name, version, spec("§5.17"),
        "GRAPH_COMPUTE followed by 7 bytes inside its declared size: trailing bytes are accepted and ignored; the message re-encodes without them",
        &graph);
    v.hex = Some(hex::encode(&frame));
    v.canonical_hex = Some(hex::encode(&canonical));
    v
}

/// RoCE caps as a Linux RDMA build sends them: qpn, psn = qpn & 0xffffff, GID ::ffff:192.168.1.10.
pub(super) fn rdma_caps() -> [u8; 24] {
    let mut caps = [0u8; 24];
    caps[0..4].copy_from_slice(&0x0001_2345u32.to_le_bytes());
    caps[4..8].copy_from_slice(&0x0001_2345u32.to_le_bytes());
    caps[18..20].copy_from_slice(&[0xff, 0xff]);
    caps[20..24].copy_from_slice(&[192, 168, 1, 10]);
    caps
}

fn host(text: &str) -> [u8; COMM_HOST_SIZE] {
    let mut out = [0u8; COMM_HOST_SIZE];
    out[..text.len()].copy_from_slice(text.as_bytes());
    out
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn boxed(tensor: RpcTensor) -> Box<RpcTensor> {
    Box::new(tensor)
}

type RequestCase = (&'static str, &'static str, &'static str, Request);

fn requests(version: ProtocolVersion) -> Vec<RequestCase> {
    let v8 = dialect(version) == Dialect::V8;
    let weight = raw_f32(1, [8, 4, 1, 1], 0x100, "blk.0.attn_k.weight");
    let vector_f32 = raw_f32(2, [8, 1, 1, 1], 0x200, "inp_pos");
    let mut cases: Vec<RequestCase> = vec![
        ("hello", "§5.1", "HELLO from a TCP-only client: 24 zero bytes of conn_caps",
            Request::Hello { caps: [0; 24] }),
        ("hello_rdma_caps", "§5.1, §10.2", "HELLO from a Linux RoCE client: qpn, psn = qpn & 0xffffff, IPv4-mapped GID",
            Request::Hello { caps: rdma_caps() }),
        ("device_count", "§5.2", "DEVICE_COUNT: empty payload", Request::DeviceCount),
        ("get_device_memory", "§5.3", "GET_DEVICE_MEMORY of device 2", Request::GetDeviceMemory { device: 2 }),
        ("get_alignment", "§5.4", "GET_ALIGNMENT of device 0", Request::GetAlignment { device: 0 }),
        ("get_max_size", "§5.5", "GET_MAX_SIZE of device 1", Request::GetMaxSize { device: 1 }),
        ("alloc_buffer", "§5.6", "ALLOC_BUFFER of 300 MiB on device 1",
            Request::AllocBuffer { device: 1, size: 300 << 20 }),
        ("alloc_buffer_zero", "§5.6, §4.3", "ALLOC_BUFFER of 0 bytes (valid: a dummy buffer with base 0)",
            Request::AllocBuffer { device: 0, size: 0 }),
        ("buffer_get_base", "§5.7", "BUFFER_GET_BASE of a raw server handle",
            Request::BufferGetBase { buffer: RAW_BUFFER }),
        ("free_buffer", "§5.8", "FREE_BUFFER", Request::FreeBuffer { buffer: RAW_BUFFER_2 }),
        ("buffer_clear", "§5.9", "BUFFER_CLEAR to 0 (KV cache clear)",
            Request::BufferClear { buffer: RAW_BUFFER, value: 0 }),
        ("buffer_clear_ff", "§5.9", "BUFFER_CLEAR to 0xff",
            Request::BufferClear { buffer: RAW_BUFFER_2, value: 0xff }),
        ("set_tensor", "§5.10", "SET_TENSOR of a whole 128-byte f32 tensor at offset 0",
            Request::SetTensor {
                header: Box::new(SetTensorHeader { tensor: weight.clone(), cache_flag: 0, offset: 0 }),
                data: pattern(128, 1),
            }),
        ("set_tensor_cache_flag", "§5.10", "SET_TENSOR with cache_flag 1 (store in the server's tensor cache)",
            Request::SetTensor {
                header: Box::new(SetTensorHeader { tensor: weight.clone(), cache_flag: 1, offset: 96 }),
                data: pattern(32, 2),
            }),
        ("set_tensor_empty", "§5.10", "SET_TENSOR with no data (size 305)",
            Request::SetTensor {
                header: Box::new(SetTensorHeader { tensor: vector_f32.clone(), cache_flag: 0, offset: 4 }),
                data: Bytes::new(),
            }),
        ("set_tensor_hash", "§5.11", "SET_TENSOR_HASH with the FNV-1a-64 of the data",
            Request::SetTensorHash {
                tensor: boxed(weight.clone()),
                offset: 0,
                hash: fnv1a64(&pattern(128, 1)),
            }),
        ("get_tensor", "§5.12", "GET_TENSOR of 16 bytes at offset 8",
            Request::GetTensor { tensor: boxed(weight.clone()), offset: 8, size: 16 }),
        ("copy_tensor", "§5.16", "COPY_TENSOR between two tensors of one server",
            Request::CopyTensor {
                src: boxed(raw_f32(3, [8, 1, 1, 1], 0x300, "src")),
                dst: boxed(f32_at(client_id(4), [8, 1, 1, 1], RAW_BUFFER_2, RAW_BASE_2 + 0x40, "dst")),
            }),
        ("init_tensor", "§5.14, §3.1", "INIT_TENSOR carrying an rpc_tensor in which every field is non-trivial",
            Request::InitTensor { tensor: boxed(realistic_tensor()) }),
        ("get_alloc_size", "§5.13", "GET_ALLOC_SIZE of a MUL_MAT node with two sources; absent sources are 296 zero bytes (null)",
            Request::GetAllocSize(Box::new(alloc_size_request()))),
        ("memset_tensor", "§5.15", "MEMSET_TENSOR of 12 bytes at offset 4 to 0xa5",
            Request::MemsetTensor { tensor: boxed(weight.clone()), offset: 4, size: 12, value: 0xa5 }),
        ("graph_compute", "§5.17", "GRAPH_COMPUTE of one node over one leaf",
            Request::GraphCompute(Box::new(single_node_graph(if v8 { 0x1234_5678_9abc } else { 0 })))),
        ("graph_compute_transformer", "§5.17, §3.2", "GRAPH_COMPUTE with 7 nodes and 11 tensors: host input, quantized weights, views, unary and GLU ops, use counts",
            Request::GraphCompute(Box::new(transformer_graph(1, if v8 { 0x1d } else { 0 })))),
        ("graph_recompute", "§5.18", "GRAPH_RECOMPUTE of device 0",
            Request::GraphRecompute { device: 0, uid: if v8 { 0x1234_5678_9abc } else { 0 } }),
    ];
    if v8 {
        cases.extend([
            (
                "graph_compute_uid0",
                "§5.17",
                "GRAPH_COMPUTE with uid 0 (not cacheable)",
                Request::GraphCompute(Box::new(single_node_graph(0))),
            ),
            (
                "set_tensor_2d",
                "§5.19",
                "SET_TENSOR_2D: 3 rows of 8 bytes every 32 bytes, starting at offset 16",
                Request::SetTensor2d {
                    header: Box::new(Tensor2dHeader {
                        tensor: weight.clone(),
                        offset: 16,
                        size: 8,
                        n_copies: 3,
                        stride: 32,
                    }),
                    data: pattern(24, 3),
                },
            ),
            (
                "set_tensor_2d_stride0",
                "§5.19",
                "SET_TENSOR_2D with stride 0 (every copy to the same place)",
                Request::SetTensor2d {
                    header: Box::new(Tensor2dHeader {
                        tensor: vector_f32.clone(),
                        offset: 0,
                        size: 4,
                        n_copies: 2,
                        stride: 0,
                    }),
                    data: pattern(8, 4),
                },
            ),
            (
                "get_tensor_2d",
                "§5.20",
                "GET_TENSOR_2D: 4 rows of 4 bytes every 32 bytes",
                Request::GetTensor2d(Box::new(Tensor2dHeader {
                    tensor: weight.clone(),
                    offset: 0,
                    size: 4,
                    n_copies: 4,
                    stride: 32,
                })),
            ),
            (
                "comm_init_rank0",
                "§5.21, §6.1",
                "COMM_INIT for rank 0 of 2: listen on the RPC port + 1000, host zeros",
                Request::CommInit(Box::new(CommInitRequest {
                    device: 0,
                    rank: 0,
                    world: 2,
                    port: 51052,
                    host: [0; COMM_HOST_SIZE],
                })),
            ),
            (
                "comm_init_rank1",
                "§5.21, §6.1",
                "COMM_INIT for rank 1 of 2: connect to rank 0's host and comm port",
                Request::CommInit(Box::new(CommInitRequest {
                    device: 1,
                    rank: 1,
                    world: 2,
                    port: 51052,
                    host: host("192.168.1.10"),
                })),
            ),
            (
                "comm_allreduce",
                "§5.22",
                "COMM_ALLREDUCE of an F32 tensor with the COMPUTE flag",
                Request::CommAllreduce {
                    device: 0,
                    tensor: boxed(allreduce_tensor()),
                },
            ),
            (
                "comm_free",
                "§5.23",
                "COMM_FREE of device 1",
                Request::CommFree { device: 1 },
            ),
        ]);
    }
    cases.extend(extension_requests());
    cases
}

/// Where our private extension is described (it is not in PROTOCOL.md).
const EXTENSION_SPEC: &str = "§2.4 (ours, ids 0xF0-0xF3: README, Server-to-server copies)";

/// Our remote-copy extension's requests (both versions; accepted only once negotiated).
fn extension_requests() -> Vec<RequestCase> {
    let src = raw_f32(1, [256, 1, 1, 1], RAW_BASE, "src");
    let mut dst = raw_f32(2, [256, 1, 1, 1], RAW_BASE_2, "dst");
    dst.buffer = RAW_BUFFER_2;
    vec![
        ("extensions", EXTENSION_SPEC, "EXTENSIONS (0xF0): the client wants bit 0, remote copy",
            Request::Extensions { wanted: EXTENSION_REMOTE_COPY }),
        ("remote_copy_expect", EXTENSION_SPEC,
            "REMOTE_COPY_EXPECT (0xF1) on server B: a ticket for 512 bytes at offset 256 of dst (one row: the stride is ignored)",
            Request::RemoteCopyExpect(Box::new(Tensor2dHeader {
                tensor: dst.clone(), offset: 256, size: 512, n_copies: 1, stride: 0,
            }))),
        ("remote_copy_expect_rows", EXTENSION_SPEC,
            "REMOTE_COPY_EXPECT (0xF1) for 4 rows of 64 bytes, 128 bytes apart, from offset 32 of dst",
            Request::RemoteCopyExpect(Box::new(Tensor2dHeader {
                tensor: dst.clone(), offset: 32, size: 64, n_copies: 4, stride: 128,
            }))),
        ("remote_copy_attach", EXTENSION_SPEC,
            "REMOTE_COPY_ATTACH (0xF2) from server A to B: ticket, buffer, start = data + offset, size, one row (stride 0)",
            Request::RemoteCopyAttach {
                ticket: 0x5eed_0f7e_a11c_0de5,
                buffer: RAW_BUFFER_2,
                start: RAW_BASE_2 + 256,
                size: 512,
                n_copies: 1,
                stride: 0,
            }),
        ("remote_copy_tensor", EXTENSION_SPEC,
            "REMOTE_COPY_TENSOR (0xF3) to server A: 512 bytes of src at 0 to dst at 256 on 10.0.0.2:50052",
            Request::RemoteCopyTensor(Box::new(RemoteCopyRequest {
                src: src.clone(),
                src_offset: 0,
                size: 512,
                n_copies: 1,
                src_stride: 0,
                dst: dst.clone(),
                dst_offset: 256,
                dst_stride: 0,
                ticket: 0x5eed_0f7e_a11c_0de5,
                endpoint: RemoteCopyRequest::endpoint_field("10.0.0.2:50052").expect("fits"),
            }))),
        ("remote_copy_tensor_rows", EXTENSION_SPEC,
            "REMOTE_COPY_TENSOR (0xF3) of 4 rows of 64 bytes: 256 bytes apart in src, 128 apart from offset 32 in dst (sent to B as one SET_TENSOR_2D)",
            Request::RemoteCopyTensor(Box::new(RemoteCopyRequest {
                src,
                src_offset: 0,
                size: 64,
                n_copies: 4,
                src_stride: 256,
                dst,
                dst_offset: 32,
                dst_stride: 128,
                ticket: 0x5eed_0f7e_a11c_0de5,
                endpoint: RemoteCopyRequest::endpoint_field("b.example:50052").expect("fits"),
            }))),
    ]
}

fn single_node_graph(uid: u64) -> proto_core::wire::GraphComputeRequest {
    let leaf = raw_f32(1, [8, 4, 1, 1], 0, "x");
    let mut node = raw_f32(2, [8, 4, 1, 1], 128, "x^2");
    node.op = proto_core::ggml::Op::SQR.0;
    node.src[0] = leaf.id;
    node.flags = proto_core::ggml::flags::COMPUTE;
    proto_core::wire::GraphComputeRequest {
        device: 0,
        uid,
        node_ids: vec![node.id],
        tensors: vec![leaf, node],
    }
}

fn alloc_size_request() -> AllocSizeRequest {
    let mut node = stored(client_id(30), ty::F32, [4096, 7, 1, 1], 0, 0, "kqv_out-0");
    node.op = proto_core::ggml::Op::MUL_MAT.0;
    let weight = stored(
        client_id(31),
        ty::Q4_K,
        [4096, 4096, 1, 1],
        RAW_BUFFER,
        RAW_BASE,
        "blk.0.attn_output.weight",
    );
    let input = stored(client_id(32), ty::F32, [4096, 7, 1, 1], 0, 0, "kqv-0");
    node.src[..2].copy_from_slice(&[weight.id, input.id]);
    let mut srcs: [RpcTensor; 10] = Default::default();
    srcs[0] = weight;
    srcs[1] = input;
    AllocSizeRequest {
        device: 0,
        tensor: node,
        srcs,
    }
}

fn allreduce_tensor() -> RpcTensor {
    let mut tensor = raw_f32(40, [4096, 2, 1, 1], 0x10_0000, "ffn_out-3");
    tensor.flags = proto_core::ggml::flags::COMPUTE;
    tensor
}

type ResponseCase = (&'static str, &'static str, &'static str, Request, Response);

fn responses(version: ProtocolVersion) -> Vec<ResponseCase> {
    let v8 = dialect(version) == Dialect::V8;
    let hello = Request::Hello { caps: [0; 24] };
    let weight = raw_f32(1, [8, 4, 1, 1], 0x100, "blk.0.attn_k.weight");
    let get = |size| Request::GetTensor {
        tensor: boxed(weight.clone()),
        offset: 8,
        size,
    };
    let hash = Request::SetTensorHash {
        tensor: boxed(weight.clone()),
        offset: 0,
        hash: 0x88201fb960ff6465,
    };
    let copy = Request::CopyTensor {
        src: boxed(raw_f32(3, [8, 1, 1, 1], 0x300, "src")),
        dst: boxed(raw_f32(4, [8, 1, 1, 1], 0x340, "dst")),
    };
    let alloc = Request::AllocBuffer {
        device: 0,
        size: 1 << 20,
    };
    let patched = ProtocolVersion {
        patch: 5,
        ..version
    };
    let mut cases: Vec<ResponseCase> = vec![
        ("hello", "§5.1, §1.5", "HELLO response of a server of the same version: byte 3 (padding/flags) 0, TCP-only caps",
            hello.clone(), Response::Hello { version, flags: 0, caps: [0; 24] }),
        ("hello_flags_cache", "§1.4, §5.1", "HELLO response with byte 3 = 1: flags bit 0 of the newest upstream change (server has a tensor cache); padding that a 7.0.0/8.0.0 client ignores",
            hello.clone(), Response::Hello { version, flags: 1, caps: [0; 24] }),
        ("hello_rdma_caps", "§5.1, §10.2", "HELLO response of a RoCE-capable server (answered to a RoCE client)",
            Request::Hello { caps: rdma_caps() }, Response::Hello { version, flags: 0, caps: server_caps() }),
        ("hello_patch_ignored", "§1.5", "HELLO response with a higher patch number: accepted, the patch is never compared",
            hello, Response::Hello { version: patched, flags: 0, caps: [0; 24] }),
        ("device_count", "§5.2", "DEVICE_COUNT response: 3 devices", Request::DeviceCount, Response::DeviceCount(3)),
        ("get_device_memory", "§5.3", "GET_DEVICE_MEMORY response: 6 GiB free of 24 GiB",
            Request::GetDeviceMemory { device: 0 }, Response::DeviceMemory { free: 6 << 30, total: 24 << 30 }),
        ("get_alignment", "§5.4", "GET_ALIGNMENT response of the CPU backend: 32",
            Request::GetAlignment { device: 0 }, Response::Alignment(32)),
        ("get_max_size", "§5.5", "GET_MAX_SIZE response of the CPU backend: 2^64 - 1 (unlimited)",
            Request::GetMaxSize { device: 0 }, Response::MaxSize(u64::MAX)),
        ("alloc_buffer", "§5.6", "ALLOC_BUFFER response: handle and size",
            alloc.clone(), Response::AllocBuffer { remote_ptr: RAW_BUFFER, remote_size: 1 << 20 }),
        ("alloc_buffer_failed", "§5.6, §2.5 step 9", "ALLOC_BUFFER response of a failed allocation: (0, 0), not fatal",
            alloc, Response::AllocBuffer { remote_ptr: 0, remote_size: 0 }),
        ("buffer_get_base", "§5.7", "BUFFER_GET_BASE response",
            Request::BufferGetBase { buffer: RAW_BUFFER }, Response::BufferBase(RAW_BASE)),
        ("set_tensor_hash_miss", "§5.11", "SET_TENSOR_HASH response 0: not cached, the client sends SET_TENSOR",
            hash.clone(), Response::SetTensorHash(0)),
        ("set_tensor_hash_hit", "§5.11", "SET_TENSOR_HASH response 1: written from the cache",
            hash, Response::SetTensorHash(1)),
        ("get_tensor", "§5.12", "GET_TENSOR response: exactly the 16 requested bytes",
            get(16), Response::TensorData(pattern(16, 9))),
        ("get_tensor_empty", "§5.12", "GET_TENSOR response to a request of 0 bytes: a size field of 0 and no payload",
            get(0), Response::TensorData(Bytes::new())),
        ("copy_tensor", "§5.16", "COPY_TENSOR response 1: copied", copy.clone(), Response::CopyTensor(1)),
        ("copy_tensor_fallback", "§5.16", "COPY_TENSOR response 0: the client falls back to GET_TENSOR + SET_TENSOR",
            copy, Response::CopyTensor(0)),
        ("get_alloc_size", "§5.13", "GET_ALLOC_SIZE response",
            Request::GetAllocSize(Box::new(alloc_size_request())), Response::AllocSize(4096 * 7 * 4 + 512)),
    ];
    if v8 {
        let rows = Tensor2dHeader {
            tensor: weight.clone(),
            offset: 0,
            size: 4,
            n_copies: 3,
            stride: 32,
        };
        let comm = CommInitRequest {
            device: 0,
            rank: 0,
            world: 2,
            port: 51052,
            host: [0; COMM_HOST_SIZE],
        };
        cases.extend([
            (
                "get_tensor_2d",
                "§5.20",
                "GET_TENSOR_2D response: size·n_copies = 12 bytes, rows back to back",
                Request::GetTensor2d(Box::new(rows)),
                Response::Tensor2dData(pattern(12, 5)),
            ),
            (
                "comm_init_ok",
                "§5.21",
                "COMM_INIT response 1: communicator ready",
                Request::CommInit(Box::new(comm.clone())),
                Response::CommInit(1),
            ),
            (
                "comm_init_failed",
                "§5.21",
                "COMM_INIT response 0: failed (never closes the connection)",
                Request::CommInit(Box::new(comm)),
                Response::CommInit(0),
            ),
        ]);
    }
    let requests: Vec<Request> = extension_requests()
        .into_iter()
        .map(|case| case.3)
        .collect();
    let [extensions, expect, _, attach, copy, _] = <[Request; 6]>::try_from(requests).expect("six");
    cases.extend([
        (
            "extensions_granted",
            EXTENSION_SPEC,
            "EXTENSIONS response: bit 0 (remote copy) granted",
            extensions.clone(),
            Response::Extensions(EXTENSION_REMOTE_COPY),
        ),
        (
            "extensions_none",
            EXTENSION_SPEC,
            "EXTENSIONS response of a server started with --no-extensions: nothing granted",
            extensions,
            Response::Extensions(0),
        ),
        (
            "remote_copy_expect",
            EXTENSION_SPEC,
            "REMOTE_COPY_EXPECT response: status 0 and the ticket",
            expect.clone(),
            Response::RemoteCopyExpect {
                status: 0,
                ticket: 0x5eed_0f7e_a11c_0de5,
            },
        ),
        (
            "remote_copy_expect_bad_region",
            EXTENSION_SPEC,
            "REMOTE_COPY_EXPECT response: status 5 (bad destination region), ticket 0",
            expect,
            Response::RemoteCopyExpect {
                status: 5,
                ticket: 0,
            },
        ),
        (
            "remote_copy_attach",
            EXTENSION_SPEC,
            "REMOTE_COPY_ATTACH response: status 0 (attached)",
            attach,
            Response::RemoteCopyAttach(0),
        ),
        (
            "remote_copy_tensor",
            EXTENSION_SPEC,
            "REMOTE_COPY_TENSOR response: status 0 (B confirmed the write)",
            copy.clone(),
            Response::RemoteCopyTensor(0),
        ),
        (
            "remote_copy_tensor_not_allowed",
            EXTENSION_SPEC,
            "REMOTE_COPY_TENSOR response: status 1 (endpoint not on the --peer list)",
            copy,
            Response::RemoteCopyTensor(1),
        ),
    ]);
    cases
}

fn server_caps() -> [u8; 24] {
    let mut caps = rdma_caps();
    caps[0..4].copy_from_slice(&0x0000_0e11u32.to_le_bytes());
    caps[4..8].copy_from_slice(&0x0000_0e11u32.to_le_bytes());
    caps[23] = 20;
    caps
}

/// The byte examples of PROTOCOL.md §5.1 and §8, copied as written there; [`spec_hex`] turns
/// them into hex.
pub(crate) mod literal {
    /// §5.1, 7.0.0 client (24 zero bytes follow).
    pub const HELLO_REQUEST: &str = "0E 18 00 00 00 00 00 00 00";
    /// §5.1, 7.0.0 server (24 zero bytes follow).
    pub const HELLO_RESPONSE_V7: &str = "1C 00 00 00 00 00 00 00 07 00 00 00";
    /// §8 DEVICE_COUNT request.
    pub const DEVICE_COUNT_REQUEST: &str = "0F 00 00 00 00 00 00 00 00";
    /// §8 DEVICE_COUNT response (one device).
    pub const DEVICE_COUNT_RESPONSE: &str = "04 00 00 00 00 00 00 00 + 01 00 00 00";
    /// §8 ALLOC_BUFFER request, device 0, 1 MiB.
    pub const ALLOC_BUFFER_REQUEST: &str =
        "00 + 0C 00 00 00 00 00 00 00 + 00 00 00 00 + 00 00 10 00 00 00 00 00";
    /// §8 ALLOC_BUFFER response header (handle and size follow).
    pub const ALLOC_BUFFER_RESPONSE_HEAD: &str = "10 00 00 00 00 00 00 00";
    /// §8 GRAPH_RECOMPUTE (8.x) device 1, uid 0x2A.
    pub const GRAPH_RECOMPUTE_V8: &str =
        "10 + 0C 00 00 00 00 00 00 00 + 01 00 00 00 + 2A 00 00 00 00 00 00 00";
    /// §8 GRAPH_RECOMPUTE (7.0.0) device 1.
    pub const GRAPH_RECOMPUTE_V7: &str = "10 + 04 00 00 00 00 00 00 00 + 01 00 00 00";
    /// §8 SET_TENSOR header of 8 bytes of data (313 = 305 + 8).
    pub const SET_TENSOR_HEAD: &str = "06 + 39 01 00 00 00 00 00 00";
    /// §8 SET_TENSOR bytes after the record: cache flag 0, offset 16.
    pub const SET_TENSOR_AFTER_RECORD: &str = "00 + 10 00 00 00 00 00 00 00";
}

/// PROTOCOL.md's notation (`0E 18 00` with `+` between parts) as lowercase hex.
pub(crate) fn spec_hex(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_hexdigit())
        .collect::<String>()
        .to_lowercase()
}

fn check_literal(name: &str, bytes: &[u8], prefix: &str) {
    let text = hex::encode(bytes);
    let prefix = spec_hex(prefix);
    assert!(
        text.starts_with(&prefix),
        "{name}: {text} does not start with PROTOCOL.md's {prefix}"
    );
}

fn examples(out: &mut Vec<Vector>) {
    let hello = Request::Hello { caps: [0; 24] };
    let hello_v7 = Response::Hello {
        version: V7,
        flags: 0,
        caps: [0; 24],
    };
    let example = |name: &str| format!("examples/{name}");
    let v = valid_request(
        example("v7/hello_request"),
        V7,
        spec("§5.1"),
        "§5.1 byte example: HELLO request of a TCP-only client (33 bytes)",
        &hello,
    );
    check_literal(&v.name, &request_frame(V7, &hello), literal::HELLO_REQUEST);
    assert_eq!(request_frame(V7, &hello).len(), 33);
    out.push(v);
    out.push(valid_response(
        example("v7/hello_response"),
        V7,
        spec("§5.1"),
        "§5.1 byte example: HELLO response of a 7.0.0 TCP-only server (36 bytes)",
        &hello,
        &hello_v7,
    ));
    check_literal(
        "hello_response",
        &hello_v7.to_frame(),
        literal::HELLO_RESPONSE_V7,
    );
    assert_eq!(hello_v7.to_frame().len(), 36);

    let alloc = Request::AllocBuffer {
        device: 0,
        size: 1 << 20,
    };
    let allocated = Response::AllocBuffer {
        remote_ptr: RAW_BUFFER,
        remote_size: 1 << 20,
    };
    let set = Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: raw_f32(7, [8, 1, 1, 1], 0x800, "inp_pos"),
            cache_flag: 0,
            offset: 16,
        }),
        data: Bytes::from_static(&[1, 2, 3, 4, 5, 6, 7, 8]),
    };
    for version in VERSIONS {
        let dir = folder(version);
        out.push(valid_request(
            example(&format!("{dir}/device_count_request")),
            version,
            spec("§8"),
            "§8 byte example: DEVICE_COUNT request",
            &Request::DeviceCount,
        ));
        check_literal(
            "device_count",
            &request_frame(version, &Request::DeviceCount),
            literal::DEVICE_COUNT_REQUEST,
        );
        out.push(valid_response(
            example(&format!("{dir}/device_count_response")),
            version,
            spec("§8"),
            "§8 byte example: DEVICE_COUNT response, one device",
            &Request::DeviceCount,
            &Response::DeviceCount(1),
        ));
        check_literal(
            "device_count",
            &Response::DeviceCount(1).to_frame(),
            literal::DEVICE_COUNT_RESPONSE,
        );
        out.push(valid_request(
            example(&format!("{dir}/alloc_buffer_request")),
            version,
            spec("§8"),
            "§8 byte example: ALLOC_BUFFER request, device 0, 1 MiB",
            &alloc,
        ));
        check_literal(
            "alloc_buffer",
            &request_frame(version, &alloc),
            literal::ALLOC_BUFFER_REQUEST,
        );
        out.push(valid_response(
            example(&format!("{dir}/alloc_buffer_response")),
            version,
            spec("§8"),
            "§8 byte example: ALLOC_BUFFER response, handle (8) + size (8)",
            &alloc,
            &allocated,
        ));
        check_literal(
            "alloc_buffer",
            &allocated.to_frame(),
            literal::ALLOC_BUFFER_RESPONSE_HEAD,
        );
        let frame = request_frame(version, &set);
        check_literal("set_tensor", &frame, literal::SET_TENSOR_HEAD);
        check_literal(
            "set_tensor",
            &frame[9 + 296..],
            literal::SET_TENSOR_AFTER_RECORD,
        );
        assert_eq!(frame.len(), 9 + 313);
        out.push(valid_request(
            example(&format!("{dir}/set_tensor_request")),
            version,
            spec("§8"),
            "§8 byte example: SET_TENSOR of 8 bytes at offset 16 (size 313 = 305 + 8)",
            &set,
        ));
    }
    let recompute_v7 = Request::GraphRecompute { device: 1, uid: 0 };
    check_literal(
        "recompute_v7",
        &request_frame(V7, &recompute_v7),
        literal::GRAPH_RECOMPUTE_V7,
    );
    out.push(valid_request(
        example("v7/graph_recompute_request"),
        V7,
        spec("§8"),
        "§8 byte example: GRAPH_RECOMPUTE (7.0.0), device 1",
        &recompute_v7,
    ));
    let recompute_v8 = Request::GraphRecompute {
        device: 1,
        uid: 0x2a,
    };
    check_literal(
        "recompute_v8",
        &request_frame(V8, &recompute_v8),
        literal::GRAPH_RECOMPUTE_V8,
    );
    out.push(valid_request(
        example("v8/graph_recompute_request"),
        V8,
        spec("§8"),
        "§8 byte example: GRAPH_RECOMPUTE (8.x), device 1, uid 0x2A",
        &recompute_v8,
    ));
    let graph = Request::GraphCompute(Box::new(example_graph(7)));
    let frame = request_frame(V8, &graph);
    // "payload size = 20 + 16 + 1480 = 1516; layout device(4) uid(8) 02 00 00 00 id0(8) id1(8)
    // 05 00 00 00 rpc_tensor×5"
    assert_eq!(&frame[..9], &[10, 0xec, 5, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&frame[9 + 12..9 + 16], &[2, 0, 0, 0]);
    assert_eq!(&frame[9 + 32..9 + 36], &[5, 0, 0, 0]);
    assert_eq!(frame.len(), 9 + 1516);
    out.push(valid_request(example("v8/graph_compute_request"), V8, spec("§8"),
        "§8 byte example: GRAPH_COMPUTE (8.x) with 2 nodes and 5 tensors, payload 20 + 16 + 1480 = 1516 bytes", &graph));
}
