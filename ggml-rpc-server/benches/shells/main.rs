//! Benchmark of every shell of `ggml-rpc-server` against the reference llama.cpp server, in one
//! run (a measurement, not a timed test):
//!
//! ```sh
//! cargo bench -p ggml-rpc-server --bench shells
//! ```
//!
//! Each server runs as a child process (ours: the release-built `ggml-rpc-server --shell NAME`;
//! the reference: `$GGML_RPC_REFERENCE_SERVER`, default
//! `/var/cache/ggml-rpc-peer/b11434/bin/ggml-rpc-server`, protocol 7) on a loopback port, and the
//! client is this process (`ggml_rpc_client::Client`, which speaks 7 and 8; the small-command
//! rates use the lean generator of `load.rs`, a mio loop that costs the client little per round
//! trip, so that the rate shows the server rather than the client). Measured per server:
//!
//! * SET and GET of one 256 MiB tensor (GB/s, best of a few runs);
//! * small-command round trips per second (GET_ALIGNMENT, one client);
//! * 16 concurrent clients each doing a 64 MiB SET then GET (aggregate GB/s of both directions);
//! * 16 concurrent clients' small-command rate (aggregate round trips per second);
//! * the server's CPU time (user + system, all threads) per GB moved, over the 256 MiB
//!   transfers and over the 16-client ones: what a shell costs beyond the throughput the
//!   kernel's loopback path allows;
//! * the server's peak RSS (VmHWM of a fresh process) while it receives a 1 GiB SET_TENSOR.
//!
//! The reference serves one client at a time, so its "16 clients" figures are its serial rate.
//! Knobs: `BENCH_SHELLS` (comma-separated, default: all of this build), `BENCH_SECONDS` (length
//! of each rate measurement, default 2), `BENCH_REPEAT` (runs of each 256 MiB transfer, default
//! 5: one takes 50-80 ms, and single runs of one server spread 2-5.7 GB/s with the machine's
//! load; the 16-client transfer takes the best of as many), `BENCH_ROUNDS` (rounds over all the
//! servers, interleaved, every other round in reverse order, default 1; the table gives
//! medians and ranges, and from 10 rounds on a 95 % bootstrap confidence interval of each
//! median ratio), `BENCH_LOAD_THREADS` (generator
//! threads of the small-command rates, default 1), `BENCH_SKIP_REFERENCE=1`,
//! `BENCH_ONLY` (comma-separated subset of `big,rtt,multi,multirtt,rss`), `BENCH_BASELINE`
//! (another build of `ggml-rpc-server`, e.g. of an earlier commit: each shell of it joins the
//! rounds as `base-NAME`, and the table gets a "vs baseline" column, this build's shell against
//! the same shell of the baseline: a before/after comparison in one run), `BENCH_PIN`
//! (`split`: every server on the last CPU and this process on the first; `same`: both on the
//! first; unset: wherever the scheduler puts them). A one-client round trip is mostly
//! wake-ups, much cheaper when the client and the server share a CPU than across CPUs, and
//! unpinned rounds switch between the two as the scheduler places the threads: pinned, its
//! rate is a stable figure (README, "Shells against the reference server"). Pinning applies to
//! every measurement (with `split` a server has one CPU for its 16 clients).

mod load;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ggml_rpc_client::Client;
use proto_core::wire::RpcTensor;

const SERVER: &str = env!("CARGO_BIN_EXE_ggml-rpc-server");
const DEFAULT_REFERENCE: &str = "/var/cache/ggml-rpc-peer/b11434/bin/ggml-rpc-server";
const MIB: usize = 1 << 20;
const BIG: usize = 256 * MIB;
const CLIENTS: usize = 16;
const PER_CLIENT: usize = 64 * MIB;
const HUGE: usize = 1024 * MIB;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Default, Clone)]
struct Row {
    name: String,
    set_gbps: f64,
    get_gbps: f64,
    rtt_per_s: f64,
    multi_gbps: f64,
    /// Server CPU milliseconds per GB moved by the 256 MiB SETs and GETs.
    big_cpu_ms_per_gb: f64,
    /// Server CPU milliseconds per GB moved by the 16-client transfers.
    multi_cpu_ms_per_gb: f64,
    multi_rtt_per_s: f64,
    multi_rtt_cpu_us: f64,
    peak_rss_mib: f64,
}

