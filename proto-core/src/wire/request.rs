//! Request messages (client → server): typed form, nom decoding and `bytes` encoding.

use bytes::{BufMut, Bytes, BytesMut};
use nom::bytes::complete::take;
use nom::number::complete::{le_u32, le_u64, u8 as le_u8};
use nom::IResult;

use super::command::{Command, RequestSize};
use super::extension::RemoteCopyRequest;
use super::tensor::{RpcTensor, MAX_SRC, RPC_TENSOR_SIZE};
use super::version::Dialect;
use crate::error::{Error, Result};

/// Size of the request frame header: command byte + u64 payload size.
pub const REQUEST_HEADER_SIZE: usize = 9;
/// Size of the `conn_caps` transport capability block.
pub const CONN_CAPS_SIZE: usize = 24;
/// Size of the COMM_INIT host field.
pub const COMM_HOST_SIZE: usize = 64;

/// Transport capabilities exchanged in HELLO and on the comm link. All zero = TCP only.
pub type ConnCaps = [u8; CONN_CAPS_SIZE];

/// The fixed 305-byte part of SET_TENSOR; the tensor data follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetTensorHeader {
    /// Destination tensor.
    pub tensor: RpcTensor,
    /// Non-zero: also store the data in the server's tensor cache.
    pub cache_flag: u8,
    /// Byte offset inside the tensor.
    pub offset: u64,
}

/// The fixed 328-byte part of SET_TENSOR_2D and the whole of GET_TENSOR_2D.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor2dHeader {
    /// The tensor.
    pub tensor: RpcTensor,
    /// Byte offset of the first row inside the tensor.
    pub offset: u64,
    /// Bytes per row (copy).
    pub size: u64,
    /// Number of rows.
    pub n_copies: u64,
    /// Distance between rows inside the tensor.
    pub stride: u64,
}

impl Tensor2dHeader {
    /// Total payload bytes (`size · n_copies`), rejecting zero and overflowing products.
    pub fn data_len(&self, command: Command) -> Result<u64> {
        if self.size == 0 || self.n_copies == 0 {
            return Err(Error::MalformedPayload {
                command,
                reason: "size and n_copies must be non-zero",
            });
        }
        self.size
            .checked_mul(self.n_copies)
            .ok_or(Error::MalformedPayload {
                command,
                reason: "size * n_copies overflows",
            })
    }

    /// Bytes from the first row's start to the last row's end, overflow checked.
    pub fn span(&self) -> Result<u64> {
        (self.n_copies - 1)
            .checked_mul(self.stride)
            .and_then(|rows| rows.checked_add(self.size))
            .ok_or(Error::SizeOverflow("2d span"))
    }
}

/// The GRAPH_COMPUTE payload as sent: node ids and the flat tensor record list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphComputeRequest {
    /// Device index.
    pub device: u32,
    /// Graph uid (protocol 8; 0 = not cacheable; always 0 in protocol 7).
    pub uid: u64,
    /// Node ids in execution order.
    pub node_ids: Vec<u64>,
    /// Every tensor the nodes reach, sources before users.
    pub tensors: Vec<RpcTensor>,
}

/// The GET_ALLOC_SIZE payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocSizeRequest {
    /// Device index.
    pub device: u32,
    /// The tensor.
    pub tensor: RpcTensor,
    /// Its sources (absent ones are all-zero records).
    pub srcs: [RpcTensor; MAX_SRC],
}

/// The COMM_INIT payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommInitRequest {
    /// Device that joins the communicator.
    pub device: u32,
    /// This server's rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// Rank 0: port to listen on; others: rank 0's comm port.
    pub port: u32,
    /// Rank 0's host, NUL padded (zeros for rank 0).
    pub host: [u8; COMM_HOST_SIZE],
}

impl CommInitRequest {
    /// The host up to the first NUL (lossy UTF-8).
    pub fn host_str(&self) -> String {
        let host = self.host.split(|&b| b == 0).next().unwrap_or_default();
        String::from_utf8_lossy(host).into_owned()
    }
}

