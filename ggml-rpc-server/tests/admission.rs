//! Admission and progress, against every shell: no client can hold the server's places
//! without using them. A connection must complete HELLO in time, a message that has begun must
//! keep arriving and a reply keep draining; idle sessions stay open, but when every place is
//! taken a connection awaiting HELLO (else an idle one holding no buffers) gives way to a new
//! client; working ones never do; one address is held to its own limit.

#[macro_use]
mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{bytes_tensor, capture_logs, Raw, TestServer};
use ggml_rpc_client::Client;
use ggml_rpc_server::ServerConfig;
use proto_core::wire::{Dialect, ProtocolVersion, Request, SetTensorHeader};

/// Short deadlines, so each test runs in a second or two (long enough that a healthy client of
/// a loaded test machine meets them with a wide margin).
const HELLO: Duration = Duration::from_secs(1);
const WINDOW: Duration = Duration::from_millis(500);
/// 64 KiB/s: 32 KiB per window.
const RATE: u64 = 64 << 10;

fn config() -> ServerConfig {
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.hello_timeout = Some(HELLO);
    config.progress_window = Some(WINDOW);
    config.min_progress_rate = RATE;
    config
}

/// A client holding a buffer: never gives way.
async fn working_client(server: &TestServer) -> Client {
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    client.alloc_buffer(0, 4096).await.unwrap().unwrap();
    client
}

/// The head of a SET_TENSOR of `len` data bytes into a fresh buffer of `raw`.
async fn set_tensor_head(raw: &mut Raw, len: u32) -> Vec<u8> {
    let (handle, base) = raw.alloc(u64::from(len)).await;
    let header = SetTensorHeader {
        tensor: bytes_tensor(9, handle, base, len),
        cache_flag: 0,
        offset: 0,
    };
    let frame = Request::SetTensor {
        header: Box::new(header),
        data: Bytes::from_static(&[0; 1]),
    }
    .to_frame(Dialect::V8)
    .unwrap();
    let mut head = frame[..frame.len() - 1].to_vec();
    head[1..9].copy_from_slice(&(SetTensorHeader::SIZE as u64 + u64::from(len)).to_le_bytes());
    head
}

async fn a_connection_without_hello_is_closed_after_the_deadline(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let server = TestServer::start(shell, config());
    let mut silent = Raw::connect(server.addr, Dialect::V8).await;
    // Half a HELLO header, then nothing.
    silent.write(&[0, 0, 0]).await;
    silent.expect_closed().await;
    logs.wait_for("kind=hello_timeout").await;
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    assert_eq!(client.device_count().await.unwrap(), 1);
    server.shutdown().await;
}

