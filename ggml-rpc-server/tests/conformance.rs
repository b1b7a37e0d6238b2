//! The shell conformance suite: every server-side behaviour, run against every shell of this
//! build (tokio, io_uring, smol) through the one in-process API, [`ggml_rpc_server::start`].
//! A behaviour difference between shells is a bug in a shell.
//!
//! * Command round trips in both dialects: device queries, buffers, byte-exact SET/GET at odd
//!   offsets, 64 MiB tensors, copies, 2D rows, graphs, the comm link between two servers, the
//!   tensor cache, SET_TENSOR data reaching the backend in chunks of at most 16 MiB.
//! * Hostile input: each attack closes only the offending connection, with its error kind
//!   logged; a bystander client keeps working with its data intact; the offender's buffers
//!   are freed (the backend is back to its baseline).
//! * Concurrency, the client limit and graceful shutdown.

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{bytes_tensor, capture_logs, f32_tensor, pattern, within, Raw, TestServer};
use ggml_rpc_client::{Client, ClientError};
use ggml_rpc_server::ServerConfig;
use ggml_rpc_tests::hostile::ABANDONED_SET_TENSOR;
use proto_core::ggml::types::id;
use proto_core::ggml::{flags, Op};
use proto_core::session::GraphSubmission;
use proto_core::tensor_cache::fnv1a64;
use proto_core::wire::{
    CommInitRequest, Dialect, GraphComputeRequest, ProtocolVersion, Request, RpcTensor,
    SetTensorHeader, HELLO_FLAG_EXTENSIONS,
};
use shell_common::FsTensorCache;
use tokio::io::AsyncWriteExt;

/// A healthy client with a buffer holding known data; checked after every attack.
struct Bystander {
    client: Client,
    tensor: RpcTensor,
    data: bytes::Bytes,
}

impl Bystander {
    async fn new(server: &TestServer) -> Bystander {
        let mut client = server.client(ProtocolVersion::V8_0_0).await;
        let buffer = client.alloc_buffer(0, 4096).await.unwrap().unwrap();
        let base = client.buffer_base(buffer.handle).await.unwrap();
        let tensor = bytes_tensor(1, buffer.handle, base, 4096);
        let data = pattern(4096, 42);
        client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
        Bystander {
            client,
            tensor,
            data,
        }
    }

    async fn still_works(&mut self) {
        assert_eq!(self.client.device_count().await.unwrap(), 1);
        assert_eq!(
            self.client.get_tensor(&self.tensor, 0, 4096).await.unwrap(),
            self.data
        );
    }
}