/// One complete request message.
///
/// `SetTensor` and `SetTensor2d` carry their data here; a server session never buffers that
/// data and delivers it in chunks instead (see [`crate::session::ServerEvent`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// HELLO with the client's transport caps.
    Hello {
        /// Client transport capabilities.
        caps: ConnCaps,
    },
    /// DEVICE_COUNT.
    DeviceCount,
    /// ALLOC_BUFFER.
    AllocBuffer {
        /// Device index.
        device: u32,
        /// Requested bytes.
        size: u64,
    },
    /// GET_ALIGNMENT.
    GetAlignment {
        /// Device index.
        device: u32,
    },
    /// GET_MAX_SIZE.
    GetMaxSize {
        /// Device index.
        device: u32,
    },
    /// BUFFER_GET_BASE.
    BufferGetBase {
        /// Buffer handle.
        buffer: u64,
    },
    /// FREE_BUFFER.
    FreeBuffer {
        /// Buffer handle.
        buffer: u64,
    },
    /// BUFFER_CLEAR.
    BufferClear {
        /// Buffer handle.
        buffer: u64,
        /// Fill value.
        value: u8,
    },
    /// SET_TENSOR with its data.
    SetTensor {
        /// Fixed part.
        header: Box<SetTensorHeader>,
        /// Tensor bytes.
        data: Bytes,
    },
    /// SET_TENSOR_HASH.
    SetTensorHash {
        /// Destination tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset inside the tensor.
        offset: u64,
        /// FNV-1a-64 of the data.
        hash: u64,
    },
    /// GET_TENSOR.
    GetTensor {
        /// Source tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset inside the tensor.
        offset: u64,
        /// Bytes to read.
        size: u64,
    },
    /// COPY_TENSOR.
    CopyTensor {
        /// Source tensor.
        src: Box<RpcTensor>,
        /// Destination tensor.
        dst: Box<RpcTensor>,
    },
    /// GRAPH_COMPUTE.
    GraphCompute(Box<GraphComputeRequest>),
    /// GET_DEVICE_MEMORY.
    GetDeviceMemory {
        /// Device index.
        device: u32,
    },
    /// INIT_TENSOR.
    InitTensor {
        /// The tensor.
        tensor: Box<RpcTensor>,
    },
    /// GET_ALLOC_SIZE.
    GetAllocSize(Box<AllocSizeRequest>),
    /// GRAPH_RECOMPUTE.
    GraphRecompute {
        /// Device index.
        device: u32,
        /// Graph uid (protocol 8; always 0 in protocol 7).
        uid: u64,
    },
    /// MEMSET_TENSOR.
    MemsetTensor {
        /// The tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset inside the tensor.
        offset: u64,
        /// Bytes to set.
        size: u64,
        /// Fill value.
        value: u8,
    },
    /// SET_TENSOR_2D with its rows.
    SetTensor2d {
        /// Fixed part.
        header: Box<Tensor2dHeader>,
        /// Rows packed back to back.
        data: Bytes,
    },
    /// GET_TENSOR_2D.
    GetTensor2d(Box<Tensor2dHeader>),
    /// COMM_INIT.
    CommInit(Box<CommInitRequest>),
    /// COMM_ALLREDUCE.
    CommAllreduce {
        /// Device index.
        device: u32,
        /// The tensor to reduce in place.
        tensor: Box<RpcTensor>,
    },
    /// COMM_FREE.
    CommFree {
        /// Device index.
        device: u32,
    },
    /// EXTENSIONS (ours, `0xF0`): the extension bits the client wants.
    Extensions {
        /// Extension bits ([`super::extension`]).
        wanted: u64,
    },
    /// REMOTE_COPY_EXPECT (ours, `0xF1`): a ticket for a destination region (`n_copies` rows
    /// of `size` bytes, `stride` apart, from `offset`; GET_TENSOR_2D's layout).
    RemoteCopyExpect(Box<Tensor2dHeader>),
    /// REMOTE_COPY_ATTACH (ours, `0xF2`): attach this connection to a ticket for the region
    /// it is about to write.
    RemoteCopyAttach {
        /// The ticket.
        ticket: u64,
        /// The destination buffer's handle (the client's connection to this server).
        buffer: u64,
        /// First address of the region (`dst.data + dst_offset`).
        start: u64,
        /// Bytes per row.
        size: u64,
        /// Rows.
        n_copies: u64,
        /// Distance between rows.
        stride: u64,
    },
    /// REMOTE_COPY_TENSOR (ours, `0xF3`): push a region to another server.
    RemoteCopyTensor(Box<RemoteCopyRequest>),
}

