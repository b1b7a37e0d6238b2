#!/usr/bin/env bash
# Throughput over RDMA on the verbs fabric against TCP on loopback, for our server and for
# b12032+1's ggml-rpc-server, in one run: `ggml-rpc bench` (our client) against four servers
#   ours-tcp  our release server, --transport tcp
#   ours-rdma our release server, --transport rdma (client --transport rdma)
#   ref-tcp   b12032+1's ggml-rpc-server with GGML_RPC_NO_RDMA=1 (client --transport tcp)
#   ref-rdma  b12032+1's ggml-rpc-server (client --transport rdma)
# in interleaved rounds (the order rotates every round, so a drift in the machine's load hits
# all four alike); prints the medians of SET_TENSOR / GET_TENSOR (GB/s) and GET_ALIGNMENT
# (round trips/s), the ratios RDMA/TCP per server and ours/reference per transport. Every
# process of the RDMA runs loads the fabric (LD_LIBRARY_PATH); the run fails unless each RDMA
# server logged "RDMA activated" once per bench and never fell back to TCP.
# The fabric carries SENDs over Unix sockets with extra copies: these figures compare the
# protocol paths and transports on the same fabric, not a NIC (README.md, "RDMA").
#
# usage: scripts/bench-rdma.sh [--rounds N] [--size SIZE] [--iterations N] [--smoke]
#   default: 5 rounds of 256MiB x 3; --smoke: 1 round of 16MiB x 1 (scripts/test.sh)
#   binaries: $GGML_RPC_OUR_SERVER (default target/release/ggml-rpc-server, built here unless
#   CONFORMANCE_REBUILD=0) and ggml-rpc next to it ($GGML_RPC_CLI overrides); the fabric from
#   scripts/fabric/build.sh --release; b12032+1 from /var/cache/ggml-rpc-peer/b12032.
# Exit status: 0 done, 1 an RDMA run did not use RDMA, 2 harness error.
set -euo pipefail
# shellcheck source=conformance/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/conformance/lib.sh"

rounds=5 size=256MiB iterations=3 small=1000
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --iterations) iterations=$2; shift 2 ;;
        --smoke) rounds=1 size=16MiB iterations=1 small=100; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done
if [ -z "${GGML_RPC_OUR_SERVER:-}" ] && [ "${CONFORMANCE_REBUILD:-1}" = 1 ]; then
    conf_log "building: cargo build --release -p ggml-rpc-server -p ggml-rpc-cli"
    (cd "$REPO_ROOT" && cargo build --release -p ggml-rpc-server -p ggml-rpc-cli) || conf_die "cargo build failed"
fi
server=$OUR_SERVER
cli=${GGML_RPC_CLI:-$(dirname "$OUR_SERVER")/ggml-rpc}
[ -x "$server" ] && [ -x "$cli" ] || conf_die "$server or $cli missing"
fabric=$("$REPO_ROOT/scripts/fabric/build.sh" --release) || conf_die "building the verbs fabric failed"
[ -f "$fabric/libibverbs.so.1" ] || conf_die "no libibverbs.so.1 in $fabric"
conf_select_peer b12032
conf_check_peer

dir="$CONF_OUT/bench-rdma"
rm -rf "$dir"; mkdir -p "$dir"
sockdir=$(mktemp -d /tmp/vfab-bench.XXXXXX)
pids=()
# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() { for p in "${pids[@]}"; do conf_kill "$p"; done; rm -rf "$sockdir"; }
trap cleanup EXIT
fab=(env "LD_LIBRARY_PATH=$fabric:$PEER_LIB" "GGML_VERBS_FABRIC_DIR=$sockdir" GGML_NO_BACKTRACE=1)

