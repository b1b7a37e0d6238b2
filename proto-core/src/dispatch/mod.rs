//! The one command implementation every shell shares: validated requests → backend calls.
//!
//! A [`Dispatcher`] holds one connection's state (its buffers, stored graphs, communicators,
//! the streamed write in progress). [`crate::driver::Connection`] feeds it [`ServerEvent`]s
//! from the [`crate::session::ServerSession`] and acts on each [`Outcome`]. Dropping the
//! dispatcher frees everything the client held.

pub mod buffers;
pub mod graph_cache;
pub mod remote_copy;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;

use crate::backend::{Backend, TensorLocation};
use crate::comm::CommError;
use crate::error::{Error, Result};
use crate::graph::{Graph, GraphLimits};
use crate::session::{ServerEvent, TensorWrite};
use crate::tensor_cache::{CacheWriter, Fnv1a64, TensorCache};
use crate::wire::{
    CommInitRequest, Command, ConnCaps, Dialect, ProtocolVersion, RemoteCopyRequest,
    RemoteCopyStatus, Request, Response, RpcTensor, Tensor2dHeader, EXTENSION_REMOTE_COPY,
    HELLO_FLAG_EXTENSIONS, HELLO_FLAG_TENSOR_CACHE,
};
use remote_copy::{CopyShape, Grant};

pub use buffers::{BufferEntry, BufferTable, RegionStart};
pub use graph_cache::{GraphCache, StoredGraph};
pub use remote_copy::TicketBoard;

/// Settings of a dispatcher (one per connection, usually cloned from the server's).
#[derive(Clone)]
pub struct DispatcherConfig {
    /// The version announced in HELLO; its major selects the dialect.
    pub version: ProtocolVersion,
    /// Transport caps announced in HELLO (all zero: TCP only).
    pub caps: ConnCaps,
    /// Whether the shell can switch transports: HELLO is then answered by the shell
    /// ([`Outcome::Upgrade`], the client's caps, all zero included: a shell that requires
    /// RDMA refuses those) instead of with `caps`.
    pub negotiate_transport: bool,
    /// Most bytes of buffers one connection may hold (`None`: unlimited).
    pub memory_quota: Option<u64>,
    /// Graph size limits.
    pub graph_limits: GraphLimits,
    /// The tensor cache (`-c`), announced by HELLO flag bit 0.
    pub tensor_cache: Option<Arc<dyn TensorCache>>,
    /// The remote-copy extension (ours, [`crate::wire::extension`]): the server's ticket
    /// board, shared by all its connections. `None`: not offered (HELLO bit 7 clear,
    /// EXTENSIONS grants nothing).
    pub remote_copy: Option<Arc<TicketBoard>>,
}

impl std::fmt::Debug for DispatcherConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherConfig")
            .field("version", &self.version)
            .field("negotiate_transport", &self.negotiate_transport)
            .field("memory_quota", &self.memory_quota)
            .field("graph_limits", &self.graph_limits)
            .field("tensor_cache", &self.tensor_cache.is_some())
            .field("remote_copy", &self.remote_copy.is_some())
            .finish()
    }
}

impl DispatcherConfig {
    /// Defaults for a version: TCP caps, no quota, default graph limits, no cache.
    pub fn new(version: ProtocolVersion) -> DispatcherConfig {
        DispatcherConfig {
            version,
            caps: [0; 24],
            negotiate_transport: false,
            memory_quota: None,
            graph_limits: GraphLimits::default(),
            tensor_cache: None,
            remote_copy: None,
        }
    }
}

/// What the shell must do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to send.
    Done,
    /// Send this response.
    Respond(Response),
    /// Establish the comm link (it needs sockets), then call
    /// [`Dispatcher::finish_comm_init`] and send the response it returns.
    CommInit(Box<CommInitRequest>),
    /// Run the all-reduce over the device's comm link: read `elements` f32 at `at`, exchange,
    /// write the sums back.
    CommAllreduce {
        /// Device.
        device: u32,
        /// The tensor's bytes.
        at: TensorLocation,
        /// Number of f32 elements.
        elements: u64,
    },
    /// Drop the device's comm link.
    CommFree {
        /// Device.
        device: u32,
    },
    /// Send a large reply piece by piece (see [`TensorReadStream`]).
    RespondStream(TensorReadStream),
    /// Push a checked source region to another server (REMOTE_COPY_TENSOR; it needs
    /// sockets), then answer with [`Response::RemoteCopyTensor`].
    RemoteCopy(Box<RemoteCopyWork>),
    /// HELLO offered these transport caps and the shell can switch transports: it answers
    /// with its own caps ([`Dispatcher::hello_response`]).
    Upgrade(ConnCaps),
}