fn caps(input: &[u8]) -> IResult<&[u8], ConnCaps> {
    let (input, bytes) = take(CONN_CAPS_SIZE)(input)?;
    let mut out = [0u8; CONN_CAPS_SIZE];
    out.copy_from_slice(bytes);
    Ok((input, out))
}

fn boxed_tensor(input: &[u8]) -> IResult<&[u8], Box<RpcTensor>> {
    let (input, tensor) = RpcTensor::parse(input)?;
    Ok((input, Box::new(tensor)))
}

/// Runs a nom parser over a payload whose length was already checked.
fn run<'a, T>(
    command: Command,
    input: &'a [u8],
    parser: impl FnOnce(&'a [u8]) -> IResult<&'a [u8], T>,
) -> Result<T> {
    parser(input)
        .map(|(_, value)| value)
        .map_err(|_| Error::MalformedPayload {
            command,
            reason: "truncated field",
        })
}

/// Like [`run`], also returning the rest of the input.
fn step<'a, T>(
    command: Command,
    input: &'a [u8],
    parser: impl FnOnce(&'a [u8]) -> IResult<&'a [u8], T>,
) -> Result<(&'a [u8], T)> {
    parser(input).map_err(|_| Error::MalformedPayload {
        command,
        reason: "truncated field",
    })
}

/// Checks a request size field against the command's rule (before anything is allocated).
pub fn check_request_size(command: Command, dialect: Dialect, size: u64) -> Result<()> {
    match command.request_size(dialect) {
        RequestSize::Exact(expected) if size != expected => Err(Error::RequestSizeMismatch {
            command,
            expected,
            got: size,
        }),
        RequestSize::AtLeast(min) if size < min => Err(Error::RequestTooShort {
            command,
            min,
            got: size,
        }),
        _ => Ok(()),
    }
}

impl SetTensorHeader {
    /// Encoded size of the fixed part.
    pub const SIZE: usize = RPC_TENSOR_SIZE + 9;

    /// Parses the fixed part.
    pub fn parse(input: &[u8]) -> IResult<&[u8], SetTensorHeader> {
        let (input, tensor) = RpcTensor::parse(input)?;
        let (input, cache_flag) = le_u8(input)?;
        let (input, offset) = le_u64(input)?;
        Ok((
            input,
            SetTensorHeader {
                tensor,
                cache_flag,
                offset,
            },
        ))
    }

    /// Appends the fixed part.
    pub fn encode(&self, out: &mut impl BufMut) {
        self.tensor.encode(out);
        out.put_u8(self.cache_flag);
        out.put_u64_le(self.offset);
    }
}

impl Tensor2dHeader {
    /// Encoded size.
    pub const SIZE: usize = RPC_TENSOR_SIZE + 32;

    /// Parses the 328-byte block.
    pub fn parse(input: &[u8]) -> IResult<&[u8], Tensor2dHeader> {
        let (input, tensor) = RpcTensor::parse(input)?;
        let (input, offset) = le_u64(input)?;
        let (input, size) = le_u64(input)?;
        let (input, n_copies) = le_u64(input)?;
        let (input, stride) = le_u64(input)?;
        Ok((
            input,
            Tensor2dHeader {
                tensor,
                offset,
                size,
                n_copies,
                stride,
            },
        ))
    }

    /// Appends the 328-byte block.
    pub fn encode(&self, out: &mut impl BufMut) {
        self.tensor.encode(out);
        out.put_u64_le(self.offset);
        out.put_u64_le(self.size);
        out.put_u64_le(self.n_copies);
        out.put_u64_le(self.stride);
    }
}

