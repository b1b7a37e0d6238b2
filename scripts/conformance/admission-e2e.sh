#!/usr/bin/env bash
# Admission end to end (issue 24): with hundreds of connections open to our server that never
# say HELLO (scripts/conformance/slot_flood.py: half silent, half one byte of a header),
# b11434's llama-completion connects, loads a tiny model (-ngl 99) and generates a few tokens
# within a bound.
#
# Three rounds, all with --hello-timeout 0 (no HELLO deadline), so the client gets in only
# because a connection awaiting HELLO gives way to it:
#   1. per-address: the connections from 127.0.0.1, the client's own address; the
#      per-address limit (default 32) is what is full (the server holds at most 32 of them);
#   2. max-clients: spread over 127.0.0.2-127.0.0.254; --max-clients (default 64) is full;
#   3. reconnecting: as 2, but each connection the server closes is replaced, 200 a second
#      (each place awaiting HELLO then lasts about a third of a second; a client whose HELLO
#      header waits unread in its socket gives way last).
# Each round also checks the server's log for the connections that gave way (kind=gave_way).
# Every round runs once per shell (tokio, uring, smol).
#
# usage: scripts/conformance/admission-e2e.sh [options]
#   --connections N    flood size (default 600; capped by the fd hard limit)
#   --shells LIST      our server's shells (default tokio,uring,smol)
#   --limit SECONDS    bound on the client's whole run (default 60; it takes a few seconds)
#   --server-cmd CMD   our server ({port} replaced, else "-p PORT" appended; "--shell NAME" is
#                      appended);
#                      default: target/release/ggml-rpc-server (built if stale)
#   --logdir DIR       default target/conformance/admission
# Exit status: 0 both rounds pass, 1 a round fails, 2 harness error.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

connections=600 limit=60 server_cmd="" shells="tokio,uring,smol" logdir="$CONF_OUT/admission"
while [ $# -gt 0 ]; do
    case "$1" in
        --connections) connections=$2; shift 2 ;;
        --shells) shells=$2; shift 2 ;;
        --limit) limit=$2; shift 2 ;;
        --server-cmd) server_cmd=$2; shift 2 ;;
        --logdir) logdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

conf_select_peer b11434
conf_check_peer
[ -x "$PEER_BIN/llama-completion" ] || conf_die "$PEER_BIN/llama-completion missing"
mdir="$CONF_OUT/models"
"$(conf_python)" "$CONF_DIR/make-models.py" --out "$mdir" --preset tiny --types f32 >&2 \
    || conf_die "make-models.py failed"
model="$mdir/tiny-llama-f32.gguf"
if [ -z "$server_cmd" ]; then
    conf_build_our_server
    server_cmd="$OUR_SERVER"
fi
mkdir -p "$logdir"
# The flood and the server hold a descriptor per connection.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

server_pid="" flood_pid=""
# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() {
    conf_kill "$flood_pid"
    conf_kill "$server_pid"
}
trap cleanup EXIT

