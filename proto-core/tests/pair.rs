//! Our client session and our server connection (the driver every shell runs, over the
//! in-memory backend) driven against each other in memory with `proto_core::testing::Pair`:
//! no sockets, every byte stream cut at random points.

use std::sync::Arc;

use bytes::Bytes;
use proto_core::dispatch::DispatcherConfig;
use proto_core::driver::{Action, Place, Receive};
use proto_core::ggml::types::id;
use proto_core::session::{ClientEvent, GraphSubmission};
use proto_core::tensor_cache::{fnv1a64, MemoryTensorCache};
use proto_core::testing::Pair;
use proto_core::wire::{
    GraphComputeRequest, ProtocolVersion, Request, Response, RpcTensor, SetTensorHeader,
    Tensor2dHeader,
};
use proto_core::{Error, ErrorKind};

fn tensor_at(id: u64, buffer: u64, data: u64, ne: [u32; 4]) -> RpcTensor {
    let mut tensor = RpcTensor::contiguous(id, id::F32, ne).unwrap();
    tensor.buffer = buffer;
    tensor.data = data;
    tensor
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn handshake_reports_version_and_cache_flag() {
    for (version, seed) in [(ProtocolVersion::V7_0_0, 1), (ProtocolVersion::V8_0_0, 2)] {
        let mut pair = Pair::new(version, version, seed);
        let ClientEvent::Connected(hello) = pair.connect() else {
            panic!()
        };
        assert_eq!(hello.version, version);
        assert!(!hello.has_tensor_cache());
    }
    let mut config = DispatcherConfig::new(ProtocolVersion::V8_0_0);
    config.tensor_cache = Some(Arc::new(MemoryTensorCache::default()));
    let mut pair = Pair::with_config(ProtocolVersion::V8_0_0, config, 3);
    let ClientEvent::Connected(hello) = pair.connect() else {
        panic!()
    };
    assert!(hello.has_tensor_cache());
}

#[test]
fn client_rejects_a_server_of_another_major() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V7_0_0, 4);
    let error = pair.drive().unwrap_err();
    assert_eq!(
        error,
        Error::VersionMismatch {
            major: 7,
            minor: 0,
            patch: 0
        }
    );
}

#[test]
fn pipelined_small_commands_come_back_in_order() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 5);
    pair.client.send(&Request::DeviceCount).unwrap();
    pair.client
        .send(&Request::GetAlignment { device: 1 })
        .unwrap();
    pair.client
        .send(&Request::GetMaxSize { device: 0 })
        .unwrap();
    pair.client
        .send(&Request::GetDeviceMemory { device: 0 })
        .unwrap();
    let events = pair.drive().unwrap();
    assert_eq!(
        events[1..],
        [
            ClientEvent::Response(Response::DeviceCount(2)),
            ClientEvent::Response(Response::Alignment(32)),
            ClientEvent::Response(Response::MaxSize(1 << 30)),
            ClientEvent::Response(Response::DeviceMemory {
                free: 1 << 30,
                total: 1 << 30
            }),
        ]
    );
}

#[test]
fn set_and_get_round_trip_in_bounded_chunks() {
    for (version, seed, in_place) in [
        (ProtocolVersion::V7_0_0, 6, false),
        (ProtocolVersion::V8_0_0, 7, false),
        (ProtocolVersion::V7_0_0, 16, true),
        (ProtocolVersion::V8_0_0, 17, true),
    ] {
        let mut pair = Pair::new(version, version, seed);
        if in_place {
            pair = pair.in_place();
        }
        pair.connect();
        let len = 40 << 20; // more than two 16 MiB chunks
        let (buffer, base) = pair.alloc(len as u64 + 64);
        let tensor = tensor_at(1, buffer, base + 64, [(len / 4) as u32, 1, 1, 1]);
        let data = Bytes::from(pattern(len, 9));
        pair.cast(Request::SetTensor {
            header: Box::new(SetTensorHeader {
                tensor: tensor.clone(),
                cache_flag: 0,
                offset: 0,
            }),
            data: data.clone(),
        });
        assert!(pair.backend.largest_write() <= 16 << 20);
        if in_place {
            // most of the data went straight to memory; what arrived with the header did not
            assert!(
                pair.received_in_place > len / 2,
                "{}",
                pair.received_in_place
            );
            assert!(pair.received_in_place <= len);
        } else {
            assert!(pair.backend.largest_write() > 0);
        }
        let response = pair.call(Request::GetTensor {
            tensor: Box::new(tensor.clone()),
            offset: 0,
            size: len as u64,
        });
        assert_eq!(response, Response::TensorData(data.clone()));
        assert_eq!(pair.sent_in_place, if in_place { len } else { 0 });
        // odd offset and size
        let response = pair.call(Request::GetTensor {
            tensor: Box::new(tensor),
            offset: 7,
            size: 13,
        });
        assert_eq!(response, Response::TensorData(data.slice(7..20)));
    }
}

