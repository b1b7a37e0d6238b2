//! A 1 GiB buffer costs no resident memory until it is written.
//!
//! Its own test binary (own process), so no other test's allocations move the RSS figures.

#![cfg(target_os = "linux")]

use backend_cpu::{CpuBackend, CpuConfig};
use proto_core::backend::{Backend, TensorLocation};

/// Resident bytes of this process: `/proc/self/statm` field 2 (pages) times the page size.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * page_size()
}

/// The kernel page size, from the first `KernelPageSize:` line of `/proc/self/smaps` (4 KiB
/// if absent): statm counts pages, and pages are 16 or 64 KiB on some arm64 kernels.
fn page_size() -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    smaps
        .lines()
        .find_map(|line| {
            let kb = line
                .strip_prefix("KernelPageSize:")?
                .trim()
                .strip_suffix("kB")?;
            kb.trim().parse::<u64>().ok()
        })
        .map_or(4096, |kb| kb * 1024)
}

#[test]
fn one_gib_buffer_is_lazily_committed() {
    const GIB: u64 = 1 << 30;
    // Far below the 1 GiB that an eager allocation would commit, far above test noise.
    const ALLOWED_GROWTH: u64 = 64 << 20;

    let backend = CpuBackend::new(CpuConfig {
        threads: 1,
        ..CpuConfig::default()
    });
    let before = resident_bytes();
    let buffer = backend
        .alloc_buffer(0, GIB)
        .expect("1 GiB of address space")
        .id;
    // Touch both ends and clear to zero (which llama.cpp does to whole KV-cache buffers).
    backend
        .write(TensorLocation { buffer, offset: 0 }, b"first")
        .unwrap();
    backend
        .write(
            TensorLocation {
                buffer,
                offset: GIB - 4,
            },
            b"last",
        )
        .unwrap();
    let mut tail = [0u8; 4];
    backend
        .read(
            TensorLocation {
                buffer,
                offset: GIB - 4,
            },
            &mut tail,
        )
        .unwrap();
    assert_eq!(&tail, b"last");
    backend.clear_buffer(buffer, 0).unwrap();
    backend
        .read(
            TensorLocation {
                buffer,
                offset: GIB - 4,
            },
            &mut tail,
        )
        .unwrap();
    assert_eq!(tail, [0; 4]);
    let after = resident_bytes();
    assert!(
        after.saturating_sub(before) < ALLOWED_GROWTH,
        "RSS grew by {} MiB for an untouched 1 GiB buffer",
        after.saturating_sub(before) >> 20
    );
    assert_eq!(backend.used_bytes(), GIB);
    backend.free_buffer(buffer);
    assert_eq!((backend.used_bytes(), backend.live_buffers()), (0, 0));
}
