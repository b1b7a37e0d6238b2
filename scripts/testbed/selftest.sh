#!/usr/bin/env bash
# The test of the test bed itself (scripts/test.sh runs it in CI, as root; about 12 s after the
# build). Fails, never skips, when not root; installs iproute2 with apt-get when `ip` or `tc`
# is missing.
#
#  1. `up` 3 hosts at 200mbit: the namespaces, lo up in each, a tbf on both ends of every
#     link, no route out of the subnet, nothing in the namespace we run in.
#  2. our ggml-rpc-server in hosts 1 and 2 (`spawn`); `ggml-rpc probe` of each from host 3
#     and of host 2 from host 1 (`exec`).
#  3. `ggml-rpc bench` of one 64 MiB SET_TENSOR and GET_TENSOR from host 3 to host 1: both
#     directions at 50-110 % of the shaping rate (a check of the shaping, not of our speed).
#  4. a second test bed up at the same time, on the same subnet: the first one's server is not
#     reachable from it, its own is.
#  5. `down` of the first: its namespaces, state and server processes are gone, its hosts
#     cannot be entered, and the second test bed still works; then `down` of the second.
#  6. `run` whose command fails (status 7) after spawning: run exits 7, nothing is left.
#  7. `run` sent TERM, then INT, while its command runs: exits 143 (130), nothing is left, the
#     command and what it spawned are stopped.
#  8. `run --hosts 2 --rate none`: the unshaped link is more than twice as fast as the shaped.
#  9. a test bed whose owner is gone is removed by `cleanup`.
# 10. no link was added to the namespace we run in.
#
# Environment: TESTBED_SELFTEST_RATE (default 200mbit), CARGO_TARGET_DIR (where the release
# binaries are built).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
T="$root/scripts/testbed/testbed.sh"
RATE=${TESTBED_SELFTEST_RATE:-200mbit}
SIZE=64MiB
# the band of the shaping rate the measured payload rate must fall in, in percent
LOW=50
HIGH=110

# (no `cmd | grep -q` under pipefail: grep's early exit can kill cmd with SIGPIPE)
say() { printf '[testbed selftest %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() {
    printf '[testbed selftest] FAIL: %s\n' "$*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] \
    || fail "must run as root (network namespaces, veth, tc): this test never skips, CI runs it as root"
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    command -v apt-get >/dev/null || fail "ip/tc missing and no apt-get to install iproute2"
    say "installing iproute2 with apt-get"
    apt-get update -qq >&2 || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >&2 || fail "apt-get install iproute2 failed"
fi
for tool in ip tc setsid timeout python3; do
    command -v "$tool" >/dev/null || fail "'$tool' not found (apt-get install -y iproute2 util-linux coreutils python3)"
done
# shellcheck source=scripts/testbed/lib.sh
. "$root/scripts/testbed/lib.sh"

target=${CARGO_TARGET_DIR:-$root/target}
say "building the release server and CLI"
cargo build --release -p ggml-rpc-server -p ggml-rpc-cli >&2 || fail "cargo build failed"
SERVER="$target/release/ggml-rpc-server"
CLI="$target/release/ggml-rpc"
[ -x "$SERVER" ] && [ -x "$CLI" ] || fail "$SERVER or $CLI missing after the build"

work=$(mktemp -d)
ids=()
links_before=$(ip -o link show | awk -F': ' '{print $2}' | sort)
cleanup_self() {
    local rc=$? id
    trap - EXIT
    for id in "${ids[@]}"; do
        [ -d "$(tb_state "$id")" ] && { "$T" down --id "$id" 2>/dev/null || true; }
    done
    rm -rf "$work"
    [ "$rc" = 0 ] || say "FAILED (status $rc)"
    exit "$rc"
}
trap cleanup_self EXIT

# up ARGS...: `testbed.sh up ARGS --owner us`, echoes the ID.
up() {
    local out id
    out=$("$T" up "$@" --owner $$) || fail "testbed.sh up $* failed"
    printf '%s\n' "$out" >&2
    id=$(sed -n 's/^export TESTBED_ID=\([^ ]*\).*/\1/p' <<<"$out")
    [ -n "$id" ] || fail "testbed.sh up printed no ID"
    echo "$id"
}

# can_connect ID HOST ADDR PORT: whether HOST of test bed ID can open a TCP connection there.
can_connect() {
    "$T" exec --id "$1" "$2" timeout 2 bash -c ": </dev/tcp/$3/$4" 2>/dev/null
}

# wait_listen ID HOST ADDR PORT: until it can connect (10 s).
wait_listen() {
    for _ in $(seq 1 100); do
        can_connect "$@" && return 0
        sleep 0.1
    done
    fail "nothing listens on $3:$4 (seen from host $2 of $1)"
}

# gone ID: no namespace and no state of test bed ID is left.
assert_gone() {
    local id=$1 left
    left=$(tb_namespaces "$id")
    [ -z "$left" ] || fail "namespaces of $id left: $left"
    [ ! -e "$(tb_state "$id")" ] || fail "state of $id left: $(tb_state "$id")"
}

# assert_dead PID...: none of these processes runs (zombies count as gone).
assert_dead() {
    local pid
    for pid in "$@"; do
        if kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]; then
            fail "process $pid ($(ps -o args= -p "$pid")) still runs"
        fi
    done
}

