//! Writes the seed corpora under `fuzz/seeds/<target>/`.
//!
//! Run from `fuzz/`: `cargo run --example make_seeds` (no nightly flags needed). Every seed is
//! built with the input layout its target reads (see `proto_core_fuzz::*`), and is run through
//! the target's harness once here, so a broken seed fails the generator instead of silently
//! wasting fuzzing time.
//!
//! When `../tests/vectors/` holds JSON test vectors, seeds are also derived from them:
//! request frames become `round_trip` and `server_session` seeds, response frames `round_trip`
//! seeds, and session vectors `server_session` conversations (their `{placeholders}` bound from
//! this server's own replies, as the vector harness does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use proto_core::comm::CommError;
use proto_core::ggml::{flags as tflags, types::id, GgmlTable, Op};
use proto_core::tensor_cache::fnv1a64;
use proto_core::wire::{
    AllocSizeRequest, CommInitRequest, Command, Dialect, ProtocolVersion, Request, Response,
    RemoteCopyRequest, RpcTensor, SetTensorHeader, Tensor2dHeader, EXTENSION_REMOTE_COPY,
};
use proto_core_fuzz::boot::{BootInput, Garbage};
use proto_core_fuzz::client::{ClientInput, RequestShape};
use proto_core_fuzz::graph::sample_graph;
use proto_core_fuzz::mirror::{raw_request_selector, raw_response_selector, RESPONSE_COMMANDS};
use proto_core_fuzz::ranked::{self, Fault, RankedInput};
use proto_core_fuzz::server::{flag, Harness, ServerInput};
use proto_core_fuzz::{boot, client, graph, mirror, server, Splits};

struct Seeds {
    root: PathBuf,
    written: BTreeMap<&'static str, usize>,
}

impl Seeds {
    fn write(&mut self, target: &'static str, name: &str, bytes: &[u8]) {
        let dir = self.root.join(target);
        std::fs::create_dir_all(&dir).expect("create seed dir");
        std::fs::write(dir.join(name), bytes).expect("write seed");
        *self.written.entry(target).or_default() += 1;
    }
}

/// A client conversation with the fuzz harness's server, recording the byte stream.
struct Conversation {
    flags: u8,
    dialect: Dialect,
    harness: Harness,
    stream: Vec<u8>,
}

impl Conversation {
    fn new(flags: u8) -> Conversation {
        let dialect = if flags & flag::V8 != 0 { Dialect::V8 } else { Dialect::V7 };
        let mut conversation =
            Conversation { flags, dialect, harness: Harness::new(flags), stream: Vec::new() };
        let hello = conversation.send(&Request::Hello { caps: [0; 24] });
        assert_eq!(hello.len(), 36);
        conversation
    }

    fn send_bytes(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.stream.extend_from_slice(bytes);
        self.harness.feed(bytes)
    }

    fn send(&mut self, request: &Request) -> Vec<u8> {
        let frame = request.to_frame(self.dialect).expect("encodes");
        let out = self.send_bytes(&frame);
        assert!(!self.harness.failed(), "{request:?} failed while writing seeds");
        out
    }

    /// Allocates a buffer on device 0 and returns (handle, base).
    fn alloc(&mut self, size: u64) -> (u64, u64) {
        let out = self.send(&Request::AllocBuffer { device: 0, size });
        let handle = u64::from_le_bytes(out[8..16].try_into().unwrap());
        let out = self.send(&Request::BufferGetBase { buffer: handle });
        (handle, u64::from_le_bytes(out[8..16].try_into().unwrap()))
    }

    fn seed(self, splits: Splits) -> Vec<u8> {
        self.harness.finish();
        ServerInput { flags: self.flags, splits, stream: &self.stream }.encode()
    }
}

fn f32_tensor(id: u64, buffer: u64, data: u64, elements: u32) -> RpcTensor {
    let mut tensor = RpcTensor::contiguous(id, id::F32, [elements, 1, 1, 1]).unwrap();
    tensor.buffer = buffer;
    tensor.data = data;
    tensor
}