#[test]
fn memset_copy_clear_and_2d() {
    memset_copy_clear_and_2d_with(Pair::new(
        ProtocolVersion::V8_0_0,
        ProtocolVersion::V8_0_0,
        8,
    ));
    for seed in 30..40 {
        memset_copy_clear_and_2d_with(
            Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, seed).in_place(),
        );
    }
}

fn memset_copy_clear_and_2d_with(mut pair: Pair) {
    pair.connect();
    let (buffer, base) = pair.alloc(4096);
    let a = tensor_at(1, buffer, base, [64, 1, 1, 1]);
    let b = tensor_at(2, buffer, base + 256, [64, 1, 1, 1]);
    pair.cast(Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: a.clone(),
            cache_flag: 0,
            offset: 0,
        }),
        data: Bytes::from(pattern(256, 1)),
    });
    assert_eq!(
        pair.call(Request::CopyTensor {
            src: Box::new(a.clone()),
            dst: Box::new(b.clone())
        }),
        Response::CopyTensor(1)
    );
    pair.cast(Request::MemsetTensor {
        tensor: Box::new(b.clone()),
        offset: 4,
        size: 8,
        value: 0xee,
    });
    let Response::TensorData(got) = pair.call(Request::GetTensor {
        tensor: Box::new(b.clone()),
        offset: 0,
        size: 256,
    }) else {
        panic!()
    };
    let mut expected = pattern(256, 1);
    expected[4..12].fill(0xee);
    assert_eq!(&got[..], &expected[..]);

    // 2D: three rows of 8 bytes every 32 bytes
    let rows = Tensor2dHeader {
        tensor: a.clone(),
        offset: 16,
        size: 8,
        n_copies: 3,
        stride: 32,
    };
    pair.cast(Request::SetTensor2d {
        header: Box::new(rows.clone()),
        data: Bytes::from(vec![7u8; 24]),
    });
    assert_eq!(
        pair.call(Request::GetTensor2d(Box::new(rows))),
        Response::Tensor2dData(Bytes::from(vec![7u8; 24]))
    );
    let Response::TensorData(got) = pair.call(Request::GetTensor {
        tensor: Box::new(a.clone()),
        offset: 0,
        size: 256,
    }) else {
        panic!()
    };
    let mut expected = pattern(256, 1);
    for row in 0..3 {
        expected[16 + 32 * row..24 + 32 * row].fill(7);
    }
    assert_eq!(&got[..], &expected[..]);

    pair.cast(Request::BufferClear { buffer, value: 0 });
    let Response::TensorData(got) = pair.call(Request::GetTensor {
        tensor: Box::new(a),
        offset: 0,
        size: 256,
    }) else {
        panic!()
    };
    assert!(got.iter().all(|&b| b == 0));
}

#[test]
fn tensor_cache_hit_miss_and_corrupt_entry() {
    let cache = Arc::new(MemoryTensorCache::default());
    let mut config = DispatcherConfig::new(ProtocolVersion::V8_0_0);
    config.tensor_cache = Some(cache.clone());
    // in-place mode: data that also goes to the cache takes the buffered path
    let mut pair = Pair::with_config(ProtocolVersion::V8_0_0, config, 10).in_place();
    pair.connect();
    let (buffer, base) = pair.alloc(1024);
    let tensor = tensor_at(1, buffer, base, [256, 1, 1, 1]);
    let data = pattern(1024, 3);
    let hash = fnv1a64(&data);
    let ask = |tensor: &RpcTensor| Request::SetTensorHash {
        tensor: Box::new(tensor.clone()),
        offset: 0,
        hash,
    };
    assert_eq!(pair.call(ask(&tensor)), Response::SetTensorHash(0));
    pair.cast(Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: tensor.clone(),
            cache_flag: 1,
            offset: 0,
        }),
        data: Bytes::from(data.clone()),
    });
    assert!(cache.contains(hash));
    assert_eq!(pair.received_in_place, 0);
    pair.cast(Request::BufferClear { buffer, value: 0 });
    assert_eq!(pair.call(ask(&tensor)), Response::SetTensorHash(1));
    assert_eq!(
        pair.call(Request::GetTensor {
            tensor: Box::new(tensor.clone()),
            offset: 0,
            size: 1024
        }),
        Response::TensorData(Bytes::from(data))
    );
    // A planted entry whose content does not match its name is a miss and gets dropped.
    cache.insert(77, vec![1; 16]);
    let planted = Request::SetTensorHash {
        tensor: Box::new(tensor),
        offset: 0,
        hash: 77,
    };
    assert_eq!(pair.call(planted), Response::SetTensorHash(0));
    assert!(!cache.contains(77));
}

