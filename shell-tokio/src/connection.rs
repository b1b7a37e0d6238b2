//! One client connection: socket bytes → [`ServerSession`] → [`Dispatcher`] → socket bytes.
//!
//! The driver has no protocol logic: it reads, feeds the session, hands every event to the
//! dispatcher, queues the responses and writes out the session's transmit queue.
//!
//! Reads: between messages the driver reads into one reusable buffer and hands the filled part
//! to the session (`split().freeze()`, no copy). While a SET_TENSOR / SET_TENSOR_2D payload
//! streams in over TCP, the socket is read straight into the destination in backend memory
//! ([`Dispatcher::receive_in_place`]: a non-blocking `recv` into the lent region), so the data
//! is copied once, by the kernel. Where that is not possible (data already buffered with the
//! header, the tensor cache also storing it, a backend without host memory, a non-TCP stream)
//! it reads `min(stream_remaining(), 8 MiB)` bytes into a fresh buffer of exactly that size
//! and hands the whole piece over, so the backend receives it without a second copy.
//!
//! Writes: the session's transmit queue (a response header, small replies) is written with
//! vectored writes straight from its `Bytes`: no frame is ever assembled in a second buffer.
//! A large GET_TENSOR reply is sent straight from backend memory over TCP
//! ([`Dispatcher::send_in_place`]), else piece by piece through the queue.
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
//! [`Blocking::InlineWhenAlone`] (connections of [`serve_on`](crate::server::serve_on), whose
//! accept loop runs outside the connections' runtime) also runs a heavy call inline while its
//! connection's task is the runtime's only task. Then nothing can wait behind the worker: no
//! other task sits in its queues, and a client accepted meanwhile is spawned from outside the
//! workers into the shared queue, which another worker takes (and with it the sockets' poll).
//! `block_in_place` hands the worker to another thread and back, about seven context switches
//! per call: per generated token of a small model, more than half of the server's switches.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use proto_core::backend::{Backend, TensorLocation};
use proto_core::dispatch::{Dispatcher, Outcome, TensorReadStream};
use proto_core::session::ServerSession;
use proto_core::wire::CommInitRequest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::watch;

use shell_common::direct::{self, record};
use shell_common::{is_heavy, is_heavy_to_free, Direct};

use crate::comm_link::CommLink;

/// Bytes read at once between messages.
const READ_SIZE: usize = 64 * 1024;
/// Bytes read at once while SET_TENSOR data streams (each read is one session chunk, within
/// the core's 16 MiB bound); smaller pieces keep the server's peak memory close to the tensor.
const STREAM_READ_SIZE: usize = 8 * 1024 * 1024;
/// Most buffers passed to one vectored write.
const MAX_IO_SLICES: usize = 64;
/// How long a failing connection may take to flush the responses it already owed.
const FINAL_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

pub use shell_common::ConnectionConfig;

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

/// Work of an event that needs the sockets, done outside the synchronous event loop.
enum Deferred {
    /// A large reply, written piece by piece.
    Reply(TensorReadStream),
    /// The comm link.
    Comm(CommWork),
}

/// Work of an event that needs sockets besides the client's (the comm link).
enum CommWork {
    Init(Box<CommInitRequest>),
    Allreduce {
        device: u32,
        at: TensorLocation,
        elements: u64,
    },
}

/// Why a connection ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The client closed its side between two messages.
    ByClient,
    /// The server is shutting down.
    Shutdown,
}

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The client broke the protocol or a command failed.
    #[error(transparent)]
    Protocol(#[from] proto_core::Error),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
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
}

