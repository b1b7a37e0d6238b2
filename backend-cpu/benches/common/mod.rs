//! What every bench of this crate shares.

use std::time::Duration;

use criterion::Criterion;

/// Runs `benches` (the bench binary's `main`, as `criterion_main!` would) with `samples`
/// samples after `warm_up_ms` of warm-up, measuring for `measure_ms`: short enough that a whole
/// bench runs in a few minutes on a shared machine. Command-line options (`--quick`, filters)
/// override these.
pub fn run(samples: usize, warm_up_ms: u64, measure_ms: u64, benches: &[fn(&mut Criterion)]) {
    let mut criterion = Criterion::default()
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(warm_up_ms))
        .measurement_time(Duration::from_millis(measure_ms))
        .configure_from_args();
    for bench in benches {
        bench(&mut criterion);
    }
    criterion.final_summary();
}
