//! A STREAM-like memory read bandwidth probe: the roofline of token generation, which streams
//! every weight once per token.
//!
//! `cargo run --release -p backend-cpu --example membw -- [--threads N] [--mib M] [--reps R]`
//!
//! Fills an `M` MiB buffer (default 1024, far larger than any cache), then `R` times (default
//! 10) has `N` threads (default 1, as the servers' `-t`) each sum its share of the buffer as
//! 64-bit words, and prints the best pass as one line:
//! `membw threads=N mib=M read_gb_s=X` (decimal GB/s). Run it with the servers' CPU affinity.

use std::hint::black_box;
use std::time::Instant;

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| {
            v.parse().unwrap_or_else(|_| {
                eprintln!("membw: {name} wants a number, got {v}");
                std::process::exit(2)
            })
        })
}

/// The sum of a slice of words, with eight independent accumulators so that the loop is
/// bound by the loads rather than by one chain of additions.
fn read_all(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &w) in acc.iter_mut().zip(chunk) {
            *a = a.wrapping_add(w);
        }
    }
    tail.iter()
        .chain(&acc)
        .fold(0u64, |sum, &w| sum.wrapping_add(w))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = arg(&args, "--threads", 1).max(1);
    let mib = arg(&args, "--mib", 1024).max(1);
    let reps = arg(&args, "--reps", 10).max(1);
    let words = mib * (1 << 20) / 8;
    // Written (not only zero-mapped) so every page is backed by memory of its own.
    let data: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9))
        .collect();
    let share = words.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        let sum = std::thread::scope(|scope| {
            let handles: Vec<_> = data
                .chunks(share)
                .map(|part| scope.spawn(move || read_all(black_box(part))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        black_box(sum);
        best = best.min(start.elapsed().as_secs_f64());
    }
    let gb_s = (words * 8) as f64 / best / 1e9;
    println!("membw threads={threads} mib={mib} read_gb_s={gb_s:.2}");
}
