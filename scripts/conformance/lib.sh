# Shared helpers for scripts/conformance/*.sh. Source it; do not run it.
# shellcheck shell=bash

CONF_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$CONF_DIR/../.." && pwd)"
PEER_ROOT="${GGML_RPC_PEER_CACHE:-/var/cache/ggml-rpc-peer}"
PEER="$PEER_ROOT/b11434"
PEER_BIN="$PEER/bin"
PEER_LIB="$PEER/lib"
PEER_INCLUDE="$PEER/include"
PEER_SRC="$PEER/src"
PEER_TAG=b11434
# where conf_build_tools puts the C helpers built against the selected peer
PEER_BUILD_SUBDIR=""
# build outputs and logs (git-ignored)
CONF_OUT="${CONFORMANCE_OUT:-$REPO_ROOT/target/conformance}"
# cargo puts the binary under $CARGO_TARGET_DIR when that is set
OUR_SERVER="${GGML_RPC_OUR_SERVER:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/ggml-rpc-server}"

conf_log() { printf '[%s %s] %s\n' "$(basename "$0")" "$(date +%H:%M:%S)" "$*" >&2; }
conf_die() { printf '[%s] ERROR: %s\n' "$(basename "$0")" "$*" >&2; exit 2; }

# conf_select_peer TAG: point PEER* at another llama.cpp peer that has bin/, lib/ and include/
# (b11434, the default, or b12032). The C helpers built against it go to
# $CONF_OUT/build (b11434) or $CONF_OUT/build/TAG (any other peer).
conf_select_peer() {
    PEER_TAG=$1
    PEER="$PEER_ROOT/$PEER_TAG"
    PEER_BIN="$PEER/bin"
    PEER_LIB="$PEER/lib"
    PEER_INCLUDE="$PEER/include"
    # shellcheck disable=SC2034  # for the scripts that source this file
    PEER_SRC="$PEER/src"
    if [ "$PEER_TAG" = b11434 ]; then PEER_BUILD_SUBDIR=""; else PEER_BUILD_SUBDIR="/$PEER_TAG"; fi
}

# conf_peer_script TAG: the script that installs peer TAG.
conf_peer_script() {
    case "$1" in
        b11434) echo scripts/peer/build-b11434.sh ;;
        b11739) echo scripts/peer/setup-b11739.sh ;;
        b12032) echo scripts/peer/build-b12032.sh ;;
        *) echo "scripts/peer/ (no script for $1)" ;;
    esac
}

conf_check_peer() {
    [ -x "$PEER_BIN/ggml-rpc-server" ] && [ -f "$PEER/.complete" ] \
        || conf_die "llama.cpp $PEER_TAG not found under $PEER (run $(conf_peer_script "$PEER_TAG") or set GGML_RPC_PEER_CACHE)"
}

# conf_build_our_server: bring target/release/ggml-rpc-server up to date (cargo is a no-op
# when it is; CONFORMANCE_REBUILD=0 skips cargo when the binary exists), then
# point OUR_SERVER at a content-addressed snapshot copy in $CONF_OUT/build, so that a
# rebuild in the shared target dir during a long run cannot swap the binary under a server
# restart. Snapshots older than a day are removed.
conf_build_our_server() {
    if [ ! -x "$OUR_SERVER" ] || [ "${CONFORMANCE_REBUILD:-1}" = 1 ]; then
        conf_log "building our server: cargo build --release -p ggml-rpc-server"
        (cd "$REPO_ROOT" && cargo build --release -p ggml-rpc-server) || conf_die "cargo build failed"
        [ -x "$OUR_SERVER" ] || conf_die "$OUR_SERVER missing after the build"
    fi
    local build="$CONF_OUT/build" sum snap
    mkdir -p "$build"
    sum=$(sha256sum "$OUR_SERVER" | cut -c1-12)
    snap="$build/ggml-rpc-server-$sum"
    find "$build" -maxdepth 1 -name 'ggml-rpc-server-*' -mtime +1 -delete 2>/dev/null || true
    if [ ! -x "$snap" ]; then
        cp "$OUR_SERVER" "$snap.tmp.$$" && mv "$snap.tmp.$$" "$snap" || conf_die "cannot copy $OUR_SERVER"
    fi
    OUR_SERVER_DESC="$OUR_SERVER mtime $(date -u -r "$OUR_SERVER" '+%F %T')Z sha256:$sum"
    [ "$snap" -ef "$OUR_SERVER" ] || touch "$snap"
    conf_log "our server: $OUR_SERVER_DESC, run from $snap"
    OUR_SERVER="$snap"
}

