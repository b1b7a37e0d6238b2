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

mod buffers;
mod graphs;
mod lifecycle;
mod protocol;
mod tensors;
mod v8;
mod v801;

use buffers::buffer_rules;
use graphs::graph_rules;
use lifecycle::{hello_caps, lifecycle};
use protocol::protocol_rules;
use tensors::tensor_rules;
use v8::v8_only;

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