#[test]
fn closing_frees_everything_the_client_held() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 11);
    pair.connect();
    pair.alloc(1000);
    let (second, _) = pair.alloc(2000);
    assert_eq!(pair.backend.live_buffers(), 2);
    pair.cast(Request::FreeBuffer { buffer: second });
    assert_eq!(pair.backend.live_buffers(), 1);
    let backend = pair.backend.clone();
    drop(pair);
    assert_eq!(backend.live_buffers(), 0);
    assert_eq!(backend.used_bytes(), 0);
}

#[test]
fn hostile_requests_fail_with_their_kind() {
    let cases: Vec<(Request, ErrorKind)> = vec![
        (
            Request::GetAlignment { device: 9 },
            ErrorKind::InvalidDevice,
        ),
        (
            Request::BufferGetBase { buffer: 12345 },
            ErrorKind::UnknownBuffer,
        ),
        (Request::FreeBuffer { buffer: 0 }, ErrorKind::UnknownBuffer),
        (
            Request::GraphRecompute { device: 0, uid: 5 },
            ErrorKind::GraphNotFound,
        ),
    ];
    for (seed, (request, kind)) in cases.into_iter().enumerate() {
        let mut pair = Pair::new(
            ProtocolVersion::V8_0_0,
            ProtocolVersion::V8_0_0,
            20 + seed as u64,
        );
        pair.connect();
        pair.client.send(&request).unwrap();
        let _ = pair.drive();
        assert_eq!(
            pair.server_error.as_ref().map(Error::kind),
            Some(kind),
            "{request:?}"
        );
    }
    // Region checks need a buffer first.
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 40);
    pair.connect();
    let (buffer, base) = pair.alloc(256);
    let outside = tensor_at(1, buffer, base + 128, [64, 1, 1, 1]);
    pair.client
        .send(&Request::GetTensor {
            tensor: Box::new(outside),
            offset: 0,
            size: 4,
        })
        .unwrap();
    let _ = pair.drive();
    assert_eq!(
        pair.server_error.as_ref().map(Error::kind),
        Some(ErrorKind::OutOfBounds)
    );
}

#[test]
fn graph_compute_and_recompute_follow_the_uid_cache() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 50);
    pair.connect();
    let (buffer, base) = pair.alloc(1024);
    let mut node = tensor_at(2, buffer, base + 256, [4, 1, 1, 1]);
    node.op = proto_core::ggml::Op::VIEW.0;
    node.view_src = 1;
    node.flags = proto_core::ggml::flags::COMPUTE;
    let leaf = tensor_at(1, buffer, base + 256, [4, 1, 1, 1]);
    let graph = GraphComputeRequest {
        device: 0,
        uid: 42,
        node_ids: vec![2],
        tensors: vec![leaf, node],
    };
    assert_eq!(
        pair.client.graph_submission(0, 42),
        GraphSubmission::Compute
    );
    pair.cast(Request::GraphCompute(Box::new(graph)));
    assert_eq!(
        pair.client.graph_submission(0, 42),
        GraphSubmission::Recompute
    );
    pair.cast(Request::GraphRecompute { device: 0, uid: 42 });
    assert_eq!(pair.backend.graphs_run(), 2);
    // FREE_BUFFER invalidates stored graphs: a recompute then closes the connection.
    pair.cast(Request::FreeBuffer { buffer });
    pair.client
        .send(&Request::GraphRecompute { device: 0, uid: 42 })
        .unwrap();
    let _ = pair.drive();
    assert_eq!(
        pair.server_error.as_ref().map(Error::kind),
        Some(ErrorKind::GraphNotFound)
    );
}

#[test]
fn overlapping_2d_read_is_refused_before_allocating() {
    // Rows of 64 bytes with stride 0, 2^44 times: 2^50 bytes out of a 256-byte tensor. This
    // used to reach `vec![0; 2^50]` and abort the process.
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 41);
    pair.connect();
    let (buffer, base) = pair.alloc(4096);
    let tensor = tensor_at(1, buffer, base, [64, 1, 1, 1]);
    let rows = Tensor2dHeader {
        tensor,
        offset: 0,
        size: 64,
        n_copies: 1 << 44,
        stride: 0,
    };
    pair.client
        .send(&Request::GetTensor2d(Box::new(rows)))
        .unwrap();
    let _ = pair.drive();
    assert_eq!(
        pair.server_error.as_ref().map(Error::kind),
        Some(ErrorKind::MessageTooLarge)
    );
}