fn set_tensor(tensor: &RpcTensor, offset: u64, data: Vec<u8>, cache_flag: u8) -> Request {
    Request::SetTensor {
        header: Box::new(SetTensorHeader { tensor: tensor.clone(), cache_flag, offset }),
        data: Bytes::from(data),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn server_seeds(seeds: &mut Seeds) {
    // The everyday conversation: HELLO, queries, ALLOC, SET, GET, MEMSET, COPY, CLEAR, FREE.
    for (name, flags, splits) in [
        ("v8_hello_alloc_set_get", flag::V8, Splits::default()),
        ("v7_hello_alloc_set_get_split", 2 << flag::CHUNK_SHIFT, Splits(vec![0, 4, 299, 8])),
        ("v8_byte_by_byte_eof", flag::V8 | flag::EOF | (1 << flag::CHUNK_SHIFT), Splits(vec![0])),
    ] {
        let mut c = Conversation::new(flags);
        c.send(&Request::DeviceCount);
        c.send(&Request::GetAlignment { device: 0 });
        c.send(&Request::GetMaxSize { device: 1 });
        c.send(&Request::GetDeviceMemory { device: 0 });
        let (buffer, base) = c.alloc(4096);
        let a = f32_tensor(1, buffer, base, 64);
        let b = f32_tensor(2, buffer, base + 256, 64);
        c.send(&set_tensor(&a, 0, pattern(256, 1), 0));
        c.send(&Request::GetTensor { tensor: Box::new(a.clone()), offset: 8, size: 16 });
        c.send(&Request::MemsetTensor { tensor: Box::new(a.clone()), offset: 4, size: 8, value: 0xee });
        c.send(&Request::CopyTensor { src: Box::new(a.clone()), dst: Box::new(b.clone()) });
        c.send(&Request::GetTensor { tensor: Box::new(b.clone()), offset: 0, size: 256 });
        c.send(&Request::InitTensor { tensor: Box::new(b.clone()) });
        c.send(&Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: b.clone(),
            srcs: Default::default(),
        })));
        c.send(&Request::BufferClear { buffer, value: 0 });
        c.send(&Request::FreeBuffer { buffer });
        seeds.write("server_session", name, &c.seed(splits));
    }

    // The tensor cache: SET_TENSOR with the cache flag, then SET_TENSOR_HASH hit and miss.
    let mut c = Conversation::new(flag::V8 | flag::CACHE);
    let (buffer, base) = c.alloc(1024);
    let t = f32_tensor(1, buffer, base, 256);
    let data = pattern(1024, 3);
    let hash = fnv1a64(&data);
    c.send(&set_tensor(&t, 0, data, 1));
    let hit = c.send(&Request::SetTensorHash { tensor: Box::new(t.clone()), offset: 0, hash });
    assert_eq!(hit[8], 1);
    c.send(&Request::SetTensorHash { tensor: Box::new(t), offset: 0, hash: hash ^ 1 });
    seeds.write("server_session", "v8_tensor_cache", &c.seed(Splits(vec![100])));

    // 2D rows, delivered one byte per chunk.
    let mut c = Conversation::new(flag::V8 | (1 << flag::CHUNK_SHIFT));
    let (buffer, base) = c.alloc(4096);
    let t = f32_tensor(1, buffer, base, 256);
    let rows = Tensor2dHeader { tensor: t, offset: 16, size: 8, n_copies: 3, stride: 32 };
    c.send(&Request::SetTensor2d { header: Box::new(rows.clone()), data: Bytes::from(vec![7u8; 24]) });
    c.send(&Request::GetTensor2d(Box::new(rows)));
    seeds.write("server_session", "v8_set_get_2d", &c.seed(Splits::default()));

    // GRAPH_COMPUTE and GRAPH_RECOMPUTE, both dialects.
    for (name, flags) in [("v8_graph_compute_recompute", flag::V8), ("v7_graph_compute_recompute", 0)] {
        let mut c = Conversation::new(flags);
        let (buffer, base) = c.alloc(8192);
        let request = sample_graph(c.dialect, 2, buffer, base);
        let uid = request.uid;
        c.send(&Request::GraphCompute(Box::new(request)));
        c.send(&Request::GraphRecompute { device: 0, uid });
        c.send(&Request::FreeBuffer { buffer });
        seeds.write("server_session", name, &c.seed(Splits(vec![500, 20])));
    }

    // Graph limits: three nodes where two are allowed.
    let mut c = Conversation::new(flag::V8 | flag::SMALL_GRAPHS);
    let (buffer, base) = c.alloc(8192);
    c.send_bytes(&Request::GraphCompute(Box::new(sample_graph(Dialect::V8, 1, buffer, base))).to_frame(Dialect::V8).unwrap());
    assert!(c.harness.failed());
    seeds.write("server_session", "v8_graph_over_limits", &c.seed(Splits::default()));

    // The comm commands (the link itself is simulated as succeeding).
    let mut c = Conversation::new(flag::V8 | flag::COMM_OK);
    let (buffer, base) = c.alloc(1024);
    let mut host = [0u8; 64];
    host[..9].copy_from_slice(b"127.0.0.1");
    let refused = c.send(&Request::CommInit(Box::new(CommInitRequest {
        device: 0,
        rank: 0,
        world: 1,
        port: 50052,
        host,
    })));
    assert_eq!(refused[8], 0);
    let ok = c.send(&Request::CommInit(Box::new(CommInitRequest {
        device: 0,
        rank: 1,
        world: 2,
        port: 50052,
        host,
    })));
    assert_eq!(ok[8], 1);
    c.send(&Request::CommAllreduce { device: 0, tensor: Box::new(f32_tensor(1, buffer, base, 64)) });
    c.send(&Request::CommFree { device: 0 });
    seeds.write("server_session", "v8_comm_init_allreduce_free", &c.seed(Splits::default()));

    // Our remote-copy extension: negotiated, a ticket, a copy (its peer is unreachable in the
    // harness), an attach refused (this connection holds buffers).
    let mut c = Conversation::new(flag::V8);
    let granted = c.send(&Request::Extensions { wanted: EXTENSION_REMOTE_COPY });
    assert_eq!(granted[8], 1);
    let (buffer, base) = c.alloc(4096);
    let tensor = f32_tensor(1, buffer, base, 1024);
    let expect = c.send(&Request::RemoteCopyExpect(Box::new(Tensor2dHeader {
        tensor: tensor.clone(),
        offset: 0,
        size: 4096,
        n_copies: 1,
        stride: 0,
    })));
    assert_eq!(expect[8], 0);
    // Tickets are random: the seed uses a fixed one (the copy fails before B sees it).
    let ticket = 1;
    let copy = c.send(&Request::RemoteCopyTensor(Box::new(RemoteCopyRequest {
        src: tensor.clone(),
        src_offset: 0,
        size: 1024,
        n_copies: 4,
        src_stride: 1024,
        dst: tensor,
        dst_offset: 0,
        dst_stride: 1024,
        ticket,
        endpoint: RemoteCopyRequest::endpoint_field("127.0.0.1:50052").unwrap(),
    })));
    assert_eq!(copy[8], 2);
    let attach =
        c.send(&Request::RemoteCopyAttach { ticket, buffer, start: base, size: 4096, n_copies: 1, stride: 0 });
    assert_eq!(attach[8], 6);
    seeds.write("server_session", "v8_remote_copy", &c.seed(Splits::default()));
    // The extension's ids without EXTENSIONS.
    let mut c = Conversation::new(flag::V8);
    c.send_bytes(
        &Request::RemoteCopyAttach { ticket: 1, buffer: 1, start: 0, size: 0, n_copies: 1, stride: 0 }
            .to_frame(Dialect::V8)
            .unwrap(),
    );
    assert!(c.harness.failed());
    seeds.write("server_session", "v8_remote_copy_not_negotiated", &c.seed(Splits::default()));

    // A quota hit.
    let mut c = Conversation::new(flag::V8 | flag::QUOTA);
    c.alloc(512 << 10);
    c.send_bytes(&Request::AllocBuffer { device: 0, size: 1 << 20 }.to_frame(Dialect::V8).unwrap());
    assert!(c.harness.failed());
    seeds.write("server_session", "v8_quota_exceeded", &c.seed(Splits::default()));

    // Errors at the door and in the middle of a stream.
    let mut c = Conversation::new(flag::V8 | flag::EOF);
    let (buffer, base) = c.alloc(4096);
    let frame = set_tensor(&f32_tensor(1, buffer, base, 1024), 0, vec![1; 1000], 0)
        .to_frame(Dialect::V8)
        .unwrap();
    c.send_bytes(&frame[..frame.len() - 990]);
    seeds.write("server_session", "v8_eof_mid_set_tensor", &c.seed(Splits(vec![3])));
    let first = Request::DeviceCount.to_frame(Dialect::V8).unwrap();
    seeds.write(
        "server_session",
        "hello_expected",
        &ServerInput { flags: flag::V8, splits: Splits::default(), stream: &first }.encode(),
    );
}

