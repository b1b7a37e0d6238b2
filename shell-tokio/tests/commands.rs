//! Every command, our client against our server over loopback TCP, in both dialects.

mod common;

use bytes::Bytes;
use common::{bytes_tensor, f32_tensor, pattern, within, TestServer};
use proto_core::ggml::{flags, Op};
use proto_core::session::GraphSubmission;
use proto_core::tensor_cache::fnv1a64;
use proto_core::wire::{CommInitRequest, GraphComputeRequest, ProtocolVersion};
use shell_tokio::{Client, ClientError, FsTensorCache, ServerConfig};
use std::sync::Arc;

#[tokio::test]
async fn device_queries_in_both_dialects() {
    for version in [ProtocolVersion::V7_0_0, ProtocolVersion::V8_0_0] {
        let server = TestServer::start(ServerConfig::new(version)).await;
        let mut client = server.client(version).await;
        assert_eq!(client.server_version(), version);
        assert_eq!(client.server_flags(), 0);
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

#[tokio::test]
async fn connect_auto_follows_the_server_major() {
    for version in [ProtocolVersion::V7_0_0, ProtocolVersion::V8_0_0] {
        let server = TestServer::start(ServerConfig::new(version)).await;
        let mut client = within(Client::connect_auto(server.addr)).await.unwrap();
        assert_eq!(client.server_version(), version);
        assert_eq!(client.dialect(), version.dialect().unwrap());
        assert_eq!(client.device_count().await.unwrap(), 1);
        // A fixed version that does not match is refused as the reference client refuses it.
        let other = if version.major == 7 {
            ProtocolVersion::V8_0_0
        } else {
            ProtocolVersion::V7_0_0
        };
        let error = Client::connect(server.addr, other).await.unwrap_err();
        assert_eq!(error.version_mismatch(), Some(version));
        server.shutdown().await;
    }
}

#[tokio::test]
async fn buffers_and_byte_exact_round_trips() {
    let server = TestServer::v8().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_tensor_round_trips() {
    let server = TestServer::v8().await;
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

#[tokio::test]
async fn copy_init_and_2d_rows() {
    let server = TestServer::v8().await;
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

#[tokio::test]
async fn graphs_compute_then_recompute() {
    for version in [ProtocolVersion::V7_0_0, ProtocolVersion::V8_0_0] {
        let server = TestServer::start(ServerConfig::new(version)).await;
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

#[tokio::test]
async fn comm_init_refusals_keep_the_connection() {
    let server = TestServer::v8().await;
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_all_reduce_over_their_comm_link() {
    let servers = [TestServer::v8().await, TestServer::v8().await];
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

#[tokio::test]
async fn protocol_7_refuses_protocol_8_commands_on_the_client_side() {
    let server = TestServer::start(ServerConfig::new(ProtocolVersion::V7_0_0)).await;
    let mut client = server.client(ProtocolVersion::V7_0_0).await;
    let tensor = bytes_tensor(1, 0, 0, 8);
    let error = client.get_tensor_2d(&tensor, 0, 1, 1, 1).await.unwrap_err();
    assert_eq!(
        error.protocol_kind(),
        Some(proto_core::ErrorKind::UnknownCommand)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn tensor_cache_directory_serves_set_tensor_hash() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(FsTensorCache::open(dir.path().join("rpc")).unwrap());
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.tensor_cache = Some(cache.clone());
    let server = TestServer::start(config).await;

    let mut first = server.client(ProtocolVersion::V8_0_0).await;
    assert!(first.server_has_tensor_cache());
    assert_eq!(first.server_flags(), 1);
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

/// A backend that records the size of every write it receives.
struct Recording {
    inner: proto_core::backend::MemoryBackend,
    writes: std::sync::Mutex<Vec<usize>>,
}

impl proto_core::backend::Backend for Recording {
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
        self.inner.graph_compute(device, graph)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_tensor_data_reaches_the_backend_in_chunks_of_at_most_16_mib() {
    let backend = Arc::new(Recording {
        inner: proto_core::backend::MemoryBackend::new(1, 1 << 30),
        writes: std::sync::Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(shell_tokio::serve(
        listener,
        backend.clone(),
        ServerConfig::new(ProtocolVersion::V8_0_0),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut client = Client::connect(addr, ProtocolVersion::V8_0_0)
        .await
        .unwrap();
    let len = 40 << 20;
    let buffer = client.alloc_buffer(0, len as u64).await.unwrap().unwrap();
    let base = client.buffer_base(buffer.handle).await.unwrap();
    let tensor = bytes_tensor(1, buffer.handle, base, len as u32);
    let data = pattern(len, 9);
    client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
    assert_eq!(
        client.get_tensor(&tensor, 0, len as u64).await.unwrap(),
        data
    );
    let writes = backend.writes.lock().unwrap().clone();
    assert_eq!(writes.iter().sum::<usize>(), len);
    assert!(writes.iter().all(|&w| w <= 16 << 20), "{writes:?}");
    // Streamed in few, large pieces: not one write per socket read.
    assert!(writes.len() <= 6, "{writes:?}");
    drop(client);
    stop.send(()).unwrap();
    within(server).await.unwrap().unwrap();
}