#[test]
fn in_place_2d_rows_land_in_their_rows() {
    for seed in 50..56 {
        let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, seed).in_place();
        pair.connect();
        let (buffer, base) = pair.alloc(8 << 20);
        let a = tensor_at(1, buffer, base, [(2 << 20) as u32, 1, 1, 1]);
        let rows = Tensor2dHeader {
            tensor: a.clone(),
            offset: 100,
            size: 1 << 20,
            n_copies: 5,
            stride: (1 << 20) + 333,
        };
        let data = pattern(5 << 20, 4);
        pair.cast(Request::SetTensor2d {
            header: Box::new(rows.clone()),
            data: Bytes::from(data.clone()),
        });
        let Response::TensorData(whole) = pair.call(Request::GetTensor {
            tensor: Box::new(a),
            offset: 0,
            size: 8 << 20,
        }) else {
            panic!()
        };
        for row in 0..5 {
            let at = 100 + row * ((1 << 20) + 333);
            assert_eq!(
                &whole[at..at + (1 << 20)],
                &data[row << 20..(row + 1) << 20],
                "seed {seed} row {row}"
            );
        }
        assert!(pair.received_in_place > 0, "seed {seed}");
    }
}

/// Allocates a 4096-byte buffer and hands the server the head of a SET_TENSOR of all of it,
/// without its data (the write streams, nothing buffered); returns the tensor.
fn send_set_tensor_head(pair: &mut Pair) -> RpcTensor {
    let (buffer, base) = pair.alloc(4096);
    let tensor = tensor_at(1, buffer, base, [1024, 1, 1, 1]);
    let mut head = bytes::BytesMut::new();
    Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: tensor.clone(),
            cache_flag: 0,
            offset: 0,
        }),
        data: Bytes::from(vec![0u8; 4096]),
    }
    .encode_head(ProtocolVersion::V8_0_0.dialect().unwrap(), &mut head)
    .unwrap();
    pair.server.handle_input(head.freeze());
    tensor
}

#[test]
fn in_place_misuse_is_an_error_not_a_corruption() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 60).in_place();
    pair.connect();
    // nothing streams: the connection declines to lend anything
    assert_eq!(
        pair.server
            .receive_in_place(&mut |_| unreachable!("nothing to lend"))
            .unwrap(),
        None
    );
    assert_eq!(
        pair.server.send_in_place(&mut |_| unreachable!()).unwrap(),
        Some(0)
    );

    // a SET_TENSOR header without its data: the write streams, nothing buffered
    send_set_tensor_head(&mut pair);
    assert!(matches!(
        pair.server.poll(Place::EventLoop).unwrap(),
        Action::Receive(Receive::Stream {
            remaining: 4096,
            in_place: true
        })
    ));
    // a receive that claims more than it was lent is refused
    let claims_more = pair.server.receive_in_place(&mut |dst| dst.len() + 1);
    assert_eq!(claims_more.unwrap_err().kind(), ErrorKind::Backend);
}

#[test]
fn in_place_receives_add_up_and_end_the_write() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 61).in_place();
    pair.connect();
    let tensor = send_set_tensor_head(&mut pair);
    for part in 0..4u8 {
        assert!(matches!(
            pair.server.poll(Place::EventLoop).unwrap(),
            Action::Receive(Receive::Stream { in_place: true, .. })
        ));
        let n = pair
            .server
            .receive_in_place(&mut |dst| {
                dst[..1024].fill(part);
                1024
            })
            .unwrap();
        assert_eq!(n, Some(1024));
    }
    // all data arrived: the write ends and the connection waits for the next message
    assert!(matches!(
        pair.server.poll(Place::EventLoop).unwrap(),
        Action::Receive(Receive::Idle)
    ));
    let Response::TensorData(data) = pair.call(Request::GetTensor {
        tensor: Box::new(tensor),
        offset: 0,
        size: 4096,
    }) else {
        panic!()
    };
    let expected: Vec<u8> = (0..4u8).flat_map(|part| [part; 1024]).collect();
    assert_eq!(&data[..], &expected[..]);
}

