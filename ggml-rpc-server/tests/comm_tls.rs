//! The comm link between TLS servers (`--tls-*` on the tokio shell): every connection between
//! the servers (the 8.0.0 pairwise link, the ranked set-up's sockets, the pairwise all-reduce,
//! the CPU ring) is TLS 1.3 with the servers' own certificates, both ends verifying the other.
//!
//! * Two and three TLS servers form the pairwise link, the ranked link with the CPU ring, and
//!   the ranked link's pairwise path; COMM_ALLREDUCE gives the same bits as the same groups of
//!   plain servers.
//! * A peer whose certificate is of another CA is refused, in either role: COMM_INIT answers
//!   `ok = 0` within the comm timeout on the refusing server, and every client connection stays
//!   usable.
//! * A plain server joining a TLS server's link is refused by the TLS server.
//! * What a TLS server sends on the comm link is a TLS record, not the link's bytes.
//!
//! Clients reach a TLS server through a TLS forwarder on the test's runtime (the client library
//! speaks plain TCP).
#![cfg(feature = "tokio")]

#[path = "../../tests/interop/comm.rs"]
mod comm;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_cpu::{CpuBackend, CpuConfig};
use comm::{comm_init, floats, from_bytes, rank, t, Rank};
use ggml_rpc_server::{RunningServer, ServerConfig};
use proto_core::comm::LinkVariant;
use proto_core::wire::ProtocolVersion;
use shell_common::tls::test_certs::Ca;
use shell_common::tls::{client_config, server_name, ServerTls, TlsFiles};
use tokio::runtime::Runtime;
use tokio_rustls::TlsConnector;

/// The comm timeout of the servers: short, so that refusals resolve quickly.
const COMM_TIMEOUT: Duration = Duration::from_secs(4);

/// The tensor sizes: one on the F32 wire, one on the bf16 wire.
const SIZES: [usize; 2] = [1000, 40_000];

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A server's TLS files and those of a client (a forwarder) that reaches it.
struct Identity {
    server: TlsFiles,
    client: TlsFiles,
}

/// A server certificate of `ca` for 127.0.0.1, trusting `ca`, and a client of `ca`.
fn identity(dir: &Path, ca: &Ca, stem: &str) -> Identity {
    Identity {
        server: ca.leaf(dir, &format!("{stem}-server"), &["localhost", "127.0.0.1"]),
        client: ca.leaf(dir, &format!("{stem}-client"), &["client"]),
    }
}

/// One of our servers (a CPU backend on the tokio shell) and where a client reaches it.
struct Node {
    /// The server itself, or a TLS forwarder to it.
    addr: SocketAddr,
    server: Option<RunningServer>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            if let Err(error) = server.shutdown() {
                eprintln!("server failed: {error:#}");
            }
        }
    }
}

/// Starts a server with the `link` comm link, TLS with `tls`, voting for the CPU
/// communicator unless `vote` is false.
fn node(rt: &Runtime, link: LinkVariant, tls: Option<&Identity>, vote: bool) -> Node {
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_1);
    config.comm_link = link;
    config.comm_timeout = COMM_TIMEOUT;
    config.backend_communicator = vote;
    config.tls = tls.map(|id| ServerTls::load(&id.server).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = Arc::new(CpuBackend::new(CpuConfig {
        threads: 1,
        ..CpuConfig::default()
    }));
    let server = ggml_rpc_server::start("tokio", listener, backend, config).unwrap();
    let addr = match tls {
        None => server.local_addr(),
        Some(id) => forward(rt, server.local_addr(), &id.client),
    };
    Node {
        addr,
        server: Some(server),
    }
}

/// A plain listener whose connections are carried to the TLS server at `to` with `client`'s
/// certificate.
fn forward(rt: &Runtime, to: SocketAddr, client: &TlsFiles) -> SocketAddr {
    let connector = TlsConnector::from(client_config(client).unwrap());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        while let Ok((mut plain, _)) = listener.accept().await {
            let connector = connector.clone();
            tokio::spawn(async move {
                let Ok(tcp) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                let _ = (plain.set_nodelay(true), tcp.set_nodelay(true));
                let name = server_name("127.0.0.1").unwrap();
                let Ok(mut tls) = connector.connect(name, tcp).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut plain, &mut tls).await;
            });
        }
    });
    addr
}

/// A port nothing listens on now (rank 0's comm port).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Rank `r`'s partial of an `n`-element tensor (the same in the TLS and the plain runs).
fn partial(n: usize, r: usize) -> Vec<f32> {
    floats(n, 100 + r as u32 + n as u32)
}

/// One connection per address (rank i at addrs[i]) with its partial.
async fn connect_ranks(addrs: &[SocketAddr], n: usize) -> Vec<Rank> {
    let mut out = Vec::new();
    for (r, addr) in addrs.iter().enumerate() {
        out.push(rank(*addr, n, &partial(n, r), &format!("rank {r}")).await);
    }
    out
}