/// A REMOTE_COPY_TENSOR whose source region was checked: what the shell pushes to server B.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCopyWork {
    /// The source region's first byte in this server's backend.
    pub src: TensorLocation,
    /// The request (destination tensor, offset, ticket, B's endpoint).
    pub request: RemoteCopyRequest,
}

/// Largest GET_TENSOR / GET_TENSOR_2D reply built in one piece; larger replies are streamed in
/// pieces of this size ([`Outcome::RespondStream`]), so memory stays bounded whatever the size.
pub const MAX_REPLY_CHUNK: u64 = 16 * 1024 * 1024;

/// Where the shell can send replies straight from backend memory, replies above this size are
/// streamed too ([`Dispatcher::set_stream_replies_above`]): a decode step's logits then go
/// to the socket without a copy into a reply buffer first.
pub const MIN_IN_PLACE_REPLY: u64 = 64 * 1024;

/// A GET_TENSOR / GET_TENSOR_2D reply read from the backend piece by piece.
///
/// [`crate::driver::Connection`] sends it: straight from backend memory
/// ([`next_region`](Self::next_region)), or piece by piece through [`Dispatcher::read_chunk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorReadStream {
    command: Command,
    target: WriteTarget,
    len: u64,
    produced: u64,
}

impl TensorReadStream {
    /// The command answered.
    pub fn command(&self) -> Command {
        self.command
    }

    /// Total data bytes of the reply.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the reply carries no data.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Data bytes not read yet.
    pub fn remaining(&self) -> u64 {
        self.len - self.produced
    }

    /// Where the next bytes come from, and how many (at most `max`, never past the reply)
    /// continue contiguously from there.
    pub fn next_region(&self, max: u64) -> (TensorLocation, u64) {
        self.target.locate(self.produced, max.min(self.remaining()))
    }

    /// Records `n` bytes of the reply sent from [`next_region`](Self::next_region).
    pub fn advance(&mut self, n: u64) {
        self.produced = (self.produced + n).min(self.len);
    }
}

/// Where the streamed data of SET_TENSOR / SET_TENSOR_2D goes (or a streamed reply comes from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteTarget {
    Contiguous(TensorLocation),
    Rows {
        first: TensorLocation,
        size: u64,
        stride: u64,
    },
}

impl WriteTarget {
    /// Where byte `position` of the stream lies, and how many bytes (at most `max`) continue
    /// contiguously from there: the rest of the region, or the rest of the row.
    fn locate(self, position: u64, max: u64) -> (TensorLocation, u64) {
        match self {
            WriteTarget::Contiguous(at) => (
                TensorLocation {
                    buffer: at.buffer,
                    offset: at.offset + position,
                },
                max,
            ),
            WriteTarget::Rows {
                first,
                size,
                stride,
            } => {
                let (row, within) = (position / size, position % size);
                let at = TensorLocation {
                    buffer: first.buffer,
                    offset: first.offset + row * stride + within,
                };
                (at, (size - within).min(max))
            }
        }
    }
}

struct StreamedWrite {
    target: WriteTarget,
    written: u64,
    cache: Option<(Fnv1a64, Box<dyn CacheWriter>)>,
}

/// One connection's command executor.
pub struct Dispatcher<B: Backend + ?Sized> {
    backend: Arc<B>,
    config: DispatcherConfig,
    dialect: Dialect,
    buffers: BufferTable,
    graphs: GraphCache,
    stream: Option<StreamedWrite>,
    communicators: HashSet<u32>,
    /// The ticket this connection issued (REMOTE_COPY_EXPECT) and its buffer handle.
    ticket: Option<(u64, u64)>,
    /// The grant this connection attached to (REMOTE_COPY_ATTACH) and whether its one write
    /// began.
    attached: Option<(Grant, bool)>,
    /// Larger GET replies are streamed ([`Dispatcher::set_stream_replies_above`]).
    stream_replies_above: u64,
}

