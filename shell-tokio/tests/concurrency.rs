//! Many clients at once, the client limit, and graceful shutdown.

mod common;

use std::time::Duration;

use common::{bytes_tensor, capture_logs, pattern, within, Raw, TestServer};
use proto_core::wire::{Dialect, ProtocolVersion};
use shell_tokio::{Client, ClientError, ServerConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_keep_their_own_data() {
    let server = TestServer::v8().await;
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

#[tokio::test]
async fn clients_beyond_the_limit_are_refused() {
    let (logs, _guard) = capture_logs();
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.max_clients = 2;
    let server = TestServer::start(config).await;
    let mut first = server.client(ProtocolVersion::V8_0_0).await;
    let mut second = server.client(ProtocolVersion::V8_0_0).await;
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

#[tokio::test]
async fn shutdown_closes_idle_clients_and_frees_their_buffers() {
    let (logs, _guard) = capture_logs();
    let server = TestServer::v8().await;
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
