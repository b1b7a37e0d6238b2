//! Hostile input on a raw socket closes that connection only, with a logged reason, while a
//! well-behaved client keeps working, and the offender's buffers are freed.

mod common;

use common::{bytes_tensor, capture_logs, pattern, Raw, TestServer};
use proto_core::ggml::types::id;
use proto_core::wire::{Dialect, ProtocolVersion, Request, RpcTensor, SetTensorHeader};
use shell_tokio::{Client, ServerConfig};
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
async fn attack<F, Fut>(kind: &str, attack: F)
where
    F: FnOnce(Raw, u64, u64) -> Fut,
    Fut: std::future::Future<Output = Raw>,
{
    let (logs, _guard) = capture_logs();
    let server = TestServer::v8().await;
    let mut bystander = Bystander::new(&server).await;
    let baseline = server.backend.live_buffers();

    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    let (handle, base) = raw.alloc(1024).await;
    assert_eq!(server.backend.live_buffers(), baseline + 1);
    let mut raw = attack(raw, handle, base).await;
    raw.expect_closed().await;
    logs.wait_for(&format!("kind={kind}")).await;
    server.wait_live_buffers(baseline).await;
    bystander.still_works().await;
    server.shutdown().await;
}

#[tokio::test]
async fn tensor_outside_its_buffer() {
    attack("out_of_bounds", |mut raw, handle, base| async move {
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

#[tokio::test]
async fn set_tensor_past_the_buffer_end() {
    attack("out_of_bounds", |mut raw, handle, base| async move {
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

#[tokio::test]
async fn ne0_not_a_multiple_of_the_block_size() {
    attack("block_misaligned", |mut raw, handle, base| async move {
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
    })
    .await;
}

#[tokio::test]
async fn a_set_tensor_length_field_of_2_pow_62() {
    attack("out_of_bounds", |mut raw, handle, base| async move {
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

#[tokio::test]
async fn a_graph_length_field_of_2_pow_62() {
    attack("message_too_large", |mut raw, _, _| async move {
        let mut frame = vec![10u8];
        frame.extend_from_slice(&(1u64 << 62).to_le_bytes());
        frame.extend_from_slice(&[0; 64]);
        raw.write(&frame).await;
        raw
    })
    .await;
}

#[tokio::test]
async fn a_fixed_size_command_with_a_wrong_length() {
    attack("request_size_mismatch", |mut raw, _, _| async move {
        let mut frame = vec![1u8];
        frame.extend_from_slice(&(1u64 << 62).to_le_bytes());
        raw.write(&frame).await;
        raw
    })
    .await;
}

#[tokio::test]
async fn an_unknown_command() {
    attack("unknown_command", |mut raw, _, _| async move {
        let mut frame = vec![23u8];
        frame.extend_from_slice(&0u64.to_le_bytes());
        raw.write(&frame).await;
        raw
    })
    .await;
}

#[tokio::test]
async fn a_second_hello() {
    attack("duplicate_hello", |mut raw, _, _| async move {
        raw.send(&Request::Hello { caps: [0; 24] }).await;
        raw
    })
    .await;
}

#[tokio::test]
async fn a_truncated_frame() {
    attack("unexpected_eof", |mut raw, handle, _| async move {
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

#[tokio::test]
async fn disconnecting_in_the_middle_of_a_large_set_tensor() {
    let (logs, _guard) = capture_logs();
    let server = TestServer::v8().await;
    let mut bystander = Bystander::new(&server).await;
    let baseline = server.backend.live_buffers();

    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    let len = 32u32 << 20;
    let (handle, base) = raw.alloc(u64::from(len)).await;
    let tensor = bytes_tensor(9, handle, base, len);
    let header = SetTensorHeader {
        tensor,
        cache_flag: 0,
        offset: 0,
    };
    let frame = Request::SetTensor {
        header: Box::new(header),
        data: pattern(len as usize, 5),
    }
    .to_frame(Dialect::V8)
    .unwrap();
    // Header and 20 MiB of the 32 MiB, then the client goes away.
    raw.write(&frame[..20 << 20]).await;
    drop(raw);
    logs.wait_for("kind=unexpected_eof").await;
    server.wait_live_buffers(baseline).await;
    bystander.still_works().await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_command_before_hello() {
    let (logs, _guard) = capture_logs();
    let server = TestServer::v8().await;
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

#[tokio::test]
async fn a_client_exceeding_its_memory_quota() {
    let (logs, _guard) = capture_logs();
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.memory_quota = Some(64 << 10);
    let server = TestServer::start(config).await;
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

#[tokio::test]
async fn responses_owed_before_a_bad_command_are_still_sent() {
    let server = TestServer::v8().await;
    let mut raw = Raw::connect_hello(server.addr, Dialect::V8).await;
    let mut frames = Request::DeviceCount.to_frame(Dialect::V8).unwrap().to_vec();
    frames.extend_from_slice(&[200, 0, 0, 0, 0, 0, 0, 0, 0]);
    raw.write(&frames).await;
    let answer = raw.read(12).await;
    assert_eq!(&answer[8..], &1u32.to_le_bytes());
    raw.expect_closed().await;
    server.shutdown().await;
}
