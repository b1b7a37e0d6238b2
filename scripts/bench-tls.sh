#!/usr/bin/env bash
# Throughput through `ggml-rpc tunnel` + our TLS server against plain TCP to our server, in one
# run: `ggml-rpc bench` rounds alternating between the two (the order flips every round, so a
# drift in the machine's load hits both alike); prints each side's median SET_TENSOR and
# GET_TENSOR rate and the ratio TLS / plain. Loopback: the two hops of the tunnel, the
# encryption and the decryption all share this machine's cores.
#
# usage: scripts/bench-tls.sh [--rounds N] [--size SIZE] [--iterations N]
#   default: 7 rounds of 256MiB x 5 (the full run, by hand; CI runs 1 round as a smoke)
#   binaries: $GGML_RPC_OUR_SERVER (default target/release/ggml-rpc-server, built here unless
#   CONFORMANCE_REBUILD=0) and ggml-rpc next to it ($GGML_RPC_CLI overrides).
set -euo pipefail
# shellcheck source=conformance/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/conformance/lib.sh"

rounds=7 size=256MiB iterations=5
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --iterations) iterations=$2; shift 2 ;;
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

dir="$CONF_OUT/bench-tls"
rm -rf "$dir"; mkdir -p "$dir"
"$REPO_ROOT/scripts/tls/make-certs.sh" "$dir/certs" >/dev/null
pids=()
# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() { for p in "${pids[@]}"; do conf_kill "$p"; done; }
trap cleanup EXIT

plain_port=$(conf_free_port)
"$server" -p "$plain_port" >"$dir/server-plain.log" 2>&1 </dev/null &
pids+=($!)
conf_wait_port "$plain_port" "${pids[-1]}" || conf_die "plain server did not start"
tls_port=$(conf_free_port)
"$server" -p "$tls_port" --tls-cert "$dir/certs/server.crt" --tls-key "$dir/certs/server.key" \
    --tls-client-ca "$dir/certs/ca.crt" >"$dir/server-tls.log" 2>&1 </dev/null &
pids+=($!)
conf_wait_port "$tls_port" "${pids[-1]}" || conf_die "TLS server did not start"
"$cli" tunnel --listen 127.0.0.1:0 --connect "127.0.0.1:$tls_port" --tls-cert "$dir/certs/client.crt" \
    --tls-key "$dir/certs/client.key" --tls-ca "$dir/certs/ca.crt" >"$dir/tunnel.out" 2>"$dir/tunnel.log" </dev/null &
pids+=($!)
tunnel_port=""
for _ in $(seq 1 100); do
    tunnel_port=$(sed -n 's/^tunnel listening on 127\.0\.0\.1://p' "$dir/tunnel.out" 2>/dev/null || true)
    [ -n "$tunnel_port" ] && break
    sleep 0.1
done
[ -n "$tunnel_port" ] || conf_die "the tunnel did not start, see $dir/tunnel.log"

# bench NAME PORT ROUND: one `ggml-rpc bench`, its table appended to NAME.txt.
bench() {
    "$cli" bench "127.0.0.1:$2" --size "$size" --iterations "$iterations" --small-rounds 1000 \
        --no-progress >"$dir/$1.$3.txt" || conf_die "ggml-rpc bench against $1 failed"
}
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then bench plain "$plain_port" "$r"; bench tls "$tunnel_port" "$r"
    else bench tls "$tunnel_port" "$r"; bench plain "$plain_port" "$r"; fi
    conf_log "round $r/$rounds done"
done

python3 - "$dir" "$rounds" "$size" "$iterations" <<'PY'
import glob, os, re, statistics, sys
d, rounds, size, iterations = sys.argv[1:]
def rates(name, test):
    out = []
    for f in sorted(glob.glob(os.path.join(d, f"{name}.*.txt"))):
        for line in open(f):
            m = re.match(rf"{test}\s+(?:\S+ \S+|-)\s+\d+\s+([\d.]+) (GB/s|rt/s)", line)
            if m:
                out.append(float(m.group(1)))
    if not out:
        sys.exit(f"no {test} rows for {name} in {d}")
    return out
print(f"TLS tunnel vs plain TCP, loopback, {rounds} interleaved rounds of {size} x {iterations} (medians of per-round means)")
for test, unit in (("SET_TENSOR", "GB/s"), ("GET_TENSOR", "GB/s"), ("GET_ALIGNMENT", "rt/s")):
    plain, tls = statistics.median(rates("plain", test)), statistics.median(rates("tls", test))
    print(f"{test:<14} plain {plain:10.2f} {unit}   tls {tls:10.2f} {unit}   ratio {tls / plain:6.1%}")
PY