# rate_mbit OUTPUT TEST: the mean rate of TEST (SET_TENSOR, GET_TENSOR) in ggml-rpc bench's
# OUTPUT, in Mbit/s.
rate_mbit() {
    awk -v t="$2" '$1 == t && $6 == "GB/s" { printf "%.1f\n", $5 * 8000 }' <<<"$1"
}

# ---------------------------------------------------------------- 1. up
say "1. up: 3 hosts at $RATE"
A=$(up --hosts 3 --rate "$RATE")
ids+=("$A")
[ "$(tb_namespaces "$A" | wc -l)" = 4 ] || fail "expected 4 namespaces, got: $(tb_namespaces "$A")"
for i in 1 2 3; do
    ns=$(tb_host_ns "$A" "$i")
    grep -q '[<,]UP[,>]' <<<"$(ip -n "$ns" -o link show lo)" || fail "lo is down in $ns"
    grep -q " 10\.77\.0\.$i/24 " <<<"$(ip -n "$ns" -o addr show dev eth0)" || fail "$ns has no 10.77.0.$i/24"
    grep -q '^qdisc tbf' <<<"$(tc -n "$ns" qdisc show dev eth0)" || fail "no tbf on eth0 in $ns"
    grep -q '^qdisc tbf' <<<"$(tc -n "$(tb_bridge_ns "$A")" qdisc show dev "h$i")" \
        || fail "no tbf on port h$i of the bridge"
    [ -z "$(ip -n "$ns" route show default)" ] || fail "$ns has a default route"
done
if grep -q ' 10\.77\.0\.' <<<"$(ip -o addr show)"; then fail "an address of the test bed is in our namespace"; fi
[ "$(ip -o link show | awk -F': ' '{print $2}' | sort)" = "$links_before" ] \
    || fail "up changed the links of our namespace"

# ---------------------------------------------------------------- 2. servers, probes
say "2. our server in hosts 1 and 2, probes from host 3 and host 1"
read -r pid1 log1 < <("$T" spawn --id "$A" 1 "$SERVER" -H 10.77.0.1 --insecure-plain -p 50052)
read -r pid2 _ < <("$T" spawn --id "$A" 2 "$SERVER" -H 10.77.0.2 --insecure-plain -p 50052)
wait_listen "$A" 3 10.77.0.1 50052
wait_listen "$A" 3 10.77.0.2 50052
for target_host in 10.77.0.1 10.77.0.2; do
    out=$("$T" exec --id "$A" 3 "$CLI" probe "$target_host:50052") || fail "probe of $target_host from host 3 failed"
    grep -q '^protocol *: 8\.' <<<"$out" || fail "unexpected probe output: $out"
    grep -q '^devices *: 1' <<<"$out" || fail "unexpected probe output: $out"
