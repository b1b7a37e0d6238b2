//! Session vectors: frames fed to a fresh server (HELLO first) with the expected answers, and
//! for invalid ones a last frame that must fail.
//!
//! Handles and base addresses are chosen by the server, so the generator writes sentinel values
//! ([`buffer`], [`base`]) and [`templatize`] turns them into `{bufferN}` / `{baseN+offset}`
//! placeholders (see [`crate::template`]).

use bytes::Bytes;
use proto_core::ggml::types::id as ty;
use proto_core::ggml::{flags, GluOp, Op, UnaryOp};
use proto_core::tensor_cache::fnv1a64;
use proto_core::wire::{
    AllocSizeRequest, CommInitRequest, Command, Dialect, GraphComputeRequest, ProtocolVersion,
    Request, Response, RpcTensor, SetTensorHeader, Tensor2dHeader,
};

use super::samples::{client_id, f32_at, stored, wire_op};
use super::{dialect, folder, raw_frame, request_frame, spec, VERSIONS};
use crate::fields::command_name;
use crate::harness::MEMORY_BACKEND_ALIGNMENT;
use crate::hex;
use crate::rules::rule_by_slug;
use crate::vector::{Direction, FinalStep, Level, ServerParams, Step, Vector};

#[path = "v801.rs"]
mod v801;

const GIB: u64 = 1 << 30;

/// The sentinel of buffer handle `k`.
fn buffer(k: u8) -> u64 {
    0xB0B0_B0B0_B0B0_B000 | u64::from(k)
}

const OFFSET_BIAS: u64 = 1 << 39;
const OFFSET_MASK: u64 = (1 << 40) - 1;

/// The sentinel of buffer `k`'s base address plus `offset` (|offset| < 2^39).
fn base(k: u8, offset: i64) -> u64 {
    0xBA5E_0000_0000_0000
        | u64::from(k) << 40
        | (OFFSET_BIAS.wrapping_add_signed(offset) & OFFSET_MASK)
}

/// Hex with every sentinel replaced by its placeholder.
fn templatize(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8) {
            let value = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            if value >> 48 == 0xBA5E {
                let k = (value >> 40) & 0xff;
                let offset = (value & OFFSET_MASK) as i64 - OFFSET_BIAS as i64;
                match offset {
                    0 => out.push_str(&format!("{{base{k}}}")),
                    _ => out.push_str(&format!("{{base{k}{offset:+}}}")),
                }
                i += 8;
                continue;
            }
            if value & !0xff == 0xB0B0_B0B0_B0B0_B000 {
                out.push_str(&format!("{{buffer{}}}", value & 0xff));
                i += 8;
                continue;
            }
        }
        out.push_str(&hex::encode(&bytes[i..i + 1]));
        i += 1;
    }
    out
}

/// An f32 tensor of shape `ne` at `offset` in buffer `k`.
fn t32(n: u64, ne: [u32; 4], k: u8, offset: i64) -> RpcTensor {
    f32_at(
        client_id(n),
        ne,
        buffer(k),
        base(k, offset),
        &format!("t{n}"),
    )
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn set(tensor: &RpcTensor, offset: u64, data: &[u8]) -> Request {
    Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: tensor.clone(),
            cache_flag: 0,
            offset,
        }),
        data: Bytes::copy_from_slice(data),
    }
}

fn get(tensor: &RpcTensor, offset: u64, size: u64) -> Request {
    Request::GetTensor {
        tensor: Box::new(tensor.clone()),
        offset,
        size,
    }
}

fn data(bytes: &[u8]) -> Response {
    Response::TensorData(Bytes::copy_from_slice(bytes))
}

fn rows(
    tensor: &RpcTensor,
    offset: u64,
    size: u64,
    n_copies: u64,
    stride: u64,
) -> Box<Tensor2dHeader> {
    Box::new(Tensor2dHeader {
        tensor: tensor.clone(),
        offset,
        size,
        n_copies,
        stride,
    })
}

struct Session {
    name: String,
    version: ProtocolVersion,
    description: String,
    spec: String,
    server: ServerParams,
    steps: Vec<Step>,
}

impl Session {
    fn new(name: &str, version: ProtocolVersion, section: &str, description: &str) -> Session {
        Session {
            name: name.to_owned(),
            version,
            description: description.to_owned(),
            spec: spec(section),
            server: ServerParams {
                devices: 1,
                device_memory: GIB.to_string(),
                alignment: MEMORY_BACKEND_ALIGNMENT.to_string(),
                memory_quota: None,
                max_message_size: (256u64 << 20).to_string(),
                tensor_cache: false,
                conn_caps: hex::encode(&[0; 24]),
            },
            steps: Vec::new(),
        }
    }

    /// HELLO and its answer.
    fn hello(mut self) -> Session {
        let flags = u8::from(self.server.tensor_cache);
        let response = Response::Hello {
            version: self.version,
            flags,
            caps: [0; 24],
        };
        self.call(&Request::Hello { caps: [0; 24] }, Some(&response));
        self
    }

    /// HELLO, then buffer 0 of `size` bytes on device 0.
    fn with_buffer(self, size: u64) -> Session {
        let mut session = self.hello();
        session.alloc(0, 0, size);
        session
    }

    fn devices(mut self, devices: u32) -> Session {
        self.server.devices = devices;
        self
    }

    fn step_bytes(&mut self, frame: &[u8], expect: &[u8]) {
        let command = Command::from_id(frame[0], dialect(self.version)).expect("known command");
        self.steps.push(Step {
            command: command_name(command).to_owned(),
            send: templatize(frame),
            expect: templatize(expect),
        });
    }

    fn call(&mut self, request: &Request, response: Option<&Response>) {
        let frame = request_frame(self.version, request);
        let expect = response.map(|r| r.to_frame().to_vec()).unwrap_or_default();
        self.step_bytes(&frame, &expect);
    }

    fn cast(&mut self, request: &Request) {
        self.call(request, None);
    }

    /// ALLOC_BUFFER of buffer `k` and its BUFFER_GET_BASE.
    fn alloc(&mut self, k: u8, device: u32, size: u64) {
        let allocated = Response::AllocBuffer {
            remote_ptr: buffer(k),
            remote_size: size,
        };
        self.call(&Request::AllocBuffer { device, size }, Some(&allocated));
        let base = if size == 0 { 0 } else { base(k, 0) };
        self.call(
            &Request::BufferGetBase { buffer: buffer(k) },
            Some(&Response::BufferBase(base)),
        );
    }

