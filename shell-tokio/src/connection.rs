//! One client connection: the loop that runs [`Connection`]'s actions on a tokio socket.
//!
//! It has no protocol logic. Reads: between messages into one reusable buffer whose filled
//! part goes to the connection (`split().freeze()`, no copy); streamed SET_TENSOR data straight
//! into backend memory when the driver says so (a non-blocking `recv` into the lent region,
//! copied once, by the kernel), else `min(remaining, 8 MiB)` bytes into a fresh buffer handed
//! over whole. Writes: the transmit queue with vectored writes straight from its `Bytes`; a
//! large GET_TENSOR reply straight from backend memory.
//!
//! Blocking backend calls: commands that may take long (graph compute, large reads, writes,
//! copies and fills, cache file I/O) run under [`tokio::task::block_in_place`] when the
//! runtime is multi-threaded, everything else inline. Commands of one connection are strictly
//! sequential anyway (the next command is not read before the current one finished, as in the
//! reference), so the only thing to protect is the *other* connections sharing the worker
//! thread: `block_in_place` hands them to another worker while this one blocks, and it keeps
//! the dispatcher where it is (borrowed, not moved), with no thread hop for small commands.
//! `spawn_blocking` would have to move the dispatcher into a `'static` closure and back for
//! every call and pay a thread handoff each time. On a current-thread runtime (tests, tools)
//! `block_in_place` is unavailable and every call runs inline.
//!
//! `Blocking::InlineWhenAlone` (connections of [`serve_on`](crate::server::serve_on), whose
//! accept loop runs outside the connections' runtime) also runs a heavy call inline while its
//! connection's task is the runtime's only task. Then nothing can wait behind the worker: no
//! other task sits in its queues, and a client accepted meanwhile is spawned from outside the
//! workers into the shared queue, which another worker takes (and with it the sockets' poll).
//! `block_in_place` hands the worker to another thread and back, about seven context switches
//! per call: per generated token of a small model, more than half of the server's switches.

use std::io::{self, Write as _};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use proto_core::backend::Backend;
use proto_core::driver::{Action, Connection, Monitor, Place, Receive};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt,
};
use tokio::net::TcpStream;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::watch;

use shell_common::direct;
use shell_common::{CommLinks, Direct};

use shell_common::shell::{self, ClientSlot, FINAL_FLUSH_TIMEOUT, READ_SIZE};
pub use shell_common::shell::{Closed, ConnectionError};
use shell_common::vectored::SendQueue;
pub use shell_common::ConnectionConfig;
use shell_rdma::serve::{Served, Upgrader};
use std::os::fd::AsFd;

/// How a connection runs its heavy (possibly long, blocking) backend calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocking {
    /// Under `block_in_place` on a multi-threaded runtime, inline otherwise.
    InPlace,
    /// Inline while the connection's task is the runtime's only task and another worker is
    /// there, else as [`Blocking::InPlace`]. Only for runtimes whose clients are accepted
    /// outside their workers (see the module docs).
    InlineWhenAlone,
}

/// A byte stream that may also be read into and written from borrowed memory without
/// blocking: a TCP socket. Tensor data then moves between the socket and backend memory with
/// no buffer in between. Other streams (in-memory pipes in tests) keep the default `None` and
/// take the buffered path.
pub trait DirectIo {
    /// The TCP socket under the stream, when it is one.
    fn socket(&self) -> Option<&TcpStream> {
        None
    }

    /// The TLS session's plaintext writer, when the stream is TLS: a large reply is then
    /// encrypted straight from backend memory instead of first copied into pieces.
    fn tls_writer(&mut self) -> Option<tokio_rustls::rustls::Writer<'_>> {
        None
    }

    /// The TLS stream's decrypted input, when the stream is TLS: streamed tensor data is then
    /// copied from it straight into backend memory.
    fn decrypted(&mut self) -> Option<&mut (dyn AsyncBufRead + Send + Unpin)> {
        None
    }
}