done
"$T" exec --id "$A" 1 "$CLI" probe 10.77.0.2:50052 >/dev/null || fail "probe of host 2 from host 1 failed"
grep -q 'endpoint *: 10\.77\.0\.1:50052' "$log1" || fail "server log $log1 does not show its endpoint"

# ---------------------------------------------------------------- 3. the shaped rate
say "3. bench: one $SIZE SET_TENSOR and GET_TENSOR from host 3 to host 1 through $RATE links"
out=$("$T" exec --id "$A" 3 "$CLI" bench 10.77.0.1:50052 --size "$SIZE" --iterations 1 \
    --small-rounds 100 --no-progress) || fail "bench failed"
printf '%s\n' "$out" >&2
shaped=$(tb_parse_rate "$RATE")
for test in SET_TENSOR GET_TENSOR; do
    mbit=$(rate_mbit "$out" "$test")
    [ -n "$mbit" ] || fail "no $test rate in the bench output"
    pct=$(awk -v m="$mbit" -v r="$shaped" 'BEGIN { printf "%.1f", m * 1e6 / r * 100 }')
    say "   $test: $mbit Mbit/s of payload = $pct % of $RATE"
    awk -v p="$pct" -v lo="$LOW" -v hi="$HIGH" 'BEGIN { exit !(p >= lo && p <= hi) }' \
        || fail "$test ran at $pct % of the shaping rate, outside $LOW-$HIGH %"
    [ "$test" = SET_TENSOR ] && shaped_set_mbit=$mbit
done

# ---------------------------------------------------------------- 4. a second test bed
say "4. a second test bed on the same subnet, up at the same time"
B=$(up --hosts 2 --rate none)
ids+=("$B")
[ "$A" != "$B" ] || fail "two test beds got the same ID $A"
read -r pidb _ < <("$T" spawn --id "$B" 1 "$SERVER" -H 10.77.0.1 --insecure-plain -p 50053)
wait_listen "$B" 2 10.77.0.1 50053
if can_connect "$B" 2 10.77.0.1 50052; then fail "test bed $B reaches $A's server"; fi
can_connect "$A" 3 10.77.0.1 50052 || fail "host 3 of $A lost its server"

# ---------------------------------------------------------------- 5. down
say "5. down $A"
"$T" down --id "$A" || fail "down of $A failed"
assert_gone "$A"
assert_dead "$pid1" "$pid2"
if "$T" exec --id "$A" 3 true 2>/dev/null; then fail "host 3 of $A can still be entered"; fi
if ip netns exec "$A-h3" true 2>/dev/null; then fail "namespace $A-h3 can still be entered"; fi
if can_connect "$B" 2 10.77.0.1 50052; then fail "$A's server answers after down"; fi
can_connect "$B" 2 10.77.0.1 50053 || fail "down of $A broke test bed $B"
"$T" down --id "$B" || fail "down of $B failed"
assert_gone "$B"
assert_dead "$pidb"

# ---------------------------------------------------------------- 6. run, failing command
say "6. run whose command fails after spawning"
rc=0
# shellcheck disable=SC2016  # expanded by the inner bash
"$T" run --hosts 3 --rate "$RATE" -- bash -c '
    echo "$TESTBED_ID" >"$0/id"
    [ "$TESTBED_HOSTS" = 3 ] && [ "$TESTBED_ADDR_2" = 10.77.0.2 ] && [ "$TESTBED_NS_2" = "$TESTBED_ID-h2" ] || exit 9
    "$TESTBED" spawn 1 sleep 300 >"$0/spawned"
    grep -q "[<,]UP[,>]" <<<"$("$TESTBED" exec 2 ip -o link show lo)" || exit 9
    echo "forced failure" >&2
    exit 7' "$work" || rc=$?
[ "$rc" = 7 ] || fail "run exited $rc, expected the command's 7"
C=$(cat "$work/id")
ids+=("$C")
assert_gone "$C"
assert_dead "$(cut -d' ' -f1 "$work/spawned")"

