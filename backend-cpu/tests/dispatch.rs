//! The connection driver every shell runs, over a [`CpuBackend`], driven by our client through
//! `proto_core::testing::Pair` (every byte stream cut at random points, SET data received
//! straight into backend memory and large replies sent from it, as a shell with a socket does).

use std::sync::Arc;

use backend_cpu::{CpuBackend, CpuConfig};
use bytes::Bytes;
use proto_core::backend::Backend;
use proto_core::dispatch::DispatcherConfig;
use proto_core::ggml::types::id;
use proto_core::ggml::{flags, Op};
use proto_core::session::ClientEvent;
use proto_core::testing::Pair;
use proto_core::wire::{
    AllocSizeRequest, GraphComputeRequest, ProtocolVersion, Request, Response, RpcTensor,
    SetTensorHeader,
};
use proto_core::{Error, ErrorKind};

type Conn = Pair<CpuBackend>;

fn cpu() -> Arc<CpuBackend> {
    Arc::new(CpuBackend::new(CpuConfig {
        threads: 1,
        ..CpuConfig::default()
    }))
}

fn connect(backend: &Arc<CpuBackend>, version: ProtocolVersion) -> Conn {
    let config = DispatcherConfig::new(version);
    let mut pair = Pair::with_backend(version, backend.clone(), config, 7).in_place();
    let ClientEvent::Connected(hello) = pair.connect() else {
        panic!("HELLO not answered");
    };
    assert_eq!(hello.version, version);
    pair
}

/// Sends a request; its response if it has one, else `None`; the error that closed the
/// connection if it failed.
fn request(conn: &mut Conn, request: Request) -> Result<Option<Response>, Error> {
    conn.client.send(&request).unwrap();
    let events = conn.drive().unwrap();
    if let Some(error) = &conn.server_error {
        return Err(error.clone());
    }
    match events.as_slice() {
        [] => Ok(None),
        [ClientEvent::Response(response)] => Ok(Some(response.clone())),
        other => panic!("unexpected client events {other:?}"),
    }
}

fn respond(conn: &mut Conn, req: Request) -> Response {
    conn.call(req)
}

fn done(conn: &mut Conn, req: Request) {
    conn.cast(req)
}

/// ALLOC_BUFFER + BUFFER_GET_BASE: (handle, base).
fn alloc(conn: &mut Conn, size: u64) -> (u64, u64) {
    conn.alloc(size)
}

/// An F32 tensor of `ne` placed at `data` in `buffer`.
fn f32_tensor(id: u64, ne: [u32; 4], buffer: u64, data: u64) -> RpcTensor {
    RpcTensor {
        buffer,
        data,
        ..RpcTensor::contiguous(id, id::F32, ne).unwrap()
    }
}

fn set(conn: &mut Conn, tensor: &RpcTensor, offset: u64, data: &[u8]) -> Result<(), Error> {
    let header = Box::new(SetTensorHeader {
        tensor: tensor.clone(),
        cache_flag: 0,
        offset,
    });
    request(
        conn,
        Request::SetTensor {
            header,
            data: Bytes::copy_from_slice(data),
        },
    )
    .map(|_| ())
}

fn get(conn: &mut Conn, tensor: &RpcTensor, offset: u64, size: u64) -> Result<Vec<u8>, Error> {
    match request(
        conn,
        Request::GetTensor {
            tensor: Box::new(tensor.clone()),
            offset,
            size,
        },
    )? {
        Some(Response::TensorData(data)) => Ok(data.to_vec()),
        other => panic!("GET_TENSOR answered {other:?}"),
    }
}

#[test]
fn device_queries() {
    let backend = cpu();
    let mut conn = connect(&backend, ProtocolVersion::V7_0_0);
    assert_eq!(
        respond(&mut conn, Request::DeviceCount),
        Response::DeviceCount(1)
    );
    assert_eq!(
        respond(&mut conn, Request::GetAlignment { device: 0 }),
        Response::Alignment(32)
    );
    assert_eq!(
        respond(&mut conn, Request::GetMaxSize { device: 0 }),
        Response::MaxSize(u64::MAX)
    );
    let Response::DeviceMemory { free, total } =
        respond(&mut conn, Request::GetDeviceMemory { device: 0 })
    else {
        panic!("GET_DEVICE_MEMORY answered something else");
    };
    assert!(free <= total);
    if cfg!(target_os = "linux") {
        assert!(total > 0, "Linux reports real figures");
    }
    let q4k = RpcTensor::contiguous(1, id::Q4_K, [768, 2, 1, 1]).unwrap();
    let alloc_size = Request::GetAllocSize(Box::new(AllocSizeRequest {
        device: 0,
        tensor: q4k.clone(),
        srcs: Default::default(),
    }));
    assert_eq!(
        respond(&mut conn, alloc_size),
        Response::AllocSize(q4k.byte_size().unwrap())
    );
    let bad_device = request(&mut conn, Request::GetAlignment { device: 1 }).unwrap_err();
    assert_eq!(
        bad_device,
        Error::InvalidDevice {
            device: 1,
            count: 1
        }
    );
}

