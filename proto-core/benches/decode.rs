//! Decode throughput of the core, next to a plain memcpy of the same volume.
//!
//! * `set_tensor_stream/*`: SET_TENSOR frames (64 × 4 MiB, 4 × 64 MiB) fed to a
//!   [`ServerSession`] in 256 KiB reads, every [`ServerEvent`] consumed. `session_only` just
//!   takes the data chunks (the session slices them out of the reads without copying);
//!   `session_plus_copy` also copies each chunk into a destination buffer, as a host backend's
//!   write would.
//! * `graph_compute/*`: a 2,000-node / 5,001-tensor GRAPH_COMPUTE payload (250 transformer-like
//!   layers) through [`Request::decode`], [`Graph::decode`] (resolving every tensor against a
//!   [`BufferTable`], as the dispatcher does) and both together.
//! * `memcpy/*`: `copy_from_slice` of the same byte volumes into a preallocated buffer (in one
//!   copy, and for the SET_TENSOR volume also in 256 KiB pieces into a 4 MiB buffer, the copy
//!   pattern of `session_plus_copy/64x4MiB`).
//!
//! Every group reports `Throughput::Bytes`, so criterion prints GB/s. Sample counts and times are
//! small so that the whole run takes well under two minutes:
//! `cargo bench -p proto-core --bench decode`.

use std::hint::black_box;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use proto_core::backend::BufferId;
use proto_core::dispatch::BufferTable;
use proto_core::ggml::{flags, types::id, GgmlTable, Op, UnaryOp};
use proto_core::graph::{Graph, GraphLimits};
use proto_core::session::{ServerEvent, ServerSession, ServerSessionConfig};
use proto_core::wire::{
    Command, Dialect, GraphComputeRequest, ProtocolVersion, Request, Response, RpcTensor,
    SetTensorHeader,
};

/// Size of one simulated socket read.
const READ: usize = 256 << 10;

fn hello_frame() -> Bytes {
    Request::Hello { caps: [0; 24] }
        .to_frame(Dialect::V8)
        .expect("HELLO encodes")
}

/// HELLO is not part of the measured stream: the session is connected before the data flows.
fn connected_session() -> ServerSession {
    let mut session = ServerSession::new(ServerSessionConfig::new(Dialect::V8));
    session.handle_input(hello_frame());
    match session.poll_event() {
        Ok(Some(ServerEvent::Request(Request::Hello { .. }))) => {}
        other => panic!("expected HELLO, got {other:?}"),
    }
    let hello = Response::Hello {
        version: ProtocolVersion::LATEST,
        flags: 0,
        caps: [0; 24],
    };
    session.send_response(&hello).expect("HELLO is owed");
    while session.poll_transmit().is_some() {}
    session
}

/// `count` SET_TENSOR frames of `size` data bytes each, back to back.
fn set_tensor_stream(count: usize, size: usize) -> Bytes {
    let mut stream = BytesMut::with_capacity(count * (size + 9 + SetTensorHeader::SIZE));
    let data: Bytes = (0..size).map(|i| i as u8).collect::<Vec<u8>>().into();
    for i in 0..count {
        let mut tensor = RpcTensor::contiguous(i as u64 + 1, id::F32, [(size / 4) as u32, 1, 1, 1])
            .expect("valid tensor");
        tensor.buffer = 0x9e37_79b9_7f4a_7c15;
        tensor.data = 0x1000_0000_0000;
        let request = Request::SetTensor {
            header: Box::new(SetTensorHeader {
                tensor,
                cache_flag: 0,
                offset: 0,
            }),
            data: data.clone(),
        };
        request
            .encode_head(Dialect::V8, &mut stream)
            .expect("encodes");
        stream.extend_from_slice(&data);
    }
    stream.freeze()
}

/// Feeds `stream` in [`READ`]-byte reads and consumes every event; returns the data bytes seen.
fn run_stream(stream: &Bytes, mut sink: impl FnMut(&[u8])) -> u64 {
    let mut session = connected_session();
    let mut data = 0u64;
    let mut at = 0;
    while at < stream.len() {
        let end = (at + READ).min(stream.len());
        session.handle_input(stream.slice(at..end));
        at = end;
        while let Some(event) = session.poll_event().expect("valid stream") {
            match event {
                ServerEvent::TensorData(chunk) => {
                    data += chunk.len() as u64;
                    sink(&chunk);
                }
                other => {
                    black_box(other);
                }
            }
        }
    }
    data
}

