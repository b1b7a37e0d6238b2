#!/usr/bin/env bash
# TLS end-to-end: b11434's llama-completion (an unmodified llama.cpp, plain TCP) generates
# greedily on a tiny model through `ggml-rpc tunnel` to our server started with
# --tls-cert/--tls-key/--tls-client-ca, and through plain TCP to our server without TLS; the
# two texts must be identical and non-empty; then e2e.sh --strict with the tunnel as "ours"
# (token ids and text identical to CPU only, logits compared). Then the negative checks: a tunnel whose
# certificate is signed by another CA, and a plain client straight at the TLS port, must both
# fail, with the server logging the refused handshake and no command served.
#
# usage: scripts/conformance/tls.sh [--model GGUF] [-n N] [--logdir DIR]
#   binaries: $GGML_RPC_OUR_SERVER (default target/release/ggml-rpc-server, built here unless
#   CONFORMANCE_REBUILD=0) and ggml-rpc next to it ($GGML_RPC_CLI overrides).
# Exit status: 0 pass, 1 fail, 2 harness error (a missing peer is an error, never a skip).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

model="" n=16 logdir="$CONF_OUT/tls"
while [ $# -gt 0 ]; do
    case "$1" in
        --model) model=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --logdir) logdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

conf_select_peer b11434
conf_check_peer
[ -x "$PEER_BIN/llama-completion" ] || conf_die "$PEER_BIN/llama-completion missing"
if [ -z "$model" ]; then
    py=$(conf_python)
    "$py" "$CONF_DIR/make-models.py" --out "$CONF_OUT/models" --preset tiny --types f32 >&2 \
        || conf_die "make-models.py failed"
    model="$CONF_OUT/models/tiny-llama-f32.gguf"
fi
if [ -z "${GGML_RPC_OUR_SERVER:-}" ] && [ "${CONFORMANCE_REBUILD:-1}" = 1 ]; then
    conf_log "building: cargo build --release -p ggml-rpc-server -p ggml-rpc-cli"
    (cd "$REPO_ROOT" && cargo build --release -p ggml-rpc-server -p ggml-rpc-cli) || conf_die "cargo build failed"
fi
server=$OUR_SERVER
cli=${GGML_RPC_CLI:-$(dirname "$OUR_SERVER")/ggml-rpc}
[ -x "$server" ] && [ -x "$cli" ] || conf_die "$server or $cli missing"

rm -rf "$logdir"; mkdir -p "$logdir"
certs="$logdir/certs" other="$logdir/other-ca"
"$REPO_ROOT/scripts/tls/make-certs.sh" "$certs" >&2
CA_NAME="another CA" "$REPO_ROOT/scripts/tls/make-certs.sh" "$other" >&2

pids=()
# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() { for p in "${pids[@]}"; do conf_kill "$p"; done; }
trap cleanup EXIT

# start_tunnel NAME CERTDIR PORT: a tunnel to 127.0.0.1:PORT with CERTDIR's client identity
# (trusting $certs's CA); sets TUNNEL_PORT.
start_tunnel() {
    local name=$1 dir=$2 to=$3
    "$cli" tunnel --listen 127.0.0.1:0 --connect "127.0.0.1:$to" --server-name localhost \
        --tls-cert "$dir/client.crt" --tls-key "$dir/client.key" --tls-ca "$certs/ca.crt" \
        >"$logdir/$name.out" 2>"$logdir/$name.log" </dev/null &
    pids+=($!)
    TUNNEL_PORT=""
    for _ in $(seq 1 100); do
        TUNNEL_PORT=$(sed -n 's/^tunnel listening on 127\.0\.0\.1://p' "$logdir/$name.out" 2>/dev/null || true)
        [ -n "$TUNNEL_PORT" ] && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    conf_die "tunnel $name did not start, see $logdir/$name.log"
}

# complete NAME ENDPOINT: llama-completion through ENDPOINT; its text in NAME.txt; returns its status.
complete() {
    GGML_NO_BACKTRACE=1 timeout 300 "$PEER_BIN/llama-completion" -m "$model" -p "Once upon a time" \
        -n "$n" --temp 0 --top-k 1 --seed 1 -no-cnv -c 256 -t 2 --no-warmup --no-repack \
        --rpc "$2" -ngl 99 </dev/null >"$logdir/$1.txt" 2>"$logdir/$1.log"
}

