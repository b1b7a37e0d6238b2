//! Large direct transfers (SET_TENSOR received straight into backend memory, GET_TENSOR sent
//! straight from it) with clients that keep stopping mid-transfer for longer than the server's
//! direct transfers wait on a blocking thread: the wait moves back to the ring and the transfer
//! resumes there, with every byte in place, and other clients are served meanwhile. Several
//! clients at once, so that some transfers run on the ring and some on blocking threads, and
//! with more of them than the blocking threads direct transfers may take, so that several
//! share the ring thread.
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::time::Duration;

use ggml_rpc_client::Client;
use proto_core::backend::MemoryBackend;
use proto_core::wire::{ProtocolVersion, RpcTensor};
use shell_uring::{Server, ServerConfig};

const LEN: usize = 24 << 20;

async fn tensor_in(client: &mut Client, len: usize) -> RpcTensor {
    let buffer = client.alloc_buffer(0, len as u64).await.unwrap().unwrap();
    let base = client.buffer_base(buffer.handle).await.unwrap();
    let mut tensor = RpcTensor::contiguous(1, 24, [len as u32, 1, 1, 1]).unwrap();
    tensor.buffer = buffer.handle;
    tensor.data = base;
    tensor
}

#[test]
fn stalling_clients_get_their_large_transfers_done() {
    stalling_clients(3, None);
}

#[test]
fn large_transfers_beyond_the_direct_threads_share_the_ring() {
    // One on a blocking thread, three taking turns on the ring.
    stalling_clients(4, Some(1));
}

fn stalling_clients(clients: u8, direct_threads: Option<usize>) {
    let backend = Arc::new(MemoryBackend::new(1, 1 << 30));
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    if let Some(threads) = direct_threads {
        config.direct_threads = threads;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(listener, backend.clone(), config).unwrap();
    let addr = server.local_addr();

    // Each stalling client runs on a runtime whose only thread is blocked now and then.
    let stalling: Vec<_> = (0..clients)
        .map(|c| {
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let mut client = Client::connect(addr, ProtocolVersion::V8_0_0)
                        .await
                        .unwrap();
                    let tensor = tensor_in(&mut client, LEN).await;
                    let data: bytes::Bytes = (0..LEN)
                        .map(|i| (i as u8) ^ ((i >> 13) as u8) ^ c)
                        .collect::<Vec<u8>>()
                        .into();
                    let staller = tokio::spawn(async {
                        for _ in 0..6 {
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            // Blocks the runtime: the transfer in progress stops on the client's side.
                            std::thread::sleep(Duration::from_millis(250));
                        }
                    });
                    client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
                    assert_eq!(client.alignment(0).await.unwrap(), 32);
                    let got = client.get_tensor(&tensor, 0, LEN as u64).await.unwrap();
                    assert!(got == data, "the stalled transfers came back intact");
                    staller.await.unwrap();
                    // Once more, both directions, without stalls.
                    let again = client.get_tensor(&tensor, 0, LEN as u64).await.unwrap();
                    assert!(again == data);
                });
            })
        })
        .collect();

    // Another client is served while the stalling one stops and goes.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut client = Client::connect(addr, ProtocolVersion::V8_0_0)
            .await
            .unwrap();
        for _ in 0..50 {
            let alignment = tokio::time::timeout(Duration::from_secs(5), client.alignment(0))
                .await
                .expect("a small command answered while another client stalls")
                .unwrap();
            assert_eq!(alignment, 32);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    for client in stalling {
        client.join().unwrap();
    }
    server.stop();
    server.join();
    assert_eq!(backend.live_buffers(), 0);
}
