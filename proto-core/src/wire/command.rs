//! The command table: ids, which dialect has them, request sizes and whether they answer.

use super::tensor::RPC_TENSOR_SIZE;
use super::version::Dialect;

/// Every request command of protocols 7 and 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Command {
    /// Allocate a buffer on a device.
    AllocBuffer = 0,
    /// Query a device's buffer alignment.
    GetAlignment = 1,
    /// Query a device's largest buffer.
    GetMaxSize = 2,
    /// Query a buffer's base address.
    BufferGetBase = 3,
    /// Free a buffer.
    FreeBuffer = 4,
    /// Fill a buffer with one byte value.
    BufferClear = 5,
    /// Write bytes into a tensor (variable size, streamed).
    SetTensor = 6,
    /// Write a tensor from the server's tensor cache.
    SetTensorHash = 7,
    /// Read bytes of a tensor.
    GetTensor = 8,
    /// Copy one tensor into another on the same server.
    CopyTensor = 9,
    /// Run a graph (variable size).
    GraphCompute = 10,
    /// Query a device's free and total memory.
    GetDeviceMemory = 11,
    /// Run a buffer type's tensor initialisation hook.
    InitTensor = 12,
    /// Query how many bytes a tensor needs in a buffer.
    GetAllocSize = 13,
    /// Handshake; must be first.
    Hello = 14,
    /// Query the number of devices.
    DeviceCount = 15,
    /// Re-run a stored graph.
    GraphRecompute = 16,
    /// Fill a tensor region with one byte value.
    MemsetTensor = 17,
    /// Write strided rows (8.x, variable size, streamed).
    SetTensor2d = 18,
    /// Read strided rows (8.x).
    GetTensor2d = 19,
    /// Join a server-to-server communicator (8.x).
    CommInit = 20,
    /// All-reduce a tensor across the communicator (8.x).
    CommAllreduce = 21,
    /// Leave the communicator (8.x).
    CommFree = 22,
    /// Ours, private range: negotiate extensions (see [`super::extension`]).
    Extensions = 0xF0,
    /// Ours, remote copy: ask the destination server for a ticket.
    RemoteCopyExpect = 0xF1,
    /// Ours, remote copy: the source server attaches to a ticket on the destination.
    RemoteCopyAttach = 0xF2,
    /// Ours, remote copy: the source server pushes a region to the destination server.
    RemoteCopyTensor = 0xF3,
}

/// How the size field of a request is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestSize {
    /// The size must equal this value.
    Exact(u64),
    /// The size must be at least this value (the fixed part of a variable request).
    AtLeast(u64),
}

const TENSOR: u64 = RPC_TENSOR_SIZE as u64;

impl Command {
    /// All commands, in id order.
    pub const ALL: [Command; 23] = [
        Command::AllocBuffer,
        Command::GetAlignment,
        Command::GetMaxSize,
        Command::BufferGetBase,
        Command::FreeBuffer,
        Command::BufferClear,
        Command::SetTensor,
        Command::SetTensorHash,
        Command::GetTensor,
        Command::CopyTensor,
        Command::GraphCompute,
        Command::GetDeviceMemory,
        Command::InitTensor,
        Command::GetAllocSize,
        Command::Hello,
        Command::DeviceCount,
        Command::GraphRecompute,
        Command::MemsetTensor,
        Command::SetTensor2d,
        Command::GetTensor2d,
        Command::CommInit,
        Command::CommAllreduce,
        Command::CommFree,
    ];

    /// Our private extension commands (ids `0xF0..=0xF3`, in id order). A server accepts them
    /// only on a connection that negotiated them ([`super::extension`]).
    pub const EXTENSIONS: [Command; 4] = [
        Command::Extensions,
        Command::RemoteCopyExpect,
        Command::RemoteCopyAttach,
        Command::RemoteCopyTensor,
    ];

    /// The private extension command with this id, `None` for any other id.
    pub fn extension(id: u8) -> Option<Command> {
        Command::EXTENSIONS
            .get(usize::from(id.checked_sub(0xF0)?))
            .copied()
    }

    /// Whether this is one of our private extension commands.
    pub fn is_extension(self) -> bool {
        self.id() >= 0xF0
    }

    /// The command with this id in `dialect`, `None` for ids the dialect does not define
    /// (including the client-internal `NONE` and our private extension ids).
    pub fn from_id(id: u8, dialect: Dialect) -> Option<Command> {
        Command::ALL
            .get(usize::from(id))
            .copied()
            .filter(|c| c.exists_in(dialect))
    }

    /// The wire id.
    pub fn id(self) -> u8 {
        self as u8
    }

    /// Whether `dialect` has this command.
    pub fn exists_in(self, dialect: Dialect) -> bool {
        dialect == Dialect::V8 || self.id() <= Command::MemsetTensor.id() || self.is_extension()
    }

