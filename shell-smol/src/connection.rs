//! One client connection: socket bytes → [`ServerSession`] → [`Dispatcher`] → socket bytes.
//!
//! The same driver as the tokio shell's, on async-io:
//!
//! * Reads: between messages into a 64 KiB scratch buffer, whose filled part is appended to the
//!   input (small messages: at most one short copy). While a SET_TENSOR / SET_TENSOR_2D payload
//!   streams in, the socket is read straight into the destination in backend memory
//!   (`Dispatcher::receive_in_place`: a non-blocking `recv` into the lent region). Where that
//!   is not possible (data buffered with the header, the tensor cache storing it too, a backend
//!   without host memory), `min(stream_remaining(), 16 MiB)` bytes are read into a fresh buffer
//!   of exactly that size, handed to the session whole: no second copy either way.
//! * Writes: the session's transmit queue is written with vectored writes straight from its
//!   `Bytes`; a large GET_TENSOR reply goes straight from backend memory
//!   (`Dispatcher::send_in_place`), else one 16 MiB piece at a time.
//! * Blocking backend calls (graph compute, large reads, writes, copies and fills, cache file
//!   I/O) run on the `blocking` thread pool: the connection's `Core` (session and dispatcher,
//!   one box) moves there for the call and comes back, so the executor threads keep serving
//!   the other connections.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use async_io::{Async, Timer};
use bytes::{Buf, Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use proto_core::backend::{Backend, TensorLocation};
use proto_core::dispatch::{Dispatcher, Outcome, TensorReadStream};
use proto_core::session::ServerSession;
use proto_core::wire::CommInitRequest;

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

/// Work that needs more than the dispatcher.
enum Deferred {
    /// A large reply, written piece by piece.
    Reply(TensorReadStream),
    /// The comm link.
    Comm(CommWork),
}

enum CommWork {
    Init(Box<CommInitRequest>),
    Allreduce {
        device: u32,
        at: TensorLocation,
        elements: u64,
    },
}

/// The connection's protocol state; moves to a blocking thread and back for heavy calls.
struct Core {
    session: ServerSession,
    dispatcher: Dispatcher<dyn Backend>,
}

/// Owns the [`Core`] between blocking calls.
struct Driver {
    core: Option<Box<Core>>,
    dispatch: tracing::Dispatch,
}

impl Driver {
    fn core(&mut self) -> &mut Core {
        self.core
            .as_mut()
            .expect("the core is only away during a blocking call, which is awaited")
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

    /// Frees everything the client holds: on the blocking pool when that is much, so the
    /// executor thread's other clients do not wait for it.
    async fn release(mut self) {
        if let Some(core) = self.core.take() {
            if is_heavy_to_free(core.dispatcher.buffers()) {
                blocking::unblock(move || drop(core)).await;
            }
        }
    }
}

/// Runs an accepted TCP client to its end and logs how it ended. `on_closed` runs after the
/// client's buffers were freed and the socket closed, before the ending is logged.
pub(crate) async fn run(
    stream: Async<TcpStream>,
    backend: Arc<dyn Backend>,
    config: Arc<ConnectionConfig>,
    stop: async_channel::Receiver<()>,
    on_closed: impl FnOnce(),
) {
    if let Err(error) = stream.get_ref().set_nodelay(true) {
        tracing::warn!(%error, kind = %error.kind(), "cannot set TCP_NODELAY");
    }
    shell_common::tune_or_log(stream.get_ref());
    tracing::info!("Accepted client connection");
    let mut stream = stream;
    let result = serve_connection(&mut stream, backend, &config, &stop).await;
    drop(stream);
    on_closed();
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

/// Serves one client until it closes, fails, or `stop` is closed (the server shuts down).
///
/// All the client's state lives in this call: when it returns, its buffers are freed.
pub async fn serve_connection(
    stream: &mut Async<TcpStream>,
    backend: Arc<dyn Backend>,
    config: &ConnectionConfig,
    stop: &async_channel::Receiver<()>,
) -> Result<Closed, ConnectionError> {
    let mut driver = Driver {
        core: Some(Box::new(Core {
            session: ServerSession::new(config.session.clone()),
            dispatcher: Dispatcher::new(backend, config.dispatcher.clone())?,
        })),
        dispatch: tracing::dispatcher::get_default(Clone::clone),
    };
    let result = serve_client(stream, &mut driver, config, stop).await;
    driver.release().await;
    result
}

/// The body of [`serve_connection`]: the client's commands, on `driver`'s core.
async fn serve_client(
    stream: &mut Async<TcpStream>,
    driver: &mut Driver,
    config: &ConnectionConfig,
    stop: &async_channel::Receiver<()>,
) -> Result<Closed, ConnectionError> {
    let mut scratch = vec![0u8; READ_SIZE];
    let mut links: HashMap<u32, CommLink> = HashMap::new();
    loop {
        let processed = match process_events(driver, &mut links).await {
            Ok(Some(Deferred::Reply(reply))) => {
                flush(stream, &mut driver.core().session).await?;
                send_reply(stream, driver, reply).await?;
                continue;
            }
            Ok(Some(Deferred::Comm(work))) => {
                // Flush first: the client may be waiting for earlier responses.
                flush(stream, &mut driver.core().session).await?;
                comm_work(work, driver, &mut links, config.comm_timeout)
                    .await
                    .map(|()| true)
            }
            Ok(None) => Ok(false),
            Err(error) => Err(error),
        };
        match processed {
            Err(error) => {
                // Responses owed to earlier requests of the same read still go out.
                let session = &mut driver.core().session;
                let _ = futures_lite::future::or(
                    async {
                        let _ = flush(stream, session).await;
                    },
                    async {
                        Timer::after(FINAL_FLUSH_TIMEOUT).await;
                    },
                )
                .await;
                return Err(error.into());
            }
            Ok(true) => continue,
            Ok(false) => {}
        }
        let session = &mut driver.core().session;
        flush(stream, session).await?;

        let remaining = session.stream_remaining();
        if remaining > 0 {
            // Streamed tensor data: finished even during shutdown (the grace period bounds it).
            if session.in_place_capacity() > 0 {
                match receive_direct(stream, driver.core()).await? {
                    Direct::Moved => continue,
                    Direct::Eof => {
                        driver.core().session.handle_eof()?;
                        return Ok(Closed::ByClient);
                    }
                    Direct::Declined => {}
                }
            }
            let session = &mut driver.core().session;
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

        if stop.is_closed() {
            return Ok(Closed::Shutdown);
        }
        let read =
            futures_lite::future::or(async { Some(stream.read(&mut scratch).await) }, async {
                // Closed (never sent to): the server is shutting down.
                let _ = stop.recv().await;
                None
            })
            .await;
        let Some(read) = read else {
            return Ok(Closed::Shutdown);
        };
        let read = read?;
        if read == 0 {
            session.handle_eof()?;
            return Ok(Closed::ByClient);
        }
        session.handle_input(Bytes::copy_from_slice(&scratch[..read]));
    }
}

/// Hands every complete event to the dispatcher and queues the responses, until one needs
/// more than the dispatcher (returned) or more input is needed.
async fn process_events(
    driver: &mut Driver,
    links: &mut HashMap<u32, CommLink>,
) -> proto_core::Result<Option<Deferred>> {
    while let Some(event) = driver.core().session.poll_event()? {
        let outcome = if is_heavy(&event, driver.core().dispatcher.buffers()) {
            driver
                .blocking(move |core| core.dispatcher.handle(event))
                .await?
        } else {
            driver.core().dispatcher.handle(event)?
        };
        let core = driver.core();
        match outcome {
            Outcome::Done => {}
            Outcome::Respond(response) => core.session.send_response(&response)?,
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

/// Writes a large GET_TENSOR reply one piece (at most 16 MiB) at a time.
async fn send_reply(
    stream: &mut Async<TcpStream>,
    driver: &mut Driver,
    reply: TensorReadStream,
) -> Result<(), ConnectionError> {
    driver
        .core()
        .session
        .begin_response_stream(reply.command(), reply.len())?;
    let mut reply = Box::new(reply);
    // The head goes first, then the data straight from backend memory.
    flush(stream, &mut driver.core().session).await?;
    if let Direct::Moved = send_direct(stream, driver.core(), &mut reply).await? {
        return Ok(());
    }
    loop {
        let (back, piece) = driver
            .blocking(move |core| {
                let piece = core.dispatcher.read_chunk(&mut reply);
                (reply, piece)
            })
            .await;
        reply = back;
        let Some(piece) = piece? else {
            break;
        };
        let session = &mut driver.core().session;
        session.send_response_data(piece)?;
        flush(stream, session).await?;
    }
    flush(stream, &mut driver.core().session).await?;
    Ok(())
}

/// Receives the next part of the streamed write straight into backend memory.
///
/// Unlike [`send_direct`], this waits for readiness before each `recv`: one `recv` takes all
/// that is queued, so trying again at once mostly finds the socket empty, and a 256 MiB
/// SET_TENSOR ran 10 % slower that way (ten interleaved rounds each: 0.95x against 1.05x the
/// tokio shell).
async fn receive_direct(
    stream: &Async<TcpStream>,
    core: &mut Core,
) -> Result<Direct, ConnectionError> {
    loop {
        stream.readable().await?;
        let mut outcome = None;
        let lent = core
            .dispatcher
            .receive_in_place(&mut core.session, &mut |dst| {
                record(stream.get_ref().read(dst), &mut outcome)
            })?;
        if let Some(direct) = direct::received(lent, outcome)? {
            return Ok(direct);
        }
    }
}

/// Sends the rest of a streamed reply (its head already written) straight from backend
/// memory; `Declined` if the backend cannot lend its memory (nothing was sent then).
///
/// Each piece is tried first and the reactor asked only once the socket is full: async-io's
/// `writable()` keeps no readiness between calls (unlike tokio's), so awaiting it before every
/// 512 KiB piece cost a trip through the reactor each and held a 256 MiB GET_TENSOR to half the
/// tokio shell's rate (2.7 against 6.3 GB/s; tried first: 1.00x, ten interleaved rounds).
async fn send_direct(
    stream: &Async<TcpStream>,
    core: &mut Core,
    reply: &mut TensorReadStream,
) -> Result<Direct, ConnectionError> {
    while reply.remaining() > 0 {
        let mut outcome = None;
        let lent = core
            .dispatcher
            .send_in_place(reply, &mut core.session, &mut |src| {
                record(
                    stream.get_ref().write(direct::send_piece(src)),
                    &mut outcome,
                )
            })?;
        match direct::sent(lent, outcome)? {
            Some(Direct::Declined) => return Ok(Direct::Declined),
            Some(_) => {}
            None => stream.writable().await?,
        }
    }
    Ok(Direct::Moved)
}

/// Runs COMM_INIT (a failure is the soft answer `ok = 0`) or COMM_ALLREDUCE (a failure closes
/// the connection, as in the reference).
async fn comm_work(
    work: CommWork,
    driver: &mut Driver,
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
            let core = driver.core();
            let response = core.dispatcher.finish_comm_init(device, ok);
            core.session.send_response(&response)
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
            let bytes = driver
                .blocking(move |core| {
                    let mut bytes = vec![0u8; len];
                    core.dispatcher
                        .backend()
                        .read(at, &mut bytes)
                        .map(|()| bytes)
                })
                .await?;
            let local: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let sums = link.allreduce(local).await?;
            let mut bytes = bytes;
            for (out, value) in bytes.chunks_exact_mut(4).zip(&sums) {
                out.copy_from_slice(&value.to_le_bytes());
            }
            driver
                .blocking(move |core| core.dispatcher.backend().write(at, &bytes))
                .await
        }
    }
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

/// Writes out everything the session queued, with vectored writes straight from its `Bytes`.
async fn flush(stream: &mut Async<TcpStream>, session: &mut ServerSession) -> io::Result<()> {
    let mut queue: Vec<Bytes> = Vec::new();
    while let Some(bytes) = session.poll_transmit() {
        if !bytes.is_empty() {
            queue.push(bytes);
        }
    }
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
    Ok(())
}