fn fake_reply(command: Command, len: u64, version: ProtocolVersion) -> Vec<u8> {
    let response = match command {
        Command::Hello => Response::Hello { version, flags: 0, caps: [0; 24] },
        Command::DeviceCount => Response::DeviceCount(2),
        Command::AllocBuffer => Response::AllocBuffer { remote_ptr: 0x9e37_79b9_7f4a_7c15, remote_size: 4096 },
        Command::GetAlignment => Response::Alignment(32),
        Command::GetMaxSize => Response::MaxSize(1 << 30),
        Command::BufferGetBase => Response::BufferBase(0x1000_0000_0000),
        Command::SetTensorHash => Response::SetTensorHash(1),
        Command::GetTensor => Response::TensorData(Bytes::from(pattern(len as usize, 5))),
        Command::CopyTensor => Response::CopyTensor(1),
        Command::GetDeviceMemory => Response::DeviceMemory { free: 1 << 29, total: 1 << 30 },
        Command::GetAllocSize => Response::AllocSize(256),
        Command::GetTensor2d => Response::Tensor2dData(Bytes::from(pattern(len as usize, 6))),
        Command::CommInit => Response::CommInit(1),
        other => panic!("{other:?} has no response"),
    };
    response.to_frame().to_vec()
}

/// Replies a well-behaved server would send to `requests` (HELLO first).
fn replies(version: ProtocolVersion, server: ProtocolVersion, requests: &[RequestShape]) -> Vec<u8> {
    let dialect = version.dialect().unwrap();
    let mut out = fake_reply(Command::Hello, 28, server);
    for shape in requests {
        let request = shape.to_request();
        let command = request.command();
        if !command.exists_in(dialect) || !command.has_response() {
            continue;
        }
        let len = match &request {
            Request::GetTensor { size, .. } => *size,
            Request::GetTensor2d(header) => match header.data_len(command) {
                Ok(len) => len,
                Err(_) => continue,
            },
            _ => command.fixed_response_size().unwrap(),
        };
        if len > 1 << 20 {
            // Huge replies are written by hand (header only).
            break;
        }
        out.extend(fake_reply(command, len, server));
    }
    out
}

fn client_seeds(seeds: &mut Seeds) {
    use RequestShape::*;
    let every = vec![
        DeviceCount,
        AllocBuffer { device: 0, size: 4096 },
        GetAlignment { device: 0 },
        GetMaxSize { device: 1 },
        GetDeviceMemory { device: 0 },
        BufferGetBase { buffer: 0x9e37_79b9_7f4a_7c15 },
        SetTensor { len: 16 },
        SetTensorHash { hash: 42 },
        GetTensor { offset: 0, size: 16 },
        CopyTensor,
        GetAllocSize,
        GraphCompute { n: 2, uid: 7 },
        GraphRecompute { uid: 7 },
        SetTensor2d { size: 4, n_copies: 2 },
        GetTensor2d { size: 4, n_copies: 3 },
        CommInit { rank: 1, world: 2 },
    ];
    let cases: Vec<(&str, u8, u8, Vec<RequestShape>, Splits)> = vec![
        ("v8_pipelined_everything", 1, 1, every.clone(), Splits::default()),
        ("v8_pipelined_small_pieces", 1, 1, every.clone(), Splits(vec![0, 1, 6, 30])),
        ("v7_pipelined", 0, 0, every[..12].to_vec(), Splits(vec![2])),
        ("v8_client_v7_server", 1, 0, vec![DeviceCount], Splits::default()),
        ("v8_huge_get_tensor", 1, 1, vec![GetTensorHuge { size: u64::MAX - 7 }], Splits::default()),
        ("v8_newer_minor_refused", 1, 3, vec![], Splits::default()),
    ];
    for (name, version, server_minor_or_major, requests, splits) in cases {
        let input = ClientInput { version, requests: requests.clone(), splits: splits.clone(), replies: &[] };
        let ours = input.protocol_version();
        let server = match (name, server_minor_or_major) {
            ("v8_client_v7_server", _) => ProtocolVersion::V7_0_0,
            ("v8_newer_minor_refused", minor) => ProtocolVersion { major: 8, minor, patch: 0 },
            _ => ours,
        };
        let mut reply = replies(ours, server, &requests);
        if name == "v8_huge_get_tensor" {
            reply.extend((u64::MAX - 7).to_le_bytes());
            reply.extend([0u8; 64]);
        }
        let bytes = ClientInput { replies: &reply, ..input }.encode();
        seeds.write("client_session", name, &bytes);
    }
    // Truncated and unsolicited replies.
    let reply = replies(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, &every);
    let input = ClientInput { version: 1, requests: every.clone(), splits: Splits(vec![9]), replies: &reply[..reply.len() - 5] };
    seeds.write("client_session", "v8_truncated", &input.encode());
    let mut reply = replies(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, &[]);
    reply.extend(fake_reply(Command::DeviceCount, 4, ProtocolVersion::V8_0_0));
    let input = ClientInput { version: 1, requests: vec![], splits: Splits::default(), replies: &reply };
    seeds.write("client_session", "v8_unsolicited", &input.encode());
}