    fn vector(self, folder: String, valid: bool) -> Vector {
        Vector {
            name: format!("{folder}/{}", self.name),
            description: self.description,
            protocol: self.version.to_string(),
            level: Level::Session,
            valid,
            direction: Direction::ClientToServer,
            command: None,
            spec: self.spec,
            hex: None,
            canonical_hex: None,
            fields: None,
            request: None,
            server: Some(self.server),
            steps: Some(self.steps),
            final_step: None,
            rule: None,
            error: None,
        }
    }

    /// A valid session (every step succeeds).
    fn done(self) -> Vector {
        let dir = format!("sessions/{}", folder(self.version));
        let mut v = self.vector(dir, true);
        v.command = v
            .steps
            .as_ref()
            .and_then(|s| s.last())
            .map(|s| s.command.clone());
        v
    }

    /// An invalid session whose last bytes are `frame` (possibly a partial frame).
    fn fail_bytes(self, frame: &[u8], eof: bool, rule: &str) -> Vector {
        let kind = rule_by_slug(rule)
            .unwrap_or_else(|| panic!("unknown rule {rule}"))
            .kind;
        let command = frame
            .first()
            .and_then(|&id| {
                Command::from_id(id, dialect(self.version)).or_else(|| Command::extension(id))
            })
            .map(|c| command_name(c).to_owned());
        let dir = format!("invalid/session/{}", folder(self.version));
        let mut v = self.vector(dir, false);
        v.command = command.clone();
        v.final_step = Some(FinalStep {
            command,
            send: templatize(frame),
            eof,
        });
        v.rule = Some(rule.to_owned());
        v.error = Some(kind.as_str().to_owned());
        v
    }

    /// An invalid session whose last request must fail.
    fn fail(self, request: &Request, rule: &str) -> Vector {
        let frame = request_frame(self.version, request);
        self.fail_bytes(&frame, false, rule)
    }
}

pub(super) fn generate(out: &mut Vec<Vector>) {
    for version in VERSIONS {
        out.push(lifecycle(version));
        protocol_rules(version, out);
        buffer_rules(version, out);
        tensor_rules(version, out);
        graph_rules(version, out);
    }
    v8_only(out);
    v801::generate(out);
}

/// The small graph of the session vectors: y = scale(view(silu(w · x))) over buffer 0.
fn mini_graph(uid: u64) -> GraphComputeRequest {
    let mut x = t32(1, [8, 2, 1, 1], 0, 1024);
    x.flags = flags::INPUT;
    x.use_count = 1;
    let mut w = t32(2, [8, 4, 1, 1], 0, 1088);
    w.flags = flags::PARAM;
    w.use_count = 1;
    let mut mm = t32(3, [4, 2, 1, 1], 0, 1216);
    mm.op = Op::MUL_MAT.0;
    mm.src[..2].copy_from_slice(&[w.id, x.id]);
    mm.flags = flags::COMPUTE;
    mm.use_count = 1;
    let mut act = t32(4, [4, 2, 1, 1], 0, 1248);
    act.op = wire_op(Op::UNARY);
    act.op_params[0] = UnaryOp::SILU.0;
    act.src[0] = mm.id;
    act.flags = flags::COMPUTE;
    act.use_count = 1;
    let mut view = t32(5, [4, 1, 1, 1], 0, 1264);
    view.op = Op::VIEW.0;
    view.src[0] = act.id;
    view.view_src = act.id;
    view.view_offs = 16;
    view.flags = flags::COMPUTE;
    view.use_count = 1;
    let mut y = t32(6, [4, 1, 1, 1], 0, 1280);
    y.op = Op::SCALE.0;
    y.op_params[0] = 0.5f32.to_bits() as i32;
    y.src[0] = view.id;
    y.flags = flags::COMPUTE | flags::OUTPUT;
    GraphComputeRequest {
        device: 0,
        uid,
        node_ids: vec![mm.id, act.id, view.id, y.id],
        tensors: vec![x, w, mm, act, view, y],
    }
}

fn uid(version: ProtocolVersion, value: u64) -> u64 {
    if dialect(version) == Dialect::V8 {
        value
    } else {
        0
    }
}

fn compute(graph: GraphComputeRequest) -> Request {
    Request::GraphCompute(Box::new(graph))
}

