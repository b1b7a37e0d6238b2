//! Interop: the protocol-8 server-to-server link (COMM_INIT / COMM_ALLREDUCE / COMM_FREE)
//! between OUR server and llama.cpp b11739's server.
//!
//! Our client drives two servers as the reference client does for tensor parallelism: COMM_INIT
//! to both ranks at once (rank 0 blocks in `accept` until rank 1 connects), then one
//! COMM_ALLREDUCE per rank, after which each rank's tensor must hold the sum of both partials:
//! exact below 32768 elements (F32 on the link), and `own + bf16(peer)` from 32768 elements on
//! (BF16 on the link, round to nearest even). Pairs: llama.cpp + llama.cpp (control),
//! llama.cpp rank 0 + ours rank 1, ours rank 0 + llama.cpp rank 1.
//!
//! Also checks the soft failures of COMM_INIT (`ok = 0`, connection kept) against both servers.

#[path = "../interop/comm.rs"]
mod comm;
#[path = "../interop/harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::time::Duration;

use ggml_rpc_client::Client;
use proto_core::wire::{CommInitRequest, ProtocolVersion};

use comm::{bf16_round, comm_init, floats, from_bytes, rank, t};
use harness::OurServer;

/// All-reduces between `a` (rank 0) and `b` (rank 1) for every size and checks the sums.
fn allreduce_pair(a: SocketAddr, b: SocketAddr, what: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for n in [1000usize, 40_000] {
            let (pa, pb) = (floats(n, 1 + n as u32), floats(n, 2 + n as u32));
            let mut r0 = rank(a, n, &pa, "rank 0").await;
            let mut r1 = rank(b, n, &pb, "rank 1").await;
            let port = u32::from(harness::free_port());
            let (init0, init1) = (comm_init(0, 2, port, ""), comm_init(1, 2, port, "127.0.0.1"));
            let (ok0, ok1) = tokio::join!(
                t("rank 0: COMM_INIT", r0.client.comm_init(&init0)),
                t("rank 1: COMM_INIT", r1.client.comm_init(&init1)),
            );
            if !(ok0 && ok1) {
                return Err(format!("{what}: COMM_INIT answered rank 0 {ok0}, rank 1 {ok1}"));
            }
            // the reference handles COMM_ALLREDUCE inside its command loop: send to both, then read
            t("rank 0: COMM_ALLREDUCE", r0.client.comm_allreduce(0, &r0.tensor)).await;
            t("rank 1: COMM_ALLREDUCE", r1.client.comm_allreduce(0, &r1.tensor)).await;
            let (g0, g1) = tokio::join!(
                t("rank 0: GET_TENSOR", r0.client.get_tensor(&r0.tensor, 0, (n * 4) as u64)),
                t("rank 1: GET_TENSOR", r1.client.get_tensor(&r1.tensor, 0, (n * 4) as u64)),
            );
            let bf16 = n >= 32_768;
            for (r, (got, own, peer)) in [(from_bytes(&g0), &pa, &pb), (from_bytes(&g1), &pb, &pa)].into_iter().enumerate() {
                for i in 0..n {
                    let want = if bf16 { own[i] + bf16_round(peer[i]) } else { own[i] + peer[i] };
                    if got[i].to_bits() != want.to_bits() {
                        return Err(format!(
                            "{what}: {n} elements ({} on the link): rank {r} element {i}: got {} want {} (own {} peer {})",
                            if bf16 { "BF16" } else { "F32" },
                            got[i], want, own[i], peer[i]
                        ));
                    }
                }
            }
            // the link stays up: a second all-reduce of the new values
            t("rank 0: COMM_ALLREDUCE 2", r0.client.comm_allreduce(0, &r0.tensor)).await;
            t("rank 1: COMM_ALLREDUCE 2", r1.client.comm_allreduce(0, &r1.tensor)).await;
            let (h0, h1) = tokio::join!(
                t("rank 0: GET_TENSOR 2", r0.client.get_tensor(&r0.tensor, 0, (n * 4) as u64)),
                t("rank 1: GET_TENSOR 2", r1.client.get_tensor(&r1.tensor, 0, (n * 4) as u64)),
            );
            let (s0, s1) = (from_bytes(&g0), from_bytes(&g1));
            for (r, (got, own, peer)) in [(from_bytes(&h0), &s0, &s1), (from_bytes(&h1), &s1, &s0)].into_iter().enumerate() {
                for i in 0..n {
                    let want = if bf16 { own[i] + bf16_round(peer[i]) } else { own[i] + peer[i] };
                    if got[i].to_bits() != want.to_bits() {
                        return Err(format!("{what}: second all-reduce of {n}: rank {r} element {i}: got {} want {want}", got[i]));
                    }
                }
            }
            for (r, name) in [(&mut r0, "rank 0"), (&mut r1, "rank 1")] {
                t(&format!("{name}: COMM_FREE"), r.client.comm_free(0)).await;
                t(&format!("{name}: FREE_BUFFER"), r.client.free_buffer(r.buffer)).await;
                t(&format!("{name}: DEVICE_COUNT after COMM_FREE"), r.client.device_count()).await;
            }
            eprintln!("{what}: all-reduce of {n} elements ok");
        }
        Ok(())
    })
}

