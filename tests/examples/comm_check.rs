//! One all-reduce group of our servers, for `scripts/conformance/rdma_comm.sh` (the comm link
//! over RDMA on the verbs fabric, compared with TCP): connects to every server over TCP, gives
//! rank r the partial `floats(n, r + 1)` for each size, COMM_INIT on every rank at once (rank 0
//! the first server, comm port = its port + 1000), COMM_ALLREDUCE on every rank, and prints
//! each rank's result as FNV-1a-64 of its bytes, one line per size and rank, so two runs can
//! be compared byte for byte. Every step is bounded (60 s).
//!
//! usage: comm_check HOST:PORT HOST:PORT... [--elements N,N...]
#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "../interop/comm.rs"]
mod comm;

use std::net::SocketAddr;
use std::process::ExitCode;

use ggml_rpc_client::Client;
use proto_core::wire::ProtocolVersion;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let mut servers: Vec<SocketAddr> = Vec::new();
    let mut sizes = vec![1000usize, 65_536];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--elements" {
            let list = args.next().unwrap_or_default();
            sizes = list.split(',').filter_map(|s| s.parse().ok()).collect();
        } else {
            match arg.parse() {
                Ok(addr) => servers.push(addr),
                Err(_) => {
                    eprintln!("usage: comm_check HOST:PORT HOST:PORT... [--elements N,N...]");
                    return ExitCode::from(2);
                }
            }
        }
    }
    if servers.len() < 2 || sizes.is_empty() {
        eprintln!("comm_check: at least two servers and one size");
        return ExitCode::from(2);
    }
    let world = servers.len() as u32;
    let port = u32::from(servers[0].port()) + 1000;
    let host = servers[0].ip().to_string();
    let mut clients = Vec::new();
    for addr in &servers {
        clients.push(
            comm::t(
                &format!("{addr}: HELLO"),
                Client::connect(*addr, ProtocolVersion::V8_0_1),
            )
            .await,
        );
    }
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(r, mut client)| {
            let request = comm::comm_init(r as u32, world, port, if r == 0 { "" } else { &host });
            tokio::spawn(async move {
                let ok = comm::t(&format!("rank {r}: COMM_INIT"), client.comm_init(&request)).await;
                (client, ok)
            })
        })
        .collect();
    let mut clients = Vec::new();
    for (r, task) in tasks.into_iter().enumerate() {
        let Ok((client, ok)) = task.await else {
            eprintln!("rank {r}: COMM_INIT task failed");
            return ExitCode::FAILURE;
        };
        if !ok {
            eprintln!("rank {r}: COMM_INIT answered ok = 0");
            return ExitCode::FAILURE;
        }
        clients.push(client);
    }
    for &n in &sizes {
        let mut group = Vec::new();
        for (r, client) in clients.drain(..).enumerate() {
            let partial = comm::floats(n, r as u32 + 1);
            group.push(comm::rank_on(client, n, &partial, &format!("rank {r}")).await);
        }
        for (r, rank) in group.iter_mut().enumerate() {
            comm::t(
                &format!("rank {r}: COMM_ALLREDUCE"),
                rank.client.comm_allreduce(0, &rank.tensor),
            )
            .await;
        }
        for (r, mut rank) in group.into_iter().enumerate() {
            let bytes = comm::t(
                &format!("rank {r}: GET_TENSOR"),
                rank.client.get_tensor(&rank.tensor, 0, (n * 4) as u64),
            )
            .await;
            println!("elements {n} rank {r}: {:016x}", fnv(&bytes));
            comm::t(
                &format!("rank {r}: FREE_BUFFER"),
                rank.client.free_buffer(rank.buffer),
            )
            .await;
            clients.push(rank.client);
        }
    }
    ExitCode::SUCCESS
}