/// A one-node graph `node = op(leaf)` over `buffer`, ops in the newest numbering.
fn unary_graph(buffer: u64, base: u64, op: proto_core::ggml::Op) -> GraphComputeRequest {
    let leaf = tensor_at(1, buffer, base, [4, 1, 1, 1]);
    let mut node = tensor_at(2, buffer, base + 256, [4, 1, 1, 1]);
    node.op = op.0;
    node.op_params[0] = proto_core::ggml::UnaryOp::SILU.0;
    node.src[0] = 1;
    node.flags = proto_core::ggml::flags::COMPUTE;
    GraphComputeRequest {
        device: 0,
        uid: 7,
        node_ids: vec![2],
        tensors: vec![leaf, node],
    }
}

#[test]
fn graph_ops_travel_in_the_servers_numbering() {
    use proto_core::ggml::{GgmlTable, Op};
    // An 8.0.1 client and an 8.0.0 server accept each other; the client sends UNARY as 91.
    for (server, table) in [
        (ProtocolVersion::V8_0_0, GgmlTable::V8_0_0),
        (ProtocolVersion::V8_0_1, GgmlTable::V8_0_1),
        (ProtocolVersion::V7_0_0, GgmlTable::V8_0_0),
    ] {
        let client = if server.major == 7 {
            ProtocolVersion::V7_0_0
        } else {
            ProtocolVersion::V8_0_1
        };
        let mut pair = Pair::new(client, server, 60);
        pair.connect();
        assert_eq!(pair.client.server_table(), table, "server {server}");
        let (buffer, base) = pair.alloc(1024);
        pair.cast(Request::GraphCompute(Box::new(unary_graph(
            buffer,
            base,
            Op::UNARY,
        ))));
        assert_eq!(pair.backend.graphs_run(), 1, "server {server}");
        assert!(pair.server_error.is_none(), "server {server}");
        // TOP_K_MASK does not exist before 8.0.1: refused before anything is sent.
        let top_k_mask = unary_graph(buffer, base, Op::TOP_K_MASK);
        let sent = pair
            .client
            .send(&Request::GraphCompute(Box::new(top_k_mask)));
        match table {
            GgmlTable::V8_0_0 => assert_eq!(
                sent,
                Err(Error::OpNotInServerTable {
                    op: Op::TOP_K_MASK.0,
                    table
                })
            ),
            GgmlTable::V8_0_1 => assert_eq!(sent, Ok(())),
        }
    }
}

#[test]
fn an_8_0_0_client_graph_sent_raw_to_an_8_0_1_server_is_renumbered_there() {
    // What the server sees when a client numbers ops the old way: wire 91 is TOP_K_MASK in
    // 8.0.1, and 101 (8.0.1's GLU) is refused by an 8.0.0 server with the likely mismatch named.
    let mut pair = Pair::new(ProtocolVersion::V8_0_1, ProtocolVersion::V8_0_0, 61);
    pair.connect();
    let (buffer, base) = pair.alloc(1024);
    let mut raw = unary_graph(buffer, base, proto_core::ggml::Op::ADD);
    raw.tensors[1].op = 101;
    let mut frame = bytes::BytesMut::new();
    Request::GraphCompute(Box::new(raw))
        .encode_head(proto_core::wire::Dialect::V8, &mut frame)
        .unwrap();
    pair.server.handle_input(frame.freeze());
    let _ = pair.drive();
    let error = pair.server_error.clone().expect("refused");
    assert_eq!(error.kind(), ErrorKind::OpRefused);
    assert!(error.to_string().contains("is the client 8.0.1"), "{error}");
}

#[test]
fn set_tensor_hash_checks_the_tensor_first_from_8_0_1_on() {
    // A tensor in no buffer, on a server without a cache: 7.0.0 and 8.0.0 answer "not cached"
    // without looking at it, 8.0.1 deserializes it first and closes (PROTOCOL.md §5.11).
    for (version, closes) in [
        (ProtocolVersion::V7_0_0, false),
        (ProtocolVersion::V8_0_0, false),
        (ProtocolVersion::V8_0_1, true),
    ] {
        let mut pair = Pair::new(version, version, 62);
        pair.connect();
        let stray = tensor_at(1, 0, 0, [4, 1, 1, 1]);
        pair.client
            .send(&Request::SetTensorHash {
                tensor: Box::new(stray),
                offset: 0,
                hash: 5,
            })
            .unwrap();
        let events = pair.drive();
        if closes {
            assert_eq!(
                pair.server_error.as_ref().map(Error::kind),
                Some(ErrorKind::MissingBuffer),
                "{version}"
            );
        } else {
            assert!(pair.server_error.is_none(), "{version}");
            assert_eq!(
                events.unwrap(),
                vec![ClientEvent::Response(Response::SetTensorHash(0))],
                "{version}"
            );
        }
    }
}
