//! `ggml-rpc`: probe and benchmark any ggml RPC server, ours or llama.cpp's `rpc-server`
//! (protocol 7 or 8, detected automatically).
#![forbid(unsafe_code)]

mod bench;
mod connect;
mod probe;
mod units;

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use connect::Protocol;

/// Probe and benchmark ggml RPC servers.
#[derive(Debug, Parser)]
#[command(name = "ggml-rpc", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Protocol to speak: auto (8, else the server's major), 7 or 8.
    #[arg(long, global = true, value_enum, default_value_t = Protocol::Auto)]
    protocol: Protocol,
    /// Seconds to wait for the server's HELLO answer.
    #[arg(long, global = true, default_value_t = 10)]
    timeout: u64,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
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
    let timeout = Duration::from_secs(cli.timeout);
    match cli.command {
        Command::Probe { endpoint } => {
            let mut client = connect::connect(&endpoint, cli.protocol, timeout).await?;
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
            let mut client = connect::connect(&endpoint, cli.protocol, timeout).await?;
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
    }
    Ok(())
}
