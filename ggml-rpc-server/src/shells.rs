//! The I/O shells the server can run on, chosen by name (`--shell`), and the one API that
//! starts any of them in-process: [`start`] → [`RunningServer`].
//!
//! A shell owns its runtime (threads, rings, executors). [`Shell::start`] takes an already bound
//! listener, the backend and the [`ServerConfig`], and returns once the shell serves; the
//! server then runs on the shell's own threads until [`RunningServer::shutdown`]. Every shell
//! drives the same sans-IO core with the same configuration and must behave identically (the
//! conformance suite in `tests/conformance.rs` runs every test against each). Each shell is
//! compiled in by the cargo feature of its name; adding one means a type here, an entry in
//! [`SHELLS`] and a feature (see ARCHITECTURE.md, "Adding a shell").
//!
//! Log output: the shell's threads log through the tracing dispatcher that was the default on
//! the thread calling [`start`], so a test that captures its own thread's logs sees the
//! server's.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context as _;
use proto_core::backend::Backend;

pub use shell_common::ServerConfig;

/// An I/O shell.
pub trait Shell: Sync {
    /// Its `--shell` name.
    fn name(&self) -> &'static str;
    /// Starts serving clients accepted on `listener` (bound, listening) on the shell's own
    /// threads; returns once it serves. Fails when the shell cannot run here (io_uring refused
    /// by the kernel, an unsupported protocol version...).
    fn start(
        &self,
        listener: TcpListener,
        backend: Arc<dyn Backend>,
        config: ServerConfig,
    ) -> anyhow::Result<RunningServer>;
}

/// Every shell of this build, the default (tokio) first.
pub const SHELLS: &[&dyn Shell] = &[
    #[cfg(feature = "tokio")]
    &TokioShell,
    #[cfg(all(feature = "uring", target_os = "linux"))]
    &UringShell,
    #[cfg(feature = "smol")]
    &SmolShell,
];

/// The shell used without `--shell`: tokio when it is compiled in.
pub const DEFAULT_SHELL: &str = if cfg!(feature = "tokio") {
    "tokio"
} else if cfg!(all(feature = "uring", target_os = "linux")) {
    "uring"
} else {
    "smol"
};

/// Whether a shell answers HELLO's transport caps and moves connections to RDMA
/// (`shell_rdma::serve`): every shell of this build does.
pub fn switches_transport(name: &str) -> bool {
    matches!(name, "tokio" | "uring" | "smol")
}

/// The names of [`SHELLS`].
pub fn names() -> Vec<&'static str> {
    SHELLS.iter().map(|shell| shell.name()).collect()
}

/// The shell called `name`.
pub fn find(name: &str) -> Option<&'static dyn Shell> {
    SHELLS.iter().copied().find(|shell| shell.name() == name)
}

/// Starts the shell called `name` on `listener` (see [`Shell::start`]).
pub fn start(
    name: &str,
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    config: ServerConfig,
) -> anyhow::Result<RunningServer> {
    find(name)
        .with_context(|| format!("unknown shell {name} (this build has: {:?})", names()))?
        .start(listener, backend, config)
}

/// A server running on a shell's threads. Dropping it shuts it down (and waits).
pub struct RunningServer {
    shell: &'static str,
    addr: SocketAddr,
    stop: Option<Box<dyn FnOnce() + Send>>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("shell", &self.shell)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl RunningServer {
    /// For shell implementations: `stop` asks the server to shut down, `thread` ends when it
    /// has (every connection closed or dropped after the grace period).
    pub fn new(
        shell: &'static str,
        addr: SocketAddr,
        stop: impl FnOnce() + Send + 'static,
        thread: JoinHandle<anyhow::Result<()>>,
    ) -> RunningServer {
        RunningServer {
            shell,
            addr,
            stop: Some(Box::new(stop)),
            thread: Some(thread),
        }
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shell's name.
    pub fn shell(&self) -> &'static str {
        self.shell
    }

    /// Graceful shutdown: stops accepting, closes idle clients, lets busy ones finish their
    /// current command (for at most the grace period), and returns when every connection is
    /// closed and its buffers freed. Blocks the calling thread.
    pub fn shutdown(mut self) -> anyhow::Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            stop();
        }
        match self.thread.take() {
            Some(thread) => match thread.join() {
                Ok(result) => result,
                Err(_) => anyhow::bail!("the {} shell panicked", self.shell),
            },
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Err(error) = self.stop_and_join() {
            tracing::error!(%error, "server failed");
        }
    }
}

/// Runs `f` on a new thread that logs through the caller's tracing dispatcher.
fn spawn_server(
    name: &str,
    f: impl FnOnce() -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _dispatch = tracing::dispatcher::set_default(&dispatch);
            f()
        })
        .context("cannot start the server thread")
}

/// The tokio shell: a multi-threaded runtime, one task per client, accepted on the server thread
/// ([`shell_tokio::serve_on`]).
#[cfg(feature = "tokio")]
pub struct TokioShell;

