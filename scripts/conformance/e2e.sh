#!/usr/bin/env bash
# End-to-end: greedy generation with llama.cpp's own llama-completion on tiny random llama
# models, CPU only vs the reference ggml-rpc-server vs our server, flash attention off and on,
# once per llama.cpp peer: b11434 (protocol 7.0.0; our server runs with --protocol 7) and
# b12032+1 (protocol 8.0.1; our server runs with --protocol 8.0.1). Each peer's own
# ggml-rpc-server is its reference. Then a negative check: b12032's llama-completion against
# our server with --protocol 8.0.0 must fail, and our server's log must name the reason
# ("is the client 8.0.1").
#
# usage: scripts/conformance/e2e.sh [options]
#   --peers LIST       llama.cpp peers whose programs run: any of b11434,b12032 (default both;
#                      b11739 has no llama-completion)
#   --targets LIST     any of cpu,reference,ours (default: all three; cpu is the baseline)
#   --types LIST       model types (default f32,f16,q8_0,q4_0,q4_k)
#   --models LIST      explicit GGUF paths instead of the generated tiny models
#   --fa LIST          flash attention settings (default off,on)
#   --server-cmd CMD   our server ({port} replaced, else "-p PORT" appended; {protocol}
#                      replaced by the peer's version: 7 or 8.0.1)
#                      default: target/release/ggml-rpc-server --protocol {protocol} -p {port}
#   --endpoint H:P     use an already running server as "ours" (one peer only)
#   -n N               tokens to generate (default 16)
#   --no-probe         only llama-completion text (skip llama_probe token ids / logits)
#   --no-negative      skip the --protocol 8.0.0 negative check
#   --strict           identical token ids and text only (a divergence at a near tie fails)
#   --logdir DIR       default target/conformance/e2e (one subfolder per peer)
# Models are generated with make-models.py (b11434's gguf-py and quantizers) into
# target/conformance/models if missing; both peers load the same files.
# Exit status: 0 all comparisons pass, 1 some fail, 2 harness error.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

peers="b11434,b12032" targets="cpu,reference,ours" types="f32,f16,q8_0,q4_0,q4_k" models="" fa="off,on"
server_cmd="" endpoint="" n=16 logdir="$CONF_OUT/e2e" extra=() negative=1
while [ $# -gt 0 ]; do
    case "$1" in
        --peers) peers=$2; shift 2 ;;
        --targets) targets=$2; shift 2 ;;
        --types) types=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        --fa) fa=$2; shift 2 ;;
        --server-cmd) server_cmd=$2; shift 2 ;;
        --endpoint) endpoint=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --no-probe) extra+=(--no-probe); shift ;;
        --no-negative) negative=0; shift ;;
        --strict) extra+=(--strict); shift ;;
        --logdir) logdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

IFS=, read -ra peer_list <<<"$peers"
[ "${#peer_list[@]}" -gt 0 ] || conf_die "--peers is empty"
for p in "${peer_list[@]}"; do
    case "$p" in
        b11434|b12032) ;;
        *) conf_die "unknown peer $p (b11434 or b12032)" ;;
    esac
    conf_select_peer "$p"
    conf_check_peer
    [ -x "$PEER_BIN/llama-completion" ] || conf_die "$PEER_BIN/llama-completion missing"
done
if [ -n "$endpoint" ] && [ "${#peer_list[@]}" -gt 1 ]; then
    conf_die "--endpoint serves one protocol: give --peers with one peer"
fi

if [ -z "$models" ]; then
    conf_select_peer b11434
    conf_check_peer
    mdir="$CONF_OUT/models"
    py=$(conf_python)
    "$py" "$CONF_DIR/make-models.py" --out "$mdir" --preset tiny --types "$types" >&2 \
        || conf_die "make-models.py failed"
    models=""
    IFS=, read -ra tl <<<"$types"
    for t in "${tl[@]}"; do models+="${models:+,}$mdir/tiny-llama-$t.gguf"; done
fi

note=""
case ",$targets," in
    *,ours,*)
        if [ -z "$endpoint" ] && [ -z "$server_cmd" ]; then
            conf_build_our_server
            server_cmd="$OUR_SERVER --protocol {protocol} -p {port}"
            note="ours: $OUR_SERVER_DESC"
        fi ;;
esac

# peer_protocol TAG: the --protocol our server serves to that peer's programs.
peer_protocol() {
    case "$1" in
        b11434) echo 7 ;;
        b12032) echo 8.0.1 ;;
    esac
}