fn lifecycle(version: ProtocolVersion) -> Vector {
    let v8 = dialect(version) == Dialect::V8;
    let mut s = Session::new(
        "lifecycle",
        version,
        "§5, §7",
        "A whole connection against 2 devices of 1 GiB: queries, buffers (including a zero-size \
         buffer and a failed allocation), writes, reads, memset (an empty one at the very end of \
         the buffer), copy, clear, INIT_TENSOR, GET_ALLOC_SIZE (whose source names an unknown \
         handle), SET_TENSOR_HASH without a cache (answers 0 without looking at the tensor), \
         GRAPH_COMPUTE / GRAPH_RECOMPUTE, FREE_BUFFER; 8.x adds the 2D commands and COMM_INIT \
         with bad arguments (answers 0)",
    )
    .devices(2)
    .hello();
    s.call(&Request::DeviceCount, Some(&Response::DeviceCount(2)));
    s.call(
        &Request::GetDeviceMemory { device: 0 },
        Some(&Response::DeviceMemory {
            free: GIB,
            total: GIB,
        }),
    );
    s.call(
        &Request::GetAlignment { device: 1 },
        Some(&Response::Alignment(32)),
    );
    s.call(
        &Request::GetMaxSize { device: 0 },
        Some(&Response::MaxSize(GIB)),
    );
    s.alloc(0, 0, 4096);
    s.call(
        &Request::GetDeviceMemory { device: 0 },
        Some(&Response::DeviceMemory {
            free: GIB - 4096,
            total: GIB,
        }),
    );
    s.alloc(1, 1, 0);
    s.call(
        &Request::AllocBuffer {
            device: 1,
            size: 2 * GIB,
        },
        Some(&Response::AllocBuffer {
            remote_ptr: 0,
            remote_size: 0,
        }),
    );
    let a = t32(1, [16, 1, 1, 1], 0, 0);
    let b = t32(2, [16, 1, 1, 1], 0, 64);
    let content = pattern(64, 3);
    s.cast(&set(&a, 0, &content));
    s.call(&get(&a, 8, 16), Some(&data(&content[8..24])));
    s.call(&get(&a, 64, 0), Some(&data(&[])));
    s.cast(&Request::MemsetTensor {
        tensor: Box::new(a.clone()),
        offset: 0,
        size: 8,
        value: 0xee,
    });
    let mut expected = content.clone();
    expected[..8].fill(0xee);
    s.call(&get(&a, 0, 16), Some(&data(&expected[..16])));
    s.call(
        &Request::CopyTensor {
            src: Box::new(a.clone()),
            dst: Box::new(b.clone()),
        },
        Some(&Response::CopyTensor(1)),
    );
    s.call(&get(&b, 0, 64), Some(&data(&expected)));
    s.cast(&set(&b, 64, &[]));
    let end = t32(3, [4, 1, 1, 1], 0, 4080);
    s.cast(&Request::MemsetTensor {
        tensor: Box::new(end.clone()),
        offset: 16,
        size: 0,
        value: 1,
    });
    s.cast(&Request::InitTensor {
        tensor: Box::new(a.clone()),
    });
    let mut node = stored(client_id(20), ty::F32, [8, 2, 1, 1], 0, 0, "node");
    node.op = Op::MUL_MAT.0;
    let mut srcs: [RpcTensor; 10] = Default::default();
    srcs[0] = stored(
        client_id(21),
        ty::Q8_0,
        [64, 8, 1, 1],
        0x0000_5581_2e4a_b000,
        0x0000_7f1c_2000_0000,
        "w",
    );
    node.src[0] = srcs[0].id;
    s.call(
        &Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 1,
            tensor: node.clone(),
            srcs: srcs.clone(),
        })),
        Some(&Response::AllocSize(64)),
    );
    // The tensor itself may name a buffer of another server: "no buffer", default buffer type.
    let mut foreign = node;
    foreign.buffer = 0x0000_5581_2e4a_c2a0;
    foreign.data = 0x0000_7f1c_6000_0000;
    s.call(
        &Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: foreign,
            srcs,
        })),
        Some(&Response::AllocSize(64)),
    );
    s.call(
        &Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: b.clone(),
            srcs: Default::default(),
        })),
        Some(&Response::AllocSize(64)),
    );
    let mut garbage = a.clone();
    garbage.type_id = 4;
    s.call(
        &Request::SetTensorHash {
            tensor: Box::new(garbage),
            offset: 0,
            hash: fnv1a64(&content),
        },
        Some(&Response::SetTensorHash(0)),
    );
    s.cast(&Request::BufferClear {
        buffer: buffer(0),
        value: 0x11,
    });
    s.call(&get(&a, 0, 4), Some(&data(&[0x11; 4])));
    s.cast(&Request::BufferClear {
        buffer: buffer(1),
        value: 0xff,
    });
    s.cast(&compute(mini_graph(uid(version, 0x77))));
    s.cast(&Request::GraphRecompute {
        device: 0,
        uid: uid(version, 0x77),
    });
    // A node without the COMPUTE flag is never executed and needs no storage.
    let mut skipped = mini_graph(uid(version, 0x78));
    let mut reshape = stored(client_id(30), ty::F32, [8, 1, 1, 1], 0, 0, "reshaped");
    reshape.op = Op::RESHAPE.0;
    reshape.src[0] = skipped.tensors[5].id;
    skipped.node_ids.push(reshape.id);
    skipped.tensors.push(reshape);
    s.cast(&compute(skipped));
    if v8 {
        // 8.x skips the bounds check of tensors without elements.
        let mut empty = t32(31, [0, 4, 1, 1], 0, 8192);
        empty.nb = [4, 0, 0, 0];
        s.cast(&Request::InitTensor {
            tensor: Box::new(empty),
        });
        s.cast(&compute(mini_graph(0)));
        s.cast(&Request::GraphRecompute {
            device: 0,
            uid: 0x77,
        });
        s.cast(&Request::SetTensor2d {
            header: rows(&a, 4, 4, 3, 16),
            data: Bytes::from(vec![7u8; 12]),
        });
        s.call(
            &Request::GetTensor2d(rows(&a, 0, 8, 2, 16)),
            Some(&Response::Tensor2dData(Bytes::from_static(&[
                0x11, 0x11, 0x11, 0x11, 7, 7, 7, 7, 0x11, 0x11, 0x11, 0x11, 7, 7, 7, 7,
            ]))),
        );
        s.cast(&Request::SetTensor2d {
            header: rows(&end, 12, 4, 2, 0),
            data: Bytes::from(vec![9u8; 8]),
        });
        s.call(
            &Request::GetTensor2d(rows(&end, 8, 8, 1, 0)),
            Some(&Response::Tensor2dData(Bytes::from_static(&[
                0x11, 0x11, 0x11, 0x11, 9, 9, 9, 9,
            ]))),
        );
        for (device, rank, world) in [(2, 0, 2), (0, 2, 2), (0, 0, 1)] {
            let request = CommInitRequest {
                device,
                rank,
                world,
                port: 51052,
                host: [0; 64],
            };
            s.call(
                &Request::CommInit(Box::new(request)),
                Some(&Response::CommInit(0)),
            );
        }
        s.cast(&Request::CommFree { device: 1 });
    }
    s.cast(&Request::FreeBuffer { buffer: buffer(1) });
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    s.call(
        &Request::GetDeviceMemory { device: 0 },
        Some(&Response::DeviceMemory {
            free: GIB,
            total: GIB,
        }),
    );
    s.done()
}

/// HELLO with RDMA caps on both sides: the server answers its own caps whatever the client sent.
fn hello_caps(version: ProtocolVersion) -> Vector {
    let client = super::frames::rdma_caps();
    let mut server = client;
    server[0..8].copy_from_slice(&[0x11, 0x0e, 0, 0, 0x11, 0x0e, 0, 0]);
    server[23] = 20;
    let mut s = Session::new("hello_caps", version, "§5.1, §10.2",
        "HELLO with RoCE caps from the client, answered with the server's own caps; then DEVICE_COUNT");
    s.server.conn_caps = hex::encode(&server);
    s.call(
        &Request::Hello { caps: client },
        Some(&Response::Hello {
            version,
            flags: 0,
            caps: server,
        }),
    );
    s.call(&Request::DeviceCount, Some(&Response::DeviceCount(1)));
    s.done()
}