# ---------------------------------------------------------------- 7. run, TERM
# signal_case SIGNAL STATUS: run, SIGNAL while its command runs, must exit STATUS and leave
# nothing. The runner starts with every signal at its default disposition (a background job of
# a script ignores INT, and a shell cannot trap a signal ignored at its start).
signal_case() {
    local sig=$1 want=$2 runner rc=0 id
    say "7. run sent $sig while its command runs"
    rm -f "$work/id" "$work/spawned" "$work/script"
    # shellcheck disable=SC2016  # expanded by the inner bash
    python3 -c 'import os, signal, sys
for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$T" run --hosts 2 --rate "$RATE" -- bash -c '
        echo $$ >"$0/script"
        "$TESTBED" spawn 2 sleep 300 >"$0/spawned"
        echo "$TESTBED_ID" >"$0/id"
        sleep 300' "$work" &
    runner=$!
    for _ in $(seq 1 100); do
        [ -s "$work/id" ] && break
        sleep 0.1
    done
    [ -s "$work/id" ] || fail "run's command did not start"
    id=$(cat "$work/id")
    ids+=("$id")
    [ "$(tb_namespaces "$id" | wc -l)" = 3 ] || fail "run's test bed is not up"
    kill "-$sig" "$runner"
    wait "$runner" || rc=$?
    [ "$rc" = "$want" ] || fail "run exited $rc after $sig, expected $want"
    assert_gone "$id"
    assert_dead "$(cut -d' ' -f1 "$work/spawned")" "$(cat "$work/script")"
}
signal_case TERM 143
signal_case INT 130

# ---------------------------------------------------------------- 8. run, unshaped
say "8. run --hosts 2 --rate none: the same transfer unshaped"
# shellcheck disable=SC2016  # expanded by the inner bash
out=$("$T" run --hosts 2 --rate none -- bash -c '
    "$TESTBED" spawn 1 "$0" -H "$TESTBED_ADDR_1" --insecure-plain -p 50052 >/dev/null
    for _ in $(seq 1 100); do
        "$TESTBED" exec 2 timeout 2 bash -c ": </dev/tcp/$TESTBED_ADDR_1/50052" 2>/dev/null && break
        sleep 0.1
    done
    "$TESTBED" exec 2 "$1" bench "$TESTBED_ADDR_1:50052" --size "$2" --iterations 1 --small-rounds 100 --no-progress
    ' "$SERVER" "$CLI" "$SIZE") || fail "unshaped run failed"
printf '%s\n' "$out" >&2
mbit=$(rate_mbit "$out" SET_TENSOR)
[ -n "$mbit" ] || fail "no SET_TENSOR rate in the unshaped bench output"
say "   SET_TENSOR unshaped: $mbit Mbit/s (shaped: $shaped_set_mbit)"
awk -v u="$mbit" -v s="$shaped_set_mbit" 'BEGIN { exit !(u > 2 * s) }' \
    || fail "unshaped ($mbit Mbit/s) is not more than twice the shaped rate ($shaped_set_mbit)"

# ---------------------------------------------------------------- 9. cleanup
say "9. cleanup removes a test bed whose owner is gone"
# `; true` keeps bash from exec'ing testbed.sh: its owner (parent) is this short-lived bash
out=$(bash -c "'$T' up --hosts 2 --rate none; true") || fail "up for the stale test bed failed"
E=$(sed -n 's/^export TESTBED_ID=\([^ ]*\).*/\1/p' <<<"$out")
[ -n "$E" ] || fail "up printed no ID"
ids+=("$E")
[ "$(tb_namespaces "$E" | wc -l)" = 3 ] || fail "the stale test bed is not up"
grep -q "^$E .*stale" <<<"$("$T" list)" || fail "list does not show $E as stale: $("$T" list)"
"$T" cleanup || fail "cleanup failed"
assert_gone "$E"

# ---------------------------------------------------------------- 10. our namespace
[ "$(ip -o link show | awk -F': ' '{print $2}' | sort)" = "$links_before" ] \
    || fail "the links of our namespace changed: $(diff <(echo "$links_before") <(ip -o link show | awk -F': ' '{print $2}' | sort))"
say "all checks passed ($RATE: SET_TENSOR at $shaped_set_mbit Mbit/s; unshaped $mbit Mbit/s)"