impl DirectIo for TcpStream {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl DirectIo for tokio::io::DuplexStream {}

/// Receives the next part of the streamed write straight into backend memory.
async fn receive_direct(
    socket: &TcpStream,
    session: &mut ServerSession,
    dispatcher: &mut Dispatcher<dyn Backend>,
) -> Result<Direct, ConnectionError> {
    loop {
        socket.readable().await?;
        let mut outcome = None;
        let lent = dispatcher.receive_in_place(session, &mut |dst| {
            record(socket.try_read(dst), &mut outcome)
        })?;
        if let Some(direct) = direct::received(lent, outcome)? {
            return Ok(direct);
        }
    }
}

/// Sends the rest of a streamed reply (its head already written) straight from backend
/// memory; `Declined` if the backend cannot lend its memory (nothing was sent then).
async fn send_direct(
    socket: &TcpStream,
    session: &mut ServerSession,
    // `&mut`: held across awaits, and the dispatcher is Send but not Sync.
    dispatcher: &mut Dispatcher<dyn Backend>,
    reply: &mut TensorReadStream,
) -> Result<Direct, ConnectionError> {
    while reply.remaining() > 0 {
        socket.writable().await?;
        let mut outcome = None;
        let lent = dispatcher.send_in_place(reply, session, &mut |src| {
            record(socket.try_write(direct::send_piece(src)), &mut outcome)
        })?;
        if let Some(Direct::Declined) = direct::sent(lent, outcome)? {
            return Ok(Direct::Declined);
        }
    }
    Ok(Direct::Moved)
}

/// Runs an accepted TCP client to its end and logs how it ended.
pub(crate) async fn run(
    stream: TcpStream,
    backend: Arc<dyn Backend>,
    config: Arc<ConnectionConfig>,
    mut stop: watch::Receiver<bool>,
    blocking: Blocking,
) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::warn!(%error, kind = %error.kind(), "cannot set TCP_NODELAY");
    }
    shell_common::tune_or_log(&stream);
    tracing::info!("Accepted client connection");
    let mut stream = stream;
    // The dispatcher lives inside `serve_connection`, so every buffer is freed before the
    // socket closes: a client that sees EOF sees the server's memory back to baseline.
    let result = serve(&mut stream, backend, &config, &mut stop, blocking).await;
    drop(stream);
    match result {
        Ok(Closed::ByClient) => tracing::info!("Client connection closed"),
        Ok(Closed::Shutdown) => {
            tracing::info!("Client connection closed: server shutting down")
        }
        Err(ConnectionError::Protocol(error)) => tracing::warn!(
            %error,
            kind = %error.kind(),
            "Client connection closed on error"
        ),
        Err(ConnectionError::Io(error)) => tracing::warn!(
            %error,
            kind = %error.kind(),
            "Client connection closed on I/O error"
        ),
    }
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
    serve(stream, backend, config, stop, Blocking::InPlace).await
}

/// [`serve_connection`] with heavy calls run as `blocking` says.
async fn serve<S>(
    stream: &mut S,
    backend: Arc<dyn Backend>,
    config: &ConnectionConfig,
    stop: &mut watch::Receiver<bool>,
    blocking: Blocking,
) -> Result<Closed, ConnectionError>
where
    S: AsyncRead + AsyncWrite + DirectIo + Unpin,
{
    let mut dispatcher = Dispatcher::new(backend, config.dispatcher.clone())?;
    let result = serve_client(stream, &mut dispatcher, config, stop, blocking).await;
    // Everything the client held goes back here, off the worker's other clients if it is much.
    if is_heavy_to_free(dispatcher.buffers()) {
        run_blocking(blocking, move || drop(dispatcher));
    }
    result
}

/// The body of [`serve`]: the client's commands, against `dispatcher`.
async fn serve_client<S>(
    stream: &mut S,
    dispatcher: &mut Dispatcher<dyn Backend>,
    config: &ConnectionConfig,
    stop: &mut watch::Receiver<bool>,
    blocking: Blocking,
) -> Result<Closed, ConnectionError>
where
    S: AsyncRead + AsyncWrite + DirectIo + Unpin,
{
    let mut session = ServerSession::new(config.session.clone());
    let mut read_buf = BytesMut::new();
    let mut links: HashMap<u32, CommLink> = HashMap::new();
    loop {
        let processed = match process_events(&mut session, dispatcher, &mut links, blocking) {
            Ok(Some(Deferred::Reply(reply))) => {
                flush(stream, &mut session).await?;
                send_reply(stream, &mut session, dispatcher, reply, blocking).await?;
                continue;
            }
            Ok(Some(Deferred::Comm(work))) => {
                // Flush first: the client may be waiting for earlier responses.
                flush(stream, &mut session).await?;
                comm_work(
                    work,
                    &mut session,
                    dispatcher,
                    &mut links,
                    config.comm_timeout,
                    blocking,
                )
                .await
                .map(|()| true)
            }
            Ok(None) => Ok(false),
            Err(error) => Err(error),
        };
        match processed {
            Err(error) => {
                // Responses owed to earlier requests of the same read still go out, as they
                // would from the reference, which answers each command before reading the next.
                let _ =
                    tokio::time::timeout(FINAL_FLUSH_TIMEOUT, flush(stream, &mut session)).await;
                return Err(error.into());
            }
            // More complete requests may already be buffered behind the comm command.
            Ok(true) => continue,
            Ok(false) => {}
        }
        flush(stream, &mut session).await?;

        let remaining = session.stream_remaining();
        if remaining > 0 {
            // Streamed tensor data: finish it even during shutdown (the grace period bounds
            // that), so a client never gets half a tensor written.
            if let Some(socket) = stream.socket() {
                if session.in_place_capacity() > 0 {
                    match receive_direct(socket, &mut session, dispatcher).await? {
                        Direct::Moved => continue,
                        Direct::Eof => {
                            session.handle_eof()?;
                            return Ok(Closed::ByClient);
                        }
                        Direct::Declined => {}
                    }
                }
            }
            let want =
                usize::try_from(remaining.min(STREAM_READ_SIZE as u64)).unwrap_or(STREAM_READ_SIZE);
            let (chunk, eof) = read_chunk(stream, want).await?;
            if !chunk.is_empty() {
                session.handle_input(chunk);
            }
            if eof {
                session.handle_eof()?;
                return Ok(Closed::ByClient);
            }
            continue;
        }

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
            session.handle_eof()?;
            return Ok(Closed::ByClient);
        }
        session.handle_input(read_buf.split().freeze());
    }
}

