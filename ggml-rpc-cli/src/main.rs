//! `ggml-rpc`: probe, benchmark and check the conformance of any ggml RPC server, ours or
//! llama.cpp's `rpc-server` (protocol 7 or 8, detected automatically), and carry a local
//! llama.cpp's plain TCP to a server that requires TLS (`tunnel`).
#![forbid(unsafe_code)]

mod bench;
mod conformance;
mod connect;
mod probe;
mod tunnel;
mod units;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use shell_common::tls::TlsFiles;
use tracing_subscriber::EnvFilter;

use connect::Protocol;

/// Probe and benchmark ggml RPC servers.
#[derive(Debug, Parser)]
#[command(name = "ggml-rpc", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Protocol to speak: auto (8, else the server's major), 7, 8 (any 8.0.x), 8.0.0 or 8.0.1.
    #[arg(long, global = true, value_enum, default_value_t = Protocol::Auto)]
    protocol: Protocol,
    /// Transport: auto (RDMA when this host has a device for the connection and the server
    /// answers with caps, as llama.cpp), tcp, or rdma (fail unless the connection switches).
    #[arg(long, global = true, default_value = "auto", value_parser = ["tcp", "rdma", "auto"])]
    transport: String,
    /// Seconds to wait for the server: its HELLO answer (probe, bench; default 10), every
    /// wait of a case (conformance; default 3).
    #[arg(long, global = true, value_parser = parse_seconds)]
    timeout: Option<Duration>,
    /// More log output (-v debug, -vv trace). RUST_LOG overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the server's version, flags and devices.
    Probe {
        /// The server, HOST:PORT.
        endpoint: String,
    },
    /// Measure SET_TENSOR / GET_TENSOR throughput and small-command round trips.
    Bench {
        /// The server, HOST:PORT.
        endpoint: String,
        /// Bytes per transfer (units: KiB, MiB, GiB, or KB, MB, GB).
        #[arg(long, default_value = "256MiB", value_parser = units::parse_size)]
        size: u64,
        /// Transfers per direction.
        #[arg(long, default_value_t = 10)]
        iterations: u32,
        /// GET_ALIGNMENT round trips.
        #[arg(long, default_value_t = 10_000)]
        small_rounds: u32,
        /// Device index.
        #[arg(long, default_value_t = 0)]
        device: u32,
        /// Never show a progress bar.
        #[arg(long)]
        no_progress: bool,
    },
    /// Run the protocol's test vectors and hostile cases against a server (exit code 0 only
    /// when every case passes; README.md, "Conformance kit").
    Conformance {
        /// The server, HOST:PORT.
        endpoint: String,
        /// Machine-readable output (one JSON document) instead of the table.
        #[arg(long)]
        json: bool,
        /// Only the cases whose name contains this.
        #[arg(long, value_name = "PATTERN")]
        only: Option<String>,
        /// Count the reference's documented gaps (PROTOCOL.md §13) as failures.
        #[arg(long)]
        strict: bool,
        /// Start the server with `sh -c CMD` (use `exec`), and again after a case killed it.
        #[arg(long, value_name = "CMD")]
        spawn: Option<String>,
    },
    /// Accept plain TCP (from a local llama.cpp) and carry each connection over its own TLS
    /// 1.3 connection, with a client certificate, to a server started with --tls-*.
    Tunnel {
        /// Where to accept, HOST:PORT (keep it on loopback: this side is plain TCP; port 0
        /// picks a free one). The address is printed as "tunnel listening on ADDR".
        #[arg(long, value_name = "HOST:PORT")]
        listen: String,
        /// The TLS server, HOST:PORT.
        #[arg(long, value_name = "HOST:PORT")]
        connect: String,
        /// Our client certificate chain (PEM), signed by the server's --tls-client-ca.
        #[arg(long, value_name = "FILE")]
        tls_cert: PathBuf,
        /// The private key (PEM) of --tls-cert.
        #[arg(long, value_name = "FILE")]
        tls_key: PathBuf,
        /// CA certificates (PEM) the server's certificate must be signed by.
        #[arg(long, value_name = "FILE")]
        tls_ca: PathBuf,
        /// The name the server's certificate must carry [default: the host of --connect].
        #[arg(long, value_name = "NAME")]
        server_name: Option<String>,
    },
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    match Duration::try_from_secs_f64(seconds) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        _ => Err(format!("{text}: a positive number of seconds")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let tunnel = matches!(cli.command, Command::Tunnel { .. });
    let level = match cli.verbose {
        // The tunnel is a long-running service: one line per connection by default.
        0 if tunnel => "info",
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Command::Conformance { .. } = &cli.command {
        // Blocking sockets with a deadline on each wait: no runtime needed.
        return conformance_command(cli);
    }
    // The tunnel encrypts on every core; probe and bench run one client.
    let mut builder = if tunnel {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let timeout = cli.timeout.unwrap_or(Duration::from_secs(10));
    match cli.command {
        Command::Probe { endpoint } => {
            let transport = cli.transport.parse().map_err(anyhow::Error::msg)?;
            let mut client = connect::connect(&endpoint, cli.protocol, transport, timeout).await?;
            tracing::info!(rdma = client.is_rdma(), "connected");
            let devices = probe::probe(&mut client).await?;
            print!("{}", probe::render(&endpoint, &client, &devices));
        }
        Command::Bench {
            endpoint,
            size,
            iterations,
            small_rounds,
            device,
            no_progress,
        } => {
            let transport = cli.transport.parse().map_err(anyhow::Error::msg)?;
            let mut client = connect::connect(&endpoint, cli.protocol, transport, timeout).await?;
            tracing::info!(rdma = client.is_rdma(), "connected");
            let plan = bench::BenchPlan {
                device,
                size,
                iterations,
                small_rounds,
                progress: !no_progress,
            };
            let results = bench::run(&mut client, plan).await?;
            print!("{}", bench::render(&endpoint, &client, &plan, &results));
        }
        Command::Conformance { .. } => unreachable!("run without a runtime"),
        Command::Tunnel {
            listen,
            connect,
            tls_cert,
            tls_key,
            tls_ca,
            server_name,
        } => {
            let files = TlsFiles {
                cert: tls_cert,
                key: tls_key,
                ca: tls_ca,
            };
            let tls = shell_common::tls::client_config(&files)?;
            let name = match server_name {
                Some(name) => name,
                None => host_of(&connect)?,
            };
            let server_name = shell_common::tls::server_name(&name)?;
            let listener = tokio::net::TcpListener::bind(&listen)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            let local = listener.local_addr()?;
            if !local.ip().is_loopback() {
                tracing::warn!(%local, "the tunnel's plain-TCP side is reachable off this host");
            }
            println!("tunnel listening on {local}");
            std::io::Write::flush(&mut std::io::stdout())?;
            let tunnel = tunnel::Tunnel {
                connect,
                server_name,
                tls,
            };
            tunnel::serve(listener, tunnel, shutdown_signal()?).await?;
        }
    }
    Ok(())
}

fn conformance_command(cli: Cli) -> ExitCode {
    let Command::Conformance {
        endpoint,
        json,
        only,
        strict,
        spawn,
    } = cli.command
    else {
        return ExitCode::FAILURE;
    };
    let fail = |error: &dyn std::fmt::Display| {
        eprintln!("error: {error}");
        ExitCode::from(2)
    };
    let addr = match conformance::resolve(&endpoint) {
        Ok(addr) => addr,
        Err(error) => return fail(&error),
    };
    let mut spawned = match spawn
        .as_deref()
        .map(|cmd| conformance::Spawned::start(cmd, addr))
    {
        None => None,
        Some(Ok(spawned)) => Some(spawned),
        Some(Err(error)) => return fail(&error),
    };
    let options = conformance::Options {
        addr,
        version: cli.protocol.exact(),
        timeout: cli.timeout.unwrap_or(Duration::from_secs(3)),
        only,
    };
    let mut on_start = |version, facts: &conformance::socket::ServerFacts| {
        if !json {
            print!("{}", conformance::report::header(&endpoint, version, facts));
        }
    };
    let mut on_case = |result: &conformance::CaseResult| {
        if !json {
            print!("{}", conformance::report::row(result));
        }
    };
    let run = conformance::run(&options, spawned.as_mut(), &mut on_start, &mut on_case);
    let (version, facts, results) = match run {
        Ok(run) => run,
        Err(error) => return fail(&error),
    };
    if results.is_empty() {
        // A pattern that matches nothing checks nothing: not a pass.
        return fail(&"no case to run (see --only)");
    }
    if json {
        let value = conformance::report::json(&endpoint, version, &facts, &results, strict);
        println!("{value:#}");
    } else {
        print!("{}", conformance::report::summary(&results, strict));
    }
    if results.iter().all(|r| r.acceptable(strict)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The host part of HOST:PORT (an IPv6 literal without its brackets).
fn host_of(endpoint: &str) -> anyhow::Result<String> {
    let (host, _port) = endpoint
        .rsplit_once(':')
        .with_context(|| format!("{endpoint}: expected HOST:PORT"))?;
    Ok(host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned())
}

/// Completes at the first SIGINT or SIGTERM.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}
