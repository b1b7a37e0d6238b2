//! What a running process holds, read from `/proc` (Linux): the figures the soak and the comm
//! test bed compare before and after a run to find leaks.

use std::time::Duration;

/// A process's resident memory, open file descriptors, threads and CPU time at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holdings {
    /// Resident set size in bytes (`VmRSS`).
    pub rss: u64,
    /// Open file descriptors (entries of `/proc/PID/fd`).
    pub fds: usize,
    /// Threads (entries of `/proc/PID/task`).
    pub threads: usize,
}

impl Holdings {
    /// Reads them for `pid`; `None` when the process is gone or `/proc` is unreadable.
    pub fn of(pid: u32) -> Option<Holdings> {
        Some(Holdings {
            rss: rss(pid)?,
            fds: count_entries(&format!("/proc/{pid}/fd"))?,
            threads: count_entries(&format!("/proc/{pid}/task"))?,
        })
    }
}

/// Resident memory of `pid` in bytes (`/proc/PID/status` `VmRSS`).
pub fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// CPU time (user + system) `pid` used so far; zero when unreadable.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    Duration::from_millis(ticks * 10) // USER_HZ = 100 on Linux
}

/// The names (`comm`) of `pid`'s threads.
pub fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_string())
        .collect()
}

fn count_entries(dir: &str) -> Option<usize> {
    Some(std::fs::read_dir(dir).ok()?.count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_holds_memory_files_and_threads() {
        let me = std::process::id();
        let held = Holdings::of(me).expect("/proc is readable");
        // stdin, stdout, stderr and the directory being read.
        assert!(
            held.rss > 0 && held.fds >= 3 && held.threads >= 1,
            "{held:?}"
        );
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {}
        assert!(cpu_time(me) > Duration::ZERO);
        assert!(!thread_names(me).is_empty());
        assert_eq!(Holdings::of(u32::MAX), None);
        assert_eq!(cpu_time(u32::MAX), Duration::ZERO);
    }
}
