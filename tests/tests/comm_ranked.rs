//! The newest upstream comm link (protocol 8.0.1 with PR #28967, `--comm-link ranked`) on
//! every shell: our servers among themselves at world 2..8 (every rank votes for the CPU
//! communicator, a ring all-reduce over TCP: every rank ends with the same bits), with
//! llama.cpp b12032+1 (seed 003 applied; its CPU server votes no, so world 2 falls back to the
//! pairwise link and larger groups refuse on every rank), the 8.0.1 pairwise link, and the
//! faults: a rank that never joins the all-reduce, duplicate and out-of-range ranks, a world
//! mismatch, a stranger on rank 0's port.

#[path = "../interop/comm.rs"]
mod comm;
#[path = "../interop/harness.rs"]
mod harness;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use comm::{bf16_round, comm_init, floats, from_bytes, rank, t, Rank};
use proto_core::comm::LinkVariant;
use proto_core::wire::{CommInitRequest, ProtocolVersion};

use harness::OurServer;

/// The comm timeout of the servers in these tests: short, so the faults resolve quickly.
const COMM_TIMEOUT: Duration = Duration::from_secs(4);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn our_server(shell: &str, link: LinkVariant) -> OurServer {
    let mut config = shell_tokio::ServerConfig::new(ProtocolVersion::V8_0_1);
    config.comm_link = link;
    config.comm_timeout = COMM_TIMEOUT;
    OurServer::start_with(shell, config)
}

/// `world` of our servers, the shells taken in turn.
fn our_group(world: usize) -> Vec<OurServer> {
    let shells = harness::shells();
    (0..world)
        .map(|i| our_server(shells[i % shells.len()], LinkVariant::Ranked))
        .collect()
}

/// Connects one rank per address with an `n`-element partial each (seeded by rank).
async fn ranks(addrs: &[SocketAddr], n: usize) -> Vec<Rank> {
    let mut out = Vec::new();
    for (r, addr) in addrs.iter().enumerate() {
        out.push(
            rank(
                *addr,
                n,
                &floats(n, 100 + r as u32 + n as u32),
                &format!("rank {r}"),
            )
            .await,
        );
    }
    out
}

/// COMM_INIT to every rank at once (as llama.cpp does: rank 0 waits for the others before it
/// answers); returns the ranks and each one's answer.
async fn init_with(
    group: Vec<Rank>,
    requests: Vec<CommInitRequest>,
    what: &str,
) -> (Vec<Rank>, Vec<bool>) {
    let handles: Vec<_> = group
        .into_iter()
        .zip(requests)
        .enumerate()
        .map(|(i, (mut r, request))| {
            let what = format!("{what}: rank {i}: COMM_INIT");
            tokio::spawn(async move {
                let ok = t(&what, r.client.comm_init(&request)).await;
                (r, ok)
            })
        })
        .collect();
    let (mut out, mut oks) = (Vec::new(), Vec::new());
    for handle in handles {
        let (r, ok) = handle.await.expect("COMM_INIT task");
        out.push(r);
        oks.push(ok);
    }
    (out, oks)
}

/// The COMM_INIT requests of rank `r` of `world` for each (rank, world), rank 0 on `port`.
fn requests(ranks_worlds: &[(u32, u32)], port: u16) -> Vec<CommInitRequest> {
    ranks_worlds
        .iter()
        .map(|&(rank, world)| {
            comm_init(
                rank,
                world,
                u32::from(port),
                if rank == 0 { "" } else { "127.0.0.1" },
            )
        })
        .collect()
}

/// COMM_ALLREDUCE on every rank, then every rank's tensor.
async fn allreduce_all(ranks: &mut [Rank], n: usize) -> Vec<Vec<f32>> {
    for (i, r) in ranks.iter_mut().enumerate() {
        t(
            &format!("rank {i}: COMM_ALLREDUCE"),
            r.client.comm_allreduce(0, &r.tensor),
        )
        .await;
    }
    let mut out = Vec::new();
    for (i, r) in ranks.iter_mut().enumerate() {
        let bytes = t(
            &format!("rank {i}: GET_TENSOR"),
            r.client.get_tensor(&r.tensor, 0, (n * 4) as u64),
        )
        .await;
        out.push(from_bytes(&bytes));
    }
    out
}

