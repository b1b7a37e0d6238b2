//! Response messages (server → client).

use bytes::{BufMut, Bytes, BytesMut};

use super::command::Command;
use super::request::{ConnCaps, CONN_CAPS_SIZE};
use super::version::ProtocolVersion;
use crate::error::{Error, Result};

/// Size of the response frame header: the u64 payload size.
pub const RESPONSE_HEADER_SIZE: usize = 8;

/// HELLO response flag: the server has a local tensor cache (newest upstream; 0 before).
pub const HELLO_FLAG_TENSOR_CACHE: u8 = 0x01;

/// One response message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// HELLO: version, flags byte (padding in 7.0.0/8.0.0) and transport caps.
    Hello {
        /// The server's version.
        version: ProtocolVersion,
        /// Byte 3: 0, or [`HELLO_FLAG_TENSOR_CACHE`].
        flags: u8,
        /// The server's transport caps.
        caps: ConnCaps,
    },
    /// DEVICE_COUNT.
    DeviceCount(u32),
    /// ALLOC_BUFFER: handle 0 and size 0 mean the allocation failed.
    AllocBuffer {
        /// Opaque buffer handle.
        remote_ptr: u64,
        /// Actual buffer size.
        remote_size: u64,
    },
    /// GET_ALIGNMENT.
    Alignment(u64),
    /// GET_MAX_SIZE.
    MaxSize(u64),
    /// BUFFER_GET_BASE.
    BufferBase(u64),
    /// SET_TENSOR_HASH: 1 = written from the cache, 0 = not cached.
    SetTensorHash(u8),
    /// GET_TENSOR data.
    TensorData(Bytes),
    /// COPY_TENSOR: 1 = copied, 0 = the destination cannot copy from the source.
    CopyTensor(u8),
    /// GET_DEVICE_MEMORY.
    DeviceMemory {
        /// Free bytes.
        free: u64,
        /// Total bytes.
        total: u64,
    },
    /// GET_ALLOC_SIZE.
    AllocSize(u64),
    /// GET_TENSOR_2D rows, packed back to back.
    Tensor2dData(Bytes),
    /// COMM_INIT: 1 = communicator ready.
    CommInit(u8),
    /// EXTENSIONS (ours): the granted extension bits.
    Extensions(u64),
    /// REMOTE_COPY_EXPECT (ours): a [`super::RemoteCopyStatus`] byte and the ticket (0 unless
    /// the status is `Ok`).
    RemoteCopyExpect {
        /// Status byte.
        status: u8,
        /// The one-shot ticket.
        ticket: u64,
    },
    /// REMOTE_COPY_ATTACH (ours): a [`super::RemoteCopyStatus`] byte.
    RemoteCopyAttach(u8),
    /// REMOTE_COPY_TENSOR (ours): a [`super::RemoteCopyStatus`] byte.
    RemoteCopyTensor(u8),
}

impl Response {
    /// Which request this response answers (GET_TENSOR and GET_TENSOR_2D share a shape but are
    /// kept apart so a session can check the order).
    pub fn command(&self) -> Command {
        match self {
            Response::Hello { .. } => Command::Hello,
            Response::DeviceCount(_) => Command::DeviceCount,
            Response::AllocBuffer { .. } => Command::AllocBuffer,
            Response::Alignment(_) => Command::GetAlignment,
            Response::MaxSize(_) => Command::GetMaxSize,
            Response::BufferBase(_) => Command::BufferGetBase,
            Response::SetTensorHash(_) => Command::SetTensorHash,
            Response::TensorData(_) => Command::GetTensor,
            Response::CopyTensor(_) => Command::CopyTensor,
            Response::DeviceMemory { .. } => Command::GetDeviceMemory,
            Response::AllocSize(_) => Command::GetAllocSize,
            Response::Tensor2dData(_) => Command::GetTensor2d,
            Response::CommInit(_) => Command::CommInit,
            Response::Extensions(_) => Command::Extensions,
            Response::RemoteCopyExpect { .. } => Command::RemoteCopyExpect,
            Response::RemoteCopyAttach(_) => Command::RemoteCopyAttach,
            Response::RemoteCopyTensor(_) => Command::RemoteCopyTensor,
        }
    }

    /// Payload length of the encoding.
    pub fn payload_len(&self) -> u64 {
        match self {
            Response::TensorData(data) | Response::Tensor2dData(data) => data.len() as u64,
            other => other.command().fixed_response_size().unwrap_or(0),
        }
    }

