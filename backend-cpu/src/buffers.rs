//! Host memory: the buffer table, fallible lazily-zeroed allocation, bounds-checked regions and
//! the locking rules.
//!
//! # Allocation
//! A buffer of at least [`MAPPED_MIN`] bytes is an anonymous memory mapping of its own
//! ([`memmap2::MmapOptions::map_anon`]): fresh zero pages that cost no resident memory until
//! written, page-aligned, and returned to the OS when the buffer goes. Unless the backend was
//! built with [`PagePolicy::Base`], the mapping is advised onto transparent huge pages
//! (`MADV_HUGEPAGE`): a weight matrix streamed once per token then takes one TLB entry per
//! 2 MiB instead of per 4 KiB (the tiny F32 model's 32 MB output matrix took about 10 % less
//! time per pass with them), and receiving a tensor takes one page fault per 2 MiB. On
//! kernels without transparent huge pages the advice is refused and ignored.
//!
//! A smaller buffer is a `Box<[u128]>` obtained from `alloc_zeroed` (through
//! [`bytemuck::allocation::try_zeroed_slice_box`]), which is `calloc` for this element
//! alignment. The buffer's bytes start at the first 64-byte boundary of that storage
//! ([`BUFFER_ALIGN`], ggml's own buffer alignment), which the allocator alone does not give
//! (glibc puts a 16-byte header in front of every block): with a base 16 bytes off a cache
//! line, every 64-byte vector load of a weight row would straddle two lines.
//!
//! Either way failure (including sizes beyond `isize::MAX`) is a soft `None`, never an abort.
//!
//! # Locking
//! The table itself sits behind one `RwLock` that is held only long enough to clone an
//! `Arc<HostBuffer>` (or to insert/remove one); each buffer's bytes have their own `RwLock`.
//! Transfers of different buffers therefore never wait for each other, and reads of one buffer
//! can run side by side. An operation that locks several buffers locks them in ascending
//! [`BufferId`] order — a copy its two, a graph computation every buffer its computed nodes
//! touch (write locks, held for the whole graph, see `compute`) — so no two of them can
//! deadlock.
//!
//! # Accounting
//! Each buffer decrements the shared counters when it is dropped, i.e. when the last `Arc` goes
//! away, so [`BufferPool::used_bytes`] never reports memory as returned while a concurrent
//! operation still holds it. The pool has a capacity: an allocation that would take the
//! requested sizes of all live buffers past it is refused (a soft `None`) before any memory is
//! touched, so buffers backed lazily can never promise away more than the host has.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use proto_core::backend::{BufferId, TensorLocation};
use proto_core::{Error, Result};

/// The storage element of small buffers: 16 bytes, 16-byte aligned on the 64-bit targets we
/// build for.
type Word = u128;

/// Clearing a buffer at least this large to zero swaps in fresh zero pages instead of writing
/// zeros (llama.cpp clears whole KV-cache buffers with 0; this keeps them lazily committed).
/// Below it, `memset` is cheaper than a new allocation.
const FRESH_ZERO_THRESHOLD: usize = 1 << 20;

/// Buffers at least this large get a mapping of their own: the size of one transparent huge
/// page on x86-64 and aarch64, the smallest buffer that can hold one.
pub(crate) const MAPPED_MIN: usize = 2 << 20;

/// Where every buffer's bytes start: a cache line, as ggml's `ggml_aligned_malloc` gives.
pub(crate) const BUFFER_ALIGN: usize = 64;

/// Which pages back the large buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PagePolicy {
    /// Advise large buffers onto transparent huge pages (the default).
    #[default]
    Huge,
    /// The system's base pages only (no advice), for hosts where huge-page faults and
    /// compaction stalls cost more than the TLB misses they save.
    Base,
}

/// Zeroed storage with `len` usable bytes starting at a [`BUFFER_ALIGN`] boundary.
#[derive(Debug)]
enum Storage {
    /// A small buffer: heap words, the bytes `start` bytes into them.
    Heap { words: Box<[Word]>, start: usize },
    /// A large buffer: an anonymous mapping, page-aligned.
    Mapped(memmap2::MmapMut),
}