impl DirectIo for TcpStream {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl DirectIo for tokio::io::DuplexStream {}

// The bytes on the socket are ciphertext: tensor data goes through rustls's buffers.
impl DirectIo for tokio_rustls::server::TlsStream<tokio::io::BufReader<TcpStream>> {
    fn tls_writer(&mut self) -> Option<tokio_rustls::rustls::Writer<'_>> {
        Some(self.get_mut().1.writer())
    }

    fn decrypted(&mut self) -> Option<&mut (dyn AsyncBufRead + Send + Unpin)> {
        Some(self)
    }
}

/// Receives the next part of the streamed write straight into backend memory.
async fn receive_direct(
    socket: &TcpStream,
    conn: &mut Connection,
) -> Result<Direct, ConnectionError> {
    loop {
        socket.readable().await?;
        if let Some(direct) = direct::receive_once(conn, |dst| socket.try_read(dst))? {
            return Ok(direct);
        }
    }
}

/// Sends the rest of the reply in progress (its head already written) straight from backend
/// memory; stops early if the backend cannot lend its memory (the driver then goes piece by
/// piece).
async fn send_direct(socket: &TcpStream, conn: &mut Connection) -> Result<(), ConnectionError> {
    while conn.reply_remaining() > 0 {
        socket.writable().await?;
        if let Some(Direct::Declined) = direct::send_once(conn, |src| socket.try_write(src))? {
            return Ok(());
        }
    }
    Ok(())
}

/// Copies what the TLS stream has decrypted (waiting for some) straight into the memory the
/// connection lends for the streamed write: no buffer in between, so no fresh 8 MiB buffer
/// (and its page faults) per piece.
async fn receive_decrypted(
    decrypted: &mut (dyn AsyncBufRead + Send + Unpin),
    conn: &mut Connection,
) -> Result<Direct, ConnectionError> {
    let plain = decrypted.fill_buf().await?;
    if plain.is_empty() {
        return Ok(Direct::Eof);
    }
    let mut taken = 0;
    let moved = direct::receive_once(conn, |dst| {
        taken = dst.len().min(plain.len());
        dst[..taken].copy_from_slice(&plain[..taken]);
        Ok(taken)
    })?;
    decrypted.consume(taken);
    // Data was there, so "nothing moved" cannot happen; `None` would only mean "try again".
    Ok(moved.unwrap_or(Direct::Moved))
}

/// Sends the rest of the reply in progress through the stream's TLS writer, straight from
/// backend memory (rustls copies each piece once, into the records it encrypts); a stream
/// without one (or a backend that cannot lend) goes piece by piece instead.
async fn send_encrypted<S>(stream: &mut S, conn: &mut Connection) -> Result<(), ConnectionError>
where
    S: AsyncWrite + DirectIo + Unpin,
{
    while conn.reply_remaining() > 0 {
        // The writer is not `Send`: it lives only for this one call, never across an await.
        let sent = match stream.tls_writer() {
            // rustls takes what fits under its buffer limit (0 when full: the flush makes room).
            Some(mut writer) => direct::send_once(conn, |src| writer.write(src))?,
            None => {
                conn.set_direct_io(false);
                return Ok(());
            }
        };
        if sent == Some(Direct::Declined) {
            return Ok(());
        }
        stream.flush().await?;
    }
    Ok(())
}

/// Runs an accepted TCP client to its end and logs how it ended.
pub(crate) async fn run(
    stream: TcpStream,
    backend: Arc<dyn Backend>,
    config: Arc<ConnectionConfig>,
    mut stop: watch::Receiver<bool>,
    blocking: Blocking,
    slot: ClientSlot,
) {
    shell::accepted(&stream);
    let mut stream = stream;
    // The connection lives inside `serve`, so every buffer is freed before the socket closes:
    // a client that sees EOF sees the server's memory back to baseline.
    let monitor = Some(slot.monitor());
    let result = serve(&mut stream, backend, &config, &mut stop, blocking, monitor).await;
    drop(stream);
    shell::log_end(&slot.ending(result));
}

