//! The command scenario our `ggml_rpc_client::Client` runs against a server (llama.cpp's or ours).
//!
//! Included by `tests/tests/interop_*.rs` after `harness.rs`, with
//! `#[path = "../interop/scenario.rs"] mod scenario;`.
//!
//! [`run`] exercises every command the client has, checks every byte it reads back against a
//! host-side model of the server buffer, and returns the [`Facts`]: the answers that must not
//! depend on which server implementation is behind the socket (alignment, sizes, copy and cache
//! results, ...), so that llama.cpp's server and ours can be compared answer for answer.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use ggml_rpc_client::{Client, ClientError, RemoteBuffer};
use proto_core::ggml::{flags, types::id, Op};
use proto_core::session::GraphSubmission;
use proto_core::tensor_cache::fnv1a64;
use proto_core::wire::{Dialect, GraphComputeRequest, RpcTensor};

use crate::harness::{first_difference, hex, pattern};

/// ggml's I8 type: one byte per element, any length, any address.
pub const I8: u32 = 24;

/// Server answers that must be identical for every correct server of the same protocol.
pub type Facts = BTreeMap<String, String>;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Sizes of the big round trips, each in a buffer of its own, at an odd address.
    pub big_sizes: Vec<usize>,
    /// Whether the server was started with a tensor cache (SET_TENSOR_HASH can hit).
    pub server_has_cache: bool,
}

/// Deadline of one command (the 256 MiB transfers included, in debug builds).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(120);

type Res<T> = Result<T, String>;