impl Storage {
    /// Allocates `len` zero bytes, or `None` when the system refuses.
    fn zeroed(len: usize, pages: PagePolicy) -> Option<Storage> {
        if len >= MAPPED_MIN {
            return Storage::mapped(len, pages);
        }
        // Up to this many bytes in front of the aligned start (the words are 16-aligned).
        let slack = BUFFER_ALIGN - std::mem::align_of::<Word>();
        let total = len.checked_add(slack)?;
        let words = total.div_ceil(std::mem::size_of::<Word>());
        let words = bytemuck::allocation::try_zeroed_slice_box::<Word>(words).ok()?;
        let start = words.as_ptr().cast::<u8>().align_offset(BUFFER_ALIGN);
        // `align_offset` may give up (usize::MAX); then the block has no aligned start within
        // the slack, which the check below turns into a refusal rather than a short buffer.
        (start <= slack).then_some(Storage::Heap { words, start })
    }

    /// An anonymous mapping of `len` bytes (`map_anon` refuses lengths above `isize::MAX`).
    fn mapped(len: usize, pages: PagePolicy) -> Option<Storage> {
        let map = memmap2::MmapOptions::new().len(len).map_anon().ok()?;
        if pages == PagePolicy::Huge {
            // Refused only where the kernel has no transparent huge pages (or they are
            // disabled outright); base pages then serve just as correctly.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Some(Storage::Mapped(map))
    }

    fn bytes(&self, len: usize) -> &[u8] {
        match self {
            Storage::Heap { words, start } => {
                &bytemuck::cast_slice::<Word, u8>(words)[*start..*start + len]
            }
            Storage::Mapped(map) => &map[..len],
        }
    }

    fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        match self {
            Storage::Heap { words, start } => {
                &mut bytemuck::cast_slice_mut::<Word, u8>(words)[*start..*start + len]
            }
            Storage::Mapped(map) => &mut map[..len],
        }
    }
}

/// Live-buffer statistics shared by the pool and its buffers.
#[derive(Debug, Default)]
struct Stats {
    used_bytes: AtomicU64,
    live_buffers: AtomicUsize,
}

/// One host-memory buffer.
#[derive(Debug)]
pub(crate) struct HostBuffer {
    /// Usable size in bytes (small buffers' storage is longer: alignment slack and whole
    /// words).
    len: usize,
    /// The pages a fresh storage gets when the buffer is cleared.
    pages: PagePolicy,
    storage: RwLock<Storage>,
    stats: Arc<Stats>,
}

impl HostBuffer {
    /// The buffer's size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Shared access to the bytes.
    pub(crate) fn read(&self) -> ReadBytes<'_> {
        // A panic while holding the lock cannot leave the bytes in a state that matters to
        // the protocol (they are plain data), so a poisoned lock stays usable.
        ReadBytes {
            guard: self.storage.read().unwrap_or_else(|p| p.into_inner()),
            len: self.len,
        }
    }

    /// Exclusive access to the bytes.
    pub(crate) fn write(&self) -> WriteBytes<'_> {
        WriteBytes {
            guard: self.storage.write().unwrap_or_else(|p| p.into_inner()),
            len: self.len,
        }
    }

    /// Sets every byte to `value`.
    pub(crate) fn clear(&self, value: u8) {
        let mut bytes = self.write();
        if value == 0 && self.len >= FRESH_ZERO_THRESHOLD {
            // Same result as writing zeros, but the new pages stay uncommitted until used and
            // the old ones go back to the OS. If the allocator refuses, fall back to writing.
            if let Some(fresh) = Storage::zeroed(self.len, self.pages) {
                let old = std::mem::replace(&mut *bytes.guard, fresh);
                // Unmapping the old storage does not need the lock.
                drop(bytes);
                drop(old);
                return;
            }
        }
        bytes.bytes_mut().fill(value);
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        self.stats
            .used_bytes
            .fetch_sub(self.len as u64, Ordering::Relaxed);
        self.stats.live_buffers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A read lock on a buffer, viewed as its `len` bytes.
pub(crate) struct ReadBytes<'a> {
    guard: RwLockReadGuard<'a, Storage>,
    len: usize,
}

impl ReadBytes<'_> {
    /// The buffer's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.guard.bytes(self.len)
    }
}

/// A write lock on a buffer, viewed as its `len` bytes.
pub(crate) struct WriteBytes<'a> {
    guard: RwLockWriteGuard<'a, Storage>,
    len: usize,
}

impl WriteBytes<'_> {
    /// The buffer's bytes, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.guard.bytes_mut(self.len)
    }
}

