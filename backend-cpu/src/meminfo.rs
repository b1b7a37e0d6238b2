//! The host's memory figures for GET_DEVICE_MEMORY and the CPU's name for the banner.
//!
//! Linux: `MemTotal` and `MemAvailable` from `/proc/meminfo`. `MemAvailable` (the kernel's
//! estimate of what new allocations can get without swapping, page cache included) is a better
//! "free" figure than `MemFree`, which leaves out reclaimable cache; kernels before 3.14 lack
//! it, and then `MemFree` is used. Elsewhere, or when the file cannot be read or parsed, the
//! figures are unknown and [`system_memory`] returns `None` (the backend then reports
//! [`crate::UNKNOWN_MEMORY`]).
//!
//! ggml's own CPU device reports `free = total` on non-Windows systems ("free system memory is
//! ill-defined"); reporting what is actually available is the more useful answer for a
//! client that splits a model across servers by free memory, and is what the brief asks for.

use proto_core::backend::DeviceMemory;

/// Total and available memory of the host, `None` where they cannot be determined.
pub(crate) fn system_memory() -> Option<DeviceMemory> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

/// Parses `/proc/meminfo` text; values are in kB (KiB).
fn parse_meminfo(text: &str) -> Option<DeviceMemory> {
    let field = |name: &str| -> Option<u64> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let mut parts = rest.split_whitespace();
            let value: u64 = parts.next()?.parse().ok()?;
            let scale = match parts.next() {
                Some("kB") => 1024,
                None => 1,
                Some(_) => return None,
            };
            value.checked_mul(scale)
        })
    };
    let total = field("MemTotal")?;
    let available = field("MemAvailable").or_else(|| field("MemFree"))?;
    Some(DeviceMemory {
        free: available.min(total),
        total,
    })
}

/// The CPU model name (`model name` in `/proc/cpuinfo`), or `"CPU"` where it is not known,
/// which is what ggml's CPU device uses as its description.
pub(crate) fn cpu_description() -> String {
    let model = if cfg!(target_os = "linux") {
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines().find_map(|line| {
                    let (key, value) = line.split_once(':')?;
                    (key.trim() == "model name").then(|| value.trim().to_owned())
                })
            })
    } else {
        None
    };
    model
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "CPU".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "MemTotal:       131189996 kB\n\
                          MemFree:        24211752 kB\n\
                          MemAvailable:   69487008 kB\n\
                          Buffers:          123456 kB\n\
                          HugePages_Total:       0\n";

    #[test]
    fn parses_total_and_available_in_bytes() {
        let memory = parse_meminfo(SAMPLE).unwrap();
        assert_eq!(memory.total, 131_189_996 * 1024);
        assert_eq!(memory.free, 69_487_008 * 1024);
    }

    #[test]
    fn falls_back_to_mem_free_and_rejects_garbage() {
        let old_kernel = "MemTotal: 2048 kB\nMemFree: 1024 kB\n";
        assert_eq!(
            parse_meminfo(old_kernel),
            Some(DeviceMemory {
                free: 1024 * 1024,
                total: 2048 * 1024
            })
        );
        assert_eq!(parse_meminfo(""), None);
        assert_eq!(
            parse_meminfo("MemTotal: lots kB\nMemAvailable: 1 kB\n"),
            None
        );
        assert_eq!(parse_meminfo("MemTotal: 1 MB\nMemAvailable: 1 kB\n"), None);
        // A field whose name merely starts like another is not mistaken for it.
        assert_eq!(parse_meminfo("MemTotalX: 5 kB\nMemAvailable: 1 kB\n"), None);
        // Overflowing values are rejected, not wrapped.
        let huge = format!("MemTotal: {} kB\nMemAvailable: 1 kB\n", u64::MAX);
        assert_eq!(parse_meminfo(&huge), None);
    }

    #[test]
    fn free_never_exceeds_total() {
        let odd = "MemTotal: 10 kB\nMemAvailable: 20 kB\n";
        assert_eq!(parse_meminfo(odd).unwrap().free, 10 * 1024);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_host_reports_real_figures() {
        let memory = system_memory().expect("/proc/meminfo is readable on Linux");
        assert!(memory.total > 0);
        assert!(memory.free <= memory.total);
        assert!(!cpu_description().is_empty());
    }
}
