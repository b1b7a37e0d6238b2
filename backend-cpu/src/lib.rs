//! The embedded default backend of `ggml-rpc-server`: one device, `"CPU"`, whose buffers live
//! in host memory.
//!
//! [`CpuBackend`] implements [`proto_core::backend::Backend`]. It answers the device queries
//! exactly as ggml's CPU backend does for its default buffer type, so a llama.cpp client lays
//! tensors out identically whether it talks to this server or to the reference one:
//!
//! | query | answer | upstream source (llama.cpp b11434) |
//! |---|---|---|
//! | GET_ALIGNMENT | [`CpuBackend::ALIGNMENT`] = 32 | `ggml_backend_cpu_buffer_type_get_alignment` returns `TENSOR_ALIGNMENT` (`ggml/src/ggml-backend.cpp`), defined as 32 in `ggml/src/ggml-impl.h` |
//! | GET_MAX_SIZE | [`CpuBackend::MAX_SIZE`] = `u64::MAX` | the CPU buffer type has no `get_max_size`, and `ggml_backend_buft_get_max_size` then returns `SIZE_MAX` (`ggml-backend.cpp`) |
//! | GET_ALLOC_SIZE | `ggml_nbytes` of the tensor ([`RpcTensor::byte_size`]) | the CPU buffer type has no `get_alloc_size`, and `ggml_backend_buft_get_alloc_size` then returns `ggml_nbytes` (`ggml-backend.cpp`) |
//!
//! The CPU device's default buffer type is `ggml_backend_cpu_buffer_type()`
//! (`ggml_backend_cpu_device_get_buffer_type` in `ggml/src/ggml-cpu/ggml-cpu.cpp`). Its "extra"
//! buffer types (repack, AMX, KleidiAI) change alignment and allocation sizes, but the RPC
//! server only ever allocates from the default type, so they play no part here.
//!
//! Module layout:
//! * `buffers`: host memory (allocation, per-buffer locks, bounds checks, accounting);
//! * `compute`: graph execution — planning and checking every node, then running ggml's ops on
//!   the locked buffers with `-t N` threads (`compute/mod.rs` says where each part is);
//! * `meminfo`: the host's memory figures and CPU name;
//! * `ring`: the communicator (a ring all-reduce over TCP, any number of servers).
//!
//! `unsafe` is denied crate-wide and allowed in exactly three modules, each block with a
//! `// SAFETY:` argument: `compute/memory.rs` (raw access to the locked buffers' bytes, checked
//! once per node), `compute/quant/simd/` and `compute/ops/fa_accumulate.rs` (CPU-feature
//! dispatch and SIMD intrinsics).
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod buffers;
mod compute;
mod meminfo;
mod ring;

use proto_core::backend::{
    AllocatedBuffer, Backend, Bootstrap, BufferId, Communicator, DeviceMemory, PreparedGraph,
    TensorLocation,
};
use proto_core::graph::Graph;
use proto_core::wire::RpcTensor;
use proto_core::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

use buffers::BufferPool;

/// The quant module's kernels, for the criterion benches in `benches/` (which, as separate
/// crates, see only public items); not an API.
#[doc(hidden)]
pub mod bench {
    pub use crate::compute::quant::{
        dequantize_row, dot_float_row1_variant, dot_float_rows, dot_tile, dot_tile_variant,
        dot_tile_vl1_variant, dot_tile_zmm_variant, format, quantize_row, quantize_row_ref,
        row_size, type_id, vec_dot, vec_dot_type, FloatRows, Q8Row, Q8Rows, StridedRows, Q0,
    };
}
pub use buffers::PagePolicy;

/// What GET_DEVICE_MEMORY answers when the host's figures cannot be read (non-Linux systems,
/// or an unreadable `/proc/meminfo`): zero free of zero total, i.e. "unknown".
pub const UNKNOWN_MEMORY: DeviceMemory = DeviceMemory { free: 0, total: 0 };

/// Settings of a [`CpuBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuConfig {
    /// Threads for graph compute (`-t N`), the calling thread included; 0 is taken as 1
    /// because a compute pool needs at least one thread.
    pub threads: usize,
    /// The pages behind large buffers: transparent huge pages by default.
    pub pages: PagePolicy,
    /// Most bytes all buffers together may hold.
    pub capacity: MemoryCapacity,
}

