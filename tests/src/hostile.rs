//! Attacks that are no vector because their bytes are too many to write down: a client that
//! announces a large SET_TENSOR, sends part of its data and leaves. Shared by the shell
//! conformance suite (`ggml-rpc-server/tests/conformance.rs`) and `ggml-rpc conformance`, so
//! both send the same bytes.

use bytes::Bytes;
use proto_core::wire::{Dialect, Request, RpcTensor, SetTensorHeader};

/// An abandoned SET_TENSOR: the frame announces `announced` bytes of data into a buffer of
/// that size; the client sends `sent` of them, then closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbandonedSetTensor {
    /// Bytes of the buffer, of the tensor and of the data the frame announces.
    pub announced: u32,
    /// Bytes of data sent before the client leaves.
    pub sent: u64,
}

/// 256 MiB announced, 100 MiB sent: large enough that the server is in the middle of
/// streaming into backend memory when the client goes.
pub const ABANDONED_SET_TENSOR: AbandonedSetTensor = AbandonedSetTensor {
    announced: 256 << 20,
    sent: 100 << 20,
};

impl AbandonedSetTensor {
    /// The ALLOC_BUFFER that comes first (device 0).
    pub fn alloc(&self) -> Request {
        Request::AllocBuffer {
            device: 0,
            size: u64::from(self.announced),
        }
    }

    /// The SET_TENSOR frame up to its data: header and 305-byte fixed part, for a tensor of
    /// `announced` bytes (type i8) at `base` in buffer `handle`.
    pub fn head(&self, dialect: Dialect, handle: u64, base: u64) -> Result<Vec<u8>, String> {
        let mut tensor = RpcTensor::contiguous(9, 24, [self.announced, 1, 1, 1])
            .ok_or("the tensor's size overflows")?;
        tensor.buffer = handle;
        tensor.data = base;
        let header = SetTensorHeader {
            tensor,
            cache_flag: 0,
            offset: 0,
        };
        let frame = Request::SetTensor {
            header: Box::new(header),
            data: Bytes::from_static(&[0]),
        }
        .to_frame(dialect)
        .map_err(|e| e.to_string())?;
        // Drop the one data byte and announce the whole length instead.
        let mut head = frame[..frame.len() - 1].to_vec();
        let size = SetTensorHeader::SIZE as u64 + u64::from(self.announced);
        head[1..9].copy_from_slice(&size.to_le_bytes());
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_announces_the_whole_write_and_carries_no_data() {
        let head = ABANDONED_SET_TENSOR.head(Dialect::V8, 7, 4096).unwrap();
        assert_eq!(head[0], 6);
        assert_eq!(head.len(), 9 + SetTensorHeader::SIZE);
        let size = u64::from_le_bytes(head[1..9].try_into().unwrap());
        assert_eq!(size, SetTensorHeader::SIZE as u64 + (256 << 20));
    }
}
