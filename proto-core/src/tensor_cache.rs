//! Keys of the server's tensor cache (SET_TENSOR_HASH): FNV-1a-64 and the file name scheme.
//!
//! The cache itself lives on disk and therefore in a shell; the core only defines the key and a
//! streaming hasher so SET_TENSOR data can be hashed chunk by chunk as it arrives.

/// Streaming FNV-1a, 64 bit, as the reference computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a64 {
    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) {
        for &byte in data {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The hash of everything fed so far.
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a-64 of one slice.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut hasher = Fnv1a64::default();
    hasher.update(data);
    hasher.finish()
}

/// The cache file name of a hash: 16 lowercase hex digits, no extension.
pub fn cache_file_name(hash: u64) -> String {
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
        assert_eq!(fnv1a64(&[0u8; 16]), 0x88201fb960ff6465);
        let mut split = Fnv1a64::default();
        split.update(b"foo");
        split.update(b"bar");
        assert_eq!(split.finish(), fnv1a64(b"foobar"));
        assert_eq!(cache_file_name(0xab), "00000000000000ab");
    }
}

/// Where SET_TENSOR_HASH data comes from and SET_TENSOR data with the cache flag goes to.
///
/// Implemented outside the core (a directory of files in the shells); the dispatcher hashes
/// and validates, the store only moves bytes.
pub trait TensorCache: Send + Sync {
    /// Length of the data stored under `hash`, `None` when absent.
    fn len(&self, hash: u64) -> Option<u64>;
    /// Streams the stored data to `sink` in order.
    fn read(
        &self,
        hash: u64,
        sink: &mut dyn FnMut(&[u8]) -> crate::Result<()>,
    ) -> crate::Result<()>;
    /// Starts storing new data (its hash is known only at the end).
    fn begin_store(&self) -> crate::Result<Box<dyn CacheWriter>>;
    /// Removes an entry whose content did not match its name.
    fn remove(&self, hash: u64);
}

/// One entry being written to a [`TensorCache`].
pub trait CacheWriter: Send {
    /// Appends data.
    fn append(&mut self, data: &[u8]) -> crate::Result<()>;
    /// Publishes the entry under `hash` (atomically, where the store can).
    fn commit(self: Box<Self>, hash: u64) -> crate::Result<()>;
}

/// An in-memory [`TensorCache`] for tests.
#[derive(Debug, Default)]
pub struct MemoryTensorCache {
    entries: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>>,
}

impl MemoryTensorCache {
    /// Stores an entry directly (possibly under a wrong name, to test verification).
    pub fn insert(&self, hash: u64, data: Vec<u8>) {
        self.lock().insert(hash, data);
    }

    /// Whether an entry exists.
    pub fn contains(&self, hash: u64) -> bool {
        self.lock().contains_key(&hash)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Vec<u8>>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

struct MemoryCacheWriter {
    entries: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>>,
    data: Vec<u8>,
}

impl CacheWriter for MemoryCacheWriter {
    fn append(&mut self, data: &[u8]) -> crate::Result<()> {
        self.data.extend_from_slice(data);
        Ok(())
    }

    fn commit(self: Box<Self>, hash: u64) -> crate::Result<()> {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.insert(hash, self.data);
        Ok(())
    }
}

impl TensorCache for MemoryTensorCache {
    fn len(&self, hash: u64) -> Option<u64> {
        self.lock().get(&hash).map(|data| data.len() as u64)
    }

    fn read(
        &self,
        hash: u64,
        sink: &mut dyn FnMut(&[u8]) -> crate::Result<()>,
    ) -> crate::Result<()> {
        let data = self.lock().get(&hash).cloned().unwrap_or_default();
        data.chunks(1 << 20).try_for_each(sink)
    }

    fn begin_store(&self) -> crate::Result<Box<dyn CacheWriter>> {
        Ok(Box::new(MemoryCacheWriter {
            entries: self.entries.clone(),
            data: Vec::new(),
        }))
    }

    fn remove(&self, hash: u64) {
        self.lock().remove(&hash);
    }
}