/// Every rank holds the same bits, within rounding of the exact sum of the partials.
fn check_ring_sums(what: &str, got: &[Vec<f32>], partials: &[Vec<f32>]) {
    let n = partials[0].len();
    let bf16 = n >= 32_768;
    for (r, values) in got.iter().enumerate() {
        assert_eq!(values.len(), n, "{what}: rank {r} length");
        if let Some(i) = (0..n).find(|&i| values[i].to_bits() != got[0][i].to_bits()) {
            panic!(
                "{what}: rank {r} element {i} is {} but rank 0 has {}",
                values[i], got[0][i]
            );
        }
    }
    let world = partials.len() as f64;
    for i in 0..n {
        let exact: f64 = partials.iter().map(|p| f64::from(p[i])).sum();
        let magnitude: f64 = partials.iter().map(|p| f64::from(p[i]).abs()).sum();
        let tolerance = if bf16 {
            magnitude * world / 128.0
        } else {
            magnitude * 1e-6
        };
        assert!(
            (f64::from(got[0][i]) - exact).abs() <= tolerance,
            "{what}: element {i} is {} but the partials sum to {exact}",
            got[0][i]
        );
    }
}

/// The pairwise link's result at world 2: `own + peer` (F32 wire) or `own + bf16(peer)`.
fn check_pairwise_sums(what: &str, got: &[Vec<f32>], partials: &[Vec<f32>]) {
    let n = partials[0].len();
    let bf16 = n >= 32_768;
    for r in 0..2 {
        let (own, peer) = (&partials[r], &partials[1 - r]);
        for i in 0..n {
            let want = if bf16 {
                own[i] + bf16_round(peer[i])
            } else {
                own[i] + peer[i]
            };
            assert_eq!(
                got[r][i].to_bits(),
                want.to_bits(),
                "{what}: rank {r} element {i}: got {} want {want}",
                got[r][i]
            );
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Expect {
    Ring,
    Pairwise,
}

/// One group over `addrs` (rank i at addrs[i]): COMM_INIT, two all-reduces, COMM_FREE, for a
/// decode-sized and a prefill-sized tensor.
async fn group_allreduce(addrs: &[SocketAddr], expect: Expect, what: &str) {
    let world = addrs.len() as u32;
    for n in [1000usize, 40_000] {
        let group = ranks(addrs, n).await;
        let partials: Vec<Vec<f32>> = (0..addrs.len())
            .map(|r| floats(n, 100 + r as u32 + n as u32))
            .collect();
        let ranks_worlds: Vec<(u32, u32)> = (0..world).map(|r| (r, world)).collect();
        let (mut group, oks) =
            init_with(group, requests(&ranks_worlds, harness::free_port()), what).await;
        assert!(
            oks.iter().all(|&ok| ok),
            "{what}: COMM_INIT answers {oks:?}"
        );
        let first = allreduce_all(&mut group, n).await;
        match expect {
            Expect::Ring => check_ring_sums(&format!("{what}, {n} elements"), &first, &partials),
            Expect::Pairwise => {
                check_pairwise_sums(&format!("{what}, {n} elements"), &first, &partials)
            }
        }
        let second = allreduce_all(&mut group, n).await;
        match expect {
            Expect::Ring => check_ring_sums(
                &format!("{what}, {n} elements, second all-reduce"),
                &second,
                &first,
            ),
            Expect::Pairwise => {
                check_pairwise_sums(&format!("{what}, {n} elements, second"), &second, &first)
            }
        }
        for (i, r) in group.iter_mut().enumerate() {
            t(&format!("rank {i}: COMM_FREE"), r.client.comm_free(0)).await;
            t(
                &format!("rank {i}: FREE_BUFFER"),
                r.client.free_buffer(r.buffer),
            )
            .await;
        }
        eprintln!("{what}: {n} elements ok");
    }
}

#[test]
fn our_servers_all_reduce_at_every_world_size_on_every_shell() {
    let rt = runtime();
    for world in 2..=8usize {
        let servers = our_group(world);
        let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
        rt.block_on(group_allreduce(
            &addrs,
            Expect::Ring,
            &format!("world {world}"),
        ));
        for s in &servers {
            s.wait_no_buffers(Duration::from_secs(10));
        }
    }
}

#[test]
fn ranks_may_join_in_any_order() {
    // Rank i sits on server world-1-i, and rank 0's peers connect in whatever order they come.
    let rt = runtime();
    let servers = our_group(4);
    let addrs: Vec<SocketAddr> = servers.iter().rev().map(|s| s.addr).collect();
    rt.block_on(group_allreduce(&addrs, Expect::Ring, "world 4, reversed"));
}

#[test]
fn the_pairwise_link_of_8_0_1_between_our_servers() {
    let rt = runtime();
    for shell in harness::shells() {
        let a = our_server(shell, LinkVariant::V8_0);
        let b = our_server(shell, LinkVariant::V8_0);
        rt.block_on(group_allreduce(
            &[a.addr, b.addr],
            Expect::Pairwise,
            &format!("pairwise link, {shell}"),
        ));
    }
}

#[test]
fn no_backend_communicator_forces_the_pairwise_path() {
    let rt = runtime();
    let a = our_server("tokio", LinkVariant::Ranked);
    let mut config = shell_tokio::ServerConfig::new(ProtocolVersion::V8_0_1);
    config.comm_timeout = COMM_TIMEOUT;
    config.backend_communicator = false;
    let b = OurServer::start_with("tokio", config);
    rt.block_on(group_allreduce(
        &[a.addr, b.addr],
        Expect::Pairwise,
        "one rank voting no",
    ));
}

/// COMM_INIT on every rank of `addrs` with the given (rank, world) per connection; every answer
/// must be `ok = 0`, within the comm timeout and some slack, and the connections stay usable.
fn all_refuse(addrs: &[SocketAddr], ranks_worlds: &[(u32, u32)], what: &str) {
    let rt = runtime();
    rt.block_on(async {
        let group = ranks(addrs, 16).await;
        let started = Instant::now();
        let (mut group, oks) =
            init_with(group, requests(ranks_worlds, harness::free_port()), what).await;
        assert!(
            oks.iter().all(|ok| !ok),
            "{what}: COMM_INIT answers {oks:?}, want all refused"
        );
        let took = started.elapsed();
        assert!(
            took < COMM_TIMEOUT * 2 + Duration::from_secs(10),
            "{what}: refusal took {took:?}"
        );
        for (i, r) in group.iter_mut().enumerate() {
            t(
                &format!("{what}: rank {i}: DEVICE_COUNT after the refusal"),
                r.client.device_count(),
            )
            .await;
        }
        eprintln!("{what}: refused in {took:?}");
    });
}

#[test]
fn wrong_ranks_and_worlds_are_refused_without_hanging() {
    let servers = our_group(3);
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    all_refuse(&addrs, &[(0, 3), (1, 3), (1, 3)], "duplicate rank 1");
    all_refuse(&addrs, &[(0, 3), (1, 3), (2, 4)], "world mismatch (3 vs 4)");
    all_refuse(&addrs[..2], &[(0, 3), (1, 3)], "a rank that never comes");
    all_refuse(
        &addrs[..2],
        &[(0, 2), (1, 2)].map(|(r, w)| if r == 1 { (1, 3) } else { (r, w) }),
        "rank 1 of 3 joining a world of 2",
    );
    // After all that, a good group still forms on the same servers.
    let rt = runtime();
    rt.block_on(group_allreduce(
        &addrs,
        Expect::Ring,
        "world 3 after the refusals",
    ));
}

#[test]
fn a_stranger_on_rank_zeros_port_fails_the_set_up_cleanly() {
    let servers = our_group(2);
    let rt = runtime();
    rt.block_on(async {
        let mut group = ranks(&[servers[0].addr], 16).await;
        let port = harness::free_port();
        let request = comm_init(0, 2, u32::from(port), "");
        let r0 = &mut group[0];
        let init = r0.client.comm_init(&request);
        let stranger = tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            loop {
                if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                    // 24 bytes of caps, then a rank that is out of range
                    let _ = s.write_all(&[0u8; 24]);
                    let _ = s.write_all(&7u32.to_le_bytes());
                    std::thread::sleep(Duration::from_millis(500));
                    return;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "rank 0 never listened"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let ok = t("rank 0: COMM_INIT with a stranger", init).await;
        stranger.await.unwrap();
        assert!(!ok, "a hostile peer must fail the set-up");
        t("rank 0: DEVICE_COUNT after", r0.client.device_count()).await;
    });
}

#[test]
fn a_rank_missing_from_the_all_reduce_fails_the_others_and_a_fresh_group_works() {
    let servers = our_group(3);
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let rt = runtime();
    rt.block_on(async {
        let n = 100_000;
        let group = ranks(&addrs, n).await;
        let (mut group, oks) = init_with(
            group,
            requests(&[(0, 3), (1, 3), (2, 3)], harness::free_port()),
            "world 3",
        )
        .await;
        assert!(oks.iter().all(|&ok| ok), "COMM_INIT answers {oks:?}");
        // Ranks 0 and 1 all-reduce; rank 2 stalls (its client never sends COMM_ALLREDUCE).
        let started = Instant::now();
        for r in group.iter_mut().take(2) {
            t("COMM_ALLREDUCE", r.client.comm_allreduce(0, &r.tensor)).await;
        }
        for (i, r) in group.iter_mut().enumerate().take(2) {
            let result = tokio::time::timeout(comm::STEP, r.client.device_count())
                .await
                .expect("no answer");
            assert!(
                result.is_err(),
                "rank {i}: the all-reduce without rank 2 must close the connection"
            );
        }
        let took = started.elapsed();
        assert!(
            took < COMM_TIMEOUT * 3 + Duration::from_secs(10),
            "the failure took {took:?}"
        );
        eprintln!("ranks 0 and 1 failed after {took:?}");
    });
    for s in &servers[..2] {
        s.wait_no_buffers(Duration::from_secs(10));
    }
    rt.block_on(group_allreduce(
        &addrs,
        Expect::Ring,
        "a fresh world 3 after the failure",
    ));
}

/// llama.cpp b12032+1 with the newest link (seed 003): its CPU server votes against a backend
/// communicator, so world 2 takes the pairwise path with ours in both rank orders, and any
/// larger group with it refuses on every rank.
#[test]
fn the_ranked_link_with_llama_b12032() {
    let peer = harness::b12032();
    let logs = tempfile::tempdir().expect("tempdir");
    let (mut theirs_a, addr_a) = harness::start_b12032_server(&peer, logs.path(), None);
    let (mut theirs_b, addr_b) = harness::start_b12032_server(&peer, logs.path(), None);
    let ours: Vec<OurServer> = our_group(2);
    let rt = runtime();
    let log = |a: &harness::Proc, b: &harness::Proc| {
        format!("\nllama.cpp A:\n{}\nllama.cpp B:\n{}", a.log(), b.log())
    };
    for (pair, what) in [
        (
            [addr_a, addr_b],
            "llama.cpp rank 0 + llama.cpp rank 1 (control)",
        ),
        ([addr_a, ours[0].addr], "llama.cpp rank 0 + our rank 1"),
        ([ours[0].addr, addr_b], "our rank 0 + llama.cpp rank 1"),
    ] {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(group_allreduce(&pair, Expect::Pairwise, what))
        }));
        if result.is_err() {
            panic!("{what} failed{}", log(&theirs_a, &theirs_b));
        }
        theirs_a.assert_alive(what);
        theirs_b.assert_alive(what);
    }
    all_refuse(
        &[ours[0].addr, ours[1].addr, addr_a],
        &[(0, 3), (1, 3), (2, 3)],
        "world 3: ours, ours, llama.cpp",
    );
    all_refuse(
        &[addr_a, ours[0].addr, ours[1].addr],
        &[(0, 3), (1, 3), (2, 3)],
        "world 3: llama.cpp, ours, ours",
    );
    theirs_a.assert_alive("after the mixed groups");
    for s in &ours {
        s.wait_no_buffers(Duration::from_secs(10));
    }
}

fn server_with_peers(link: LinkVariant, peers: &str) -> OurServer {
    let mut config = shell_tokio::ServerConfig::new(ProtocolVersion::V8_0_1);
    config.comm_link = link;
    config.comm_timeout = COMM_TIMEOUT;
    config.comm_peers =
        shell_common::CommPeers::only(vec![
            shell_common::CommPeers::parse_entry(peers).expect("network")
        ]);
    OurServer::start_with("tokio", config)
}

/// `--comm-peers`: a rank refuses to connect to rank 0 outside the list, rank 0 refuses a peer
/// from outside it; with loopback in the list the same groups form.
#[test]
fn comm_peers_refuse_connecting_and_accepting_outside_the_list() {
    for link in [LinkVariant::Ranked, LinkVariant::V8_0] {
        let open = our_server("tokio", link);
        let closed = server_with_peers(link, "10.99.0.0/16");
        all_refuse(
            &[open.addr, closed.addr],
            &[(0, 2), (1, 2)],
            &format!("{link:?}: rank 1 may not connect to 127.0.0.1"),
        );
        all_refuse(
            &[closed.addr, open.addr],
            &[(0, 2), (1, 2)],
            &format!("{link:?}: rank 0 may not accept from 127.0.0.1"),
        );
        let allowed = server_with_peers(link, "127.0.0.0/8");
        let expect = if link == LinkVariant::Ranked {
            Expect::Ring
        } else {
            Expect::Pairwise
        };
        runtime().block_on(group_allreduce(
            &[allowed.addr, open.addr],
            expect,
            &format!("{link:?}: loopback allowed"),
        ));
    }
}

/// A peer that completes the handshake as rank 1, votes for the communicator, then sends a
/// ring block pointing nowhere (127.0.0.1:1) and garbage: rank 0 answers COMM_INIT with 0
/// within the timeout and keeps serving.
#[test]
fn hostile_bytes_in_the_exchange_fail_the_set_up_cleanly() {
    let servers = our_group(1);
    let rt = runtime();
    rt.block_on(async {
        let mut group = ranks(&[servers[0].addr], 16).await;
        let port = harness::free_port();
        let request = comm_init(0, 2, u32::from(port), "");
        let init = group[0].client.comm_init(&request);
        let peer = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let start = Instant::now();
            let mut s = loop {
                if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                    break s;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "rank 0 never listened"
                );
                std::thread::sleep(Duration::from_millis(20));
            };
            let mut caps = [0u8; 24];
            s.write_all(&[0u8; 24]).unwrap(); // caps
            s.read_exact(&mut caps).unwrap();
            s.write_all(&1u32.to_le_bytes()).unwrap(); // rank 1
            s.write_all(&[1]).unwrap(); // votes yes
            let mut votes = [0u8; 2];
            s.read_exact(&mut votes).unwrap();
            assert_eq!(votes, [1, 1], "both voted for the communicator");
            // the ring block: 127.0.0.1, port 1, a token; then bytes nobody asked for
            let mut block = vec![127, 0, 0, 1, 1, 0];
            block.extend_from_slice(&[0xee; 8]);
            block.extend_from_slice(&[0xff; 64]);
            let _ = s.write_all(&block);
            std::thread::sleep(COMM_TIMEOUT + Duration::from_secs(1));
        });
        let started = Instant::now();
        let ok = t("rank 0: COMM_INIT with a hostile peer", init).await;
        assert!(!ok, "a hostile peer must fail the set-up");
        assert!(
            started.elapsed() < COMM_TIMEOUT * 3,
            "took {:?}",
            started.elapsed()
        );
        t("rank 0: DEVICE_COUNT after", group[0].client.device_count()).await;
        peer.await.unwrap();
    });
}