/// `[offset, offset + len)` as a slice range of a buffer of `size` bytes, or `OutOfBounds`.
///
/// The dispatcher has already checked every region against its buffer; this is the defensive
/// second check that turns a mistake there into an error instead of a panic.
pub(crate) fn region(size: usize, offset: u64, len: u64) -> Result<Range<usize>> {
    let start = usize::try_from(offset).map_err(|_| Error::OutOfBounds("backend region offset"))?;
    let len = usize::try_from(len).map_err(|_| Error::OutOfBounds("backend region length"))?;
    match start.checked_add(len) {
        Some(end) if end <= size => Ok(start..end),
        _ => Err(Error::OutOfBounds("backend region outside the buffer")),
    }
}

/// Every live buffer of a backend.
#[derive(Debug)]
pub(crate) struct BufferPool {
    next_id: AtomicU64,
    buffers: RwLock<HashMap<BufferId, Arc<HostBuffer>>>,
    stats: Arc<Stats>,
    pages: PagePolicy,
    capacity: u64,
}

impl Default for BufferPool {
    fn default() -> Self {
        BufferPool::new(PagePolicy::default(), u64::MAX)
    }
}

impl BufferPool {
    /// An empty pool whose large buffers get `pages`, holding at most `capacity` bytes.
    pub(crate) fn new(pages: PagePolicy, capacity: u64) -> BufferPool {
        BufferPool {
            // Ids start at 1 so a zeroed id is never a live buffer.
            next_id: AtomicU64::new(1),
            buffers: RwLock::new(HashMap::new()),
            stats: Arc::default(),
            pages,
            capacity,
        }
    }

