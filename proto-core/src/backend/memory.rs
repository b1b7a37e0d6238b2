//! [`MemoryBackend`]: host-memory buffers with no compute, for tests of the core and shells.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{AllocatedBuffer, Backend, BufferId, DeviceMemory, TensorLocation};
use crate::error::{Error, Result};
use crate::graph::Graph;

/// A test double: `devices` devices of `capacity` bytes each, buffers as `Vec<u8>`, graphs
/// accepted and counted but not executed.
#[derive(Debug)]
pub struct MemoryBackend {
    devices: u32,
    capacity: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    buffers: HashMap<BufferId, (u32, Vec<u8>)>,
    graphs_run: u64,
    largest_write: usize,
}

impl MemoryBackend {
    /// A backend with `devices` devices of `capacity` bytes each.
    pub fn new(devices: u32, capacity: u64) -> MemoryBackend {
        MemoryBackend {
            devices,
            capacity,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps inconsistent (every mutation is
        // a single insert/remove/copy), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Number of live buffers (to check that a closed connection freed everything).
    pub fn live_buffers(&self) -> usize {
        self.state().buffers.len()
    }

    /// Bytes held by live buffers.
    pub fn used_bytes(&self) -> u64 {
        self.state()
            .buffers
            .values()
            .map(|(_, b)| b.len() as u64)
            .sum()
    }

    /// The most bytes one [`Backend::write`] call carried (a streamed write's largest chunk).
    pub fn largest_write(&self) -> usize {
        self.state().largest_write
    }

    /// Number of graphs run so far.
    pub fn graphs_run(&self) -> u64 {
        self.state().graphs_run
    }

    fn used_on(&self, state: &State, device: u32) -> u64 {
        state
            .buffers
            .values()
            .filter(|(d, _)| *d == device)
            .map(|(_, b)| b.len() as u64)
            .sum()
    }

    fn with_region<T>(
        &self,
        at: TensorLocation,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T> {
        let mut state = self.state();
        let (_, bytes) = state
            .buffers
            .get_mut(&at.buffer)
            .ok_or(Error::Backend(format!("unknown buffer {:?}", at.buffer)))?;
        let start = usize::try_from(at.offset).map_err(|_| Error::OutOfBounds("offset"))?;
        let len = usize::try_from(len).map_err(|_| Error::OutOfBounds("length"))?;
        let region = start
            .checked_add(len)
            .and_then(|end| bytes.get_mut(start..end))
            .ok_or(Error::OutOfBounds("backend region"))?;
        Ok(f(region))
    }
}

impl Backend for MemoryBackend {
    fn device_count(&self) -> u32 {
        self.devices
    }

    fn device_memory(&self, device: u32) -> DeviceMemory {
        let used = self.used_on(&self.state(), device);
        DeviceMemory {
            free: self.capacity.saturating_sub(used),
            total: self.capacity,
        }
    }

    fn alignment(&self, _device: u32) -> u64 {
        32
    }

    fn max_size(&self, _device: u32) -> u64 {
        self.capacity
    }

    fn alloc_buffer(&self, device: u32, size: u64) -> Option<AllocatedBuffer> {
        let mut state = self.state();
        if self.used_on(&state, device).checked_add(size)? > self.capacity {
            return None;
        }
        let bytes = vec![0u8; usize::try_from(size).ok()?];
        state.next_id += 1;
        let id = BufferId(state.next_id);
        state.buffers.insert(id, (device, bytes));
        Some(AllocatedBuffer { id, size })
    }

    fn free_buffer(&self, buffer: BufferId) {
        self.state().buffers.remove(&buffer);
    }

    fn clear_buffer(&self, buffer: BufferId, value: u8) -> Result<()> {
        let mut state = self.state();
        let (_, bytes) = state
            .buffers
            .get_mut(&buffer)
            .ok_or(Error::Backend(format!("unknown buffer {buffer:?}")))?;
        bytes.fill(value);
        Ok(())
    }

    fn write(&self, at: TensorLocation, data: &[u8]) -> Result<()> {
        {
            let mut state = self.state();
            state.largest_write = state.largest_write.max(data.len());
        }
        self.with_region(at, data.len() as u64, |region| region.copy_from_slice(data))
    }

    fn read(&self, at: TensorLocation, out: &mut [u8]) -> Result<()> {
        self.with_region(at, out.len() as u64, |region| out.copy_from_slice(region))
    }

    fn write_in_place(
        &self,
        at: TensorLocation,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<Option<usize>> {
        self.with_region(at, len as u64, |region| fill(region))
            .map(Some)
    }

    fn read_in_place(
        &self,
        at: TensorLocation,
        len: usize,
        drain: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<Option<usize>> {
        self.with_region(at, len as u64, |region| drain(region))
            .map(Some)
    }

    fn fill(&self, at: TensorLocation, len: u64, value: u8) -> Result<()> {
        self.with_region(at, len, |region| region.fill(value))
    }

    fn copy(&self, src: TensorLocation, dst: TensorLocation, len: u64) -> Result<bool> {
        let mut staging = vec![0u8; usize::try_from(len).map_err(|_| Error::OutOfBounds("copy"))?];
        self.read(src, &mut staging)?;
        self.write(dst, &staging)?;
        Ok(true)
    }

    fn graph_compute(&self, _device: u32, _graph: &Graph) -> Result<()> {
        self.state().graphs_run += 1;
        Ok(())
    }
}
