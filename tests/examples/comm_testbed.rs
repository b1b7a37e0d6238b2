//! The comm link on the multi-host test bed (scripts/testbed/): our release `ggml-rpc-server`
//! in hosts 1..N, this program (the client) in the last host, every link shaped by tbf.
//!
//! ```sh
//! cargo build --release -p ggml-rpc-server --example comm_testbed -p ggml-rpc-tests
//! target/release/examples/comm_testbed fault              # the CI fault test (root)
//! target/release/examples/comm_testbed bench [options]    # bus bandwidth, tokens/s
//! ```
//!
//! Run as root outside a test bed, it re-executes itself inside `testbed.sh run` (which
//! always tears down) and there inside the client's namespace (`ip netns exec`); servers are
//! started with `ip netns exec $TESTBED_NS_i`.
//!
//! `fault` (world 4, `--comm-timeout 5`, `--max-clients 1`, 200mbit): a healthy 64 MiB F32
//! all-reduce first; then rank 1's server is killed (SIGKILL), or stopped (SIGSTOP, SIGCONT
//! at the end), half a second after every server logged the start of the next one (no rank
//! can be done by then). Every other rank's connection must close within the comm timeout
//! plus slack of the fault (a following DEVICE_COUNT fails), its server must log why, its memory (RSS) must
//! fall back near where it was before the group allocated, and a fresh connection must be
//! served (with `--max-clients 1` only once the failed one is gone); then a fresh world-4
//! group on the survivors and a replacement (a new server for the killed rank, the resumed
//! one for the stopped rank) all-reduces real data correctly (bit-identical on every rank).
//! Only behaviour is bounded, never speed.
//!
//! `bench`: the all-reduce bus bandwidth, 2 (n − 1) / n × bytes / time, of our ring (ranked
//! link) at every world of `--worlds` for every size of `--sizes` (F32 MiB), and at world 2
//! our pairwise link and llama.cpp b12032+1's own servers (pairwise); rounds interleaved,
//! medians, against the link rate in tensor bytes (F32) and in wire bytes (BF16, half).
//! `--llama-bench`: b12032+1's llama-bench, `-sm tensor -fa 1`, on 2 and 4 of our servers
//! against 1 (tokens/s).
#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "../interop/comm.rs"]
mod comm;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ggml_rpc_client::Client;
use ggml_rpc_tests::process;
use proto_core::ggml::flags;
use proto_core::wire::{CommInitRequest, ProtocolVersion, RpcTensor};

const PORT: u16 = 50052;
/// The reference client's comm port: rank 0's port + 1000.
const COMM_PORT: u16 = PORT + 1000;
const REFERENCE_BIN: &str = "/var/cache/ggml-rpc-peer/b12032/bin";
const MIB: usize = 1 << 20;

type Res<T> = Result<T, String>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(format!($($t)*)) };
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn say(what: impl std::fmt::Display) {
    let start = START.get_or_init(Instant::now);
    eprintln!(
        "[comm_testbed {:>6.1}s] {what}",
        start.elapsed().as_secs_f64()
    );
}

// ------------------------------------------------------------------------------ options

#[derive(Clone, Debug)]
struct Options {
    mode: String,
    rate: String,
    comm_timeout: u64,
    rounds: usize,
    sizes_mib: Vec<usize>,
    worlds: Vec<usize>,
    pairwise: bool,
    reference: bool,
    llama_bench: bool,
    model: Option<PathBuf>,
    cases: Vec<String>,
}

const USAGE: &str = "usage: comm_testbed fault [--rate R] [--cases kill,stop]
       comm_testbed bench [--rate R] [--rounds N] [--sizes MIB,..] [--worlds N,..]
                          [--no-pairwise] [--no-reference] [--llama-bench [--model GGUF]]
                          [--comm-timeout S]";

fn list<T: std::str::FromStr>(s: &str) -> Res<Vec<T>> {
    s.split(',')
        .map(|x| x.trim().parse().map_err(|_| format!("bad list item '{x}'")))
        .collect()
}

