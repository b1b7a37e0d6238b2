//! The per-connection buffer table: opaque handles and a private address space.
//!
//! The reference puts server pointers on the wire (gap G1). Here a handle is an opaque number
//! and each buffer gets a synthetic, aligned base address in a per-connection address space,
//! so no server pointer ever leaves the process and every address is checked against its range.

use std::collections::HashMap;

use crate::backend::{BufferId, TensorLocation};
use crate::error::{Error, Result};
use crate::ggml::GgmlTable;
use crate::wire::RpcTensor;

/// First synthetic base address: far from 0 so a zeroed field never aliases a buffer.
const ADDRESS_SPACE_START: u64 = 0x0000_1000_0000_0000;
/// Bases are aligned to this, and consecutive buffers are separated by at least this much.
const ADDRESS_GRANULE: u64 = 1 << 16;

/// One buffer of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferEntry {
    /// The backend's id.
    pub id: BufferId,
    /// The device it was allocated on.
    pub device: u32,
    /// Its synthetic base address (0 for a zero-size buffer, as the reference reports).
    pub base: u64,
    /// Its size in bytes.
    pub size: u64,
}

impl BufferEntry {
    /// The location of an absolute address known to be inside the buffer.
    fn location(&self, address: u64) -> TensorLocation {
        TensorLocation {
            buffer: self.id,
            offset: address - self.base,
        }
    }

    /// One past the last address.
    fn end(&self) -> u64 {
        self.base + self.size
    }
}

/// Where a region may start. The reference is strict for SET/GET_TENSOR (even an empty region
/// may not start at the buffer end) and inclusive for MEMSET_TENSOR and the 2D commands; we keep
/// both outcomes so well-formed requests are accepted exactly when the reference accepts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionStart {
    /// `start < buffer end`.
    InsideBuffer,
    /// `start <= buffer end`.
    UpToBufferEnd,
}

/// A tensor record resolved against the buffer table (the reference's "deserialize").
#[derive(Debug, Clone, Copy)]
pub struct ResolvedTensor {
    /// Its buffer, if it names one of this connection's buffers.
    pub buffer: Option<BufferEntry>,
    /// Its byte size.
    pub byte_size: u64,
}

/// Handles and address ranges of one connection's buffers.
#[derive(Debug)]
pub struct BufferTable {
    /// The type table tensors are validated against (the served protocol's).
    table: GgmlTable,
    entries: HashMap<u64, BufferEntry>,
    next_handle: u64,
    next_base: u64,
    total_bytes: u64,
}

impl BufferTable {
    /// An empty table whose tensors are validated against `table`.
    pub fn new(table: GgmlTable) -> Self {
        BufferTable {
            table,
            entries: HashMap::new(),
            next_handle: 0,
            next_base: ADDRESS_SPACE_START,
            total_bytes: 0,
        }
    }
}

impl BufferTable {
    /// Registers a new buffer and returns its wire handle, or `None` when the address space
    /// is exhausted (the caller frees the backend buffer and reports an allocation failure).
    pub fn insert(&mut self, id: BufferId, device: u32, size: u64) -> Option<u64> {
        let base = if size == 0 {
            0
        } else {
            let base = self.next_base;
            let span = size.checked_add(2 * ADDRESS_GRANULE - 1)? & !(ADDRESS_GRANULE - 1);
            self.next_base = base.checked_add(span)?;
            base
        };
        self.next_handle += 1;
        // Opaque but unique: an odd multiplier is a bijection on u64, and never yields 0.
        let handle = self.next_handle.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        self.entries.insert(
            handle,
            BufferEntry {
                id,
                device,
                base,
                size,
            },
        );
        self.total_bytes += size;
        Some(handle)
    }

    /// Looks a handle up.
    pub fn get(&self, handle: u64) -> Result<BufferEntry> {
        self.entries
            .get(&handle)
            .copied()
            .ok_or(Error::UnknownBuffer { handle })
    }

    /// Forgets a handle and returns its entry.
    pub fn remove(&mut self, handle: u64) -> Result<BufferEntry> {
        let entry = self
            .entries
            .remove(&handle)
            .ok_or(Error::UnknownBuffer { handle })?;
        self.total_bytes -= entry.size;
        Ok(entry)
    }