/// `graph_compute` seeds: graphs each op family accepts (one whose ids come from the noise,
/// which the kernel must refuse at run time).
fn compute_seeds(seeds: &mut Seeds) {
    use proto_core_fuzz::compute::{ComputeInput, TensorSpec};
    // TYPES indices
    let (f32_, f16_, i32_, q8_0, q4_0) = (0u8, 1u8, 3u8, 5u8, 6u8);
    let leaf = |ty: u8, ne: [u8; 4], offset: u16| TensorSpec { op: 0, ty, ne, layout: 0, offset, srcs: [0; 4], params: [0; 16] };
    let node = |op: Op, ty: u8, ne: [u8; 4], offset: u16, srcs: [u8; 4], params: [i32; 16]| TensorSpec {
        op: (op.0 + 1) as u8,
        ty,
        ne,
        layout: 0,
        offset,
        srcs,
        params,
    };
    let f = |v: f32| v.to_bits() as i32;
    let mut rope = [0i32; 16];
    rope[1] = 32;
    rope[4] = 512;
    rope[5] = f(10000.0);
    rope[6] = f(1.0);
    rope[8] = f(1.0);
    rope[9] = f(32.0);
    rope[10] = f(1.0);
    let mut softmax = [0i32; 16];
    softmax[0] = f(0.5);
    let graphs: Vec<(&str, Vec<TensorSpec>)> = vec![
        ("mul_mat_f32", vec![leaf(f32_, [32, 4, 1, 1], 0), leaf(f32_, [32, 3, 1, 1], 64), node(Op::MUL_MAT, f32_, [4, 3, 1, 1], 128, [1, 2, 0, 0], [0; 16])]),
        ("mul_mat_q4_0", vec![leaf(q4_0, [1, 4, 1, 1], 0), leaf(f32_, [32, 3, 1, 1], 64), node(Op::MUL_MAT, f32_, [4, 3, 1, 1], 128, [1, 2, 0, 0], [0; 16])]),
        ("soft_max", vec![leaf(f32_, [32, 4, 1, 1], 0), node(Op::SOFT_MAX, f32_, [32, 4, 1, 1], 64, [1, 0, 0, 0], softmax)]),
        ("rope", vec![leaf(f32_, [32, 2, 3, 1], 0), leaf(i32_, [3, 1, 1, 1], 64), node(Op::ROPE, f32_, [32, 2, 3, 1], 128, [1, 2, 0, 0], rope)]),
        ("ssm_conv", vec![leaf(f32_, [7, 8, 1, 1], 0), leaf(f32_, [4, 8, 1, 1], 64), node(Op::SSM_CONV, f32_, [8, 4, 1, 1], 128, [1, 2, 0, 0], [0; 16])]),
        ("cpy_f32_f16_then_add", vec![leaf(f32_, [32, 4, 1, 1], 0), node(Op::CPY, f16_, [32, 4, 1, 1], 64, [1, 0, 0, 0], [0; 16]), node(Op::ADD, f32_, [32, 4, 1, 1], 128, [1, 1, 0, 0], [0; 16])]),
        ("get_rows_q8_0_refused_ids", vec![leaf(q8_0, [1, 5, 1, 1], 0), leaf(i32_, [3, 1, 1, 1], 64), node(Op::GET_ROWS, f32_, [32, 3, 1, 1], 128, [1, 2, 0, 0], [0; 16])]),
    ];
    for (name, tensors) in graphs {
        let input = ComputeInput { threads: 1, fill: 0x5eed, tensors };
        seeds.write("graph_compute", name, &input.encode());
    }
}