#[test]
fn data_commands_are_byte_exact() {
    let backend = cpu();
    let mut conn = connect(&backend, ProtocolVersion::V8_0_0);
    let (buffer, base) = alloc(&mut conn, 4096);
    let src = f32_tensor(1, [16, 4, 1, 1], buffer, base);
    let dst = f32_tensor(2, [16, 4, 1, 1], buffer, base + 1024);
    let data: Vec<u8> = (0..256u32).map(|i| (i * 7 + 3) as u8).collect();

    set(&mut conn, &src, 0, &data).unwrap();
    assert_eq!(get(&mut conn, &src, 0, 256).unwrap(), data);
    assert_eq!(get(&mut conn, &src, 100, 20).unwrap(), &data[100..120]);
    assert_eq!(
        get(&mut conn, &dst, 0, 256).unwrap(),
        vec![0; 256],
        "untouched memory is zero"
    );

    // A write at an offset, streamed in the pair's random pieces, lands exactly there.
    set(&mut conn, &dst, 16, &data[..100]).unwrap();
    let got = get(&mut conn, &dst, 0, 256).unwrap();
    assert_eq!(&got[..16], &[0; 16]);
    assert_eq!(&got[16..116], &data[..100]);
    assert_eq!(&got[116..], &[0; 140][..]);

    // COPY_TENSOR
    let copy = Request::CopyTensor {
        src: Box::new(src.clone()),
        dst: Box::new(dst.clone()),
    };
    assert_eq!(respond(&mut conn, copy), Response::CopyTensor(1));
    assert_eq!(get(&mut conn, &dst, 0, 256).unwrap(), data);

    // MEMSET_TENSOR
    done(
        &mut conn,
        Request::MemsetTensor {
            tensor: Box::new(dst.clone()),
            offset: 8,
            size: 16,
            value: 0xaa,
        },
    );
    let got = get(&mut conn, &dst, 0, 256).unwrap();
    assert_eq!(&got[..8], &data[..8]);
    assert_eq!(&got[8..24], &[0xaa; 16]);
    assert_eq!(&got[24..], &data[24..]);

    // INIT_TENSOR: nothing to do on the CPU, but accepted.
    done(
        &mut conn,
        Request::InitTensor {
            tensor: Box::new(dst.clone()),
        },
    );

    // BUFFER_CLEAR
    done(&mut conn, Request::BufferClear { buffer, value: 3 });
    assert_eq!(get(&mut conn, &src, 0, 256).unwrap(), vec![3; 256]);
    assert_eq!(get(&mut conn, &dst, 0, 256).unwrap(), vec![3; 256]);

    // FREE_BUFFER
    assert_eq!(backend.live_buffers(), 1);
    done(&mut conn, Request::FreeBuffer { buffer });
    assert_eq!((backend.live_buffers(), backend.used_bytes()), (0, 0));
    let gone = request(&mut conn, Request::BufferGetBase { buffer }).unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::UnknownBuffer);
    drop(conn);
    assert_eq!((backend.live_buffers(), backend.used_bytes()), (0, 0));
}

#[test]
fn copies_between_two_buffers_of_one_connection() {
    let backend = cpu();
    let mut conn = connect(&backend, ProtocolVersion::V7_0_0);
    let (a, base_a) = alloc(&mut conn, 1024);
    let (b, base_b) = alloc(&mut conn, 1024);
    let src = f32_tensor(1, [8, 8, 1, 1], a, base_a + 256);
    let dst = f32_tensor(2, [8, 8, 1, 1], b, base_b);
    let data: Vec<u8> = (0..=255).collect();
    set(&mut conn, &src, 0, &data).unwrap();
    for (from, to) in [(&src, &dst), (&dst, &src)] {
        let copy = Request::CopyTensor {
            src: Box::new(from.clone()),
            dst: Box::new(to.clone()),
        };
        assert_eq!(respond(&mut conn, copy), Response::CopyTensor(1));
    }
    assert_eq!(get(&mut conn, &dst, 0, 256).unwrap(), data);
    assert_eq!(get(&mut conn, &src, 0, 256).unwrap(), data);
}

