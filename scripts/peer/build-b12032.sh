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
# shellcheck disable=SC2034  # read by lib.sh (peer_ninja_build)
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

peer_begin
peer_build_tools
command -v patch >/dev/null || peer_die "patch not found (apt-get install -y patch)"

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
# The tree has no tests/, examples/ or app/, so those are off (the server also needs tools/ui,
# which is absent).
BUILD="$WORK/build"
peer_configure "$SRC" "$BUILD" -DGGML_RPC_RDMA=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
grep -q 'RDMA transport enabled' "$WORK/configure.log" \
    || { grep -i rdma "$WORK/configure.log" >&2 || true; peer_die "configure did not enable the RDMA transport"; }
peer_log "RDMA transport enabled"

# --- build only what we need ----------------------------------------------
peer_ninja_build "$BUILD" "${REQUIRED_BINS[@]}" "${LIBS[@]}"
peer_install "$BUILD" "$SRC" "${REQUIRED_BINS[@]}"
for t in "${REQUIRED_BINS[@]}"; do
    [ -f "$DEST/bin/$t" ] || peer_die "$BUILD/bin/$t not produced"
done
env -u LD_LIBRARY_PATH ldd "$DEST"/lib/libggml-rpc.so | grep -q 'libibverbs' \
    || peer_die "libggml-rpc.so is not linked against libibverbs (RDMA not built in)"

# --- smoke test: the tools start, HELLO answers exactly 8.0.1 ------------------
for b in llama-bench llama-completion; do
    "$DEST/bin/$b" --help > "$WORK/smoke-$b.log" 2>&1 \
        || { tail -20 "$WORK/smoke-$b.log" >&2; peer_die "$b --help failed"; }
done
peer_smoke_hello --expect-version "$EXPECT_VERSION"
grep -q 'RDMA auto-negotiate enabled' "$WORK/smoke-server.log" \
    || { cat "$WORK/smoke-server.log" >&2; peer_die "ggml-rpc-server does not report the RDMA transport"; }
peer_finish
