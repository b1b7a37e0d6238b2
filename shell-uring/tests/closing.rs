//! Large frees run on blocking threads: a FREE_BUFFER of a large buffer, and a closing client
//! that held much memory. The ring goes on serving its other clients while the memory is
//! released, and `join` still returns only once every buffer is freed.
#![cfg(target_os = "linux")]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ggml_rpc_client::Client;
use proto_core::backend::{
    AllocatedBuffer, Backend, BufferId, DeviceMemory, MemoryBackend, TensorLocation,
};
use proto_core::graph::Graph;
use proto_core::wire::ProtocolVersion;
use shell_uring::{Server, ServerConfig};

/// Bytes the closing client holds: above what the ring frees itself.
const HELD: u64 = 32 << 20;

/// Frees go through a gate the test opens: a free that has begun waits until then.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    open: bool,
    /// Names of the threads that freed buffers (`None`: unnamed).
    freed_on: Vec<Option<String>>,
    waiting: usize,
}

impl Gate {
    fn pass(&self) {
        let mut state = self.state.lock().unwrap();
        state.waiting += 1;
        self.changed.notify_all();
        while !state.open {
            state = self.changed.wait(state).unwrap();
        }
        state.waiting -= 1;
        state
            .freed_on
            .push(std::thread::current().name().map(str::to_owned));
    }

    fn wait_for_a_free(&self) {
        let state = self.state.lock().unwrap();
        let (_state, timeout) = self
            .changed
            .wait_timeout_while(state, Duration::from_secs(20), |s| s.waiting == 0)
            .unwrap();
        assert!(!timeout.timed_out(), "the server never freed the buffer");
    }

    fn open(&self) {
        self.state.lock().unwrap().open = true;
        self.changed.notify_all();
    }

    fn freed_on(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().freed_on.clone()
    }
}

/// A [`MemoryBackend`] whose frees wait at a [`Gate`].
struct GatedFrees {
    inner: MemoryBackend,
    gate: Arc<Gate>,
}

