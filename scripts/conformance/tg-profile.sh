#!/usr/bin/env bash
# Server instructions per generated token, exact (callgrind), split into MUL_MAT and the rest:
# our release server (-t 1) under valgrind --tool=callgrind with a peer's llama-bench
# (-p 0, -r 1) as the client, once with -n N1 and once with -n N2 tokens; the difference of
# the two runs divided by N2 - N1 cancels the model load, the warm-up and the set-up.
#
# usage: scripts/conformance/tg-profile.sh [--server BIN] [--model GGUF] [--peer b12032|b11434]
#                                          [--n1 16] [--n2 48] [--fa on|off|auto]
# needs: valgrind (callgrind_annotate), the peer's llama-bench; writes target/conformance/tg-profile/
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

server="" model="" peer=b12032 n1=16 n2=48 fa=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --server) server=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --peer) peer=$2; shift 2 ;;
        --n1) n1=$2; shift 2 ;;
        --n2) n2=$2; shift 2 ;;
        --fa) fa=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done
case "$peer" in b11434) proto=7 ;; b12032) proto=8.0.1 ;; *) conf_die "unknown peer $peer" ;; esac
command -v valgrind >/dev/null || conf_die "valgrind not found"
conf_select_peer "$peer"
conf_check_peer
if [ -z "$server" ]; then
    conf_build_our_server
    server=$OUR_SERVER
fi
if [ -z "$model" ]; then
    "$(conf_python)" "$CONF_DIR/make-models.py" --out "$CONF_OUT/models" --preset tiny >&2
    model="$CONF_OUT/models/tiny-llama-q8_0.gguf"
fi
out="$CONF_OUT/tg-profile"
mkdir -p "$out"

run() { # run N: callgrind output $out/cg.N, its inclusive annotation $out/incl.N.txt
    local n=$1 port pid
    port=$(conf_free_port)
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$n" "$server" --protocol "$proto" \
        -t 1 -p "$port" >"$out/server.$n.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 1
    done
    GGML_NO_BACKTRACE=1 "$PEER_BIN/llama-bench" --rpc "127.0.0.1:$port" -dev RPC0 -ngl 99 \
        -m "$model" -p 0 -n "$n" -r 1 -fa "$fa" -o jsonl >"$out/bench.$n.jsonl" 2>"$out/bench.$n.log" \
        || conf_die "llama-bench failed, see $out/bench.$n.log"
    kill -INT "$pid"
    wait "$pid" || true
    callgrind_annotate --inclusive=yes "$out/cg.$n" >"$out/incl.$n.txt"
}
conf_log "server $server, model $model, llama-bench -n $n1 and -n $n2 under callgrind"
run "$n1"
run "$n2"
python3 -B "$CONF_DIR/tg_profile.py" "$out/incl.$n1.txt" "$out/incl.$n2.txt" $((n2 - n1))