/// Runs one attack: a raw connection that said HELLO and allocated a buffer (so the server
/// holds something for it), then `attack`; the server must close it, log `kind`, free its
/// buffer, and keep serving the bystander.
async fn attack<F, Fut>(shell: &'static str, kind: &str, attack: F)
where
    F: FnOnce(Raw, u64, u64) -> Fut,
    Fut: std::future::Future<Output = Raw>,
{
    let (logs, _guard) = capture_logs();
    let server = TestServer::v8(shell);
    let mut bystander = Bystander::new(&server).await;
    let baseline = server.backend.live_buffers();
    let baseline_bytes = server.backend.used_bytes();

    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    let (handle, base) = raw.alloc(1024).await;
    assert_eq!(server.backend.live_buffers(), baseline + 1);
    let mut raw = attack(raw, handle, base).await;
    raw.expect_closed().await;
    logs.wait_for(&format!("kind={kind}")).await;
    server.wait_live_buffers(baseline).await;
    assert_eq!(server.backend.used_bytes(), baseline_bytes);
    bystander.still_works().await;
    server.shutdown().await;
    // The lines came from the shell under test (its client span names it).
    assert!(
        logs.text().contains(&format!("shell=\"{shell}\"")),
        "{}",
        logs.text()
    );
}

async fn device_queries_in_both_dialects(shell: &'static str) {
    for version in [ProtocolVersion::V7_0_0, ProtocolVersion::V8_0_0] {
        let server = TestServer::start(shell, ServerConfig::new(version));
        let mut client = server.client(version).await;
        assert_eq!(client.server_version(), version);
        // Bit 7: our extensions (remote copy), offered by default.
        assert_eq!(client.server_flags(), HELLO_FLAG_EXTENSIONS);
        assert!(!client.server_has_tensor_cache());
        assert_eq!(client.device_count().await.unwrap(), 1);
        assert_eq!(client.alignment(0).await.unwrap(), 32);
        assert_eq!(client.max_size(0).await.unwrap(), 1 << 30);
        let memory = client.device_memory(0).await.unwrap();
        assert_eq!((memory.free, memory.total), (1 << 30, 1 << 30));
        let tensor = f32_tensor(1, 0, 0, [33, 3, 1, 1]);
        assert_eq!(
            client.alloc_size(0, &tensor, &[]).await.unwrap(),
            33 * 3 * 4
        );
        drop(client);
        server.shutdown().await;
    }
}

async fn buffers_and_byte_exact_round_trips(shell: &'static str) {
    let server = TestServer::v8(shell);
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    let buffer = client.alloc_buffer(0, 10_000).await.unwrap().unwrap();
    assert_eq!(buffer.size, 10_000);
    let base = client.buffer_base(buffer.handle).await.unwrap();
    assert_ne!(base, 0);
    // A tensor at an odd address inside the buffer, written and read at odd offsets/sizes.
    let tensor = bytes_tensor(1, buffer.handle, base + 3, 9_001);
    let data = pattern(9_001, 7);
    client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
    assert_eq!(client.get_tensor(&tensor, 0, 9_001).await.unwrap(), data);
    for (offset, size) in [(1u64, 1u64), (17, 333), (4_095, 4_097), (9_000, 1), (5, 0)] {
        let got = client.get_tensor(&tensor, offset, size).await.unwrap();
        assert_eq!(got, data.slice(offset as usize..(offset + size) as usize));
    }
    let patch = pattern(777, 99);
    client
        .set_tensor(&tensor, 1_001, patch.clone())
        .await
        .unwrap();
    let mut expected = data.to_vec();
    expected[1_001..1_778].copy_from_slice(&patch);
    assert_eq!(
        client.get_tensor(&tensor, 0, 9_001).await.unwrap(),
        expected
    );

    // MEMSET_TENSOR, BUFFER_CLEAR
    client.memset_tensor(&tensor, 13, 29, 0xab).await.unwrap();
    expected[13..42].fill(0xab);
    assert_eq!(
        client.get_tensor(&tensor, 0, 9_001).await.unwrap(),
        expected
    );
    client.buffer_clear(buffer.handle, 0x5a).await.unwrap();
    let whole = bytes_tensor(2, buffer.handle, base, 10_000);
    let cleared = client.get_tensor(&whole, 0, 10_000).await.unwrap();
    assert!(cleared.iter().all(|&b| b == 0x5a));

    // A zero-size buffer has base 0, as the reference reports.
    let empty = client.alloc_buffer(0, 0).await.unwrap().unwrap();
    assert_eq!(client.buffer_base(empty.handle).await.unwrap(), 0);

    // Allocation failure is soft: (0, 0) and the connection goes on.
    assert_eq!(client.alloc_buffer(0, 2 << 30).await.unwrap(), None);
    assert_eq!(server.backend.live_buffers(), 2);

    client.free_buffer(buffer.handle).await.unwrap();
    client.free_buffer(empty.handle).await.unwrap();
    assert_eq!(client.device_count().await.unwrap(), 1);
    assert_eq!(server.backend.live_buffers(), 0);
    server.shutdown().await;
}

async fn a_64_mib_tensor_round_trips(shell: &'static str) {
    let server = TestServer::v8(shell);
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    let len = 64 << 20;
    let buffer = client
        .alloc_buffer(0, len as u64 + 32)
        .await
        .unwrap()
        .unwrap();
    let base = client.buffer_base(buffer.handle).await.unwrap();
    let tensor = bytes_tensor(1, buffer.handle, base + 32, len as u32);
    let data = pattern(len, 3);
    client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
    let got = client.get_tensor(&tensor, 0, len as u64).await.unwrap();
    assert!(got == data, "64 MiB round trip differs");
    let tail = client
        .get_tensor(&tensor, len as u64 - 100_001, 100_001)
        .await
        .unwrap();
    assert_eq!(tail, data.slice(len - 100_001..));
    server.shutdown().await;
}

async fn copy_init_and_2d_rows(shell: &'static str) {
    let server = TestServer::v8(shell);
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    let buffer = client.alloc_buffer(0, 4096).await.unwrap().unwrap();
    let base = client.buffer_base(buffer.handle).await.unwrap();
    let a = f32_tensor(1, buffer.handle, base, [64, 1, 1, 1]);
    let b = f32_tensor(2, buffer.handle, base + 256, [64, 1, 1, 1]);
    let data = pattern(256, 1);
    client.set_tensor(&a, 0, data.clone()).await.unwrap();
    client.init_tensor(&b).await.unwrap();
    assert!(client.copy_tensor(&a, &b).await.unwrap());
    assert_eq!(client.get_tensor(&b, 0, 256).await.unwrap(), data);

    // three rows of 8 bytes every 32 bytes, starting at byte 16
    let rows = pattern(24, 50);
    client
        .set_tensor_2d(&a, 16, 8, 3, 32, rows.clone())
        .await
        .unwrap();
    assert_eq!(client.get_tensor_2d(&a, 16, 8, 3, 32).await.unwrap(), rows);
    let mut expected = data.to_vec();
    for row in 0..3 {
        expected[16 + 32 * row..24 + 32 * row].copy_from_slice(&rows[8 * row..8 * row + 8]);
    }
    assert_eq!(client.get_tensor(&a, 0, 256).await.unwrap(), expected);
    server.shutdown().await;
}

async fn graphs_compute_then_recompute(shell: &'static str) {
    for version in [ProtocolVersion::V7_0_0, ProtocolVersion::V8_0_0] {
        let server = TestServer::start(shell, ServerConfig::new(version));
        let mut client = server.client(version).await;
        let buffer = client.alloc_buffer(0, 1024).await.unwrap().unwrap();
        let base = client.buffer_base(buffer.handle).await.unwrap();
        let leaf = f32_tensor(1, buffer.handle, base + 256, [4, 1, 1, 1]);
        let mut node = f32_tensor(2, buffer.handle, base + 256, [4, 1, 1, 1]);
        node.op = Op::VIEW.0;
        node.view_src = 1;
        node.flags = flags::COMPUTE;
        let graph = GraphComputeRequest {
            device: 0,
            uid: 42,
            node_ids: vec![2],
            tensors: vec![leaf, node],
        };
        assert_eq!(
            client.graph_compute(&graph).await.unwrap(),
            GraphSubmission::Compute
        );
        assert_eq!(
            client.graph_compute(&graph).await.unwrap(),
            GraphSubmission::Recompute
        );
        // A round trip makes sure both were executed (commands run in order).
        client.device_count().await.unwrap();
        assert_eq!(server.backend.graphs_run(), 2);
        server.shutdown().await;
    }
}

async fn comm_init_refusals_keep_the_connection(shell: &'static str) {
    let server = TestServer::v8(shell);
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    let mut host = [0u8; 64];
    host[..9].copy_from_slice(b"127.0.0.1");
    let request = CommInitRequest {
        device: 0,
        rank: 1,
        world: 2,
        port: 1,
        host,
    };
    // COMM_INIT answers "not ready" for what it cannot serve, and the connection goes on.
    for bad in [
        CommInitRequest {
            device: 7,
            ..request.clone()
        },
        CommInitRequest {
            world: 3,
            ..request.clone()
        },
        CommInitRequest {
            rank: 2,
            ..request.clone()
        },
        CommInitRequest {
            port: 0,
            ..request.clone()
        },
        CommInitRequest {
            port: 70_000,
            ..request.clone()
        },
        CommInitRequest {
            host: [0; 64],
            ..request.clone()
        },
    ] {
        assert!(!client.comm_init(&bad).await.unwrap(), "{bad:?}");
    }
    client.comm_free(0).await.unwrap();
    assert_eq!(client.device_count().await.unwrap(), 1);
    // An all-reduce without a communicator closes the connection.
    let tensor = f32_tensor(1, 0, 0, [4, 1, 1, 1]);
    client.comm_allreduce(0, &tensor).await.unwrap();
    assert!(matches!(
        client.device_count().await,
        Err(ClientError::Closed | ClientError::Io(_))
    ));
    server.shutdown().await;
}

/// Two servers, one client connection to each: COMM_INIT links them, COMM_ALLREDUCE sums.
async fn two_servers_all_reduce_over_their_comm_link(shell: &'static str) {
    let servers = [TestServer::v8(shell), TestServer::v8(shell)];
    let mut clients = Vec::new();
    let mut tensors = Vec::new();
    // 40 000 elements: above the BF16 wire threshold; integers below 256 are exact in BF16.
    let elements = 40_000u32;
    for (rank, server) in servers.iter().enumerate() {
        let mut client = server.client(ProtocolVersion::V8_0_0).await;
        let buffer = client
            .alloc_buffer(0, u64::from(elements) * 4)
            .await
            .unwrap()
            .unwrap();
        let base = client.buffer_base(buffer.handle).await.unwrap();
        let mut tensor = f32_tensor(1, buffer.handle, base, [elements, 1, 1, 1]);
        tensor.flags = flags::COMPUTE;
        let values: Vec<u8> = (0..elements)
            .flat_map(|i| (((i % 50) as f32) * (rank as f32 + 1.0)).to_le_bytes())
            .collect();
        client.set_tensor(&tensor, 0, values.into()).await.unwrap();
        clients.push(client);
        tensors.push(tensor);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut host = [0u8; 64];
    host[..9].copy_from_slice(b"127.0.0.1");
    let rank0 = CommInitRequest {
        device: 0,
        rank: 0,
        world: 2,
        port: u32::from(port),
        host: [0; 64],
    };
    let rank1 = CommInitRequest {
        device: 0,
        rank: 1,
        world: 2,
        port: u32::from(port),
        host,
    };
    let (second, first) = clients.split_at_mut(1);
    let (a, b) =
        within(async { tokio::join!(second[0].comm_init(&rank0), first[0].comm_init(&rank1)) })
            .await;
    assert!(a.unwrap() && b.unwrap());
    // Already linked: answered at once.
    assert!(second[0].comm_init(&rank0).await.unwrap());
    for round in 0..2 {
        for (client, tensor) in clients.iter_mut().zip(&tensors) {
            client.comm_allreduce(0, tensor).await.unwrap();
        }
        for (client, tensor) in clients.iter_mut().zip(&tensors) {
            let got = within(client.get_tensor(tensor, 0, u64::from(elements) * 4))
                .await
                .unwrap();
            for (i, value) in got.chunks_exact(4).enumerate() {
                let value = f32::from_le_bytes(value.try_into().unwrap());
                let expected = ((i % 50) as f32) * 3.0 * 2f32.powi(round);
                assert_eq!(value, expected, "round {round} element {i}");
            }
        }
    }
    for client in &mut clients {
        client.comm_free(0).await.unwrap();
        assert_eq!(client.device_count().await.unwrap(), 1);
    }
    for server in servers {
        server.shutdown().await;
    }
}

async fn tensor_cache_directory_serves_set_tensor_hash(shell: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(FsTensorCache::open(dir.path().join("rpc")).unwrap());
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.tensor_cache = Some(cache.clone());
    let server = TestServer::start(shell, config);

    let mut first = server.client(ProtocolVersion::V8_0_0).await;
    assert!(first.server_has_tensor_cache());
    assert_eq!(first.server_flags(), 1 | HELLO_FLAG_EXTENSIONS);
    let buffer = first.alloc_buffer(0, 1 << 20).await.unwrap().unwrap();
    let base = first.buffer_base(buffer.handle).await.unwrap();
    let tensor = bytes_tensor(1, buffer.handle, base, 1 << 20);
    let data = pattern(1 << 20, 11);
    let hash = fnv1a64(&data);
    assert!(!first.set_tensor_hash(&tensor, 0, hash).await.unwrap());
    first
        .set_tensor_with_cache_flag(&tensor, 0, data.clone(), true)
        .await
        .unwrap();
    first.device_count().await.unwrap();
    let path = dir.path().join("rpc").join(format!("{hash:016x}"));
    assert_eq!(std::fs::read(&path).unwrap(), data);
    drop(first);

    // Another connection gets the data from the cache.
    let mut second = server.client(ProtocolVersion::V8_0_0).await;
    let buffer = second.alloc_buffer(0, 1 << 20).await.unwrap().unwrap();
    let base = second.buffer_base(buffer.handle).await.unwrap();
    let tensor = bytes_tensor(1, buffer.handle, base, 1 << 20);
    assert!(second.set_tensor_hash(&tensor, 0, hash).await.unwrap());
    assert_eq!(second.get_tensor(&tensor, 0, 1 << 20).await.unwrap(), data);

    // A planted file whose content does not match its name is a miss, and is removed.
    let planted = dir.path().join("rpc").join(format!("{:016x}", 0x1234u64));
    std::fs::write(&planted, b"not what the name says").unwrap();
    assert!(!second.set_tensor_hash(&tensor, 0, 0x1234).await.unwrap());
    assert!(!planted.exists());
    let only: Vec<_> = std::fs::read_dir(dir.path().join("rpc")).unwrap().collect();
    assert_eq!(only.len(), 1, "no temporary files are left behind");
    let _ = Bytes::new();
    server.shutdown().await;
}

async fn set_tensor_data_reaches_the_backend_in_chunks_of_at_most_16_mib(shell: &'static str) {
    let backend = Arc::new(Observed::new(true));
    let server = common::start(
        shell,
        backend.clone(),
        ServerConfig::new(ProtocolVersion::V8_0_0),
    );
    let mut client = within(Client::connect(
        server.local_addr(),
        ProtocolVersion::V8_0_0,
    ))
    .await
    .unwrap();
    let len = 40 << 20;
    let buffer = client.alloc_buffer(0, len as u64).await.unwrap().unwrap();
    let base = client.buffer_base(buffer.handle).await.unwrap();
    let tensor = bytes_tensor(1, buffer.handle, base, len as u32);
    let data = pattern(len, 9);
    client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
    // 40 MiB: more than one reply piece, so this reply is streamed.
    assert!(
        client.get_tensor(&tensor, 0, len as u64).await.unwrap() == data,
        "40 MiB round trip differs"
    );
    let writes = backend.writes.lock().unwrap().clone();
    assert_eq!(writes.iter().sum::<usize>(), len);
    assert!(writes.iter().all(|&w| w <= 16 << 20), "{writes:?}");
    // Streamed in few, large pieces (each shell reads 8 MiB at a time while data streams),
    // not one write per 64 KiB socket read.
    assert!(writes.len() <= 12, "{writes:?}");
    drop(client);
    common::shutdown(server).await;
}

async fn tensor_outside_its_buffer(shell: &'static str) {
    attack(shell, "out_of_bounds", |mut raw, handle, base| async move {
        // 1024-byte buffer, a 512-byte tensor starting 768 bytes in.
        let tensor = bytes_tensor(9, handle, base + 768, 512);
        raw.send(&Request::GetTensor {
            tensor: Box::new(tensor),
            offset: 0,
            size: 4,
        })
        .await;
        raw
    })
    .await;
}

async fn set_tensor_past_the_buffer_end(shell: &'static str) {
    attack(shell, "out_of_bounds", |mut raw, handle, base| async move {
        let tensor = bytes_tensor(9, handle, base, 1024);
        let header = SetTensorHeader {
            tensor,
            cache_flag: 0,
            offset: 1000,
        };
        raw.send(&Request::SetTensor {
            header: Box::new(header),
            data: pattern(100, 1),
        })
        .await;
        raw
    })
    .await;
}

async fn ne0_not_a_multiple_of_the_block_size(shell: &'static str) {
    attack(
        shell,
        "block_misaligned",
        |mut raw, handle, base| async move {
            let mut tensor = RpcTensor::contiguous(9, id::Q4_0, [32, 1, 1, 1]).unwrap();
            tensor.ne[0] = 33;
            tensor.buffer = handle;
            tensor.data = base;
            raw.send(&Request::GetTensor {
                tensor: Box::new(tensor),
                offset: 0,
                size: 4,
            })
            .await;
            raw
        },
    )
    .await;
}

async fn a_set_tensor_length_field_of_2_pow_62(shell: &'static str) {
    attack(shell, "out_of_bounds", |mut raw, handle, base| async move {
        let tensor = bytes_tensor(9, handle, base, 1024);
        let header = SetTensorHeader {
            tensor,
            cache_flag: 0,
            offset: 0,
        };
        let mut frame = Request::SetTensor {
            header: Box::new(header),
            data: pattern(8, 1),
        }
        .to_frame(Dialect::V8)
        .unwrap()
        .to_vec();
        frame[1..9].copy_from_slice(&(1u64 << 62).to_le_bytes());
        raw.write(&frame).await;
        raw
    })
    .await;
}

async fn a_graph_length_field_of_2_pow_62(shell: &'static str) {
    attack(shell, "message_too_large", |mut raw, _, _| async move {
        let mut frame = vec![10u8];
        frame.extend_from_slice(&(1u64 << 62).to_le_bytes());
        frame.extend_from_slice(&[0; 64]);
        raw.write(&frame).await;
        raw
    })
    .await;
}

async fn a_fixed_size_command_with_a_wrong_length(shell: &'static str) {
    attack(shell, "request_size_mismatch", |mut raw, _, _| async move {
        let mut frame = vec![1u8];
        frame.extend_from_slice(&(1u64 << 62).to_le_bytes());
        raw.write(&frame).await;
        raw
    })
    .await;
}

async fn an_unknown_command(shell: &'static str) {
    attack(shell, "unknown_command", |mut raw, _, _| async move {
        let mut frame = vec![23u8];
        frame.extend_from_slice(&0u64.to_le_bytes());
        raw.write(&frame).await;
        raw
    })
    .await;
}

async fn a_second_hello(shell: &'static str) {
    attack(shell, "duplicate_hello", |mut raw, _, _| async move {
        raw.send(&Request::Hello { caps: [0; 24] }).await;
        raw
    })
    .await;
}

async fn a_truncated_frame(shell: &'static str) {
    attack(shell, "unexpected_eof", |mut raw, handle, _| async move {
        let frame = Request::BufferClear {
            buffer: handle,
            value: 1,
        }
        .to_frame(Dialect::V8)
        .unwrap();
        raw.write(&frame[..12]).await;
        raw.stream.shutdown().await.unwrap();
        raw
    })
    .await;
}

async fn disconnecting_in_the_middle_of_a_large_set_tensor(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let server = TestServer::v8(shell);
    let mut bystander = Bystander::new(&server).await;
    let baseline = server.backend.live_buffers();
    let baseline_bytes = server.backend.used_bytes();

    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    // The frame announces 256 MiB of data; the client sends the header and 100 MiB of it,
    // then goes away (the same bytes `ggml-rpc conformance` sends).
    let case = ABANDONED_SET_TENSOR;
    let (handle, base) = raw.alloc(u64::from(case.announced)).await;
    raw.write(&case.head(Dialect::V8, handle, base).unwrap())
        .await;
    let piece = vec![0x5a; 4 << 20];
    for _ in 0..case.sent / piece.len() as u64 {
        raw.write(&piece).await;
    }
    drop(raw);
    logs.wait_for("kind=unexpected_eof").await;
    server.wait_live_buffers(baseline).await;
    assert_eq!(server.backend.used_bytes(), baseline_bytes);
    bystander.still_works().await;
    server.shutdown().await;
}

async fn a_command_before_hello(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let server = TestServer::v8(shell);
    let mut bystander = Bystander::new(&server).await;
    let mut raw = Raw::connect(server.addr, Dialect::V8).await;
    raw.send(&Request::DeviceCount).await;
    raw.expect_closed().await;
    logs.wait_for("kind=hello_expected").await;
    // A HELLO of the wrong size (an old client) is refused too.
    let mut raw = Raw::connect(server.addr, Dialect::V8).await;
    let mut frame = vec![14u8];
    frame.extend_from_slice(&0u64.to_le_bytes());
    raw.write(&frame).await;
    raw.expect_closed().await;
    logs.wait_for("kind=request_size_mismatch").await;
    bystander.still_works().await;
    server.shutdown().await;
}

async fn a_client_exceeding_its_memory_quota(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.memory_quota = Some(64 << 10);
    let server = TestServer::start(shell, config);
    let mut bystander = Bystander::new(&server).await;
    let baseline = server.backend.live_buffers();

    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    raw.alloc(40 << 10).await;
    // 40 KiB + 40 KiB > 64 KiB
    raw.send(&Request::AllocBuffer {
        device: 0,
        size: 40 << 10,
    })
    .await;
    raw.expect_closed().await;
    logs.wait_for("kind=quota_exceeded").await;
    server.wait_live_buffers(baseline).await;
    // The quota is per client: the bystander may still allocate up to it.
    let more = bystander.client.alloc_buffer(0, 56 << 10).await.unwrap();
    assert!(more.is_some());
    bystander.still_works().await;
    server.shutdown().await;
}

async fn responses_owed_before_a_bad_command_are_still_sent(shell: &'static str) {
    let server = TestServer::v8(shell);
    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    let mut frames = Request::DeviceCount.to_frame(Dialect::V8).unwrap().to_vec();
    frames.extend_from_slice(&[200, 0, 0, 0, 0, 0, 0, 0, 0]);
    raw.write(&frames).await;
    let answer = raw.read(12).await;
    assert_eq!(&answer[8..], &1u32.to_le_bytes());
    raw.expect_closed().await;
    server.shutdown().await;
}

async fn concurrent_clients_keep_their_own_data(shell: &'static str) {
    let server = TestServer::v8(shell);
    let clients = 8;
    let rounds = 20;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let addr = server.addr;
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(addr, ProtocolVersion::V8_0_0)
                .await
                .unwrap();
            let size = 256 * 1024 + c * 4099;
            let buffer = client.alloc_buffer(0, size as u64).await.unwrap().unwrap();
            let base = client.buffer_base(buffer.handle).await.unwrap();
            let tensor = bytes_tensor(1, buffer.handle, base, size as u32);
            for round in 0..rounds {
                let data = pattern(size, (c * 31 + round) as u8);
                client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
                // interleave small commands with the transfers of the others
                assert_eq!(client.alignment(0).await.unwrap(), 32);
                let got = client.get_tensor(&tensor, 0, size as u64).await.unwrap();
                assert!(
                    got == data,
                    "client {c} round {round}: data of another client?"
                );
            }
            buffer.handle
        }));
    }
    let mut handles = Vec::new();
    for task in tasks {
        handles.push(within(task).await.unwrap());
    }
    // Handles are per connection; buffers of closed clients are all gone.
    assert_eq!(handles.len(), clients);
    server.wait_live_buffers(0).await;
    server.shutdown().await;
}