#[test]
fn out_of_range_regions_are_rejected_and_change_nothing() {
    let backend = cpu();
    // A bystander's data, which no refused request may touch.
    let mut bystander = connect(&backend, ProtocolVersion::V8_0_0);
    let (kept, kept_base) = alloc(&mut bystander, 256);
    let kept_tensor = f32_tensor(9, [64, 1, 1, 1], kept, kept_base);
    let pattern: Vec<u8> = (0..=255).collect();
    set(&mut bystander, &kept_tensor, 0, &pattern).unwrap();

    // Each hostile request on a connection of its own (it closes that connection), against a
    // 256-byte buffer whose tensor is its last 128 bytes.
    let refused = |attack: &dyn Fn(u64, u64, &RpcTensor) -> Request| -> ErrorKind {
        let mut conn = connect(&backend, ProtocolVersion::V8_0_0);
        let (buffer, base) = alloc(&mut conn, 256);
        let tensor = f32_tensor(1, [16, 2, 1, 1], buffer, base + 128);
        let error = request(&mut conn, attack(buffer, base, &tensor)).unwrap_err();
        drop(conn);
        error.kind()
    };
    let set_req = |tensor: RpcTensor, offset: u64, len: usize| Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor,
            cache_flag: 0,
            offset,
        }),
        data: Bytes::from(vec![1; len]),
    };
    let get_req = |tensor: RpcTensor, offset: u64, size: u64| Request::GetTensor {
        tensor: Box::new(tensor),
        offset,
        size,
    };
    // Past the tensor (and the buffer).
    assert_eq!(
        refused(&|_, _, t| set_req(t.clone(), 120, 16)),
        ErrorKind::OutOfBounds
    );
    assert_eq!(
        refused(&|_, _, t| get_req(t.clone(), 0, 129)),
        ErrorKind::OutOfBounds
    );
    assert_eq!(
        refused(&|_, _, t| get_req(t.clone(), u64::MAX, 1)),
        ErrorKind::SizeOverflow
    );
    let memset = |_: u64, _: u64, t: &RpcTensor| Request::MemsetTensor {
        tensor: Box::new(t.clone()),
        offset: 64,
        size: 65,
        value: 9,
    };
    assert_eq!(refused(&memset), ErrorKind::OutOfBounds);
    // A tensor that does not fit where it claims to be.
    assert_eq!(
        refused(&|buffer, base, _| set_req(f32_tensor(2, [16, 2, 1, 1], buffer, base + 200), 0, 4)),
        ErrorKind::OutOfBounds
    );
    assert_eq!(
        refused(&|buffer, base, _| get_req(f32_tensor(3, [4, 1, 1, 1], buffer, base - 16), 0, 4)),
        ErrorKind::OutOfBounds
    );
    // COPY_TENSOR whose source is larger than its destination's room.
    let copy = |buffer: u64, base: u64, t: &RpcTensor| Request::CopyTensor {
        src: Box::new(f32_tensor(4, [32, 2, 1, 1], buffer, base)),
        dst: Box::new(t.clone()),
    };
    assert_eq!(refused(&copy), ErrorKind::OutOfBounds);
    // A handle this connection does not own.
    assert_eq!(
        refused(&|buffer, base, _| set_req(f32_tensor(5, [4, 1, 1, 1], buffer ^ 2, base), 0, 4)),
        ErrorKind::UnknownBuffer
    );

    // Every refused connection freed its buffer, and the bystander's data is intact.
    assert_eq!(backend.live_buffers(), 1);
    assert_eq!(get(&mut bystander, &kept_tensor, 0, 256).unwrap(), pattern);
}

