#!/usr/bin/env bash
# Tensor parallelism end to end: llama.cpp b12032+1's llama-completion (the newest upstream
# client, seed 003 applied) splitting a tiny model by tensor (-sm tensor, flash attention on,
# which -sm tensor requires) across 2, 3 and 4 of our servers (--protocol 8.0.1, ranked comm
# link: every rank votes for the CPU communicator, a ring all-reduce). The greedy text must be
# identical to the same client's CPU-only run, and every server must have run COMM_ALLREDUCE
# (the reduction went through the servers, not through the client's fallback). A control run
# splits across two of b12032+1's own servers (pairwise link). Short prompts keep F32 on the
# comm wire; long ones (BF16 on the wire) are checked token by token against CPU-only with a
# rule relative to b12032+1's own pairwise link (tp_margins.py).
#
# Q4_K is not run split: b12032+1's client aborts loading it with -sm tensor (GGML_ASSERT
# "tensor write out of bounds" in ggml_backend_tensor_set_2d, with its own servers too); the
# script checks that this is still so, to notice when upstream fixes it.
#
# b11739's client (protocol 8.0.0; the peer has libllama but no llama-completion, so
# scripts/peer/b11739_generate.py drives it with ctypes inside its chroot) splits the same models
# across two of our servers with --protocol 8.0.0 (its link takes exactly two) and, as the
# control, two of b11739's own servers: the greedy token ids must equal its CPU-only run's, and
# both of ours must have run COMM_ALLREDUCE. Across 3 or 4 servers (the other --worlds) its
# client forms no server link (no COMM_INIT reaches our servers, b11739's own log no comm_init)
# and sums the partial results itself: the ids must still match, with no COMM_ALLREDUCE. Its
# client aborts loading Q4_K with -sm tensor as b12032+1's does; checked the same way.
#
# usage: scripts/conformance/tp.sh [options]
#   --worlds LIST      numbers of servers (default 2,3,4)
#   --types LIST       model types (default f32,f16,q8_0,q4_0)
#   --clients LIST     b12032 (b12032+1's llama-completion), b11739 (its libllama through
#                      scripts/peer/b11739_generate.py); default b12032,b11739
#   --testbed          run every server and the client in its own host (network namespace)
#                      of scripts/testbed/testbed.sh, links rate-limited by --rate (as root)
#   --rate R           link rate on the test bed (default 1gbit)
#   -n N               tokens to generate (default 24)
#   --logdir DIR       default target/conformance/tp
# Exit status: 0 all identical, 1 some differ, 2 harness error.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

worlds="2,3,4" types="f32,f16,q8_0,q4_0" clients="b12032,b11739" n=24 logdir="$CONF_OUT/tp" testbed=0 rate=1gbit
all_args=("$@")
while [ $# -gt 0 ]; do
    case "$1" in
        --worlds) worlds=$2; shift 2 ;;
        --types) types=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --testbed) testbed=1; shift ;;
        --rate) rate=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --logdir) logdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) conf_die "unknown option $1 (see --help)" ;;
    esac
done

has_client() { case ",$clients," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
for c in ${clients//,/ }; do
    case "$c" in b12032|b11739) ;; *) conf_die "unknown client $c (b12032, b11739)" ;; esac
done