    /// Allocates a zero-filled buffer of `size` bytes; `None` when it cannot be had or would
    /// take the pool past its capacity.
    pub(crate) fn alloc(&self, size: u64) -> Option<BufferId> {
        let len = usize::try_from(size).ok()?;
        // Reserve first, so concurrent allocations cannot together pass the capacity.
        self.stats
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(size)
                    .filter(|&total| total <= self.capacity)
            })
            .ok()?;
        // Allocate before taking the table lock: a large allocation may take a while and must
        // not stall other connections' lookups.
        let Some(storage) = Storage::zeroed(len, self.pages) else {
            self.stats.used_bytes.fetch_sub(size, Ordering::AcqRel);
            return None;
        };
        self.stats.live_buffers.fetch_add(1, Ordering::Relaxed);
        let buffer = Arc::new(HostBuffer {
            len,
            pages: self.pages,
            storage: RwLock::new(storage),
            stats: self.stats.clone(),
        });
        let id = BufferId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.table_mut().insert(id, buffer);
        Some(id)
    }

    /// Forgets a buffer; its memory goes back when the last user lets go of it.
    pub(crate) fn free(&self, id: BufferId) {
        let removed = self.table_mut().remove(&id);
        // Dropped here, outside the table lock: returning a large buffer to the OS takes time.
        drop(removed);
    }

    /// The buffer behind an id.
    pub(crate) fn get(&self, id: BufferId) -> Result<Arc<HostBuffer>> {
        let table = self.buffers.read().unwrap_or_else(|p| p.into_inner());
        table
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::Backend(format!("unknown buffer {}", id.0)))
    }

    /// Runs `f` on the bytes of `len` bytes at `at`, under the buffer's write lock.
    pub(crate) fn with_region_mut<T>(
        &self,
        at: TensorLocation,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T> {
        let buffer = self.get(at.buffer)?;
        let range = region(buffer.len(), at.offset, len)?;
        let mut bytes = buffer.write();
        Ok(f(&mut bytes.bytes_mut()[range]))
    }

    /// Runs `f` on the bytes of `len` bytes at `at`, under the buffer's read lock.
    pub(crate) fn with_region<T>(
        &self,
        at: TensorLocation,
        len: u64,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T> {
        let buffer = self.get(at.buffer)?;
        let range = region(buffer.len(), at.offset, len)?;
        let bytes = buffer.read();
        Ok(f(&bytes.bytes()[range]))
    }

    /// Copies `len` bytes from `src` to `dst`; overlapping ranges of one buffer behave like
    /// `memmove`.
    pub(crate) fn copy(&self, src: TensorLocation, dst: TensorLocation, len: u64) -> Result<()> {
        let from = self.get(src.buffer)?;
        let to = self.get(dst.buffer)?;
        let src_range = region(from.len(), src.offset, len)?;
        let dst_range = region(to.len(), dst.offset, len)?;
        if src.buffer == dst.buffer {
            // One lock; `copy_within` is memmove.
            let mut bytes = to.write();
            bytes.bytes_mut().copy_within(src_range, dst_range.start);
            return Ok(());
        }
        // Two locks: always in ascending id order (see the module documentation).
        let (source, mut target);
        if src.buffer < dst.buffer {
            source = from.read();
            target = to.write();
        } else {
            target = to.write();
            source = from.read();
        }
        target.bytes_mut()[dst_range].copy_from_slice(&source.bytes()[src_range]);
        Ok(())
    }

    /// Bytes held by live buffers (their requested sizes).
    pub(crate) fn used_bytes(&self) -> u64 {
        self.stats.used_bytes.load(Ordering::Acquire)
    }

    /// Number of live buffers.
    pub(crate) fn live_buffers(&self) -> usize {
        self.stats.live_buffers.load(Ordering::Relaxed)
    }

    fn table_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<BufferId, Arc<HostBuffer>>> {
        // Every mutation of the table is a single insert or remove, so a poisoned lock still
        // guards a consistent map.
        self.buffers.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(buffer: BufferId, offset: u64) -> TensorLocation {
        TensorLocation { buffer, offset }
    }

    #[test]
    fn region_rejects_everything_outside_without_panicking() {
        assert_eq!(region(10, 0, 10).unwrap(), 0..10);
        assert_eq!(region(10, 10, 0).unwrap(), 10..10);
        assert!(region(10, 11, 0).is_err());
        assert!(region(10, 5, 6).is_err());
        assert!(region(10, u64::MAX, 1).is_err());
        assert!(region(10, 1, u64::MAX).is_err());
        assert!(region(usize::MAX, usize::MAX as u64, 1).is_err());
    }

    #[test]
    fn buffers_start_zeroed_and_are_sized_exactly() {
        let mapped = MAPPED_MIN as u64;
        for pages in [PagePolicy::Huge, PagePolicy::Base] {
            let pool = BufferPool::new(pages, u64::MAX);
            for size in [0u64, 1, 15, 16, 17, 1000, mapped - 1, mapped, mapped + 3] {
                let id = pool.alloc(size).unwrap();
                let buffer = pool.get(id).unwrap();
                assert_eq!(buffer.len() as u64, size);
                assert!(buffer.read().bytes().iter().all(|&b| b == 0));
                assert_eq!(buffer.read().bytes().as_ptr() as usize % BUFFER_ALIGN, 0);
                // A region may not reach into the word padding or the mapping's last page.
                assert!(pool.with_region(at(id, 0), size + 1, |_| ()).is_err());
                // The last byte is the buffer's own.
                if size > 0 {
                    pool.with_region_mut(at(id, size - 1), 1, |bytes| bytes[0] = 7)
                        .unwrap();
                    assert_eq!(buffer.read().bytes()[size as usize - 1], 7);
                }
            }
        }
    }

    /// The `VmFlags` of the mapping of this process that holds `address`.
    #[cfg(target_os = "linux")]
    fn vm_flags_at(address: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            // A mapping's header starts with its range, `start-end` in hex; its attribute
            // lines (`Size:`, ..., `VmFlags:`) follow it.
            let range = line.split_whitespace().next().and_then(|first| {
                let (start, end) = first.split_once('-')?;
                let start = usize::from_str_radix(start, 16).ok()?;
                let end = usize::from_str_radix(end, 16).ok()?;
                Some(start..end)
            });
            if let Some(range) = range {
                inside = range.contains(&address);
            } else if let Some(flags) = line.strip_prefix("VmFlags:").filter(|_| inside) {
                return flags.split_whitespace().map(str::to_owned).collect();
            }
        }
        panic!("no mapping holds {address:#x}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_are_advised_onto_huge_pages_unless_base_pages_are_asked_for() {
        // `hg` is the kernel's record of MADV_HUGEPAGE; without transparent huge pages in the
        // kernel the advice is refused and nothing can be checked but the absence.
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
        for (pages, advised) in [(PagePolicy::Huge, thp), (PagePolicy::Base, false)] {
            let pool = BufferPool::new(pages, u64::MAX);
            let id = pool.alloc(4 * MAPPED_MIN as u64).unwrap();
            let buffer = pool.get(id).unwrap();
            let address = buffer.read().bytes().as_ptr() as usize;
            assert_eq!(vm_flags_at(address).contains(&"hg".to_owned()), advised);
            // The fresh storage that a clear to zero swaps in is advised alike.
            buffer.clear(1);
            buffer.clear(0);
            let address = buffer.read().bytes().as_ptr() as usize;
            assert_eq!(vm_flags_at(address).contains(&"hg".to_owned()), advised);
            // Small buffers stay on the heap, never advised on their own.
            let small = pool.get(pool.alloc(4096).unwrap()).unwrap();
            let heap_flags = vm_flags_at(small.read().bytes().as_ptr() as usize);
            assert!(!heap_flags.contains(&"hg".to_owned()));
        }
    }

    #[test]
    fn impossible_sizes_are_soft_failures() {
        let pool = BufferPool::default();
        assert!(pool.alloc(u64::MAX).is_none());
        assert!(pool.alloc(isize::MAX as u64 + 1).is_none());
        // Just below the limit: rounding to whole words must not overflow either.
        assert!(pool.alloc(isize::MAX as u64).is_none());
        assert_eq!(pool.live_buffers(), 0);
        assert_eq!(pool.used_bytes(), 0);
    }

    #[test]
    fn allocations_past_the_capacity_are_refused_until_memory_comes_back() {
        let pool = BufferPool::new(PagePolicy::Base, 1000);
        let a = pool.alloc(600).expect("fits");
        assert_eq!(pool.alloc(401), None, "600 + 401 > 1000");
        let b = pool.alloc(400).expect("exactly full");
        assert_eq!(pool.alloc(1), None);
        assert_eq!(pool.used_bytes(), 1000);
        pool.free(a);
        assert_eq!(pool.used_bytes(), 400);
        assert!(pool.alloc(600).is_some());
        pool.free(b);
        assert_eq!(pool.alloc(u64::MAX), None);
    }

    #[test]
    fn accounting_follows_the_last_reference() {
        let pool = BufferPool::default();
        let a = pool.alloc(100).unwrap();
        let b = pool.alloc(28).unwrap();
        assert_eq!((pool.used_bytes(), pool.live_buffers()), (128, 2));
        let held = pool.get(a).unwrap();
        pool.free(a);
        assert!(pool.get(a).is_err());
        // Still counted while an operation holds it.
        assert_eq!((pool.used_bytes(), pool.live_buffers()), (128, 2));
        drop(held);
        assert_eq!((pool.used_bytes(), pool.live_buffers()), (28, 1));
        pool.free(b);
        pool.free(b); // freeing twice is harmless
        assert_eq!((pool.used_bytes(), pool.live_buffers()), (0, 0));
    }

    #[test]
    fn clear_to_zero_of_a_large_buffer_swaps_storage_with_the_same_result() {
        let pool = BufferPool::default();
        let size = FRESH_ZERO_THRESHOLD + 3;
        let id = pool.alloc(size as u64).unwrap();
        let buffer = pool.get(id).unwrap();
        buffer.clear(0xab);
        assert!(buffer.read().bytes().iter().all(|&b| b == 0xab));
        buffer.clear(0);
        assert_eq!(buffer.len(), size);
        assert!(buffer.read().bytes().iter().all(|&b| b == 0));
        // The swapped-in storage is aligned like the first.
        assert_eq!(buffer.read().bytes().as_ptr() as usize % BUFFER_ALIGN, 0);
        assert_eq!(pool.used_bytes(), size as u64);
    }

    #[test]
    fn same_buffer_copy_is_memmove_in_both_directions() {
        let pool = BufferPool::default();
        let id = pool.alloc(16).unwrap();
        let pattern: Vec<u8> = (0..16).collect();
        pool.with_region_mut(at(id, 0), 16, |b| b.copy_from_slice(&pattern))
            .unwrap();
        // forward overlap
        pool.copy(at(id, 0), at(id, 4), 8).unwrap();
        let got = pool.with_region(at(id, 0), 16, <[u8]>::to_vec).unwrap();
        assert_eq!(got, [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]);
        // backward overlap
        pool.with_region_mut(at(id, 0), 16, |b| b.copy_from_slice(&pattern))
            .unwrap();
        pool.copy(at(id, 4), at(id, 0), 8).unwrap();
        let got = pool.with_region(at(id, 0), 16, <[u8]>::to_vec).unwrap();
        assert_eq!(
            got,
            [4, 5, 6, 7, 8, 9, 10, 11, 8, 9, 10, 11, 12, 13, 14, 15]
        );
    }

    #[test]
    fn opposite_copies_between_two_buffers_do_not_deadlock() {
        let pool = Arc::new(BufferPool::default());
        let a = pool.alloc(4096).unwrap();
        let b = pool.alloc(4096).unwrap();
        let threads: Vec<_> = [(a, b), (b, a), (a, b), (b, a)]
            .into_iter()
            .map(|(src, dst)| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        pool.copy(at(src, i % 64), at(dst, 64), 1024).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }
}