impl GraphComputeRequest {
    /// Decodes a GRAPH_COMPUTE payload, checking both counts against the payload length before
    /// allocating anything. Trailing bytes are ignored, as the reference does.
    pub fn decode(dialect: Dialect, payload: &[u8]) -> Result<GraphComputeRequest> {
        let command = Command::GraphCompute;
        let malformed = |reason| Error::MalformedPayload { command, reason };
        let header = dialect.graph_header_size();
        if payload.len() < header {
            return Err(malformed("shorter than its header"));
        }
        let (rest, device) = step(command, payload, le_u32)?;
        let (rest, uid) = if dialect.has_graph_uid() {
            step(command, rest, le_u64)?
        } else {
            (rest, 0)
        };
        let (rest, n_nodes) = step(command, rest, le_u32)?;
        // The node ids, leaving at least the 4 bytes of n_tensors.
        let (ids, rest) = (n_nodes as usize)
            .checked_mul(8)
            .and_then(|bytes| rest.split_at_checked(bytes))
            .filter(|(_, rest)| rest.len() >= 4)
            .ok_or(malformed("n_nodes exceeds the payload"))?;
        let node_ids = ids
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        let (rest, n_tensors) = step(command, rest, le_u32)?;
        let records = (n_tensors as usize)
            .checked_mul(RPC_TENSOR_SIZE)
            .and_then(|bytes| rest.get(..bytes))
            .ok_or(malformed("n_tensors exceeds the payload"))?;
        let tensors = records
            .chunks_exact(RPC_TENSOR_SIZE)
            .map(|record| run(command, record, RpcTensor::parse))
            .collect::<Result<Vec<_>>>()?;
        Ok(GraphComputeRequest {
            device,
            uid,
            node_ids,
            tensors,
        })
    }

    /// Encoded payload length.
    pub fn encoded_len(&self, dialect: Dialect) -> usize {
        dialect.graph_header_size()
            + 8 * self.node_ids.len()
            + 4
            + RPC_TENSOR_SIZE * self.tensors.len()
    }

    /// Appends the payload.
    pub fn encode(&self, dialect: Dialect, out: &mut impl BufMut) {
        out.put_u32_le(self.device);
        if dialect.has_graph_uid() {
            out.put_u64_le(self.uid);
        }
        out.put_u32_le(self.node_ids.len() as u32);
        self.node_ids.iter().for_each(|&id| out.put_u64_le(id));
        out.put_u32_le(self.tensors.len() as u32);
        self.tensors.iter().for_each(|t| t.encode(out));
    }
}

impl Request {
    /// The command of this message.
    pub fn command(&self) -> Command {
        match self {
            Request::Hello { .. } => Command::Hello,
            Request::DeviceCount => Command::DeviceCount,
            Request::AllocBuffer { .. } => Command::AllocBuffer,
            Request::GetAlignment { .. } => Command::GetAlignment,
            Request::GetMaxSize { .. } => Command::GetMaxSize,
            Request::BufferGetBase { .. } => Command::BufferGetBase,
            Request::FreeBuffer { .. } => Command::FreeBuffer,
            Request::BufferClear { .. } => Command::BufferClear,
            Request::SetTensor { .. } => Command::SetTensor,
            Request::SetTensorHash { .. } => Command::SetTensorHash,
            Request::GetTensor { .. } => Command::GetTensor,
            Request::CopyTensor { .. } => Command::CopyTensor,
            Request::GraphCompute(_) => Command::GraphCompute,
            Request::GetDeviceMemory { .. } => Command::GetDeviceMemory,
            Request::InitTensor { .. } => Command::InitTensor,
            Request::GetAllocSize(_) => Command::GetAllocSize,
            Request::GraphRecompute { .. } => Command::GraphRecompute,
            Request::MemsetTensor { .. } => Command::MemsetTensor,
            Request::SetTensor2d { .. } => Command::SetTensor2d,
            Request::GetTensor2d(_) => Command::GetTensor2d,
            Request::CommInit(_) => Command::CommInit,
            Request::CommAllreduce { .. } => Command::CommAllreduce,
            Request::CommFree { .. } => Command::CommFree,
            Request::Extensions { .. } => Command::Extensions,
            Request::RemoteCopyExpect { .. } => Command::RemoteCopyExpect,
            Request::RemoteCopyAttach { .. } => Command::RemoteCopyAttach,
            Request::RemoteCopyTensor(_) => Command::RemoteCopyTensor,
        }
    }

