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
    fma:GGML_FMA f16c:GGML_F16C avx512f:GGML_AVX512 avx512vbmi:GGML_AVX512_VBMI
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

# --- the steps every from-source peer build shares ---------------------------------------
# Callers set TAG, DEST and JOBS and define print_summary before calling peer_begin.

# peer_begin: exits 0 (after print_summary) when $DEST holds a build for this CPU; otherwise
# takes the install lock, drops a build made for other extensions and sets t_start and WORK.
peer_begin() {
    local reason
    for reason in "" " (by a concurrent run)"; do
        if [ -f "$DEST/.complete" ] && peer_built_for_this_cpu "$DEST"; then
            peer_log "already installed$reason: $DEST ($(cat "$DEST/cpu-features"))"
            print_summary
            exit 0
        fi
        [ -n "$reason" ] || peer_lock "$TAG"
    done
    if [ -f "$DEST/.complete" ]; then
        peer_log "cached build was made for other CPU extensions ($(cat "$DEST/cpu-features" 2>/dev/null || echo unknown)); rebuilding for: $(peer_cpu_features)"
        rm -f "$DEST/.complete"
    fi
    t_start=$(date +%s)
    WORK="$DEST/work"
    mkdir -p "$WORK"
}

# peer_build_tools: cmake and ninja on PATH (from PyPI into the cache when the system has
# none) and a C++ compiler.
peer_build_tools() {
    local venv="$PEER_ROOT/.buildtools"
    if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
        if [ ! -x "$venv/bin/cmake" ] || [ ! -x "$venv/bin/ninja" ]; then
            peer_log "installing cmake and ninja from PyPI into $venv"
            python3 -m venv "$venv" || peer_die "python3 -m venv failed"
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
                "cmake>=3.28,<5" "ninja>=1.11" || peer_die "pip install cmake ninja failed"
        fi
        export PATH="$venv/bin:$PATH"
    fi
    command -v cmake >/dev/null || peer_die "cmake still not on PATH"
    command -v ninja >/dev/null || peer_die "ninja still not on PATH"
    command -v c++ >/dev/null || command -v g++ >/dev/null || peer_die "no C++ compiler (apt-get install -y build-essential)"
    peer_log "cmake: $(cmake --version | head -1); ninja: $(ninja --version)"
}

# peer_configure SRC BUILD CMAKE_ARG...: a Release, shared-library, Ninja configure with RPC
# on, RUNPATH $ORIGIN/../lib, and every extension this CPU reports, as GGML_NATIVE would pick,
# but never AMX (advertised by some CI CPUs, then faulting with SIGILL): peer_isa_cmake_args.
peer_configure() {
    local src=$1 build=$2 t0
    shift 2
    t0=$(date +%s)
    # shellcheck disable=SC2046,SC2016  # word-split ISA args; $ORIGIN is literal
    cmake -S "$src" -B "$build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON \
        -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
        '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN' \
        -DGGML_RPC=ON \
        -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_SERVER=OFF \
        "$@" \
        $(peer_isa_cmake_args) \
        > "$WORK/configure.log" 2>&1 \
        || { tail -40 "$WORK/configure.log" >&2; peer_die "cmake configure failed (log: $WORK/configure.log)"; }
    peer_log "configured in $(( $(date +%s) - t0 ))s for CPU extensions: $(peer_cpu_features)"
}

# peer_ninja_build BUILD TARGET...: builds exactly these targets with -j$JOBS; each must exist.
peer_ninja_build() {
    local build=$1 t t0
    shift
    peer_list_targets "$build"
    for t in "$@"; do
        peer_has_target "$t" || peer_die "ninja target $t missing in this build"
    done
    t0=$(date +%s)
    peer_log "building $* with -j$JOBS (several minutes on 2 cores; log: $WORK/build.log)"
    ninja -C "$build" -j "$JOBS" "$@" > "$WORK/build.log" 2>&1 \
        || { tail -40 "$WORK/build.log" >&2; peer_die "ninja build failed (log: $WORK/build.log)"; }
    peer_log "built in $(( $(date +%s) - t0 ))s"
}

# peer_list_targets BUILD, then peer_has_target NAME: whether the configured tree has a target.
peer_list_targets() { ninja -C "$1" -t targets all > "$WORK/targets.txt"; }
peer_has_target() { grep -q "^$1: " "$WORK/targets.txt"; }

# peer_install BUILD SRC BIN...: bin/ (the executables that were built), lib/ (every shared
# library, symlinks kept) and include/ under $DEST; every binary must find its libraries
# through its RUNPATH alone. Writes $DEST/env.sh exporting LLAMA_<TAG>_{DIR,BIN,LIB,INCLUDE,SRC}.
peer_install() {
    local build=$1 src=$2 t b var
    shift 2
    rm -rf "${DEST:?}/bin" "${DEST:?}/lib" "${DEST:?}/include"
    mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/include"
    for t in "$@"; do
        if [ -f "$build/bin/$t" ]; then cp -a "$build/bin/$t" "$DEST/bin/"; fi
    done
    # shared libraries land in build/bin (CMAKE_LIBRARY_OUTPUT_DIRECTORY)
    find "$build/bin" -maxdepth 1 -name 'lib*.so*' -exec cp -a {} "$DEST/lib/" \;
    ls "$DEST"/lib/libggml-rpc.so* >/dev/null 2>&1 || peer_die "libggml-rpc.so not produced"
    cp -a "$src"/ggml/include/*.h "$src"/include/*.h "$DEST/include/"
    for b in "$DEST"/bin/*; do
        if env -u LD_LIBRARY_PATH ldd "$b" | grep -q 'not found'; then
            env -u LD_LIBRARY_PATH ldd "$b" >&2
            peer_die "$b has unresolved shared libraries"
        fi
    done
    var="LLAMA_$(echo "$TAG" | tr '[:lower:]' '[:upper:]')"
    cat > "$DEST/env.sh" <<ENV
# generated by scripts/peer/$(basename "$0")
export ${var}_DIR="$DEST"
export ${var}_BIN="$DEST/bin"
export ${var}_LIB="$DEST/lib"
export ${var}_INCLUDE="$DEST/include"
export ${var}_SRC="$DEST/src"
ENV
}

# peer_smoke_hello RPC_HELLO_ARGS...: starts $DEST/bin/ggml-rpc-server on a free port and
# requires rpc_hello.py with these arguments (e.g. --expect-major 7) to pass; leaves the
# server log in $WORK/smoke-server.log and prints rpc_hello's line.
peer_smoke_hello() {
    local port pid out
    port=$(peer_free_port)
    "$DEST/bin/ggml-rpc-server" --host 127.0.0.1 --port "$port" > "$WORK/smoke-server.log" 2>&1 &
    pid=$!
    if ! out=$(python3 "$PEER_SCRIPT_DIR/rpc_hello.py" 127.0.0.1 "$port" "$@" --wait 30); then
        peer_kill "$pid"
        cat "$WORK/smoke-server.log" >&2
        peer_die "$TAG ggml-rpc-server did not answer HELLO as expected ($*)"
    fi
    peer_kill "$pid"
    peer_log "smoke test ok on port $port: $out"
}

# peer_finish: records the CPU extensions and the completion marker, prints the summary.
peer_finish() {
    peer_cpu_features > "$DEST/cpu-features"
    date -u +%Y-%m-%dT%H:%M:%SZ > "$DEST/.complete"
    peer_log "installed $TAG in $(( $(date +%s) - t_start ))s: $DEST"
    ls "$DEST/bin" >&2
    print_summary
}