async fn clients_beyond_the_limit_are_refused(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.max_clients = 2;
    let server = TestServer::start(shell, config);
    let mut first = server.client(ProtocolVersion::V8_0_0).await;
    let mut second = server.client(ProtocolVersion::V8_0_0).await;
    // Clients holding buffers never give way to a new one (see tests/admission.rs).
    for client in [&mut first, &mut second] {
        client.alloc_buffer(0, 4096).await.unwrap().unwrap();
    }
    // The third connection is accepted by the kernel and closed by the server at once.
    let mut third = Raw::connect(server.addr, Dialect::V8).await;
    third.expect_closed().await;
    logs.wait_for("too many clients").await;
    assert_eq!(first.device_count().await.unwrap(), 1);
    assert_eq!(second.device_count().await.unwrap(), 1);
    // A slot frees up when a client leaves.
    drop(first);
    common::eventually(|| logs.text().matches("Client connection closed").count() >= 1).await;
    let mut fourth = server.client(ProtocolVersion::V8_0_0).await;
    assert_eq!(fourth.device_count().await.unwrap(), 1);
    server.shutdown().await;
}

async fn shutdown_closes_idle_clients_and_frees_their_buffers(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let server = TestServer::v8(shell);
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    client.alloc_buffer(0, 4096).await.unwrap().unwrap();
    let addr = server.addr;
    let backend = server.backend.clone();
    server.shutdown().await;
    assert_eq!(backend.live_buffers(), 0);
    assert!(logs.text().contains("server shutting down"));
    // The connection is closed and nothing listens any more.
    assert!(matches!(
        client.device_count().await,
        Err(ClientError::Closed | ClientError::Io(_))
    ));
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        Client::connect(addr, ProtocolVersion::V8_0_0),
    )
    .await;
    assert!(matches!(refused, Ok(Err(_))));
}