# --testbed: run this script again inside a test bed of max(worlds) + 1 hosts (at least 3 for
# b11739's two servers); the last host runs the client (llama-completion, llama_probe,
# b11739_generate.py), hosts 1..N the servers of each run.
if [ "$testbed" = 1 ] && [ -z "${TESTBED:-}" ]; then
    [ "$(id -u)" -eq 0 ] || conf_die "--testbed needs root (network namespaces)"
    max=2
    for w in ${worlds//,/ }; do [ "$w" -gt "$max" ] && max=$w; done
    exec bash "$REPO_ROOT/scripts/testbed/testbed.sh" run --hosts $((max + 1)) --rate "$rate" \
        -- bash "$0" "${all_args[@]}"
fi
# in_client CMD...: run where the client runs (the test bed's last host, else right here)
in_client() {
    if [ -n "${TESTBED:-}" ]; then
        local ns="TESTBED_NS_$TESTBED_HOSTS"
        ip netns exec "${!ns}" "$@"
    else
        "$@"
    fi
}

# the models come from b11434's quantizers (make-models.py), as for e2e.sh
conf_select_peer b11434
conf_check_peer
models="$CONF_OUT/models"
py=$(conf_python)
"$py" "$CONF_DIR/make-models.py" --out "$models" --preset tp --types "$types" >&2 \
    || conf_die "make-models.py failed"
"$py" "$CONF_DIR/make-models.py" --out "$models" --preset tiny --types q4_k >&2 \
    || conf_die "make-models.py failed"
conf_build_our_server
mkdir -p "$logdir"
prompt=${TP_PROMPT:-"Once upon a time"}

pids=() chroot_tmp=""
cleanup() { for p in "${pids[@]}"; do conf_kill "$p"; done; pids=(); }
trap 'cleanup; [ -z "$chroot_tmp" ] || rm -rf "$chroot_tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_servers KIND COUNT: our servers (KIND=ours, protocol $OUR_PROTO) or the reference's
# ($REF_SERVER), on free loopback ports or, on the test bed, one per host on its address; logs
# $logdir/$LOG_TAG$KIND-COUNT-I.log; sets ENDPOINTS (comma-separated) and LOGS (array)
LOG_TAG=""
start_servers() {
    local kind=$1 count=$2 i host port pid log cmd
    ENDPOINTS="" LOGS=()
    for i in $(seq 1 "$count"); do
        if [ -n "${TESTBED:-}" ]; then
            host="TESTBED_ADDR_$i" port=50052
            host=${!host}
        else
            # the client uses rank 0's port + 1000 for the comm link: keep that in range
            host=127.0.0.1
            while :; do port=$(conf_free_port); [ "$port" -lt 64000 ] && break; done
        fi
        log="$logdir/$LOG_TAG$kind-$count-$i.log"
        if [ "$kind" = ours ]; then
            cmd=("$OUR_SERVER" --protocol "$OUR_PROTO" -t 1 -H "$host" --insecure-plain -p "$port" -v --comm-timeout 30)
        else
            cmd=(env GGML_RPC_NO_RDMA=1 "$REF_SERVER" -d CPU -t 1 -H "$host" -p "$port")
        fi
        if [ -n "${TESTBED:-}" ]; then
            local ns="TESTBED_NS_$i"
            ip netns exec "${!ns}" "${cmd[@]}" >"$log" 2>&1 &
        else
            "${cmd[@]}" >"$log" 2>&1 &
        fi
        pid=$!
        pids+=("$pid")
        wait_endpoint "$host" "$port" "$pid" || conf_die "$kind server $i did not start (log: $log)"
        ENDPOINTS+="${ENDPOINTS:+,}$host:$port"
        LOGS+=("$log")
    done
}

# wait_endpoint HOST PORT PID: until HOST:PORT accepts connections from the client (30 s)
wait_endpoint() {
    local host=$1 port=$2 pid=$3
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || return 1
        if in_client python3 -c "import socket; socket.create_connection(('$host', $port), timeout=1).close()" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# allreduced TAG: every one of our servers just run (LOGS) ran COMM_ALLREDUCE (and, with
# NEED_COMMUNICATOR=1, voted for its backend communicator, the ring); reports the result
allreduced() {
    local tag=$1 log missing=""
    for log in "${LOGS[@]}"; do
        grep -q "COMM_ALLREDUCE" "$log" || missing+=" $log"
        if [ "${NEED_COMMUNICATOR:-0}" = 1 ]; then
            grep -q "backend communicator" "$log" || missing+=" $log(no communicator)"
        fi
    done
    if [ -n "$missing" ]; then
        report "FAIL $tag: identical output, but no COMM_ALLREDUCE in:$missing"
        failures=$((failures + 1))
    else
        report "ok   $tag: identical to CPU-only, $(grep -c COMM_ALLREDUCE "${LOGS[0]}") all-reduces on rank 0"
    fi
}

failures=0
report() { conf_log "$*"; }

# ---- b12032+1's client: llama-completion and llama_probe, every world -----------------------
if has_client b12032; then
conf_select_peer b12032
conf_check_peer
conf_build_tools
COMPLETION="$PEER_BIN/llama-completion"
REF_SERVER="$PEER_BIN/ggml-rpc-server"
OUR_PROTO=8.0.1 NEED_COMMUNICATOR=1 LOG_TAG=""
[ -x "$COMPLETION" ] || conf_die "$COMPLETION missing"

# complete OUT ERR [extra args...]: greedy generation, flash attention on. llama-completion
# prints through a log thread that is not flushed at exit, so the tail of the text can be lost
# with status 0; the perf summary is logged last: without it, run again (as e2e_run.py does).
complete() {
    local out=$1 err=$2 attempt rc; shift 2
    for attempt in 1 2 3; do
        rc=0
        in_client env GGML_NO_BACKTRACE=1 timeout 300 "$COMPLETION" -p "$prompt" -n "$n" --temp 0 --top-k 1 --seed 1 \
            -no-cnv -fa on -t 1 --no-warmup --no-repack "$@" >"$out" 2>"$err" || rc=$?
        if [ "$rc" -ne 0 ] || grep -q "total time =" "$err"; then return "$rc"; fi
        conf_log "llama-completion output truncated (log not flushed), run $attempt: again"
    done
    return 1
}

for ty in ${types//,/ }; do
    model="$models/tp-llama-$ty.gguf"
    complete "$logdir/$ty-cpu.txt" "$logdir/$ty-cpu.err" -m "$model" || conf_die "CPU-only run failed ($ty): $logdir/$ty-cpu.err"
    runs=()
    for w in ${worlds//,/ }; do runs+=("ours:$w"); done
    runs+=("reference:2")
    for run in "${runs[@]}"; do
        kind=${run%%:*} w=${run##*:} tag="$ty-$kind-$w"
        start_servers "$kind" "$w"
        if ! complete "$logdir/$tag.txt" "$logdir/$tag.err" -m "$model" --rpc "$ENDPOINTS" -ngl 99 -sm tensor; then
            report "FAIL $tag: llama-completion failed (see $logdir/$tag.err)"
            failures=$((failures + 1))
        elif ! cmp -s "$logdir/$ty-cpu.txt" "$logdir/$tag.txt"; then
            report "FAIL $tag: text differs from CPU-only"
            diff <(cat "$logdir/$ty-cpu.txt"; echo) <(cat "$logdir/$tag.txt"; echo) >&2 || true
            failures=$((failures + 1))
        elif [ "$kind" = ours ]; then
            allreduced "$tag"
        else
            report "ok   $tag: identical to CPU-only"
        fi
        cleanup
    done
done

# Long prompts put BF16 on the comm wire (32768 elements or more per all-reduce): token by
# token against CPU-only with llama_probe --pair, our ring at every world against b12032+1's
# own pairwise link (tp_margins.py states the rule).
prompts="$logdir/long-prompts.txt"
"$py" - "$prompts" <<'PY'
import random, sys
words = ("the quick brown fox jumps over lazy dog and then a small cat sat on mat while birds "
         "sing in trees near river under blue sky").split()
with open(sys.argv[1], "w") as f:
    for k in range(6):
        r = random.Random(k)
        f.write(" ".join(r.choice(words) for _ in range(110)) + "\n")
PY
probes=()
for ty in ${types//,/ }; do
    runs=("reference:2")
    for w in ${worlds//,/ }; do runs+=("ours:$w"); done
    for run in "${runs[@]}"; do
        kind=${run%%:*} w=${run##*:} tag="$ty-$kind-$w"
        start_servers "$kind" "$w"
        if in_client env GGML_RPC_SHIM_QUIET=1 GGML_RPC_SHIM_ENDPOINT="$ENDPOINTS" LD_PRELOAD="$SHIM" timeout 600 \
            "$PROBE" -m "$models/tp-llama-$ty.gguf" --prompts "$prompts" -n "$n" --fa on --split tensor \
            --pair --repack off -c 512 -t 1 >"$logdir/$tag.probe" 2>"$logdir/$tag.probe.err"; then
            probes+=("$logdir/$tag.probe")
        else
            report "FAIL $tag: llama_probe failed (see $logdir/$tag.probe.err)"
            failures=$((failures + 1))
        fi
        cleanup
    done
done
"$py" "$CONF_DIR/tp_margins.py" "${probes[@]}" >&2 || failures=$((failures + 1))

# the upstream client's Q4_K limitation, still there?
start_servers reference 2
if complete "$logdir/q4_k-reference-2.txt" "$logdir/q4_k-reference-2.err" -m "$models/tiny-llama-q4_k.gguf" --rpc "$ENDPOINTS" -ngl 99 -sm tensor; then
    report "NOTE q4_k: b12032+1's client now loads Q4_K with -sm tensor: add q4_k to the default types"
    failures=$((failures + 1))
elif grep -q "tensor write out of bounds" "$logdir/q4_k-reference-2.err"; then
    report "ok   q4_k: b12032+1's client still aborts with -sm tensor (its own servers too), as documented"
else
    report "FAIL q4_k: the reference run failed differently (see $logdir/q4_k-reference-2.err)"
    failures=$((failures + 1))
fi
cleanup
fi # b12032

# ---- b11739's client: its libllama driven by b11739_generate.py inside its chroot, which sees
# only the chroot: the script and each model are copied into a scratch folder there
if has_client b11739; then
B11739="$PEER_ROOT/b11739"
CHROOT="$B11739/chroot"
[ -f "$B11739/.complete" ] && [ -x "$B11739/rpc-server" ] \
    || conf_die "llama.cpp b11739 not found under $B11739 (run scripts/peer/setup-b11739.sh)"
REF_SERVER="$B11739/rpc-server"
OUR_PROTO=8.0.0 NEED_COMMUNICATOR=0 LOG_TAG=b11739-
chroot_tmp=$(mktemp -d "$CHROOT/tmp/ggml-rpc-tp.XXXXXX")
cp "$REPO_ROOT/scripts/peer/b11739_generate.py" "$chroot_tmp/"
inside=${chroot_tmp#"$CHROOT"}
# generate OUT [b11739_generate.py args...]: the greedy token ids ($chroot_tmp/model.gguf) on one line
generate() {
    local out=$1; shift
    in_client timeout 300 env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 chroot "$CHROOT" \
        python3 "$inside/b11739_generate.py" -m "$inside/model.gguf" -p "$prompt" -n "$n" -t 1 "$@" \
        >"$out" 2>"${out%.ids}.err" && [ -s "$out" ]
}
for ty in ${types//,/ }; do
    cp "$models/tp-llama-$ty.gguf" "$chroot_tmp/model.gguf"
    generate "$logdir/b11739-$ty-cpu.ids" || conf_die "b11739 CPU-only run failed ($ty): $logdir/b11739-$ty-cpu.err"
    runs=("ours:2" "reference:2")
    for w in ${worlds//,/ }; do [ "$w" -gt 2 ] && runs+=("ours:$w"); done
    for run in "${runs[@]}"; do
        kind=${run%%:*} w=${run##*:} tag="b11739-$ty-$kind-$w"
        start_servers "$kind" "$w"
        if ! generate "$logdir/$tag.ids" --rpc "$ENDPOINTS" --split tensor; then
            report "FAIL $tag: b11739_generate.py failed (see $logdir/$tag.err)"
            failures=$((failures + 1))
        elif ! cmp -s "$logdir/b11739-$ty-cpu.ids" "$logdir/$tag.ids"; then
            report "FAIL $tag: token ids differ from CPU-only"
            diff "$logdir/b11739-$ty-cpu.ids" "$logdir/$tag.ids" >&2 || true
            failures=$((failures + 1))
        elif [ "$kind" = ours ] && [ "$w" = 2 ]; then
            allreduced "$tag"
        elif [ "$kind" = ours ] && grep -q "COMM_ALLREDUCE" "${LOGS[@]}"; then
            report "NOTE $tag: b11739's client now all-reduces through $w servers: check that too"
            failures=$((failures + 1))
        elif [ "$kind" = ours ]; then
            report "ok   $tag: identical to CPU-only (no server link beyond two: the client sums)"
        else
            report "ok   $tag: identical to CPU-only"
        fi
        cleanup
    done
done
# the Q4_K limitation is b11739's too (same assert, its own servers)
cp "$models/tiny-llama-q4_k.gguf" "$chroot_tmp/model.gguf"
start_servers reference 2
if generate "$logdir/b11739-q4_k-reference-2.ids" --rpc "$ENDPOINTS" --split tensor; then
    report "NOTE b11739-q4_k: b11739's client now loads Q4_K with -sm tensor"
    failures=$((failures + 1))
elif grep -q "tensor write out of bounds" "$logdir/b11739-q4_k-reference-2.err"; then
    report "ok   b11739-q4_k: b11739's client aborts with -sm tensor (its own servers too), as b12032+1's"
else
    report "FAIL b11739-q4_k: the reference run failed differently (see $logdir/b11739-q4_k-reference-2.err)"
    failures=$((failures + 1))
fi
cleanup
fi # b11739

if [ "$failures" -ne 0 ]; then
    conf_log "$failures failure(s); logs in $logdir"
    exit 1
fi
conf_log "tensor parallelism: every split run identical to CPU-only"