/// COMM_INIT's soft failures answer 0 and keep the connection.
fn soft_failures(addr: SocketAddr) -> Vec<(String, bool)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = t("HELLO", Client::connect(addr, ProtocolVersion::V8_0_0)).await;
        let mut out = Vec::new();
        for (what, req) in [
            ("world 1", comm_init(0, 1, 1, "")),
            ("rank 2 of world 2", comm_init(2, 2, 1, "127.0.0.1")),
            (
                "device 7",
                CommInitRequest {
                    device: 7,
                    ..comm_init(0, 2, 1, "")
                },
            ),
        ] {
            out.push((what.to_string(), t(what, c.comm_init(&req)).await));
        }
        t("COMM_FREE without a communicator", c.comm_free(0)).await;
        t("DEVICE_COUNT after the soft failures", c.device_count()).await;
        out
    })
}

#[test]
fn comm_link_between_our_server_and_llama_b11739() {
    let peer = harness::b11739();
    let logs = tempfile::tempdir().expect("tempdir");
    let (mut theirs_a, addr_a) = harness::start_b11739_server(&peer, logs.path(), None);
    let (mut theirs_b, addr_b) = harness::start_b11739_server(&peer, logs.path(), None);
    let ours = OurServer::start(ProtocolVersion::V8_0_0, None);

    let theirs_soft = soft_failures(addr_a);
    let ours_soft = soft_failures(ours.addr);
    assert!(
        theirs_soft.iter().all(|(_, ok)| !ok),
        "llama.cpp: {theirs_soft:?}"
    );
    assert_eq!(
        theirs_soft, ours_soft,
        "COMM_INIT soft failures (left: llama.cpp, right: ours)"
    );

    let mut failures = Vec::new();
    let logs_of = |a: &harness::Proc, b: &harness::Proc| {
        format!(
            "\nllama.cpp A log:\n{}\nllama.cpp B log:\n{}",
            a.log(),
            b.log()
        )
    };
    if let Err(e) = allreduce_pair(
        addr_a,
        addr_b,
        "llama.cpp rank 0 + llama.cpp rank 1 (control)",
    ) {
        panic!(
            "the control pair fails: {e}{}",
            logs_of(&theirs_a, &theirs_b)
        );
    }
    theirs_a.assert_alive("after the control pair");
    theirs_b.assert_alive("after the control pair");
    if let Err(e) = allreduce_pair(addr_a, ours.addr, "llama.cpp rank 0 + our rank 1") {
        failures.push(e);
    }
    if let Err(e) = allreduce_pair(ours.addr, addr_b, "our rank 0 + llama.cpp rank 1") {
        failures.push(e);
    }
    assert!(
        failures.is_empty(),
        "{}{}",
        failures.join("\n"),
        logs_of(&theirs_a, &theirs_b)
    );
    theirs_a.assert_alive("after the mixed pairs");
    theirs_b.assert_alive("after the mixed pairs");
    ours.wait_no_buffers(Duration::from_secs(10));
}
