#!/usr/bin/env bash
# Build and install the llama.cpp b12032+1 peer (ggml RPC protocol 8.0.1, commit 785322d17f) with
# the multi-rank COMM_INIT change (seed 003) and the Linux RDMA transport compiled in, into
#   ${GGML_RPC_PEER_CACHE:-/var/cache/ggml-rpc-peer}/b12032/
# The source is the llama.cpp tree vendored by the crates.io package llama-cpp-sys-4 0.11.0.
# Idempotent: exits at once when .complete exists and the build was made for this CPU's
# extensions ($DEST/cpu-features). See scripts/peer/README.md.
set -euo pipefail

# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

TAG=b12032
CRATE=llama-cpp-sys-4
CRATE_VERSION=0.11.0
# sha256 of the .crate file; equals the "cksum" of 0.11.0 in the crates.io index
# (https://index.crates.io/ll/am/llama-cpp-sys-4), which cargo checks too.
CRATE_SHA256=814738cddce0c910aa0f5192fd9d3e2ff7e447453e66326dd2f5df7f1375aea3
CRATE_URL="https://static.crates.io/crates/$CRATE/$CRATE-$CRATE_VERSION.crate"
EXPECT_VERSION=8.0.1
DEST="$PEER_ROOT/$TAG"
JOBS="${GGML_RPC_PEER_JOBS:-2}"
REPO_DIR="$(cd "$PEER_SCRIPT_DIR/../.." && pwd)"
# executables wanted in bin/ (all required). No test-backend-ops: the package has no tests/ and
# the file of commit 785322d17f could not be obtained and verified (README.md).
REQUIRED_BINS=(ggml-rpc-server llama-bench llama-completion)
LIBS=(ggml ggml-base ggml-cpu ggml-rpc llama llama-common)

print_summary() {
    cat <<EOF
LLAMA_B12032_DIR=$DEST
LLAMA_B12032_BIN=$DEST/bin
LLAMA_B12032_LIB=$DEST/lib
LLAMA_B12032_INCLUDE=$DEST/include
LLAMA_B12032_SRC=$DEST/src
# source $DEST/env.sh
EOF
}