/// COMM_INIT on every rank at once, rank 0 on a fresh port; the ranks and their answers.
async fn init_all(group: Vec<Rank>) -> (Vec<Rank>, Vec<bool>) {
    let world = group.len() as u32;
    let port = u32::from(free_port());
    let handles: Vec<_> = group
        .into_iter()
        .enumerate()
        .map(|(r, mut member)| {
            let host = if r == 0 { "" } else { "127.0.0.1" };
            let request = comm_init(r as u32, world, port, host);
            tokio::spawn(async move {
                let ok = t(
                    &format!("rank {r}: COMM_INIT"),
                    member.client.comm_init(&request),
                )
                .await;
                (member, ok)
            })
        })
        .collect();
    let (mut ranks, mut oks) = (Vec::new(), Vec::new());
    for handle in handles {
        let (member, ok) = handle.await.expect("COMM_INIT task");
        ranks.push(member);
        oks.push(ok);
    }
    (ranks, oks)
}

/// The group at `addrs` forms its link and all-reduces an `n`-element tensor twice; every
/// rank's tensor after each.
async fn all_reduce_twice(addrs: &[SocketAddr], n: usize, what: &str) -> Vec<Vec<f32>> {
    let group = connect_ranks(addrs, n).await;
    let (mut group, oks) = init_all(group).await;
    assert!(
        oks.iter().all(|&ok| ok),
        "{what}: COMM_INIT answers {oks:?}"
    );
    let mut results = Vec::new();
    for _ in 0..2 {
        for (r, member) in group.iter_mut().enumerate() {
            t(
                &format!("{what}: rank {r}: COMM_ALLREDUCE"),
                member.client.comm_allreduce(0, &member.tensor),
            )
            .await;
        }
        for (r, member) in group.iter_mut().enumerate() {
            let bytes = t(
                &format!("{what}: rank {r}: GET_TENSOR"),
                member.client.get_tensor(&member.tensor, 0, (n * 4) as u64),
            )
            .await;
            results.push(from_bytes(&bytes));
        }
    }
    for (r, member) in group.iter_mut().enumerate() {
        t(
            &format!("{what}: rank {r}: COMM_FREE"),
            member.client.comm_free(0),
        )
        .await;
    }
    results
}

/// The same groups of TLS servers and of plain servers, rank for rank: the all-reduces give
/// the same bits, and they are sums (rank 0's first result is not its own partial).
fn same_sums_as_plain(world: usize, link: LinkVariant, votes: &[bool], what: &str) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("comm CA");
    let identities: Vec<Identity> = (0..world)
        .map(|i| identity(dir.path(), &ca, &format!("rank{i}")))
        .collect();
    let tls_nodes: Vec<Node> = identities
        .iter()
        .zip(votes)
        .map(|(id, &vote)| node(&rt, link, Some(id), vote))
        .collect();
    let plain_nodes: Vec<Node> = votes
        .iter()
        .map(|&vote| node(&rt, link, None, vote))
        .collect();
    let tls_addrs: Vec<SocketAddr> = tls_nodes.iter().map(|n| n.addr).collect();
    let plain_addrs: Vec<SocketAddr> = plain_nodes.iter().map(|n| n.addr).collect();
    for n in SIZES {
        let over_tls = rt.block_on(all_reduce_twice(&tls_addrs, n, &format!("{what}, TLS")));
        let plain = rt.block_on(all_reduce_twice(&plain_addrs, n, &format!("{what}, plain")));
        assert_eq!(over_tls.len(), plain.len());
        for (i, (a, b)) in over_tls.iter().zip(&plain).enumerate() {
            let same =
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{what}, {n} elements: result {i} differs from plain TCP's"
            );
        }
        let own = partial(n, 0);
        assert!(
            over_tls[0].iter().zip(&own).any(|(x, y)| x != y),
            "{what}, {n} elements: rank 0 holds its own partial, not a sum"
        );
        eprintln!("{what}: {n} elements: TLS and plain TCP agree");
    }
}

#[test]
fn the_pairwise_link_over_tls_sums_as_over_plain_tcp() {
    same_sums_as_plain(2, LinkVariant::V8_0, &[true, true], "8.0.0 pairwise link");
}

#[test]
fn the_ranked_link_with_the_cpu_ring_over_tls_sums_as_over_plain_tcp() {
    same_sums_as_plain(3, LinkVariant::Ranked, &[true; 3], "ranked link, ring of 3");
    same_sums_as_plain(2, LinkVariant::Ranked, &[true; 2], "ranked link, ring of 2");
}

#[test]
fn the_ranked_links_pairwise_path_over_tls_sums_as_over_plain_tcp() {
    same_sums_as_plain(
        2,
        LinkVariant::Ranked,
        &[true, false],
        "ranked link, pairwise path",
    );
}

