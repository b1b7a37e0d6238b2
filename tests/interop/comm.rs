//! What the comm-link tests share: bounded steps, test data, and one rank's connection with an
//! F32 tensor to all-reduce.
#![allow(dead_code)] // each test crate uses part of it

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use ggml_rpc_client::Client;
use proto_core::ggml::flags;
use proto_core::wire::{CommInitRequest, ProtocolVersion, RpcTensor, COMM_HOST_SIZE};

pub const STEP: Duration = Duration::from_secs(60);

pub async fn t<T, E: std::fmt::Display>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> T {
    match tokio::time::timeout(STEP, fut).await {
        Err(_) => panic!("{what}: no answer within {STEP:?}"),
        Ok(Err(e)) => panic!("{what}: {e}"),
        Ok(Ok(v)) => v,
    }
}

pub fn floats(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// f32 → bf16 (round to nearest even, as ggml's CPU conversion) → f32.
pub fn bf16_round(v: f32) -> f32 {
    let bits = v.to_bits();
    if v.is_nan() {
        return f32::from_bits((bits | 0x0040_0000) & 0xffff_0000);
    }
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    f32::from_bits(rounded & 0xffff_0000)
}

pub fn to_bytes(v: &[f32]) -> Bytes {
    Bytes::from(v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>())
}

pub fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn comm_init(rank: u32, world: u32, port: u32, host: &str) -> CommInitRequest {
    let mut h = [0u8; COMM_HOST_SIZE];
    h[..host.len()].copy_from_slice(host.as_bytes());
    CommInitRequest {
        device: 0,
        rank,
        world,
        port,
        host: h,
    }
}

/// One rank: a connection, a buffer and an F32 tensor of `n` elements holding `partial`.
pub struct Rank {
    pub client: Client,
    pub tensor: RpcTensor,
    pub buffer: u64,
}

pub async fn rank(addr: SocketAddr, n: usize, partial: &[f32], name: &str) -> Rank {
    let client = t(
        &format!("{name}: HELLO"),
        Client::connect(addr, ProtocolVersion::V8_0_0),
    )
    .await;
    rank_on(client, n, partial, name).await
}

/// [`rank`] on a connected client.
pub async fn rank_on(mut client: Client, n: usize, partial: &[f32], name: &str) -> Rank {
    let buf = t(
        &format!("{name}: ALLOC_BUFFER"),
        client.alloc_buffer(0, (n * 4) as u64),
    )
    .await
    .expect("allocation");
    let base = t(
        &format!("{name}: BUFFER_GET_BASE"),
        client.buffer_base(buf.handle),
    )
    .await;
    let mut tensor = RpcTensor::contiguous(0x7000 + n as u64, 0, [n as u32, 1, 1, 1]).unwrap();
    tensor.buffer = buf.handle;
    tensor.data = base;
    tensor.flags = flags::COMPUTE;
    tensor.set_name("partial");
    t(
        &format!("{name}: SET_TENSOR"),
        client.set_tensor(&tensor, 0, to_bytes(partial)),
    )
    .await;
    Rank {
        client,
        tensor,
        buffer: buf.handle,
    }
}