    /// Removes every entry (connection teardown).
    pub fn drain(&mut self) -> impl Iterator<Item = BufferEntry> + '_ {
        self.total_bytes = 0;
        self.entries.drain().map(|(_, entry)| entry)
    }

    /// Lends another connection's buffer to this one under the same handle (an attached
    /// remote copy, [`super::remote_copy`]); it is not counted in
    /// [`total_bytes`](Self::total_bytes) and must be taken out with
    /// [`forget_borrowed`](Self::forget_borrowed), never freed. `false` if the handle is taken.
    pub fn insert_borrowed(&mut self, handle: u64, entry: BufferEntry) -> bool {
        if self.entries.contains_key(&handle) {
            return false;
        }
        self.entries.insert(handle, entry);
        true
    }

    /// Takes a borrowed buffer out of the table without freeing it.
    pub fn forget_borrowed(&mut self, handle: u64) {
        self.entries.remove(&handle);
    }

    /// Bytes held by this connection's buffers.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Number of live buffers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the connection holds no buffer.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Validates a record's shape and resolves its buffer. A non-zero unknown handle is an
    /// error (the reference silently drops it); a tensor with elements must lie inside its
    /// buffer, with overflow-checked arithmetic.
    pub fn resolve(&self, tensor: &RpcTensor) -> Result<ResolvedTensor> {
        tensor.validate_shape(self.table)?;
        let byte_size = tensor.byte_size()?;
        if tensor.buffer == 0 {
            return Ok(ResolvedTensor {
                buffer: None,
                byte_size,
            });
        }
        let entry = self.get(tensor.buffer)?;
        if byte_size > 0 {
            let end = tensor
                .data
                .checked_add(byte_size)
                .ok_or(Error::SizeOverflow("data + nbytes"))?;
            if tensor.data < entry.base || end > entry.end() {
                return Err(Error::OutOfBounds("tensor outside its buffer"));
            }
        }
        Ok(ResolvedTensor {
            buffer: Some(entry),
            byte_size,
        })
    }

    /// Resolves a tensor that must be in a buffer of this connection.
    pub fn resolve_in_buffer(&self, tensor: &RpcTensor) -> Result<(BufferEntry, u64)> {
        let resolved = self.resolve(tensor)?;
        let entry = resolved.buffer.ok_or(Error::MissingBuffer)?;
        Ok((entry, resolved.byte_size))
    }

    /// The location of `len` bytes at `offset` inside a tensor: the region must start inside
    /// the buffer, end inside the buffer, and end inside the tensor (gap G4: the reference
    /// aborts there instead). `rule` says whether an empty region may start at the buffer end.
    pub fn region(
        &self,
        tensor: &RpcTensor,
        offset: u64,
        len: u64,
        rule: RegionStart,
    ) -> Result<TensorLocation> {
        let (entry, byte_size) = self.resolve_in_buffer(tensor)?;
        let start = tensor
            .data
            .checked_add(offset)
            .ok_or(Error::SizeOverflow("data + offset"))?;
        let past_end = match rule {
            RegionStart::InsideBuffer => start >= entry.end(),
            RegionStart::UpToBufferEnd => start > entry.end(),
        };
        if start < entry.base || past_end || len > entry.end() - start {
            return Err(Error::OutOfBounds("region outside the buffer"));
        }
        if offset.checked_add(len).is_none_or(|end| end > byte_size) {
            return Err(Error::OutOfBounds("region outside the tensor"));
        }
        Ok(entry.location(start))
    }

    /// The location of the tensor's first byte (for whole-tensor operations), `None` when it
    /// has no buffer.
    pub fn location(&self, tensor: &RpcTensor) -> Result<Option<TensorLocation>> {
        let resolved = self.resolve(tensor)?;
        Ok(match resolved.buffer {
            Some(entry) if tensor.data >= entry.base && tensor.data <= entry.end() => {
                Some(entry.location(tensor.data))
            }
            Some(_) if resolved.byte_size == 0 => None,
            Some(_) => return Err(Error::OutOfBounds("tensor outside its buffer")),
            None if tensor.data != 0 => return Err(Error::MissingBuffer),
            None => None,
        })
    }
}
