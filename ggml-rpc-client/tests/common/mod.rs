//! Helpers of the client's loopback tests: a server on 127.0.0.1:0 over the in-memory
//! backend and a deadline for every wait. (The shell-agnostic server tests, with their raw
//! socket and log capture, live in `ggml-rpc-server/tests/`.)

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ggml_rpc_client::Client;
use proto_core::backend::MemoryBackend;
use proto_core::wire::{ProtocolVersion, RpcTensor};
use shell_tokio::{serve, ServerConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Deadline of every wait in the tests (generous; the waits end as soon as they can).
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A running server.
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    /// Starts a server with a 1 GiB, one-device memory backend.
    pub async fn start(config: ServerConfig) -> TestServer {
        let backend = Arc::new(MemoryBackend::new(1, 1 << 30));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, backend, config, async move {
            let _ = stopped.await;
        }));
        TestServer { addr, stop, task }
    }

    /// A client speaking `version`.
    pub async fn client(&self, version: ProtocolVersion) -> Client {
        Client::connect(self.addr, version).await.unwrap()
    }

    /// Stops the server and waits for `serve` to return.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        within(self.task).await.unwrap().unwrap();
    }
}

/// Runs a future with the test deadline.
pub async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("timed out")
}

/// A contiguous i8 tensor of `len` bytes at `data` inside `buffer`.
pub fn bytes_tensor(id: u64, buffer: u64, data: u64, len: u32) -> RpcTensor {
    let mut tensor = RpcTensor::contiguous(id, 24, [len, 1, 1, 1]).unwrap();
    tensor.buffer = buffer;
    tensor.data = data;
    tensor
}