fn parse(args: &[String]) -> Res<Options> {
    let mode = args.first().cloned().unwrap_or_default();
    let fault = match mode.as_str() {
        "fault" => true,
        "bench" => false,
        _ => bail!("{USAGE}"),
    };
    let mut o = Options {
        mode,
        rate: "200mbit".into(),
        comm_timeout: if fault { 5 } else { 300 },
        rounds: 3,
        sizes_mib: vec![64, 256],
        worlds: vec![2, 3, 4, 8],
        pairwise: true,
        reference: true,
        llama_bench: false,
        model: None,
        cases: vec!["kill".into(), "stop".into()],
    };
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--rate" => o.rate = value()?,
            "--comm-timeout" => o.comm_timeout = value()?.parse().map_err(|_| "bad timeout")?,
            "--rounds" => o.rounds = value()?.parse().map_err(|_| "bad rounds")?,
            "--sizes" => o.sizes_mib = list(&value()?)?,
            "--worlds" => o.worlds = list(&value()?)?,
            "--cases" => o.cases = list(&value()?)?,
            "--model" => o.model = Some(value()?.into()),
            "--no-pairwise" => o.pairwise = false,
            "--no-reference" => o.reference = false,
            "--llama-bench" => o.llama_bench = true,
            _ => bail!("unknown option {a}\n{USAGE}"),
        }
    }
    Ok(o)
}

impl Options {
    /// Test-bed hosts: the servers, then one for the client.
    fn hosts(&self) -> usize {
        if self.mode == "fault" {
            return 5;
        }
        let mut max = self.worlds.iter().copied().max().unwrap_or(2).max(2);
        if self.llama_bench {
            max = max.max(4);
        }
        max + 1
    }
}

// ------------------------------------------------------------------------------ test bed

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn env_var(name: &str) -> Res<String> {
    std::env::var(name).map_err(|_| format!("${name} is not set (not inside a test bed?)"))
}

fn host_ns(i: usize) -> Res<String> {
    env_var(&format!("TESTBED_NS_{i}"))
}

fn host_addr(i: usize) -> Res<String> {
    env_var(&format!("TESTBED_ADDR_{i}"))
}

/// Outside a test bed: `testbed.sh run` this program; inside, but not yet in the client's
/// host: `ip netns exec` into it. `None`: we are where the work runs.
fn reexec(o: &Options, args: &[String]) -> Res<Option<ExitCode>> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = if std::env::var_os("TESTBED").is_none() {
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| e.to_string())?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            bail!("must run as root (network namespaces of the test bed); this test never skips");
        }
        say(format!(
            "test bed: {} hosts at {}, via scripts/testbed/testbed.sh run",
            o.hosts(),
            o.rate
        ));
        Command::new(repo_root().join("scripts/testbed/testbed.sh"))
            .args(["run", "--hosts", &o.hosts().to_string(), "--rate", &o.rate])
            .arg("--")
            .arg(&me)
            .args(args)
            .status()
    } else if std::env::var_os("COMM_TESTBED_CLIENT").is_none() {
        let hosts: usize = env_var("TESTBED_HOSTS")?
            .parse()
            .map_err(|_| "TESTBED_HOSTS")?;
        if hosts < o.hosts() {
            bail!("the test bed has {hosts} hosts, {} needed", o.hosts());
        }
        Command::new("ip")
            .args(["netns", "exec", &host_ns(hosts)?])
            .arg(&me)
            .args(args)
            .env("COMM_TESTBED_CLIENT", "1")
            .status()
    } else {
        return Ok(None);
    };
    let status = status.map_err(|e| format!("re-executing: {e}"))?;
    Ok(Some(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8,
    )))
}

// ------------------------------------------------------------------------------ servers

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    /// Ours, ranked link (the CPU ring).
    Ring,
    /// Ours, `--comm-link pairwise`.
    Pairwise,
    /// b12032+1's ggml-rpc-server (ranked set-up, votes no: pairwise).
    Reference,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ring => "ours, ring (ranked)",
            Kind::Pairwise => "ours, pairwise",
            Kind::Reference => "b12032+1, pairwise",
        }
    }
}

struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

fn our_server_bin() -> Res<PathBuf> {
    if let Ok(p) = std::env::var("GGML_RPC_OUR_SERVER") {
        return Ok(p.into());
    }
    // target/release/examples/comm_testbed → target/release/ggml-rpc-server
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = me
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("ggml-rpc-server"))
        .ok_or("no target dir")?;
    if !bin.is_file() {
        bail!(
            "{} missing: cargo build --release -p ggml-rpc-server",
            bin.display()
        );
    }
    Ok(bin)
}

fn log_dir() -> PathBuf {
    let dir = std::env::var("TESTBED_STATE")
        .map(|s| PathBuf::from(s).join("logs"))
        .unwrap_or_else(|_| std::env::temp_dir());
    let _ = std::fs::create_dir_all(&dir);
    dir
}

