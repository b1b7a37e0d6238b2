#!/usr/bin/env bash
# The long fuzz runs (by hand, not in CI): every cargo-fuzz target for a number of executions,
# one after another, niced, each from a corpus kept between runs, then that corpus minimised
# (libFuzzer's -merge=1) into fuzz/corpus-min/<target>, which is committed, replayed by
# `cargo test` in fuzz/ and seeds the CI runs (scripts/fuzz.sh).
#
# usage: scripts/fuzz-long.sh [--runs N] [--corpus DIR] [TARGET ...]
#   --runs N      executions per target (default 10000000)
#   --corpus DIR  where the growing corpora live (default fuzz/corpus, ignored by git)
#   TARGET        the targets to run (default: every one, `cargo fuzz list`)
# Prints one line per target: executions, new units, peak RSS, seconds, minimised files.
# A crash stops that target's run (libFuzzer writes the input to fuzz/artifacts/<target>/)
# and makes the script exit non-zero after the other targets.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
runs=10000000 corpus_root=corpus targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=$2; shift 2 ;;
        --corpus) corpus_root=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) targets+=("$1"); shift ;;
    esac
done
export RUSTC_BOOTSTRAP=1
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
nice -n 19 cargo fuzz build -O "${targets[@]}" || exit 1
bin=target/x86_64-unknown-linux-gnu/release
failed=0
for target in "${targets[@]}"; do
    corpus="$corpus_root/$target"
    mkdir -p "$corpus" "corpus-min/$target" "artifacts/$target"
    for dir in seeds corpus-min; do
        if [ -d "$dir/$target" ]; then cp -n "$dir/$target"/* "$corpus"/ 2>/dev/null || true; fi
    done
    log="$corpus_root/$target.log"
    start=$(date +%s)
    nice -n 19 "$bin/$target" "$corpus" -runs="$runs" -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="artifacts/$target/" >"$log" 2>&1
    rc=$?
    seconds=$(($(date +%s) - start))
    # The minimised corpus: the smallest set of inputs that keeps every feature reached.
    rm -rf "corpus-min/$target.new" && mkdir "corpus-min/$target.new"
    "$bin/$target" -merge=1 -rss_limit_mb=4096 "corpus-min/$target.new" "$corpus" >>"$log" 2>&1 &&
        rm -rf "corpus-min/$target" && mv "corpus-min/$target.new" "corpus-min/$target"
    final_stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -n 1; }
    echo "$target: rc=$rc executions=$(final_stat number_of_executed_units) new_units=$(final_stat new_units_added)" \
        "peak_rss_mb=$(final_stat peak_rss_mb) seconds=$seconds minimised=$(ls "corpus-min/$target" | wc -l)"
    [ "$rc" = 0 ] || failed=1
done
exit $failed
