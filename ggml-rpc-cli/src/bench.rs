//! `ggml-rpc bench`: SET_TENSOR / GET_TENSOR throughput and small-command round trips.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use bytes::{Bytes, BytesMut};
use ggml_rpc_client::Client;
use indicatif::{ProgressBar, ProgressStyle};
use proto_core::wire::RpcTensor;

use crate::units::format_bytes;

/// ggml's `i8` type: one byte per element, so any byte count is a valid tensor.
const TYPE_I8: u32 = 24;
/// Row length of tensors too large for a 32-bit `ne[0]`.
const WIDE_ROW: u64 = 1 << 20;
/// Runs moving at least this much data (or this many round trips) show a progress bar.
const LONG_RUN_BYTES: u64 = 1 << 30;
const LONG_RUN_ROUNDS: u64 = 20_000;

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct BenchPlan {
    /// Device index.
    pub device: u32,
    /// Bytes per SET/GET.
    pub size: u64,
    /// SET and GET repetitions.
    pub iterations: u32,
    /// GET_ALIGNMENT round trips.
    pub small_rounds: u32,
    /// Allow a progress bar.
    pub progress: bool,
}

/// Timings of one test.
#[derive(Debug, Clone)]
pub struct Timings {
    /// Test name (the command measured).
    pub name: &'static str,
    /// Bytes per operation (0 for small commands).
    pub bytes: u64,
    /// One duration per operation (or one for the whole small-command loop).
    pub samples: Vec<Duration>,
    /// Operations covered by the samples.
    pub operations: u64,
}

/// Runs the plan; frees what it allocated on success.
pub async fn run(client: &mut Client, plan: BenchPlan) -> anyhow::Result<Vec<Timings>> {
    let count = client.device_count().await?;
    ensure!(
        plan.device < count,
        "device {} does not exist (the server has {count})",
        plan.device
    );
    ensure!(plan.iterations > 0, "--iterations must be at least 1");
    ensure!(plan.size > 0, "--size must be at least 1 byte");
    let max = client.max_size(plan.device).await?;
    ensure!(
        plan.size <= max,
        "--size {} exceeds the device's largest buffer ({})",
        format_bytes(plan.size),
        format_bytes(max)
    );
    let len = usize::try_from(plan.size).context("--size does not fit in memory")?;
    let mut tensor = bench_tensor(plan.size)?;

    let buffer = client
        .alloc_buffer(plan.device, plan.size)
        .await?
        .with_context(|| format!("the server could not allocate {}", format_bytes(plan.size)))?;
    let base = client.buffer_base(buffer.handle).await?;
    tensor.buffer = buffer.handle;
    tensor.data = base;
    tensor.set_name("ggml-rpc-bench");
    let data = pattern(len);

    let moved = plan
        .size
        .saturating_mul(u64::from(plan.iterations))
        .saturating_mul(2);
    let long = moved >= LONG_RUN_BYTES || u64::from(plan.small_rounds) >= LONG_RUN_ROUNDS;
    let bar = if plan.progress && long {
        let bar = ProgressBar::new(u64::from(plan.iterations) * 2 + u64::from(plan.small_rounds));
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg:14} [{bar:40}] {pos}/{len} ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };

    let mut results = Vec::new();
    bar.set_message("SET_TENSOR");
    let mut samples = Vec::new();
    for _ in 0..plan.iterations {
        let start = Instant::now();
        client.set_tensor(&tensor, 0, data.clone()).await?;
        // SET_TENSOR has no response: a round trip makes the time include the server's work.
        client.alignment(plan.device).await?;
        samples.push(start.elapsed());
        bar.inc(1);
    }
    results.push(Timings {
        name: "SET_TENSOR",
        bytes: plan.size,
        samples,
        operations: u64::from(plan.iterations),
    });

    bar.set_message("GET_TENSOR");
    let mut samples = Vec::new();
    // One receive buffer, its pages touched before timing: a fresh buffer per GET would
    // measure this client's page faults rather than the server and the network.
    let mut received = BytesMut::zeroed(data.len());
    for iteration in 0..plan.iterations {
        let start = Instant::now();
        let got = client
            .get_tensor_into(&tensor, 0, plan.size, received)
            .await?;
        samples.push(start.elapsed());
        if iteration == 0 && got != data {
            bail!("GET_TENSOR returned other bytes than SET_TENSOR wrote");
        }
        received = match got.try_into_mut() {
            Ok(received) => received,
            Err(_) => BytesMut::zeroed(data.len()),
        };
        bar.inc(1);
    }
    results.push(Timings {
        name: "GET_TENSOR",
        bytes: plan.size,
        samples,
        operations: u64::from(plan.iterations),
    });

    if plan.small_rounds > 0 {
        bar.set_message("GET_ALIGNMENT");
        let start = Instant::now();
        for _ in 0..plan.small_rounds {
            client.alignment(plan.device).await?;
            bar.inc(1);
        }
        results.push(Timings {
            name: "GET_ALIGNMENT",
            bytes: 0,
            samples: vec![start.elapsed()],
            operations: u64::from(plan.small_rounds),
        });
    }
    bar.finish_and_clear();
    client.free_buffer(buffer.handle).await?;
    // Make sure the FREE_BUFFER was processed before the connection goes away.
    client.device_count().await?;
    Ok(results)
}