    /// The size rule of the request payload.
    pub fn request_size(self, dialect: Dialect) -> RequestSize {
        use RequestSize::{AtLeast, Exact};
        match self {
            Command::AllocBuffer => Exact(12),
            Command::GetAlignment | Command::GetMaxSize | Command::GetDeviceMemory => Exact(4),
            Command::BufferGetBase | Command::FreeBuffer => Exact(8),
            Command::BufferClear => Exact(9),
            Command::SetTensor => AtLeast(TENSOR + 9),
            Command::SetTensorHash | Command::GetTensor => Exact(TENSOR + 16),
            Command::CopyTensor => Exact(2 * TENSOR),
            Command::GraphCompute => AtLeast(dialect.graph_header_size() as u64 + 4),
            Command::InitTensor => Exact(TENSOR),
            Command::GetAllocSize => Exact(4 + 11 * TENSOR),
            Command::Hello => Exact(24),
            Command::DeviceCount => Exact(0),
            Command::GraphRecompute => Exact(if dialect.has_graph_uid() { 12 } else { 4 }),
            Command::MemsetTensor => Exact(TENSOR + 17),
            Command::SetTensor2d => AtLeast(TENSOR + 32),
            Command::GetTensor2d => Exact(TENSOR + 32),
            Command::CommInit => Exact(80),
            Command::CommAllreduce => Exact(4 + TENSOR),
            Command::CommFree => Exact(4),
            Command::Extensions => Exact(8),
            Command::RemoteCopyAttach => Exact(48),
            Command::RemoteCopyExpect => Exact(TENSOR + 32),
            Command::RemoteCopyTensor => Exact(super::extension::RemoteCopyRequest::SIZE as u64),
        }
    }

    /// Whether the server answers this command with a response frame.
    pub fn has_response(self) -> bool {
        matches!(
            self,
            Command::AllocBuffer
                | Command::GetAlignment
                | Command::GetMaxSize
                | Command::BufferGetBase
                | Command::SetTensorHash
                | Command::GetTensor
                | Command::CopyTensor
                | Command::GetDeviceMemory
                | Command::GetAllocSize
                | Command::Hello
                | Command::DeviceCount
                | Command::GetTensor2d
                | Command::CommInit
                | Command::Extensions
                | Command::RemoteCopyExpect
                | Command::RemoteCopyAttach
                | Command::RemoteCopyTensor
        )
    }

    /// The response payload size for commands whose answer has a fixed size.
    pub fn fixed_response_size(self) -> Option<u64> {
        match self {
            Command::AllocBuffer | Command::GetDeviceMemory => Some(16),
            Command::GetAlignment
            | Command::GetMaxSize
            | Command::BufferGetBase
            | Command::GetAllocSize => Some(8),
            Command::SetTensorHash
            | Command::CopyTensor
            | Command::CommInit
            | Command::RemoteCopyAttach
            | Command::RemoteCopyTensor => Some(1),
            Command::Extensions => Some(8),
            Command::RemoteCopyExpect => Some(9),
            Command::Hello => Some(28),
            Command::DeviceCount => Some(4),
            _ => None,
        }
    }

    /// Whether the payload after the fixed part is raw tensor data streamed in chunks.
    pub fn streams_payload(self) -> bool {
        matches!(self, Command::SetTensor | Command::SetTensor2d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_protocol_sizes() {
        assert_eq!(Command::from_id(18, Dialect::V7), None);
        assert_eq!(
            Command::from_id(18, Dialect::V8),
            Some(Command::SetTensor2d)
        );
        assert_eq!(Command::from_id(23, Dialect::V8), None);
        assert_eq!(
            Command::GetAllocSize.request_size(Dialect::V7),
            RequestSize::Exact(3260)
        );
        assert_eq!(
            Command::SetTensor.request_size(Dialect::V8),
            RequestSize::AtLeast(305)
        );
        assert_eq!(
            Command::SetTensor2d.request_size(Dialect::V8),
            RequestSize::AtLeast(328)
        );
        assert_eq!(
            Command::GraphCompute.request_size(Dialect::V7),
            RequestSize::AtLeast(12)
        );
        assert_eq!(
            Command::GraphCompute.request_size(Dialect::V8),
            RequestSize::AtLeast(20)
        );
        assert_eq!(
            Command::GraphRecompute.request_size(Dialect::V8),
            RequestSize::Exact(12)
        );
        assert_eq!(
            Command::CommAllreduce.request_size(Dialect::V8),
            RequestSize::Exact(300)
        );
        for (i, c) in Command::ALL.iter().enumerate() {
            assert_eq!(usize::from(c.id()), i);
        }
        for c in Command::EXTENSIONS {
            assert_eq!(Command::extension(c.id()), Some(c));
            assert_eq!(Command::from_id(c.id(), Dialect::V8), None);
            assert!(c.exists_in(Dialect::V7));
        }
        assert_eq!(Command::extension(0xEF), None);
        assert_eq!(Command::extension(0xF4), None);
        assert_eq!(
            Command::RemoteCopyTensor.request_size(Dialect::V7),
            RequestSize::Exact(712)
        );
    }
}