/// COMM_INIT on the group at `addrs`: the answers (in `COMM_TIMEOUT` and some slack), after
/// which every connection still answers DEVICE_COUNT.
async fn init_answers(addrs: &[SocketAddr], what: &str) -> Vec<bool> {
    let group = connect_ranks(addrs, 16).await;
    let started = Instant::now();
    let (mut group, oks) = init_all(group).await;
    let took = started.elapsed();
    assert!(
        took < COMM_TIMEOUT * 2 + Duration::from_secs(5),
        "{what}: COMM_INIT took {took:?}"
    );
    for (r, member) in group.iter_mut().enumerate() {
        t(
            &format!("{what}: rank {r}: DEVICE_COUNT after COMM_INIT"),
            member.client.device_count(),
        )
        .await;
    }
    eprintln!("{what}: answers {oks:?} in {took:?}");
    oks
}

#[test]
fn a_peer_with_a_certificate_of_another_ca_is_refused() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let ours = Ca::new("our CA");
    let theirs = Ca::new("their CA");
    let member = identity(dir.path(), &ours, "member");
    // The stranger trusts our CA, but its own certificate is of another: only our server's
    // verification can refuse it, in either role.
    let mut stranger = identity(dir.path(), &ours, "stranger");
    let foreign = theirs.leaf(dir.path(), "stranger-foreign", &["localhost", "127.0.0.1"]);
    stranger.server.cert = foreign.cert;
    stranger.server.key = foreign.key;
    stranger.client.ca = foreign.ca;
    for link in [LinkVariant::V8_0, LinkVariant::Ranked] {
        let a = node(&rt, link, Some(&member), true);
        let b = node(&rt, link, Some(&stranger), true);
        for (addrs, ours_at) in [([a.addr, b.addr], 0), ([b.addr, a.addr], 1)] {
            let what = format!("{link:?}: our server as rank {ours_at}, the stranger's the other");
            let oks = rt.block_on(init_answers(&addrs, &what));
            assert!(!oks[ours_at], "{what}: our server accepted the stranger");
            assert!(!oks[1 - ours_at], "{what}: the stranger formed a link");
        }
        // The same server forms a link with a member of its CA afterwards.
        let c = node(&rt, link, Some(&identity(dir.path(), &ours, "c")), true);
        let oks = rt.block_on(init_answers(&[a.addr, c.addr], "after the refusals"));
        assert_eq!(oks, [true, true], "{link:?}: a member after the refusals");
    }
}

#[test]
fn a_plain_server_joining_a_tls_servers_link_is_refused() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let member = identity(dir.path(), &Ca::new("our CA"), "member");
    for link in [LinkVariant::V8_0, LinkVariant::Ranked] {
        let secure = node(&rt, link, Some(&member), true);
        let plain = node(&rt, link, None, true);
        let what = format!("{link:?}: plain rank 1 joining TLS rank 0");
        let oks = rt.block_on(init_answers(&[secure.addr, plain.addr], &what));
        assert_eq!(oks, [false, false], "{what}");
        // As rank 0 the plain server may take the ClientHello for its peer's first bytes; the
        // TLS server refuses the answer.
        let what = format!("{link:?}: TLS rank 1 joining plain rank 0");
        let oks = rt.block_on(init_answers(&[plain.addr, secure.addr], &what));
        assert!(
            !oks[1],
            "{what}: the TLS server formed a link with a plain one"
        );
    }
}

/// Stands in for rank 0 on a raw socket: what a TLS server's rank 1 sends first is a TLS
/// handshake record (content type 22, TLS 1.x), not the link's 24 bytes of caps; its COMM_INIT
/// then fails and its client connection stays usable.
#[test]
fn a_tls_servers_comm_link_speaks_tls() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let member = identity(dir.path(), &Ca::new("our CA"), "member");
    for link in [LinkVariant::V8_0, LinkVariant::Ranked] {
        let secure = node(&rt, link, Some(&member), true);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let fake_rank0 = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut first = [0u8; 5];
            stream.read_exact(&mut first).unwrap();
            first
        });
        rt.block_on(async {
            let mut group = connect_ranks(&[secure.addr], 16).await;
            let request = comm_init(1, 2, u32::from(port), "127.0.0.1");
            let ok = t("rank 1: COMM_INIT", group[0].client.comm_init(&request)).await;
            assert!(
                !ok,
                "{link:?}: the link formed with a peer that speaks no TLS"
            );
            t("rank 1: DEVICE_COUNT", group[0].client.device_count()).await;
        });
        let first = fake_rank0.join().unwrap();
        assert_eq!(
            first[0], 22,
            "{link:?}: not a TLS handshake record: {first:?}"
        );
        assert_eq!(first[1], 3, "{link:?}: not a TLS record: {first:?}");
    }
}