/// A graph over one 4x4 F32 weight `w` at `base`: `view` (VIEW of w) and `reshape`
/// (RESHAPE of view), both computed nodes.
fn view_graph(buffer: u64, base: u64, uid: u64) -> GraphComputeRequest {
    let weight = f32_tensor(10, [4, 4, 1, 1], buffer, base);
    let mut view = f32_tensor(11, [4, 2, 1, 1], buffer, base + 32);
    view.op = Op::VIEW.0;
    view.flags = flags::COMPUTE;
    view.src[0] = weight.id;
    view.view_src = weight.id;
    view.view_offs = 32;
    let mut reshape = f32_tensor(12, [8, 1, 1, 1], buffer, base + 32);
    reshape.op = Op::RESHAPE.0;
    reshape.flags = flags::COMPUTE;
    reshape.src[0] = view.id;
    reshape.view_src = weight.id;
    reshape.view_offs = 32;
    GraphComputeRequest {
        device: 0,
        uid,
        node_ids: vec![view.id, reshape.id],
        tensors: vec![weight, view, reshape],
    }
}

#[test]
fn graphs_of_views_run_mul_mat_computes_and_unsupported_ops_are_refused() {
    let backend = cpu();
    let mut conn = connect(&backend, ProtocolVersion::V8_0_0);
    let (buffer, base) = alloc(&mut conn, 1024);
    let weights: Vec<u8> = (0..64).collect();
    set(
        &mut conn,
        &f32_tensor(10, [4, 4, 1, 1], buffer, base),
        0,
        &weights,
    )
    .unwrap();

    done(
        &mut conn,
        Request::GraphCompute(Box::new(view_graph(buffer, base, 7))),
    );
    done(&mut conn, Request::GraphRecompute { device: 0, uid: 7 });
    assert_eq!(
        get(
            &mut conn,
            &f32_tensor(10, [4, 4, 1, 1], buffer, base),
            0,
            64
        )
        .unwrap(),
        weights
    );

    // MUL_MAT of the 4x4 weights (bytes 0..63 as f32 bit patterns are tiny but finite) with
    // a vector of ones: each output is the sum of one weight row.
    let a = f32_tensor(20, [4, 4, 1, 1], buffer, base);
    let b = f32_tensor(21, [4, 1, 1, 1], buffer, base + 64);
    let mut c = f32_tensor(22, [4, 1, 1, 1], buffer, base + 128);
    let weights: Vec<f32> = (0..16).map(|i| i as f32 - 3.5).collect();
    let as_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    set(&mut conn, &a, 0, &as_bytes(&weights)).unwrap();
    set(&mut conn, &b, 0, &as_bytes(&[1.0; 4])).unwrap();
    c.op = Op::MUL_MAT.0;
    c.flags = flags::COMPUTE;
    c.src[0] = a.id;
    c.src[1] = b.id;
    let mul_mat = GraphComputeRequest {
        device: 0,
        uid: 8,
        node_ids: vec![c.id],
        tensors: vec![a.clone(), b.clone(), c.clone()],
    };
    done(&mut conn, Request::GraphCompute(Box::new(mul_mat)));
    let got: Vec<f32> = get(&mut conn, &c, 0, 16)
        .unwrap()
        .chunks_exact(4)
        .map(|x| f32::from_le_bytes(x.try_into().unwrap()))
        .collect();
    let want: Vec<f32> = weights.chunks(4).map(|row| row.iter().sum()).collect();
    assert_eq!(got, want);

    // An op without a CPU kernel: refused before anything ran, and the graph is not stored.
    let mut d = f32_tensor(23, [4, 1, 1, 1], buffer, base + 192);
    d.op = Op::WIN_PART.0;
    d.flags = flags::COMPUTE;
    d.src[0] = a.id;
    d.src[1] = b.id;
    let conv = GraphComputeRequest {
        device: 0,
        uid: 9,
        node_ids: vec![c.id, d.id],
        tensors: vec![a, b, c.clone(), d.clone()],
    };
    set(&mut conn, &c, 0, &[0; 16]).unwrap();
    let refused = request(&mut conn, Request::GraphCompute(Box::new(conv))).unwrap_err();
    assert_eq!(
        refused,
        Error::OpRefused {
            op: Op::WIN_PART.0,
            reason: "not implemented by the CPU backend"
        }
    );
    // The refusal closed the connection, which freed what it held.
    drop(conn);
    assert_eq!((backend.live_buffers(), backend.used_bytes()), (0, 0));
}

#[test]
fn closing_a_connection_returns_its_memory() {
    let backend = cpu();
    let baseline = (backend.live_buffers(), backend.used_bytes());
    {
        let mut conn = connect(&backend, ProtocolVersion::V8_0_0);
        for size in [0, 1, 4096, 1 << 20] {
            alloc(&mut conn, size);
        }
        assert_eq!(backend.live_buffers(), 4);
        assert_eq!(backend.used_bytes(), 1 + 4096 + (1 << 20));
        // dropped without FREE_BUFFER, as when a client disconnects
    }
    assert_eq!((backend.live_buffers(), backend.used_bytes()), baseline);
}

