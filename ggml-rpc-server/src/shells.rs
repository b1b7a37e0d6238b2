//! The I/O shells the server can run on, chosen by name (`--shell`).
//!
//! A shell owns its runtime: it binds the listener, calls [`ServeParams::on_listening`] once
//! it listens, serves until SIGINT/SIGTERM, and returns when its connections are closed. Every
//! shell drives the same sans-IO core with the same [`ServerConfig`]; adding one (io_uring,
//! smol, ...) means adding a type here and an entry in [`SHELLS`].

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use proto_core::backend::Backend;
use shell_tokio::ServerConfig;

/// What a shell needs to serve.
pub struct ServeParams {
    /// Address to bind.
    pub addr: SocketAddr,
    /// The backend shared by all connections.
    pub backend: Arc<dyn Backend>,
    /// Limits, version, cache.
    pub config: ServerConfig,
    /// Called once the listener is bound (prints the banner).
    pub on_listening: Box<dyn FnOnce(SocketAddr) + Send>,
}

/// An I/O shell.
pub trait Shell: Sync {
    /// Its `--shell` name.
    fn name(&self) -> &'static str;
    /// Serves until a shutdown signal; returns when every connection is closed.
    fn run(&self, params: ServeParams) -> anyhow::Result<()>;
}

/// Every shell of this build.
pub const SHELLS: &[&dyn Shell] = &[&TokioShell];

/// The names of [`SHELLS`].
pub fn names() -> Vec<&'static str> {
    SHELLS.iter().map(|shell| shell.name()).collect()
}

/// The shell called `name`.
pub fn find(name: &str) -> Option<&'static dyn Shell> {
    SHELLS.iter().copied().find(|shell| shell.name() == name)
}

/// The tokio shell: a multi-threaded runtime, one task per client ([`shell_tokio::serve`]).
pub struct TokioShell;

impl Shell for TokioShell {
    fn name(&self) -> &'static str {
        "tokio"
    }

    fn run(&self, params: ServeParams) -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("rpc-io")
            .build()
            .context("cannot start the tokio runtime")?;
        runtime.block_on(async move {
            let socket = match params.addr {
                SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
                SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
            }?;
            socket.set_reuseaddr(true)?;
            socket
                .bind(params.addr)
                .with_context(|| format!("cannot bind {}", params.addr))?;
            let listener = socket.listen(128)?;
            (params.on_listening)(listener.local_addr()?);
            shell_tokio::serve(listener, params.backend, params.config, shutdown_signal()).await?;
            tracing::info!("server stopped");
            Ok(())
        })
    }
}

/// Completes on the first SIGINT or SIGTERM (Ctrl-C elsewhere).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot watch SIGTERM; only SIGINT stops the server");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown signal received");
}
