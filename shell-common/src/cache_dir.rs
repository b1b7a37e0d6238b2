//! [`FsTensorCache`]: the SET_TENSOR_HASH tensor cache as a directory of files.
//!
//! The layout is the reference's (PROTOCOL.md §5.11.1): one file per entry, named by the
//! FNV-1a-64 hash of its content as exactly 16 lowercase hex digits, directly inside the
//! directory, holding the raw bytes and nothing else. A directory filled by llama.cpp's
//! `rpc-server -c` can therefore be served as it is, and the other way round.
//!
//! Unlike the reference, an entry is written to a hidden temporary file in the same directory
//! and renamed into place when complete, so a reader never sees a half-written entry and an
//! interrupted upload leaves no entry behind. The dispatcher re-hashes what it serves (gap G15)
//! and calls [`TensorCache::remove`] for an entry whose content does not match its name.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use proto_core::tensor_cache::{cache_file_name, CacheWriter, TensorCache};

/// Bytes read from an entry per call of the sink.
const READ_CHUNK: usize = 4 << 20;
/// Prefix of temporary files; a leading dot keeps them apart from the 16-hex-digit entries.
const TEMP_PREFIX: &str = ".tmp-";

/// A tensor cache stored as files in one directory (shared by every connection).
#[derive(Debug)]
pub struct FsTensorCache {
    dir: PathBuf,
    next_temp: AtomicU64,
}

impl FsTensorCache {
    /// Opens the cache in `dir`, creating the directory (and its parents) if missing.
    ///
    /// Temporary files left by an earlier process that stopped mid-write are removed.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<FsTensorCache> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(FsTensorCache {
            dir,
            next_temp: AtomicU64::new(0),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the entry for `hash` (whether it exists or not).
    pub fn entry_path(&self, hash: u64) -> PathBuf {
        self.dir.join(cache_file_name(hash))
    }

    fn temp_path(&self) -> PathBuf {
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join(format!("{TEMP_PREFIX}{}-{n}", std::process::id()))
    }
}

fn cache_error(what: &str, path: &Path, error: io::Error) -> proto_core::Error {
    proto_core::Error::Backend(format!("tensor cache: {what} {}: {error}", path.display()))
}

impl TensorCache for FsTensorCache {
    fn len(&self, hash: u64) -> Option<u64> {
        fs::metadata(self.entry_path(hash))
            .ok()
            .filter(fs::Metadata::is_file)
            .map(|meta| meta.len())
    }

    fn read(
        &self,
        hash: u64,
        sink: &mut dyn FnMut(&[u8]) -> proto_core::Result<()>,
    ) -> proto_core::Result<()> {
        let path = self.entry_path(hash);
        let mut file = File::open(&path).map_err(|e| cache_error("opening", &path, e))?;
        let mut chunk = vec![0u8; READ_CHUNK];
        loop {
            let n = match file.read(&mut chunk) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(cache_error("reading", &path, e)),
            };
            sink(chunk.get(..n).unwrap_or_default())?;
        }
    }

    fn begin_store(&self) -> proto_core::Result<Box<dyn CacheWriter>> {
        let path = self.temp_path();
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| cache_error("creating", &path, e))?;
        Ok(Box::new(FsCacheWriter {
            file: Some(io::BufWriter::with_capacity(1 << 20, file)),
            temp: path,
            dir: self.dir.clone(),
        }))
    }

    fn remove(&self, hash: u64) {
        let path = self.entry_path(hash);
        match fs::remove_file(&path) {
            Ok(()) => {
                tracing::warn!(path = %path.display(), "removed a corrupt tensor cache entry")
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a tensor cache entry")
            }
        }
    }
}

/// An entry being written: a temporary file renamed into place by `commit`, deleted if
/// dropped before.
struct FsCacheWriter {
    file: Option<io::BufWriter<File>>,
    temp: PathBuf,
    dir: PathBuf,
}

impl CacheWriter for FsCacheWriter {
    fn append(&mut self, data: &[u8]) -> proto_core::Result<()> {
        let file = self.file.as_mut().ok_or(proto_core::Error::InvalidState(
            "cache entry already committed",
        ))?;
        file.write_all(data)
            .map_err(|e| cache_error("writing", &self.temp, e))
    }

    fn commit(mut self: Box<Self>, hash: u64) -> proto_core::Result<()> {
        let file = self.file.take().ok_or(proto_core::Error::InvalidState(
            "cache entry already committed",
        ))?;
        file.into_inner()
            .map_err(|e| cache_error("writing", &self.temp, e.into_error()))?;
        let target = self.dir.join(cache_file_name(hash));
        fs::rename(&self.temp, &target).map_err(|e| cache_error("publishing", &target, e))?;
        tracing::info!(path = %target.display(), "saved to the tensor cache");
        Ok(())
    }
}

impl Drop for FsCacheWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto_core::tensor_cache::fnv1a64;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn store_then_read_back_under_the_reference_name() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FsTensorCache::open(dir.path().join("rpc")).unwrap();
        let data = b"foobar";
        let hash = fnv1a64(data);
        assert_eq!(cache.len(hash), None);
        let mut writer = cache.begin_store().unwrap();
        writer.append(b"foo").unwrap();
        writer.append(b"bar").unwrap();
        writer.commit(hash).unwrap();
        assert_eq!(entries(cache.dir()), ["85944171f73967e8"]);
        assert_eq!(cache.len(hash), Some(6));
        let mut read = Vec::new();
        cache
            .read(hash, &mut |piece| {
                read.extend_from_slice(piece);
                Ok(())
            })
            .unwrap();
        assert_eq!(read, data);
        cache.remove(hash);
        assert_eq!(cache.len(hash), None);
        assert!(cache.read(hash, &mut |_| Ok(())).is_err());
    }

    #[test]
    fn an_abandoned_write_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FsTensorCache::open(dir.path()).unwrap();
        let mut writer = cache.begin_store().unwrap();
        writer.append(&[1; 100]).unwrap();
        assert_eq!(
            entries(dir.path()).len(),
            1,
            "the temporary file exists while writing"
        );
        drop(writer);
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn open_sweeps_stale_temporaries_and_keeps_entries() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".tmp-1-0"), b"partial").unwrap();
        fs::write(dir.path().join("00000000000000ab"), b"entry").unwrap();
        let cache = FsTensorCache::open(dir.path()).unwrap();
        assert_eq!(entries(dir.path()), ["00000000000000ab"]);
        assert_eq!(cache.len(0xab), Some(5));
    }
}