    /// Decodes one whole payload of `command`. The size rule is checked first; for SET_TENSOR
    /// and SET_TENSOR_2D the data is sliced out of `payload` without copying.
    pub fn decode(command: Command, dialect: Dialect, payload: Bytes) -> Result<Request> {
        if !command.exists_in(dialect) {
            return Err(Error::UnknownCommand { id: command.id() });
        }
        check_request_size(command, dialect, payload.len() as u64)?;
        let p = &payload[..];
        let request = match command {
            Command::Hello => Request::Hello {
                caps: run(command, p, caps)?,
            },
            Command::DeviceCount => Request::DeviceCount,
            Command::AllocBuffer => run(command, p, |i| {
                let (i, device) = le_u32(i)?;
                let (i, size) = le_u64(i)?;
                Ok((i, Request::AllocBuffer { device, size }))
            })?,
            Command::GetAlignment => Request::GetAlignment {
                device: run(command, p, le_u32)?,
            },
            Command::GetMaxSize => Request::GetMaxSize {
                device: run(command, p, le_u32)?,
            },
            Command::GetDeviceMemory => Request::GetDeviceMemory {
                device: run(command, p, le_u32)?,
            },
            Command::BufferGetBase => Request::BufferGetBase {
                buffer: run(command, p, le_u64)?,
            },
            Command::FreeBuffer => Request::FreeBuffer {
                buffer: run(command, p, le_u64)?,
            },
            Command::BufferClear => run(command, p, |i| {
                let (i, buffer) = le_u64(i)?;
                let (i, value) = le_u8(i)?;
                Ok((i, Request::BufferClear { buffer, value }))
            })?,
            Command::SetTensor => {
                let header = run(command, p, SetTensorHeader::parse)?;
                Request::SetTensor {
                    header: Box::new(header),
                    data: payload.slice(SetTensorHeader::SIZE..),
                }
            }
            Command::SetTensorHash => run(command, p, |i| {
                let (i, tensor) = boxed_tensor(i)?;
                let (i, offset) = le_u64(i)?;
                let (i, hash) = le_u64(i)?;
                Ok((
                    i,
                    Request::SetTensorHash {
                        tensor,
                        offset,
                        hash,
                    },
                ))
            })?,
            Command::GetTensor => run(command, p, |i| {
                let (i, tensor) = boxed_tensor(i)?;
                let (i, offset) = le_u64(i)?;
                let (i, size) = le_u64(i)?;
                Ok((
                    i,
                    Request::GetTensor {
                        tensor,
                        offset,
                        size,
                    },
                ))
            })?,
            Command::CopyTensor => run(command, p, |i| {
                let (i, src) = boxed_tensor(i)?;
                let (i, dst) = boxed_tensor(i)?;
                Ok((i, Request::CopyTensor { src, dst }))
            })?,
            Command::GraphCompute => {
                Request::GraphCompute(Box::new(GraphComputeRequest::decode(dialect, p)?))
            }
            Command::InitTensor => Request::InitTensor {
                tensor: run(command, p, boxed_tensor)?,
            },
            Command::GetAllocSize => run(command, p, |i| {
                let (mut i, device) = le_u32(i)?;
                let (rest, tensor) = RpcTensor::parse(i)?;
                i = rest;
                let mut srcs: [RpcTensor; MAX_SRC] = Default::default();
                for src in srcs.iter_mut() {
                    let (rest, parsed) = RpcTensor::parse(i)?;
                    *src = parsed;
                    i = rest;
                }
                Ok((
                    i,
                    Request::GetAllocSize(Box::new(AllocSizeRequest {
                        device,
                        tensor,
                        srcs,
                    })),
                ))
            })?,
            Command::GraphRecompute => run(command, p, |i| {
                let (i, device) = le_u32(i)?;
                let (i, uid) = if dialect.has_graph_uid() {
                    le_u64(i)?
                } else {
                    (i, 0)
                };
                Ok((i, Request::GraphRecompute { device, uid }))
            })?,
            Command::MemsetTensor => run(command, p, |i| {
                let (i, tensor) = boxed_tensor(i)?;
                let (i, offset) = le_u64(i)?;
                let (i, size) = le_u64(i)?;
                let (i, value) = le_u8(i)?;
                Ok((
                    i,
                    Request::MemsetTensor {
                        tensor,
                        offset,
                        size,
                        value,
                    },
                ))
            })?,
            Command::SetTensor2d => {
                let header = run(command, p, Tensor2dHeader::parse)?;
                let data = payload.slice(Tensor2dHeader::SIZE..);
                if header.data_len(command)? != data.len() as u64 {
                    return Err(Error::MalformedPayload {
                        command,
                        reason: "size * n_copies differs from the data length",
                    });
                }
                Request::SetTensor2d {
                    header: Box::new(header),
                    data,
                }
            }
            Command::GetTensor2d => {
                let header = run(command, p, Tensor2dHeader::parse)?;
                header.data_len(command)?;
                Request::GetTensor2d(Box::new(header))
            }
            Command::CommInit => run(command, p, |i| {
                let (i, device) = le_u32(i)?;
                let (i, rank) = le_u32(i)?;
                let (i, world) = le_u32(i)?;
                let (i, port) = le_u32(i)?;
                let (i, host_bytes) = take(COMM_HOST_SIZE)(i)?;
                let mut host = [0u8; COMM_HOST_SIZE];
                host.copy_from_slice(host_bytes);
                Ok((
                    i,
                    Request::CommInit(Box::new(CommInitRequest {
                        device,
                        rank,
                        world,
                        port,
                        host,
                    })),
                ))
            })?,
            Command::CommAllreduce => run(command, p, |i| {
                let (i, device) = le_u32(i)?;
                let (i, tensor) = boxed_tensor(i)?;
                Ok((i, Request::CommAllreduce { device, tensor }))
            })?,
            Command::CommFree => Request::CommFree {
                device: run(command, p, le_u32)?,
            },
            Command::Extensions => Request::Extensions {
                wanted: run(command, p, le_u64)?,
            },
            Command::RemoteCopyExpect => {
                Request::RemoteCopyExpect(Box::new(run(command, p, Tensor2dHeader::parse)?))
            }
            Command::RemoteCopyAttach => run(command, p, |i| {
                let (i, ticket) = le_u64(i)?;
                let (i, buffer) = le_u64(i)?;
                let (i, start) = le_u64(i)?;
                let (i, size) = le_u64(i)?;
                let (i, n_copies) = le_u64(i)?;
                let (i, stride) = le_u64(i)?;
                Ok((
                    i,
                    Request::RemoteCopyAttach {
                        ticket,
                        buffer,
                        start,
                        size,
                        n_copies,
                        stride,
                    },
                ))
            })?,
            Command::RemoteCopyTensor => {
                Request::RemoteCopyTensor(Box::new(run(command, p, RemoteCopyRequest::parse)?))
            }
        };
        Ok(request)
    }