# seed_diff: the multi-rank COMM_INIT diff (seed 003 with its whitespace restored). It lives in
# the team's shared folder next to the repository, not in the repository.
seed_diff() {
    local cand
    for cand in "${GGML_RPC_PEER_SEED_003:-}" \
                "$REPO_DIR/shared/seeds/003-restored.diff" \
                "$REPO_DIR/../shared/seeds/003-restored.diff" \
                /work/shared/seeds/003-restored.diff; do
        if [ -n "$cand" ] && [ -f "$cand" ]; then echo "$cand"; return 0; fi
    done
    return 1
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
command -v patch >/dev/null || peer_die "patch not found (apt-get install -y patch)"
peer_log "cmake: $(cmake --version | head -1); ninja: $(ninja --version)"

# --- RDMA: GGML_RPC_RDMA=ON needs libibverbs (library + <infiniband/verbs.h>) -------------
# ggml/src/ggml-rpc/CMakeLists.txt does find_library(ibverbs REQUIRED) and transport.cpp
# includes <infiniband/verbs.h>. Debian: libibverbs-dev (pulls libibverbs1, ibverbs-providers).
have_ibverbs() {
    [ -f /usr/include/infiniband/verbs.h ] && ldconfig -p | grep -q 'libibverbs\.so '
}
if ! have_ibverbs; then
    t0=$(date +%s)
    peer_log "installing libibverbs-dev with apt-get (for GGML_RPC_RDMA=ON)"
    command -v apt-get >/dev/null || peer_die "libibverbs-dev missing and no apt-get to install it"
    apt-get update -qq >"$WORK/apt.log" 2>&1 || { tail -20 "$WORK/apt.log" >&2; peer_die "apt-get update failed"; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs-dev >>"$WORK/apt.log" 2>&1 \
        || { tail -20 "$WORK/apt.log" >&2; peer_die "apt-get install libibverbs-dev failed"; }
    have_ibverbs || peer_die "libibverbs-dev installed but verbs.h / libibverbs.so still missing"
    peer_log "libibverbs-dev installed ($(( $(date +%s) - t0 ))s)"
fi

# --- source ----------------------------------------------------------------
SRC="$DEST/src"
if [ ! -f "$SRC/.extracted" ]; then
    t0=$(date +%s)
    SEED=$(seed_diff) || peer_die "seed diff 003-restored.diff not found (looked in \$GGML_RPC_PEER_SEED_003, $REPO_DIR/shared/seeds, $REPO_DIR/../shared/seeds, /work/shared/seeds)"
    rm -rf "$SRC" "$WORK/crate" "$WORK/extract"
    mkdir -p "$WORK/crate" "$WORK/extract"
    crate_file="$WORK/crate/$CRATE-$CRATE_VERSION.crate"
    peer_log "downloading $CRATE $CRATE_VERSION from crates.io"
    if ! curl -fsSL --retry 3 -o "$crate_file" "$CRATE_URL"; then
        # fallback: let cargo fetch it (same checksum, taken from the index) into a scratch project
        peer_log "curl $CRATE_URL failed; trying cargo fetch"
        command -v cargo >/dev/null || peer_die "cannot download $CRATE_URL and no cargo"
        mkdir -p "$WORK/crate/scratch/src"
        printf '[package]\nname = "peer-fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\n%s = "=%s"\n' \
            "$CRATE" "$CRATE_VERSION" > "$WORK/crate/scratch/Cargo.toml"
        : > "$WORK/crate/scratch/src/lib.rs"
        (cd "$WORK/crate/scratch" && cargo fetch --quiet) || peer_die "cargo fetch $CRATE $CRATE_VERSION failed"
        cached=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/cache" -name "$CRATE-$CRATE_VERSION.crate" | head -1)
        [ -n "$cached" ] || peer_die "cargo fetch did not leave $CRATE-$CRATE_VERSION.crate in the registry cache"
        cp "$cached" "$crate_file"
    fi
    echo "$CRATE_SHA256  $crate_file" | sha256sum -c --quiet - \
        || peer_die "sha256 of $crate_file is not $CRATE_SHA256"
    tar xzf "$crate_file" --no-same-owner -C "$WORK/extract" || peer_die "cannot extract $crate_file"
    top="$WORK/extract/$CRATE-$CRATE_VERSION/llama.cpp"
    [ -f "$top/CMakeLists.txt" ] && [ -f "$top/ggml/include/ggml-rpc.h" ] \
        || peer_die "llama.cpp source (CMakeLists.txt + ggml/include/ggml-rpc.h) not found in $crate_file"
    grep -q '785322d17f (b12032+1' "$WORK/extract/$CRATE-$CRATE_VERSION/README.md" \
        || peer_die "$CRATE $CRATE_VERSION README does not name llama.cpp 785322d17f (b12032+1)"
    h="$top/ggml/include/ggml-rpc.h"
    if ! grep -q 'RPC_PROTO_MAJOR_VERSION *8$' "$h" || ! grep -q 'RPC_PROTO_MINOR_VERSION *0$' "$h" \
            || ! grep -q 'RPC_PROTO_PATCH_VERSION *1$' "$h"; then
        peer_die "unexpected RPC protocol version in $h (want $EXPECT_VERSION)"
    fi
    peer_log "applying $SEED (multi-rank COMM_INIT)"
    (cd "$top" && patch -p1 --forward --no-backup-if-mismatch < "$SEED") > "$WORK/patch.log" 2>&1 \
        || { cat "$WORK/patch.log" >&2; peer_die "patch -p1 < $SEED failed"; }
    if grep -q -i -E 'offset|fuzz|hunk .* failed' "$WORK/patch.log"; then
        cat "$WORK/patch.log" >&2
        peer_die "$SEED did not apply exactly (offset/fuzz); is this the b12032+1 tree?"
    fi
    cp "$SEED" "$WORK/003-restored.diff"
    mv "$top" "$SRC"
    rm -rf "$WORK/extract" "$WORK/crate"
    touch "$SRC/.extracted"
    peer_log "source ready in $SRC ($(( $(date +%s) - t0 ))s)"
fi

# --- configure -------------------------------------------------------------
BUILD="$WORK/build"
t0=$(date +%s)
# Every extension this CPU reports, as GGML_NATIVE would pick, but never AMX (advertised by
# some CI CPUs, then faulting with SIGILL): see peer_isa_cmake_args. The tree has no tests/,
# examples/ or app/, so those are off (the server also needs tools/ui, which is absent).
# shellcheck disable=SC2046,SC2016  # word-split ISA args; $ORIGIN is literal
cmake -S "$SRC" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN' \
    -DGGML_RPC=ON \
    -DGGML_RPC_RDMA=ON \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF \
    $(peer_isa_cmake_args) \
    > "$WORK/configure.log" 2>&1 \
    || { tail -40 "$WORK/configure.log" >&2; peer_die "cmake configure failed (log: $WORK/configure.log)"; }
grep -q 'RDMA transport enabled' "$WORK/configure.log" \
    || { grep -i rdma "$WORK/configure.log" >&2 || true; peer_die "configure did not enable the RDMA transport"; }
peer_log "configured in $(( $(date +%s) - t0 ))s (RDMA on) for CPU extensions: $(peer_cpu_features)"

# --- build only what we need ----------------------------------------------
ninja -C "$BUILD" -t targets all > "$WORK/targets.txt"
has_target() { grep -q "^$1: " "$WORK/targets.txt"; }
targets=()
for t in "${REQUIRED_BINS[@]}" "${LIBS[@]}"; do
    has_target "$t" || peer_die "ninja target $t missing in this build"
    targets+=("$t")
done
t0=$(date +%s)
peer_log "building ${targets[*]} with -j$JOBS (several minutes on 2 cores; log: $WORK/build.log)"
ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; peer_die "ninja build failed (log: $WORK/build.log)"; }
peer_log "built in $(( $(date +%s) - t0 ))s"

# --- install bin/ lib/ include/ ---------------------------------------------
rm -rf "${DEST:?}/bin" "${DEST:?}/lib" "${DEST:?}/include"
mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/include"
for t in "${REQUIRED_BINS[@]}"; do
    [ -f "$BUILD/bin/$t" ] || peer_die "$BUILD/bin/$t not produced"
    cp -a "$BUILD/bin/$t" "$DEST/bin/"
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
env -u LD_LIBRARY_PATH ldd "$DEST"/lib/libggml-rpc.so | grep -q 'libibverbs' \
    || peer_die "libggml-rpc.so is not linked against libibverbs (RDMA not built in)"

cat > "$DEST/env.sh" <<EOF
# generated by scripts/peer/build-b12032.sh
export LLAMA_B12032_DIR="$DEST"
export LLAMA_B12032_BIN="$DEST/bin"
export LLAMA_B12032_LIB="$DEST/lib"
export LLAMA_B12032_INCLUDE="$DEST/include"
export LLAMA_B12032_SRC="$DEST/src"
EOF

# --- smoke test: the tools start, HELLO answers exactly 8.0.1 ------------------
for b in llama-bench llama-completion; do
    "$DEST/bin/$b" --help > "$WORK/smoke-$b.log" 2>&1 \
        || { tail -20 "$WORK/smoke-$b.log" >&2; peer_die "$b --help failed"; }
done
port=$(peer_free_port)
"$DEST/bin/ggml-rpc-server" --host 127.0.0.1 --port "$port" > "$WORK/smoke-server.log" 2>&1 &
server_pid=$!
trap 'peer_kill "${server_pid:-}"' EXIT
if ! hello_out=$(python3 "$PEER_SCRIPT_DIR/rpc_hello.py" 127.0.0.1 "$port" --expect-version "$EXPECT_VERSION" --wait 30); then
    cat "$WORK/smoke-server.log" >&2
    peer_die "b12032 ggml-rpc-server did not answer HELLO with $EXPECT_VERSION"
fi
grep -q 'RDMA auto-negotiate enabled' "$WORK/smoke-server.log" \
    || { cat "$WORK/smoke-server.log" >&2; peer_die "ggml-rpc-server does not report the RDMA transport"; }
peer_kill "$server_pid"; server_pid=""
trap - EXIT
peer_log "smoke test ok on port $port: $hello_out"

peer_cpu_features > "$DEST/cpu-features"
date -u +%Y-%m-%dT%H:%M:%SZ > "$DEST/.complete"
peer_log "installed $TAG in $(( $(date +%s) - t_start ))s: $DEST"
ls "$DEST/bin" >&2
print_summary
