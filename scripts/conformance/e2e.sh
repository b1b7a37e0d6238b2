#!/usr/bin/env bash
# End-to-end: greedy generation with llama.cpp b11434 on tiny random llama models, CPU only
# vs the reference ggml-rpc-server vs our server, flash attention off and on.
#
# usage: scripts/conformance/e2e.sh [options]
#   --targets LIST     any of cpu,reference,ours (default: all three; cpu is the baseline)
#   --types LIST       model types (default f32,f16,q8_0,q4_0,q4_k)
#   --models LIST      explicit GGUF paths instead of the generated tiny models
#   --fa LIST          flash attention settings (default off,on)
#   --server-cmd CMD   our server ({port} replaced, else "-p PORT" appended)
#                      default: target/release/ggml-rpc-server --protocol 7 -p {port}
#   --endpoint H:P     use an already running server as "ours"
#   -n N               tokens to generate (default 16)
#   --no-probe         only llama-completion text (skip llama_probe token ids / logits)
#   --strict           identical token ids and text only (a divergence at a near tie fails)
#   --logdir DIR       default target/conformance/e2e
# Models are generated with make-models.py into target/conformance/models if missing.
# Exit status: 0 all comparisons pass, 1 some fail, 2 harness error.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

targets="cpu,reference,ours" types="f32,f16,q8_0,q4_0,q4_k" models="" fa="off,on"
server_cmd="" endpoint="" n=16 logdir="$CONF_OUT/e2e" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --targets) targets=$2; shift 2 ;;
        --types) types=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        --fa) fa=$2; shift 2 ;;
        --server-cmd) server_cmd=$2; shift 2 ;;
        --endpoint) endpoint=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --no-probe) extra+=(--no-probe); shift ;;
        --strict) extra+=(--strict); shift ;;
        --logdir) logdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

conf_check_peer
[ -x "$PEER_BIN/llama-completion" ] || conf_die "$PEER_BIN/llama-completion missing"
conf_build_tools

if [ -z "$models" ]; then
    mdir="$CONF_OUT/models"
    py=$(conf_python)
    "$py" "$CONF_DIR/make-models.py" --out "$mdir" --preset tiny --types "$types" >&2 \
        || conf_die "make-models.py failed"
    models=""
    IFS=, read -ra tl <<<"$types"
    for t in "${tl[@]}"; do models+="${models:+,}$mdir/tiny-llama-$t.gguf"; done
fi

srv=() note=""
case ",$targets," in
    *,ours,*)
        if [ -n "$endpoint" ]; then
            srv+=(--our-endpoint "$endpoint")
        else
            if [ -z "$server_cmd" ]; then
                conf_build_our_server
                server_cmd="$OUR_SERVER --protocol 7 -p {port}"
                note="ours: $OUR_SERVER_DESC"
            fi
            srv+=(--our-cmd "$server_cmd")
        fi ;;
esac
srv+=(--ref-cmd "$PEER_BIN/ggml-rpc-server -p {port}")

exec python3 -B "$CONF_DIR/e2e_run.py" --completion "$PEER_BIN/llama-completion" --probe "$PROBE" \
    --shim "$SHIM" --models "$models" --fa "$fa" --targets "$targets" -n "$n" \
    --logdir "$logdir" --note "$note" "${srv[@]}" "${extra[@]}"
