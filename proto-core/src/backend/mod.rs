//! The one trait every device sits behind, and an in-memory test double.
//!
//! A backend sees validated, already translated requests: buffers by [`BufferId`], regions as
//! byte offsets that the dispatcher has bounds-checked against the buffer. It never sees wire
//! handles or wire addresses, and it does no I/O of the connection.

pub mod communicator;
pub mod memory;

use crate::error::Result;
use crate::graph::Graph;
use crate::wire::RpcTensor;

pub use communicator::{Bootstrap, Communicator, Duplex, SecuredStream, Side};
pub use memory::MemoryBackend;

/// A backend's own name for one of its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

/// A byte position inside a backend buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorLocation {
    /// The buffer.
    pub buffer: BufferId,
    /// Byte offset from the start of the buffer.
    pub offset: u64,
}

/// A buffer the backend allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatedBuffer {
    /// Its id.
    pub id: BufferId,
    /// Its usable size (at least the requested size).
    pub size: u64,
}

/// Free and total memory of a device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceMemory {
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

/// What a backend keeps with a stored graph so that GRAPH_RECOMPUTE need not redo the work that
/// follows from the graph alone (the CPU backend: its checked plan of every node). Opaque to
/// the dispatcher, which drops it together with the stored graph.
pub type PreparedGraph = Box<dyn std::any::Any + Send + Sync>;

/// A compute device (or a set of them) behind the RPC server.
///
/// Methods take `&self` so one backend can serve many connections at once; implementations
/// synchronise internally. Device indices passed in are always `< device_count()` and buffer
/// regions are always inside the buffer: the dispatcher checks both first.
pub trait Backend: Send + Sync {
    /// Number of devices; the wire's device index is the position in this list.
    fn device_count(&self) -> u32;
    /// Current memory figures of a device.
    fn device_memory(&self, device: u32) -> DeviceMemory;
    /// Alignment of the device's default buffer type.
    fn alignment(&self, device: u32) -> u64;
    /// Largest single buffer the device can allocate.
    fn max_size(&self, device: u32) -> u64;
    /// Allocates a buffer; `None` is a soft failure the client is told about.
    fn alloc_buffer(&self, device: u32, size: u64) -> Option<AllocatedBuffer>;
    /// Frees a buffer.
    fn free_buffer(&self, buffer: BufferId);
    /// Sets every byte of a buffer.
    fn clear_buffer(&self, buffer: BufferId, value: u8) -> Result<()>;
    /// Writes bytes at a location.
    fn write(&self, at: TensorLocation, data: &[u8]) -> Result<()>;
    /// Reads `out.len()` bytes from a location.
    fn read(&self, at: TensorLocation, out: &mut [u8]) -> Result<()>;
    /// Reads `len` bytes from a location into a new buffer (a reply piece). The default
    /// zero-fills a buffer and calls [`Backend::read`]; host-memory backends copy once instead.
    fn read_bytes(&self, at: TensorLocation, len: usize) -> Result<bytes::Bytes> {
        let mut data = vec![0u8; len];
        self.read(at, &mut data)?;
        Ok(data.into())
    }
    /// Lends the `len` bytes at a location to `fill` for writing in place and returns how
    /// many of them, from the start, `fill` says it wrote; `Ok(None)` when this backend's
    /// memory is not host-addressable (the default), so the caller writes through
    /// [`Backend::write`] instead.
    ///
    /// This is how a shell receives SET_TENSOR data from its socket straight into device
    /// memory with no intermediate buffer: `fill` is a non-blocking receive. It must return
    /// quickly (the region may be locked while it runs) and never more than the slice length.
    fn write_in_place(
        &self,
        at: TensorLocation,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<Option<usize>> {
        let _ = (at, len, fill);
        Ok(None)
    }
    /// Lends the `len` bytes at a location to `drain` for reading in place and returns how
    /// many of them, from the start, `drain` says it consumed; `Ok(None)` when this backend's
    /// memory is not host-addressable (the default). The GET_TENSOR counterpart of
    /// [`Backend::write_in_place`]: `drain` is a non-blocking send.
    fn read_in_place(
        &self,
        at: TensorLocation,
        len: usize,
        drain: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<Option<usize>> {
        let _ = (at, len, drain);
        Ok(None)
    }
    /// Sets `len` bytes at a location to `value`.
    fn fill(&self, at: TensorLocation, len: u64, value: u8) -> Result<()>;
    /// Copies `len` bytes between buffers of this backend; `Ok(false)` if this pair of buffers
    /// cannot copy directly (the client then copies through its own memory).
    fn copy(&self, src: TensorLocation, dst: TensorLocation, len: u64) -> Result<bool>;
    /// Bytes a tensor needs in a buffer of `device` (default: its byte size).
    fn alloc_size(&self, device: u32, tensor: &RpcTensor) -> Result<u64> {
        let _ = device;
        tensor.byte_size()
    }
    /// The buffer type's tensor initialisation hook (default: nothing to do).
    fn init_tensor(&self, at: TensorLocation, tensor: &RpcTensor) -> Result<()> {
        let _ = (at, tensor);
        Ok(())
    }
    /// Runs a validated graph whose tensors all carry their locations.
    fn graph_compute(&self, device: u32, graph: &Graph) -> Result<()>;
    /// Runs a graph the dispatcher stores for GRAPH_RECOMPUTE. `prepared` is the slot kept
    /// with that stored graph: empty on its first run, then whatever this method left in it.
    ///
    /// The dispatcher drops the slot with the graph: when a GRAPH_COMPUTE replaces it, when
    /// the cache is cleared and on every FREE_BUFFER (so a buffer id in it may only name a
    /// buffer that was live when it was made, and ids of freed buffers are not reused while
    /// a slot lives). What it holds may depend on the graph and on the sizes of its buffers,
    /// never on their contents (SET_TENSOR, BUFFER_CLEAR and other graphs change those between
    /// runs), and a backend still checks memory it reaches through it. The default keeps
    /// nothing and runs [`Backend::graph_compute`].
    fn graph_compute_stored(
        &self,
        device: u32,
        graph: &Graph,
        prepared: &mut Option<PreparedGraph>,
    ) -> Result<()> {
        let _ = prepared;
        self.graph_compute(device, graph)
    }
    /// Waits until every device is idle (protocol 8 launches graphs asynchronously).
    fn synchronize(&self) {}
    /// Whether `device` offers a multi-process communicator (its vote in the newest link's
    /// path negotiation, PROTOCOL.md §6.3). Default: no, and the pairwise link is used.
    fn communicator_available(&self, device: u32) -> bool {
        let _ = device;
        false
    }
    /// Builds this rank's communicator for `device`, exchanging what it needs through
    /// `bootstrap`; called on every rank once all voted yes.
    fn communicator_init(
        &self,
        device: u32,
        bootstrap: &mut dyn Bootstrap,
    ) -> Result<Box<dyn Communicator>> {
        let _ = (device, bootstrap);
        Err(crate::Error::Comm(crate::comm::CommError::NoCommunicator {
            device,
        }))
    }
}