/// A contiguous i8 tensor covering exactly `size` bytes: one row below 4 GiB, rows of 1 MiB
/// above (the wire's `ne` and `nb` are 32 bits wide, and the strides of the unused outer
/// dimensions, which would not fit, do not count for a dimension of one element).
fn bench_tensor(size: u64) -> anyhow::Result<RpcTensor> {
    let (ne, nb) = if let Ok(ne0) = u32::try_from(size) {
        ([ne0, 1, 1, 1], [1, ne0, ne0, ne0])
    } else {
        ensure!(
            size.is_multiple_of(WIDE_ROW),
            "sizes of 4 GiB and more must be a multiple of 1 MiB"
        );
        let rows = u32::try_from(size / WIDE_ROW).context("--size too large")?;
        let row = WIDE_ROW as u32;
        ([row, rows, 1, 1], [1, row, 0, 0])
    };
    Ok(RpcTensor {
        id: 1,
        type_id: TYPE_I8,
        ne,
        nb,
        ..RpcTensor::default()
    })
}

/// Data that is not all zeros (so a server cannot cheat on it).
fn pattern(len: usize) -> Bytes {
    let mut data = Vec::with_capacity(len);
    let mut x: u32 = 0x9e37_79b9;
    data.resize_with(len, || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x as u8
    });
    data.into()
}

/// A rate in GB/s with two decimals, and with at least three significant digits below 1 GB/s
/// (a link shaped to 200 Mbit/s shows as 0.0250 GB/s, not 0.03).
fn format_gbps(gbps: f64) -> String {
    let decimals = if gbps > 0.0 && gbps < 1.0 {
        (2 - gbps.log10().floor() as i32).clamp(2, 9) as usize
    } else {
        2
    };
    format!("{gbps:.decimals$} GB/s")
}

/// The results as a compact table.
pub fn render(endpoint: &str, client: &Client, plan: &BenchPlan, results: &[Timings]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ggml-rpc bench {endpoint}: server {}, device {}",
        client.server_version(),
        plan.device
    );
    let _ = writeln!(
        out,
        "{:<14} {:>10} {:>7} {:>13} {:>13}",
        "test", "size", "count", "mean", "best"
    );
    for timing in results {
        let total: Duration = timing.samples.iter().sum();
        let (mean, best) = if timing.bytes > 0 {
            let best = timing.samples.iter().min().copied().unwrap_or_default();
            let rate =
                |bytes: u64, time: Duration| bytes as f64 / time.as_secs_f64().max(1e-9) / 1e9;
            (
                format_gbps(rate(timing.bytes * timing.operations, total)),
                format_gbps(rate(timing.bytes, best)),
            )
        } else {
            let per = total.as_secs_f64() / timing.operations.max(1) as f64;
            (
                format!("{:.0} rt/s", 1.0 / per.max(1e-12)),
                format!("{:.1} µs/rt", per * 1e6),
            )
        };
        let size = if timing.bytes > 0 {
            format_bytes(timing.bytes)
        } else {
            "-".to_owned()
        };
        let _ = writeln!(
            out,
            "{:<14} {:>10} {:>7} {:>13} {:>13}",
            timing.name, size, timing.operations, mean, best
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_below_one_gbps_keep_three_digits() {
        assert_eq!(format_gbps(5.4321), "5.43 GB/s");
        assert_eq!(format_gbps(1.0), "1.00 GB/s");
        assert_eq!(format_gbps(0.39), "0.390 GB/s");
        assert_eq!(format_gbps(0.025_04), "0.0250 GB/s");
        assert_eq!(format_gbps(0.001_234), "0.00123 GB/s");
        assert_eq!(format_gbps(0.0), "0.00 GB/s");
    }

    #[test]
    fn tensors_cover_the_size_exactly() {
        for size in [1, 4097, 256 << 20, u64::from(u32::MAX), 4 << 30, 5 << 30] {
            let tensor = bench_tensor(size).unwrap();
            tensor
                .validate_shape(proto_core::ggml::GgmlTable::V8_0_0)
                .unwrap();
            assert_eq!(tensor.byte_size().unwrap(), size, "{size}");
        }
        assert_eq!(
            bench_tensor(256 << 20).unwrap(),
            RpcTensor::contiguous(1, TYPE_I8, [256 << 20, 1, 1, 1]).unwrap()
        );
        assert!(bench_tensor((4 << 30) + 1).is_err());
    }
}
