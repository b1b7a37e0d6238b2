#!/usr/bin/env bash
# `ggml-rpc conformance` (README.md, "Conformance kit") in CI:
#  * against our server in every shell (tokio, uring, smol) and protocol (7, 8.0.0, 8.0.1) with
#    --strict: every case must pass (known gaps of the reference count as failures for us);
#  * against the real llama.cpp servers b11434 (7.0.0), b11739 (8.0.0) and b12032+1 (8.0.1):
#    each run must complete (bounded; the kit restarts a server that died with --spawn) and
#    print its table, and the cases the server passes must be exactly those README.md's
#    table for it lists as passed (their known weaknesses do not fail CI; a change does).
# Tables and logs go to $CONF_OUT/kit. KIT_TIMEOUT: seconds per wait (default 3).
set -euo pipefail
# shellcheck source=scripts/conformance/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
TIMEOUT=${KIT_TIMEOUT:-3}
out="$CONF_OUT/kit"
mkdir -p "$out"

cargo build -p ggml-rpc-cli
kit="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/ggml-rpc"
conf_build_our_server
failed=0

# run_kit NAME ARGS...: one run, bounded; its table in $out/NAME.txt. Exit code 0 or 1 is a
# completed run (conformant or not); 2 is no run, 124 the kit itself past its bound.
run_kit() {
    local name=$1 rc=0
    shift
    timeout 900 "$kit" conformance "$@" --timeout "$TIMEOUT" >"$out/$name.txt" 2>"$out/$name.err" || rc=$?
    tail -n 1 "$out/$name.txt" >&2 || true
    return "$rc"
}

for shell in tokio uring smol; do
    for proto in 7 8.0.0 8.0.1; do
        port=$(conf_free_port)
        rc=0
        run_kit "ours-$shell-$proto" "127.0.0.1:$port" --strict \
            --spawn "exec $OUR_SERVER --shell $shell --protocol $proto -p $port" || rc=$?
        if [ "$rc" = 0 ]; then
            conf_log "our server ($shell, $proto): every case passed"
        else
            conf_log "FAIL: our server ($shell, $proto), exit $rc:"
            grep -v ' passed \| n/a ' "$out/ours-$shell-$proto.txt" >&2 || true
            cat "$out/ours-$shell-$proto.err" >&2
            failed=1
        fi
    done
done

check_peer() {
    local tag=$1 protocol=$2 command=$3 port=$4 rc=0
    run_kit "$tag" "127.0.0.1:$port" --protocol "$protocol" --spawn "$command" || rc=$?
    if [ "$rc" -gt 1 ]; then
        conf_log "FAIL: the run against $tag did not complete (exit $rc)"
        cat "$out/$tag.err" >&2
        failed=1
        return
    fi
    if python3 "$CONF_DIR/kit_check.py" README.md "$tag" "$out/$tag.txt"; then
        conf_log "$tag: the cases it passes are README.md's"
    else
        failed=1
    fi
}

port=$(conf_free_port)
check_peer b11434 auto "exec $PEER_ROOT/b11434/bin/ggml-rpc-server -p $port -t 1" "$port"
port=$(conf_free_port)
check_peer b11739 auto "exec $PEER_ROOT/b11739/rpc-server --host 127.0.0.1 --port $port --threads 1" "$port"
port=$(conf_free_port)
check_peer b12032 8.0.1 "exec $PEER_ROOT/b12032/bin/ggml-rpc-server -p $port -t 1" "$port"

exit "$failed"