fn bench_set_tensor(c: &mut Criterion) {
    let mut group = c.benchmark_group("set_tensor_stream");
    for (name, count, size) in [("64x4MiB", 64, 4 << 20), ("4x64MiB", 4, 64 << 20)] {
        let stream = set_tensor_stream(count, size);
        let expected = (count * size) as u64;
        group.throughput(Throughput::Bytes(stream.len() as u64));
        group.bench_function(format!("session_only/{name}"), |b| {
            b.iter(|| {
                let seen = run_stream(&stream, |chunk| {
                    black_box(chunk);
                });
                assert_eq!(seen, expected);
            })
        });
        let mut destination = vec![0u8; size];
        group.bench_function(format!("session_plus_copy/{name}"), |b| {
            b.iter(|| {
                let mut offset = 0;
                let seen = run_stream(&stream, |chunk| {
                    if offset + chunk.len() > destination.len() {
                        offset = 0;
                    }
                    destination[offset..offset + chunk.len()].copy_from_slice(chunk);
                    offset += chunk.len();
                });
                assert_eq!(seen, expected);
                black_box(&destination);
            })
        });
    }
    group.finish();
}

/// Tokens in the batch the graph computes.
const TOKENS: u32 = 32;
/// Model width.
const EMBED: u32 = 4096;
/// Feed-forward width (a multiple of 256 for Q4_K).
const FFN: u32 = 11008;
/// Layers: 12 leaves and 8 nodes each.
const LAYERS: usize = 250;

struct GraphBuilder {
    tensors: Vec<RpcTensor>,
    nodes: Vec<u64>,
    buffer: u64,
    base: u64,
    cursor: u64,
}

impl GraphBuilder {
    fn add(&mut self, type_id: u32, ne: [u32; 4], op: Op, src: &[u64], name: String) -> u64 {
        let id = self.tensors.len() as u64 + 1;
        let mut tensor = RpcTensor::contiguous(id, type_id, ne).expect("valid shape");
        tensor.op = op.0;
        tensor.src[..src.len()].copy_from_slice(src);
        tensor.buffer = self.buffer;
        tensor.data = self.base + self.cursor;
        tensor.set_name(&name);
        self.cursor += tensor.byte_size().expect("fits").next_multiple_of(32);
        if op != Op::NONE {
            tensor.flags = flags::COMPUTE;
            tensor.use_count = 1;
            self.nodes.push(id);
        }
        self.tensors.push(tensor);
        id
    }

    fn view(&mut self, source: u64, ne: [u32; 4], name: String) -> u64 {
        let id = self.add(id::F16, ne, Op::VIEW, &[source], name);
        let data = self.tensors[source as usize - 1].data;
        let view = self.tensors.last_mut().expect("just added");
        view.view_src = source;
        view.data = data;
        id
    }
}

/// A llama-like graph: 250 layers of 12 leaves (norms, Q4_K projections, F16 KV cache, positions)
/// and 8 nodes, 2,000 nodes and 5,001 tensors in all, every tensor in one buffer.
fn realistic_graph(table: &mut BufferTable) -> GraphComputeRequest {
    let buffer = table
        .insert(BufferId(1), 0, 1 << 40)
        .expect("address space");
    let base = table.get(buffer).expect("inserted").base;
    let mut g = GraphBuilder {
        tensors: Vec::new(),
        nodes: Vec::new(),
        buffer,
        base,
        cursor: 0,
    };
    let act = [EMBED, TOKENS, 1, 1];
    let mut x = g.add(id::F32, act, Op::NONE, &[], "inp_embd".into());
    for layer in 0..LAYERS {
        let w = |n: &str| format!("blk.{layer}.{n}");
        let norm1 = g.add(
            id::F32,
            [EMBED, 1, 1, 1],
            Op::NONE,
            &[],
            w("attn_norm.weight"),
        );
        let wq = g.add(
            id::Q4_K,
            [EMBED, EMBED, 1, 1],
            Op::NONE,
            &[],
            w("attn_q.weight"),
        );
        let _wk = g.add(
            id::Q4_K,
            [EMBED, EMBED, 1, 1],
            Op::NONE,
            &[],
            w("attn_k.weight"),
        );
        let _wv = g.add(
            id::Q4_K,
            [EMBED, EMBED, 1, 1],
            Op::NONE,
            &[],
            w("attn_v.weight"),
        );
        let wo = g.add(
            id::Q4_K,
            [EMBED, EMBED, 1, 1],
            Op::NONE,
            &[],
            w("attn_output.weight"),
        );
        let _norm2 = g.add(
            id::F32,
            [EMBED, 1, 1, 1],
            Op::NONE,
            &[],
            w("ffn_norm.weight"),
        );
        let _wg = g.add(
            id::Q4_K,
            [EMBED, FFN, 1, 1],
            Op::NONE,
            &[],
            w("ffn_gate.weight"),
        );
        let _wu = g.add(
            id::Q4_K,
            [EMBED, FFN, 1, 1],
            Op::NONE,
            &[],
            w("ffn_up.weight"),
        );
        let _wd = g.add(
            id::Q4_K,
            [FFN, EMBED, 1, 1],
            Op::NONE,
            &[],
            w("ffn_down.weight"),
        );
        let k_cache = g.add(
            id::F16,
            [EMBED, 512, 1, 1],
            Op::NONE,
            &[],
            format!("cache_k_l{layer}"),
        );
        let _v_cache = g.add(
            id::F16,
            [EMBED, 512, 1, 1],
            Op::NONE,
            &[],
            format!("cache_v_l{layer}"),
        );
        let pos = g.add(
            id::I32,
            [TOKENS, 1, 1, 1],
            Op::NONE,
            &[],
            format!("inp_pos_l{layer}"),
        );

        let normed = g.add(id::F32, act, Op::RMS_NORM, &[x], format!("norm-{layer}"));
        let scaled = g.add(
            id::F32,
            act,
            Op::MUL,
            &[normed, norm1],
            format!("attn_norm-{layer}"),
        );
        let q = g.add(
            id::F32,
            act,
            Op::MUL_MAT,
            &[wq, scaled],
            format!("Qcur-{layer}"),
        );
        let roped = g.add(id::F32, act, Op::ROPE, &[q, pos], format!("Qrope-{layer}"));
        let k_view = g.view(k_cache, act, format!("k_cache_view-{layer}"));
        let attn = g.add(
            id::F32,
            act,
            Op::MUL_MAT,
            &[wo, roped, k_view],
            format!("attn_out-{layer}"),
        );
        let gate = g.add(
            id::F32,
            act,
            Op::UNARY,
            &[attn],
            format!("ffn_silu-{layer}"),
        );
        g.tensors.last_mut().expect("added").op_params[0] = UnaryOp::SILU.0;
        x = g.add(id::F32, act, Op::ADD, &[gate, x], format!("l_out-{layer}"));
    }
    assert_eq!(g.nodes.len(), 8 * LAYERS);
    GraphComputeRequest {
        device: 0,
        uid: 7,
        node_ids: g.nodes,
        tensors: g.tensors,
    }
}

