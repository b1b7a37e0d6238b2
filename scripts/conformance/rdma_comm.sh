#!/usr/bin/env bash
# The comm link (server to server, PROTOCOL.md §6) over RDMA on the verbs fabric (verbs-fabric/,
# a userspace libibverbs.so.1 loaded with LD_LIBRARY_PATH; scripts/fabric/build.sh): groups of our
# servers, each comm socket offering caps and switching to an RC queue pair after the caps
# exchange as the reference does, against the same groups with --transport tcp. Cases:
#   1. ranked link, world 2, GGML_RPC_NO_BACKEND_COMMUNICATOR=1: the pairwise path, every
#      all-reduce payload over RDMA (tokio shell);
#   2. ranked link, world 3, the CPU backend communicator: ranks, votes and the ring's bootstrap
#      exchange over RDMA (uring shell);
#   3. --comm-link pairwise (plain 8.0.1), world 2: the pairwise all-reduce over RDMA (smol);
#   4. llama.cpp b12032+1's ggml-rpc-server (its ranked link) as rank 1 of ours, then as rank 0:
#      the caps, the rank, the vote and the all-reduce payloads wire-exact with the reference,
#      each side switching (ours logs it, the reference logs "RDMA activated"); the reference
#      runs with GGML_RPC_NO_RDMA=1 in the TCP group.
# Each: tests/examples/comm_check (COMM_INIT on every rank, COMM_ALLREDUCE of 1000 and 65536
# F32 elements, each rank's result hashed) must print the same over RDMA as over TCP, every comm
# socket of ours must log "comm link: switched to RDMA", the TCP group none. About 25 s.
# usage: scripts/conformance/rdma_comm.sh [--bin-dir DIR] [--logdir DIR]
#   --bin-dir: where our ggml-rpc-server and examples/comm_check are (default: built with
#   --release).
# Exit status: 0 all pass, 1 a check failed, 2 harness error.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bindir="" logdir="$CONF_OUT/rdma-comm"
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bindir=$2; shift 2 ;;
        --logdir) logdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

if [ -z "$bindir" ]; then
    (cd "$REPO_ROOT" && cargo build --release -p ggml-rpc-server \
        && cargo build --release -p ggml-rpc-tests --example comm_check) || conf_die "cargo build failed"
    bindir="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
fi
server="$bindir/ggml-rpc-server" check="$bindir/examples/comm_check"
[ -x "$server" ] && [ -x "$check" ] || conf_die "no ggml-rpc-server / examples/comm_check in $bindir"
conf_select_peer b12032
conf_check_peer
fabric=$("$REPO_ROOT/scripts/fabric/build.sh") || conf_die "building the verbs fabric failed"
[ -f "$fabric/libibverbs.so.1" ] || conf_die "no libibverbs.so.1 in $fabric"

mkdir -p "$logdir"
sockdir=$(mktemp -d /tmp/vfab-comm.XXXXXX)
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do conf_kill "$pid"; done
    rm -rf "$sockdir"
}
trap cleanup EXIT
fail=0
bad() { conf_log "FAIL $*"; fail=1; }

# group NAME TRANSPORT KINDS [ENV...] -- [SERVER ARGS...]: a group of servers, one per entry
# of the comma-separated KINDS in rank order (a shell of ours, or "ref": b12032+1's server),
# comm_check against it; its output in $logdir/NAME.TRANSPORT.out.
group() {
    local name=$1 transport=$2 kinds=$3
    shift 3
    local envs=() args=() addrs=() i=0 port kind
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    args=("$@")
    pids=()
    for kind in ${kinds//,/ }; do
        port=$(conf_free_port)
        if [ "$kind" = ref ]; then
            local ref_env=()
            [ "$transport" = tcp ] && ref_env=(GGML_RPC_NO_RDMA=1)
            env "LD_LIBRARY_PATH=$fabric:$PEER_LIB" "GGML_VERBS_FABRIC_DIR=$sockdir" "${envs[@]}" "${ref_env[@]}" \
                "$PEER_BIN/ggml-rpc-server" -d CPU -t 1 -H 127.0.0.1 -p "$port" \
                >"$logdir/$name.$transport.$i.ref.log" 2>&1 </dev/null &
        else
            env "LD_LIBRARY_PATH=$fabric" "GGML_VERBS_FABRIC_DIR=$sockdir" GGML_NO_BACKTRACE=1 "${envs[@]}" \
                "$server" -p "$port" --shell "$kind" --transport "$transport" "${args[@]}" \
                >"$logdir/$name.$transport.$i.log" 2>&1 </dev/null &
        fi
        pids+=($!)
        conf_wait_port "$port" "$!" || conf_die "a server did not start, see $logdir/$name.$transport.$i.*log"
        addrs+=("127.0.0.1:$port")
        i=$((i + 1))
    done
    if ! env "LD_LIBRARY_PATH=$fabric" "GGML_VERBS_FABRIC_DIR=$sockdir" RUST_BACKTRACE=0 timeout 180 \
        "$check" "${addrs[@]}" >"$logdir/$name.$transport.out" 2>"$logdir/$name.$transport.err"; then
        bad "$name ($transport): comm_check failed, see $logdir/$name.$transport.err"
    fi
    for i in "${pids[@]}"; do conf_kill "$i"; done
    pids=()
}

# check NAME KINDS WANT [ENV...] -- [SERVER ARGS...]: WANT comm sockets of ours switch.
check() {
    local name=$1 kinds=$2 want=$3 switched
    shift 3
    rm -f "$logdir/$name".*
    group "$name" auto "$kinds" "$@"
    group "$name" tcp "$kinds" "$@"
    switched=$(cat "$logdir/$name".auto.*.log | grep -c 'comm link: switched to RDMA' || true)
    [ "$switched" = "$want" ] || bad "$name: $switched comm sockets switched to RDMA, want $want (see $logdir/$name.auto.*.log)"
    if cat "$logdir/$name".tcp.*.log | grep -q 'RDMA activated'; then
        bad "$name: a TCP server activated RDMA"
    fi
    if [[ $kinds == *ref* ]] && ! cat "$logdir/$name".auto.*.ref.log | grep -q 'RDMA activated'; then
        bad "$name: the reference's comm link did not activate RDMA (see $logdir/$name.auto.*.ref.log)"
    fi
    if [ -s "$logdir/$name.auto.out" ] && cmp -s "$logdir/$name.auto.out" "$logdir/$name.tcp.out"; then
        conf_log "ok $name: $switched comm sockets over RDMA, all-reduce results identical to TCP"
    else
        diff "$logdir/$name.tcp.out" "$logdir/$name.auto.out" >&2 || true
        bad "$name: results differ between RDMA and TCP"
    fi
}

check ranked-pairwise tokio,tokio 2 GGML_RPC_NO_BACKEND_COMMUNICATOR=1 --
check ranked-ring uring,uring,uring 4 --
check pairwise-link smol,smol 2 -- --comm-link pairwise
check ref-rank1 tokio,ref 1 GGML_RPC_NO_BACKEND_COMMUNICATOR=1 --
check ref-rank0 ref,uring 1 GGML_RPC_NO_BACKEND_COMMUNICATOR=1 --
exit "$fail"
