#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time, seeded from the test vectors (fuzz/seeds) and
# the minimised corpus of the long runs (fuzz/corpus-min).
# Usage: scripts/fuzz.sh [seconds-per-target]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
# cargo-fuzz passes nightly-only flags (sanitizers); stable accepts them with this set.
export RUSTC_BOOTSTRAP=1
cd fuzz
# the committed seeds still reach what their names promise
cargo test --quiet
targets=$(cargo fuzz list)
cargo fuzz build -O $targets >/dev/null 2>&1 || cargo fuzz build -O
for target in $targets; do
    corpus="corpus/$target"
    mkdir -p "$corpus"
    for dir in seeds corpus-min; do
        if [ -d "$dir/$target" ]; then cp -n "$dir/$target"/* "$corpus"/ 2>/dev/null || true; fi
    done
    echo "fuzzing $target for ${seconds}s"
    cargo fuzz run -O "$target" "$corpus" -- -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 2>&1 | tail -n 15
done
echo "fuzz: every target ran ${seconds}s without a crash"