fn protocol_rules(version: ProtocolVersion, out: &mut Vec<Vector>) {
    out.push(hello_caps(version));
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    out.push(
        new(
            "command_before_hello",
            "§2.5 step 2",
            "DEVICE_COUNT as the first command",
        )
        .fail(&Request::DeviceCount, "hello_first"),
    );
    out.push(
        new(
            "unknown_command_before_hello",
            "§2.5 step 2",
            "An unknown command id (99) as the first frame: HELLO is checked first",
        )
        .fail_bytes(&raw_frame(99, 0, &[]), false, "hello_first"),
    );
    out.push(
        new(
            "graph_compute_before_hello",
            "§2.5 step 2",
            "The header of a huge GRAPH_COMPUTE as the first frame",
        )
        .fail_bytes(&raw_frame(10, 1 << 62, &[]), false, "hello_first"),
    );
    out.push(
        new("second_hello", "§2.5 step 7, §5.1", "HELLO twice in a row")
            .hello()
            .fail(&Request::Hello { caps: [0; 24] }, "hello_once"),
    );
    let copy = Request::RemoteCopyTensor(Box::new(proto_core::wire::RemoteCopyRequest {
        src: RpcTensor::default(),
        src_offset: 0,
        size: 0,
        n_copies: 1,
        src_stride: 0,
        dst: RpcTensor::default(),
        dst_offset: 0,
        dst_stride: 0,
        ticket: 1,
        endpoint: [0; proto_core::wire::ENDPOINT_SIZE],
    }));
    out.push(
        new(
            "remote_copy_without_extensions",
            "§2.5 step 7 (ours: ids 0xF1-0xF3)",
            "REMOTE_COPY_TENSOR (0xF3, our extension) on a connection that never sent EXTENSIONS",
        )
        .hello()
        .fail(&copy, "extension_negotiated"),
    );
    let mut s = new(
        "hello_after_commands",
        "§2.5 step 7, §5.1",
        "HELLO after other commands",
    )
    .hello();
    s.call(&Request::DeviceCount, Some(&Response::DeviceCount(1)));
    out.push(s.fail(&Request::Hello { caps: [0; 24] }, "hello_once"));

    let header_of =
        |request: &Request, keep: usize| request_frame(version, request)[..keep].to_vec();
    out.push(
        new(
            "eof_in_header",
            "§2.5 step 7",
            "The stream ends 5 bytes into a request header",
        )
        .hello()
        .fail_bytes(
            &header_of(&Request::GetAlignment { device: 0 }, 5),
            true,
            "complete_frames",
        ),
    );
    let t = t32(1, [16, 1, 1, 1], 0, 0);
    let partial = header_of(&get(&t, 0, 16), 9 + 300);
    out.push(
        new(
            "eof_in_payload",
            "§2.5 step 7",
            "The stream ends inside a GET_TENSOR payload",
        )
        .with_buffer(4096)
        .fail_bytes(&partial, true, "complete_frames"),
    );
    let write = request_frame(version, &set(&t, 0, &pattern(64, 1)));
    out.push(
        new(
            "eof_in_set_tensor_data",
            "§2.5 step 7, §5.10",
            "The stream ends after 40 of the 64 data bytes of a SET_TENSOR",
        )
        .with_buffer(4096)
        .fail_bytes(&write[..write.len() - 24], true, "complete_frames"),
    );

    let devices = |name: &str, request: Request| {
        new(
            &format!("invalid_device_{name}"),
            "§4.2",
            &format!(
                "{} naming device 1 of a server with 1 device",
                command_name(request.command())
            ),
        )
        .hello()
        .fail(&request, "device_index")
    };
    out.push(devices(
        "get_alignment",
        Request::GetAlignment { device: 1 },
    ));
    out.push(devices("get_max_size", Request::GetMaxSize { device: 1 }));
    out.push(devices(
        "get_device_memory",
        Request::GetDeviceMemory { device: 1 },
    ));
    out.push(devices(
        "alloc_buffer",
        Request::AllocBuffer {
            device: 1,
            size: 64,
        },
    ));
    out.push(devices(
        "graph_recompute",
        Request::GraphRecompute {
            device: 1,
            uid: uid(version, 5),
        },
    ));
    out.push(devices(
        "get_alloc_size",
        Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 1,
            tensor: stored(client_id(1), ty::F32, [4, 1, 1, 1], 0, 0, "t"),
            srcs: Default::default(),
        })),
    ));
    out.push(devices(
        "alloc_buffer_max",
        Request::AllocBuffer {
            device: u32::MAX,
            size: 64,
        },
    ));
    let mut graph = mini_graph(uid(version, 3));
    graph.device = 1;
    out.push(
        new(
            "invalid_device_graph_compute",
            "§4.2, §5.17 step 1",
            "GRAPH_COMPUTE on device 1 of a server with 1 device",
        )
        .with_buffer(4096)
        .fail(&compute(graph), "device_index"),
    );

    let mut s = new(
        "memory_quota",
        "G10",
        "A connection with a 1 MiB quota holds 768 KiB and asks for 512 KiB more",
    )
    .hello();
    s.server.memory_quota = Some((1u64 << 20).to_string());
    s.alloc(0, 0, 768 << 10);
    out.push(s.fail(
        &Request::AllocBuffer {
            device: 0,
            size: 512 << 10,
        },
        "memory_quota",
    ));
    let mut s = new(
        "memory_quota_after_free",
        "G10",
        "Freed bytes return to the quota; one byte over it fails",
    )
    .hello();
    s.server.memory_quota = Some((1u64 << 20).to_string());
    s.alloc(0, 0, 1 << 20);
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    s.alloc(1, 0, 1 << 20);
    out.push(s.fail(&Request::AllocBuffer { device: 0, size: 1 }, "memory_quota"));

    out.push(new("graph_compute_too_large", "G10, §5.17", "A GRAPH_COMPUTE header declaring 2^62 bytes: refused before any payload is read (limit 256 MiB)")
        .hello()
        .fail_bytes(&raw_frame(10, 1 << 62, &[]), false, "buffered_request_limit"));
    let mut limited = new(
        "graph_compute_over_limit",
        "G10, §5.17",
        "A GRAPH_COMPUTE one byte above a 4 KiB message limit",
    )
    .hello();
    limited.server.max_message_size = 4096.to_string();
    let body = vec![0u8; 4097];
    out.push(limited.fail_bytes(&raw_frame(10, 4097, &body), false, "buffered_request_limit"));
}