/// Serves one client on any byte stream until it closes, fails, or `stop` turns true.
///
/// All the client's state lives in this call: when it returns, its buffers are freed. The
/// stream is not closed here; the caller drops it.
pub async fn serve_connection<S>(
    stream: &mut S,
    backend: Arc<dyn Backend>,
    config: &ConnectionConfig,
    stop: &mut watch::Receiver<bool>,
) -> Result<Closed, ConnectionError>
where
    S: AsyncRead + AsyncWrite + DirectIo + Unpin,
{
    serve(stream, backend, config, stop, Blocking::InPlace, None).await
}

/// [`serve_connection`] with heavy calls run as `blocking` says, reporting to admission
/// control's `monitor`.
pub(crate) async fn serve<S>(
    stream: &mut S,
    backend: Arc<dyn Backend>,
    config: &ConnectionConfig,
    stop: &mut watch::Receiver<bool>,
    blocking: Blocking,
    monitor: Option<Arc<dyn Monitor>>,
) -> Result<Closed, ConnectionError>
where
    S: AsyncRead + AsyncWrite + DirectIo + Unpin,
{
    let lends = stream.socket().is_some() || stream.tls_writer().is_some();
    let mut conn = config.connect(backend, lends)?;
    if let Some(monitor) = monitor {
        conn.set_monitor(monitor);
    }
    let mut links = config.comm_links();
    let upgrader = Upgrader::new(config.transport);
    let result = serve_client(stream, &mut conn, &mut links, stop, blocking, upgrader).await;
    // Everything the client held goes back here, off the worker's other clients if it is much.
    if conn.heavy_to_free() {
        run_blocking(blocking, move || drop(conn));
    }
    result
}

/// The body of [`serve`]: the client's commands, on `conn`.
async fn serve_client<S>(
    stream: &mut S,
    conn: &mut Connection,
    links: &mut CommLinks,
    stop: &mut watch::Receiver<bool>,
    blocking: Blocking,
    mut upgrader: Upgrader,
) -> Result<Closed, ConnectionError>
where
    S: AsyncRead + AsyncWrite + DirectIo + Unpin,
{
    let mut read_buf = BytesMut::new();
    let mut queue = SendQueue::new();
    loop {
        let action = match next_action(conn, links, blocking) {
            Ok(action) => action,
            Err(error) => {
                // Responses owed to earlier requests of the same read still go out, as they
                // would from the reference, which answers each command before reading the next.
                let flushed = flush(stream, conn, &mut queue);
                let _ = tokio::time::timeout(FINAL_FLUSH_TIMEOUT, flushed).await;
                return Err(error.into());
            }
        };
        if let (Action::Receive(_), Some(socket)) = (&action, stream.socket()) {
            // HELLO's answer is written: the connection moves to RDMA, off the event loop.
            if let Some(switch) = upgrader.take() {
                let mode = upgrader.mode();
                let stopping = || *stop.borrow();
                match run_blocking(blocking, || {
                    switch.serve(socket.as_fd(), mode, conn, links, &stopping)
                }) {
                    Served::Ended(result) => return result,
                    Served::StayOnTcp => {}
                }
            }
        }
        match action {
            Action::Transmit => flush(stream, conn, &mut queue).await?,
            Action::SendInPlace => match stream.socket() {
                Some(socket) => send_direct(socket, conn).await?,
                None => send_encrypted(stream, conn).await?,
            },
            Action::Receive(Receive::Stream {
                remaining,
                in_place,
            }) => {
                // Streamed tensor data: finish it even during shutdown (the grace period bounds
                // that), so a client never gets half a tensor written.
                if let (true, Some(socket)) = (in_place, stream.socket()) {
                    match receive_direct(socket, conn).await? {
                        Direct::Moved => continue,
                        Direct::Eof => return shell::end_of_input(conn),
                        Direct::Declined => {}
                    }
                } else if let (true, Some(decrypted)) = (in_place, stream.decrypted()) {
                    match receive_decrypted(decrypted, conn).await? {
                        Direct::Moved => continue,
                        Direct::Eof => return shell::end_of_input(conn),
                        Direct::Declined => {}
                    }
                }
                let (chunk, eof) = read_chunk(stream, shell::stream_read_size(remaining)).await?;
                if !chunk.is_empty() {
                    conn.handle_input(chunk);
                }
                if eof {
                    return shell::end_of_input(conn);
                }
            }
            Action::Receive(Receive::Idle) => {
                if *stop.borrow() {
                    return Ok(Closed::Shutdown);
                }
                read_buf.reserve(READ_SIZE);
                let read = tokio::select! {
                    read = stream.read_buf(&mut read_buf) => read?,
                    changed = stop.changed() => {
                        // A dropped sender also means the server is gone.
                        let _ = changed;
                        return Ok(Closed::Shutdown);
                    }
                };
                if read == 0 {
                    return shell::end_of_input(conn);
                }
                conn.handle_input(read_buf.split().freeze());
            }
            Action::Upgrade(peer) => {
                let caps = match stream.socket().map(TcpStream::local_addr) {
                    Some(Ok(local)) => upgrader.answer(local.ip(), &peer)?,
                    // An in-memory stream has no second transport.
                    _ => [0; 24],
                };
                conn.answer_hello(caps)?;
            }
            // `next_action` runs these.
            Action::Offload | Action::Comm(_) => {}
        }
    }
}

