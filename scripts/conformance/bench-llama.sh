#!/usr/bin/env bash
# llama-bench --rpc (pp64, tg32) on the tiny conformance models and a synthetic ~110M
# parameter llama (Q8_0, Q4_0): our server against llama.cpp's ggml-rpc-server in one
# llama-bench run, with the ratio ours/reference. The peer's llama-bench is the client and
# its ggml-rpc-server the reference: b11434 (default; our server runs --protocol 7) or
# b12032+1 (--peer b12032; our server runs --protocol 8.0.1).
#
# usage: scripts/conformance/bench-llama.sh [options]
#   --peer TAG         b11434 (default) or b12032
#   --reference-only   benchmark two reference servers against each other (validates the
#                      script; ratios should be ~1)
#   --server-cmd CMD   our server ({port} replaced, else "-p PORT" appended; "-t THREADS"
#                      is not added; {protocol} replaced by 7 or 8.0.1). Default:
#                      target/release/ggml-rpc-server --protocol {protocol} -t THREADS -p {port}
#   --models LIST      GGUF paths (default: tiny f32,f16,q8_0,q4_0,q4_k + bench q8_0,q4_0)
#   --tiny-only        skip the ~110M model
#   --threads N        compute threads of both servers (default 1)
#   -r N               repetitions per llama-bench run (default 5)
#   --rounds N         llama-bench runs per model, the device order swapped each (default 3);
#                      the table shows medians over every repetition of every round
#   -p N / -n N        prompt / generation lengths (default 64 / 32)
#   --fa on|off|auto   flash attention (default off)
#   --client-threads N llama-bench's own threads (default 1)
#   --no-pin           do not pin (default: llama-bench on the first CPU, the servers on the
#                      others, when there are two CPUs or more)
#   --logdir DIR       default target/conformance/bench (b11434), target/conformance/bench/TAG
#   --no-roofline      skip the memory bandwidth probe and the tg rows' "% of the bound"
#
# The roofline: before the rounds, backend-cpu's `membw` example measures the memory read
# bandwidth with the servers' thread count on the servers' CPUs; each tg row then shows the
# weight bytes a token streams (every tensor of the GGUF but token_embd, which the client's
# GET_ROWS reads one row of; all of it when the output layer shares it) and
# A's and B's t/s x those bytes as a % of that bandwidth.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

roofline=1 peer=b11434 mode=ours server_cmd="" models="" note="" tiny_only=0 threads=1 reps=5 rounds=3 pp=64 tg=32 fa=off client_threads=1 pin=auto
logdir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --peer) peer=$2; shift 2 ;;
        --reference-only) mode=reference; shift ;;
        --server-cmd) server_cmd=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        --tiny-only) tiny_only=1; shift ;;
        --threads) threads=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        -p) pp=$2; shift 2 ;;
        -n) tg=$2; shift 2 ;;
        --fa) fa=$2; shift 2 ;;
        --client-threads) client_threads=$2; shift 2 ;;
        --no-pin) pin=off; shift ;;
        --logdir) logdir=$2; shift 2 ;;
        --no-roofline) roofline=0; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

if [ -z "$logdir" ]; then
    logdir="$CONF_OUT/bench"
    if [ "$peer" != b11434 ]; then logdir+="/$peer"; fi
fi
case "$peer" in
    b11434) proto=7 ;;
    b12032) proto=8.0.1 ;;
    *) conf_die "unknown peer $peer (b11434 or b12032)" ;;
esac
# the models come from b11434's gguf-py and quantizers (make-models.py), whichever peer runs
conf_check_peer
conf_select_peer "$peer"
conf_check_peer
[ -x "$PEER_BIN/llama-bench" ] || conf_die "$PEER_BIN/llama-bench missing"

if [ -z "$models" ]; then
    mdir="$CONF_OUT/models"
    py=$(conf_python)
    "$py" "$CONF_DIR/make-models.py" --out "$mdir" --preset tiny >&2 || conf_die "make-models.py failed"
    for t in f32 f16 q8_0 q4_0 q4_k; do models+="${models:+,}$mdir/tiny-llama-$t.gguf"; done
    if [ "$tiny_only" = 0 ]; then
        "$py" "$CONF_DIR/make-models.py" --out "$mdir" --preset bench --types q8_0,q4_0 >&2 \
            || conf_die "make-models.py failed"
        models+=",$mdir/bench-llama-q8_0.gguf,$mdir/bench-llama-q4_0.gguf"
    fi
fi

ref_cmd="$PEER_BIN/ggml-rpc-server -t $threads -p {port}"
if [ "$mode" = reference ]; then
    a_cmd=$ref_cmd a_name=reference-A b_name=reference-B
else
    if [ -z "$server_cmd" ]; then
        conf_build_our_server
        server_cmd="$OUR_SERVER --protocol {protocol} -t $threads -p {port}"
        note="ours: $OUR_SERVER_DESC"
    fi
    server_cmd=${server_cmd//\{protocol\}/$proto}
    a_cmd=$server_cmd a_name=ours b_name=reference
fi

membw_cmd=""
if [ "$roofline" = 1 ]; then
    conf_build_membw
    membw_cmd="$MEMBW --threads $threads"
fi

exec python3 -B "$CONF_DIR/bench_run.py" --bench "$PEER_BIN/llama-bench" --a-cmd "$a_cmd" \
    --b-cmd "$ref_cmd" --a-name "$a_name" --b-name "$b_name" --models "$models" \
    -p "$pp" -n "$tg" -r "$reps" --rounds "$rounds" --fa "$fa" \
    --client-threads "$client_threads" --pin "$pin" --logdir "$logdir" --membw-cmd "$membw_cmd" \
    --note "llama.cpp $peer${note:+; $note, --protocol $proto}"