#[test]
fn concurrent_connections_with_distinct_buffers() {
    let backend = cpu();
    let workers: Vec<_> = (0..4u8)
        .map(|n| {
            let backend = backend.clone();
            std::thread::spawn(move || {
                let mut conn = connect(&backend, ProtocolVersion::V8_0_0);
                for round in 0..25u8 {
                    let (buffer, base) = alloc(&mut conn, 8192);
                    let src = f32_tensor(1, [256, 4, 1, 1], buffer, base);
                    let dst = f32_tensor(2, [256, 4, 1, 1], buffer, base + 4096);
                    let data: Vec<u8> = (0..4096u32).map(|i| (i as u8) ^ n ^ round).collect();
                    set(&mut conn, &src, 0, &data).unwrap();
                    let copy = Request::CopyTensor {
                        src: Box::new(src),
                        dst: Box::new(dst.clone()),
                    };
                    assert_eq!(respond(&mut conn, copy), Response::CopyTensor(1));
                    assert_eq!(get(&mut conn, &dst, 0, 4096).unwrap(), data);
                    done(&mut conn, Request::FreeBuffer { buffer });
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!((backend.live_buffers(), backend.used_bytes()), (0, 0));
    // The backend is still usable through the trait object the shells hold.
    let shared: Arc<dyn Backend> = backend;
    assert_eq!(shared.device_count(), 1);
}

/// `c = a x b` (MUL_MAT of a 4x4 weight and a vector) with `a` and `b` in `inputs` and `c` at
/// `c_offset` in `output`.
fn mul_mat_graph(
    uid: u64,
    inputs: (u64, u64),
    output: (u64, u64),
    c_offset: u64,
) -> (GraphComputeRequest, RpcTensor) {
    let a = f32_tensor(20, [4, 4, 1, 1], inputs.0, inputs.1);
    let b = f32_tensor(21, [4, 1, 1, 1], inputs.0, inputs.1 + 64);
    let mut c = f32_tensor(22, [4, 1, 1, 1], output.0, output.1 + c_offset);
    c.op = Op::MUL_MAT.0;
    c.flags = flags::COMPUTE;
    c.src[0] = a.id;
    c.src[1] = b.id;
    let graph = GraphComputeRequest {
        device: 0,
        uid,
        node_ids: vec![c.id],
        tensors: vec![a, b, c.clone()],
    };
    (graph, c)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|x| f32::from_le_bytes(x.try_into().unwrap()))
        .collect()
}

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn recompute_reuses_the_stored_plan_until_the_graph_is_dropped() {
    let backend = cpu();
    let mut conn = connect(&backend, ProtocolVersion::V8_0_0);
    let inputs = alloc(&mut conn, 256);
    let output = alloc(&mut conn, 256);
    let (_, unrelated_base) = alloc(&mut conn, 64);
    let _ = unrelated_base;
    let weights: Vec<f32> = (0..16).map(|i| i as f32 - 3.5).collect();
    let a = f32_tensor(20, [4, 4, 1, 1], inputs.0, inputs.1);
    let b = f32_tensor(21, [4, 1, 1, 1], inputs.0, inputs.1 + 64);
    set(&mut conn, &a, 0, &le_bytes(&weights)).unwrap();
    set(&mut conn, &b, 0, &le_bytes(&[1.0; 4])).unwrap();
    let (graph, c) = mul_mat_graph(5, inputs, output, 0);
    let plans = backend.plans_built();
    done(&mut conn, Request::GraphCompute(Box::new(graph.clone())));
    assert_eq!(backend.plans_built(), plans + 1);

    // New inputs, same graph: the recompute plans nothing and reads the new values, exactly
    // as a fresh compute of the same graph (another uid) does.
    set(&mut conn, &b, 0, &le_bytes(&[1.0, -2.0, 0.5, 3.0])).unwrap();
    done(&mut conn, Request::GraphRecompute { device: 0, uid: 5 });
    assert_eq!(backend.plans_built(), plans + 1);
    let recomputed = get(&mut conn, &c, 0, 16).unwrap();
    set(&mut conn, &c, 0, &[0; 16]).unwrap();
    let fresh = GraphComputeRequest { uid: 6, ..graph };
    done(&mut conn, Request::GraphCompute(Box::new(fresh)));
    assert_eq!(backend.plans_built(), plans + 2);
    assert_eq!(get(&mut conn, &c, 0, 16).unwrap(), recomputed);
    let want: Vec<f32> = weights
        .chunks(4)
        .map(|row| row[0] - 2.0 * row[1] + 0.5 * row[2] + 3.0 * row[3])
        .collect();
    assert_eq!(f32s(&recomputed), want);

    // BUFFER_CLEAR changes contents, not the plan: still reused, and the zeros are read.
    done(
        &mut conn,
        Request::BufferClear {
            buffer: inputs.0,
            value: 0,
        },
    );
    done(&mut conn, Request::GraphRecompute { device: 0, uid: 5 });
    assert_eq!(backend.plans_built(), plans + 2);
    assert_eq!(get(&mut conn, &c, 0, 16).unwrap(), vec![0; 16]);

    // A new graph under the same uid replaces the plan with its own.
    set(&mut conn, &a, 0, &le_bytes(&weights)).unwrap();
    set(&mut conn, &b, 0, &le_bytes(&[1.0; 4])).unwrap();
    let (moved, c_moved) = mul_mat_graph(5, inputs, output, 64);
    done(&mut conn, Request::GraphCompute(Box::new(moved)));
    assert_eq!(backend.plans_built(), plans + 3);
    set(&mut conn, &c_moved, 0, &[0; 16]).unwrap();
    done(&mut conn, Request::GraphRecompute { device: 0, uid: 5 });
    assert_eq!(backend.plans_built(), plans + 3);
    let sums: Vec<f32> = weights.chunks(4).map(|row| row.iter().sum()).collect();
    assert_eq!(f32s(&get(&mut conn, &c_moved, 0, 16).unwrap()), sums);
}

#[test]
fn free_buffer_drops_stored_plans_and_recompute_fails_as_before() {
    for version in [ProtocolVersion::V7_0_0, ProtocolVersion::V8_0_0] {
        let backend = cpu();
        let mut conn = connect(&backend, version);
        let inputs = alloc(&mut conn, 256);
        let output = alloc(&mut conn, 256);
        let (other, _) = alloc(&mut conn, 64);
        let (graph, _) = mul_mat_graph(5, inputs, output, 0);
        done(&mut conn, Request::GraphCompute(Box::new(graph.clone())));
        done(&mut conn, Request::GraphRecompute { device: 0, uid: 5 });
        assert_eq!(backend.plans_built(), 1);
        // Freeing any buffer, even one the graph does not use, drops every stored graph (as
        // the reference does), and with it the plan: a recompute is refused as it always was.
        done(&mut conn, Request::FreeBuffer { buffer: other });
        let refused = request(&mut conn, Request::GraphRecompute { device: 0, uid: 5 });
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::GraphNotFound);
        assert_eq!(backend.plans_built(), 1);
        drop(conn);
        assert_eq!((backend.live_buffers(), backend.used_bytes()), (0, 0));

        // Freeing a buffer the graph uses: computing it again plans it again.
        let mut conn = connect(&backend, version);
        let inputs = alloc(&mut conn, 256);
        let output = alloc(&mut conn, 256);
        let (graph, _) = mul_mat_graph(5, inputs, output, 0);
        done(&mut conn, Request::GraphCompute(Box::new(graph.clone())));
        done(&mut conn, Request::FreeBuffer { buffer: output.0 });
        let refused = request(&mut conn, Request::GraphRecompute { device: 0, uid: 5 });
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::GraphNotFound);
        assert_eq!(backend.plans_built(), 2);
    }
}

#[test]
fn medium_replies_sent_from_backend_memory_are_byte_exact() {
    // Above MIN_IN_PLACE_REPLY (64 KiB) and below 16 MiB: streamed in place (logits-sized).
    let backend = cpu();
    let mut conn = connect(&backend, ProtocolVersion::V8_0_0);
    let (buffer, base) = alloc(&mut conn, 1 << 20);
    let tensor = f32_tensor(1, [1 << 18, 1, 1, 1], buffer, base);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 251) as u8).collect();
    set(&mut conn, &tensor, 0, &data).unwrap();
    for (offset, len) in [
        (0, 1 << 20),
        (4096, 128 << 10),
        (1, (64 << 10) + 1),
        (8, 64 << 10),
    ] {
        let got = get(&mut conn, &tensor, offset, len).unwrap();
        assert_eq!(got, &data[offset as usize..(offset + len) as usize]);
    }
}