fn buffer_rules(version: ProtocolVersion, out: &mut Vec<Vector>) {
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    let unknown = 0x0000_5581_2e4a_b000u64;
    out.push(
        new(
            "buffer_get_base_unknown",
            "§5.7",
            "BUFFER_GET_BASE of a handle on a connection that allocated nothing",
        )
        .hello()
        .fail(&Request::BufferGetBase { buffer: unknown }, "buffer_handle"),
    );
    out.push(
        new(
            "buffer_get_base_zero",
            "§5.7",
            "BUFFER_GET_BASE of handle 0 (the failed-allocation handle)",
        )
        .hello()
        .fail(&Request::BufferGetBase { buffer: 0 }, "buffer_handle"),
    );
    let mut s = new(
        "free_buffer_twice",
        "§5.8",
        "FREE_BUFFER of a handle already freed",
    )
    .with_buffer(4096);
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    out.push(s.fail(&Request::FreeBuffer { buffer: buffer(0) }, "buffer_handle"));
    out.push(
        new("free_buffer_zero", "§5.8", "FREE_BUFFER of handle 0")
            .with_buffer(4096)
            .fail(&Request::FreeBuffer { buffer: 0 }, "buffer_handle"),
    );
    let mut s = new(
        "buffer_clear_freed",
        "§5.9",
        "BUFFER_CLEAR of a freed buffer",
    )
    .with_buffer(4096);
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    out.push(s.fail(
        &Request::BufferClear {
            buffer: buffer(0),
            value: 0,
        },
        "buffer_handle",
    ));
    let t = t32(1, [16, 1, 1, 1], 0, 0);
    let freed = |name: &str, description: &str, request: Request| {
        let mut s = new(name, "§3.3 step 4, G1", description).with_buffer(4096);
        s.cast(&Request::FreeBuffer { buffer: buffer(0) });
        s.fail(&request, "buffer_handle")
    };
    out.push(freed(
        "get_tensor_freed_buffer",
        "GET_TENSOR of a tensor whose buffer was freed",
        get(&t, 0, 4),
    ));
    out.push(freed(
        "set_tensor_freed_buffer",
        "SET_TENSOR into a tensor whose buffer was freed",
        set(&t, 0, &[1, 2, 3, 4]),
    ));
    out.push(freed(
        "memset_tensor_freed_buffer",
        "MEMSET_TENSOR of a tensor whose buffer was freed",
        Request::MemsetTensor {
            tensor: Box::new(t.clone()),
            offset: 0,
            size: 4,
            value: 0,
        },
    ));
    out.push(new("init_tensor_unknown_buffer", "§5.14, G18", "INIT_TENSOR naming a handle this connection never allocated (the reference logs and succeeds; rejected)")
        .with_buffer(4096)
        .fail(&Request::InitTensor { tensor: Box::new(f32_at(client_id(1), [16, 1, 1, 1], unknown, 0x0000_7f1c_2000_0000, "t")) }, "buffer_handle"));
    let mut s = new(
        "copy_tensor_freed_destination",
        "§5.16",
        "COPY_TENSOR into a tensor of a freed buffer",
    )
    .with_buffer(4096);
    s.alloc(1, 0, 4096);
    s.cast(&Request::FreeBuffer { buffer: buffer(1) });
    out.push(s.fail(
        &Request::CopyTensor {
            src: Box::new(t.clone()),
            dst: Box::new(t32(2, [16, 1, 1, 1], 1, 0)),
        },
        "buffer_handle",
    ));

    let mut host = t.clone();
    host.buffer = 0;
    host.data = 0;
    let missing = |name: &str, section: &str, description: &str, request: Request| {
        new(name, section, description)
            .with_buffer(4096)
            .fail(&request, "tensor_needs_buffer")
    };
    out.push(missing(
        "set_tensor_no_buffer",
        "§5.10 step 2",
        "SET_TENSOR into a tensor with buffer 0",
        set(&host, 0, &[1, 2, 3, 4]),
    ));
    out.push(missing(
        "get_tensor_no_buffer",
        "§5.12",
        "GET_TENSOR of a tensor with buffer 0",
        get(&host, 0, 4),
    ));
    out.push(missing(
        "memset_tensor_no_buffer",
        "§5.15",
        "MEMSET_TENSOR of a tensor with buffer 0",
        Request::MemsetTensor {
            tensor: Box::new(host.clone()),
            offset: 0,
            size: 4,
            value: 0,
        },
    ));
    out.push(missing(
        "copy_tensor_source_no_buffer",
        "§5.16",
        "COPY_TENSOR from a tensor with buffer 0",
        Request::CopyTensor {
            src: Box::new(host.clone()),
            dst: Box::new(t.clone()),
        },
    ));
    out.push(missing(
        "init_tensor_no_buffer",
        "§5.14, G18",
        "INIT_TENSOR of a tensor with buffer 0 (the reference logs and succeeds; rejected)",
        Request::InitTensor {
            tensor: Box::new(host.clone()),
        },
    ));

    let outside = |name: &str,
                   section: &str,
                   description: &str,
                   tensor: RpcTensor,
                   request: fn(&RpcTensor) -> Request| {
        new(name, section, description)
            .with_buffer(4096)
            .fail(&request(&tensor), "tensor_inside_buffer")
    };
    out.push(outside(
        "get_tensor_crosses_buffer_end",
        "§3.3 step 5",
        "GET_TENSOR of a 64-byte tensor starting 32 bytes before the end of its 4096-byte buffer",
        t32(1, [16, 1, 1, 1], 0, 4064),
        |t| get(t, 0, 4),
    ));
    out.push(outside(
        "get_tensor_before_buffer",
        "§3.3 step 5",
        "GET_TENSOR of a tensor starting 16 bytes before its buffer's base",
        t32(1, [16, 1, 1, 1], 0, -16),
        |t| get(t, 32, 4),
    ));
    out.push(outside(
        "set_tensor_data_zero",
        "§3.3 step 5",
        "SET_TENSOR into a tensor of a known buffer whose data address is 0",
        f32_at(client_id(1), [16, 1, 1, 1], buffer(0), 0, "t"),
        |t| set(t, 0, &[1, 2, 3, 4]),
    ));
    out.push(outside(
        "init_tensor_outside_buffer",
        "§3.3 step 5, §5.14",
        "INIT_TENSOR of a tensor that extends past its buffer",
        t32(1, [1024, 2, 1, 1], 0, 0),
        |t| Request::InitTensor {
            tensor: Box::new(t.clone()),
        },
    ));
    out.push(outside(
        "copy_tensor_source_outside_buffer",
        "§3.3 step 5, §5.16",
        "COPY_TENSOR from a tensor that extends past its buffer",
        t32(1, [16, 1, 1, 1], 0, 4090),
        |t| Request::CopyTensor {
            src: Box::new(t.clone()),
            dst: Box::new(t32(2, [16, 1, 1, 1], 0, 0)),
        },
    ));
    out.push(outside("get_alloc_size_outside_buffer", "§3.3 step 5, §5.13",
        "GET_ALLOC_SIZE of a tensor that names a known buffer but extends past it: deserialization fails, the connection closes",
        t32(1, [16, 1, 1, 1], 0, 4090),
        |t| Request::GetAllocSize(Box::new(AllocSizeRequest { device: 0, tensor: t.clone(), srcs: Default::default() }))));
    let mut s = new(
        "tensor_in_zero_size_buffer",
        "§3.3 step 5, §4.3",
        "GET_TENSOR of a 64-byte tensor in a zero-size buffer (base 0)",
    )
    .hello();
    s.alloc(0, 0, 0);
    out.push(s.fail(
        &get(
            &f32_at(client_id(1), [16, 1, 1, 1], buffer(0), 0, "t"),
            0,
            4,
        ),
        "tensor_inside_buffer",
    ));

    let mut copy = new(
        "copy_tensor_larger_source",
        "§5.16, G19",
        "COPY_TENSOR of a 64-byte tensor into a 32-byte tensor, both inside one buffer",
    )
    .with_buffer(4096);
    copy.cast(&set(&t, 0, &pattern(64, 1)));
    out.push(copy.fail(
        &Request::CopyTensor {
            src: Box::new(t.clone()),
            dst: Box::new(t32(2, [8, 1, 1, 1], 0, 1024)),
        },
        "copy_destination",
    ));
    out.push(new("copy_tensor_past_buffer_end", "§5.16", "COPY_TENSOR of a 128-byte tensor into a 64-byte tensor at the end of the buffer: the write would leave the buffer")
        .with_buffer(4096)
        .fail(&Request::CopyTensor { src: Box::new(t32(1, [32, 1, 1, 1], 0, 0)), dst: Box::new(t32(2, [16, 1, 1, 1], 0, 4032)) }, "copy_destination"));
}

