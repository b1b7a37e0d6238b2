//! Drives one server over RDMA with our client (scripts/conformance/rdma_ours.sh runs it against
//! llama.cpp's ggml-rpc-server on the verbs fabric): `--transport rdma` HELLO (fails unless the
//! connection switches), memory commands, a 256 MiB SET_TENSOR / GET_TENSOR compared byte for
//! byte, and an ADD graph whose result is read back and checked.
//!
//! usage: rdma_check HOST:PORT [BYTES]

use ggml_rpc_client::proto_core::ggml::{flags, ops::Op, types::id};
use ggml_rpc_client::proto_core::wire::GraphComputeRequest;
use ggml_rpc_client::{Bytes, Client, ProtocolVersion, RpcTensor, TransportMode};

fn tensor(id_: u64, buffer: u64, data: u64, ne: [u32; 4]) -> RpcTensor {
    let mut t = RpcTensor::contiguous(id_, id::F32, ne).expect("a valid shape");
    t.buffer = buffer;
    t.data = data;
    t
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().ok_or("usage: rdma_check HOST:PORT [BYTES]")?;
    let size: u64 = args.next().map_or(Ok(256 << 20), |s| s.parse())?;
    let mut client =
        Client::connect_with(&endpoint, ProtocolVersion::V8_0_1, TransportMode::Rdma).await?;
    if !client.is_rdma() {
        return Err("the connection did not switch to RDMA".into());
    }
    let devices = client.device_count().await?;
    let memory = client.device_memory(0).await?;
    println!(
        "server {}, {devices} device(s), {} MiB free",
        client.server_version(),
        memory.free >> 20
    );

    let buffer = client
        .alloc_buffer(0, size + 4096)
        .await?
        .ok_or("ALLOC_BUFFER failed")?;
    let base = client.buffer_base(buffer.handle).await?;
    let big = tensor(1, buffer.handle, base, [(size / 4) as u32, 1, 1, 1]);
    let data: Vec<u8> = (0..size).map(|i| (i * 31 + i / 4093) as u8).collect();
    client
        .set_tensor(&big, 0, Bytes::from(data.clone()))
        .await?;
    let back = client.get_tensor(&big, 0, size).await?;
    if back != data {
        return Err("GET_TENSOR returned other bytes than SET_TENSOR wrote".into());
    }
    println!("SET/GET {} MiB byte-exact", size >> 20);

    // c = a + b on 64 floats, in the last 4 KiB of the buffer.
    let at = base + size;
    let a = tensor(10, buffer.handle, at, [64, 1, 1, 1]);
    let b = tensor(11, buffer.handle, at + 256, [64, 1, 1, 1]);
    let mut c = tensor(12, buffer.handle, at + 512, [64, 1, 1, 1]);
    c.op = Op::ADD.0;
    c.src[0] = a.id;
    c.src[1] = b.id;
    c.flags = flags::COMPUTE;
    let floats = |f: &dyn Fn(usize) -> f32| -> Bytes {
        Bytes::from(
            (0..64)
                .flat_map(|i| f(i).to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    };
    client.set_tensor(&a, 0, floats(&|i| i as f32)).await?;
    client
        .set_tensor(&b, 0, floats(&|i| 0.5 * i as f32))
        .await?;
    let graph = GraphComputeRequest {
        device: 0,
        uid: 7,
        node_ids: vec![c.id],
        tensors: vec![a, b, c.clone()],
    };
    client.graph_compute(&graph).await?;
    let sums = client.get_tensor(&c, 0, 256).await?;
    if sums != floats(&|i| 1.5 * i as f32) {
        return Err("the ADD graph computed other values".into());
    }
    println!("graph ADD computed over RDMA");
    client.free_buffer(buffer.handle).await?;
    client.close().await?;
    Ok(())
}
