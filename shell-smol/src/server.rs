//! The TCP server: accept loop, server-wide limits and graceful shutdown (the tokio shell's
//! behaviour on async-io / async-executor).

use std::future::Future;
use std::io;
use std::net::TcpListener;
use std::sync::Arc;

use async_executor::{Executor, Task};
use async_io::{Async, Timer};
use proto_core::backend::Backend;
use tracing::instrument::WithSubscriber as _;
use tracing::Instrument as _;

pub use shell_common::config::{
    ServerConfig, DEFAULT_COMM_TIMEOUT, DEFAULT_MAX_CLIENTS, DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_SHUTDOWN_GRACE,
};

use shell_common::shell;

use crate::connection;

/// Serves clients accepted on `listener` until `shutdown` completes, one task per client on
/// `executor` (run it on as many threads as wanted).
///
/// The behaviour is the tokio shell's `serve`: `TCP_NODELAY` on every client, clients beyond
/// [`ServerConfig::max_clients`] closed at once with a log line, any error closing only that
/// connection, and on shutdown: the listener closed, idle connections closed, busy ones
/// finishing their current command, stragglers dropped after [`ServerConfig::shutdown_grace`].
/// Every buffer the clients held is freed when this returns.
pub async fn serve(
    executor: Arc<Executor<'static>>,
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let connection_config = Arc::new(config.connection_config()?);
    let listener = Async::new(listener)?;
    let slots = config.client_slots();
    // Never sent to: closing it (dropping the sender) tells every connection to stop.
    let (stop_tx, stop_rx) = async_channel::bounded::<()>(1);
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let mut tasks: Vec<Task<()>> = Vec::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            shutdown.as_mut().await;
            None
        })
        .await;
        let Some(accepted) = accepted else {
            break;
        };
        tasks.retain(|task| !task.is_finished());
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                shell::accept_failed(&error);
                Timer::after(shell::ACCEPT_PAUSE).await;
                continue;
            }
        };
        let Some(slot) = slots.admit(peer, stream.get_ref()) else {
            continue;
        };
        let span = tracing::info_span!("client", %peer, shell = "smol");
        let task = connection::run(
            stream,
            backend.clone(),
            connection_config.clone(),
            stop_rx.clone(),
            slot,
        );
        tasks.push(executor.spawn(task.instrument(span).with_subscriber(dispatch.clone())));
    }
    drop(listener);
    tasks.retain(|task| !task.is_finished());
    shell::stopping(tasks.len());
    drop(stop_tx);
    drop(stop_rx);
    let remaining = tasks.len();
    let drained = futures_lite::future::or(
        async move {
            for task in tasks {
                task.await;
            }
            true
        },
        async {
            Timer::after(config.shutdown_grace).await;
            false
        },
    )
    .await;
    if !drained {
        // The tasks were dropped with the losing future, which cancels them.
        shell::grace_over(remaining);
    }
    Ok(())
}

/// Serves on a fresh executor run by `threads` threads (the calling one included) until
/// `shutdown` completes: the whole server in one blocking call.
pub fn run(
    threads: usize,
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let executor = Arc::new(Executor::new());
    let (done_tx, done_rx) = async_channel::bounded::<()>(1);
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let mut workers = Vec::new();
    for index in 1..threads.max(1) {
        let executor = executor.clone();
        let done = done_rx.clone();
        let dispatch = dispatch.clone();
        workers.push(
            std::thread::Builder::new()
                .name(format!("rpc-smol-{index}"))
                .spawn(move || {
                    let _dispatch = tracing::dispatcher::set_default(&dispatch);
                    async_io::block_on(executor.run(async {
                        let _ = done.recv().await;
                    }));
                })?,
        );
    }
    let result = async_io::block_on(executor.run(serve(
        executor.clone(),
        listener,
        backend,
        config,
        shutdown,
    )));
    drop(done_tx);
    for worker in workers {
        let _ = worker.join();
    }
    result
}