# round NAME FLOOD_SOURCES MOST_HELD [FLOOD_FLAGS]: one round; returns 0 when it passes.
round() {
    local name=$1 sources=$2 most=$3 reconnect=${4:-} shell=$5 port cmd slog flog status t0 t1 rc=0 elapsed
    slog="$logdir/$name.server.log" flog="$logdir/$name.completion.log" status="$logdir/$name.flood"
    port=$(conf_free_port)
    cmd="$server_cmd --shell $shell --protocol 7 --hello-timeout 0"
    if [[ "$cmd" == *"{port}"* ]]; then cmd=${cmd//\{port\}/$port}; else cmd="$cmd -p $port"; fi
    conf_log "round $name: $cmd"
    # shellcheck disable=SC2086  # the command line is split on purpose
    $cmd >"$slog" 2>&1 </dev/null &
    server_pid=$!
    conf_wait_port "$port" "$server_pid" || { conf_log "server did not start, see $slog"; return 2; }
    rm -f "$status"
    # shellcheck disable=SC2086  # the flood's flags are split on purpose
    python3 "$CONF_DIR/slot_flood.py" "127.0.0.1:$port" "$connections" ${sources:+--sources "$sources"} \
        --status "$status" $reconnect &
    flood_pid=$!
    # The flood is up when every connection was made (and the server closed those over its
    # limit), or, reconnecting, when the server has been closing them for a while.
    for _ in $(seq 1 300); do
        if [ -f "$status" ] && awk -v r="$reconnect" '{ split($1, o, "="); split($2, c, "="); split($3, t, "=")
                exit !(r == "" ? o[2] + c[2] >= t[2] : c[2] >= 2 * t[2]) }' "$status"; then
            break
        fi
        sleep 0.1
    done
    sleep 0.5
    conf_log "round $name: flood $(cat "$status" 2>/dev/null || echo 'not up'); running llama-completion"
    # Connections the server holds (accepted, its own); those in the listen queue are no one's.
    local held
    held=$(ss -Htnp state established "( sport = :$port )" 2>/dev/null | grep -c "pid=$server_pid," || true)
    local held_note="; the server held $held before the client came"
    [ -z "$reconnect" ] || held_note=""
    t0=$(date +%s.%N)
    # llama-completion's log thread is not flushed at exit (see e2e_run.py): a run that exits 0
    # without its summary is run again (the flood still on).
    for _ in 1 2 3; do
        rc=0
        GGML_NO_BACKTRACE=1 timeout "$limit" "$PEER_BIN/llama-completion" -m "$model" \
            -p "Once upon a time" -n 8 --temp 0 --top-k 1 --seed 1 -no-cnv -c 256 -t 2 \
            --no-warmup --no-repack --rpc "127.0.0.1:$port" -ngl 99 >"$flog.txt" 2>"$flog" </dev/null || rc=$?
        if [ "$rc" != 0 ] || grep -q "total time =" "$flog"; then break; fi
        conf_log "round $name: llama-completion output truncated (log not flushed), again"
        t0=$(date +%s.%N)
    done
    t1=$(date +%s.%N)
    elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    conf_log "round $name: llama-completion exit $rc after ${elapsed}s; flood $(cat "$status" 2>/dev/null)$held_note"
    conf_kill "$flood_pid"; flood_pid=""
    conf_kill "$server_pid"; server_pid=""
    local fail=0
    [ "$rc" = 0 ] || { conf_log "FAIL $name: llama-completion exit $rc (limit ${limit}s), see $flog"; fail=1; }
    grep -q "total time =" "$flog" || { conf_log "FAIL $name: no generation summary in $flog"; fail=1; }
    grep -q "make room for a new client" "$slog" || { conf_log "FAIL $name: nothing gave way, see $slog"; fail=1; }
    grep -q "Client connection closed by the server.*kind=gave_way" "$slog" \
        || { conf_log "FAIL $name: no gave_way close logged, see $slog"; fail=1; }
    # Every place the flood may take was taken: the client got in only by making room.
    if [ -z "$reconnect" ] && [ "$held" -ne "$most" ]; then
        conf_log "FAIL $name: the server held $held flood connections ($most expected)"
        fail=1
    fi
    [ "$fail" = 0 ] && conf_log "PASS $name: model loaded and generated in ${elapsed}s under the flood"
    return "$fail"
}

result=0
IFS=, read -ra shell_list <<<"$shells"
for shell in "${shell_list[@]}"; do
    round "$shell.per-address" "" 32 "" "$shell" || result=1
    round "$shell.max-clients" "127.0.0.2-127.0.0.254" 64 "" "$shell" || result=1
    round "$shell.reconnecting" "127.0.0.2-127.0.0.254" 64 "--reconnect --rate 200" "$shell" || result=1
done
exit "$result"
