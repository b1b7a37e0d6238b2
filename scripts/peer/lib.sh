# Shared helpers for the peer install scripts. Source it; do not run it.
# shellcheck shell=bash

PEER_SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEER_ROOT="${GGML_RPC_PEER_CACHE:-/var/cache/ggml-rpc-peer}"

peer_log() { printf '[%s %s] %s\n' "$(basename "$0")" "$(date +%H:%M:%S)" "$*" >&2; }
peer_die() { printf '[%s] ERROR: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

# peer_lock NAME: take an exclusive flock on $PEER_ROOT/.NAME.lock (fd 9) for the
# rest of the script. A second caller waits (up to GGML_RPC_PEER_LOCK_WAIT s).
peer_lock() {
    local name=$1 wait=${GGML_RPC_PEER_LOCK_WAIT:-7200}
    command -v flock >/dev/null || peer_die "flock not found (package util-linux)"
    mkdir -p "$PEER_ROOT" || peer_die "cannot create cache root $PEER_ROOT"
    exec 9>"$PEER_ROOT/.$name.lock"
    if ! flock -n 9; then
        peer_log "another install of $name is running; waiting for its lock (up to ${wait}s)"
        flock -w "$wait" 9 || peer_die "timed out waiting for $PEER_ROOT/.$name.lock"
    fi
}

# peer_free_port: print a TCP port that is free on 127.0.0.1 right now.
peer_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# peer_kill PID: stop a server we started (TERM, then KILL), ignore if gone.
peer_kill() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