fn graph_seeds(seeds: &mut Seeds) {
    let (handle, base, _) = graph::BUFFERS[0];
    for (name, dialect, trailing) in [
        ("raw_v8_valid", Dialect::V8, 0),
        ("raw_v7_valid", Dialect::V7, 0),
        ("raw_v8_trailing_bytes", Dialect::V8, 5),
    ] {
        let request = sample_graph(dialect, 3, handle, base);
        let mut payload = bytes::BytesMut::new();
        request.encode(dialect, &mut payload);
        payload.extend_from_slice(&vec![0xab; trailing]);
        let mode = if dialect == Dialect::V8 { graph::mode::V8 } else { 0 };
        let mut bytes = vec![mode];
        bytes.extend_from_slice(&payload);
        seeds.write("graph_decode", name, &bytes);
    }
    // A view and a node whose source is a later node: decodes, then fails validation.
    let mut request = sample_graph(Dialect::V8, 2, handle, base);
    request.node_ids.reverse();
    let mut view = f32_tensor(1000, handle, base + 16, 4);
    view.op = Op::VIEW.0;
    view.view_src = request.tensors[0].id;
    view.view_offs = 16;
    view.flags = tflags::COMPUTE;
    request.tensors.push(view);
    let mut payload = bytes::BytesMut::new();
    request.encode(Dialect::V8, &mut payload);
    seeds.write("graph_decode", "raw_v8_nodes_out_of_order", &[&[graph::mode::V8][..], &payload].concat());
    // Counts larger than the payload.
    seeds.write("graph_decode", "raw_v7_counts_too_large", &[0, 0, 0, 0, 0, 255, 255, 255, 255, 1, 2, 3]);
    // Protocol 8.0.1: ggml's newer op and type numbering (mode bit V8_0_1 selects its table).
    let v8_0_1 = graph::mode::V8 | graph::mode::V8_0_1;
    let encode = |request: &proto_core::wire::GraphComputeRequest, mode: u8| {
        let mut payload = bytes::BytesMut::new();
        request.encode(Dialect::V8, &mut payload);
        [&[mode][..], &payload].concat()
    };
    // The sample graph with its ops renumbered for 8.0.1 (UNARY 91 -> 92): still valid.
    let mut renumbered = sample_graph(Dialect::V8, 3, handle, base);
    for t in &mut renumbered.tensors {
        let op = GgmlTable::V8_0_0.op_from_wire(t.op).expect("an 8.0.0 op");
        t.op = GgmlTable::V8_0_1.op_to_wire(op).expect("an 8.0.1 op");
    }
    seeds.write("graph_decode", "raw_v8_0_1_valid", &encode(&renumbered, v8_0_1));
    // Every moved op id and an f8_e4m3 weight: valid for 8.0.1, refused by 8.0.0's table.
    let moved = graph::moved_ops_graph(handle, base);
    seeds.write("graph_decode", "raw_v8_0_1_moved_ops", &encode(&moved, v8_0_1));
    seeds.write("graph_decode", "raw_v8_0_0_moved_ops_refused", &encode(&moved, graph::mode::V8));
    let f8 = graph::f8_graph(handle, base);
    seeds.write("graph_decode", "raw_v8_0_1_f8_e4m3", &encode(&f8, v8_0_1));
    seeds.write("graph_decode", "raw_v8_0_0_f8_e4m3_refused", &encode(&f8, graph::mode::V8));
    // Structured inputs: any bytes describe some graph.
    for (name, seed) in [("structured_v8_a", 11u8), ("structured_v7_b", 97), ("structured_v8_0_1_c", 53)] {
        let mode = graph::mode::STRUCTURED
            | if name.contains("v8") { graph::mode::V8 } else { 0 }
            | if name.contains("v8_0_1") { graph::mode::V8_0_1 } else { 0 };
        let mut bytes = vec![mode];
        bytes.extend(pattern(300, seed).iter().map(|b| b % 13));
        seeds.write("graph_decode", name, &bytes);
    }
}

fn boot_seeds(seeds: &mut Seeds) {
    let honest = |world: u32, size: usize, schedule: Vec<u8>| BootInput {
        world,
        size,
        salt: 0x5a,
        garbage: Garbage::None,
        a: 0,
        b: 0,
        len: 0,
        bytes: vec![0],
        schedule,
    };
    let cases = [
        ("honest_w2_s1", honest(2, 1, vec![])),
        ("honest_w3_s0", honest(3, 0, vec![])),
        ("honest_w4_s16_interleaved", honest(4, 16, (0..64).map(|i| (i * 37 % 251) as u8).collect())),
        ("honest_w8_s64_byte_pieces", honest(8, 64, (0..200).map(|i| if i % 2 == 1 { 0 } else { i as u8 }).collect())),
        ("honest_w8_nccl_sized", honest(8, 64, vec![])),
        (
            "extra_from_peer",
            BootInput { garbage: Garbage::ExtraFromPeer, a: 1, len: 2, bytes: vec![1, 2, 3], ..honest(3, 8, vec![0, 3, 1, 200]) },
        ),
        (
            "wrong_sender_root",
            BootInput { garbage: Garbage::WrongSender, a: 0, b: 1, len: 1, bytes: vec![9, 9], ..honest(4, 4, vec![]) },
        ),
        (
            "early_close_leaf",
            BootInput { garbage: Garbage::EarlyClose, a: 2, b: 0, len: 0, bytes: vec![0], ..honest(3, 5, vec![]) },
        ),
        (
            "surplus_from_root",
            BootInput { garbage: Garbage::SurplusFromRoot, a: 0, len: 3, bytes: vec![7, 7, 7, 7], ..honest(2, 6, vec![1, 1, 0, 255]) },
        ),
    ];
    for (name, input) in cases {
        let bytes = input.encode();
        assert_eq!(BootInput::parse(&bytes), input, "{name} layout");
        let outcome = boot::run(&bytes);
        if input.garbage == Garbage::None {
            assert!(outcome.all_done, "{name}");
        }
        seeds.write("bootstrap", name, &bytes);
    }
    ranked_seeds(seeds);
}