/// Hands every complete event to the dispatcher and queues the responses, until one needs
/// the comm link (returned, to be run by [`comm_work`]) or more input is needed.
fn process_events(
    session: &mut ServerSession,
    dispatcher: &mut Dispatcher<dyn Backend>,
    links: &mut HashMap<u32, CommLink>,
    blocking: Blocking,
) -> proto_core::Result<Option<Deferred>> {
    while let Some(event) = session.poll_event()? {
        let outcome = if is_heavy(&event, dispatcher.buffers()) {
            run_blocking(blocking, || dispatcher.handle(event))?
        } else {
            dispatcher.handle(event)?
        };
        match outcome {
            Outcome::Done => {}
            Outcome::Respond(response) => session.send_response(&response)?,
            Outcome::RespondStream(reply) => return Ok(Some(Deferred::Reply(reply))),
            Outcome::CommFree { device } => {
                if links.remove(&device).is_some() {
                    tracing::info!(device, "comm link closed");
                }
            }
            Outcome::CommInit(request) => return Ok(Some(Deferred::Comm(CommWork::Init(request)))),
            Outcome::CommAllreduce {
                device,
                at,
                elements,
            } => {
                return Ok(Some(Deferred::Comm(CommWork::Allreduce {
                    device,
                    at,
                    elements,
                })))
            }
        }
    }
    Ok(None)
}

/// Writes a large GET_TENSOR reply one piece (at most 16 MiB) at a time, so the server never
/// holds more than one piece of it.
async fn send_reply<S: AsyncWrite + DirectIo + Unpin>(
    stream: &mut S,
    session: &mut ServerSession,
    // `&mut`, not `&`: the future must be Send, and the dispatcher is Send but not Sync.
    dispatcher: &mut Dispatcher<dyn Backend>,
    mut reply: TensorReadStream,
    blocking: Blocking,
) -> Result<(), ConnectionError> {
    session.begin_response_stream(reply.command(), reply.len())?;
    if let Some(socket) = stream.socket() {
        // The head goes first, then the data straight from backend memory.
        let mut queue = Vec::new();
        while let Some(bytes) = session.poll_transmit() {
            queue.push(bytes);
        }
        write_all_vectored_socket(socket, queue).await?;
        if let Direct::Moved = send_direct(socket, session, dispatcher, &mut reply).await? {
            return Ok(());
        }
    }
    while let Some(piece) = run_blocking(blocking, || dispatcher.read_chunk(&mut reply))? {
        session.send_response_data(piece)?;
        flush(stream, session).await?;
    }
    flush(stream, session).await?;
    Ok(())
}