fn bench_graph(c: &mut Criterion) {
    let mut table = BufferTable::new(GgmlTable::V8_0_1);
    let request = realistic_graph(&mut table);
    let mut payload = BytesMut::new();
    request.encode(Dialect::V8, &mut payload);
    let payload = payload.freeze();
    let limits = GraphLimits::default();
    let decode_graph = |request: &GraphComputeRequest| {
        Graph::decode(request, &limits, GgmlTable::V8_0_1, &mut |tensor, _| {
            table.location(tensor)
        })
        .expect("valid graph")
    };
    // Sanity: the payload decodes to the request and the graph validates.
    let Request::GraphCompute(decoded) =
        Request::decode(Command::GraphCompute, Dialect::V8, payload.clone()).expect("decodes")
    else {
        panic!("not a graph");
    };
    assert_eq!(*decoded, request);
    let graph = decode_graph(&decoded);
    assert_eq!((graph.nodes.len(), graph.tensors.len()), (2000, 5001));

    let mut group = c.benchmark_group("graph_compute");
    group.throughput(Throughput::Bytes(payload.len() as u64));
    group.bench_function("request_decode", |b| {
        b.iter(|| {
            Request::decode(
                Command::GraphCompute,
                Dialect::V8,
                black_box(payload.clone()),
            )
        })
    });
    group.bench_function("graph_decode", |b| {
        b.iter(|| decode_graph(black_box(&decoded)))
    });
    group.bench_function("request_plus_graph_decode", |b| {
        b.iter(|| {
            let Ok(Request::GraphCompute(request)) = Request::decode(
                Command::GraphCompute,
                Dialect::V8,
                black_box(payload.clone()),
            ) else {
                panic!("not a graph");
            };
            decode_graph(&request)
        })
    });
    group.finish();
}

fn bench_memcpy(c: &mut Criterion) {
    let mut group = c.benchmark_group("memcpy");
    let stream_volume = 64 * (9 + SetTensorHeader::SIZE + (4 << 20));
    let mut table = BufferTable::new(GgmlTable::V8_0_1);
    let graph_volume = realistic_graph(&mut table).encoded_len(Dialect::V8);
    for (name, len) in [
        ("set_tensor_volume", stream_volume),
        ("graph_payload_volume", graph_volume),
    ] {
        let source: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut destination = vec![0u8; len];
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                destination.copy_from_slice(black_box(&source));
                black_box(&destination);
            })
        });
    }
    // The copy `session_plus_copy/64x4MiB` does, without the session: 256 KiB reads of the
    // same volume into a 4 MiB destination (warm in cache, unlike the flat copy above).
    let source: Vec<u8> = (0..stream_volume).map(|i| i as u8).collect();
    let mut destination = vec![0u8; 4 << 20];
    group.throughput(Throughput::Bytes(stream_volume as u64));
    group.bench_function("set_tensor_volume_in_256KiB_reads_into_4MiB", |b| {
        b.iter(|| {
            let mut offset = 0;
            for piece in black_box(&source).chunks(READ) {
                if offset + piece.len() > destination.len() {
                    offset = 0;
                }
                destination[offset..offset + piece.len()].copy_from_slice(piece);
                offset += piece.len();
            }
            black_box(&destination);
        })
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_set_tensor, bench_graph, bench_memcpy
}
criterion_main!(benches);