impl Backend for GatedFrees {
    fn device_count(&self) -> u32 {
        self.inner.device_count()
    }
    fn device_memory(&self, device: u32) -> DeviceMemory {
        self.inner.device_memory(device)
    }
    fn alignment(&self, device: u32) -> u64 {
        self.inner.alignment(device)
    }
    fn max_size(&self, device: u32) -> u64 {
        self.inner.max_size(device)
    }
    fn alloc_buffer(&self, device: u32, size: u64) -> Option<AllocatedBuffer> {
        self.inner.alloc_buffer(device, size)
    }
    fn free_buffer(&self, buffer: BufferId) {
        self.gate.pass();
        self.inner.free_buffer(buffer);
    }
    fn clear_buffer(&self, buffer: BufferId, value: u8) -> proto_core::Result<()> {
        self.inner.clear_buffer(buffer, value)
    }
    fn write(&self, at: TensorLocation, data: &[u8]) -> proto_core::Result<()> {
        self.inner.write(at, data)
    }
    fn read(&self, at: TensorLocation, out: &mut [u8]) -> proto_core::Result<()> {
        self.inner.read(at, out)
    }
    fn fill(&self, at: TensorLocation, len: u64, value: u8) -> proto_core::Result<()> {
        self.inner.fill(at, len, value)
    }
    fn copy(&self, src: TensorLocation, dst: TensorLocation, len: u64) -> proto_core::Result<bool> {
        self.inner.copy(src, dst, len)
    }
    fn graph_compute(&self, device: u32, graph: &Graph) -> proto_core::Result<()> {
        self.inner.graph_compute(device, graph)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_client_is_freed_while_the_ring_serves_the_others() {
    let (server, backend, gate) = start();
    let addr = server.local_addr();

    let mut large = Client::connect(addr, ProtocolVersion::V8_0_0)
        .await
        .unwrap();
    let mut other = Client::connect(addr, ProtocolVersion::V8_0_0)
        .await
        .unwrap();
    large.alloc_buffer(0, HELD).await.unwrap().unwrap();
    assert_eq!(other.alignment(0).await.unwrap(), 32);
    drop(large);

    // The free has begun and cannot finish: the ring serves the other client meanwhile (were
    // the ring freeing, this round trip would wait for the gate, which opens only after it).
    gate.clone().a_free_began().await;
    let served = tokio::time::timeout(Duration::from_secs(20), other.alignment(0)).await;
    assert_eq!(
        served.expect("the ring was blocked by the free").unwrap(),
        32
    );
    assert_eq!(backend.inner.live_buffers(), 1);
    gate.open();
    let freed_on = gate.freed_on_eventually(1).await;
    assert_eq!(freed_on.len(), 1);
    assert_eq!(
        freed_on[0].as_deref(),
        Some("rpc-uring-blocking"),
        "freed on a blocking thread, not on the ring"
    );
    drop(other);
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_free_buffer_runs_while_the_ring_serves_the_others() {
    let (server, backend, gate) = start();
    let addr = server.local_addr();
    let mut freeing = Client::connect(addr, ProtocolVersion::V8_0_0)
        .await
        .unwrap();
    let mut other = Client::connect(addr, ProtocolVersion::V8_0_0)
        .await
        .unwrap();
    let buffer = freeing.alloc_buffer(0, HELD).await.unwrap().unwrap();
    // FREE_BUFFER has no reply: the next round trip on the connection waits for it.
    freeing.free_buffer(buffer.handle).await.unwrap();
    gate.clone().a_free_began().await;
    let served = tokio::time::timeout(Duration::from_secs(20), other.alignment(0)).await;
    assert_eq!(
        served.expect("the ring was blocked by the free").unwrap(),
        32
    );
    gate.open();
    assert_eq!(freeing.alignment(0).await.unwrap(), 32);
    assert_eq!(backend.inner.live_buffers(), 0);
    assert_eq!(gate.freed_on(), vec![Some("rpc-uring-blocking".to_owned())]);
    // A small buffer is freed on the ring.
    let small = freeing.alloc_buffer(0, 4096).await.unwrap().unwrap();
    freeing.free_buffer(small.handle).await.unwrap();
    assert_eq!(freeing.alignment(0).await.unwrap(), 32);
    assert_eq!(gate.freed_on()[1].as_deref(), Some("rpc-uring-0"));
    drop((freeing, other));
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_waits_for_the_frees_of_closed_clients() {
    let (server, backend, gate) = start();
    let mut large = Client::connect(server.local_addr(), ProtocolVersion::V8_0_0)
        .await
        .unwrap();
    large.alloc_buffer(0, HELD).await.unwrap().unwrap();
    drop(large);
    gate.clone().a_free_began().await;

    // The ring ends at once (it has no clients left); join returns only after the free.
    server.stop();
    let opener = std::thread::spawn({
        let gate = gate.clone();
        move || {
            std::thread::sleep(Duration::from_millis(200));
            gate.open();
        }
    });
    let backend_after = backend.clone();
    let live_after_join = tokio::task::spawn_blocking(move || {
        server.join();
        backend_after.inner.live_buffers()
    })
    .await
    .unwrap();
    assert_eq!(live_after_join, 0);
    opener.join().unwrap();
}

/// A server on a [`GatedFrees`] backend.
fn start() -> (Server, Arc<GatedFrees>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let backend = Arc::new(GatedFrees {
        inner: MemoryBackend::new(1, 1 << 30),
        gate: gate.clone(),
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(
        listener,
        backend.clone(),
        ServerConfig::new(ProtocolVersion::V8_0_0),
    )
    .unwrap();
    (server, backend, gate)
}

async fn stop(server: Server) {
    server.stop();
    tokio::task::spawn_blocking(move || server.join())
        .await
        .unwrap();
}

impl Gate {
    /// Returns once a free waits at the gate.
    async fn a_free_began(self: Arc<Self>) {
        tokio::task::spawn_blocking(move || self.wait_for_a_free())
            .await
            .unwrap();
    }

    /// The threads that freed buffers, once at least `count` frees have finished.
    async fn freed_on_eventually(&self, count: usize) -> Vec<Option<String>> {
        for _ in 0..2000 {
            let freed_on = self.freed_on();
            if freed_on.len() >= count {
                return freed_on;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the free never finished");
    }
}