/// Ranked-mode seeds: every fault, named after the outcome `tests/seeds.rs` asserts.
fn ranked_seeds(seeds: &mut Seeds) {
    let base = |world: u32, votes: u8| RankedInput {
        world,
        votes,
        salt: 0x3c,
        fault: Fault::None,
        a: 0,
        b: 0,
        c: 0,
        bytes: vec![],
        arrival: vec![0; world as usize - 1],
        schedule: vec![],
    };
    let with = |input: RankedInput, fault: Fault, a: u8, b: u8, c: u8, bytes: Vec<u8>| {
        let mut input = RankedInput { fault, a, b, c, bytes, ..input };
        if fault == Fault::Stranger {
            input.arrival.push(0);
        }
        input
    };
    // A stranger speaking the protocol: caps, rank, vote, 14-byte block.
    let impostor = |rank: u32, len: usize| {
        let mut bytes = vec![0x11; 24];
        bytes.extend_from_slice(&rank.to_le_bytes());
        bytes.push(1);
        bytes.extend_from_slice(&ranked::comm_block(rank + 100, 7));
        bytes.truncate(len);
        bytes
    };
    let interleaved: Vec<u8> = (0..120).map(|i| (i * 53 % 251) as u8).collect();
    let byte_pieces: Vec<u8> = (0..800).map(|i| if i % 2 == 1 { 0 } else { (i / 2 % 7) as u8 }).collect();
    let mut cases = vec![
        ("ranked_honest_w2_comm", base(2, 0xff)),
        ("ranked_honest_w2_pairwise", base(2, 0b01)),
        ("ranked_honest_w3_vote_no_fails", base(3, 0b011)),
        ("ranked_honest_w5_reverse_arrival", RankedInput { arrival: vec![3, 2, 1, 0], schedule: interleaved.clone(), ..base(5, 0xff) }),
        ("ranked_honest_w8_byte_pieces", RankedInput { arrival: vec![5, 1, 4, 0, 2, 1, 0], schedule: byte_pieces, ..base(8, 0xff) }),
        ("ranked_honest_w6_pairwise_refused", RankedInput { schedule: interleaved.clone(), ..base(6, 0b101111) }),
        // Stranger: arrival [2, ..] queues it first (connections 0, 1 are ranks 1, 2).
        ("ranked_stranger_short_closed", RankedInput { arrival: vec![2, 0, 0], ..with(base(3, 0xff), Fault::Stranger, 0, 0, 0, vec![0xee; 10]) }),
        ("ranked_stranger_rank_out_of_range", RankedInput { arrival: vec![2, 0, 0], ..with(base(3, 0xff), Fault::Stranger, 0, 0, 0, impostor(9, 28)) }),
        ("ranked_stranger_duplicate_rank", RankedInput { arrival: vec![0, 1, 0], ..with(base(3, 0xff), Fault::Stranger, 0, 0, 0, impostor(1, 40)) }),
        ("ranked_stranger_last_ignored", RankedInput { arrival: vec![0, 0, 0], ..with(base(3, 0xff), Fault::Stranger, 0, 0, 0, vec![0xee; 50]) }),
        ("ranked_stranger_stops_after_rank", RankedInput { arrival: vec![2, 0, 0], ..with(base(3, 0xff), Fault::Stranger, 0, 0, 0, impostor(2, 28)) }),
        ("ranked_stranger_impersonates", RankedInput { arrival: vec![2, 0, 0], schedule: interleaved.clone(), ..with(base(3, 0xff), Fault::Stranger, 0, 0, 0, impostor(2, 43)) }),
        // Bad rank from peer 1 + a % (world − 1).
        ("ranked_bad_rank_zero", with(base(4, 0xff), Fault::BadRank, 1, 0, 0, vec![])),
        ("ranked_bad_rank_duplicate", RankedInput { arrival: vec![2, 1, 0], ..with(base(4, 0xff), Fault::BadRank, 0, 1, 0, vec![]) }),
        ("ranked_bad_rank_out_of_range", with(base(2, 0xff), Fault::BadRank, 0, 2, 255, vec![])),
        // World mismatch of peer 1 (a = 0): b = 2 → W' = 6 at world 3, b = 6 → W' = 3 at world 4.
        ("ranked_world_mismatch_out_of_range", with(base(3, 0xff), Fault::WorldMismatch, 0, 2, 7, vec![])),
        ("ranked_world_mismatch_duplicate", with(base(3, 0xff), Fault::WorldMismatch, 0, 2, 3, vec![])),
        ("ranked_world_mismatch_larger_times_out", with(base(3, 0xff), Fault::WorldMismatch, 0, 2, 0, vec![])),
        ("ranked_world_mismatch_smaller_undetected", with(base(4, 0xff), Fault::WorldMismatch, 0, 6, 0, vec![])),
        // Injection on peer 1's connection (b: bit 0 towards the peer, bit 1 the communicator's exchange).
        ("ranked_inject_peer_vote_agreed", with(base(2, 0xff), Fault::Inject, 0, 0, 0, vec![0, 9, 9])),
        ("ranked_inject_peer_comm_agreed", RankedInput { schedule: interleaved.clone(), ..with(base(3, 0xff), Fault::Inject, 0, 2, 0, vec![0xab; 5]) }),
        ("ranked_inject_root_vote_fails", with(base(3, 0xff), Fault::Inject, 0, 1, 0, vec![0])),
        ("ranked_inject_root_vote_times_out", with(base(2, 0xff), Fault::Inject, 0, 1, 0, vec![0])),
        ("ranked_inject_root_comm_misleads", with(base(2, 0xff), Fault::Inject, 0, 3, 0, vec![1, 2, 3])),
        ("ranked_crash_root_at_start", with(base(4, 0xff), Fault::Crash, 0, 0, 0, vec![])),
        ("ranked_crash_never", with(base(3, 0xff), Fault::Crash, 1, 255, 0, vec![])),
    ];
    // Crashes of peer 1 at the first step that leaves rank 0 with each error.
    let world = 3;
    let mut found = [None, None, None];
    for step in 0..=255u8 {
        let input = with(base(world, 0xff), Fault::Crash, 1, step, 0, vec![]);
        let outcome = ranked::run(&input.encode());
        let slot = match &outcome.ends[0] {
            ranked::End::Failed(CommError::ConnectionClosed { peer: None }) => 0,
            ranked::End::Failed(CommError::ConnectionClosed { peer: Some(1) }) => 1,
            ranked::End::Communicator { .. } if outcome.ends[1] == ranked::End::Crashed => 2,
            _ => continue,
        };
        found[slot].get_or_insert(input);
    }
    let [before_rank, in_exchange, after_block] = found;
    cases.push(("ranked_crash_peer_before_rank", before_rank.expect("a crash before the rank")));
    cases.push(("ranked_crash_peer_in_exchange", in_exchange.expect("a crash in an exchange")));
    cases.push(("ranked_crash_peer_after_last_block", after_block.expect("a crash after the last block")));
    for (name, input) in cases {
        let bytes = input.encode();
        assert_eq!(RankedInput::parse(&bytes), input, "{name} layout");
        ranked::run(&bytes);
        seeds.write("bootstrap", name, &bytes);
    }
}