# start NAME CMD...: a server on a free port, its log in NAME.server.log; sets port_NAME.
start() {
    local name=$1 port
    shift
    port=$(conf_free_port)
    "${fab[@]}" "$@" -p "$port" >"$dir/$name.server.log" 2>&1 </dev/null &
    pids+=($!)
    conf_wait_port "$port" "${pids[-1]}" || conf_die "$name server did not start, see $dir/$name.server.log"
    printf -v "port_${name//-/_}" %s "$port"
}
start ours-tcp "$server" --transport tcp
start ours-rdma "$server" --transport rdma
start ref-tcp GGML_RPC_NO_RDMA=1 "$PEER_BIN/ggml-rpc-server" -H 127.0.0.1
start ref-rdma "$PEER_BIN/ggml-rpc-server" -H 127.0.0.1

# bench NAME ROUND: one `ggml-rpc bench` against NAME's server, its table in NAME.ROUND.txt.
bench() {
    local name=$1 var="port_${1//-/_}" extra=()
    [ "$name" = "${name%-tcp}" ] || extra=(GGML_RPC_NO_RDMA=1)
    "${fab[@]}" "${extra[@]}" timeout 600 "$cli" bench "127.0.0.1:${!var}" --transport "${name#*-}" \
        --size "$size" --iterations "$iterations" --small-rounds "$small" --no-progress \
        >"$dir/$name.$2.txt" 2>&1 || conf_die "ggml-rpc bench against $name failed, see $dir/$name.$2.txt"
}
names=(ours-tcp ours-rdma ref-tcp ref-rdma)
for r in $(seq 1 "$rounds"); do
    for i in 0 1 2 3; do bench "${names[$(((i + r - 1) % 4))]}" "$r"; done
    conf_log "round $r/$rounds done"
done

fail=0
for name in ours-rdma ref-rdma; do
    log="$dir/$name.server.log"
    ups=$(grep -c 'RDMA activated' "$log" || true)
    if [ "$ups" -lt "$rounds" ] || grep -qE 'transport rdma|activate failed|continuing with TCP' "$log"; then
        conf_log "FAIL $name: $ups RDMA activation(s) for $rounds bench(es), see $log"; fail=1
    fi
done
for name in ours-tcp ref-tcp; do
    if grep -q 'RDMA activated' "$dir/$name.server.log"; then
        conf_log "FAIL $name: a TCP run switched to RDMA, see $dir/$name.server.log"; fail=1
    fi
done

python3 - "$dir" "$rounds" "$size" "$iterations" <<'PY'
import glob, os, re, statistics, sys
d, rounds, size, iterations = sys.argv[1:]
def med(name, test):
    out = []
    for f in sorted(glob.glob(os.path.join(d, f"{name}.*.txt"))):
        for line in open(f):
            m = re.match(rf"{test}\s+(?:\S+ \S+|-)\s+\d+\s+([\d.]+) (?:GB/s|rt/s)", line)
            if m:
                out.append(float(m.group(1)))
    if not out:
        sys.exit(f"no {test} rows for {name} in {d}")
    return statistics.median(out)
print(f"RDMA (verbs fabric) vs TCP, loopback, {rounds} interleaved rounds of {size} x {iterations}"
      " (medians of per-round means; our client)")
print("| test | ours TCP | ours RDMA | ref TCP | ref RDMA | ours RDMA/TCP | ref RDMA/TCP | ours/ref TCP | ours/ref RDMA |")
print("|---|---|---|---|---|---|---|---|---|")
for test, unit in (("SET_TENSOR", "GB/s"), ("GET_TENSOR", "GB/s"), ("GET_ALIGNMENT", "rt/s")):
    ot, orr, rt, rr = (med(n, test) for n in ("ours-tcp", "ours-rdma", "ref-tcp", "ref-rdma"))
    fmt = (lambda v: f"{v:.3g} {unit}") if unit == "GB/s" else (lambda v: f"{v:.0f} {unit}")
    print(f"| {test} | {fmt(ot)} | {fmt(orr)} | {fmt(rt)} | {fmt(rr)} | {orr / ot:.3g} | {rr / rt:.3g}"
          f" | {ot / rt:.3g} | {orr / rr:.3g} |")
PY
exit "$fail"
