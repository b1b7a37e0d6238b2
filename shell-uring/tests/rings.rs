//! The io_uring shell with several rings (the conformance suite in `ggml-rpc-server` runs the
//! default, one ring): clients spread over the rings keep their own data, the client limit is
//! shared, and stopping frees everything.
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::time::Duration;

use ggml_rpc_client::Client;
use proto_core::backend::MemoryBackend;
use proto_core::wire::{ProtocolVersion, RpcTensor};
use shell_uring::{Server, ServerConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_on_several_rings() {
    let backend = Arc::new(MemoryBackend::new(1, 1 << 30));
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.rings = 3;
    config.stream_chunk = 1 << 20;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(listener, backend.clone(), config).unwrap();
    let addr = server.local_addr();
    let mut tasks = Vec::new();
    for c in 0..9u8 {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(addr, ProtocolVersion::V8_0_0)
                .await
                .unwrap();
            let len = (3 << 20) + usize::from(c) * 4097;
            let buffer = client.alloc_buffer(0, len as u64).await.unwrap().unwrap();
            let base = client.buffer_base(buffer.handle).await.unwrap();
            let mut tensor = RpcTensor::contiguous(1, 24, [len as u32, 1, 1, 1]).unwrap();
            tensor.buffer = buffer.handle;
            tensor.data = base;
            for round in 0..3u8 {
                let data: bytes::Bytes = (0..len)
                    .map(|i| (i as u8) ^ c.wrapping_mul(37) ^ round)
                    .collect::<Vec<u8>>()
                    .into();
                client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
                assert_eq!(client.alignment(0).await.unwrap(), 32);
                let got = client.get_tensor(&tensor, 0, len as u64).await.unwrap();
                assert!(got == data, "client {c} round {round}");
            }
            client
        }));
    }
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(backend.live_buffers(), 9);
    // Stopping closes the idle clients on every ring and frees their buffers.
    let stopper = server.stopper();
    stopper.stop();
    tokio::task::spawn_blocking(move || server.join())
        .await
        .unwrap();
    assert_eq!(backend.live_buffers(), 0);
    for client in &mut clients {
        assert!(client.device_count().await.is_err());
    }
}

#[test]
fn probe_reports_io_uring_available_here() {
    // The suite runs where io_uring works; where it does not, this says why.
    shell_uring::probe().unwrap();
}