    /// The bulk data that follows the fixed part (SET_TENSOR, SET_TENSOR_2D), if any.
    pub fn bulk_data(&self) -> Option<&Bytes> {
        match self {
            Request::SetTensor { data, .. } | Request::SetTensor2d { data, .. } => Some(data),
            _ => None,
        }
    }

    /// Appends the frame header and the fixed part of the payload to `out`. The bulk data
    /// ([`Request::bulk_data`]) is not copied: the caller sends it right after, as the
    /// reference client does with its separate header and data writes.
    pub fn encode_head(&self, dialect: Dialect, out: &mut BytesMut) -> Result<()> {
        let command = self.command();
        if !command.exists_in(dialect) {
            return Err(Error::UnknownCommand { id: command.id() });
        }
        let bulk = self.bulk_data().map_or(0, |d| d.len());
        let fixed = match self {
            Request::GraphCompute(graph) => graph.encoded_len(dialect),
            _ => match command.request_size(dialect) {
                RequestSize::Exact(n) | RequestSize::AtLeast(n) => n as usize,
            },
        };
        out.reserve(REQUEST_HEADER_SIZE + fixed);
        out.put_u8(command.id());
        out.put_u64_le((fixed + bulk) as u64);
        match self {
            Request::Hello { caps } => out.put_slice(caps),
            Request::DeviceCount => {}
            Request::AllocBuffer { device, size } => {
                out.put_u32_le(*device);
                out.put_u64_le(*size);
            }
            Request::GetAlignment { device }
            | Request::GetMaxSize { device }
            | Request::GetDeviceMemory { device }
            | Request::CommFree { device } => out.put_u32_le(*device),
            Request::BufferGetBase { buffer } | Request::FreeBuffer { buffer } => {
                out.put_u64_le(*buffer)
            }
            Request::BufferClear { buffer, value } => {
                out.put_u64_le(*buffer);
                out.put_u8(*value);
            }
            Request::SetTensor { header, .. } => header.encode(out),
            Request::SetTensorHash {
                tensor,
                offset,
                hash,
            } => {
                tensor.encode(out);
                out.put_u64_le(*offset);
                out.put_u64_le(*hash);
            }
            Request::GetTensor {
                tensor,
                offset,
                size,
            } => {
                tensor.encode(out);
                out.put_u64_le(*offset);
                out.put_u64_le(*size);
            }
            Request::CopyTensor { src, dst } => {
                src.encode(out);
                dst.encode(out);
            }
            Request::GraphCompute(graph) => graph.encode(dialect, out),
            Request::InitTensor { tensor } => tensor.encode(out),
            Request::GetAllocSize(req) => {
                out.put_u32_le(req.device);
                req.tensor.encode(out);
                req.srcs.iter().for_each(|src| src.encode(out));
            }
            Request::GraphRecompute { device, uid } => {
                out.put_u32_le(*device);
                if dialect.has_graph_uid() {
                    out.put_u64_le(*uid);
                }
            }
            Request::MemsetTensor {
                tensor,
                offset,
                size,
                value,
            } => {
                tensor.encode(out);
                out.put_u64_le(*offset);
                out.put_u64_le(*size);
                out.put_u8(*value);
            }
            Request::SetTensor2d { header, .. } => header.encode(out),
            Request::GetTensor2d(header) => header.encode(out),
            Request::CommInit(req) => {
                out.put_u32_le(req.device);
                out.put_u32_le(req.rank);
                out.put_u32_le(req.world);
                out.put_u32_le(req.port);
                out.put_slice(&req.host);
            }
            Request::CommAllreduce { device, tensor } => {
                out.put_u32_le(*device);
                tensor.encode(out);
            }
            Request::Extensions { wanted } => out.put_u64_le(*wanted),
            Request::RemoteCopyAttach {
                ticket,
                buffer,
                start,
                size,
                n_copies,
                stride,
            } => {
                for v in [ticket, buffer, start, size, n_copies, stride] {
                    out.put_u64_le(*v);
                }
            }
            Request::RemoteCopyExpect(header) => header.encode(out),
            Request::RemoteCopyTensor(request) => request.encode(out),
        }
        Ok(())
    }