# negative_check: b12032's llama-completion against our server serving 8.0.0. The 8.0.1
# client numbers UNARY/GLU one higher than 8.0.0 (TOP_K_MASK was inserted at op 91), so our
# server must refuse the first graph, close, and log "is the client 8.0.1"; the client must
# exit non-zero. Returns 0 when both hold.
negative_check() {
    local dir="$logdir/b12032" model port pid rc=0 slog cmd
    model=${models%%,*}
    mkdir -p "$dir"
    slog="$dir/negative.our-server-8.0.0.log"
    port=$(conf_free_port)
    cmd=${server_cmd//\{protocol\}/8.0.0}
    if [[ "$cmd" == *"{port}"* ]]; then cmd=${cmd//\{port\}/$port}; else cmd="$cmd -p $port"; fi
    conf_log "negative check: b12032 llama-completion against our server --protocol 8.0.0 ($cmd)"
    # shellcheck disable=SC2086  # the command line is split on purpose
    $cmd >"$slog" 2>&1 </dev/null &
    pid=$!
    if ! conf_wait_port "$port" "$pid"; then
        conf_kill "$pid"
        conf_log "negative check: our server did not start, see $slog"
        return 2
    fi
    GGML_NO_BACKTRACE=1 timeout 120 "$PEER_BIN/llama-completion" -m "$model" -p "Once upon a time" -n 4 \
        --temp 0 --top-k 1 --seed 1 -no-cnv -c 256 -t 2 --no-warmup --no-repack \
        --rpc "127.0.0.1:$port" -ngl 99 </dev/null >"$dir/negative.completion.txt" \
        2>"$dir/negative.completion.log" || rc=$?
    conf_kill "$pid"
    local ok=0
    if [ "$rc" = 0 ]; then
        conf_log "negative check FAILED: llama-completion exited 0 against a 8.0.0 server (see $dir/negative.completion.*)"
        ok=1
    elif [ "$rc" = 124 ]; then
        conf_log "negative check FAILED: llama-completion hung (killed after 120 s)"
        ok=1
    fi
    if ! grep -q "is the client 8.0.1" "$slog"; then
        conf_log "negative check FAILED: our server's log does not say \"is the client 8.0.1\" (see $slog)"
        ok=1
    fi
    if [ "$ok" = 0 ]; then
        conf_log "negative check passed: llama-completion exit $rc; our server: $(grep -m1 -o 'op [0-9]* is .*is the client 8.0.1[^;]*' "$slog" | head -c 200)"
        printf '\nnegative check (b12032 llama-completion vs our server --protocol 8.0.0): PASS, client exit %s, server log: %s\n' \
            "$rc" "$(grep -m1 -o 'is the client 8.0.1[^?]*?' "$slog")"
    else
        printf '\nnegative check (b12032 llama-completion vs our server --protocol 8.0.0): FAIL, client exit %s, logs in %s\n' "$rc" "$dir"
    fi
    return "$ok"
}

status=0
for p in "${peer_list[@]}"; do
    conf_select_peer "$p"
    conf_build_tools
    proto=$(peer_protocol "$p")
    srv=()
    case ",$targets," in
        *,ours,*)
            if [ -n "$endpoint" ]; then
                srv+=(--our-endpoint "$endpoint")
            else
                srv+=(--our-cmd "${server_cmd//\{protocol\}/$proto}")
            fi ;;
    esac
    srv+=(--ref-cmd "$PEER_BIN/ggml-rpc-server -p {port}")
    conf_log "peer $p (our server: --protocol $proto)"
    rc=0
    python3 -B "$CONF_DIR/e2e_run.py" --peer "$p" --completion "$PEER_BIN/llama-completion" --probe "$PROBE" \
        --shim "$SHIM" --models "$models" --fa "$fa" --targets "$targets" -n "$n" \
        --logdir "$logdir/$p" --note "${note:+$note, --protocol $proto}" "${srv[@]}" "${extra[@]}" || rc=$?
    if [ "$rc" -gt "$status" ]; then status=$rc; fi
    if [ "$p" = b12032 ] && [ "$negative" = 1 ] && [ -z "$endpoint" ] && [[ ",$targets," == *,ours,* ]]; then
        rc=0
        negative_check || rc=$?
        if [ "$rc" -gt "$status" ]; then status=$rc; fi
    fi
done
exit "$status"