/// Runs COMM_INIT (sets up the link; a failure is the soft answer `ok = 0`) or COMM_ALLREDUCE
/// (reads the partial from the backend, exchanges it, writes the sums back; a failure closes
/// the connection, as in the reference).
async fn comm_work(
    work: CommWork,
    session: &mut ServerSession,
    dispatcher: &mut Dispatcher<dyn Backend>,
    links: &mut HashMap<u32, CommLink>,
    timeout: Duration,
    blocking: Blocking,
) -> proto_core::Result<()> {
    match work {
        CommWork::Init(request) => {
            let device = request.device;
            let ok = match CommLink::establish(&request, timeout).await {
                Ok(link) => {
                    tracing::info!(device, rank = link.rank(), "comm link ready");
                    links.insert(device, link);
                    true
                }
                Err(error) => {
                    tracing::warn!(%error, device, rank = request.rank, world = request.world, "COMM_INIT failed");
                    false
                }
            };
            let response = dispatcher.finish_comm_init(device, ok);
            session.send_response(&response)
        }
        CommWork::Allreduce {
            device,
            at,
            elements,
        } => {
            let link = links.get_mut(&device).ok_or_else(|| {
                proto_core::Error::Comm(format!("no comm link for device {device}"))
            })?;
            let len = usize::try_from(elements)
                .ok()
                .and_then(|n| n.checked_mul(4))
                .ok_or(proto_core::Error::SizeOverflow("all-reduce tensor"))?;
            let backend = dispatcher.backend().clone();
            let mut bytes = vec![0u8; len];
            run_blocking(blocking, || backend.read(at, &mut bytes))?;
            let local: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let sums = link.allreduce(local).await?;
            for (out, value) in bytes.chunks_exact_mut(4).zip(&sums) {
                out.copy_from_slice(&value.to_le_bytes());
            }
            run_blocking(blocking, || backend.write(at, &bytes))
        }
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

/// Writes out everything the session queued, with vectored writes straight from its `Bytes`.
async fn flush<S: AsyncWrite + Unpin>(
    stream: &mut S,
    session: &mut ServerSession,
) -> io::Result<()> {
    let mut queue: Vec<Bytes> = Vec::new();
    while let Some(bytes) = session.poll_transmit() {
        queue.push(bytes);
    }
    write_all_vectored(stream, queue).await
}

/// [`write_all_vectored`] through a shared reference to a TCP socket.
async fn write_all_vectored_socket(socket: &TcpStream, queue: Vec<Bytes>) -> io::Result<()> {
    let mut writer = SocketWriter(socket);
    write_all_vectored(&mut writer, queue).await
}

/// `AsyncWrite` over `&TcpStream` (tokio implements it for `TcpStream` only by `&mut`).
struct SocketWriter<'a>(&'a TcpStream);

impl AsyncWrite for SocketWriter<'_> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return std::task::Poll::Ready(other),
            }
        }
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return std::task::Poll::Ready(other),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Writes a list of buffers in order, in as few system calls as the socket allows, each
/// offering at most [`SEND_PIECE`](direct::SEND_PIECE) bytes (a 256 MiB SET_TENSOR from the
/// client went 35 % faster in such pieces than in writes of all the socket would take; see
/// there why).
pub(crate) async fn write_all_vectored<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut queue: Vec<Bytes>,
) -> io::Result<()> {
    queue.retain(|b| !b.is_empty());
    let mut first = 0;
    while first < queue.len() {
        let written = {
            let mut offered = 0;
            let slices: Vec<io::IoSlice<'_>> = queue[first..]
                .iter()
                .take(MAX_IO_SLICES)
                .map_while(|b| {
                    let take = b.len().min(direct::SEND_PIECE - offered);
                    offered += take;
                    (take > 0).then(|| io::IoSlice::new(&b[..take]))
                })
                .collect();
            stream.write_vectored(&slices).await?
        };
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut left = written;
        while left > 0 {
            let Some(front) = queue.get_mut(first) else {
                break;
            };
            let step = left.min(front.len());
            front.advance(step);
            left -= step;
            if front.is_empty() {
                first += 1;
            }
        }
    }
    stream.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the bytes of each write call; takes at most `accept` bytes per call.
    struct Recorder {
        calls: Vec<usize>,
        data: Vec<u8>,
        accept: usize,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            let n = buf.len().min(self.accept);
            self.calls.push(n);
            self.data.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> std::task::Poll<io::Result<usize>> {
            let mut n = 0;
            for buf in bufs {
                let take = buf.len().min(self.accept - n);
                self.data.extend_from_slice(&buf[..take]);
                n += take;
            }
            self.calls.push(bufs.iter().map(|b| b.len()).sum());
            std::task::Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn vectored_writes_offer_one_piece_at_a_time_and_keep_the_order() {
        let piece = direct::SEND_PIECE;
        let queue: Vec<Bytes> = vec![
            Bytes::from_static(b"head"),
            Bytes::new(),
            (0..piece * 2 + 100).map(|i| (i % 251) as u8).collect(),
            Bytes::from_static(b"tail"),
        ];
        let expected: Vec<u8> = queue.iter().flat_map(|b| b.iter().copied()).collect();
        // A socket that takes everything offered, and one that takes a little at a time.
        for accept in [usize::MAX, 3000] {
            let mut writer = Recorder {
                calls: Vec::new(),
                data: Vec::new(),
                accept,
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime
                .block_on(write_all_vectored(&mut writer, queue.clone()))
                .unwrap();
            assert!(writer.data == expected, "bytes in order (accept {accept})");
            assert!(writer.calls.iter().all(|&n| n > 0 && n <= piece));
            if accept == usize::MAX {
                // head + the first piece's rest, then whole pieces, then the end with the tail.
                assert_eq!(writer.calls.len(), 3);
            }
        }
    }
}