    /// Decodes the payload of a response to `command`; `expected_len` is the size the request
    /// implies (the client always knows it) and any other length is an error.
    pub fn decode(command: Command, expected_len: u64, payload: Bytes) -> Result<Response> {
        if payload.len() as u64 != expected_len {
            return Err(Error::ResponseSizeMismatch {
                command,
                expected: expected_len,
                got: payload.len() as u64,
            });
        }
        let u64_at = |at: usize| {
            payload
                .get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or(Error::ResponseSizeMismatch {
                    command,
                    expected: expected_len,
                    got: payload.len() as u64,
                })
        };
        let byte0 = || payload.first().copied().ok_or(Error::UnexpectedResponse);
        Ok(match command {
            Command::Hello => {
                let (&[major, minor, patch, flags], rest) = payload
                    .split_first_chunk::<4>()
                    .ok_or(Error::UnexpectedResponse)?;
                let caps: ConnCaps = *rest
                    .first_chunk::<CONN_CAPS_SIZE>()
                    .ok_or(Error::UnexpectedResponse)?;
                Response::Hello {
                    version: ProtocolVersion {
                        major,
                        minor,
                        patch,
                    },
                    flags,
                    caps,
                }
            }
            Command::DeviceCount => Response::DeviceCount(u32::from_le_bytes(
                payload
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .ok_or(Error::UnexpectedResponse)?,
            )),
            Command::AllocBuffer => Response::AllocBuffer {
                remote_ptr: u64_at(0)?,
                remote_size: u64_at(8)?,
            },
            Command::GetAlignment => Response::Alignment(u64_at(0)?),
            Command::GetMaxSize => Response::MaxSize(u64_at(0)?),
            Command::BufferGetBase => Response::BufferBase(u64_at(0)?),
            Command::SetTensorHash => Response::SetTensorHash(byte0()?),
            Command::GetTensor => Response::TensorData(payload),
            Command::CopyTensor => Response::CopyTensor(byte0()?),
            Command::GetDeviceMemory => Response::DeviceMemory {
                free: u64_at(0)?,
                total: u64_at(8)?,
            },
            Command::GetAllocSize => Response::AllocSize(u64_at(0)?),
            Command::GetTensor2d => Response::Tensor2dData(payload),
            Command::CommInit => Response::CommInit(byte0()?),
            Command::Extensions => Response::Extensions(u64_at(0)?),
            Command::RemoteCopyExpect => Response::RemoteCopyExpect {
                status: byte0()?,
                ticket: u64_at(1)?,
            },
            Command::RemoteCopyAttach => Response::RemoteCopyAttach(byte0()?),
            Command::RemoteCopyTensor => Response::RemoteCopyTensor(byte0()?),
            _ => return Err(Error::UnexpectedResponse),
        })
    }

    /// Appends the 8-byte size header and, except for tensor data, the payload. Tensor data is
    /// returned instead of copied so that the caller can send it straight from its buffer.
    pub fn encode_head(&self, out: &mut BytesMut) -> Option<Bytes> {
        out.reserve(RESPONSE_HEADER_SIZE + 28);
        out.put_u64_le(self.payload_len());
        match self {
            Response::Hello {
                version,
                flags,
                caps,
            } => {
                out.put_slice(&[version.major, version.minor, version.patch, *flags]);
                out.put_slice(caps);
            }
            Response::DeviceCount(n) => out.put_u32_le(*n),
            Response::AllocBuffer {
                remote_ptr,
                remote_size,
            } => {
                out.put_u64_le(*remote_ptr);
                out.put_u64_le(*remote_size);
            }
            Response::Alignment(v)
            | Response::MaxSize(v)
            | Response::BufferBase(v)
            | Response::AllocSize(v) => out.put_u64_le(*v),
            Response::SetTensorHash(v)
            | Response::CopyTensor(v)
            | Response::CommInit(v)
            | Response::RemoteCopyAttach(v)
            | Response::RemoteCopyTensor(v) => out.put_u8(*v),
            Response::Extensions(v) => out.put_u64_le(*v),
            Response::RemoteCopyExpect { status, ticket } => {
                out.put_u8(*status);
                out.put_u64_le(*ticket);
            }
            Response::DeviceMemory { free, total } => {
                out.put_u64_le(*free);
                out.put_u64_le(*total);
            }
            Response::TensorData(data) | Response::Tensor2dData(data) => return Some(data.clone()),
        }
        None
    }

    /// The whole frame in one buffer (copies tensor data; for tests and vectors).
    pub fn to_frame(&self) -> Bytes {
        let mut out = BytesMut::new();
        if let Some(data) = self.encode_head(&mut out) {
            out.extend_from_slice(&data);
        }
        out.freeze()
    }
}
