#!/usr/bin/env bash
# Throughput through `ggml-rpc tunnel` + our TLS server against plain TCP to our server, in one
# run: `ggml-rpc bench` rounds alternating between the two (the order flips every round, so a
# drift in the machine's load hits both alike); prints each side's median SET_TENSOR and
# GET_TENSOR rate and the ratio TLS / plain. Loopback: the two hops of the tunnel, the
# encryption and the decryption all share this machine's cores; so it also prints the CPU
# seconds each side spent per GiB moved, which is what the tunnel and TLS cost.
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
plain_pid=$!
conf_wait_port "$plain_port" "${pids[-1]}" || conf_die "plain server did not start"
tls_port=$(conf_free_port)
"$server" -p "$tls_port" --tls-cert "$dir/certs/server.crt" --tls-key "$dir/certs/server.key" \
    --tls-client-ca "$dir/certs/ca.crt" >"$dir/server-tls.log" 2>&1 </dev/null &
pids+=($!)
tls_pid=$!
conf_wait_port "$tls_port" "${pids[-1]}" || conf_die "TLS server did not start"
"$cli" tunnel --listen 127.0.0.1:0 --connect "127.0.0.1:$tls_port" --tls-cert "$dir/certs/client.crt" \
    --tls-key "$dir/certs/client.key" --tls-ca "$dir/certs/ca.crt" >"$dir/tunnel.out" 2>"$dir/tunnel.log" </dev/null &
pids+=($!)
tunnel_pid=$!
tunnel_port=""
for _ in $(seq 1 100); do
    tunnel_port=$(sed -n 's/^tunnel listening on 127\.0\.0\.1://p' "$dir/tunnel.out" 2>/dev/null || true)
    [ -n "$tunnel_port" ] && break
    sleep 0.1
done
[ -n "$tunnel_port" ] || conf_die "the tunnel did not start, see $dir/tunnel.log"

# cpu_ticks PID...: user + system clock ticks those processes used so far.
cpu_ticks() {
    local total=0 pid fields
    for pid in "$@"; do
        # Fields 14 and 15 of /proc/PID/stat, counted after the command name's closing ")".
        read -r -a fields <<<"$(sed 's/.*) //' "/proc/$pid/stat")"
        total=$((total + fields[11] + fields[12]))
    done
    echo "$total"
}
# bench NAME PORT ROUND: one `ggml-rpc bench`, its table in NAME.ROUND.txt, and the CPU time the
# client, the tunnel (TLS only) and the server spent on it in NAME.ROUND.cpu (the client's user
# and system seconds, then the server's and the tunnel's clock ticks together).
bench() {
    local served=("${@:4}") before after client
    before=$(cpu_ticks "${served[@]}")
    client=$( { /usr/bin/time -f "%U %S" "$cli" bench "127.0.0.1:$2" --size "$size" \
        --iterations "$iterations" --small-rounds 1000 --no-progress >"$dir/$1.$3.txt"; } 2>&1 |
        tail -n 1) || conf_die "ggml-rpc bench against $1 failed"
    after=$(cpu_ticks "${served[@]}")
    echo "$client $(( after - before ))" >"$dir/$1.$3.cpu"
}
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then bench plain "$plain_port" "$r" "$plain_pid"; bench tls "$tunnel_port" "$r" "$tls_pid" "$tunnel_pid"
    else bench tls "$tunnel_port" "$r" "$tls_pid" "$tunnel_pid"; bench plain "$plain_port" "$r" "$plain_pid"; fi
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
# CPU seconds per GiB moved (SET and GET together; the small round trips are a rounding error),
# summed over the rounds: on a loopback run every side shares the same cores, so this, not the
# wall clock, is what the tunnel costs.
def parse_size(text):
    m = re.fullmatch(r"(\d+)(KiB|MiB|GiB|KB|MB|GB)?", text)
    scale = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9, None: 1}
    return int(m.group(1)) * scale[m.group(2)]
gib = 2 * parse_size(size) * int(iterations) * int(rounds) / 2**30
def cpu(name):
    client = served = 0.0
    for f in glob.glob(os.path.join(d, f"{name}.*.cpu")):
        user, system, ticks = open(f).read().split()
        client += float(user) + float(system)
        served += int(ticks) / os.sysconf("SC_CLK_TCK")
    return client / gib, served / gib
(pc, ps), (tc, ts) = cpu("plain"), cpu("tls")
print(f"CPU s/GiB      plain {pc + ps:10.2f} (client {pc:.2f}, server {ps:.2f})   "
      f"tls {tc + ts:10.2f} (client {tc:.2f}, tunnel + server {ts:.2f})   ratio {(pc + ps) / (tc + ts):6.1%}")
PY
