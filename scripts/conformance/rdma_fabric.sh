#!/usr/bin/env bash
# The real llama.cpp over RDMA on the verbs fabric: b12032+1's llama-completion --rpc against
# b12032+1's ggml-rpc-server, both with LD_LIBRARY_PATH at the fabric's libibverbs.so.1
# (verbs-fabric/, built by scripts/fabric/build.sh), on tiny llama models. Checks, per model:
#   * the server's log shows every connection upgraded ("RDMA activated: qpn=A->B") and never
#     "RDMA activate failed" / "continuing with TCP";
#   * the greedy text equals the same pair's run with GGML_RPC_NO_RDMA=1 (TCP), whose server log
#     must show no upgrade.
# With --testbed, the same checks then run again across two hosts of the multi-host test bed
# (network namespaces; needs root): server in h1, client in h2, one fabric directory.
# usage: scripts/conformance/rdma_fabric.sh [--types f32,q8_0] [-n N] [--logdir DIR] [--testbed]
# Exit status: 0 all pass, 1 a mismatch or missing upgrade, 2 harness error.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

types="f32,q8_0" n=16 logdir="$CONF_OUT/rdma-fabric" testbed=0 in_testbed=0
while [ $# -gt 0 ]; do
    case "$1" in
        --testbed) testbed=1; shift ;;
        --in-testbed) in_testbed=1; shift ;;  # internal: run by testbed.sh run
        --types) types=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --logdir) logdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

# Tiny models, made as e2e.sh makes them (b11434's gguf-py).
conf_select_peer b11434
conf_check_peer
mdir="$CONF_OUT/models"
"$(conf_python)" "$CONF_DIR/make-models.py" --out "$mdir" --preset tiny --types "$types" >&2 \
    || conf_die "make-models.py failed"

conf_select_peer b12032
conf_check_peer
[ -x "$PEER_BIN/llama-completion" ] || conf_die "$PEER_BIN/llama-completion missing"
readelf -d "$PEER_LIB/libggml-rpc.so" | grep -q 'libibverbs.so.1' \
    || conf_die "$PEER_LIB/libggml-rpc.so is not linked with libibverbs (built without GGML_RPC_RDMA)"

fabric=$("$REPO_ROOT/scripts/fabric/build.sh") || conf_die "building the verbs fabric failed"
[ -f "$fabric/libibverbs.so.1" ] || conf_die "no libibverbs.so.1 in $fabric"
conf_log "verbs fabric: $fabric/libibverbs.so.1"

# Where the pair runs: loopback here, or h1 (server) and h2 (client) of a test bed.
host=127.0.0.1 srv_pre=() cli_pre=()
if [ "$in_testbed" = 1 ]; then
    [ -n "${TESTBED_NS_2:-}" ] || conf_die "--in-testbed outside testbed.sh run"
    host=$TESTBED_ADDR_1 srv_pre=(ip netns exec "$TESTBED_NS_1") cli_pre=(ip netns exec "$TESTBED_NS_2")
    logdir="$logdir/testbed"
fi
wait_server() {
    local port=$1 pid=$2
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || return 1
        "${cli_pre[@]}" python3 -c "import socket; socket.create_connection(('$host',$port),timeout=1).close()" \
            2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

mkdir -p "$logdir"
sockdir=$(mktemp -d /tmp/vfab-e2e.XXXXXX)
spid=""
cleanup() { conf_kill "$spid"; rm -rf "$sockdir"; }
trap cleanup EXIT

# run_pair MODE MODEL OUT: server + client in MODE (rdma|tcp); the text goes to OUT.txt, the logs
# to OUT.server.log / OUT.client.log. Returns the client's exit status.
run_pair() {
    local mode=$1 model=$2 out=$3 port rc=0
    local -a env=(env "LD_LIBRARY_PATH=$fabric" "GGML_VERBS_FABRIC_DIR=$sockdir" GGML_NO_BACKTRACE=1)
    [ "$mode" = tcp ] && env+=(GGML_RPC_NO_RDMA=1)
    port=$(conf_free_port)
    "${srv_pre[@]}" "${env[@]}" "$PEER_BIN/ggml-rpc-server" -H "$host" -p "$port" >"$out.server.log" 2>&1 </dev/null &
    spid=$!
    wait_server "$port" "$spid" || { conf_log "server did not start, see $out.server.log"; return 2; }
    "${cli_pre[@]}" "${env[@]}" timeout 300 "$PEER_BIN/llama-completion" -m "$model" -p "Once upon a time" -n "$n" \
        --temp 0 --top-k 1 --seed 1 -no-cnv --rpc "$host:$port" -ngl 99 \
        >"$out.txt" 2>"$out.client.log" </dev/null || rc=$?
    conf_kill "$spid"
    spid=""
    return "$rc"
}

fail=0
IFS=, read -ra tl <<<"$types"
for t in "${tl[@]}"; do
    model="$mdir/tiny-llama-$t.gguf"
    base="$logdir/$t"
    for mode in tcp rdma; do
        if ! run_pair "$mode" "$model" "$base.$mode"; then
            conf_log "FAIL $t: llama-completion ($mode) failed, see $base.$mode.client.log"
            fail=1
            continue 2
        fi
    done
    ups=$(grep -c 'RDMA activated: qpn=' "$base.rdma.server.log" || true)
    if [ "$ups" -lt 1 ]; then
        conf_log "FAIL $t: the server never upgraded to RDMA (see $base.rdma.server.log)"; fail=1
    fi
    if grep -E 'RDMA activate failed|continuing with TCP|RDMA probe failed' "$base.rdma.server.log" "$base.rdma.client.log"; then
        conf_log "FAIL $t: a connection stayed on TCP"; fail=1
    fi
    if grep -q 'RDMA activated' "$base.tcp.server.log"; then
        conf_log "FAIL $t: the GGML_RPC_NO_RDMA=1 run upgraded anyway"; fail=1
    fi
    if ! cmp -s "$base.tcp.txt" "$base.rdma.txt" || [ ! -s "$base.rdma.txt" ]; then
        conf_log "FAIL $t: text differs between TCP and RDMA:"
        diff "$base.tcp.txt" "$base.rdma.txt" >&2 || true
        fail=1
    else
        conf_log "ok $t: $ups connection(s) upgraded to RDMA, text identical to TCP: $(head -c 120 "$base.rdma.txt" | tr '\n' ' ')"
    fi
done
left=$(find "$sockdir" -type s | wc -l)
conf_log "fabric sockets left by killed servers: $left"
if [ "$testbed" = 1 ] && [ "$in_testbed" = 0 ]; then
    conf_log "again across two test-bed hosts (network namespaces)"
    "$REPO_ROOT/scripts/testbed/testbed.sh" run --hosts 2 --rate none -- \
        bash "$0" --in-testbed --types "$types" -n "$n" --logdir "$logdir" || fail=1
fi
exit "$fail"