/// A memory backend the tests look into: it records the size of every write it receives, and
/// its graph computations wait at a gate until the test opens it (a heavy call held for as
/// long as the test wants, without timing).
struct Observed {
    inner: proto_core::backend::MemoryBackend,
    writes: std::sync::Mutex<Vec<usize>>,
    entered: std::sync::atomic::AtomicUsize,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Observed {
    /// A 1 GiB memory backend with the gate open or closed.
    fn new(open: bool) -> Observed {
        Observed {
            inner: proto_core::backend::MemoryBackend::new(1, 1 << 30),
            writes: std::sync::Mutex::new(Vec::new()),
            entered: Default::default(),
            open: std::sync::Mutex::new(open),
            opened: std::sync::Condvar::new(),
        }
    }

    fn entered(&self) -> usize {
        self.entered.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// Opens the gate when dropped, so a failing test does not leave server threads waiting.
struct OpenOnDrop(Arc<Observed>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// A one-node graph (a VIEW of a leaf) in a fresh buffer of `client`.
async fn view_graph(client: &mut Client, uid: u64) -> GraphComputeRequest {
    let buffer = client.alloc_buffer(0, 1024).await.unwrap().unwrap();
    let base = client.buffer_base(buffer.handle).await.unwrap();
    let leaf = f32_tensor(1, buffer.handle, base + 256, [4, 1, 1, 1]);
    let mut node = f32_tensor(2, buffer.handle, base + 256, [4, 1, 1, 1]);
    node.op = Op::VIEW.0;
    node.view_src = 1;
    node.flags = flags::COMPUTE;
    GraphComputeRequest {
        device: 0,
        uid,
        node_ids: vec![2],
        tensors: vec![leaf, node],
    }
}

async fn long_computations_do_not_stall_other_clients(shell: &'static str) {
    let backend = Arc::new(Observed::new(false));
    let server = common::start(
        shell,
        backend.clone(),
        ServerConfig::new(ProtocolVersion::V8_0_0),
    );
    let _gate = OpenOnDrop(backend.clone());
    let addr = server.local_addr();
    // Two clients whose graphs are held at the gate (as many as the tokio shell has workers
    // on two cores): a heavy call must never keep the other connections waiting, neither
    // those already connected nor new ones. (Running one heavy call plainly inline on a tokio
    // worker instead of under `block_in_place` failed this under load: a task woken by that
    // worker waits in its non-stealable LIFO slot.)
    let mut computing = Vec::new();
    for uid in [1, 2] {
        let mut client = within(Client::connect(addr, ProtocolVersion::V8_0_0))
            .await
            .unwrap();
        let graph = view_graph(&mut client, uid).await;
        client.graph_compute(&graph).await.unwrap();
        computing.push(client);
    }
    common::eventually(|| backend.entered() == 2).await;
    let mut other = within(Client::connect(addr, ProtocolVersion::V8_0_0))
        .await
        .unwrap();
    for _ in 0..20 {
        assert_eq!(within(other.alignment(0)).await.unwrap(), 32);
    }
    let buffer = within(other.alloc_buffer(0, 4096)).await.unwrap().unwrap();
    let base = within(other.buffer_base(buffer.handle)).await.unwrap();
    let tensor = bytes_tensor(1, buffer.handle, base, 4096);
    let data = pattern(4096, 3);
    within(other.set_tensor(&tensor, 0, data.clone()))
        .await
        .unwrap();
    assert_eq!(
        within(other.get_tensor(&tensor, 0, 4096)).await.unwrap(),
        data
    );
    // The two graphs were held all along; released, their clients go on.
    assert_eq!(backend.entered(), 2);
    backend.open();
    for mut client in computing {
        assert_eq!(within(client.device_count()).await.unwrap(), 1);
    }
    assert_eq!(backend.inner.graphs_run(), 2);
    common::shutdown(server).await;
}

impl proto_core::backend::Backend for Observed {
    fn device_count(&self) -> u32 {
        self.inner.device_count()
    }
    fn device_memory(&self, device: u32) -> proto_core::backend::DeviceMemory {
        self.inner.device_memory(device)
    }
    fn alignment(&self, device: u32) -> u64 {
        self.inner.alignment(device)
    }
    fn max_size(&self, device: u32) -> u64 {
        self.inner.max_size(device)
    }
    fn alloc_buffer(&self, device: u32, size: u64) -> Option<proto_core::backend::AllocatedBuffer> {
        self.inner.alloc_buffer(device, size)
    }
    fn free_buffer(&self, buffer: proto_core::backend::BufferId) {
        self.inner.free_buffer(buffer)
    }
    fn clear_buffer(
        &self,
        buffer: proto_core::backend::BufferId,
        value: u8,
    ) -> proto_core::Result<()> {
        self.inner.clear_buffer(buffer, value)
    }
    fn write(
        &self,
        at: proto_core::backend::TensorLocation,
        data: &[u8],
    ) -> proto_core::Result<()> {
        self.writes.lock().unwrap().push(data.len());
        self.inner.write(at, data)
    }
    fn read(
        &self,
        at: proto_core::backend::TensorLocation,
        out: &mut [u8],
    ) -> proto_core::Result<()> {
        self.inner.read(at, out)
    }
    fn fill(
        &self,
        at: proto_core::backend::TensorLocation,
        len: u64,
        value: u8,
    ) -> proto_core::Result<()> {
        self.inner.fill(at, len, value)
    }
    fn copy(
        &self,
        src: proto_core::backend::TensorLocation,
        dst: proto_core::backend::TensorLocation,
        len: u64,
    ) -> proto_core::Result<bool> {
        self.inner.copy(src, dst, len)
    }
    fn graph_compute(
        &self,
        device: u32,
        graph: &proto_core::graph::Graph,
    ) -> proto_core::Result<()> {
        self.entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        drop(open);
        self.inner.graph_compute(device, graph)
    }
}

for_each_shell!(
    device_queries_in_both_dialects,
    buffers_and_byte_exact_round_trips,
    a_64_mib_tensor_round_trips,
    copy_init_and_2d_rows,
    graphs_compute_then_recompute,
    comm_init_refusals_keep_the_connection,
    two_servers_all_reduce_over_their_comm_link,
    tensor_cache_directory_serves_set_tensor_hash,
    set_tensor_data_reaches_the_backend_in_chunks_of_at_most_16_mib,
    tensor_outside_its_buffer,
    set_tensor_past_the_buffer_end,
    ne0_not_a_multiple_of_the_block_size,
    a_set_tensor_length_field_of_2_pow_62,
    a_graph_length_field_of_2_pow_62,
    a_fixed_size_command_with_a_wrong_length,
    an_unknown_command,
    a_second_hello,
    a_truncated_frame,
    disconnecting_in_the_middle_of_a_large_set_tensor,
    a_command_before_hello,
    a_client_exceeding_its_memory_quota,
    responses_owed_before_a_bad_command_are_still_sent,
    concurrent_clients_keep_their_own_data,
    clients_beyond_the_limit_are_refused,
    shutdown_closes_idle_clients_and_frees_their_buffers,
    long_computations_do_not_stall_other_clients,
);
