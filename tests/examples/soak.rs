//! The soak: a bounded load-and-fault run against our release `ggml-rpc-server` on loopback.
//!
//! ```sh
//! cargo build --release -p ggml-rpc-server -p ggml-rpc-tests --example soak
//! target/release/examples/soak --clients 64 --seconds 120 --shell tokio   # the full run
//! target/release/examples/soak --clients 12 --seconds 10 --shell uring    # CI's short run
//! ```
//!
//! `--clients` workers each repeat a model-load cycle on their own connection: allocate a
//! buffer, upload a blob of 1..`--max-mib` MiB in one to three SET_TENSORs (pieces above
//! 16 MiB arrive in chunks), compute an ADD graph over two tensors beside it, download the blob
//! and the sums and compare them byte for byte with what they sent and expect, then free the
//! buffer or reconnect. Meanwhile `--faulters` fault injectors each repeat, in turn: a client
//! killed in the middle of a 32 MiB upload (reset), a reader that asks for 16 MiB and stops
//! reading, a client that half-closes in the middle of an upload, hostile messages (a length
//! field of 2^62, an unknown command, a graph whose node count overruns its payload, a tensor in
//! a buffer it does not own; each must make the server close that connection), a connection
//! that never says HELLO, a header torn in the middle.
//!
//! At the end: every worker cycle verified byte-exact (any worker error fails the run), a fresh
//! client served, and the server back to its baseline (taken after one warm-up cycle): resident
//! memory within `--rss-slack-mib` (default 8), the same number of file descriptors, no more
//! threads. Exit status 0 only then. The report (clients, bytes, faults, survivors, leaks) is
//! what README.md's "Soak" section shows.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use ggml_rpc_client::{Client, ProtocolVersion, RpcTensor};
use ggml_rpc_tests::process::Holdings;
use proto_core::ggml::types::id::F32;
use proto_core::ggml::{flags, Op};
use proto_core::session::{ClientEvent, ClientSession};
use proto_core::wire::{Command, GraphComputeRequest, Request, Response, SetTensorHeader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type Res<T> = Result<T, String>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(format!($($t)*)) };
}

const MIB: u64 = 1 << 20;
/// Elements of each ADD operand.
const ADD_ELEMENTS: u32 = 4096;
const ADD_BYTES: u64 = ADD_ELEMENTS as u64 * 4;
/// How long any one step may take before the run counts it as hung.
const STEP: Duration = Duration::from_secs(60);
/// How long a hostile or half-closed connection may stay open before the run fails.
const CLOSE_WITHIN: Duration = Duration::from_secs(15);
/// How long the server has to return to its baseline after the last client left.
const SETTLE: Duration = Duration::from_secs(40);
/// The name prefix of the threads of smol's blocking pool (the `blocking` crate), which since
/// its 1.7 keeps idle threads up to its limit (500) instead of ending them: the pool's
/// high-water mark, reported, not counted as left over.
const IDLE_POOL_THREADS: &str = "blocking-";

/// The server's threads, less the idle pool's.
fn own_threads(pid: u32) -> usize {
    let names = ggml_rpc_tests::process::thread_names(pid);
    names
        .iter()
        .filter(|n| !n.starts_with(IDLE_POOL_THREADS))
        .count()
}

struct Options {
    clients: usize,
    faulters: usize,
    seconds: u64,
    shell: String,
    max_mib: u64,
    rss_slack_mib: u64,
    server: Option<PathBuf>,
}

fn parse(args: &[String]) -> Res<Options> {
    let mut o = Options {
        clients: 64,
        faulters: 8,
        seconds: 60,
        shell: "tokio".into(),
        max_mib: 32,
        rss_slack_mib: 8,
        server: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: &String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} {v}: a number"))
        };
        match flag.as_str() {
            "--clients" => o.clients = number(value()?)? as usize,
            "--faulters" => o.faulters = number(value()?)? as usize,
            "--seconds" => o.seconds = number(value()?)?,
            "--shell" => o.shell = value()?.clone(),
            "--max-mib" => o.max_mib = number(value()?)?.max(1),
            "--rss-slack-mib" => o.rss_slack_mib = number(value()?)?,
            "--server" => o.server = Some(value()?.into()),
            "-h" | "--help" => bail!(
                "usage: soak [--clients N] [--faulters N] [--seconds S] [--shell tokio|uring|smol] \
                 [--max-mib N] [--rss-slack-mib N] [--server PATH]"
            ),
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(o)
}

