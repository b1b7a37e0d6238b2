//! `ggml-rpc-server` as a library: the command line, the banner, the devices, and the shells
//! the server runs on, so tests (and other tools) can start any shell in-process with
//! [`start`] and get a [`RunningServer`].
//!
//! Flags, banner and behaviour follow llama.cpp's `rpc-server` (PROTOCOL.md §11), except that
//! many clients are served at once, each with its own buffers, within configurable limits.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod args;
pub mod banner;
pub mod cache_location;
pub mod devices;
pub mod shells;

use std::io::IsTerminal as _;
use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use proto_core::tensor_cache::TensorCache;
use shell_common::FsTensorCache;
use tracing_subscriber::EnvFilter;

pub use args::Args;
pub use shells::{start, RunningServer, ServerConfig, Shell, SHELLS};

/// Logs go to stderr. `RUST_LOG` wins; otherwise `-v`/`-vv` (or the reference's
/// `GGML_RPC_DEBUG=1`) raise the default `info` level.
pub fn init_tracing(verbose: u8) {
    let debug_env = std::env::var("GGML_RPC_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0");
    let level = match (verbose, debug_env) {
        (0, false) => "info",
        (0, true) | (1, _) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// The whole process after argument parsing: devices, cache, bind, start the shell, banner,
/// serve until SIGINT/SIGTERM, graceful shutdown.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    shell_common::freed_memory::return_large_blocks();
    let selected = match devices::select(args.device.as_deref()) {
        Ok(selected) => selected,
        Err(unknown) => {
            eprintln!("error: unknown device: {unknown}");
            eprintln!("available devices:");
            for name in devices::available_names() {
                eprintln!("  {name}");
            }
            eprintln!("No devices found");
            return Ok(ExitCode::FAILURE);
        }
    };
    shell_common::set_tuning(!args.system_congestion_control);
    let defaults = backend_cpu::CpuConfig::default();
    let threads = args.threads.unwrap_or(defaults.threads);
    let pages = if args.no_huge_pages {
        backend_cpu::PagePolicy::Base
    } else {
        backend_cpu::PagePolicy::Huge
    };
    let capacity = args.memory_capacity.map_or(
        backend_cpu::MemoryCapacity::Available,
        backend_cpu::MemoryCapacity::Bytes,
    );
    let devices = devices::open(
        &selected,
        backend_cpu::CpuConfig {
            threads,
            pages,
            capacity,
        },
    );

    let cache_dir = match (&args.cache_dir, args.cache) {
        (Some(dir), _) => Some(dir.clone()),
        (None, true) => Some(
            cache_location::default_cache_dir(|name| std::env::var(name).ok())
                .context("cannot locate the cache directory: set LLAMA_CACHE or use --cache-dir")?,
        ),
        (None, false) => None,
    };
    let cache = cache_dir
        .as_ref()
        .map(|dir| {
            FsTensorCache::open(dir)
                .with_context(|| format!("cannot create the cache directory {}", dir.display()))
        })
        .transpose()?;

    if let Some(reason) = args.refused_exposure() {
        eprintln!("error: {reason}");
        return Ok(ExitCode::FAILURE);
    }
    let tls = args
        .tls_files()
        .map(|files| shell_common::tls::ServerTls::load(&files))
        .transpose()
        .context("cannot set up TLS")?;

    let version = args.protocol;
    let mut config = ServerConfig::new(version);
    config.max_clients = args.max_clients;
    config.max_clients_per_address = args.max_clients_per_address;
    let seconds = |n: u64| (n > 0).then(|| std::time::Duration::from_secs(n));
    config.hello_timeout = seconds(args.hello_timeout);
    config.progress_window = seconds(args.progress_window);
    config.min_progress_rate = args.min_progress_rate;
    config.memory_quota = args.memory_quota;
    config.max_message_size = args.max_message_size;
    config.tensor_cache = cache.map(|cache| Arc::new(cache) as Arc<dyn TensorCache>);
    config.comm_link = args.comm_link;
    config.comm_timeout = std::time::Duration::from_secs(args.comm_timeout);
    config.comm_peers = args
        .comm_peers
        .clone()
        .map_or_else(shell_common::CommPeers::any, shell_common::CommPeers::only);
    config.remote_copy = !args.no_extensions;
    config.peers = shell_common::PeerAllowList::resolve(&args.peers)
        .context("cannot resolve a --peer address")?;
    // As the reference: set (to anything) on any one rank, the group takes the pairwise path.
    config.backend_communicator = std::env::var_os("GGML_RPC_NO_BACKEND_COMMUNICATOR").is_none();
    config.tls = tls;

    let config_link = config.link_variant();
    let shell =
        shells::find(&args.shell).with_context(|| format!("unknown shell {}", args.shell))?;
    let transport: shell_common::TransportMode =
        args.transport.parse().map_err(anyhow::Error::msg)?;
    let switches = shells::switches_transport(shell.name());
    if transport == shell_common::TransportMode::Rdma && !switches {
        anyhow::bail!("--transport rdma needs --shell tokio, uring or smol");
    }
    config.transport = if switches {
        transport
    } else {
        shell_common::TransportMode::Tcp
    };
    // The comm link offers RDMA caps as the reference's does, whatever the shell.
    config.comm_transport = shell_rdma::comm::transport(transport);
    let transport_line = banner::transport_line(
        transport,
        switches,
        &if transport == shell_common::TransportMode::Tcp {
            Vec::new()
        } else {
            shell_rdma::sys::device_names()
        },
    );
    let shutdown = ShutdownSignal::install()?;
    let comm_open = version.major >= 8 && !config.comm_peers.is_restricted();
    let exposed = args.host.to_string();
    if let Some(warning) = banner::exposure_warning(&exposed, comm_open, config.tls.is_some()) {
        eprint!("{warning}");
    }
    let addr = SocketAddr::from((args.host, args.port));
    // std sets SO_REUSEADDR on Unix listeners (backlog 128).
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot bind {addr}"))?;
    tracing::debug!(shell = shell.name(), threads, "starting");
    let tls_files = config.tls.as_ref().map(|tls| tls.files.clone());
    let server = shell.start(listener, devices.backend, config)?;
    if let Some(files) = tls_files {
        // The comm link (COMM_INIT) has no TLS yet: only the client port is protected.
        tracing::info!(
            cert = %files.cert.display(),
            client_ca = %files.ca.display(),
            "TLS 1.3: clients must present a certificate of the client CA; the comm link stays plain TCP"
        );
    }
    print!(
        "{}",
        banner::banner(
            version,
            config_link,
            server.local_addr(),
            cache_dir.as_deref(),
            &devices.list,
            &transport_line,
        )
    );
    {
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    }
    shutdown.wait();
    tracing::info!("shutdown signal received");
    server.shutdown()?;
    tracing::info!("server stopped");
    Ok(ExitCode::SUCCESS)
}

/// SIGINT and SIGTERM, caught from start-up on (so a signal right after the banner is not
/// lost), for every shell alike.
struct ShutdownSignal {
    #[cfg(unix)]
    signals: signal_hook::iterator::Signals,
}

impl ShutdownSignal {
    fn install() -> anyhow::Result<ShutdownSignal> {
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGINT, SIGTERM};
            let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
                .context("cannot watch SIGINT/SIGTERM")?;
            Ok(ShutdownSignal { signals })
        }
        #[cfg(not(unix))]
        {
            Ok(ShutdownSignal {})
        }
    }

    /// Blocks until the first SIGINT or SIGTERM.
    fn wait(mut self) {
        #[cfg(unix)]
        {
            let _ = self.signals.forever().next();
        }
        #[cfg(not(unix))]
        loop {
            std::thread::park();
        }
    }
}