fn main() {
    let seconds: f64 = env_or("BENCH_SECONDS", 2.0);
    let repeat: usize = env_or("BENCH_REPEAT", 5);
    let rounds_wanted: usize = env_or("BENCH_ROUNDS", 1);
    let shells: Vec<String> = std::env::var("BENCH_SHELLS")
        .unwrap_or_else(|_| "tokio,uring,smol".into())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let reference =
        std::env::var("GGML_RPC_REFERENCE_SERVER").unwrap_or_else(|_| DEFAULT_REFERENCE.to_owned());
    let skip_reference = std::env::var("BENCH_SKIP_REFERENCE").is_ok_and(|v| v == "1");

    let baseline = std::env::var("BENCH_BASELINE").ok();
    let mut targets: Vec<(String, Vec<String>, String)> = Vec::new();
    if !skip_reference && std::path::Path::new(&reference).exists() {
        targets.push(("reference".into(), Vec::new(), reference.clone()));
    } else if !skip_reference {
        eprintln!("reference server {reference} not found; measuring ours only");
    }
    for shell in &shells {
        let args = vec!["--shell".into(), shell.clone(), "-t".into(), "1".into()];
        targets.push((shell.clone(), args.clone(), SERVER.to_owned()));
        if let Some(baseline) = &baseline {
            targets.push((format!("base-{shell}"), args, baseline.clone()));
        }
    }

    // Before any thread starts, so that every thread of this process inherits the CPU.
    if let Some(cpus) = &pinning().client {
        let pinned = Command::new("taskset")
            .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
            .stdout(Stdio::null())
            .status();
        if !pinned.is_ok_and(|status| status.success()) {
            eprintln!("BENCH_PIN: cannot pin this process to CPU {cpus} (taskset)");
            std::process::exit(2);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let big = fill(BIG, 3);
    let per_client = fill(PER_CLIENT, 7);
    let huge = fill(HUGE, 11);

    // Rounds interleave the servers, so a load change on the machine hits all of them alike;
    // every other round runs them in reverse order, so none always runs first or last (right
    // after the reference, or while the machine still settles). The table gives medians and
    // the range of the per-round ratios.
    let mut rounds = Vec::new();
    let mut failed = 0;
    for round in 0..rounds_wanted.max(1) {
        let mut rows = Vec::new();
        let mut order: Vec<_> = targets.iter().collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for (name, args, program) in order {
            eprintln!("== {name} (round {})", round + 1);
            let mut row = Row {
                name: name.clone(),
                ..Row::default()
            };
            match runtime.block_on(measure(
                program,
                args,
                &mut row,
                &big,
                &per_client,
                &huge,
                seconds,
                repeat,
                // The reference serves one client at a time.
                if name == "reference" {
                    load::Clients::Serial
                } else {
                    load::Clients::Concurrent
                },
            )) {
                Ok(()) => {}
                Err(error) => {
                    eprintln!("{name}: measurement failed: {error}");
                    failed += 1;
                }
            }
            eprintln!("{row:?}");
            rows.push(row);
        }
        rounds.push(rows);
    }
    print_table(&rounds);
    if failed > 0 {
        eprintln!("{failed} measurement(s) failed");
        std::process::exit(1);
    }
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    program: &str,
    args: &[String],
    row: &mut Row,
    big: &Bytes,
    per_client: &Bytes,
    huge: &Bytes,
    seconds: f64,
    repeat: usize,
    clients: load::Clients,
) -> Result<(), BoxError> {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let wanted = |metric: &str| only.is_empty() || only.split(',').any(|m| m.trim() == metric);
    let failures = std::cell::Cell::new(0);
    // Throughput and rates on one server process.
    {
        let server = ServerProcess::start(program, args)?;
        let addr = server.addr;
        // A failed measurement is reported and left at 0; the others go on, and the server's
        // measurement fails at the end.
        let report = |what: &str, error: BoxError| {
            eprintln!("  {what} failed: {error}");
            failures.set(failures.get() + 1);
        };
        if wanted("big") {
            let cpu = server.cpu_seconds()?;
            match big_transfer(addr, big, repeat).await {
                Ok((set, get)) => {
                    row.set_gbps = set;
                    row.get_gbps = get;
                    let moved = 2 * repeat.max(1) * big.len();
                    row.big_cpu_ms_per_gb = cpu_ms_per_gb(server.cpu_seconds()? - cpu, moved);
                    eprintln!(
                        "  256 MiB SET {set:.2} GB/s, GET {get:.2} GB/s, server CPU {:.0} ms/GB",
                        row.big_cpu_ms_per_gb
                    );
                }
                Err(error) => report("256 MiB SET/GET", error),
            }
        }
        if wanted("rtt") {
            match small_commands(addr, 1, load::Clients::Concurrent, seconds).await {
                Ok(rate) => {
                    row.rtt_per_s = rate;
                    eprintln!("  GET_ALIGNMENT, 1 client: {rate:.0}/s");
                }
                Err(error) => report("GET_ALIGNMENT, 1 client", error),
            }
        }
        if wanted("multi") {
            let cpu = server.cpu_seconds()?;
            let mut moved = 0;
            for _ in 0..repeat.max(1) {
                match many_transfers(addr, per_client, clients).await {
                    Ok(rate) => {
                        row.multi_gbps = row.multi_gbps.max(rate);
                        moved += 2 * CLIENTS * per_client.len();
                    }
                    Err(error) => report("16 x 64 MiB SET+GET", error),
                }
            }
            if moved > 0 {
                row.multi_cpu_ms_per_gb = cpu_ms_per_gb(server.cpu_seconds()? - cpu, moved);
            }
            eprintln!(
                "  16 x 64 MiB SET+GET: {:.2} GB/s, server CPU {:.0} ms/GB",
                row.multi_gbps, row.multi_cpu_ms_per_gb
            );
        }
        if wanted("multirtt") {
            let cpu = server.cpu_seconds()?;
            let start = Instant::now();
            match small_commands(addr, CLIENTS, clients, seconds).await {
                Ok(rate) => {
                    row.multi_rtt_per_s = rate;
                    let commands = rate * start.elapsed().as_secs_f64();
                    row.multi_rtt_cpu_us = (server.cpu_seconds()? - cpu) * 1e6 / commands;
                    eprintln!(
                        "  GET_ALIGNMENT, 16 clients: {rate:.0}/s, server CPU {:.1} us each",
                        row.multi_rtt_cpu_us
                    );
                }
                Err(error) => report("GET_ALIGNMENT, 16 clients", error),
            }
        }
    }
    // Peak RSS on a fresh process.
    if wanted("rss") {
        let server = ServerProcess::start(program, args)?;
        let mut client = Client::connect_auto(server.addr).await?;
        let tensor = tensor_in(&mut client, HUGE).await?;
        client.set_tensor(&tensor, 0, huge.clone()).await?;
        client.alignment(0).await?;
        row.peak_rss_mib = server.peak_rss_mib()?;
        eprintln!(
            "  peak RSS with a 1 GiB tensor: {:.0} MiB",
            row.peak_rss_mib
        );
    }
    match failures.get() {
        0 => Ok(()),
        n => Err(format!("{n} of its measurements failed").into()),
    }
}

/// SET then GET of one tensor of `data.len()` bytes, `repeat` times; the best GB/s of each.
async fn big_transfer(
    addr: SocketAddr,
    data: &Bytes,
    repeat: usize,
) -> Result<(f64, f64), BoxError> {
    let mut client = connect(addr).await?;
    let tensor = tensor_in(&mut client, data.len()).await?;
    let (mut set, mut get) = (0f64, 0f64);
    // One receive buffer, touched once before timing: the client's page faults are not the
    // server's throughput.
    let mut buffer = bytes::BytesMut::zeroed(data.len());
    for _ in 0..repeat.max(1) {
        let start = Instant::now();
        client.set_tensor(&tensor, 0, data.clone()).await?;
        // SET_TENSOR has no reply: a round trip makes sure the server has the data.
        client.alignment(0).await?;
        set = set.max(gbps(data.len(), start.elapsed()));
        let start = Instant::now();
        let got = client
            .get_tensor_into(&tensor, 0, data.len() as u64, buffer)
            .await?;
        get = get.max(gbps(data.len(), start.elapsed()));
        if got.len() != data.len() || got[..4096] != data[..4096] {
            return Err("GET returned other data".into());
        }
        buffer = got
            .try_into_mut()
            .map_err(|_| "receive buffer still shared")?;
    }
    Ok((set, get))
}

/// `clients` connections sending GET_ALIGNMENT for `seconds` (one request in flight on each,
/// from the lean generator); aggregate round trips per second.
async fn small_commands(
    addr: SocketAddr,
    clients: usize,
    mode: load::Clients,
    seconds: f64,
) -> Result<f64, BoxError> {
    // The protocol the server speaks, from a HELLO of the auto-negotiating client.
    let version = connect(addr).await?.server_version();
    let threads: usize = env_or("BENCH_LOAD_THREADS", 1);
    tokio::task::spawn_blocking(move || {
        load::round_trips(addr, version, clients, mode, threads, seconds)
    })
    .await?
}

/// 16 clients, each SET then GET of its own 64 MiB tensor; aggregate GB/s over both
/// directions. All at once, or one after another ([`load::Clients::Serial`], for the reference:
/// with its backlog of one, sixteen connections at once left some half open, their HELLO
/// retransmitted at ever longer intervals, for minutes).
async fn many_transfers(
    addr: SocketAddr,
    data: &Bytes,
    clients: load::Clients,
) -> Result<f64, BoxError> {
    let one_client = |data: Bytes| {
        retrying(move || {
            let data = data.clone();
            async move {
                let mut client = connect(addr).await?;
                let tensor = tensor_in(&mut client, data.len()).await?;
                client.set_tensor(&tensor, 0, data.clone()).await?;
                let got = client.get_tensor(&tensor, 0, data.len() as u64).await?;
                if got.len() != data.len() || got[..4096] != data[..4096] {
                    return Err::<(), BoxError>("GET returned other data".into());
                }
                Ok(())
            }
        })
    };
    let start = Instant::now();
    match clients {
        load::Clients::Serial => {
            for _ in 0..CLIENTS {
                one_client(data.clone()).await?;
            }
        }
        load::Clients::Concurrent => {
            let tasks: Vec<_> = (0..CLIENTS)
                .map(|_| tokio::spawn(one_client(data.clone())))
                .collect();
            for task in tasks {
                task.await??;
            }
        }
    }
    Ok(gbps(2 * CLIENTS * data.len(), start.elapsed()))
}

/// Connects, retrying for a while: the reference serves one client at a time with a backlog of
/// one, so the connections of concurrent clients may be refused or reset until it gets to them.
async fn connect(addr: SocketAddr) -> Result<Client, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match Client::connect_auto(addr).await {
            Ok(client) => return Ok(client),
            Err(error) if Instant::now() > deadline => return Err(error.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Runs one client's work again (from a new connection) when it failed, for a while: with the
/// reference, queued clients' connections may be reset before it serves them. Only complete runs
/// are counted; the time of failed ones is not subtracted.
async fn retrying<T, F, Fut>(work: F) -> Result<T, BoxError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, BoxError>>,
{
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match work().await {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() > deadline => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Allocates a buffer of `len` bytes and returns an i8 tensor covering it.
async fn tensor_in(client: &mut Client, len: usize) -> Result<RpcTensor, BoxError> {
    let buffer = client
        .alloc_buffer(0, len as u64)
        .await?
        .ok_or("the server could not allocate the buffer")?;
    let base = client.buffer_base(buffer.handle).await?;
    let mut tensor =
        RpcTensor::contiguous(1, 24, [u32::try_from(len)?, 1, 1, 1]).ok_or("tensor shape")?;
    tensor.buffer = buffer.handle;
    tensor.data = base;
    Ok(tensor)
}

/// CPU milliseconds per GB (10^9 bytes) moved.
fn cpu_ms_per_gb(cpu_seconds: f64, bytes: usize) -> f64 {
    cpu_seconds * 1e3 / (bytes as f64 / 1e9)
}

fn gbps(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e9
}

fn fill(len: usize, seed: u8) -> Bytes {
    let mut data = vec![0u8; len];
    for (i, chunk) in data.chunks_mut(4096).enumerate() {
        chunk.fill(seed.wrapping_add(i as u8));
    }
    data.into()
}

/// A server child process on a free loopback port, stopped (SIGTERM, then kill) on drop.
struct ServerProcess {
    child: Child,
    addr: SocketAddr,
}

impl ServerProcess {
    fn start(program: &str, args: &[String]) -> Result<ServerProcess, BoxError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut command = match &pinning().server {
            Some(cpus) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", cpus, program]);
                taskset
            }
            None => Command::new(program),
        };
        let child = command
            .args(["-p", &port.to_string()])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let server = ServerProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        // The reference's banner sits in its stdout buffer (a pipe), so readiness is a
        // successful connect rather than the banner.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(server.addr).is_err() {
            if Instant::now() > deadline {
                return Err(format!("{program} did not start").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// CPU time (user + system, all threads) the process used so far, in seconds.
    fn cpu_seconds(&self) -> Result<f64, BoxError> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the command name (which may contain spaces) start at field 3.
        let rest = stat.rsplit_once(')').ok_or("bad stat")?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: f64 = fields.get(11).ok_or("bad stat")?.parse()?;
        let stime: f64 = fields.get(12).ok_or("bad stat")?.parse()?;
        Ok((utime + stime) / clock_ticks())
    }

    /// VmHWM of the process, in MiB.
    fn peak_rss_mib(&self) -> Result<f64, BoxError> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = status
            .lines()
            .find(|line| line.starts_with("VmHWM:"))
            .ok_or("no VmHWM")?;
        let kib: f64 = line.split_whitespace().nth(1).ok_or("bad VmHWM")?.parse()?;
        Ok(kib / 1024.0)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sysconf(_SC_CLK_TCK)`, the unit of /proc/PID/stat times.
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The CPUs (`taskset -c` lists) that `BENCH_PIN` gives this process and the servers.
#[derive(Debug, Clone, Default)]
struct Pinning {
    client: Option<String>,
    server: Option<String>,
}

/// Read once, before this process pins itself (which changes the CPUs it can see).
fn pinning() -> &'static Pinning {
    static PINNING: OnceLock<Pinning> = OnceLock::new();
    PINNING.get_or_init(|| {
        let last = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
        let (client, server) = match std::env::var("BENCH_PIN").as_deref() {
            Err(_) | Ok("") => return Pinning::default(),
            Ok("split") => ("0".to_owned(), last.to_string()),
            Ok("same") => ("0".to_owned(), "0".to_owned()),
            Ok(other) => {
                eprintln!("BENCH_PIN={other}: expected split or same");
                std::process::exit(2);
            }
        };
        Pinning {
            client: Some(client),
            server: Some(server),
        }
    })
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Prints one line per metric and server: the median over the rounds (and their range), and
/// the median and range of the per-round ratios to the reference and to tokio.
fn print_table(rounds: &[Vec<Row>]) {
    let Some(first) = rounds.first() else {
        return;
    };
    // The first round ran the servers in their own order (later ones may have run reversed).
    let names: Vec<&str> = first.iter().map(|r| r.name.as_str()).collect();
    let value_of = |round: &[Row], name: &str, get: fn(&Row) -> f64| {
        round
            .iter()
            .find(|r| r.name == name)
            .map(get)
            .unwrap_or(0.0)
    };
    type Metric = (&'static str, fn(&Row) -> f64, &'static str);
    let metrics: [Metric; 9] = [
        ("SET 256 MiB", |r| r.set_gbps, "GB/s"),
        ("GET 256 MiB", |r| r.get_gbps, "GB/s"),
        (
            "server CPU per GB, 256 MiB SET+GET",
            |r| r.big_cpu_ms_per_gb,
            "ms/GB",
        ),
        ("GET_ALIGNMENT, 1 client", |r| r.rtt_per_s, "/s"),
        ("16 clients x 64 MiB SET+GET", |r| r.multi_gbps, "GB/s"),
        (
            "server CPU per GB, 16 clients x 64 MiB",
            |r| r.multi_cpu_ms_per_gb,
            "ms/GB",
        ),
        ("GET_ALIGNMENT, 16 clients", |r| r.multi_rtt_per_s, "/s"),
        (
            "server CPU per command, 16 clients",
            |r| r.multi_rtt_cpu_us,
            "us",
        ),
        ("peak RSS, 1 GiB SET_TENSOR", |r| r.peak_rss_mib, "MiB"),
    ];
    let shown = |value: f64, unit: &str| {
        if unit == "GB/s" || unit == "us" {
            format!("{value:.2}")
        } else {
            format!("{value:.0}")
        }
    };
    println!();
    println!(
        "{} round(s); median (min-max){}",
        rounds.len(),
        if rounds.len() >= BOOTSTRAP_MIN_ROUNDS {
            "; ratios also with the 95 % bootstrap confidence interval of their median"
        } else {
            ""
        }
    );
    println!();
    println!("| metric | server | value | vs reference | vs tokio | vs baseline |");
    println!("|---|---|---|---|---|---|");
    for (label, get, unit) in metrics {
        for &name in &names {
            let values: Vec<f64> = rounds.iter().map(|r| value_of(r, name, get)).collect();
            if values.iter().all(|&v| v == 0.0) {
                // Not measured (BENCH_ONLY).
                continue;
            }
            let ratios = |base: &str| -> String {
                let ratios: Vec<f64> = rounds
                    .iter()
                    .map(|r| (value_of(r, name, get), value_of(r, base, get)))
                    .filter(|&(v, b)| v > 0.0 && b > 0.0)
                    .map(|(v, b)| v / b)
                    .collect();
                match spread(&ratios) {
                    Some((median, min, max))
                        if ratios.len() >= BOOTSTRAP_MIN_ROUNDS && min < max =>
                    {
                        let (low, high) = median_interval(&ratios);
                        format!("{median:.2}x ({min:.2}-{max:.2}; CI {low:.2}-{high:.2})")
                    }
                    Some((median, min, max)) if ratios.len() > 1 => {
                        format!("{median:.2}x ({min:.2}-{max:.2})")
                    }
                    Some((median, _, _)) => format!("{median:.2}x"),
                    None => "-".to_owned(),
                }
            };
            let value = match spread(&values) {
                Some((median, min, max)) if values.len() > 1 => format!(
                    "{} {unit} ({}-{})",
                    shown(median, unit),
                    shown(min, unit),
                    shown(max, unit)
                ),
                Some((median, _, _)) => format!("{} {unit}", shown(median, unit)),
                None => "-".to_owned(),
            };
            println!(
                "| {label} | {name} | {value} | {} | {} | {} |",
                ratios("reference"),
                ratios("tokio"),
                ratios(&format!("base-{name}"))
            );
        }
    }
}

/// Median, minimum and maximum.
fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let (&min, &max) = (sorted.first()?, sorted.last()?);
    Some((median_of_sorted(&sorted), min, max))
}

fn median_of_sorted(sorted: &[f64]) -> f64 {
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// Rounds from which the ratios get a confidence interval: with fewer, the interval of a median
/// is about the range of the rounds.
const BOOTSTRAP_MIN_ROUNDS: usize = 10;
/// Resamples of the bootstrap.
const BOOTSTRAP_RESAMPLES: usize = 4000;

/// The 95 % percentile-bootstrap confidence interval of the median of `values` (not empty):
/// the 2.5th and 97.5th percentiles of the medians of resamples drawn with replacement, from a
/// fixed seed so one set of rounds always gives one interval.
fn median_interval(values: &[f64]) -> (f64, f64) {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64*: plenty for drawing indices.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut medians = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    let mut resample = vec![0.0; values.len()];
    for _ in 0..BOOTSTRAP_RESAMPLES {
        for slot in &mut resample {
            *slot = values[(next() % values.len() as u64) as usize];
        }
        resample.sort_by(f64::total_cmp);
        medians.push(median_of_sorted(&resample));
    }
    medians.sort_by(f64::total_cmp);
    let at = |quantile: f64| medians[((medians.len() - 1) as f64 * quantile).round() as usize];
    (at(0.025), at(0.975))
}
