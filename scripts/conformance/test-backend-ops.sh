#!/usr/bin/env bash
# Run llama.cpp b11434's test-backend-ops against an RPC server, op by op, and print a
# per-op table (passed / failed / not supported / crashed / hung / not run).
#
# usage: scripts/conformance/test-backend-ops.sh [options]
#   --server-cmd CMD   server to start ({port} is replaced, else "-p PORT" is appended)
#                      default: target/release/ggml-rpc-server --protocol 7 -p {port}
#                      (built with cargo if missing)
#   --reference        use llama.cpp's own ggml-rpc-server (b11434) instead
#   --endpoint H:P     use a server that is already running (no restarts after crashes)
#   --ops LIST         comma list of test-backend-ops op names and groups: default,
#                      UNARY (=SILU,GELU,TANH), GLU (=SWIGLU,GEGLU), fused (whole-graph
#                      cases such as RMS_NORM_MUL_ADD), extra (every further op the CPU
#                      backend implements: state-space, linear attention, generic ops, ...).
#                      Default: default
#   --params REGEX     only cases whose parameters match (test-backend-ops -p)
#   --scope all|listed listed: only cases whose type parameters are all among the types the
#                      compute issue lists (F32, F16, BF16, Q4_0..Q8_0, Q2_K..Q6_K, I8..I64);
#                      the rest are counted as out of scope, not run. Default: all
#   --sample N         at most N evenly spread in-scope cases per op (quick runs)
#   --sample-op OP=N   at most N evenly spread in-scope cases of OP (instead of --sample;
#                      repeatable)
#   --case-timeout S   a case with no result for S seconds is a hang (default 120)
#   --max-crashes N    crashes+hangs per op before its other cases are skipped (default 200)
#   --logdir DIR       default target/conformance/tbo-<ours|reference|custom>
# Exit status: 0 all passed, 1 some case failed/crashed/hung/not run, 2 harness error.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

server_cmd="" endpoint="" mode=ours logdir="" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --server-cmd) server_cmd=$2; mode=custom; shift 2 ;;
        --reference) mode=reference; shift ;;
        --endpoint) endpoint=$2; mode=custom; shift 2 ;;
        --ops|--params|--scope|--sample|--sample-op|--case-timeout|--max-crashes) extra+=("$1" "$2"); shift 2 ;;
        --logdir) logdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

conf_check_peer
[ -x "$PEER_BIN/test-backend-ops" ] || conf_die "$PEER_BIN/test-backend-ops missing"

# --- shims -----------------------------------------------------------------------------
conf_build_tools

# --- server ----------------------------------------------------------------------------
case "$mode" in
    ours)
        conf_build_our_server
        server_cmd="$OUR_SERVER --protocol 7 -p {port}"
        title="test-backend-ops via RPC against OUR server ($OUR_SERVER_DESC)" ;;
    reference)
        server_cmd="$PEER_BIN/ggml-rpc-server -p {port}"
        title="test-backend-ops via RPC against the REFERENCE server (llama.cpp b11434)" ;;
    custom)
        title="test-backend-ops via RPC against ${server_cmd:-$endpoint}" ;;
esac
logdir=${logdir:-$CONF_OUT/tbo-$mode}
target=()
if [ -n "$endpoint" ]; then target=(--endpoint "$endpoint"); else target=(--server-cmd "$server_cmd"); fi

exec python3 -B "$CONF_DIR/tbo_run.py" --tbo "$PEER_BIN/test-backend-ops" --shim "$SHIM" \
    --list-shim "$LIST_SHIM" "${target[@]}" --logdir "$logdir" --title "$title" "${extra[@]}"