fn tensor_rules(version: ProtocolVersion, out: &mut Vec<Vector>) {
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    let t = t32(1, [16, 1, 1, 1], 0, 0);
    let fail = |name: &str, section: &str, description: &str, request: Request, rule: &str| {
        new(name, section, description)
            .with_buffer(4096)
            .fail(&request, rule)
    };
    // Regions against the buffer.
    let end = t32(2, [4, 1, 1, 1], 0, 4080);
    out.push(fail("set_tensor_empty_at_buffer_end", "§5.10 step 3",
        "SET_TENSOR of 0 bytes at the very end of the buffer (inside the tensor's bounds): the start must be strictly inside the buffer",
        set(&end, 16, &[]), "region_inside_buffer"));
    out.push(fail(
        "get_tensor_empty_at_buffer_end",
        "§5.12",
        "GET_TENSOR of 0 bytes at the very end of the buffer",
        get(&end, 16, 0),
        "region_inside_buffer",
    ));
    out.push(fail(
        "get_tensor_huge_size",
        "§5.12, G10",
        "GET_TENSOR of 2^62 bytes: refused before anything is allocated",
        get(&t, 0, 1 << 62),
        "region_inside_buffer",
    ));
    let mut empty_past = t32(3, [0, 1, 1, 1], 0, 4097);
    empty_past.nb = [4, 4, 4, 4];
    out.push(fail("memset_tensor_empty_tensor_past_buffer", "§5.15",
        "MEMSET_TENSOR of 0 bytes of an empty tensor (exempt from the tensor-in-buffer check) placed 1 byte past the end of its buffer",
        Request::MemsetTensor { tensor: Box::new(empty_past.clone()), offset: 0, size: 0, value: 0 }, "region_inside_buffer"));
    out.push(fail(
        "set_tensor_empty_tensor_past_buffer",
        "§5.10 step 3",
        "SET_TENSOR of 0 bytes into an empty tensor placed 1 byte past the end of its buffer",
        set(&empty_past, 0, &[]),
        "region_inside_buffer",
    ));
    // Regions against the tensor (G4).
    let big = new("set_tensor_past_tensor_end", "G4, §5.10 step 5", "SET_TENSOR of 8 bytes at offset 60 of a 64-byte tensor (inside the buffer, outside the tensor)")
        .with_buffer(4096);
    out.push(big.fail(&set(&t, 60, &pattern(8, 2)), "region_inside_tensor"));
    out.push(fail(
        "get_tensor_past_tensor_end",
        "G4, §5.12",
        "GET_TENSOR of 16 bytes at offset 56 of a 64-byte tensor",
        get(&t, 56, 16),
        "region_inside_tensor",
    ));
    out.push(fail(
        "memset_tensor_past_tensor_end",
        "§5.15",
        "MEMSET_TENSOR of 1 byte at offset 64 of a 64-byte tensor",
        Request::MemsetTensor {
            tensor: Box::new(t.clone()),
            offset: 64,
            size: 1,
            value: 0,
        },
        "region_inside_tensor",
    ));
    // Types and shapes.
    let typed = |type_id: u32| {
        let mut tensor = t.clone();
        tensor.type_id = type_id;
        tensor
    };
    out.push(fail(
        "get_tensor_removed_type",
        "§3.3 step 1, §12.1",
        "GET_TENSOR of a tensor of type 4 (removed q4_2)",
        get(&typed(4), 0, 4),
        "type_id",
    ));
    out.push(fail(
        "set_tensor_type_43",
        "§3.3 step 1, §12.1",
        "SET_TENSOR into a tensor of type 43 (GGML_TYPE_COUNT)",
        set(&typed(43), 0, &[0; 4]),
        "type_id",
    ));
    out.push(fail(
        "init_tensor_type_max",
        "§3.3 step 1",
        "INIT_TENSOR of a tensor of type 2^32 - 1",
        Request::InitTensor {
            tensor: Box::new(typed(u32::MAX)),
        },
        "type_id",
    ));
    out.push(fail(
        "get_alloc_size_removed_type",
        "§3.3 step 1, §5.13",
        "GET_ALLOC_SIZE of a tensor of type 31 (removed q4_0_4_4)",
        Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: typed(31),
            srcs: Default::default(),
        })),
        "type_id",
    ));
    let mut q8 = stored(
        client_id(3),
        ty::Q8_0,
        [64, 1, 1, 1],
        buffer(0),
        base(0, 0),
        "q",
    );
    q8.ne[0] = 33;
    out.push(fail(
        "get_tensor_ne0_not_block_multiple",
        "G3, §12.1",
        "GET_TENSOR of a q8_0 tensor with ne[0] = 33 (block size 32)",
        get(&q8, 0, 4),
        "block_multiple",
    ));
    let mut q4k = stored(client_id(4), ty::Q4_K, [256, 1, 1, 1], 0, 0, "q");
    q4k.ne[0] = 100;
    out.push(fail(
        "get_alloc_size_ne0_not_block_multiple",
        "G3, §5.13",
        "GET_ALLOC_SIZE of a q4_K tensor with ne[0] = 100 (block size 256)",
        Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: q4k,
            srcs: Default::default(),
        })),
        "block_multiple",
    ));
    let mut huge = t.clone();
    huge.ne = [65536, 65536, 65536, 32768];
    out.push(fail(
        "get_tensor_element_count_2_63",
        "§3.3 step 2, G3",
        "GET_TENSOR of a tensor of 2^63 elements (one more than i64 holds)",
        get(&huge, 0, 4),
        "element_count",
    ));
    let mut max = t.clone();
    max.ne = [u32::MAX; 4];
    out.push(fail(
        "init_tensor_element_count_overflow",
        "§3.3 step 2, G3",
        "INIT_TENSOR of a tensor whose element count overflows 64 bits",
        Request::InitTensor {
            tensor: Box::new(max),
        },
        "element_count",
    ));
    let mut wide = t.clone();
    wide.ne = [u32::MAX, (1 << 31) - 1, 1, 1];
    wide.nb = [u32::MAX, u32::MAX, u32::MAX, u32::MAX];
    out.push(fail("get_tensor_byte_size_overflow", "§3.4, G5", "GET_TENSOR of a tensor whose element count fits i64 but whose byte extent overflows 64 bits",
        get(&wide, 0, 4), "address_arithmetic"));
    out.push(fail(
        "set_tensor_offset_wraps",
        "G5, §5.10 step 3",
        "SET_TENSOR at offset 2^64 - 1: data + offset wraps",
        set(&t, u64::MAX, &[1]),
        "address_arithmetic",
    ));
    out.push(fail(
        "get_tensor_offset_wraps",
        "G5, §5.12",
        "GET_TENSOR at offset 2^64 - 8: data + offset wraps",
        get(&t, u64::MAX - 7, 4),
        "address_arithmetic",
    ));
    // A streamed write longer than anything.
    let mut frame = request_frame(version, &set(&t, 0, &[]));
    frame[1..9].copy_from_slice(&(1u64 << 62).to_le_bytes());
    out.push(new("set_tensor_huge_length", "G10, §5.10", "A SET_TENSOR header declaring 2^62 bytes: refused after the 305-byte fixed part, before any data")
        .with_buffer(4096)
        .fail_bytes(&frame, false, "streamed_length"));
}