// ------------------------------------------------------------------------------ the server

struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    fn start(o: &Options) -> Res<Server> {
        let bin = match &o.server {
            Some(path) => path.clone(),
            None => sibling_server_binary()?,
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let log = std::env::temp_dir().join(format!("soak-{}-{port}.log", o.shell));
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        let max_clients = (o.clients + 2 * o.faulters + 8).to_string();
        let child = std::process::Command::new(&bin)
            .args([
                "--shell",
                &o.shell,
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args(["-t", "2", "--max-clients", &max_clients])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut server = Server { child, addr, log };
        server.wait_listening()?;
        Ok(server)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn wait_listening(&mut self) -> Res<()> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if !self.alive() {
                bail!("the server exited at start:\n{}", self.log_tail());
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the server does not listen on {} after 30 s", self.addr)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn log_count(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches(needle)
            .count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// target/release/examples/soak → target/release/ggml-rpc-server
fn sibling_server_binary() -> Res<PathBuf> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = me
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("ggml-rpc-server"))
        .ok_or("no target directory")?;
    if !bin.is_file() {
        bail!(
            "{} is missing: cargo build --release -p ggml-rpc-server (or pass --server)",
            bin.display()
        );
    }
    Ok(bin)
}

// ------------------------------------------------------------------------------ workers

#[derive(Default)]
struct Totals {
    cycles: AtomicU64,
    uploaded: AtomicU64,
    downloaded: AtomicU64,
    connections: AtomicU64,
}

/// The bytes a worker uploads in a cycle: a function of (worker, cycle, position), so a
/// mismatch can never be a stale copy of another cycle's data.
fn blob(worker: u64, cycle: u64, len: usize) -> Bytes {
    let mut state = (worker << 32 | cycle).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = BytesMut::with_capacity(len);
    while out.len() + 8 <= len {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.put_u64_le(state.wrapping_mul(0x2545_F491_4F6C_DD1D));
    }
    while out.len() < len {
        out.put_u8(out.len() as u8);
    }
    out.freeze()
}

fn f32_tensor(id: u64, buffer: u64, data: u64, elements: u32) -> Res<RpcTensor> {
    let mut tensor = RpcTensor::contiguous(id, F32, [elements, 1, 1, 1]).ok_or("F32 exists")?;
    tensor.buffer = buffer;
    tensor.data = data;
    Ok(tensor)
}

async fn step<T, E: std::fmt::Display>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Res<T> {
    match tokio::time::timeout(STEP, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {STEP:?} (hung)")),
    }
}

/// One model-load cycle on `client`, verified byte for byte.
async fn cycle(client: &mut Client, worker: u64, n: u64, mib: u64, totals: &Totals) -> Res<()> {
    let size = mib * MIB;
    let buffer = step("ALLOC_BUFFER", client.alloc_buffer(0, size + 3 * ADD_BYTES))
        .await?
        .ok_or("the server refused the allocation")?;
    let base = step("BUFFER_GET_BASE", client.buffer_base(buffer.handle)).await?;
    let data = blob(worker, n, size as usize);
    let whole = f32_tensor(1, buffer.handle, base, (size / 4) as u32)?;
    // One to three pieces: 16 MiB+ pieces reach the backend in chunks.
    let pieces = 1 + (worker + n) % 3;
    let piece = size.div_ceil(pieces);
    let mut offset = 0;
    while offset < size {
        let end = (offset + piece).min(size);
        let part = data.slice(offset as usize..end as usize);
        step("SET_TENSOR", client.set_tensor(&whole, offset, part)).await?;
        offset = end;
    }
    totals.uploaded.fetch_add(size, Ordering::Relaxed);

    // c = a + b over two tensors beside the blob: values whose sums are exact.
    let (a_at, b_at, c_at) = (
        base + size,
        base + size + ADD_BYTES,
        base + size + 2 * ADD_BYTES,
    );
    let a_values: Vec<f32> = (0..ADD_ELEMENTS)
        .map(|i| (i as f32) + (worker as f32))
        .collect();
    let b_values: Vec<f32> = (0..ADD_ELEMENTS)
        .map(|i| (n % 1000) as f32 - i as f32)
        .collect();
    let a = f32_tensor(2, buffer.handle, a_at, ADD_ELEMENTS)?;
    let b = f32_tensor(3, buffer.handle, b_at, ADD_ELEMENTS)?;
    let mut c = f32_tensor(4, buffer.handle, c_at, ADD_ELEMENTS)?;
    let bytes_of =
        |v: &[f32]| Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>());
    step(
        "SET_TENSOR a",
        client.set_tensor(&a, 0, bytes_of(&a_values)),
    )
    .await?;
    step(
        "SET_TENSOR b",
        client.set_tensor(&b, 0, bytes_of(&b_values)),
    )
    .await?;
    c.op = Op::ADD.0;
    c.src[0] = a.id;
    c.src[1] = b.id;
    c.flags = flags::COMPUTE;
    let graph = GraphComputeRequest {
        device: 0,
        uid: worker << 32 | n,
        node_ids: vec![c.id],
        tensors: vec![a, b, c.clone()],
    };
    step("GRAPH_COMPUTE", client.graph_compute(&graph)).await?;
    let sums = step("GET_TENSOR c", client.get_tensor(&c, 0, ADD_BYTES)).await?;
    let expected: Vec<f32> = a_values.iter().zip(&b_values).map(|(x, y)| x + y).collect();
    if sums != bytes_of(&expected) {
        bail!("worker {worker} cycle {n}: the ADD graph's sums differ");
    }

    let back = step("GET_TENSOR", client.get_tensor(&whole, 0, size)).await?;
    totals
        .downloaded
        .fetch_add(size + ADD_BYTES, Ordering::Relaxed);
    if back != data {
        let at = back.iter().zip(data.iter()).position(|(x, y)| x != y);
        bail!(
            "worker {worker} cycle {n}: {size} bytes uploaded, {} came back, first difference at {at:?}",
            back.len()
        );
    }
    step("FREE_BUFFER", client.free_buffer(buffer.handle)).await?;
    totals.cycles.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn connect(addr: SocketAddr, totals: &Totals) -> Res<Client> {
    let client = step("connect", Client::connect(addr, ProtocolVersion::V8_0_1)).await?;
    totals.connections.fetch_add(1, Ordering::Relaxed);
    Ok(client)
}

async fn worker(
    addr: SocketAddr,
    id: u64,
    max_mib: u64,
    until: Instant,
    totals: Arc<Totals>,
) -> Res<u64> {
    let mut client = connect(addr, &totals).await?;
    let mut n = 0;
    while Instant::now() < until {
        let mib = 1 + (id * 7 + n * 13) % max_mib;
        cycle(&mut client, id, n, mib, &totals)
            .await
            .map_err(|e| format!("worker {id}: {e}"))?;
        n += 1;
        if (id + n).is_multiple_of(4) {
            step("close", client.close()).await?;
            client = connect(addr, &totals).await?;
        }
    }
    step("close", client.close()).await?;
    Ok(n)
}

// ------------------------------------------------------------------------------ faults

/// A raw connection: our client session's bytes, written as the fault needs them.
struct Raw {
    stream: TcpStream,
    session: ClientSession,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Res<Raw> {
        let stream = step("connect", TcpStream::connect(addr)).await?;
        let session =
            ClientSession::new(ProtocolVersion::V8_0_1, [0; 24]).map_err(|e| e.to_string())?;
        let mut raw = Raw { stream, session };
        raw.flush().await?;
        match raw.next_event().await? {
            ClientEvent::Connected(_) => Ok(raw),
            ClientEvent::Response(_) => bail!("a response before HELLO's"),
        }
    }

    async fn flush(&mut self) -> Res<()> {
        while let Some(bytes) = self.session.poll_transmit() {
            step("write", self.stream.write_all(&bytes)).await?;
        }
        Ok(())
    }

    async fn next_event(&mut self) -> Res<ClientEvent> {
        loop {
            if let Some(event) = self.session.poll_event().map_err(|e| e.to_string())? {
                return Ok(event);
            }
            let mut buf = BytesMut::with_capacity(64 * 1024);
            if step("read", self.stream.read_buf(&mut buf)).await? == 0 {
                bail!("the server closed the connection");
            }
            self.session.handle_input(buf.freeze());
        }
    }

    async fn call(&mut self, request: Request) -> Res<Response> {
        self.session.send(&request).map_err(|e| e.to_string())?;
        self.flush().await?;
        match self.next_event().await? {
            ClientEvent::Response(response) => Ok(response),
            ClientEvent::Connected(_) => bail!("a second HELLO response"),
        }
    }

    /// A buffer of `size` bytes and an F32 tensor over all of it.
    async fn buffer(&mut self, size: u64) -> Res<RpcTensor> {
        let handle = match self.call(Request::AllocBuffer { device: 0, size }).await? {
            Response::AllocBuffer { remote_ptr, .. } if remote_ptr != 0 => remote_ptr,
            other => bail!("ALLOC_BUFFER: {other:?}"),
        };
        let base = match self.call(Request::BufferGetBase { buffer: handle }).await? {
            Response::BufferBase(base) => base,
            other => bail!("BUFFER_GET_BASE: {other:?}"),
        };
        f32_tensor(1, handle, base, (size / 4) as u32)
    }

    /// Queues a SET_TENSOR of `data` and writes its head and `quarters`/4 of the data only.
    async fn torn_set_tensor(
        &mut self,
        tensor: RpcTensor,
        data: Bytes,
        quarters: usize,
    ) -> Res<()> {
        let header = Box::new(SetTensorHeader {
            tensor,
            cache_flag: 0,
            offset: 0,
        });
        self.session
            .send(&Request::SetTensor { header, data })
            .map_err(|e| e.to_string())?;
        let head = self.session.poll_transmit().ok_or("no SET_TENSOR head")?;
        step("write", self.stream.write_all(&head)).await?;
        let data = self.session.poll_transmit().ok_or("no SET_TENSOR data")?;
        let part = data.len() * quarters / 4;
        step("write", self.stream.write_all(&data[..part])).await
    }

    /// Waits until the server closes the connection (EOF or reset), reading what comes.
    async fn expect_closed(mut self, after: &str) -> Res<()> {
        let mut buf = vec![0u8; 64 * 1024];
        let closed = tokio::time::timeout(CLOSE_WITHIN, async {
            loop {
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        closed.await.map_err(|_| {
            format!("the server kept the connection open {CLOSE_WITHIN:?} after {after}")
        })
    }

    /// Drops the connection with a reset (SO_LINGER 0), as a killed process's kernel may.
    fn reset(self) {
        // A zero linger time never blocks the close (the deprecation's concern): it resets.
        #[allow(deprecated)]
        let _ = self.stream.set_linger(Some(Duration::ZERO));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    KilledMidUpload,
    StalledReader,
    HalfClosedMidUpload,
    Hostile,
    NeverHello,
    TornHeader,
}

const FAULTS: [Fault; 6] = [
    Fault::KilledMidUpload,
    Fault::StalledReader,
    Fault::HalfClosedMidUpload,
    Fault::Hostile,
    Fault::NeverHello,
    Fault::TornHeader,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::KilledMidUpload => "client killed mid-upload",
            Fault::StalledReader => "reader stalled mid-reply",
            Fault::HalfClosedMidUpload => "half-closed mid-upload",
            Fault::Hostile => "hostile message",
            Fault::NeverHello => "connection without HELLO",
            Fault::TornHeader => "header torn off",
        }
    }
}

/// The hostile frames, after HELLO: each must close the connection.
fn hostile_frame(n: u64, tensor: &RpcTensor) -> Bytes {
    let mut out = BytesMut::new();
    match n % 4 {
        0 => {
            // SET_TENSOR claiming 2^62 bytes.
            out.put_u8(Command::SetTensor.id());
            out.put_u64_le(1 << 62);
        }
        1 => {
            // An unknown command.
            out.put_u8(0x7E);
            out.put_u64_le(0);
        }
        2 => {
            // GRAPH_COMPUTE whose node count overruns its 16-byte payload.
            out.put_u8(Command::GraphCompute.id());
            out.put_u64_le(16);
            out.put_u32_le(0);
            out.put_u64_le(0);
            out.put_u32_le(u32::MAX);
        }
        _ => {
            // GET_TENSOR of a tensor in a buffer handle this connection does not own.
            let mut foreign = tensor.clone();
            foreign.buffer ^= 0x5A5A_0000;
            let mut payload = BytesMut::new();
            foreign.encode(&mut payload);
            payload.put_u64_le(0);
            payload.put_u64_le(16);
            out.put_u8(Command::GetTensor.id());
            out.put_u64_le(payload.len() as u64);
            out.put(payload);
        }
    }
    out.freeze()
}

async fn inject(addr: SocketAddr, fault: Fault, n: u64) -> Res<()> {
    match fault {
        Fault::KilledMidUpload => {
            let mut raw = Raw::connect(addr).await?;
            let tensor = raw.buffer(32 * MIB).await?;
            raw.torn_set_tensor(
                tensor,
                blob(u64::MAX, n, (32 * MIB) as usize),
                1 + (n % 3) as usize,
            )
            .await?;
            raw.reset();
        }
        Fault::StalledReader => {
            let mut raw = Raw::connect(addr).await?;
            let tensor = raw.buffer(16 * MIB).await?;
            let request = Request::GetTensor {
                tensor: Box::new(tensor),
                offset: 0,
                size: 16 * MIB,
            };
            raw.session.send(&request).map_err(|e| e.to_string())?;
            raw.flush().await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(raw);
        }
        Fault::HalfClosedMidUpload => {
            let mut raw = Raw::connect(addr).await?;
            let tensor = raw.buffer(8 * MIB).await?;
            raw.torn_set_tensor(tensor, blob(u64::MAX - 1, n, (8 * MIB) as usize), 2)
                .await?;
            step("shutdown", raw.stream.shutdown()).await?;
            raw.expect_closed("a half-close in the middle of SET_TENSOR")
                .await?;
        }
        Fault::Hostile => {
            let mut raw = Raw::connect(addr).await?;
            let tensor = raw.buffer(MIB).await?;
            let frame = hostile_frame(n, &tensor);
            step("write", raw.stream.write_all(&frame)).await?;
            raw.expect_closed(&format!("hostile frame {}", n % 4))
                .await?;
        }
        Fault::NeverHello => {
            let stream = step("connect", TcpStream::connect(addr)).await?;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            drop(stream);
        }
        Fault::TornHeader => {
            let mut raw = Raw::connect(addr).await?;
            // ALLOC_BUFFER's command byte and half its size field.
            let torn = [Command::AllocBuffer.id(), 12, 0, 0, 0];
            step("write", raw.stream.write_all(&torn)).await?;
            raw.reset();
        }
    }
    Ok(())
}

async fn faulter(
    addr: SocketAddr,
    id: usize,
    until: Instant,
    counts: Arc<Mutex<[u64; 6]>>,
) -> Res<()> {
    let mut n = id as u64;
    while Instant::now() < until {
        let index = (n % FAULTS.len() as u64) as usize;
        inject(addr, FAULTS[index], n)
            .await
            .map_err(|e| format!("fault {:?} #{n}: {e}", FAULTS[index]))?;
        counts.lock().map_err(|_| "poisoned")?[index] += 1;
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

// ------------------------------------------------------------------------------ the run

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// Polls the server's holdings until they are back at `baseline` (or `SETTLE` passed).
fn settle(server: &Server, baseline: Holdings, slack: u64) -> Res<Holdings> {
    let started = Instant::now();
    loop {
        let now = Holdings::of(server.pid()).ok_or("the server is gone")?;
        let now = Holdings {
            threads: own_threads(server.pid()),
            ..now
        };
        let back = now.rss <= baseline.rss + slack
            && now.fds == baseline.fds
            && now.threads <= baseline.threads;
        if back || started.elapsed() > SETTLE {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn run(o: &Options) -> Res<()> {
    let mut server = Server::start(o)?;
    let addr = server.addr;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let totals = Arc::new(Totals::default());

    // Warm-up: one cycle of every kind of work, so pools and arenas exist before the baseline.
    runtime.block_on(async {
        let mut client = connect(addr, &totals).await?;
        cycle(&mut client, u64::MAX, 0, o.max_mib, &totals).await?;
        step("close", client.close()).await
    })?;
    std::thread::sleep(Duration::from_secs(1));
    let baseline = Holdings::of(server.pid()).ok_or("the server is gone")?;
    let baseline = Holdings {
        threads: own_threads(server.pid()),
        ..baseline
    };

    println!(
        "soak: shell {}, {} clients + {} fault injectors, {} s, uploads 1-{} MiB, server pid {}",
        o.shell,
        o.clients,
        o.faulters,
        o.seconds,
        o.max_mib,
        server.pid()
    );
    let started = Instant::now();
    let until = started + Duration::from_secs(o.seconds);
    let counts = Arc::new(Mutex::new([0u64; 6]));
    let peak = Arc::new(AtomicU64::new(baseline.rss));
    let pid = server.pid();
    let (errors, survivors) = runtime.block_on(async {
        let sampler = {
            let peak = peak.clone();
            tokio::spawn(async move {
                while let Some(rss) = ggml_rpc_tests::process::rss(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let workers: Vec<_> = (0..o.clients as u64)
            .map(|id| tokio::spawn(worker(addr, id, o.max_mib, until, totals.clone())))
            .collect();
        let faulters: Vec<_> = (0..o.faulters)
            .map(|id| tokio::spawn(faulter(addr, id, until, counts.clone())))
            .collect();
        let mut errors = Vec::new();
        let mut survivors = 0;
        for task in workers {
            match task.await {
                Ok(Ok(_)) => survivors += 1,
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(format!("a worker panicked: {e}")),
            }
        }
        for task in faulters {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(format!("a fault injector panicked: {e}")),
            }
        }
        // A fresh client after everything: still served, still exact.
        match connect(addr, &totals).await {
            Ok(mut client) => {
                if let Err(e) = cycle(&mut client, u64::MAX - 2, 0, 4, &totals).await {
                    errors.push(format!("a fresh client after the run: {e}"));
                }
                let _ = client.close().await;
            }
            Err(e) => errors.push(format!("a fresh client after the run: {e}")),
        }
        sampler.abort();
        (errors, survivors)
    });
    let elapsed = started.elapsed();
    drop(runtime);

    let slack = o.rss_slack_mib * MIB;
    let after = settle(&server, baseline, slack)?;
    let counts = *counts.lock().map_err(|_| "poisoned")?;
    let faults: u64 = counts.iter().sum();
    let closed_on_error = server.log_count("Client connection closed on error");
    let pool_threads = ggml_rpc_tests::process::thread_names(server.pid())
        .iter()
        .filter(|n| n.starts_with(IDLE_POOL_THREADS))
        .count();

    println!(
        "clients: {} workers, {} survived, {} connections, {} cycles verified byte-exact, {:.1} GiB up, {:.1} GiB down in {:.0} s",
        o.clients,
        survivors,
        totals.connections.load(Ordering::Relaxed),
        totals.cycles.load(Ordering::Relaxed),
        mib(totals.uploaded.load(Ordering::Relaxed)) / 1024.0,
        mib(totals.downloaded.load(Ordering::Relaxed)) / 1024.0,
        elapsed.as_secs_f64()
    );
    let by_kind: Vec<String> = FAULTS
        .iter()
        .zip(counts)
        .map(|(fault, count)| format!("{} {count}", fault.name()))
        .collect();
    println!("faults: {faults} injected ({}); server logged {closed_on_error} connections closed on error", by_kind.join(", "));
    println!(
        "server: baseline RSS {:.1} MiB, {} fds, {} threads; peak RSS {:.1} MiB; after: RSS {:.1} MiB, {} fds, {} threads (+ {pool_threads} idle blocking-pool threads)",
        mib(baseline.rss),
        baseline.fds,
        baseline.threads,
        mib(peak.load(Ordering::Relaxed)),
        mib(after.rss),
        after.fds,
        after.threads
    );

    let mut leaks = Vec::new();
    if after.rss > baseline.rss + slack {
        leaks.push(format!(
            "RSS {:.1} MiB above baseline",
            mib(after.rss - baseline.rss)
        ));
    }
    if after.fds != baseline.fds {
        leaks.push(format!("{} fds instead of {}", after.fds, baseline.fds));
    }
    if after.threads > baseline.threads {
        leaks.push(format!(
            "{} threads instead of {}",
            after.threads, baseline.threads
        ));
    }
    println!(
        "leaks: {}",
        if leaks.is_empty() {
            "none".to_string()
        } else {
            leaks.join(", ")
        }
    );
    if !server.alive() {
        bail!("the server died:\n{}", server.log_tail());
    }
    if !errors.is_empty() {
        bail!("{} failures, first: {}", errors.len(), errors[0]);
    }
    if faults == 0 || totals.cycles.load(Ordering::Relaxed) == 0 {
        bail!("the run did no work (faults {faults})");
    }
    if !leaks.is_empty() {
        bail!("the server did not return to its baseline within {SETTLE:?}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse(&args).and_then(|o| run(&o));
    match result {
        Ok(()) => {
            println!("soak: passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("soak: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
