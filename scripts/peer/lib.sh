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

# The x86 ISA extensions ggml can use, as "cpuinfo-flag:GGML_OPTION" pairs. AMX is never
# enabled: some CI CPUs advertise it and then fault.
PEER_ISA_OPTIONS=(
    sse4_2:GGML_SSE42 avx:GGML_AVX avx_vnni:GGML_AVX_VNNI avx2:GGML_AVX2 bmi2:GGML_BMI2
    fma:GGML_FMA f16c:GGML_F16C avx512f:GGML_AVX512 avx512_vbmi:GGML_AVX512_VBMI
    avx512_vnni:GGML_AVX512_VNNI avx512_bf16:GGML_AVX512_BF16
)

# peer_cpu_features: the extensions of PEER_ISA_OPTIONS this CPU reports (what GGML_NATIVE
# would pick, less AMX), one line, in table order. Recorded with each built peer
# ($DEST/cpu-features) so benchmarks can print what they compare against, and so a cache built
# on another CPU is rebuilt instead of dying with SIGILL.
peer_cpu_features() {
    local flags pair out=()
    flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    for pair in "${PEER_ISA_OPTIONS[@]}"; do
        case "$flags" in *" ${pair%%:*} "*) out+=("${pair%%:*}") ;; esac
    done
    echo "${out[*]}"
}

# peer_isa_cmake_args: -DGGML_...=ON|OFF for every option of PEER_ISA_OPTIONS, as this CPU
# reports, with GGML_NATIVE and AMX off.
peer_isa_cmake_args() {
    local features pair args=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    features=" $(peer_cpu_features) "
    for pair in "${PEER_ISA_OPTIONS[@]}"; do
        case "$features" in
            *" ${pair%%:*} "*) args+=("-D${pair#*:}=ON") ;;
            *) args+=("-D${pair#*:}=OFF") ;;
        esac
    done
    echo "${args[*]}"
}

# peer_built_for_this_cpu DEST: whether DEST was built for the extensions this CPU has.
peer_built_for_this_cpu() {
    [ -f "$1/cpu-features" ] && [ "$(cat "$1/cpu-features")" = "$(peer_cpu_features)" ]
}
