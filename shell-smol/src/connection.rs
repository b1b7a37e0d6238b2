//! One client connection: the loop that runs [`Connection`]'s actions on async-io sockets.
//!
//! * Reads: between messages into a 64 KiB scratch buffer, whose filled part is appended to the
//!   input (small messages: at most one short copy). While a SET_TENSOR / SET_TENSOR_2D payload
//!   streams in, the socket is read straight into the destination in backend memory
//!   (`Connection::receive_in_place`: a non-blocking `recv` into the lent region). Where that
//!   is not possible (data buffered with the header, the tensor cache storing it too, a backend
//!   without host memory), `min(remaining, 8 MiB)` bytes are read into a fresh buffer
//!   of exactly that size, handed to the connection whole: no second copy either way.
//! * Writes: the connection's transmit queue is written with vectored writes straight from its
//!   `Bytes`; a large GET_TENSOR reply goes straight from backend memory
//!   (`Connection::send_in_place`), else one 16 MiB piece at a time.
//! * Blocking backend calls (graph compute, large reads, writes, copies and fills, cache file
//!   I/O, the comm link) run on the `blocking` thread pool: the connection's `Core` (driver and
//!   comm links, one box) moves there for the call and comes back, so the executor threads keep serving
//!   the other connections.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use async_io::{Async, Timer};
use bytes::{Buf, Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use proto_core::backend::Backend;
use proto_core::driver::{Action, Connection, Monitor, Place, Receive};

use shell_common::direct;
use shell_common::shell::{self, ClientSlot, FINAL_FLUSH_TIMEOUT, READ_SIZE};
use shell_common::vectored::{SendQueue, MAX_IO_SLICES};
use shell_common::{CommLinks, Direct};
use shell_rdma::serve::{Served, Upgrader};
use std::os::fd::AsFd;

pub use shell_common::shell::{Closed, ConnectionError};
pub use shell_common::ConnectionConfig;

/// The connection's protocol state and comm links; moves to a blocking thread and back for
/// heavy work.
struct Core {
    conn: Connection,
    links: CommLinks,
}

/// Owns the [`Core`] between blocking calls.
struct Driver {
    core: Option<Box<Core>>,
    dispatch: tracing::Dispatch,
}

impl Driver {
    fn conn(&mut self) -> &mut Connection {
        &mut self
            .core
            .as_mut()
            .expect("the core is only away during a blocking call, which is awaited")
            .conn
    }

    /// Runs `f` on the blocking pool with the core, in the current span and log dispatcher.
    async fn blocking<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> R {
        let mut core = self
            .core
            .take()
            .expect("the core is only away during a blocking call, which is awaited");
        let dispatch = self.dispatch.clone();
        let span = tracing::Span::current();
        let (core, result) = blocking::unblock(move || {
            let result =
                tracing::dispatcher::with_default(&dispatch, || span.in_scope(|| f(&mut core)));
            (core, result)
        })
        .await;
        self.core = Some(core);
        result
    }

    /// Polls the connection, running heavy work and comm work on the blocking pool, until it
    /// needs the socket.
    async fn next_action(&mut self) -> proto_core::Result<Action> {
        let mut action = self.conn().poll(Place::EventLoop)?;
        loop {
            action = match action {
                Action::Offload => {
                    self.blocking(|core| core.conn.poll(Place::Blocking))
                        .await?
                }
                Action::Comm(work) => {
                    self.blocking(move |core| core.links.run(work, &mut core.conn))
                        .await?;
                    self.conn().poll(Place::EventLoop)?
                }
                other => return Ok(other),
            };
        }
    }

    /// Frees everything the client holds: on the blocking pool when that is much, so the
    /// executor thread's other clients do not wait for it.
    async fn release(mut self) {
        if let Some(core) = self.core.take() {
            if core.conn.heavy_to_free() {
                blocking::unblock(move || drop(core)).await;
            }
        }
    }
}

/// Runs an accepted TCP client to its end and logs how it ended. Its `slot` is freed after the
/// client's buffers were freed and the socket closed, before the ending is logged.
pub(crate) async fn run(
    stream: Async<TcpStream>,
    backend: Arc<dyn Backend>,
    config: Arc<ConnectionConfig>,
    stop: async_channel::Receiver<()>,
    slot: ClientSlot,
) {
    shell::accepted(stream.get_ref());
    let mut stream = stream;
    let monitor = Some(slot.monitor());
    let result = serve_monitored(&mut stream, backend, &config, &stop, monitor).await;
    drop(stream);
    let result = slot.ending(result);
    drop(slot);
    shell::log_end(&result);
}

/// Serves one client until it closes, fails, or `stop` is closed (the server shuts down).
///
/// All the client's state lives in this call: when it returns, its buffers are freed.
pub async fn serve_connection(
    stream: &mut Async<TcpStream>,
    backend: Arc<dyn Backend>,
    config: &ConnectionConfig,
    stop: &async_channel::Receiver<()>,
) -> Result<Closed, ConnectionError> {
    serve_monitored(stream, backend, config, stop, None).await
}

/// [`serve_connection`], reporting to admission control's `monitor`.
async fn serve_monitored(
    stream: &mut Async<TcpStream>,
    backend: Arc<dyn Backend>,
    config: &ConnectionConfig,
    stop: &async_channel::Receiver<()>,
    monitor: Option<Arc<dyn Monitor>>,
) -> Result<Closed, ConnectionError> {
    let mut conn = config.connect(backend, true)?;
    if let Some(monitor) = monitor {
        conn.set_monitor(monitor);
    }
    let mut driver = Driver {
        core: Some(Box::new(Core {
            conn,
            links: config.comm_links(),
        })),
        dispatch: tracing::dispatcher::get_default(Clone::clone),
    };
    let upgrader = Upgrader::new(config.transport);
    let result = serve_client(stream, &mut driver, stop, upgrader).await;
    driver.release().await;
    result
}

/// The body of [`serve_connection`]: the client's commands, on `driver`'s core.
async fn serve_client(
    stream: &mut Async<TcpStream>,
    driver: &mut Driver,
    stop: &async_channel::Receiver<()>,
    mut upgrader: Upgrader,
) -> Result<Closed, ConnectionError> {
    let mut scratch = vec![0u8; READ_SIZE];
    let mut queue = SendQueue::new();
    loop {
        let action = match driver.next_action().await {
            Ok(action) => action,
            Err(error) => {
                // Responses owed to earlier requests of the same read still go out.
                let conn = driver.conn();
                let _ = futures_lite::future::or(
                    async {
                        let _ = flush(stream, conn, &mut queue).await;
                    },
                    async {
                        Timer::after(FINAL_FLUSH_TIMEOUT).await;
                    },
                )
                .await;
                return Err(error.into());
            }
        };
        let written = matches!(action, Action::Receive(_));
        if let Some(switch) = upgrader.take_if(written) {
            // HELLO's answer is written: the connection moves to RDMA on the blocking pool.
            let socket = stream.get_ref().try_clone()?;
            let mode = upgrader.mode();
            let stop = stop.clone();
            let served = driver
                .blocking(move |core| {
                    let stopping = || stop.is_closed();
                    switch.serve(
                        socket.as_fd(),
                        mode,
                        &mut core.conn,
                        &mut core.links,
                        &stopping,
                    )
                })
                .await;
            match served {
                Served::Ended(result) => return result,
                Served::StayOnTcp => {}
            }
        }
        let conn = driver.conn();
        match action {
            Action::Transmit => flush(stream, conn, &mut queue).await?,
            Action::SendInPlace => send_direct(stream, conn).await?,
            Action::Receive(Receive::Stream {
                remaining,
                in_place,
            }) => {
                // Streamed tensor data: finished even during shutdown (the grace period bounds it).
                if in_place {
                    match receive_direct(stream, conn).await? {
                        Direct::Moved => continue,
                        Direct::Eof => return shell::end_of_input(conn),
                        Direct::Declined => {}
                    }
                }
                let want = shell::stream_read_size(remaining);
                let (chunk, eof) = read_chunk(stream, want).await?;
                if !chunk.is_empty() {
                    conn.handle_input(chunk);
                }
                if eof {
                    return shell::end_of_input(conn);
                }
            }
            Action::Receive(Receive::Idle) => {
                if stop.is_closed() {
                    return Ok(Closed::Shutdown);
                }
                let read = futures_lite::future::or(
                    async { Some(stream.read(&mut scratch).await) },
                    async {
                        // Closed (never sent to): the server is shutting down.
                        let _ = stop.recv().await;
                        None
                    },
                )
                .await;
                let Some(read) = read else {
                    return Ok(Closed::Shutdown);
                };
                let read = read?;
                if read == 0 {
                    return shell::end_of_input(conn);
                }
                conn.handle_input(Bytes::copy_from_slice(&scratch[..read]));
            }
            Action::Upgrade(peer) => {
                let local = stream.get_ref().local_addr()?;
                conn.answer_hello(upgrader.answer(local.ip(), &peer)?)?;
            }
            // `next_action` runs these.
            Action::Offload | Action::Comm(_) => {}
        }
    }
}

/// Receives the next part of the streamed write straight into backend memory.
///
/// Unlike [`send_direct`], this waits for readiness before each `recv`: one `recv` takes all
/// that is queued, so trying again at once mostly finds the socket empty, and a 256 MiB
/// SET_TENSOR ran 10 % slower that way (ten interleaved rounds each: 0.95x against 1.05x the
/// tokio shell).
async fn receive_direct(
    stream: &Async<TcpStream>,
    conn: &mut Connection,
) -> Result<Direct, ConnectionError> {
    loop {
        stream.readable().await?;
        if let Some(direct) = direct::receive_once(conn, |dst| stream.get_ref().read(dst))? {
            return Ok(direct);
        }
    }
}

/// Sends the rest of the reply in progress (its head already written) straight from backend
/// memory; stops early if the backend cannot lend its memory (the driver then goes piece by
/// piece).
///
/// Each piece is tried first and the reactor asked only once the socket is full: async-io's
/// `writable()` keeps no readiness between calls (unlike tokio's), so awaiting it before every
/// 512 KiB piece cost a trip through the reactor each and held a 256 MiB GET_TENSOR to half the
/// tokio shell's rate (2.7 against 6.3 GB/s; tried first: 1.00x, ten interleaved rounds).
async fn send_direct(
    stream: &Async<TcpStream>,
    conn: &mut Connection,
) -> Result<(), ConnectionError> {
    while conn.reply_remaining() > 0 {
        match direct::send_once(conn, |src| stream.get_ref().write(src))? {
            Some(Direct::Declined) => return Ok(()),
            Some(_) => {}
            None => stream.writable().await?,
        }
    }
    Ok(())
}

/// Reads up to `want` bytes into a fresh buffer of exactly that size, stopping early only at
/// EOF. Returns the bytes and whether EOF was reached.
async fn read_chunk(stream: &mut Async<TcpStream>, want: usize) -> io::Result<(Bytes, bool)> {
    let mut buf = BytesMut::zeroed(want);
    let mut filled = 0;
    while filled < want {
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            buf.truncate(filled);
            return Ok((buf.freeze(), true));
        }
        filled += n;
    }
    Ok((buf.freeze(), false))
}

/// Writes out everything the connection queued, with vectored writes straight from its `Bytes`
/// (each offering at most one [`SEND_PIECE`](direct::SEND_PIECE): see [`SendQueue`]), through
/// the connection's `queue` (empty, kept for its allocation).
async fn flush(
    stream: &mut Async<TcpStream>,
    conn: &mut Connection,
    queue: &mut SendQueue,
) -> io::Result<()> {
    queue.extend(std::iter::from_fn(|| conn.poll_transmit()));
    while !queue.is_empty() {
        let mut slices = [IoSlice::new(&[]); MAX_IO_SLICES];
        let count = queue.chunks_vectored(&mut slices);
        let written = stream.write_vectored(&slices[..count]).await?;
        queue.written(written)?;
    }
    Ok(())
}