/// How much memory the device's buffers may hold together. Buffers are backed lazily, so
/// without a bound clients could be promised more than the host has, and writing into it
/// would get the whole server killed by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryCapacity {
    /// What the host reports available when the backend starts, less a margin for the
    /// server itself and the system: a tenth of the total, at least 1 GiB (unbounded where
    /// the host's memory cannot be read).
    #[default]
    Available,
    /// A fixed number of bytes.
    Bytes(u64),
}

impl MemoryCapacity {
    /// The capacity in bytes; `host` gives the host's memory (`None`: unknown) and is only
    /// asked for [`MemoryCapacity::Available`].
    pub fn resolve(self, host: impl FnOnce() -> Option<DeviceMemory>) -> u64 {
        match self {
            MemoryCapacity::Bytes(bytes) => bytes,
            MemoryCapacity::Available => host().map_or(u64::MAX, |host| {
                let margin = (host.total / 10).max(1 << 30);
                host.free.saturating_sub(margin)
            }),
        }
    }
}

impl Default for CpuConfig {
    /// `ggml-rpc-server`'s default: half the hardware threads, at least one.
    fn default() -> Self {
        let hardware = std::thread::available_parallelism().map_or(1, |n| n.get());
        CpuConfig {
            threads: (hardware / 2).max(1),
            pages: PagePolicy::default(),
            capacity: MemoryCapacity::default(),
        }
    }
}

/// The CPU device: host-memory buffers, shared by every connection of the server.
///
/// Every method takes `&self`; wrap the backend in an `Arc` and hand it to each connection's
/// dispatcher. Buffers are locked individually, so transfers of different buffers run in
/// parallel.
#[derive(Debug)]
pub struct CpuBackend {
    threads: usize,
    /// Most bytes all buffers together may hold.
    capacity: u64,
    /// The compute threads, started on the first graph that needs them.
    pool: compute::Pool,
    buffers: BufferPool,
    /// Graph plans built (a recompute of a stored graph reuses its plan).
    plans: AtomicU64,
}

impl CpuBackend {
    /// The device's name (ggml's CPU device name, used by `-d CPU`).
    pub const DEVICE_NAME: &'static str = "CPU";
    /// Alignment of the default buffer type: ggml's `TENSOR_ALIGNMENT`.
    pub const ALIGNMENT: u64 = 32;
    /// Largest buffer the default buffer type will try to allocate: ggml's `SIZE_MAX` default
    /// ("unlimited"; a real allocation may of course still fail).
    pub const MAX_SIZE: u64 = u64::MAX;

    /// A backend with the given settings and no buffers.
    pub fn new(config: CpuConfig) -> CpuBackend {
        let threads = config.threads.max(1);
        let capacity = config.capacity.resolve(meminfo::system_memory);
        CpuBackend {
            threads,
            capacity,
            pool: compute::Pool::new(threads),
            buffers: BufferPool::new(config.pages, capacity),
            plans: AtomicU64::new(0),
        }
    }

    /// The compute thread count.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The device's name, [`CpuBackend::DEVICE_NAME`].
    pub fn device_name(&self) -> &'static str {
        Self::DEVICE_NAME
    }

    /// The device's description for the server banner: the CPU model where the OS tells it,
    /// otherwise `"CPU"` (as ggml's CPU device does).
    pub fn device_description(&self) -> String {
        meminfo::cpu_description()
    }

    /// Most bytes all buffers together may hold (see [`MemoryCapacity`]).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held by live buffers (requested sizes), to check that closed connections gave
    /// their memory back.
    pub fn used_bytes(&self) -> u64 {
        self.buffers.used_bytes()
    }

    /// How many graph plans (the check of every node before a graph runs) this backend has
    /// built: one per GRAPH_COMPUTE, none for a GRAPH_RECOMPUTE of a stored graph whose
    /// buffers are unchanged.
    pub fn plans_built(&self) -> u64 {
        self.plans.load(Ordering::Relaxed)
    }

    /// Number of live buffers.
    pub fn live_buffers(&self) -> usize {
        self.buffers.live_buffers()
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new(CpuConfig::default())
    }
}

impl Backend for CpuBackend {
    fn device_count(&self) -> u32 {
        1
    }