async fn step<T>(label: &str, fut: impl Future<Output = Result<T, ClientError>>) -> Res<T> {
    match tokio::time::timeout(STEP_TIMEOUT, fut).await {
        Err(_) => Err(format!("{label}: no answer within {STEP_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("{label}: {e} ({e:?})")),
        Ok(Ok(v)) => Ok(v),
    }
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Res<()> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

fn compare(got: &[u8], want: &[u8], what: &str) -> Res<()> {
    match first_difference(got, want) {
        None => Ok(()),
        Some(at) => Err(format!(
            "{what}: got {} bytes, want {}; first difference at byte {at}: got {} want {}",
            got.len(),
            want.len(),
            hex(&got[at.min(got.len())..(at + 16).min(got.len())]),
            hex(&want[at.min(want.len())..(at + 16).min(want.len())]),
        )),
    }
}

/// A server buffer, its base and the model of its bytes.
struct Buf {
    remote: RemoteBuffer,
    base: u64,
    model: Vec<u8>,
}

struct Ids(u64);

impl Ids {
    fn next(&mut self) -> u64 {
        self.0 += 0x130;
        self.0
    }
}

/// A tensor of `type_id`/`ne` placed at `offset` inside `buf` (data = base + offset, as a
/// llama.cpp client computes it from BUFFER_GET_BASE).
fn tensor(
    ids: &mut Ids,
    buf: &Buf,
    type_id: u32,
    ne: [u32; 4],
    offset: u64,
    name: &str,
) -> RpcTensor {
    let mut t = RpcTensor::contiguous(ids.next(), type_id, ne).expect("valid type");
    t.buffer = buf.remote.handle;
    t.data = buf.base + offset;
    t.set_name(name);
    t
}

fn bytes_tensor(ids: &mut Ids, buf: &Buf, offset: u64, len: usize, name: &str) -> RpcTensor {
    tensor(ids, buf, I8, [len as u32, 1, 1, 1], offset, name)
}

async fn alloc(c: &mut Client, size: u64, fill: u8, what: &str) -> Res<Buf> {
    let remote = step(
        &format!("ALLOC_BUFFER {size} ({what})"),
        c.alloc_buffer(0, size),
    )
    .await?
    .ok_or_else(|| format!("ALLOC_BUFFER {size} ({what}) failed (null handle)"))?;
    ensure(remote.size == size, || {
        format!(
            "ALLOC_BUFFER {size}: the server reports size {}",
            remote.size
        )
    })?;
    let base = step("BUFFER_GET_BASE", c.buffer_base(remote.handle)).await?;
    ensure(base != 0, || {
        format!("BUFFER_GET_BASE of a {size}-byte buffer: 0")
    })?;
    step("BUFFER_CLEAR", c.buffer_clear(remote.handle, fill)).await?;
    Ok(Buf {
        remote,
        base,
        model: vec![fill; size as usize],
    })
}

/// Reads the whole buffer back and compares it with the model.
async fn verify(c: &mut Client, ids: &mut Ids, buf: &Buf, after: &str) -> Res<()> {
    let whole = bytes_tensor(ids, buf, 0, buf.model.len(), "whole");
    let got = step(
        &format!("GET_TENSOR of the whole buffer after {after}"),
        c.get_tensor(&whole, 0, buf.model.len() as u64),
    )
    .await?;
    compare(&got, &buf.model, &format!("the buffer after {after}"))
}

/// SET_TENSOR of `data` into a fresh tensor at `offset`, GET_TENSOR of it back.
async fn round_trip(
    c: &mut Client,
    ids: &mut Ids,
    buf: &mut Buf,
    offset: u64,
    data: Vec<u8>,
    what: &str,
) -> Res<()> {
    let len = data.len();
    let t = bytes_tensor(ids, buf, offset, len, what);
    let data = Bytes::from(data);
    step(
        &format!("SET_TENSOR {what} ({len} bytes at +{offset})"),
        c.set_tensor(&t, 0, data.clone()),
    )
    .await?;
    let got = step(
        &format!("GET_TENSOR {what} ({len} bytes at +{offset})"),
        c.get_tensor(&t, 0, len as u64),
    )
    .await?;
    compare(
        &got,
        &data,
        &format!("round trip of {what} ({len} bytes at buffer offset {offset})"),
    )?;
    buf.model[offset as usize..offset as usize + len].copy_from_slice(&data);
    Ok(())
}

/// Runs the scenario; `Err` describes the first failure.
pub async fn run(c: &mut Client, options: &Options) -> Res<Facts> {
    let mut facts = Facts::new();
    let mut ids = Ids(0x5000_0000);
    let v8 = c.dialect() == Dialect::V8;
    facts.insert("server version".into(), c.server_version().to_string());
    facts.insert("hello flags".into(), c.server_flags().to_string());

    // DEVICE_COUNT, GET_DEVICE_MEMORY, GET_ALIGNMENT, GET_MAX_SIZE
    let devices = step("DEVICE_COUNT", c.device_count()).await?;
    facts.insert("device count".into(), devices.to_string());
    let memory = step("GET_DEVICE_MEMORY", c.device_memory(0)).await?;
    ensure(memory.total > 0 && memory.free <= memory.total, || {
        format!(
            "GET_DEVICE_MEMORY: free {} of total {}",
            memory.free, memory.total
        )
    })?;
    let alignment = step("GET_ALIGNMENT", c.alignment(0)).await?;
    facts.insert("alignment".into(), alignment.to_string());
    let max_size = step("GET_MAX_SIZE", c.max_size(0)).await?;
    facts.insert("max size".into(), max_size.to_string());

    // ALLOC_BUFFER of 0 bytes: a dummy buffer whose base is 0
    let zero = step("ALLOC_BUFFER 0", c.alloc_buffer(0, 0)).await?;
    match zero {
        None => {
            facts.insert("alloc 0".into(), "null handle".into());
        }
        Some(zero) => {
            let base = step(
                "BUFFER_GET_BASE of the 0-byte buffer",
                c.buffer_base(zero.handle),
            )
            .await?;
            step(
                "BUFFER_CLEAR of the 0-byte buffer",
                c.buffer_clear(zero.handle, 7),
            )
            .await?;
            facts.insert("alloc 0".into(), format!("size {} base {base}", zero.size));
            step(
                "FREE_BUFFER of the 0-byte buffer",
                c.free_buffer(zero.handle),
            )
            .await?;
        }
    }

    // One 4 MiB + 17 buffer for everything small; BUFFER_GET_BASE, BUFFER_CLEAR
    let size = (4 << 20) + 17;
    let mut buf = alloc(c, size, 0xAA, "main").await?;
    facts.insert(
        "base aligned".into(),
        (buf.base % alignment.max(1) == 0).to_string(),
    );
    verify(c, &mut ids, &buf, "BUFFER_CLEAR 0xaa").await?;
    step("BUFFER_CLEAR 0x3c", c.buffer_clear(buf.remote.handle, 0x3c)).await?;
    buf.model.fill(0x3c);
    verify(c, &mut ids, &buf, "BUFFER_CLEAR 0x3c").await?;

    // SET_TENSOR / GET_TENSOR: 1 byte at both ends, odd sizes at odd offsets, 1 MiB
    let cases: [(u64, usize); 8] = [
        (0, 1),
        (size - 1, 1),
        (1, 3),
        (13, 4097),
        (101, 65_537),
        (7_777, 1_000_003),
        (1_048_579, 1 << 20),
        (3 << 20, 999_999),
    ];
    for (i, &(offset, len)) in cases.iter().enumerate() {
        round_trip(
            c,
            &mut ids,
            &mut buf,
            offset,
            pattern(len, 100 + i as u64),
            &format!("case {i}"),
        )
        .await?;
    }
    verify(c, &mut ids, &buf, "the odd round trips").await?;

    // SET_TENSOR / GET_TENSOR with a non-zero offset inside the tensor
    let t = bytes_tensor(&mut ids, &buf, 3, 10_000, "inner");
    let data = Bytes::from(pattern(999, 7));
    step(
        "SET_TENSOR at tensor offset 5",
        c.set_tensor(&t, 5, data.clone()),
    )
    .await?;
    buf.model[8..8 + 999].copy_from_slice(&data);
    let got = step("GET_TENSOR at tensor offset 5", c.get_tensor(&t, 5, 999)).await?;
    compare(&got, &data, "GET_TENSOR at tensor offset 5")?;
    let got = step(
        "GET_TENSOR at tensor offset 9999",
        c.get_tensor(&t, 9_999, 1),
    )
    .await?;
    compare(
        &got,
        &buf.model[3 + 9_999..3 + 10_000],
        "GET_TENSOR of the tensor's last byte",
    )?;
    let got = step("GET_TENSOR of 0 bytes", c.get_tensor(&t, 17, 0)).await?;
    ensure(got.is_empty(), || {
        "GET_TENSOR of 0 bytes returned data".into()
    })?;

    // COPY_TENSOR (F32, same buffer, odd destination address)
    let src = tensor(&mut ids, &buf, id::F32, [250, 4, 1, 1], 64, "copy.src");
    let dst = tensor(
        &mut ids,
        &buf,
        id::F32,
        [250, 4, 1, 1],
        (2 << 20) + 1,
        "copy.dst",
    );
    let n = 250 * 4 * 4;
    let copied = step("COPY_TENSOR", c.copy_tensor(&src, &dst)).await?;
    facts.insert("copy tensor".into(), copied.to_string());
    if copied {
        let from = buf.model[64..64 + n].to_vec();
        buf.model[(2 << 20) + 1..(2 << 20) + 1 + n].copy_from_slice(&from);
    }
    verify(c, &mut ids, &buf, "COPY_TENSOR").await?;

    // MEMSET_TENSOR (inside a tensor at an odd address)
    let t = bytes_tensor(&mut ids, &buf, 5, 3_001, "memset");
    step("MEMSET_TENSOR", c.memset_tensor(&t, 7, 1_000, 0xC3)).await?;
    buf.model[12..1_012].fill(0xC3);
    step(
        "MEMSET_TENSOR of the last byte",
        c.memset_tensor(&t, 3_000, 1, 0x01),
    )
    .await?;
    buf.model[5 + 3_000] = 0x01;
    verify(c, &mut ids, &buf, "MEMSET_TENSOR").await?;

    // INIT_TENSOR of a quantized tensor (no response: the next command proves it was accepted)
    let q8 = tensor(&mut ids, &buf, id::Q8_0, [96, 3, 1, 1], 4_096, "q8");
    step("INIT_TENSOR", c.init_tensor(&q8)).await?;
    verify(c, &mut ids, &buf, "INIT_TENSOR").await?;

    // GET_ALLOC_SIZE: quantized in a buffer, plain F32 without a buffer, MUL_MAT with sources
    facts.insert(
        "alloc size q8_0[96,3] in buffer".into(),
        step("GET_ALLOC_SIZE q8", c.alloc_size(0, &q8, &[]))
            .await?
            .to_string(),
    );
    let mut loose = RpcTensor::contiguous(ids.next(), id::F32, [4097, 1, 1, 1]).unwrap();
    loose.set_name("loose");
    facts.insert(
        "alloc size f32[4097] no buffer".into(),
        step("GET_ALLOC_SIZE f32", c.alloc_size(0, &loose, &[]))
            .await?
            .to_string(),
    );
    let a = RpcTensor::contiguous(ids.next(), id::F32, [64, 32, 1, 1]).unwrap();
    let b = RpcTensor::contiguous(ids.next(), id::F32, [64, 64, 1, 1]).unwrap();
    let mut mm = RpcTensor::contiguous(ids.next(), id::F32, [32, 64, 1, 1]).unwrap();
    mm.op = Op::MUL_MAT.0;
    mm.src[0] = a.id;
    mm.src[1] = b.id;
    facts.insert(
        "alloc size mul_mat".into(),
        step("GET_ALLOC_SIZE mul_mat", c.alloc_size(0, &mm, &[a, b]))
            .await?
            .to_string(),
    );
    let mut strided = mm.clone();
    strided.id = ids.next();
    strided.nb[1] *= 2;
    strided.nb[2] = strided.nb[1] * strided.ne[1];
    strided.nb[3] = strided.nb[2];
    facts.insert(
        "alloc size strided mul_mat".into(),
        step("GET_ALLOC_SIZE strided", c.alloc_size(0, &strided, &[]))
            .await?
            .to_string(),
    );

    // SET_TENSOR_HASH: a miss answers 0; with a cache, SET_TENSOR with cache_flag 1 stores the
    // data and the next SET_TENSOR_HASH of the same bytes hits and writes them
    let data = Bytes::from(pattern(1 << 20, 0xCAC4E));
    let hash = fnv1a64(&data);
    let at = 1_048_579u64;
    let t = bytes_tensor(&mut ids, &buf, at, data.len(), "hashed");
    // a hash no one has stored: 0 for every server, with or without a cache
    let miss = step(
        "SET_TENSOR_HASH (unknown hash)",
        c.set_tensor_hash(&t, 0, hash ^ 0x5a5a_5a5a_5a5a_5a5a),
    )
    .await?;
    facts.insert("set tensor hash unknown".into(), miss.to_string());
    verify(c, &mut ids, &buf, "SET_TENSOR_HASH miss").await?;
    step(
        "SET_TENSOR with cache_flag 1",
        c.set_tensor_with_cache_flag(&t, 0, data.clone(), true),
    )
    .await?;
    buf.model[at as usize..at as usize + data.len()].copy_from_slice(&data);
    verify(c, &mut ids, &buf, "SET_TENSOR with cache_flag 1").await?;
    step(
        "MEMSET_TENSOR (wipe the hashed tensor)",
        c.memset_tensor(&t, 0, data.len() as u64, 0),
    )
    .await?;
    buf.model[at as usize..at as usize + data.len()].fill(0);
    let hit = step(
        "SET_TENSOR_HASH (stored hash)",
        c.set_tensor_hash(&t, 0, hash),
    )
    .await?;
    if options.server_has_cache {
        facts.insert("set tensor hash stored".into(), hit.to_string());
        ensure(hit, || {
            "SET_TENSOR_HASH: a server with a cache did not find the data just stored with cache_flag 1".into()
        })?;
    } else {
        ensure(!hit, || {
            "SET_TENSOR_HASH: a server without a cache answered 1".into()
        })?;
    }
    if hit {
        buf.model[at as usize..at as usize + data.len()].copy_from_slice(&data);
    }
    verify(c, &mut ids, &buf, "SET_TENSOR_HASH").await?;

    // GRAPH_COMPUTE of a view-only graph, then the same uid again: GRAPH_RECOMPUTE
    let leaf = tensor(&mut ids, &buf, id::F32, [256, 1, 1, 1], 8_192, "leaf");
    let mut view = RpcTensor::contiguous(ids.next(), id::F32, [100, 1, 1, 1]).unwrap();
    view.buffer = buf.remote.handle;
    view.data = leaf.data + 40;
    view.op = Op::VIEW.0;
    view.op_params[0] = 40;
    view.flags = flags::COMPUTE;
    view.src[0] = leaf.id;
    view.view_src = leaf.id;
    view.view_offs = 40;
    view.set_name("leaf (view)");
    let graph = GraphComputeRequest {
        device: 0,
        uid: 0x0bad_cafe,
        node_ids: vec![view.id],
        tensors: vec![leaf.clone(), view.clone()],
    };
    let first = step("GRAPH_COMPUTE", c.graph_compute(&graph)).await?;
    ensure(first == GraphSubmission::Compute, || {
        format!("first submission was {first:?}")
    })?;
    verify(c, &mut ids, &buf, "GRAPH_COMPUTE").await?;
    let second = step("GRAPH_RECOMPUTE", c.graph_compute(&graph)).await?;
    ensure(second == GraphSubmission::Recompute, || {
        format!("second submission was {second:?}")
    })?;
    verify(c, &mut ids, &buf, "GRAPH_RECOMPUTE").await?;
    let got = step("GET_TENSOR through the view", c.get_tensor(&view, 0, 400)).await?;
    compare(
        &got,
        &buf.model[8_192 + 40..8_192 + 440],
        "GET_TENSOR through the view",
    )?;

    // GRAPH_COMPUTE of a real MUL_MAT: Y[3,2] = W[4,3] x X[4,2], small integers so that the
    // sums are exact in any summation order
    let w_vals: Vec<f32> = (0..12).map(|i| (i % 5) as f32 - 2.0).collect();
    let x_vals: Vec<f32> = (0..8).map(|i| (i % 3) as f32 + 1.0).collect();
    let w = tensor(&mut ids, &buf, id::F32, [4, 3, 1, 1], 12_288, "w");
    let x = tensor(&mut ids, &buf, id::F32, [4, 2, 1, 1], 12_352, "x");
    let mut y = tensor(&mut ids, &buf, id::F32, [3, 2, 1, 1], 12_416, "y");
    y.op = Op::MUL_MAT.0;
    y.src[0] = w.id;
    y.src[1] = x.id;
    y.flags = flags::COMPUTE | flags::OUTPUT;
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    for (t, vals, at) in [(&w, &w_vals, 12_288usize), (&x, &x_vals, 12_352)] {
        let data = f32_bytes(vals);
        step(
            "SET_TENSOR (mul_mat input)",
            c.set_tensor(t, 0, Bytes::from(data.clone())),
        )
        .await?;
        buf.model[at..at + data.len()].copy_from_slice(&data);
    }
    let (mut w_rec, mut x_rec) = (w.clone(), x.clone());
    w_rec.use_count = 1;
    x_rec.use_count = 1;
    let graph = GraphComputeRequest {
        device: 0,
        uid: 0,
        node_ids: vec![y.id],
        tensors: vec![w_rec, x_rec, y.clone()],
    };
    step("GRAPH_COMPUTE (mul_mat)", c.graph_compute(&graph)).await?;
    let want: Vec<f32> = (0..2)
        .flat_map(|n| {
            let (w_vals, x_vals) = (&w_vals, &x_vals);
            (0..3).map(move |m| {
                (0..4)
                    .map(|k| w_vals[m * 4 + k] * x_vals[n * 4 + k])
                    .sum::<f32>()
            })
        })
        .collect();
    buf.model[12_416..12_416 + 24].copy_from_slice(&f32_bytes(&want));
    let got = step("GET_TENSOR (mul_mat result)", c.get_tensor(&y, 0, 24)).await?;
    compare(
        &got,
        &f32_bytes(&want),
        &format!("MUL_MAT result (want {want:?})"),
    )?;
    facts.insert("mul_mat result".into(), format!("{want:?}"));
    verify(c, &mut ids, &buf, "GRAPH_COMPUTE of MUL_MAT").await?;

    // GRAPH_COMPUTE of a UNARY op (NEG of the MUL_MAT result): UNARY is op 91 in protocol
    // 7.0.0/8.0.0 and 92 in 8.0.1 (TOP_K_MASK was inserted before it), so this proves that the
    // client sends the server's numbering (`Client::server_table`)
    let mut z = tensor(&mut ids, &buf, id::F32, [3, 2, 1, 1], 12_480, "z");
    z.op = Op::UNARY.0;
    z.op_params[0] = proto_core::ggml::UnaryOp::NEG.0;
    z.src[0] = y.id;
    z.flags = flags::COMPUTE | flags::OUTPUT;
    let mut y_rec = y.clone();
    y_rec.op = Op::NONE.0;
    y_rec.src.fill(0);
    y_rec.use_count = 1;
    let graph = GraphComputeRequest {
        device: 0,
        uid: 0,
        node_ids: vec![z.id],
        tensors: vec![y_rec, z.clone()],
    };
    step("GRAPH_COMPUTE (unary neg)", c.graph_compute(&graph)).await?;
    let neg: Vec<f32> = want.iter().map(|v| -v).collect();
    buf.model[12_480..12_480 + 24].copy_from_slice(&f32_bytes(&neg));
    let got = step("GET_TENSOR (neg result)", c.get_tensor(&z, 0, 24)).await?;
    compare(
        &got,
        &f32_bytes(&neg),
        &format!("UNARY NEG result (want {neg:?})"),
    )?;
    facts.insert("unary neg result".into(), format!("{neg:?}"));
    facts.insert(
        "unary wire op".into(),
        format!("{:?}", c.server_table().op_to_wire(Op::UNARY)),
    );
    verify(c, &mut ids, &buf, "GRAPH_COMPUTE of UNARY NEG").await?;

    // SET_TENSOR_2D / GET_TENSOR_2D (protocol 8)
    if v8 {
        let rows = bytes_tensor(&mut ids, &buf, (3 << 20) + 1_000_000, 64 * 16, "rows");
        let r0 = (3 << 20) + 1_000_000usize;
        let packed = pattern(5 * 10, 0x2D);
        step(
            "SET_TENSOR_2D",
            c.set_tensor_2d(&rows, 3, 10, 5, 70, Bytes::from(packed.clone())),
        )
        .await?;
        for i in 0..5 {
            buf.model[r0 + 3 + 70 * i..r0 + 3 + 70 * i + 10]
                .copy_from_slice(&packed[10 * i..10 * i + 10]);
        }
        verify(c, &mut ids, &buf, "SET_TENSOR_2D").await?;
        let got = step("GET_TENSOR_2D", c.get_tensor_2d(&rows, 1, 20, 4, 64)).await?;
        let want: Vec<u8> = (0..4)
            .flat_map(|i| buf.model[r0 + 1 + 64 * i..r0 + 1 + 64 * i + 20].to_vec())
            .collect();
        compare(&got, &want, "GET_TENSOR_2D")?;
        // stride 0: every copy lands on the same bytes, the last one wins
        let packed = pattern(3 * 8, 0x2E);
        step(
            "SET_TENSOR_2D stride 0",
            c.set_tensor_2d(&rows, 100, 8, 3, 0, Bytes::from(packed.clone())),
        )
        .await?;
        buf.model[r0 + 100..r0 + 108].copy_from_slice(&packed[16..24]);
        verify(c, &mut ids, &buf, "SET_TENSOR_2D with stride 0").await?;
        let got = step(
            "GET_TENSOR_2D stride 0",
            c.get_tensor_2d(&rows, 100, 8, 3, 0),
        )
        .await?;
        compare(
            &got,
            &packed[16..24].repeat(3),
            "GET_TENSOR_2D with stride 0",
        )?;
        // one copy, the whole tensor
        let whole = pattern(64 * 16, 0x2F);
        step(
            "SET_TENSOR_2D one copy",
            c.set_tensor_2d(&rows, 0, 64 * 16, 1, 64 * 16, Bytes::from(whole.clone())),
        )
        .await?;
        buf.model[r0..r0 + 64 * 16].copy_from_slice(&whole);
        verify(c, &mut ids, &buf, "SET_TENSOR_2D of one copy").await?;
    }

    // Big round trips, each in a buffer of its own, at an odd address
    for &len in &options.big_sizes {
        let mut big = alloc(c, len as u64 + 1, 0x00, &format!("{len} bytes")).await?;
        round_trip(
            c,
            &mut ids,
            &mut big,
            1,
            pattern(len, len as u64),
            &format!("{} MiB", len >> 20),
        )
        .await?;
        let got = step(
            "GET_TENSOR of the big buffer's first byte",
            c.get_tensor(&bytes_tensor(&mut ids, &big, 0, 1, "first"), 0, 1),
        )
        .await?;
        compare(&got, &[0], "the byte before the big tensor")?;
        step("FREE_BUFFER (big)", c.free_buffer(big.remote.handle)).await?;
    }

    // FREE_BUFFER; the connection stays usable
    step("FREE_BUFFER", c.free_buffer(buf.remote.handle)).await?;
    let again = step("DEVICE_COUNT after FREE_BUFFER", c.device_count()).await?;
    ensure(again == devices, || {
        format!("DEVICE_COUNT changed from {devices} to {again}")
    })?;
    Ok(facts)
}

/// Compares two fact sets, naming every difference.
pub fn diff_facts(theirs: &Facts, ours: &Facts) -> Vec<String> {
    let mut out = Vec::new();
    for key in theirs.keys().chain(ours.keys()) {
        let (a, b) = (theirs.get(key), ours.get(key));
        if a != b
            && !out
                .iter()
                .any(|line: &String| line.starts_with(&format!("{key}:")))
        {
            out.push(format!("{key}: llama.cpp {a:?}, ours {b:?}"));
        }
    }
    out
}
