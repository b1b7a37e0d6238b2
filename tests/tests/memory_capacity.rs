//! The CPU device's memory capacity: clients together asking for three times what the server
//! may hold, and writing every byte they got. Allocations past the capacity are refused as the
//! reference refuses a failed allocation (a zero handle, the connection stays), what was granted
//! never exceeds the capacity, every granted byte is really written and reads back, free memory
//! follows what is allocated, and the server serves on afterwards.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use backend_cpu::{CpuBackend, CpuConfig, MemoryCapacity};
use bytes::Bytes;
use ggml_rpc_client::Client;
use proto_core::backend::Backend;
use proto_core::wire::{ProtocolVersion, RpcTensor};

const CAPACITY: u64 = 1 << 30;
const BUFFER: u64 = 256 << 20;
const CLIENTS: usize = 4;
const ASKED_PER_CLIENT: usize = 3;

#[test]
fn clients_asking_for_three_times_the_capacity_get_clean_refusals() {
    let backend = Arc::new(CpuBackend::new(CpuConfig {
        threads: 1,
        capacity: MemoryCapacity::Bytes(CAPACITY),
        ..CpuConfig::default()
    }));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = backend.clone() as Arc<dyn Backend>;
    let server = ggml_rpc_server::shells::start(
        "tokio",
        listener,
        served,
        shell_tokio::ServerConfig::new(ProtocolVersion::V8_0_1),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| tokio::spawn(client(addr, c as u8)))
            .collect();
        let mut granted = 0u64;
        let mut refused = 0usize;
        let mut clients = Vec::new();
        for handle in handles {
            let (client, got, refusals) = handle.await.expect("client task");
            granted += got;
            refused += refusals;
            clients.push(client);
        }
        assert!(
            granted <= CAPACITY,
            "granted {granted} bytes past the capacity"
        );
        assert_eq!(
            granted, CAPACITY,
            "the capacity is usable to the last buffer"
        );
        assert_eq!(
            refused,
            CLIENTS * ASKED_PER_CLIENT - (CAPACITY / BUFFER) as usize
        );
        assert_eq!(backend.used_bytes(), CAPACITY);
        // free memory follows what is allocated
        let mut probe = Client::connect(addr, ProtocolVersion::V8_0_1)
            .await
            .unwrap();
        assert_eq!(probe.device_memory(0).await.unwrap().free, 0);
        drop(clients);
        let start = std::time::Instant::now();
        while backend.used_bytes() != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "buffers not given back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(probe.device_memory(0).await.unwrap().free > 0);
        let again = probe.alloc_buffer(0, BUFFER).await.unwrap();
        assert!(again.is_some(), "memory given back is granted again");
    });
    server.shutdown().unwrap();
}

/// One client: asks for its buffers, fills every one it got with its own byte (server side,
/// BUFFER_CLEAR, then a SET_TENSOR at the end), and checks it reads back. Returns the client
/// (still connected), the bytes granted and the refusals.
async fn client(addr: SocketAddr, id: u8) -> (Client, u64, usize) {
    let mut client = Client::connect(addr, ProtocolVersion::V8_0_1)
        .await
        .unwrap();
    let (mut granted, mut refused) = (0, 0);
    for _ in 0..ASKED_PER_CLIENT {
        let Some(buffer) = client.alloc_buffer(0, BUFFER).await.unwrap() else {
            refused += 1;
            // a refusal keeps the connection
            client
                .device_count()
                .await
                .expect("connection after a refusal");
            continue;
        };
        granted += buffer.size;
        client.buffer_clear(buffer.handle, id + 1).await.unwrap();
        let base = client.buffer_base(buffer.handle).await.unwrap();
        let mut tail = RpcTensor::contiguous(1, 0, [1 << 18, 1, 1, 1]).unwrap();
        tail.buffer = buffer.handle;
        tail.data = base + BUFFER - (1 << 20);
        let pattern = Bytes::from(vec![id ^ 0x5a; 1 << 20]);
        client.set_tensor(&tail, 0, pattern.clone()).await.unwrap();
        assert_eq!(client.get_tensor(&tail, 0, 1 << 20).await.unwrap(), pattern);
        let mut head = tail;
        head.data = base;
        let cleared = client.get_tensor(&head, 0, 1 << 20).await.unwrap();
        assert!(
            cleared.iter().all(|&b| b == id + 1),
            "the clear wrote the buffer"
        );
    }
    (client, granted, refused)
}