/// Polls the connection, running heavy work and comm work as `blocking` says, until it needs
/// the socket.
fn next_action(
    conn: &mut Connection,
    links: &mut CommLinks,
    blocking: Blocking,
) -> proto_core::Result<Action> {
    let mut action = conn.poll(Place::EventLoop)?;
    loop {
        action = match action {
            Action::Offload => run_blocking(blocking, || conn.poll(Place::Blocking))?,
            Action::Comm(work) => {
                run_blocking(blocking, || links.run(work, conn))?;
                conn.poll(Place::EventLoop)?
            }
            other => return Ok(other),
        };
    }
}

/// Runs the heavy call `f` as `blocking` says (see [`Blocking`]).
fn run_blocking<R>(blocking: Blocking, f: impl FnOnce() -> R) -> R {
    let Ok(handle) = Handle::try_current() else {
        return f();
    };
    if handle.runtime_flavor() != RuntimeFlavor::MultiThread {
        return f();
    }
    let metrics = handle.metrics();
    let alone = metrics.num_alive_tasks() <= 1 && metrics.num_workers() >= 2;
    if blocking == Blocking::InlineWhenAlone && alone {
        f()
    } else {
        tokio::task::block_in_place(f)
    }
}

/// Reads up to `want` bytes into a fresh buffer of exactly that size, stopping early only at
/// EOF. Returns the bytes and whether EOF was reached.
async fn read_chunk<S: AsyncRead + Unpin>(
    stream: &mut S,
    want: usize,
) -> io::Result<(Bytes, bool)> {
    let mut buf = BytesMut::with_capacity(want);
    while buf.len() < want {
        let room = want - buf.len();
        if stream.read_buf(&mut (&mut buf).limit(room)).await? == 0 {
            return Ok((buf.freeze(), true));
        }
    }
    Ok((buf.freeze(), false))
}

/// Writes out everything the connection queued, with vectored writes straight from its `Bytes`
/// (each offering at most one [`SEND_PIECE`](direct::SEND_PIECE): see [`SendQueue`]), through
/// the connection's `queue` (empty, kept for its allocation).
async fn flush<S: AsyncWrite + Unpin>(
    stream: &mut S,
    conn: &mut Connection,
    queue: &mut SendQueue,
) -> io::Result<()> {
    queue.extend(std::iter::from_fn(|| conn.poll_transmit()));
    stream.write_all_buf(queue).await?;
    stream.flush().await
}