impl Server {
    /// Starts a server in test-bed host `host`, waits until it accepts connections.
    fn start(kind: Kind, host: usize, comm_timeout: u64, extra: &[&str], tag: &str) -> Res<Server> {
        let addr_s = host_addr(host)?;
        let log = log_dir().join(format!("{tag}-h{host}.log"));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &host_ns(host)?]);
        let port = PORT.to_string();
        match kind {
            Kind::Ring | Kind::Pairwise => {
                cmd.arg(our_server_bin()?);
                cmd.args([
                    "--protocol",
                    "8.0.1",
                    "-t",
                    "1",
                    "-H",
                    &addr_s,
                    "--insecure-plain",
                    "-p",
                    &port,
                    "-v",
                ]);
                cmd.args(["--comm-timeout", &comm_timeout.to_string()]);
                if kind == Kind::Pairwise {
                    cmd.args(["--comm-link", "pairwise"]);
                }
            }
            Kind::Reference => {
                cmd.env("GGML_RPC_NO_RDMA", "1");
                cmd.arg(Path::new(REFERENCE_BIN).join("ggml-rpc-server"));
                cmd.args(["-d", "CPU", "-t", "1", "-H", &addr_s, "-p", &port]);
            }
        }
        cmd.args(extra);
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null()).stdout(file).stderr(err);
        let child = cmd.spawn().map_err(|e| format!("spawning a server: {e}"))?;
        let addr: SocketAddr = format!("{addr_s}:{PORT}").parse().map_err(|_| "address")?;
        let mut server = Server { child, addr, log };
        server.wait_listening(Duration::from_secs(30))?;
        Ok(server)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_listening(&mut self, within: Duration) -> Res<()> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "server {} exited ({status}) at start:\n{}",
                    self.addr,
                    self.log_text()
                );
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(500)).is_ok() {
                return Ok(());
            }
            if started.elapsed() > within {
                bail!("server {} does not listen after {within:?}", self.addr);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Resident memory in bytes.
    fn rss(&self) -> Res<u64> {
        process::rss(self.pid()).ok_or_else(|| format!("no VmRSS for server {}", self.addr))
    }

    /// CPU time (user + system) so far.
    fn cpu(&self) -> Duration {
        process::cpu_time(self.pid())
    }

    fn signal(&self, sig: &str) -> Res<()> {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .map_err(|e| e.to_string())?
            .success();
        if !ok {
            bail!("kill -{sig} {} failed", self.pid());
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.signal("CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------------------------ ranks

/// One rank: a connection, a buffer and an F32 tensor of `n` elements.
struct Member {
    client: Client,
    tensor: RpcTensor,
    buffer: u64,
}

const STEP: Duration = Duration::from_secs(120);

async fn step<T, E: std::fmt::Display>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Res<T> {
    match tokio::time::timeout(STEP, fut).await {
        Err(_) => Err(format!("{what}: no answer within {STEP:?}")),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Ok(Ok(v)) => Ok(v),
    }
}

async fn connect(addr: SocketAddr) -> Res<Client> {
    step(
        &format!("{addr}: HELLO"),
        Client::connect(addr, ProtocolVersion::V8_0_1),
    )
    .await
}

/// A rank of `n` elements holding `partial`, or (None) every byte `0x3c` (BUFFER_CLEAR: no
/// data crosses the client's link).
async fn member(mut client: Client, n: usize, partial: Option<&[f32]>) -> Res<Member> {
    let what = format!("{}", client.peer_addr());
    let buf = step(
        &format!("{what}: ALLOC_BUFFER"),
        client.alloc_buffer(0, (n * 4) as u64),
    )
    .await?
    .ok_or(format!("{what}: allocation of {n} floats refused"))?;
    let base = step(
        &format!("{what}: BUFFER_GET_BASE"),
        client.buffer_base(buf.handle),
    )
    .await?;
    let mut tensor =
        RpcTensor::contiguous(0x7000 + n as u64, 0, [n as u32, 1, 1, 1]).ok_or("tensor shape")?;
    tensor.buffer = buf.handle;
    tensor.data = base;
    tensor.flags = flags::COMPUTE;
    tensor.set_name("partial");
    match partial {
        Some(values) => {
            step(
                &format!("{what}: SET_TENSOR"),
                client.set_tensor(&tensor, 0, comm::to_bytes(values)),
            )
            .await?
        }
        None => {
            step(
                &format!("{what}: BUFFER_CLEAR"),
                client.buffer_clear(buf.handle, 0x3c),
            )
            .await?
        }
    }
    Ok(Member {
        client,
        tensor,
        buffer: buf.handle,
    })
}

/// COMM_INIT on every rank at once (rank 0 on `servers[0]`); every answer must be ok.
async fn comm_init(clients: Vec<Client>, rank0: SocketAddr) -> Res<Vec<Client>> {
    let world = clients.len() as u32;
    let host = rank0.ip().to_string();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(r, mut client)| {
            let request: CommInitRequest = comm::comm_init(
                r as u32,
                world,
                u32::from(COMM_PORT),
                if r == 0 { "" } else { &host },
            );
            tokio::spawn(async move {
                let ok = step(&format!("rank {r}: COMM_INIT"), client.comm_init(&request)).await;
                (client, ok)
            })
        })
        .collect();
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (r, task) in tasks.into_iter().enumerate() {
        let (client, ok) = task.await.map_err(|e| e.to_string())?;
        match ok {
            Ok(true) => {}
            Ok(false) => errors.push(format!("rank {r}: COMM_INIT answered ok = 0")),
            Err(e) => errors.push(e),
        }
        out.push(client);
    }
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    Ok(out)
}

/// COMM_ALLREDUCE on every rank (no reply).
async fn allreduce_send(group: &mut [Member]) -> Res<()> {
    for (r, m) in group.iter_mut().enumerate() {
        step(
            &format!("rank {r}: COMM_ALLREDUCE"),
            m.client.comm_allreduce(0, &m.tensor),
        )
        .await?;
    }
    Ok(())
}

/// One all-reduce on every rank, timed until every rank answered the next request.
async fn allreduce_timed(group: &mut [Member]) -> Res<Duration> {
    let started = Instant::now();
    allreduce_send(group).await?;
    for (r, m) in group.iter_mut().enumerate() {
        step(
            &format!("rank {r}: DEVICE_COUNT after COMM_ALLREDUCE"),
            m.client.device_count(),
        )
        .await?;
    }
    Ok(started.elapsed())
}

async fn free_all(group: Vec<Member>) -> Res<Vec<Client>> {
    let mut out = Vec::new();
    for (r, mut m) in group.into_iter().enumerate() {
        step(
            &format!("rank {r}: FREE_BUFFER"),
            m.client.free_buffer(m.buffer),
        )
        .await?;
        out.push(m.client);
    }
    Ok(out)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

// ------------------------------------------------------------------------------ fault

const FAULT_WORLD: usize = 4;
const VICTIM: usize = 1;
const FAULT_ELEMENTS: usize = 16 * MIB; // 64 MiB of F32
const CHECK_ELEMENTS: usize = MIB; // the fresh group's all-reduce of real data
/// Slack on top of the comm timeout for a failure to show (generous: CI machines are slow;
/// tight enough to catch a survivor that waits out several timeouts in a row).
const SLACK: Duration = Duration::from_secs(8);
/// RSS above the baseline that counts as freed (the group held 64 MiB plus the all-reduce's
/// scratch on each server).
const RSS_FREED_MARGIN: u64 = 24 * MIB as u64;

fn fault(o: &Options) -> Res<()> {
    let rt = runtime();
    for case in &o.cases {
        let started = Instant::now();
        match case.as_str() {
            "kill" | "stop" => rt.block_on(fault_case(o, case))?,
            _ => bail!("unknown case {case} (kill, stop)"),
        }
        say(format!(
            "case {case}: passed in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    Ok(())
}

async fn fault_case(o: &Options, case: &str) -> Res<()> {
    let timeout = Duration::from_secs(o.comm_timeout);
    let extra = ["--max-clients", "1"];
    let tag = format!("fault-{case}");
    let mut servers: Vec<Server> = (1..=FAULT_WORLD)
        .map(|h| Server::start(Kind::Ring, h, o.comm_timeout, &extra, &tag))
        .collect::<Res<_>>()?;
    let baseline: Vec<u64> = servers.iter().map(Server::rss).collect::<Res<_>>()?;
    say(format!(
        "{case}: world {FAULT_WORLD} at {}, --comm-timeout {}; baseline RSS {:?} MiB",
        o.rate,
        o.comm_timeout,
        baseline.iter().map(|b| b / MIB as u64).collect::<Vec<_>>()
    ));

    // The group, and a healthy all-reduce.
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(connect(s.addr).await?);
    }
    let clients = comm_init(clients, servers[0].addr).await?;
    let mut group = Vec::new();
    for c in clients {
        group.push(member(c, FAULT_ELEMENTS, None).await?);
    }
    let healthy = allreduce_timed(&mut group).await?;
    say(format!(
        "{case}: healthy 64 MiB all-reduce took {healthy:.2?}"
    ));
    for (i, s) in servers.iter().enumerate() {
        let rss = s.rss()?;
        if rss < baseline[i] + FAULT_ELEMENTS as u64 * 4 {
            bail!("server {i}: RSS {rss} does not show the 64 MiB the group holds");
        }
    }

    // The fault, once every rank's server has begun the next all-reduce (its debug log line),
    // plus half a second: no rank can be done by then (each link carries 50 MB of BF16, 2 s at
    // the full 200mbit), and rank 1 has sent part of its share.
    let began = Instant::now();
    allreduce_send(&mut group).await?;
    let marker = format!("COMM_ALLREDUCE device=0 elements={FAULT_ELEMENTS}");
    wait_for(Duration::from_secs(30), || {
        servers
            .iter()
            .all(|s| s.log_text().matches(&marker).count() >= 2)
            .then_some(())
    })
    .ok_or(format!(
        "{case}: not every server logged the start of the second all-reduce"
    ))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let victim_pid = servers[VICTIM].pid();
    match case {
        "kill" => servers[VICTIM].signal("KILL")?,
        _ => servers[VICTIM].signal("STOP")?,
    }
    say(format!(
        "{case}: rank {VICTIM}'s server (pid {victim_pid}) sent SIG{} {:.2?} into the all-reduce",
        case.to_uppercase(),
        began.elapsed()
    ));
    // bounds count from the fault
    let started = Instant::now();
    let bound = timeout + SLACK;
    let mut victim_member = None;
    for (r, mut m) in group.into_iter().enumerate() {
        if r == VICTIM {
            victim_member = Some(m);
            continue;
        }
        let left = bound.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, m.client.device_count()).await {
            Err(_) => bail!(
                "{case}: rank {r}: the connection is still open {:?} after the fault \
                 (bound: comm timeout {timeout:?} + {SLACK:?})",
                started.elapsed()
            ),
            Ok(Ok(_)) => bail!("{case}: rank {r}: the all-reduce without rank {VICTIM} succeeded"),
            Ok(Err(e)) => say(format!(
                "{case}: rank {r}: connection closed {:.2} s after the fault ({e})",
                started.elapsed().as_secs_f64()
            )),
        }
    }
    let took = started.elapsed();

    // Why, in every survivor's log.
    for (r, s) in servers.iter().enumerate() {
        if r == VICTIM {
            continue;
        }
        let log = wait_for(Duration::from_secs(10), || {
            let text = s.log_text();
            text.contains("Client connection closed on error")
                .then_some(text)
        })
        .ok_or(format!(
            "{case}: rank {r}: the log {} has no 'Client connection closed on error'",
            s.log.display()
        ))?;
        let line = log
            .lines()
            .rfind(|l| l.contains("Client connection closed on error"))
            .unwrap_or_default();
        if !line.contains("comm") {
            bail!("{case}: rank {r}: the closing log line names no comm error: {line}");
        }
        say(format!("{case}: rank {r} log: {}", line.trim()));
    }

    // Freed: the memory, the client slot (--max-clients 1), the comm ports.
    for (r, s) in servers.iter().enumerate() {
        if r == VICTIM {
            continue;
        }
        let limit = baseline[r] + RSS_FREED_MARGIN;
        let rss = wait_for(Duration::from_secs(15), || {
            s.rss().ok().filter(|&v| v <= limit)
        })
        .ok_or(format!(
            "{case}: rank {r}: RSS {} MiB stays above baseline {} MiB + {} MiB",
            s.rss().unwrap_or(0) / MIB as u64,
            baseline[r] / MIB as u64,
            RSS_FREED_MARGIN / MIB as u64
        ))?;
        say(format!(
            "{case}: rank {r}: RSS back to {} MiB (baseline {} MiB)",
            rss / MIB as u64,
            baseline[r] / MIB as u64
        ));
    }
    if case == "stop" {
        servers[VICTIM].signal("CONT")?;
        // the resumed rank finds its peers gone: its own connection closes too, within the
        // timeout (its deadline passed while it was stopped)
        let mut m = victim_member.take().ok_or("victim")?;
        match tokio::time::timeout(bound, m.client.device_count()).await {
            Ok(Err(_)) => say(format!(
                "{case}: rank {VICTIM}: resumed, its connection closed"
            )),
            Ok(Ok(_)) => bail!("{case}: rank {VICTIM}: resumed and its all-reduce succeeded"),
            Err(_) => bail!("{case}: rank {VICTIM}: resumed, still open after {bound:?}"),
        }
    } else {
        drop(victim_member);
        let mut old = servers.remove(VICTIM);
        let status = old.child.wait().map_err(|e| e.to_string())?;
        say(format!(
            "{case}: rank {VICTIM}'s server ended: {status}; a replacement starts"
        ));
        servers.insert(
            VICTIM,
            Server::start(
                Kind::Ring,
                VICTIM + 1,
                o.comm_timeout,
                &extra,
                &format!("{tag}-replacement"),
            )?,
        );
    }

    // A fresh group on the same servers (and ports): real data, correct and bit-identical.
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(fresh_connection(s.addr).await?);
    }
    let clients = comm_init(clients, servers[0].addr).await?;
    let partials: Vec<Vec<f32>> = (0..FAULT_WORLD)
        .map(|r| comm::floats(CHECK_ELEMENTS, 7 + r as u32))
        .collect();
    let mut group = Vec::new();
    for (c, p) in clients.into_iter().zip(&partials) {
        group.push(member(c, CHECK_ELEMENTS, Some(p)).await?);
    }
    allreduce_timed(&mut group).await?;
    let mut got = Vec::new();
    for (r, m) in group.iter_mut().enumerate() {
        let bytes = step(
            &format!("rank {r}: GET_TENSOR"),
            m.client
                .get_tensor(&m.tensor, 0, (CHECK_ELEMENTS * 4) as u64),
        )
        .await?;
        got.push(comm::from_bytes(&bytes));
    }
    check_sums(&got, &partials)?;
    free_all(group).await?;
    say(format!(
        "{case}: survivors failed within {took:.2?} (bound {bound:?}), logged it, freed their \
         memory and slot; a fresh world {FAULT_WORLD} with the {} rank all-reduced correctly",
        if case == "kill" {
            "replacement"
        } else {
            "resumed"
        }
    ));
    Ok(())
}

/// A new connection; with `--max-clients 1` it is served once the failed one is gone.
async fn fresh_connection(addr: SocketAddr) -> Res<Client> {
    let started = Instant::now();
    loop {
        let attempt = async {
            let mut c = Client::connect(addr, ProtocolVersion::V8_0_1).await?;
            c.device_count().await?;
            Ok::<_, ggml_rpc_client::ClientError>(c)
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(c)) => return Ok(c),
            other => {
                if started.elapsed() > Duration::from_secs(15) {
                    bail!(
                        "{addr}: no fresh connection served within 15 s: {:?}",
                        other.err()
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn wait_for<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if started.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every rank the same bits, within bf16 rounding of the exact sum.
fn check_sums(got: &[Vec<f32>], partials: &[Vec<f32>]) -> Res<()> {
    let n = partials[0].len();
    for (r, values) in got.iter().enumerate() {
        if let Some(i) = (0..n).find(|&i| values[i].to_bits() != got[0][i].to_bits()) {
            bail!(
                "rank {r} element {i} is {} but rank 0 has {}",
                values[i],
                got[0][i]
            );
        }
    }
    let world = partials.len() as f64;
    for i in 0..n {
        let exact: f64 = partials.iter().map(|p| f64::from(p[i])).sum();
        let magnitude: f64 = partials.iter().map(|p| f64::from(p[i]).abs()).sum();
        if (f64::from(got[0][i]) - exact).abs() > magnitude * world / 128.0 {
            bail!(
                "element {i} is {} but the partials sum to {exact}",
                got[0][i]
            );
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------ bench

/// Bits per second of a tc rate ("200mbit", "1gbit", "500kbit").
fn rate_bps(rate: &str) -> Option<f64> {
    let r = rate.to_ascii_lowercase();
    for (suffix, mult) in [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)] {
        if let Some(v) = r.strip_suffix(suffix) {
            return v.parse::<f64>().ok().map(|v| v * mult);
        }
    }
    None
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Config {
    kind_order: u8,
    world: usize,
    size_mib: usize,
}

fn kind_of(order: u8) -> Kind {
    match order {
        0 => Kind::Ring,
        1 => Kind::Pairwise,
        _ => Kind::Reference,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn bench(o: &Options) -> Res<()> {
    let rate = env_var("TESTBED_RATE").unwrap_or_else(|_| o.rate.clone());
    let link = rate_bps(&rate).ok_or(format!("cannot read the rate {rate}"))? / 8.0; // bytes/s
    let rt = runtime();
    let mut groups: Vec<(Kind, usize)> = o.worlds.iter().map(|&w| (Kind::Ring, w)).collect();
    if o.pairwise {
        groups.push((Kind::Pairwise, 2));
    }
    if o.reference {
        groups.push((Kind::Reference, 2));
    }
    let mut times: BTreeMap<Config, Vec<f64>> = BTreeMap::new();
    let mut cores: BTreeMap<Config, Vec<f64>> = BTreeMap::new();
    for round in 1..=o.rounds {
        for &(kind, world) in &groups {
            say(format!(
                "round {round}/{}: {} world {world}",
                o.rounds,
                kind.name()
            ));
            let servers: Vec<Server> = (1..=world)
                .map(|h| {
                    Server::start(
                        kind,
                        h,
                        o.comm_timeout,
                        &[],
                        &format!("bench-{kind:?}-{world}"),
                    )
                })
                .collect::<Res<_>>()?;
            let result: Res<()> = rt.block_on(async {
                let mut clients = Vec::new();
                for s in &servers {
                    clients.push(connect(s.addr).await?);
                }
                let mut clients = comm_init(clients, servers[0].addr).await?;
                for &size in &o.sizes_mib {
                    let n = size * MIB / 4;
                    let mut group = Vec::new();
                    for c in clients {
                        group.push(member(c, n, None).await?);
                    }
                    // a first all-reduce of this size, untimed: the links' scratch and the
                    // TCP windows are then as in a long run (llama.cpp repeats its sizes)
                    allreduce_timed(&mut group).await?;
                    let cpu0: Duration = servers.iter().map(Server::cpu).sum();
                    let t = allreduce_timed(&mut group).await?;
                    let cpu: Duration = servers.iter().map(Server::cpu).sum::<Duration>() - cpu0;
                    let key = Config {
                        kind_order: kind as u8,
                        world,
                        size_mib: size,
                    };
                    let bus = 2.0 * (world as f64 - 1.0) / world as f64 * (size * MIB) as f64
                        / t.as_secs_f64();
                    say(format!(
                        "   {size} MiB: {:.3} s, bus {:.1} MB/s (tensor bytes) = {:.0} % of the link; \
                         servers' CPU {:.2} cores",
                        t.as_secs_f64(),
                        bus / 1e6,
                        bus / link * 100.0,
                        cpu.as_secs_f64() / t.as_secs_f64()
                    ));
                    times.entry(key).or_default().push(t.as_secs_f64());
                    cores
                        .entry(key)
                        .or_default()
                        .push(cpu.as_secs_f64() / t.as_secs_f64());
                    clients = free_all(group).await?;
                }
                Ok(())
            });
            if let Err(e) = result {
                for s in &servers {
                    eprintln!("--- {}:\n{}", s.log.display(), tail(&s.log_text(), 15));
                }
                bail!("{} world {world}: {e}", kind.name());
            }
        }
    }
    println!();
    println!(
        "all-reduce bus bandwidth, 2(n-1)/n x bytes / time, medians of {} round(s); link {rate} = {:.1} MB/s",
        o.rounds,
        link / 1e6
    );
    println!(
        "{:<22} {:>5} {:>8} {:>9} {:>12} {:>8} {:>12} {:>8} {:>6}",
        "link",
        "world",
        "MiB F32",
        "time s",
        "bus MB/s F32",
        "% link",
        "wire MB/s",
        "% link",
        "cores"
    );
    for (key, t) in &times {
        let kind = kind_of(key.kind_order);
        let t = median(t.clone());
        let bus =
            2.0 * (key.world as f64 - 1.0) / key.world as f64 * (key.size_mib * MIB) as f64 / t;
        // ≥ 32768 elements: bf16 on the wire on every link measured here
        let wire = bus / 2.0;
        println!(
            "{:<22} {:>5} {:>8} {:>9.3} {:>12.1} {:>7.0}% {:>12.1} {:>7.0}% {:>6.2}",
            kind.name(),
            key.world,
            key.size_mib,
            t,
            bus / 1e6,
            bus / link * 100.0,
            wire / 1e6,
            wire / link * 100.0,
            median(cores[key].clone())
        );
    }
    // world-2 ratios
    for &size in &o.sizes_mib {
        let get = |order: u8| {
            times
                .get(&Config {
                    kind_order: order,
                    world: 2,
                    size_mib: size,
                })
                .map(|t| median(t.clone()))
        };
        if let Some(ring) = get(0) {
            for order in [1u8, 2] {
                if let Some(other) = get(order) {
                    println!(
                        "world 2, {size} MiB: ring is {:.2}x as fast as {}",
                        other / ring,
                        kind_of(order).name()
                    );
                }
            }
        }
    }
    if o.llama_bench {
        llama_bench(o)?;
    }
    Ok(())
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// b12032+1's llama-bench on 1, 2 and 4 of our servers (`-sm tensor -fa 1` on 2 and 4).
fn llama_bench(o: &Options) -> Res<()> {
    let model = o
        .model
        .clone()
        .unwrap_or_else(|| repo_root().join("target/conformance/models/tp-llama-q8_0.gguf"));
    if !model.is_file() {
        bail!(
            "{} missing: scripts/conformance/make-models.py --preset tp --types q8_0 (see tp.sh)",
            model.display()
        );
    }
    let bin = Path::new(REFERENCE_BIN).join("llama-bench");
    let mut rows = Vec::new();
    for world in [1usize, 2, 4] {
        let servers: Vec<Server> = (1..=world)
            .map(|h| {
                Server::start(
                    Kind::Ring,
                    h,
                    o.comm_timeout,
                    &[],
                    &format!("llama-bench-{world}"),
                )
            })
            .collect::<Res<_>>()?;
        let endpoints: Vec<String> = servers.iter().map(|s| s.addr.to_string()).collect();
        let split = if world == 1 { "layer" } else { "tensor" };
        say(format!("llama-bench on {world} server(s), -sm {split}"));
        let out = Command::new(&bin)
            .arg("-m")
            .arg(&model)
            .args([
                "--rpc",
                &endpoints.join(","),
                "-ngl",
                "99",
                "-sm",
                split,
                "-fa",
                "1",
            ])
            .args(["-p", "128", "-n", "32", "-r", "3", "-t", "1", "-o", "jsonl"])
            .env("GGML_RPC_NO_RDMA", "1")
            .output()
            .map_err(|e| format!("llama-bench: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            bail!(
                "llama-bench on {world} server(s) failed: {}\n{}",
                out.status,
                tail(&String::from_utf8_lossy(&out.stderr), 20)
            );
        }
        for line in stdout.lines().filter(|l| l.trim_start().starts_with('{')) {
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("llama-bench output: {e}"))?;
            let int = |k: &str| v[k].as_u64().unwrap_or(0);
            let test = if int("n_prompt") > 0 {
                format!("pp{}", int("n_prompt"))
            } else {
                format!("tg{}", int("n_gen"))
            };
            let ts = v["avg_ts"].as_f64().unwrap_or(0.0);
            let sd = v["stddev_ts"].as_f64().unwrap_or(0.0);
            rows.push((world, test, ts, sd));
        }
        let comm = servers
            .iter()
            .map(|s| s.log_text().matches("COMM_ALLREDUCE").count())
            .sum::<usize>();
        say(format!(
            "   {world} server(s): {comm} COMM_ALLREDUCE logged"
        ));
        if world > 1 && comm == 0 {
            bail!("llama-bench on {world} servers ran no COMM_ALLREDUCE");
        }
    }
    println!();
    println!(
        "llama-bench (b12032+1), {}, -fa 1, -t 1, link {}:",
        model.display(),
        o.rate
    );
    println!(
        "{:>8} {:>8} {:>10} {:>8} {:>8}",
        "servers", "test", "tokens/s", "stddev", "vs 1"
    );
    for (world, test, ts, sd) in &rows {
        let one = rows.iter().find(|r| r.0 == 1 && &r.1 == test).map(|r| r.2);
        let ratio = match one {
            Some(a) if a > 0.0 => format!("{:.2}x", ts / a),
            _ => String::new(),
        };
        println!("{world:>8} {test:>8} {ts:>10.1} {sd:>8.1} {ratio:>8}");
    }
    Ok(())
}

// ------------------------------------------------------------------------------ main

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match reexec(&o, &args) {
        Ok(Some(code)) => return code,
        Ok(None) => {}
        Err(e) => {
            eprintln!("[comm_testbed] FAIL: {e}");
            return ExitCode::FAILURE;
        }
    }
    let result = match o.mode.as_str() {
        "fault" => fault(&o),
        _ => bench(&o),
    };
    match result {
        Ok(()) => {
            say("done");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("[comm_testbed] FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}