fn sample_requests(dialect: Dialect) -> Vec<Request> {
    let t = f32_tensor(1, 0x9e37_79b9_7f4a_7c15, 0x1000_0000_0000, 64);
    let bt = || Box::new(t.clone());
    let mut host = [0u8; 64];
    host[..9].copy_from_slice(b"10.0.0.17");
    let (handle, base, _) = graph::BUFFERS[0];
    vec![
        Request::Hello { caps: [0; 24] },
        Request::DeviceCount,
        Request::AllocBuffer { device: 0, size: 4096 },
        Request::GetAlignment { device: 0 },
        Request::GetMaxSize { device: 0 },
        Request::BufferGetBase { buffer: t.buffer },
        Request::FreeBuffer { buffer: t.buffer },
        Request::BufferClear { buffer: t.buffer, value: 0 },
        set_tensor(&t, 0, pattern(32, 1), 0),
        Request::SetTensorHash { tensor: bt(), offset: 0, hash: 0xcbf2_9ce4_8422_2325 },
        Request::GetTensor { tensor: bt(), offset: 0, size: 256 },
        Request::CopyTensor { src: bt(), dst: bt() },
        Request::GraphCompute(Box::new(sample_graph(dialect, 1, handle, base))),
        Request::GetDeviceMemory { device: 1 },
        Request::InitTensor { tensor: bt() },
        Request::GetAllocSize(Box::new(AllocSizeRequest { device: 0, tensor: t.clone(), srcs: Default::default() })),
        Request::GraphRecompute { device: 0, uid: if dialect == Dialect::V8 { 42 } else { 0 } },
        Request::MemsetTensor { tensor: bt(), offset: 0, size: 16, value: 1 },
        Request::SetTensor2d {
            header: Box::new(Tensor2dHeader { tensor: t.clone(), offset: 0, size: 4, n_copies: 2, stride: 16 }),
            data: Bytes::from(vec![1u8; 8]),
        },
        Request::GetTensor2d(Box::new(Tensor2dHeader { tensor: t.clone(), offset: 0, size: 4, n_copies: 2, stride: 16 })),
        Request::CommInit(Box::new(CommInitRequest { device: 0, rank: 1, world: 2, port: 50052, host })),
        Request::CommAllreduce { device: 0, tensor: bt() },
        Request::CommFree { device: 0 },
    ]
}

fn round_trip_seeds(seeds: &mut Seeds) {
    for dialect in [Dialect::V7, Dialect::V8] {
        for request in sample_requests(dialect) {
            if !request.command().exists_in(dialect) {
                continue;
            }
            let frame = request.to_frame(dialect).unwrap();
            let mut bytes = vec![raw_request_selector(dialect)];
            bytes.extend_from_slice(&frame);
            let name = format!("req_{}_{:?}", if dialect == Dialect::V8 { "v8" } else { "v7" }, request.command());
            seeds.write("round_trip", &name, &bytes);
        }
    }
    for command in RESPONSE_COMMANDS {
        let len = match command {
            Command::GetTensor => 16,
            Command::GetTensor2d => 8,
            _ => command.fixed_response_size().unwrap(),
        };
        let mut bytes = vec![raw_response_selector(command)];
        bytes.extend(fake_reply(command, len, ProtocolVersion::V8_0_0));
        seeds.write("round_trip", &format!("resp_{command:?}"), &bytes);
    }
    // Typed modes read any bytes.
    for (name, selector) in [("typed_request_v8", mirror::mode::REQUEST | mirror::mode::V8), ("typed_response", mirror::mode::RESPONSE)] {
        let mut bytes = vec![selector];
        bytes.extend(pattern(400, 17));
        seeds.write("round_trip", name, &bytes);
    }
}

// ---------------------------------------------------------------------------------------------
// Seeds from the JSON test vectors (format: tests/vectors/README.md).

enum Piece {
    Bytes(Vec<u8>),
    Value(String, i64),
    Any,
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

fn template(text: &str) -> Option<Vec<Piece>> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let open = rest.find('{').unwrap_or(rest.len());
        if open > 0 {
            pieces.push(Piece::Bytes(hex_decode(&rest[..open])?));
        }
        rest = &rest[open..];
        if rest.is_empty() {
            break;
        }
        let close = rest.find('}')?;
        let body = &rest[1..close];
        rest = &rest[close + 1..];
        if body == "_" {
            pieces.push(Piece::Any);
            continue;
        }
        let split = body.find(['+', '-']).unwrap_or(body.len());
        let (name, offset) = body.split_at(split);
        let offset = match offset.chars().next() {
            None => 0,
            Some(sign) => {
                let magnitude: i64 = offset[1..].parse().ok()?;
                if sign == '-' { -magnitude } else { magnitude }
            }
        };
        pieces.push(Piece::Value(name.to_owned(), offset));
    }
    Some(pieces)
}

fn render(pieces: &[Piece], bindings: &BTreeMap<String, u64>) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Bytes(bytes) => out.extend_from_slice(bytes),
            Piece::Value(name, offset) => {
                let value = bindings.get(name).copied().unwrap_or(0).wrapping_add(*offset as u64);
                out.extend(value.to_le_bytes());
            }
            Piece::Any => out.extend([0u8; 8]),
        }
    }
    out
}

/// Binds the names an expected reply captures from what this server actually wrote.
fn capture(pieces: &[Piece], actual: &[u8], bindings: &mut BTreeMap<String, u64>) {
    let mut at = 0;
    for piece in pieces {
        match piece {
            Piece::Bytes(bytes) => at += bytes.len(),
            Piece::Any => at += 8,
            Piece::Value(name, offset) => {
                if let Some(raw) = actual.get(at..at + 8) {
                    let value = u64::from_le_bytes(raw.try_into().unwrap()).wrapping_sub(*offset as u64);
                    bindings.entry(name.clone()).or_insert(value);
                }
                at += 8;
            }
        }
    }
}