    fn device_memory(&self, _device: u32) -> DeviceMemory {
        // Free is what a new buffer can still get: never more than the capacity leaves.
        let left = self.capacity.saturating_sub(self.buffers.used_bytes());
        match meminfo::system_memory() {
            Some(host) => DeviceMemory {
                free: host.free.min(left),
                total: host.total,
            },
            None if self.capacity == u64::MAX => UNKNOWN_MEMORY,
            None => DeviceMemory {
                free: left,
                total: self.capacity,
            },
        }
    }

    fn alignment(&self, _device: u32) -> u64 {
        Self::ALIGNMENT
    }

    fn max_size(&self, _device: u32) -> u64 {
        Self::MAX_SIZE
    }

    fn alloc_buffer(&self, device: u32, size: u64) -> Option<AllocatedBuffer> {
        // The dispatcher checks the index; a stray one is still only a failed allocation.
        if device != 0 {
            return None;
        }
        let id = self.buffers.alloc(size)?;
        Some(AllocatedBuffer { id, size })
    }

    fn free_buffer(&self, buffer: BufferId) {
        self.buffers.free(buffer);
    }

    fn clear_buffer(&self, buffer: BufferId, value: u8) -> Result<()> {
        self.buffers.get(buffer)?.clear(value);
        Ok(())
    }

    fn write(&self, at: TensorLocation, data: &[u8]) -> Result<()> {
        self.buffers
            .with_region_mut(at, data.len() as u64, |region| region.copy_from_slice(data))
    }

    fn read(&self, at: TensorLocation, out: &mut [u8]) -> Result<()> {
        self.buffers
            .with_region(at, out.len() as u64, |region| out.copy_from_slice(region))
    }

    fn read_bytes(&self, at: TensorLocation, len: usize) -> Result<bytes::Bytes> {
        // One copy straight out of the buffer, without zero-filling a reply piece first.
        self.buffers
            .with_region(at, len as u64, bytes::Bytes::copy_from_slice)
    }

    fn write_in_place(
        &self,
        at: TensorLocation,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<Option<usize>> {
        self.buffers
            .with_region_mut(at, len as u64, |region| fill(region))
            .map(Some)
    }

    fn read_in_place(
        &self,
        at: TensorLocation,
        len: usize,
        drain: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<Option<usize>> {
        self.buffers
            .with_region(at, len as u64, |region| drain(region))
            .map(Some)
    }

    fn fill(&self, at: TensorLocation, len: u64, value: u8) -> Result<()> {
        self.buffers
            .with_region_mut(at, len, |region| region.fill(value))
    }

    fn copy(&self, src: TensorLocation, dst: TensorLocation, len: u64) -> Result<bool> {
        // Every buffer of this backend is host memory, so every pair can copy directly.
        self.buffers.copy(src, dst, len)?;
        Ok(true)
    }

    fn alloc_size(&self, _device: u32, tensor: &RpcTensor) -> Result<u64> {
        // ggml's CPU buffer type has no get_alloc_size: ggml_nbytes, no padding.
        tensor.byte_size()
    }

    fn init_tensor(&self, at: TensorLocation, tensor: &RpcTensor) -> Result<()> {
        // ggml's CPU buffer has no init_tensor hook: nothing to prepare. The tensor is still
        // checked against its buffer so a dispatcher mistake surfaces here as an error.
        let size = tensor.byte_size()?;
        let buffer = self.buffers.get(at.buffer)?;
        buffers::region(buffer.len(), at.offset, size).map(|_| ())
    }

    fn graph_compute(&self, device: u32, graph: &Graph) -> Result<()> {
        if device != 0 {
            return Err(Error::InvalidDevice { device, count: 1 });
        }
        compute::run_stored(&self.buffers, &self.pool, graph, None, &self.plans)
    }

    fn graph_compute_stored(
        &self,
        device: u32,
        graph: &Graph,
        prepared: &mut Option<PreparedGraph>,
    ) -> Result<()> {
        if device != 0 {
            return Err(Error::InvalidDevice { device, count: 1 });
        }
        compute::run_stored(
            &self.buffers,
            &self.pool,
            graph,
            Some(prepared),
            &self.plans,
        )
    }

    fn communicator_available(&self, device: u32) -> bool {
        device == 0
    }

    fn communicator_init(
        &self,
        device: u32,
        bootstrap: &mut dyn Bootstrap,
    ) -> Result<Box<dyn Communicator>> {
        if device != 0 {
            return Err(Error::InvalidDevice { device, count: 1 });
        }
        Ok(Box::new(ring::Ring::establish(bootstrap)?))
    }
}

#[cfg(test)]
mod tests;