impl<B: Backend + ?Sized> Dispatcher<B> {
    /// A dispatcher for a new connection. Fails for a version whose major we do not speak.
    pub fn new(backend: Arc<B>, config: DispatcherConfig) -> Result<Dispatcher<B>> {
        let version = config.version;
        let dialect = version.dialect().ok_or(Error::VersionMismatch {
            major: version.major,
            minor: version.minor,
            patch: version.patch,
        })?;
        Ok(Dispatcher {
            backend,
            config,
            dialect,
            buffers: BufferTable::new(version.ggml_table()),
            graphs: GraphCache::new(dialect),
            stream: None,
            communicators: HashSet::new(),
            ticket: None,
            attached: None,
            stream_replies_above: MAX_REPLY_CHUNK,
        })
    }

    /// Replies of more than `len` bytes (at most [`MAX_REPLY_CHUNK`]) are streamed
    /// ([`Outcome::RespondStream`]) rather than built in one piece: the driver lowers it to
    /// [`MIN_IN_PLACE_REPLY`] while the shell can send straight from backend memory.
    pub fn set_stream_replies_above(&mut self, len: u64) {
        self.stream_replies_above = len.min(MAX_REPLY_CHUNK);
    }

    /// The connection's buffers.
    pub fn buffers(&self) -> &BufferTable {
        &self.buffers
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// Executes one event.
    pub fn handle(&mut self, event: ServerEvent) -> Result<Outcome> {
        match event {
            ServerEvent::Request(request) => self.request(request),
            ServerEvent::TensorWriteBegin { write, data_len } => {
                self.begin_write(write, data_len)?;
                Ok(Outcome::Done)
            }
            ServerEvent::TensorData(chunk) => {
                self.write_chunk(&chunk)?;
                Ok(Outcome::Done)
            }
            ServerEvent::TensorWriteEnd => {
                self.end_write()?;
                Ok(Outcome::Done)
            }
        }
    }

    /// HELLO's answer with these transport caps (the flags follow from the configuration).
    pub fn hello_response(&self, caps: ConnCaps) -> Response {
        let mut flags = 0;
        if self.config.tensor_cache.is_some() {
            flags |= HELLO_FLAG_TENSOR_CACHE;
        }
        if self.config.remote_copy.is_some() {
            flags |= HELLO_FLAG_EXTENSIONS;
        }
        Response::Hello {
            version: self.config.version,
            flags,
            caps,
        }
    }

    fn device(&self, device: u32) -> Result<u32> {
        let count = self.backend.device_count();
        if device < count {
            Ok(device)
        } else {
            Err(Error::InvalidDevice { device, count })
        }
    }

    /// 8.x launches graphs asynchronously; data commands wait for every device first.
    fn sync_devices(&self) {
        if self.dialect == Dialect::V8 {
            self.backend.synchronize();
        }
    }

    fn request(&mut self, request: Request) -> Result<Outcome> {
        let respond = |r| Ok(Outcome::Respond(r));
        if self.attached.is_some() && !matches!(request, Request::DeviceCount) {
            return Err(Error::InvalidState(
                "an attached remote-copy connection may only write its region",
            ));
        }
        match request {
            Request::Hello { caps } => {
                if self.config.negotiate_transport {
                    return Ok(Outcome::Upgrade(caps));
                }
                respond(self.hello_response(self.config.caps))
            }
            Request::Extensions { wanted } => {
                let offered = if self.config.remote_copy.is_some() {
                    EXTENSION_REMOTE_COPY
                } else {
                    0
                };
                respond(Response::Extensions(wanted & offered))
            }
            Request::RemoteCopyExpect(header) => {
                self.sync_devices();
                let (status, ticket) = self.remote_copy_expect(&header);
                respond(Response::RemoteCopyExpect {
                    status: status.byte(),
                    ticket,
                })
            }
            Request::RemoteCopyAttach {
                ticket,
                buffer,
                start,
                size,
                n_copies,
                stride,
            } => respond(Response::RemoteCopyAttach(
                self.remote_copy_attach(
                    ticket,
                    CopyShape::new(buffer, start, size, n_copies, stride),
                )
                .byte(),
            )),
            Request::RemoteCopyTensor(request) => {
                self.sync_devices();
                let src = Tensor2dHeader {
                    tensor: request.src.clone(),
                    offset: request.src_offset,
                    size: request.size,
                    n_copies: request.n_copies,
                    stride: request.src_stride,
                };
                match self.copy_region(&src) {
                    Ok(src) => Ok(Outcome::RemoteCopy(Box::new(RemoteCopyWork {
                        src,
                        request: *request,
                    }))),
                    Err(_) => respond(Response::RemoteCopyTensor(
                        RemoteCopyStatus::BadSource.byte(),
                    )),
                }
            }
            Request::DeviceCount => respond(Response::DeviceCount(self.backend.device_count())),
            Request::GetDeviceMemory { device } => {
                let memory = self.backend.device_memory(self.device(device)?);
                respond(Response::DeviceMemory {
                    free: memory.free,
                    total: memory.total,
                })
            }
            Request::GetAlignment { device } => respond(Response::Alignment(
                self.backend.alignment(self.device(device)?),
            )),
            Request::GetMaxSize { device } => respond(Response::MaxSize(
                self.backend.max_size(self.device(device)?),
            )),
            Request::AllocBuffer { device, size } => self.alloc_buffer(device, size),
            Request::BufferGetBase { buffer } => {
                respond(Response::BufferBase(self.buffers.get(buffer)?.base))
            }
            Request::FreeBuffer { buffer } => {
                self.sync_devices();
                let entry = self.buffers.remove(buffer)?;
                if let Some((ticket, _)) = self.ticket.filter(|&(_, handle)| handle == buffer) {
                    self.revoke_ticket(ticket);
                }
                self.graphs.invalidate_all();
                self.backend.free_buffer(entry.id);
                Ok(Outcome::Done)
            }
            Request::BufferClear { buffer, value } => {
                self.sync_devices();
                let entry = self.buffers.get(buffer)?;
                self.backend.clear_buffer(entry.id, value)?;
                Ok(Outcome::Done)
            }
            Request::SetTensor { header, data } => {
                // A whole message (not streamed): same path as the streamed one.
                let len = data.len() as u64;
                self.begin_write(TensorWrite::Set(header), len)?;
                self.write_chunk(&data)?;
                self.end_write()?;
                Ok(Outcome::Done)
            }
            Request::SetTensor2d { header, data } => {
                let len = data.len() as u64;
                self.begin_write(TensorWrite::Set2d(header), len)?;
                self.write_chunk(&data)?;
                self.end_write()?;
                Ok(Outcome::Done)
            }
            Request::SetTensorHash {
                tensor,
                offset,
                hash,
            } => {
                self.sync_devices();
                respond(Response::SetTensorHash(
                    self.set_tensor_from_cache(&tensor, offset, hash)?,
                ))
            }
            Request::GetTensor {
                tensor,
                offset,
                size,
            } => {
                self.sync_devices();
                let at = self
                    .buffers
                    .region(&tensor, offset, size, RegionStart::InsideBuffer)?;
                self.reply_with_data(Command::GetTensor, WriteTarget::Contiguous(at), size)
            }
            Request::GetTensor2d(header) => {
                self.sync_devices();
                let command = Command::GetTensor2d;
                let (first, _) = self.rows(&header)?;
                let total = header.data_len(command)?;
                // Overlapping rows (stride < size) could ask for far more bytes than exist; a
                // reply is never larger than the tensor it reads.
                let (_, byte_size) = self.buffers.resolve_in_buffer(&header.tensor)?;
                if total > byte_size {
                    return Err(Error::MessageTooLarge {
                        command,
                        limit: byte_size,
                        got: total,
                    });
                }
                let rows = WriteTarget::Rows {
                    first,
                    size: header.size,
                    stride: header.stride,
                };
                self.reply_with_data(command, rows, total)
            }
            Request::MemsetTensor {
                tensor,
                offset,
                size,
                value,
            } => {
                self.sync_devices();
                let at = self
                    .buffers
                    .region(&tensor, offset, size, RegionStart::UpToBufferEnd)?;
                if size > 0 {
                    self.backend.fill(at, size, value)?;
                }
                Ok(Outcome::Done)
            }
            Request::CopyTensor { src, dst } => {
                self.sync_devices();
                respond(Response::CopyTensor(self.copy_tensor(&src, &dst)?))
            }
            Request::InitTensor { tensor } => {
                self.sync_devices();
                // G18: the reference logs and succeeds for an unknown buffer; we refuse.
                let (_, _) = self.buffers.resolve_in_buffer(&tensor)?;
                if let Some(at) = self.buffers.location(&tensor)? {
                    self.backend.init_tensor(at, &tensor)?;
                }
                Ok(Outcome::Done)
            }
            Request::GetAllocSize(request) => {
                let device = self.device(request.device)?;
                // As the reference: a handle of another server (or none) means "no buffer", a
                // handle of ours must hold the tensor.
                if self.buffers.get(request.tensor.buffer).is_ok() {
                    self.buffers.resolve(&request.tensor)?;
                } else {
                    request
                        .tensor
                        .validate_shape(self.config.version.ggml_table())?;
                }
                respond(Response::AllocSize(
                    self.backend.alloc_size(device, &request.tensor)?,
                ))
            }
            Request::GraphCompute(request) => {
                let device = self.device(request.device)?;
                self.graphs.prepare(device, request.uid);
                let buffers = &self.buffers;
                let graph = Graph::decode(
                    &request,
                    &self.config.graph_limits,
                    self.config.version.ggml_table(),
                    &mut |tensor, _| buffers.location(tensor),
                )?;
                // The backend prepares while it runs; the slot is stored with the graph.
                let mut prepared = None;
                self.backend
                    .graph_compute_stored(device, &graph, &mut prepared)?;
                self.graphs
                    .store(device, request.uid, Arc::new(graph), prepared);
                Ok(Outcome::Done)
            }
            Request::GraphRecompute { device, uid } => {
                let device = self.device(device)?;
                let stored = self
                    .graphs
                    .get_mut(device, uid)
                    .ok_or(Error::GraphNotFound { device, uid })?;
                self.backend
                    .graph_compute_stored(device, &stored.graph, &mut stored.prepared)?;
                Ok(Outcome::Done)
            }
            Request::CommInit(request) => self.comm_init(request),
            Request::CommAllreduce { device, tensor } => {
                let device = self.device(device)?;
                if !self.communicators.contains(&device) {
                    return Err(CommError::NoCommunicator { device }.into());
                }
                let (_, byte_size) = self.buffers.resolve_in_buffer(&tensor)?;
                if byte_size == 0 {
                    return Ok(Outcome::Done);
                }
                if tensor.type_id != crate::ggml::types::id::F32 {
                    return Err(CommError::NotF32 {
                        type_id: tensor.type_id,
                    }
                    .into());
                }
                let elements = tensor.element_count()?;
                let at =
                    self.buffers
                        .region(&tensor, 0, elements * 4, RegionStart::InsideBuffer)?;
                Ok(Outcome::CommAllreduce {
                    device,
                    at,
                    elements,
                })
            }
            Request::CommFree { device } => {
                let device = self.device(device)?;
                if self.communicators.remove(&device) {
                    // The newest upstream waits for every device before releasing the
                    // communicator (a reduction may still be running on it).
                    self.sync_devices();
                }
                Ok(Outcome::CommFree { device })
            }
        }
    }

    /// A data reply: built at once when small, streamed otherwise.
    fn reply_with_data(&self, command: Command, target: WriteTarget, len: u64) -> Result<Outcome> {
        let mut stream = TensorReadStream {
            command,
            target,
            len,
            produced: 0,
        };
        if len > self.stream_replies_above {
            return Ok(Outcome::RespondStream(stream));
        }
        let data = self.read_chunk(&mut stream)?.unwrap_or_default();
        Ok(Outcome::Respond(match command {
            Command::GetTensor2d => Response::Tensor2dData(data),
            _ => Response::TensorData(data),
        }))
    }

    /// Reads the next piece (at most [`MAX_REPLY_CHUNK`] bytes) of a streamed reply; `None`
    /// once everything was read.
    pub fn read_chunk(&self, stream: &mut TensorReadStream) -> Result<Option<Bytes>> {
        let remaining = stream.remaining();
        if remaining == 0 {
            return Ok(None);
        }
        let piece = to_usize(remaining.min(MAX_REPLY_CHUNK))?;
        if let WriteTarget::Contiguous(_) = stream.target {
            // One backend copy, no zero-filled staging buffer.
            let (at, _) = stream.target.locate(stream.produced, piece as u64);
            let data = self.backend.read_bytes(at, piece)?;
            stream.produced += piece as u64;
            return Ok(Some(data));
        }
        let mut data = vec![0u8; piece];
        let mut rest = data.as_mut_slice();
        while !rest.is_empty() {
            let (at, take) = stream.target.locate(stream.produced, rest.len() as u64);
            let (row, tail) = std::mem::take(&mut rest)
                .split_at_mut_checked(to_usize(take)?)
                .ok_or(Error::InvalidState("a row longer than the reply piece"))?;
            self.backend.read(at, row)?;
            stream.produced += take;
            rest = tail;
        }
        Ok(Some(data.into()))
    }

    /// Where the next bytes of the streamed SET_TENSOR / SET_TENSOR_2D data go when received
    /// straight into backend memory: the location and how many bytes (at most `capacity`)
    /// continue contiguously from there. `None` when no write is in progress or it also goes
    /// to the tensor cache (which must see every byte).
    pub fn in_place_target(&self, capacity: u64) -> Option<(TensorLocation, u64)> {
        let stream = self.stream.as_ref()?;
        if capacity == 0 || stream.cache.is_some() {
            return None;
        }
        Some(stream.target.locate(stream.written, capacity))
    }

    /// Records `n` bytes of the streamed write placed at [`in_place_target`](Self::in_place_target).
    pub fn received_in_place(&mut self, n: u64) -> Result<()> {
        let stream = self
            .stream
            .as_mut()
            .ok_or(Error::InvalidState("data without a write"))?;
        stream.written += n;
        Ok(())
    }

    fn alloc_buffer(&mut self, device: u32, size: u64) -> Result<Outcome> {
        let device = self.device(device)?;
        if let Some(quota) = self.config.memory_quota {
            let total = self.buffers.total_bytes().saturating_add(size);
            if total > quota {
                return Err(Error::QuotaExceeded {
                    requested: total,
                    quota,
                });
            }
        }
        let failed = Outcome::Respond(Response::AllocBuffer {
            remote_ptr: 0,
            remote_size: 0,
        });
        let Some(buffer) = self.backend.alloc_buffer(device, size) else {
            return Ok(failed);
        };
        match self.buffers.insert(buffer.id, device, buffer.size) {
            Some(handle) => Ok(Outcome::Respond(Response::AllocBuffer {
                remote_ptr: handle,
                remote_size: buffer.size,
            })),
            None => {
                self.backend.free_buffer(buffer.id);
                Ok(failed)
            }
        }
    }

    /// Checks a 2D request and returns the first row's location and the span.
    fn rows(&self, header: &Tensor2dHeader) -> Result<(TensorLocation, u64)> {
        let span = header.span()?;
        let first = self.buffers.region(
            &header.tensor,
            header.offset,
            span,
            RegionStart::UpToBufferEnd,
        )?;
        Ok((first, span))
    }

    fn begin_write(&mut self, write: TensorWrite, data_len: u64) -> Result<()> {
        self.sync_devices();
        if let Some((grant, begun)) = self.attached.as_mut() {
            // The one write an attached connection may do: exactly the granted region.
            let shape = match &write {
                TensorWrite::Set(header) if header.cache_flag == 0 => header
                    .tensor
                    .data
                    .checked_add(header.offset)
                    .map(|start| CopyShape::new(header.tensor.buffer, start, data_len, 1, 0)),
                TensorWrite::Set(_) => None,
                TensorWrite::Set2d(header) => {
                    header.tensor.data.checked_add(header.offset).map(|start| {
                        CopyShape::new(
                            header.tensor.buffer,
                            start,
                            header.size,
                            header.n_copies,
                            header.stride,
                        )
                    })
                }
            };
            let fits = !*begun && shape == Some(grant.shape);
            if !fits {
                return Err(Error::OutOfBounds(
                    "remote copy write differs from its ticket's region",
                ));
            }
            *begun = true;
        }
        let (target, cache_flag) = match &write {
            TensorWrite::Set(header) => {
                let at = self.buffers.region(
                    &header.tensor,
                    header.offset,
                    data_len,
                    RegionStart::InsideBuffer,
                )?;
                (WriteTarget::Contiguous(at), header.cache_flag != 0)
            }
            TensorWrite::Set2d(header) => {
                let (first, _) = self.rows(header)?;
                (
                    WriteTarget::Rows {
                        first,
                        size: header.size,
                        stride: header.stride,
                    },
                    false,
                )
            }
        };
        let cache = match (&self.config.tensor_cache, cache_flag) {
            (Some(cache), true) => Some((Fnv1a64::default(), cache.begin_store()?)),
            _ => None,
        };
        self.stream = Some(StreamedWrite {
            target,
            written: 0,
            cache,
        });
        Ok(())
    }

    fn write_chunk(&mut self, mut chunk: &[u8]) -> Result<()> {
        let stream = self
            .stream
            .as_mut()
            .ok_or(Error::InvalidState("data without a write"))?;
        if let Some((hasher, writer)) = stream.cache.as_mut() {
            hasher.update(chunk);
            writer.append(chunk)?;
        }
        while !chunk.is_empty() {
            let (at, take) = stream.target.locate(stream.written, chunk.len() as u64);
            let (piece, rest) = chunk
                .split_at_checked(to_usize(take)?)
                .ok_or(Error::InvalidState("a row longer than the chunk"))?;
            self.backend.write(at, piece)?;
            stream.written += take;
            chunk = rest;
        }
        Ok(())
    }

    fn end_write(&mut self) -> Result<()> {
        let stream = self
            .stream
            .take()
            .ok_or(Error::InvalidState("end without a write"))?;
        if let Some((grant, _)) = self.attached {
            // Written: the lent buffer goes back to its owner's connection alone.
            self.buffers.forget_borrowed(grant.shape.handle);
        }
        if let Some((hasher, writer)) = stream.cache {
            writer.commit(hasher.finish())?;
        }
        Ok(())
    }

    fn set_tensor_from_cache(&mut self, tensor: &RpcTensor, offset: u64, hash: u64) -> Result<u8> {
        // 8.0.1 checks the tensor before looking for the file (PROTOCOL.md §5.11): a bad tensor
        // closes the connection even on a miss or without a cache, where 7.0.0 answered 0.
        if self.config.version >= ProtocolVersion::V8_0_1 {
            self.buffers.resolve_in_buffer(tensor)?;
        }
        let Some(cache) = self.config.tensor_cache.clone() else {
            return Ok(0);
        };
        let Some(len) = cache.len(hash) else {
            return Ok(0);
        };
        let at = self
            .buffers
            .region(tensor, offset, len, RegionStart::InsideBuffer)?;
        let mut hasher = Fnv1a64::default();
        let mut written = 0u64;
        cache.read(hash, &mut |piece| {
            hasher.update(piece);
            let end = written
                .checked_add(piece.len() as u64)
                .filter(|&end| end <= len);
            let end = end.ok_or(Error::Backend("cache entry changed while reading".into()))?;
            self.backend.write(
                TensorLocation {
                    buffer: at.buffer,
                    offset: at.offset + written,
                },
                piece,
            )?;
            written = end;
            Ok(())
        })?;
        // G15: the reference trusts the file name; a corrupt entry is dropped and reported as a
        // miss, so the client sends the data again and overwrites what was written.
        if written != len || hasher.finish() != hash {
            cache.remove(hash);
            return Ok(0);
        }
        Ok(1)
    }

    fn copy_tensor(&mut self, src: &RpcTensor, dst: &RpcTensor) -> Result<u8> {
        let (_, src_size) = self.buffers.resolve_in_buffer(src)?;
        let (dst_entry, dst_size) = self.buffers.resolve_in_buffer(dst)?;
        // The reference checks only that the write ends inside the destination buffer; G19 adds
        // the destination tensor's own size.
        let end = dst
            .data
            .checked_add(src_size)
            .ok_or(Error::SizeOverflow("dst + nbytes"))?;
        if end > dst_entry.base + dst_entry.size || src_size > dst_size {
            return Err(Error::OutOfBounds(
                "copy_tensor writes past its destination",
            ));
        }
        if src_size == 0 {
            return Ok(1);
        }
        let from = self
            .buffers
            .region(src, 0, src_size, RegionStart::InsideBuffer)?;
        let to = self
            .buffers
            .region(dst, 0, src_size, RegionStart::InsideBuffer)?;
        Ok(u8::from(self.backend.copy(from, to, src_size)?))
    }

    fn comm_init(&mut self, request: Box<CommInitRequest>) -> Result<Outcome> {
        let refuse = Ok(Outcome::Respond(Response::CommInit(0)));
        // COMM_INIT never closes the connection over its arguments: it answers 0.
        if request.device >= self.backend.device_count()
            || request.rank >= request.world
            || request.world < 2
        {
            return refuse;
        }
        if self.communicators.contains(&request.device) {
            return Ok(Outcome::Respond(Response::CommInit(1)));
        }
        self.sync_devices();
        Ok(Outcome::CommInit(request))
    }

    /// Records the result of a comm link set-up started by [`Outcome::CommInit`] and returns
    /// the response to send.
    pub fn finish_comm_init(&mut self, device: u32, ok: bool) -> Response {
        if ok {
            self.communicators.insert(device);
        }
        Response::CommInit(u8::from(ok))
    }

    /// A remote copy's region of a tensor of this connection: one contiguous region as
    /// SET_TENSOR's (`n_copies` 1), or rows as SET_TENSOR_2D's, never more bytes than the
    /// tensor holds. The first row's location.
    fn copy_region(&self, header: &Tensor2dHeader) -> Result<TensorLocation> {
        if header.n_copies == 1 {
            return self.buffers.region(
                &header.tensor,
                header.offset,
                header.size,
                RegionStart::InsideBuffer,
            );
        }
        let total = header.data_len(Command::SetTensor2d)?;
        let (first, _) = self.rows(header)?;
        let (_, byte_size) = self.buffers.resolve_in_buffer(&header.tensor)?;
        if total > byte_size {
            return Err(Error::OutOfBounds("rows copy more than the tensor holds"));
        }
        Ok(first)
    }

    /// REMOTE_COPY_EXPECT: a ticket for a region of this connection's buffers (checked by
    /// [`copy_region`](Self::copy_region); rows only on protocol 8, which has SET_TENSOR_2D).
    /// Soft: a bad region is a status, not a closed connection.
    fn remote_copy_expect(&mut self, header: &Tensor2dHeader) -> (RemoteCopyStatus, u64) {
        let tensor = &header.tensor;
        if let Some((ticket, _)) = self.ticket.take() {
            self.revoke_ticket(ticket);
        }
        let Some(board) = self.config.remote_copy.clone() else {
            return (RemoteCopyStatus::TicketRefused, 0);
        };
        if header.n_copies != 1 && self.dialect != Dialect::V8 {
            return (RemoteCopyStatus::BadDestination, 0);
        }
        let entry = self
            .copy_region(header)
            .and_then(|_| self.buffers.get(tensor.buffer));
        let entry = match entry {
            Ok(entry) => entry,
            Err(_) => return (RemoteCopyStatus::BadDestination, 0),
        };
        let grant = Grant {
            entry,
            // copy_region() checked that data + offset does not overflow
            shape: CopyShape::new(
                tensor.buffer,
                tensor.data + header.offset,
                header.size,
                header.n_copies,
                header.stride,
            ),
        };
        match board.issue(grant) {
            Some(ticket) => {
                self.ticket = Some((ticket, tensor.buffer));
                (RemoteCopyStatus::Ok, ticket)
            }
            None => (RemoteCopyStatus::TicketRefused, 0),
        }
    }

    /// REMOTE_COPY_ATTACH: lends the ticket's buffer to this connection for its one write.
    /// Refused on a connection that holds buffers of its own or attached before.
    /// `shape`: the region the source server will write.
    fn remote_copy_attach(&mut self, ticket: u64, shape: CopyShape) -> RemoteCopyStatus {
        let Some(board) = self.config.remote_copy.clone() else {
            return RemoteCopyStatus::TicketRefused;
        };
        if self.attached.is_some() || !self.buffers.is_empty() || self.stream.is_some() {
            return RemoteCopyStatus::TicketRefused;
        }
        let Some(grant) = board.take(ticket) else {
            return RemoteCopyStatus::TicketRefused;
        };
        if shape != grant.shape {
            return RemoteCopyStatus::BadDestination;
        }
        if !self
            .buffers
            .insert_borrowed(grant.shape.handle, grant.entry)
        {
            return RemoteCopyStatus::TicketRefused;
        }
        self.attached = Some((grant, false));
        RemoteCopyStatus::Ok
    }

    fn revoke_ticket(&mut self, ticket: u64) {
        if let Some(board) = &self.config.remote_copy {
            board.revoke(ticket);
        }
        self.ticket = None;
    }

    /// Frees everything the connection held (also done on drop).
    pub fn close(&mut self) {
        if let Some((ticket, _)) = self.ticket.take() {
            self.revoke_ticket(ticket);
        }
        if let Some((grant, _)) = self.attached {
            // Lent, not ours: never freed here.
            self.buffers.forget_borrowed(grant.shape.handle);
        }
        self.stream = None;
        self.graphs.invalidate_all();
        // The links and communicators themselves belong to the shell's comm state and go with it.
        self.communicators.clear();
        let backend = self.backend.clone();
        for entry in self.buffers.drain() {
            backend.free_buffer(entry.id);
        }
    }
}

impl<B: Backend + ?Sized> Drop for Dispatcher<B> {
    fn drop(&mut self) {
        self.close();
    }
}

fn to_usize(n: u64) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::SizeOverflow("length exceeds the address space"))
}