fn command_named(name: &str) -> Option<Command> {
    let wanted: String = name.trim_start_matches("RPC_CMD_").chars().filter(|c| *c != '_').collect();
    Command::ALL.into_iter().find(|c| format!("{c:?}").eq_ignore_ascii_case(&wanted))
}

fn vector_seeds(seeds: &mut Seeds, dir: &Path) -> usize {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut used = 0;
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let Ok(vector) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        let field = |key: &str| vector.get(key).and_then(|v| v.as_str()).unwrap_or("");
        let dialect = match field("protocol") {
            "7.0.0" => Dialect::V7,
            "8.0.0" | "8.0.1" => Dialect::V8,
            _ => continue,
        };
        // The server_session harness speaks 8.0.0 (its flag byte has no bit left for 8.0.1), so
        // 8.0.1 sessions would be refused at their first moved op: their frames seed round_trip
        // and, through the frame vectors, server_session; the graphs reach graph_decode via
        // graph_seeds.
        let v801 = field("protocol") == "8.0.1";
        let v8 = if dialect == Dialect::V8 { flag::V8 } else { 0 };
        let name = format!("vec_{}", field("name").replace(['/', ' '], "_"));
        match (field("level"), field("direction")) {
            ("frame", "client_to_server") => {
                let Some(frame) = hex_decode(field("hex")) else { continue };
                seeds.write("round_trip", &name, &[&[raw_request_selector(dialect)][..], &frame].concat());
                let mut stream = Request::Hello { caps: [0; 24] }.to_frame(dialect).unwrap().to_vec();
                if frame.first() == Some(&Command::Hello.id()) {
                    stream.clear();
                }
                stream.extend_from_slice(&frame);
                let input = ServerInput { flags: v8, splits: Splits::default(), stream: &stream };
                seeds.write("server_session", &name, &input.encode());
                used += 1;
            }
            ("frame", "server_to_client") => {
                let Some(frame) = hex_decode(field("hex")) else { continue };
                let command = vector
                    .get("request")
                    .and_then(|r| r.get("command"))
                    .and_then(|c| c.as_str())
                    .or(vector.get("command").and_then(|c| c.as_str()))
                    .and_then(command_named);
                let Some(command) = command.filter(|c| c.has_response()) else { continue };
                seeds.write("round_trip", &name, &[&[raw_response_selector(command)][..], &frame].concat());
                used += 1;
            }
            ("session", _) if v801 => {}
            ("session", _) => {
                let server = vector.get("server");
                let flag_if = |key: &str, bit: u8| {
                    let set = server.and_then(|s| s.get(key)).is_some_and(|v| !v.is_null() && v != &serde_json::Value::Bool(false));
                    if set { bit } else { 0 }
                };
                let final_step = vector.get("final");
                let eof = final_step.and_then(|f| f.get("eof")).and_then(|e| e.as_bool()).unwrap_or(false);
                let flags = v8 | flag_if("tensor_cache", flag::CACHE) | flag_if("memory_quota", flag::QUOTA)
                    | if eof { flag::EOF } else { 0 };
                let mut harness = Harness::new(flags);
                let mut stream = Vec::new();
                let mut bindings = BTreeMap::new();
                let steps = vector.get("steps").and_then(|s| s.as_array()).cloned().unwrap_or_default();
                let mut ok = true;
                for step in &steps {
                    let send = step.get("send").and_then(|s| s.as_str()).and_then(template);
                    let expect = step.get("expect").and_then(|s| s.as_str()).and_then(template);
                    let (Some(send), Some(expect)) = (send, expect) else { ok = false; break };
                    let bytes = render(&send, &bindings);
                    stream.extend_from_slice(&bytes);
                    let out = harness.feed(&bytes);
                    capture(&expect, &out, &mut bindings);
                }
                if let Some(send) = final_step.and_then(|f| f.get("send")).and_then(|s| s.as_str()).and_then(template) {
                    let bytes = render(&send, &bindings);
                    stream.extend_from_slice(&bytes);
                    harness.feed(&bytes);
                }
                harness.finish();
                if !ok {
                    continue;
                }
                let input = ServerInput { flags, splits: Splits::default(), stream: &stream };
                seeds.write("server_session", &name, &input.encode());
                used += 1;
            }
            _ => {}
        }
    }
    used
}

fn main() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Usage: make_seeds [VECTORS_DIR [SEEDS_DIR]]
    let root = std::env::args().nth(2).map(PathBuf::from).unwrap_or_else(|| manifest.join("seeds"));
    let mut seeds = Seeds { root, written: BTreeMap::new() };
    server_seeds(&mut seeds);
    client_seeds(&mut seeds);
    graph_seeds(&mut seeds);
    compute_seeds(&mut seeds);
    boot_seeds(&mut seeds);
    round_trip_seeds(&mut seeds);
    let vectors = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| manifest.join("../tests/vectors"));
    let from_vectors = vector_seeds(&mut seeds, &vectors);
    println!("seeds from {} test vectors in {}", from_vectors, vectors.display());

    // Every seed must run through its harness without breaking an invariant.
    for (target, run) in [
        ("server_session", (|d: &[u8]| drop(server::run(d))) as fn(&[u8])),
        ("client_session", |d| drop(client::run(d))),
        ("graph_decode", |d| drop(graph::run(d))),
        ("bootstrap", boot::fuzz),
        ("round_trip", mirror::run),
        ("graph_compute", |d| drop(proto_core_fuzz::compute::run(d))),
    ] {
        let mut entries: Vec<_> = std::fs::read_dir(seeds.root.join(target)).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            run(&std::fs::read(entry.path()).unwrap());
        }
    }
    for (target, count) in &seeds.written {
        println!("{target}: {count} seeds written");
    }
}