plain_port=$(conf_free_port)
"$server" --protocol 7 -p "$plain_port" >"$logdir/server-plain.log" 2>&1 </dev/null &
pids+=($!)
conf_wait_port "$plain_port" "${pids[-1]}" || conf_die "plain server did not start, see $logdir/server-plain.log"
tls_port=$(conf_free_port)
"$server" --protocol 7 -p "$tls_port" --tls-cert "$certs/server.crt" --tls-key "$certs/server.key" \
    --tls-client-ca "$certs/ca.crt" >"$logdir/server-tls.log" 2>&1 </dev/null &
pids+=($!)
conf_wait_port "$tls_port" "${pids[-1]}" || conf_die "TLS server did not start, see $logdir/server-tls.log"
start_tunnel tunnel "$certs" "$tls_port"
tunnel_port=$TUNNEL_PORT

status=0
fail() { conf_log "FAIL: $*"; status=1; }

# conf_wait_port's probe was refused (it connects and closes): count from here.
refused_before=$(grep -c "TLS handshake failed" "$logdir/server-tls.log" || true)
conf_log "llama-completion over plain TCP (127.0.0.1:$plain_port)"
complete plain "127.0.0.1:$plain_port" || fail "llama-completion over plain TCP failed (see $logdir/plain.log)"
conf_log "llama-completion through the tunnel (127.0.0.1:$tunnel_port -> TLS 127.0.0.1:$tls_port)"
complete tls "127.0.0.1:$tunnel_port" || fail "llama-completion through the tunnel failed (see $logdir/tls.log)"
grep -q "total time =" "$logdir/tls.log" || fail "the run through the tunnel did not finish (see $logdir/tls.log)"
if [ ! -s "$logdir/tls.txt" ]; then
    fail "no text through the tunnel"
elif ! cmp -s "$logdir/plain.txt" "$logdir/tls.txt"; then
    fail "texts differ: $(diff "$logdir/plain.txt" "$logdir/tls.txt" | head -5)"
else
    conf_log "identical text over TLS and plain TCP: $(tr '\n' ' ' <"$logdir/tls.txt" | head -c 120)"
fi
grep -q "Accepted client connection" "$logdir/server-tls.log" || fail "the TLS server never saw a client"
if [ "$(grep -c "TLS handshake failed" "$logdir/server-tls.log" || true)" != "$refused_before" ]; then
    fail "a handshake of the good tunnel was refused (see $logdir/server-tls.log)"
fi

# Token ids and logits too: e2e.sh's llama_probe (through its RPC shim) and llama-completion,
# CPU only against "ours" = the tunnel, identical ids and text required.
conf_log "e2e.sh --strict through the tunnel (token ids against CPU only)"
bash "$CONF_DIR/e2e.sh" --peers b11434 --targets cpu,ours --endpoint "127.0.0.1:$tunnel_port" \
    --models "$model" --fa off -n "$n" --strict --logdir "$logdir/e2e" \
    || fail "e2e.sh through the tunnel failed (see $logdir/e2e)"

conf_log "negative: a tunnel whose certificate another CA signed"
start_tunnel stranger "$other" "$tls_port"
if (complete stranger "127.0.0.1:$TUNNEL_PORT") 2>/dev/null; then fail "llama-completion succeeded through an untrusted tunnel"; fi
conf_log "negative: llama-completion straight at the TLS port (no TLS)"
if (complete direct "127.0.0.1:$tls_port") 2>/dev/null; then fail "llama-completion succeeded without TLS"; fi
refusals=$(grep -c "TLS handshake failed" "$logdir/server-tls.log" || true)
[ $((refusals - refused_before)) -ge 2 ] || fail "expected 2 more refused handshakes in the server log, found $((refusals - refused_before))"
grep -q "invalid peer certificate: UnknownIssuer" "$logdir/server-tls.log" \
    || fail "the untrusted certificate's refusal does not name UnknownIssuer"
served=$(grep -c "Client connection closed" "$logdir/server-tls.log" || true)
accepted_ok=$(grep -c "Accepted client connection" "$logdir/server-tls.log" || true)
# Every accepted connection is either served (closed ...) or refused in the handshake.
[ $((served + refusals)) -eq "$accepted_ok" ] || fail "accepted $accepted_ok, served $served, refused $refusals"

if [ "$status" = 0 ]; then
    printf 'TLS end-to-end (b11434 llama-completion, %s, -n %s): PASS, identical text through the tunnel, %s refused handshakes\n' \
        "$(basename "$model")" "$n" "$((refusals - refused_before))"
else
    printf 'TLS end-to-end: FAIL, logs in %s\n' "$logdir"
fi
exit "$status"
