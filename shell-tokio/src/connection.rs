//! One client connection: socket bytes → [`ServerSession`] → [`Dispatcher`] → socket bytes.
//!
//! The driver has no protocol logic: it reads, feeds the session, hands every event to the
//! dispatcher, queues the responses and writes out the session's transmit queue.
//!
//! Reads: between messages the driver reads into one reusable buffer and hands the filled part
//! to the session (`split().freeze()`, no copy). While a SET_TENSOR / SET_TENSOR_2D payload
//! streams in, it reads `min(stream_remaining(), 16 MiB)` bytes into a fresh buffer of exactly
//! that size and hands the whole piece over, so the session slices the data out of it and the
//! backend receives it without a second copy, in chunks of at most 16 MiB.
//!
//! Writes: the session's transmit queue (a response header, then for GET_TENSOR the tensor
//! bytes as the backend produced them) is written with vectored writes straight from those
//! `Bytes`: no frame is ever assembled in a second buffer.
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

use shell_common::is_heavy;

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

/// Runs an accepted TCP client to its end and logs how it ended.
pub(crate) async fn run(
    stream: TcpStream,
    backend: Arc<dyn Backend>,
    config: Arc<ConnectionConfig>,
    mut stop: watch::Receiver<bool>,
) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::warn!(%error, kind = %error.kind(), "cannot set TCP_NODELAY");
    }
    tracing::info!("Accepted client connection");
    let mut stream = stream;
    // The dispatcher lives inside `serve_connection`, so every buffer is freed before the
    // socket closes: a client that sees EOF sees the server's memory back to baseline.
    let result = serve_connection(&mut stream, backend, &config, &mut stop).await;
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
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut session = ServerSession::new(config.session.clone());
    let mut dispatcher = Dispatcher::new(backend, config.dispatcher.clone())?;
    let mut read_buf = BytesMut::new();
    let mut links: HashMap<u32, CommLink> = HashMap::new();
    loop {
        let processed = match process_events(&mut session, &mut dispatcher, &mut links) {
            Ok(Some(Deferred::Reply(reply))) => {
                flush(stream, &mut session).await?;
                send_reply(stream, &mut session, &mut dispatcher, reply).await?;
                continue;
            }
            Ok(Some(Deferred::Comm(work))) => {
                // Flush first: the client may be waiting for earlier responses.
                flush(stream, &mut session).await?;
                comm_work(
                    work,
                    &mut session,
                    &mut dispatcher,
                    &mut links,
                    config.comm_timeout,
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
) -> proto_core::Result<Option<Deferred>> {
    while let Some(event) = session.poll_event()? {
        let outcome = if is_heavy(&event) {
            run_blocking(|| dispatcher.handle(event))?
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
async fn send_reply<S: AsyncWrite + Unpin>(
    stream: &mut S,
    session: &mut ServerSession,
    // `&mut`, not `&`: the future must be Send, and the dispatcher is Send but not Sync.
    dispatcher: &mut Dispatcher<dyn Backend>,
    mut reply: TensorReadStream,
) -> Result<(), ConnectionError> {
    session.begin_response_stream(reply.command(), reply.len())?;
    while let Some(piece) = run_blocking(|| dispatcher.read_chunk(&mut reply))? {
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
            run_blocking(|| backend.read(at, &mut bytes))?;
            let local: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let sums = link.allreduce(local).await?;
            for (out, value) in bytes.chunks_exact_mut(4).zip(&sums) {
                out.copy_from_slice(&value.to_le_bytes());
            }
            run_blocking(|| backend.write(at, &bytes))
        }
    }
}

/// Runs `f` under `block_in_place` on a multi-threaded runtime, inline otherwise.
fn run_blocking<R>(f: impl FnOnce() -> R) -> R {
    match Handle::try_current().map(|handle| handle.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
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

/// Writes a list of buffers in order, as few system calls as the socket allows.
pub(crate) async fn write_all_vectored<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut queue: Vec<Bytes>,
) -> io::Result<()> {
    queue.retain(|b| !b.is_empty());
    let mut first = 0;
    while first < queue.len() {
        let written = {
            let slices: Vec<io::IoSlice<'_>> = queue[first..]
                .iter()
                .take(MAX_IO_SLICES)
                .map(|b| io::IoSlice::new(b))
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
