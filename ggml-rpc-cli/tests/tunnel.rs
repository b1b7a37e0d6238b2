//! `ggml-rpc tunnel` between our clients (plain TCP) and a TLS server in-process: many
//! connections at once, each side's end closing the other, and a tunnel whose certificate the
//! server does not trust.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ggml_rpc_client::Client;
use proto_core::backend::MemoryBackend;
use proto_core::wire::{ProtocolVersion, RpcTensor};
use shell_common::tls::test_certs::Ca;
use shell_common::tls::{ServerTls, TlsFiles};
use shell_tokio::{serve, ServerConfig};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const CLI: &str = env!("CARGO_BIN_EXE_ggml-rpc");
const DEADLINE: Duration = Duration::from_secs(20);

/// A TLS server on a background runtime; stops when the returned sender drops.
struct Server {
    addr: SocketAddr,
    backend: Arc<MemoryBackend>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(files: &TlsFiles) -> Server {
        Server::start_with_peers(files, &[])
    }

    /// A server that may push remote copies to `peers` (over TLS, with its own certificate).
    fn start_with_peers(files: &TlsFiles, peers: &[String]) -> Server {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let backend = Arc::new(MemoryBackend::new(1, 1 << 30));
        let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
        config.tls = Some(ServerTls::load(files).unwrap());
        config.peers = shell_common::PeerAllowList::resolve(peers).unwrap();
        let served = backend.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                serve(listener, served, config, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        Server {
            addr: addr_rx.recv().unwrap(),
            backend,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops the server (its clients are closed) and waits until it stopped.
    fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The tunnel process; killed when dropped.
struct Tunnel {
    addr: SocketAddr,
    child: Child,
}

impl Tunnel {
    fn start(to: SocketAddr, files: &TlsFiles) -> Tunnel {
        let mut child = Command::new(CLI)
            .args(["tunnel", "--listen", "127.0.0.1:0", "--connect"])
            .arg(to.to_string())
            .arg("--tls-cert")
            .arg(&files.cert)
            .arg("--tls-key")
            .arg(&files.key)
            .arg("--tls-ca")
            .arg(&files.ca)
            .args(["--server-name", "localhost"])
            .stdout(Stdio::piped())
            // Its log lines would interleave with the test output.
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("tunnel listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Tunnel { addr, child }
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn identities(dir: &Path) -> (TlsFiles, TlsFiles) {
    let ca = Ca::new("our CA");
    (
        ca.leaf(dir, "server", &["localhost", "127.0.0.1"]),
        ca.leaf(dir, "client", &["client"]),
    )
}

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("timed out")
}

async fn eventually(mut condition: impl FnMut() -> bool) {
    within(async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// One client's round trip through the tunnel: a buffer, `len` bytes in and out.
async fn round_trip(addr: SocketAddr, len: usize, seed: u8) {
    let mut client = within(Client::connect(addr, ProtocolVersion::V8_0_0))
        .await
        .unwrap();
    let buffer = client.alloc_buffer(0, len as u64).await.unwrap().unwrap();
    let base = client.buffer_base(buffer.handle).await.unwrap();
    let mut tensor = RpcTensor::contiguous(1, 24, [len as u32, 1, 1, 1]).unwrap();
    tensor.buffer = buffer.handle;
    tensor.data = base;
    let data = pattern(len, seed);
    client.set_tensor(&tensor, 0, data.clone()).await.unwrap();
    let back = client.get_tensor(&tensor, 0, len as u64).await.unwrap();
    assert!(back == data, "client {seed}: the data came back changed");
    client.free_buffer(buffer.handle).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_connections_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (server_files, client_files) = identities(dir.path());
    let server = Server::start(&server_files);
    let tunnel = Tunnel::start(server.addr, &client_files);
    let clients: Vec<_> = (0..16u8)
        .map(|seed| tokio::spawn(round_trip(tunnel.addr, 3 << 20, seed)))
        .collect();
    for client in clients {
        within(client).await.unwrap();
    }
    // FREE_BUFFER has no answer: each is applied soon after its client returned.
    let backend = server.backend.clone();
    eventually(move || backend.live_buffers() == 0).await;
}

/// Replies above 16 MiB go out encrypted straight from backend memory; data above 16 MiB
/// comes in through the buffered path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfers_through_the_tunnel() {
    let dir = tempfile::tempdir().unwrap();
    let (server_files, client_files) = identities(dir.path());
    let server = Server::start(&server_files);
    let tunnel = Tunnel::start(server.addr, &client_files);
    round_trip(tunnel.addr, (40 << 20) + 3, 9).await;
    let backend = server.backend.clone();
    eventually(move || backend.live_buffers() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_closes_its_server_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (server_files, client_files) = identities(dir.path());
    let server = Server::start(&server_files);
    let tunnel = Tunnel::start(server.addr, &client_files);
    let mut client = within(Client::connect(tunnel.addr, ProtocolVersion::V8_0_0))
        .await
        .unwrap();
    client.alloc_buffer(0, 1 << 20).await.unwrap().unwrap();
    assert_eq!(server.backend.live_buffers(), 1);
    // The server frees a client's buffers when its connection ends: the tunnel passed the end on.
    drop(client);
    let backend = server.backend.clone();
    eventually(move || backend.live_buffers() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_leaving_closes_the_client_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (server_files, client_files) = identities(dir.path());
    let mut server = Server::start(&server_files);
    let tunnel = Tunnel::start(server.addr, &client_files);
    let mut client = within(Client::connect(tunnel.addr, ProtocolVersion::V8_0_0))
        .await
        .unwrap();
    client.device_count().await.unwrap();
    tokio::task::block_in_place(|| server.stop());
    // The next command finds the connection closed instead of waiting for an answer.
    let error = within(client.device_count()).await;
    assert!(error.is_err(), "{error:?}");
    // And the tunnel is still there for the next client, which finds no server.
    let mut raw = within(TcpStream::connect(tunnel.addr)).await.unwrap();
    let mut sink = [0u8; 16];
    assert!(matches!(within(raw.read(&mut sink)).await, Ok(0) | Err(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_of_another_ca_is_refused_and_the_client_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (server_files, _) = identities(dir.path());
    let server = Server::start(&server_files);
    let mut stranger = Ca::new("their CA").leaf(dir.path(), "stranger", &["stranger"]);
    stranger.ca = server_files.ca.clone();
    let tunnel = Tunnel::start(server.addr, &stranger);
    let result = within(Client::connect(tunnel.addr, ProtocolVersion::V8_0_0)).await;
    assert!(result.is_err(), "the HELLO was answered");
    assert_eq!(server.backend.live_buffers(), 0);
}

/// REMOTE_COPY_TENSOR between two TLS servers: A pushes to B over TLS with its own
/// certificate, B checks it against its client CA; the client reaches each through a tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_copy_between_tls_servers_goes_direct() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("our CA");
    let a_files = ca.leaf(dir.path(), "a", &["localhost", "127.0.0.1"]);
    let b_files = ca.leaf(dir.path(), "b", &["localhost", "127.0.0.1"]);
    let client_files = ca.leaf(dir.path(), "client", &["client"]);
    let b = Server::start(&b_files);
    let a = Server::start_with_peers(&a_files, &[b.addr.to_string()]);
    let (to_a, to_b) = (
        Tunnel::start(a.addr, &client_files),
        Tunnel::start(b.addr, &client_files),
    );
    let version = ProtocolVersion::V8_0_0;
    let mut src = within(Client::connect(to_a.addr, version)).await.unwrap();
    let mut dst = within(Client::connect(to_b.addr, version)).await.unwrap();
    let len = 5 << 20;
    let tensor_on = |buffer: u64, base: u64| {
        let mut tensor = RpcTensor::contiguous(1, 24, [len as u32, 1, 1, 1]).unwrap();
        tensor.buffer = buffer;
        tensor.data = base;
        tensor
    };
    let src_buffer = src.alloc_buffer(0, len as u64).await.unwrap().unwrap();
    let src_tensor = tensor_on(
        src_buffer.handle,
        src.buffer_base(src_buffer.handle).await.unwrap(),
    );
    let dst_buffer = dst.alloc_buffer(0, len as u64).await.unwrap().unwrap();
    let dst_tensor = tensor_on(
        dst_buffer.handle,
        dst.buffer_base(dst_buffer.handle).await.unwrap(),
    );
    let data = pattern(len, 7);
    src.set_tensor(&src_tensor, 0, data.clone()).await.unwrap();
    let path = within(ggml_rpc_client::copy_between_servers(
        &mut src,
        &src_tensor,
        0,
        &mut dst,
        &dst_tensor,
        0,
        len as u64,
        &b.addr.to_string(),
        ggml_rpc_client::CopyMode::Direct,
    ))
    .await
    .unwrap();
    assert_eq!(path, ggml_rpc_client::CopyPath::Direct);
    let back = dst.get_tensor(&dst_tensor, 0, len as u64).await.unwrap();
    assert!(back == data, "the copy arrived changed");
}