#[cfg(feature = "tokio")]
impl Shell for TokioShell {
    fn name(&self) -> &'static str {
        "tokio"
    }

    fn start(
        &self,
        listener: TcpListener,
        backend: Arc<dyn Backend>,
        config: ServerConfig,
    ) -> anyhow::Result<RunningServer> {
        // Checked here so a bad version fails `start`, not the server thread.
        config.connection_config()?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .worker_threads(tokio_workers())
            .thread_name("rpc-io")
            .on_thread_start(move || {
                THREAD_DISPATCH.with(|slot| {
                    *slot.borrow_mut() = Some(tracing::dispatcher::set_default(&dispatch));
                });
            })
            .on_thread_stop(|| THREAD_DISPATCH.with(|slot| drop(slot.borrow_mut().take())))
            .build()
            .context("cannot start the tokio runtime")?;
        // The accept loop on a current-thread runtime of the server thread, the clients on
        // the workers (`shell_tokio::serve_on`: a lone client then runs its graphs inline).
        let accept = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the tokio runtime")?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = spawn_server("rpc-tokio", move || {
            let connections = runtime.handle().clone();
            accept.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                shell_tokio::serve_on(listener, connections, backend, config, async move {
                    let _ = stop_rx.await;
                })
                .await
            })?;
            drop(runtime);
            Ok(())
        })?;
        Ok(RunningServer::new(
            "tokio",
            addr,
            move || {
                let _ = stop_tx.send(());
            },
            thread,
        ))
    }
}

/// A shell without TLS refuses a configuration with it at start, rather than serve in clear.
#[cfg(any(feature = "smol", all(feature = "uring", target_os = "linux")))]
fn refuse_tls(shell: &str, config: &ServerConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.tls.is_none(),
        "the {shell} shell cannot serve TLS (--tls-cert/--tls-key/--tls-client-ca): use --shell tokio"
    );
    Ok(())
}

/// Worker threads of the tokio shell: one per CPU this process may run on, but never fewer
/// than two. A lone client's heavy calls (graph compute) run inline only while another worker
/// is there to keep the sockets; with a single worker each one would go through
/// `block_in_place`, a handoff of about seven context switches, which costs a small model
/// about 2 % of its generation speed on a server pinned to one CPU.
#[cfg(feature = "tokio")]
fn tokio_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, std::num::NonZeroUsize::get)
        .max(2)
}

#[cfg(feature = "tokio")]
thread_local! {
    /// Keeps a tokio worker's tracing dispatcher set for the thread's life.
    static THREAD_DISPATCH: std::cell::RefCell<Option<tracing::dispatcher::DefaultGuard>> =
        const { std::cell::RefCell::new(None) };
}

/// The io_uring shell: one ring thread serving every client, heavy work on blocking threads
/// ([`shell_uring::Server`]). Refused at start where the kernel refuses io_uring.
#[cfg(all(feature = "uring", target_os = "linux"))]
pub struct UringShell;

#[cfg(all(feature = "uring", target_os = "linux"))]
impl Shell for UringShell {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn start(
        &self,
        listener: TcpListener,
        backend: Arc<dyn Backend>,
        config: ServerConfig,
    ) -> anyhow::Result<RunningServer> {
        refuse_tls("uring", &config)?;
        let uring = shell_uring::ServerConfig::from_base(config);
        // The error already reads "io_uring is not available: ..." when the kernel refuses it.
        let server = shell_uring::Server::start(listener, backend, uring)?;
        let addr = server.local_addr();
        let stopper = server.stopper();
        let thread = spawn_server("rpc-uring", move || {
            server.join();
            Ok(())
        })?;
        Ok(RunningServer::new(
            "uring",
            addr,
            move || stopper.stop(),
            thread,
        ))
    }
}

/// The smol shell: an async-executor run by one thread per core, one task per client
/// ([`shell_smol::serve`]).
#[cfg(feature = "smol")]
pub struct SmolShell;

#[cfg(feature = "smol")]
impl Shell for SmolShell {
    fn name(&self) -> &'static str {
        "smol"
    }

    fn start(
        &self,
        listener: TcpListener,
        backend: Arc<dyn Backend>,
        config: ServerConfig,
    ) -> anyhow::Result<RunningServer> {
        // Refuse an unsupported version here, before a thread is started.
        config.connection_config()?;
        refuse_tls("smol", &config)?;
        let addr = listener.local_addr()?;
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        // Never sent to: dropping the sender is the shutdown signal.
        let (stop_tx, stop_rx) = async_channel::bounded::<()>(1);
        let thread = spawn_server("rpc-smol", move || {
            shell_smol::run(threads, listener, backend, config, async move {
                let _ = stop_rx.recv().await;
            })?;
            Ok(())
        })?;
        Ok(RunningServer::new(
            "smol",
            addr,
            move || drop(stop_tx),
            thread,
        ))
    }
}
