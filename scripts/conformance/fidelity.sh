#!/usr/bin/env bash
# Fidelity on models we did not make: greedy generation on random tiny llama models (several
# model seeds) and random prompts, llama.cpp b11434's CPU backend (the reference, in the probe
# process itself) against our server over RPC, token by token (tests/conformance/llama_probe
# --pair). Reports, per type, how often the generated tokens are identical, every divergence
# (step, the reference's top-2 margin there, the largest |logit difference| before it) and
# the largest |logit difference| seen while the tokens agree. Fails on a divergence at a
# reference margin above the type's threshold (fidelity_run.py THRESHOLDS, README section 4).
#
# usage: scripts/conformance/fidelity.sh [options]
#   --types LIST       model types (default f32,f16,q8_0,q4_0,q4_k)
#   --seeds LIST       model seeds for make-models.py (default 1,2,3)
#   --presets LIST     make-models.py presets (default tiny; also: small)
#   --prompts N        prompts per model (default 20), sampled from the vocab's words
#   --prompt-seed N    RNG seed of the prompts (default 11434)
#   -n N               tokens to generate per prompt (default 64)
#   --fa LIST          flash attention settings (default off)
#   --reference        the reference ggml-rpc-server instead of ours (validates the harness:
#                      everything identical, |logit difference| 0)
#   --server-cmd CMD   our server ({port} replaced, else "-p PORT" appended)
#                      default: target/release/ggml-rpc-server --protocol 7 -p {port}
#   --endpoint H:P     an already running server
#   --logdir DIR       default target/conformance/fidelity
#   --rescore          run nothing: print the table of the run in --logdir again (same
#                      options as that run), e.g. after changing the thresholds
# Models go to target/conformance/models/fidelity/seed-N (written once, deterministic).
# The short CI run (scripts/test.sh): --seeds 1 --prompts 10 -n 40.
# Exit status: 0 pass, 1 some prompt fails, 2 harness error.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

types="f32,f16,q8_0,q4_0,q4_k" seeds="1,2,3" presets="tiny" prompts=20 prompt_seed=11434 n=64
fa="off" reference=0 server_cmd="" endpoint="" logdir="$CONF_OUT/fidelity" rescore=()
while [ $# -gt 0 ]; do
    case "$1" in
        --types) types=$2; shift 2 ;;
        --seeds) seeds=$2; shift 2 ;;
        --presets) presets=$2; shift 2 ;;
        --prompts) prompts=$2; shift 2 ;;
        --prompt-seed) prompt_seed=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --fa) fa=$2; shift 2 ;;
        --reference) reference=1; shift ;;
        --server-cmd) server_cmd=$2; shift 2 ;;
        --endpoint) endpoint=$2; shift 2 ;;
        --logdir) logdir=$2; shift 2 ;;
        --rescore) rescore=(--rescore); shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

conf_check_peer
conf_build_tools
py=$(conf_python)

srv=() note="" label=ours
if [ ${#rescore[@]} -gt 0 ]; then
    srv+=(--endpoint none)
elif [ -n "$endpoint" ]; then
    srv+=(--endpoint "$endpoint")
elif [ "$reference" = 1 ]; then
    label=reference
    srv+=(--server-cmd "$PEER_BIN/ggml-rpc-server -p {port}")
else
    if [ -z "$server_cmd" ]; then
        conf_build_our_server
        server_cmd="$OUR_SERVER --protocol 7 -p {port}"
        note="ours: $OUR_SERVER_DESC"
    fi
    srv+=(--server-cmd "$server_cmd")
fi

exec "$py" -B "$CONF_DIR/fidelity_run.py" --probe "$PROBE" --shim "$SHIM" --python "$py" \
    --make-models "$CONF_DIR/make-models.py" --models-dir "$CONF_OUT/models/fidelity" \
    --types "$types" --seeds "$seeds" --presets "$presets" --prompts "$prompts" \
    --prompt-seed "$prompt_seed" -n "$n" --fa "$fa" --logdir "$logdir" --label "$label" \
    --note "$note" "${srv[@]}" "${rescore[@]}"