fn graph_rules(version: ProtocolVersion, out: &mut Vec<Vector>) {
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
    let glu_ok = with(&|g| {
        g.tensors[3].op = wire_op(Op::GLU);
        g.tensors[3].op_params[0] = GluOp::SWIGLU_CLAMP.0;
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

fn v8_only(out: &mut Vec<Vector>) {
    let version = super::V8;
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    let t = t32(1, [16, 1, 1, 1], 0, 0);
    let fail = |name: &str, section: &str, description: &str, request: Request, rule: &str| {
        new(name, section, description)
            .with_buffer(4096)
            .fail(&request, rule)
    };
    let mut s = new(
        "recompute_unknown_uid",
        "§5.18",
        "GRAPH_COMPUTE of uid 0x77, GRAPH_RECOMPUTE of uid 0x78",
    )
    .with_buffer(4096);
    s.cast(&compute(mini_graph(0x77)));
    out.push(s.fail(
        &Request::GraphRecompute {
            device: 0,
            uid: 0x78,
        },
        "stored_graph",
    ));
    let mut s = new(
        "recompute_uid_zero",
        "§5.17 step 3, §5.18",
        "GRAPH_COMPUTE with uid 0 is not cached: GRAPH_RECOMPUTE of uid 0 fails",
    )
    .with_buffer(4096);
    s.cast(&compute(mini_graph(0)));
    out.push(s.fail(
        &Request::GraphRecompute { device: 0, uid: 0 },
        "stored_graph",
    ));

    out.push(fail(
        "set_tensor_2d_no_buffer",
        "§5.19",
        "SET_TENSOR_2D into a tensor with buffer 0",
        Request::SetTensor2d {
            header: rows(
                &{
                    let mut h = t.clone();
                    h.buffer = 0;
                    h.data = 0;
                    h
                },
                0,
                4,
                2,
                8,
            ),
            data: Bytes::from(vec![1u8; 8]),
        },
        "tensor_needs_buffer",
    ));
    out.push(fail(
        "set_tensor_2d_rows_past_tensor",
        "§5.19",
        "SET_TENSOR_2D whose last row (offset 8 + 3·24) ends past the 64-byte tensor",
        Request::SetTensor2d {
            header: rows(&t, 8, 8, 4, 24),
            data: Bytes::from(vec![1u8; 32]),
        },
        "region_inside_tensor",
    ));
    out.push(fail(
        "get_tensor_2d_rows_past_tensor",
        "§5.20",
        "GET_TENSOR_2D of 2 rows of 8 bytes, stride 60, in a 64-byte tensor",
        Request::GetTensor2d(rows(&t, 0, 8, 2, 60)),
        "region_inside_tensor",
    ));
    out.push(fail("get_tensor_2d_past_buffer_end", "§5.20", "GET_TENSOR_2D of one byte at offset 17 of a 16-byte tensor that ends with its buffer: the row starts past the buffer",
        Request::GetTensor2d(rows(&t32(2, [4, 1, 1, 1], 0, 4080), 17, 1, 1, 0)), "region_inside_buffer"));
    out.push(fail(
        "get_tensor_2d_stride_overflow",
        "§5.20, G5",
        "GET_TENSOR_2D with stride 2^64 - 1: (n_copies - 1)·stride + size overflows",
        Request::GetTensor2d(rows(&t, 0, 8, 2, u64::MAX)),
        "address_arithmetic",
    ));
    out.push(fail(
        "set_tensor_2d_stride_overflow",
        "§5.19, G5",
        "SET_TENSOR_2D with 2 rows of 4 bytes and stride 2^64 - 2: the span overflows",
        Request::SetTensor2d {
            header: rows(&t, 0, 4, 2, u64::MAX - 1),
            data: Bytes::from(vec![1u8; 8]),
        },
        "address_arithmetic",
    ));
    let mut frame = request_frame(
        version,
        &Request::GetTensor2d(rows(&t, 0, (1 << 62) - 328, 1, 0)),
    );
    frame[0] = Command::SetTensor2d.id();
    frame[1..9].copy_from_slice(&(1u64 << 62).to_le_bytes());
    out.push(new("set_tensor_2d_huge_length", "G10, §5.19", "A SET_TENSOR_2D header declaring 2^62 bytes (one row of 2^62 - 328 bytes): refused before any data")
        .with_buffer(4096)
        .fail_bytes(&frame, false, "streamed_length"));
    out.push(fail(
        "comm_free_invalid_device",
        "§5.23",
        "COMM_FREE of device 1 of a server with 1 device",
        Request::CommFree { device: 1 },
        "device_index",
    ));
    out.push(fail(
        "comm_allreduce_invalid_device",
        "§5.22",
        "COMM_ALLREDUCE on device 1 of a server with 1 device",
        Request::CommAllreduce {
            device: 1,
            tensor: Box::new(t.clone()),
        },
        "device_index",
    ));
    let mut compute_flag = t.clone();
    compute_flag.flags = flags::COMPUTE;
    out.push(fail(
        "comm_allreduce_without_comm_init",
        "§5.22",
        "COMM_ALLREDUCE on a device without a communicator",
        Request::CommAllreduce {
            device: 0,
            tensor: Box::new(compute_flag.clone()),
        },
        "communicator_required",
    ));
    let mut s = new(
        "comm_allreduce_after_failed_comm_init",
        "§5.21, §5.22",
        "COMM_INIT with world 1 answers 0; COMM_ALLREDUCE then has no communicator",
    )
    .with_buffer(4096);
    s.call(
        &Request::CommInit(Box::new(CommInitRequest {
            device: 0,
            rank: 0,
            world: 1,
            port: 51052,
            host: [0; 64],
        })),
        Some(&Response::CommInit(0)),
    );
    out.push(s.fail(
        &Request::CommAllreduce {
            device: 0,
            tensor: Box::new(compute_flag),
        },
        "communicator_required",
    ));

    // The tensor cache (HELLO flag bit 0).
    let content = pattern(256, 7);
    let hash = fnv1a64(&content);
    let cached = |name: &str, description: &str| {
        let mut s = new(name, "§5.11, §1.4", description);
        s.server.tensor_cache = true;
        s.with_buffer(4096)
    };
    let weight = t32(3, [64, 1, 1, 1], 0, 256);
    let mut s = cached("tensor_cache", "A server with a tensor cache: HELLO flags 1, SET_TENSOR_HASH miss (0), SET_TENSOR with cache_flag 1, BUFFER_CLEAR, SET_TENSOR_HASH hit (1) restores the data");
    s.call(
        &Request::SetTensorHash {
            tensor: Box::new(weight.clone()),
            offset: 0,
            hash,
        },
        Some(&Response::SetTensorHash(0)),
    );
    s.cast(&Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: weight.clone(),
            cache_flag: 1,
            offset: 0,
        }),
        data: Bytes::from(content.clone()),
    });
    s.cast(&Request::BufferClear {
        buffer: buffer(0),
        value: 0,
    });
    s.call(
        &Request::SetTensorHash {
            tensor: Box::new(weight.clone()),
            offset: 0,
            hash,
        },
        Some(&Response::SetTensorHash(1)),
    );
    s.call(&get(&weight, 0, 256), Some(&data(&content)));
    s.call(
        &Request::SetTensorHash {
            tensor: Box::new(weight.clone()),
            offset: 0,
            hash: hash ^ 1,
        },
        Some(&Response::SetTensorHash(0)),
    );
    out.push(s.done());
    let mut s = cached("tensor_cache_hit_past_tensor", "SET_TENSOR_HASH hit whose cached data (256 bytes) would be written at offset 16 of a 256-byte tensor (G4)");
    s.cast(&Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: weight.clone(),
            cache_flag: 1,
            offset: 0,
        }),
        data: Bytes::from(content),
    });
    out.push(s.fail(
        &Request::SetTensorHash {
            tensor: Box::new(weight),
            offset: 16,
            hash,
        },
        "region_inside_tensor",
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinels_become_placeholders() {
        let mut bytes = vec![0xaa];
        bytes.extend_from_slice(&buffer(3).to_le_bytes());
        bytes.extend_from_slice(&base(0, 0).to_le_bytes());
        bytes.extend_from_slice(&base(1, 4080).to_le_bytes());
        bytes.extend_from_slice(&base(2, -16).to_le_bytes());
        assert_eq!(
            templatize(&bytes),
            "aa{buffer3}{base0}{base1+4080}{base2-16}"
        );
        assert_eq!(base(0, 0) + 64, base(0, 64));
    }
}