    /// The whole frame in one contiguous buffer (copies the bulk data; meant for small
    /// messages, tests and vectors).
    pub fn to_frame(&self, dialect: Dialect) -> Result<Bytes> {
        let mut out = BytesMut::new();
        self.encode_head(dialect, &mut out)?;
        if let Some(data) = self.bulk_data() {
            out.extend_from_slice(data);
        }
        Ok(out.freeze())
    }

    /// Decodes one complete frame (header and payload) that spans exactly `frame`.
    pub fn from_frame(dialect: Dialect, frame: Bytes) -> Result<Request> {
        let Some(&[id, ref size @ ..]) = frame.first_chunk::<REQUEST_HEADER_SIZE>() else {
            return Err(Error::UnexpectedEof(
                (REQUEST_HEADER_SIZE - frame.len()) as u64,
            ));
        };
        let command = Command::from_id(id, dialect)
            .or_else(|| Command::extension(id))
            .ok_or(Error::UnknownCommand { id })?;
        let size = u64::from_le_bytes(*size);
        check_request_size(command, dialect, size)?;
        let available = (frame.len() - REQUEST_HEADER_SIZE) as u64;
        if available < size {
            return Err(Error::UnexpectedEof(size - available));
        }
        if available > size {
            return Err(Error::MalformedPayload {
                command,
                reason: "bytes after the frame",
            });
        }
        Request::decode(command, dialect, frame.slice(REQUEST_HEADER_SIZE..))
    }
}
