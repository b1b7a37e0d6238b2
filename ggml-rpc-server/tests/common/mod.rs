//! Helpers of the shell conformance suite: a server on 127.0.0.1:0 over the in-memory backend,
//! started in-process on any shell through [`ggml_rpc_server::start`], a raw socket for hostile
//! input, log capture and polling with a deadline. The clients are the async client library
//! ([`ggml_rpc_client::Client`]) on the test's own runtime; the server runs on the shell's threads.
#![allow(dead_code)]

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ggml_rpc_client::Client;
use ggml_rpc_server::{RunningServer, ServerConfig};
use proto_core::backend::{Backend, MemoryBackend};
use proto_core::ggml::types::id;
use proto_core::wire::{Dialect, ProtocolVersion, Request, RpcTensor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Deadline of every wait in the tests (generous; the waits end as soon as the condition holds).
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Starts `shell` on a fresh loopback listener.
pub fn start(shell: &str, backend: Arc<dyn Backend>, config: ServerConfig) -> RunningServer {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    ggml_rpc_server::start(shell, listener, backend, config)
        .unwrap_or_else(|error| panic!("cannot start the {shell} shell: {error:#}"))
}

/// Shuts a server down from async code (the wait blocks, so it runs on the blocking pool).
pub async fn shutdown(server: RunningServer) {
    tokio::time::timeout(
        DEADLINE,
        tokio::task::spawn_blocking(move || server.shutdown()),
    )
    .await
    .expect("the server stops in time")
    .unwrap()
    .unwrap();
}

/// A running server over a [`MemoryBackend`].
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its backend (to count live buffers).
    pub backend: Arc<MemoryBackend>,
    server: Option<RunningServer>,
}

impl TestServer {
    /// Starts `shell` with a 1 GiB, one-device memory backend.
    pub fn start(shell: &str, config: ServerConfig) -> TestServer {
        let backend = Arc::new(MemoryBackend::new(1, 1 << 30));
        let server = start(shell, backend.clone(), config);
        TestServer {
            addr: server.local_addr(),
            backend,
            server: Some(server),
        }
    }

    /// Starts a protocol-8 server with default settings.
    pub fn v8(shell: &str) -> TestServer {
        TestServer::start(shell, ServerConfig::new(ProtocolVersion::V8_0_0))
    }

    /// A client speaking `version`.
    pub async fn client(&self, version: ProtocolVersion) -> Client {
        within(Client::connect(self.addr, version)).await.unwrap()
    }

    /// Waits until the backend holds exactly `n` buffers.
    pub async fn wait_live_buffers(&self, n: usize) {
        let backend = self.backend.clone();
        eventually(move || backend.live_buffers() == n).await;
    }

    /// Stops the server and waits until it stopped.
    pub async fn shutdown(mut self) {
        if let Some(server) = self.server.take() {
            shutdown(server).await;
        }
    }
}

/// Polls `condition` until it holds; panics after [`DEADLINE`].
pub async fn eventually(mut condition: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !condition() {
        assert!(start.elapsed() < DEADLINE, "condition not reached in time");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Runs a future with the test deadline.
pub async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("timed out")
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect::<Vec<u8>>()
        .into()
}

/// A contiguous i8 tensor of `len` bytes at `data` inside `buffer`.
pub fn bytes_tensor(id: u64, buffer: u64, data: u64, len: u32) -> RpcTensor {
    let mut tensor = RpcTensor::contiguous(id, 24, [len, 1, 1, 1]).unwrap();
    tensor.buffer = buffer;
    tensor.data = data;
    tensor
}

/// A contiguous f32 tensor of shape `ne` at `data` inside `buffer`.
pub fn f32_tensor(id: u64, buffer: u64, data: u64, ne: [u32; 4]) -> RpcTensor {
    let mut tensor = RpcTensor::contiguous(id, id::F32, ne).unwrap();
    tensor.buffer = buffer;
    tensor.data = data;
    tensor
}

/// A raw TCP connection for sending arbitrary bytes.
pub struct Raw {
    pub stream: TcpStream,
    dialect: Dialect,
}

impl Raw {
    /// Connects without HELLO.
    pub async fn connect(addr: SocketAddr, dialect: Dialect) -> Raw {
        let stream = within(TcpStream::connect(addr)).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Raw { stream, dialect }
    }

    /// Connects and performs HELLO, checking the 36-byte answer.
    pub async fn connect_hello(addr: SocketAddr, dialect: Dialect) -> Raw {
        let mut raw = Raw::connect(addr, dialect).await;
        raw.send(&Request::Hello { caps: [0; 24] }).await;
        let answer = raw.read(36).await;
        assert_eq!(&answer[..8], &28u64.to_le_bytes());
        assert_eq!(answer[8], dialect.version().major);
        raw
    }

    /// Writes a well-formed request frame.
    pub async fn send(&mut self, request: &Request) {
        let frame = request.to_frame(self.dialect).unwrap();
        self.write(&frame).await;
    }

    /// Writes raw bytes.
    pub async fn write(&mut self, bytes: &[u8]) {
        within(self.stream.write_all(bytes)).await.unwrap();
    }

    /// Reads exactly `n` bytes.
    pub async fn read(&mut self, n: usize) -> Vec<u8> {
        let mut out = vec![0; n];
        within(self.stream.read_exact(&mut out)).await.unwrap();
        out
    }

    /// Sends a request with a response and returns the response payload.
    pub async fn call(&mut self, request: &Request, response_len: usize) -> Vec<u8> {
        self.send(request).await;
        let head = self.read(8).await;
        assert_eq!(
            u64::from_le_bytes(head.try_into().unwrap()),
            response_len as u64
        );
        self.read(response_len).await
    }

    /// Allocates a buffer; returns (handle, base).
    pub async fn alloc(&mut self, size: u64) -> (u64, u64) {
        let answer = self
            .call(&Request::AllocBuffer { device: 0, size }, 16)
            .await;
        let handle = u64::from_le_bytes(answer[..8].try_into().unwrap());
        assert_ne!(handle, 0);
        let base = self
            .call(&Request::BufferGetBase { buffer: handle }, 8)
            .await;
        (handle, u64::from_le_bytes(base.try_into().unwrap()))
    }

    /// Waits until the server closed the connection (EOF or reset), discarding anything sent.
    pub async fn expect_closed(&mut self) {
        within(async {
            let mut sink = [0u8; 4096];
            loop {
                match self.stream.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
}

/// Captured log output.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_for(&self, needle: &str) {
        let logs = self.clone();
        let wanted = needle.to_owned();
        tokio::time::timeout(DEADLINE, async move {
            while !logs.text().contains(&wanted) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("log line not found: {needle}\n{}", self.text()));
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// Captures the logs of this thread until the guard drops. Servers started from this thread
/// log here too (every shell's threads take over the dispatcher of the thread that started
/// them).
pub fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// Runs every listed test once per shell of this build: `tokio_shell::NAME`, `uring_shell::NAME`,
/// `smol_shell::NAME`. The client side is a two-worker tokio runtime; the server runs on the
/// shell's own threads.
macro_rules! for_each_shell {
    ($($test:ident),* $(,)?) => {
        #[cfg(feature = "tokio")]
        mod tokio_shell {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test("tokio").await
                }
            )*
        }
        #[cfg(all(feature = "uring", target_os = "linux"))]
        mod uring_shell {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test("uring").await
                }
            )*
        }
        #[cfg(feature = "smol")]
        mod smol_shell {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test("smol").await
                }
            )*
        }
    };
}