# conf_build_membw: build the memory read bandwidth probe (backend-cpu's example `membw`, the
# roofline of the bench tables) and set MEMBW to it.
conf_build_membw() {
    MEMBW="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/examples/membw"
    if [ ! -x "$MEMBW" ] || [ "${CONFORMANCE_REBUILD:-1}" = 1 ]; then
        (cd "$REPO_ROOT" && cargo build --release -p backend-cpu --example membw) \
            || conf_die "cargo build of the membw probe failed"
    fi
}

conf_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# conf_wait_port PORT PID: wait until 127.0.0.1:PORT accepts connections (30 s) while PID lives.
conf_wait_port() {
    local port=$1 pid=$2
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || return 1
        if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$port),timeout=1).close()" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# conf_kill PID: stop a process we started (TERM, then KILL), ignore if gone.
conf_kill() {
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

# conf_build_tools: build the C helpers from tests/conformance into $CONF_OUT/build
# (b11434) or $CONF_OUT/build/TAG (other peers, see conf_select_peer), only when a source
# or the peer's libllama is newer than its output. Sets SHIM, LIST_SHIM, PROBE.
conf_build_tools() {
    local build="$CONF_OUT/build$PEER_BUILD_SUBDIR" src="$REPO_ROOT/tests/conformance" cc=${CC:-cc}
    mkdir -p "$build"
    SHIM="$build/librpc_shim.so"
    LIST_SHIM="$build/liblist_shim.so"
    PROBE="$build/llama_probe"
    if [ ! -f "$SHIM" ] || [ "$src/rpc_shim.c" -nt "$SHIM" ] || [ "$PEER_LIB/libggml-rpc.so" -nt "$SHIM" ]; then
        conf_log "building $SHIM"
        $cc -shared -fPIC -O2 -Wall -Wextra -o "$SHIM" "$src/rpc_shim.c" -I"$PEER_INCLUDE" \
            -L"$PEER_LIB" -lggml-rpc -lggml -lggml-base -Wl,-rpath,"$PEER_LIB" \
            || conf_die "building the RPC shim failed"
    fi
    if [ ! -f "$LIST_SHIM" ] || [ "$src/list_shim.c" -nt "$LIST_SHIM" ]; then
        conf_log "building $LIST_SHIM"
        $cc -shared -fPIC -O2 -Wall -Wextra -o "$LIST_SHIM" "$src/list_shim.c" -I"$PEER_INCLUDE" \
            || conf_die "building the list shim failed"
    fi
    if [ ! -f "$PROBE" ] || [ "$src/llama_probe.c" -nt "$PROBE" ] || [ "$PEER_LIB/libllama.so" -nt "$PROBE" ]; then
        conf_log "building $PROBE"
        $cc -O2 -Wall -Wextra -o "$PROBE" "$src/llama_probe.c" -I"$PEER_INCLUDE" \
            -L"$PEER_LIB" -lllama -lggml -lggml-base -Wl,-rpath,"$PEER_LIB" \
            || conf_die "building llama_probe failed"
    fi
}

# conf_python: print a python that has numpy and pyyaml (for make-models.py). Uses
# $CONFORMANCE_PYTHON if set, the system python3 if it has both, else a venv in
# $CONF_OUT/venv that it creates with pip (numpy, pyyaml) on first use.
conf_python() {
    if [ -n "${CONFORMANCE_PYTHON:-}" ]; then echo "$CONFORMANCE_PYTHON"; return 0; fi
    if python3 -c 'import numpy, yaml' 2>/dev/null; then command -v python3; return 0; fi
    local venv="$CONF_OUT/venv"
    if ! "$venv/bin/python" -c 'import numpy, yaml' 2>/dev/null; then
        conf_log "creating $venv (numpy, pyyaml)"
        python3 -m venv "$venv" >&2 || conf_die "python3 -m venv failed"
        "$venv/bin/pip" install -q numpy pyyaml >&2 || conf_die "pip install numpy pyyaml failed"
    fi
    echo "$venv/bin/python"
}