async fn a_trickling_message_is_closed(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let server = TestServer::start(shell, config());
    let baseline = server.backend.live_buffers();
    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    let head = set_tensor_head(&mut raw, 1 << 20).await;
    raw.write(&head).await;
    // One byte every 20 ms: 50 B/s against the 64 KiB/s owed. The server shuts the socket, so
    // a write fails (or the trickle ends) once it gave up.
    for _ in 0..200 {
        if tokio::io::AsyncWriteExt::write_all(&mut raw.stream, &[7])
            .await
            .is_err()
        {
            break;
        }
        if logs.text().contains("kind=receive_stalled") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    logs.wait_for("kind=receive_stalled").await;
    raw.expect_closed().await;
    server.wait_live_buffers(baseline).await;
    server.shutdown().await;
}

async fn a_client_that_stops_reading_a_reply_is_closed(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let server = TestServer::start(shell, config());
    let baseline = server.backend.live_buffers();
    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    let len = 64u32 << 20;
    let (handle, base) = raw.alloc(u64::from(len)).await;
    let get = Request::GetTensor {
        tensor: Box::new(bytes_tensor(3, handle, base, len)),
        offset: 0,
        size: u64::from(len),
    };
    // 64 MiB asked for and never read: far more than the sockets' buffers hold.
    raw.send(&get).await;
    logs.wait_for("kind=send_stalled").await;
    raw.expect_closed().await;
    server.wait_live_buffers(baseline).await;
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    assert_eq!(client.device_count().await.unwrap(), 1);
    server.shutdown().await;
}

async fn a_large_upload_at_a_steady_pace_is_kept(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let mut config = config();
    // 16 KiB owed per second.
    config.progress_window = Some(Duration::from_secs(1));
    config.min_progress_rate = 16 << 10;
    let server = TestServer::start(shell, config);
    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    let len = 2u32 << 20;
    let head = set_tensor_head(&mut raw, len).await;
    raw.write(&head).await;
    // 2 MiB in 64 KiB pieces every 100 ms (about 40x the minimum), over three windows: the
    // whole message takes longer than a window, and no deadline per message closes it.
    let piece = vec![0x5a; 64 << 10];
    for _ in 0..(len as usize / piece.len()) {
        raw.write(&piece).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The write completed: the connection answers the next command.
    let (handle, _) = raw.alloc(4096).await;
    assert_ne!(handle, 0);
    assert!(
        !logs.text().contains("closed by the server"),
        "{}",
        logs.text()
    );
    server.shutdown().await;
}

async fn an_idle_session_stays_open_past_the_deadlines(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let server = TestServer::start(shell, config());
    let mut client = server.client(ProtocolVersion::V8_0_0).await;
    tokio::time::sleep(HELLO * 2 + WINDOW * 2).await;
    assert_eq!(client.device_count().await.unwrap(), 1);
    assert!(
        !logs.text().contains("closed by the server"),
        "{}",
        logs.text()
    );
    server.shutdown().await;
}

async fn full_slots_make_room_for_a_new_client(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let mut config = config();
    // Deadlines out of the way: here only the places count.
    config.hello_timeout = None;
    config.max_clients = 4;
    let server = TestServer::start(shell, config);
    let mut working = working_client(&server).await;
    let mut idle = server.client(ProtocolVersion::V8_0_0).await;
    let mut silent = [
        Raw::connect(server.addr, Dialect::V8).await,
        Raw::connect(server.addr, Dialect::V8).await,
    ];
    // Every place is taken: the oldest connection awaiting HELLO gives way.
    let mut newcomer = working_client(&server).await;
    silent[0].expect_closed().await;
    logs.wait_for("kind=gave_way").await;
    // Then the other one, then the idle session without buffers.
    let mut second = working_client(&server).await;
    silent[1].expect_closed().await;
    let mut third = working_client(&server).await;
    common::eventually(|| logs.text().matches("kind=gave_way").count() == 3).await;
    assert!(
        idle.device_count().await.is_err(),
        "the idle session gave way"
    );
    // Now every place is held by a client with buffers: the next one is refused.
    let mut refused = Raw::connect(server.addr, Dialect::V8).await;
    refused.expect_closed().await;
    logs.wait_for("too many clients").await;
    for client in [&mut working, &mut newcomer, &mut second, &mut third] {
        assert_eq!(client.device_count().await.unwrap(), 1);
    }
    server.shutdown().await;
}

async fn a_working_client_is_never_evicted(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let mut config = config();
    config.max_clients = 2;
    // Progress out of the way: here only the places count.
    config.progress_window = Some(Duration::from_secs(20));
    let server = TestServer::start(shell, config);
    let mut holding = working_client(&server).await;
    // In the middle of an upload (no buffers held yet but its own, and a message begun).
    let mut uploading = Raw::connect_hello(server.addr, Dialect::V8).await;
    let len = 4u32 << 20;
    let head = set_tensor_head(&mut uploading, len).await;
    uploading.write(&head).await;
    uploading.write(&vec![1; 1 << 20]).await;
    for _ in 0..3 {
        let mut refused = Raw::connect(server.addr, Dialect::V8).await;
        refused.expect_closed().await;
    }
    logs.wait_for("too many clients").await;
    uploading.write(&vec![1; 3 << 20]).await;
    let (handle, _) = uploading.alloc(4096).await;
    assert_ne!(handle, 0);
    assert_eq!(holding.device_count().await.unwrap(), 1);
    assert!(!logs.text().contains("gave_way"), "{}", logs.text());
    server.shutdown().await;
}

async fn one_address_is_held_to_its_limit(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let mut config = config();
    config.max_clients = 8;
    config.max_clients_per_address = 2;
    let server = TestServer::start(shell, config);
    let mut first = working_client(&server).await;
    let mut second = working_client(&server).await;
    let mut third = Raw::connect(server.addr, Dialect::V8).await;
    third.expect_closed().await;
    logs.wait_for("too many clients from this address").await;
    assert_eq!(first.device_count().await.unwrap(), 1);
    assert_eq!(second.device_count().await.unwrap(), 1);
    drop(first);
    common::eventually(|| logs.text().contains("Client connection closed")).await;
    let mut fourth = server.client(ProtocolVersion::V8_0_0).await;
    assert_eq!(fourth.device_count().await.unwrap(), 1);
    server.shutdown().await;
}

for_each_shell!(
    a_connection_without_hello_is_closed_after_the_deadline,
    a_trickling_message_is_closed,
    a_client_that_stops_reading_a_reply_is_closed,
    a_large_upload_at_a_steady_pace_is_kept,
    an_idle_session_stays_open_past_the_deadlines,
    full_slots_make_room_for_a_new_client,
    a_working_client_is_never_evicted,
    one_address_is_held_to_its_limit,
);
