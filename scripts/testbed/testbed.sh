#!/usr/bin/env bash
# A multi-host test bed on one machine: N "hosts" as network namespaces joined by veth pairs
# through a bridge (in a namespace of its own), each link rate-limited in both directions.
# Needs root. scripts/testbed/README.md has the details.
#
#   testbed.sh up [--hosts N] [--rate R] [--subnet A.B.C] [--owner PID]
#                                  make one; prints its ID and hosts (the test bed belongs to
#                                  the calling shell, or PID: `cleanup` removes it once that
#                                  process is gone)
#   testbed.sh exec  [--id ID] HOST CMD...   run CMD in HOST (1..N, hN or its address)
#   testbed.sh spawn [--id ID] HOST CMD...   start CMD in HOST in the background; prints
#                                  "PID LOG" (stdout and stderr go to LOG)
#   testbed.sh env   [--id ID]     the test bed as TESTBED_* assignments (eval "$(... env)")
#   testbed.sh down  [--id ID]     stop everything in it and remove it
#   testbed.sh list                the test beds that are up, and whether their owner lives
#   testbed.sh cleanup [--all]     remove test beds whose owner is gone (--all: every one)
#   testbed.sh run [--hosts N] [--rate R] [--subnet A.B.C] [--keep-logs DIR] -- CMD...
#                                  up, run CMD with TESTBED_* in its environment, down (always:
#                                  on success, failure, INT, TERM, HUP); exits with CMD's status
#
# --id defaults to $TESTBED_ID, else the only test bed that is up. --hosts defaults to 3,
# --rate to 1gbit ("none": no shaping), --subnet to 10.77.0 (host i is SUBNET.i/24).
#
# The environment run gives CMD (and env prints): TESTBED (this script), TESTBED_ID,
# TESTBED_HOSTS, TESTBED_RATE, TESTBED_SUBNET, TESTBED_STATE, TESTBED_BRIDGE_NS, and for each
# host i TESTBED_NS_i and TESTBED_ADDR_i.
set -euo pipefail
# shellcheck source=scripts/testbed/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
    exit "${1:-0}"
}

hosts=3 rate=1gbit subnet=10.77.0 owner="" id="" keep_logs="" all=""

# parse_common ARGS...: the options before the positional arguments; sets REST.
parse_common() {
    REST=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --hosts) hosts=${2:?--hosts needs a value}; shift 2 ;;
            --rate) rate=${2:?--rate needs a value}; shift 2 ;;
            --subnet) subnet=${2:?--subnet needs a value}; shift 2 ;;
            --owner) owner=${2:?--owner needs a value}; shift 2 ;;
            --id) id=${2:?--id needs a value}; shift 2 ;;
            --keep-logs) keep_logs=${2:?--keep-logs needs a value}; shift 2 ;;
            --all) all=--all; shift ;;
            -h | --help) usage 0 ;;
            --) shift; REST=("$@"); return 0 ;;
            -*) tb_die "unknown option $1 (testbed.sh --help)" ;;
            *) REST=("$@"); return 0 ;;
        esac
    done
}

# print_hosts ID: one line per host, "hI NAMESPACE ADDRESS", after the ID.
print_hosts() {
    local id=$1 state i
    state=$(tb_state "$id")
    echo "testbed $id: $(cat "$state/hosts") hosts, rate $(cat "$state/rate"), bridge namespace $(tb_bridge_ns "$id")"
    for i in $(seq 1 "$(cat "$state/hosts")"); do
        echo "h$i $(tb_host_ns "$id" "$i") $(cat "$state/subnet").$i"
    done
}

cmd_up() {
    parse_common "$@"
    [ ${#REST[@]} -eq 0 ] || tb_die "up takes no arguments (got ${REST[*]})"
    tb_require
    id=$(tb_new_id)
    owner=${owner:-$PPID}
    # a half-made test bed does not outlive a failed `up`
    trap 'up_exit' EXIT
    tb_up "$id" "$hosts" "$rate" "$subnet" "$owner"
    print_hosts "$id"
    echo "export TESTBED_ID=$id   # for exec/spawn/env/down"
}

up_exit() {
    local rc=$?
    trap - EXIT
    if [ ! -f "$(tb_state "$id")/up" ]; then
        tb_log "up failed: removing what was made of $id"
        tb_down "$id" || true
        [ "$rc" != 0 ] || rc=1
    fi
    exit "$rc"
}

cmd_run() {
    parse_common "$@"
    [ ${#REST[@]} -gt 0 ] || tb_die "run needs a command: testbed.sh run [options] -- CMD..."
    tb_require
    id=$(tb_new_id)
    RUN_CHILD=""
    trap 'run_exit' EXIT
    trap 'run_signal 130' INT
    trap 'run_signal 143' TERM
    trap 'run_signal 129' HUP
    tb_up "$id" "$hosts" "$rate" "$subnet" "$$"
    print_hosts "$id" >&2
    local line
    while IFS= read -r line; do
        export "${line?}"
    done < <(tb_env "$id")
    # CMD runs in a session of its own so that a signal to us can stop all it started
    setsid "${REST[@]}" &
    RUN_CHILD=$!
    local rc=0
    wait "$RUN_CHILD" || rc=$?
    RUN_CHILD=""
    exit "$rc"
}

# run_signal STATUS: stop CMD's process group, then exit (run_exit tears down).
run_signal() {
    trap - INT TERM HUP
    if [ -n "$RUN_CHILD" ]; then
        tb_log "signal: stopping the command (process group $RUN_CHILD)"
        kill -TERM -- "-$RUN_CHILD" 2>/dev/null || true
        for _ in $(seq 1 30); do
            kill -0 -- "-$RUN_CHILD" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$RUN_CHILD" 2>/dev/null || true
    fi
    exit "$1"
}

run_exit() {
    local rc=$? state log
    trap - EXIT INT TERM HUP
    [ -n "$id" ] || exit "$rc"
    state=$(tb_state "$id")
    if [ "$rc" != 0 ] && [ -s "$state/spawned" ]; then
        tb_log "the command failed ($rc); the last lines of what it spawned:"
        while read -r _ _ _ log; do
            printf -- '--- %s\n' "$log" >&2
            tail -n 20 "$log" >&2 2>/dev/null || true
        done <"$state/spawned"
    fi
    if [ -n "$keep_logs" ] && [ -d "$state/logs" ]; then
        mkdir -p "$keep_logs" && cp -r "$state/logs/." "$keep_logs/" || true
    fi
    if ! tb_down "$id"; then
        tb_log "teardown of $id left something behind"
        [ "$rc" != 0 ] || rc=1
    fi
    exit "$rc"
}

[ $# -gt 0 ] || usage 2
sub=$1
shift
case "$sub" in
    up) cmd_up "$@" ;;
    run) cmd_run "$@" ;;
    exec | spawn)
        parse_common "$@"
        [ ${#REST[@]} -ge 2 ] || tb_die "$sub needs a host and a command: testbed.sh $sub [--id ID] HOST CMD..."
        tb_require
        id=$(tb_select "$id")
        if [ "$sub" = exec ]; then tb_exec "$id" "${REST[@]}"; else tb_spawn "$id" "${REST[@]}"; fi
        ;;
    env)
        parse_common "$@"
        id=$(tb_select "$id")
        tb_env "$id"
        ;;
    down)
        parse_common "$@"
        tb_require
        id=$(tb_select "$id")
        tb_down "$id"
        tb_log "test bed $id removed"
        ;;
    list)
        for id in $(tb_ids); do
            if tb_owner_alive "$id"; then state="owner alive"; else state="stale: owner gone"; fi
            echo "$id $(cat "$(tb_state "$id")/hosts") hosts, rate $(cat "$(tb_state "$id")/rate") ($state)"
        done
        ;;
    cleanup)
        parse_common "$@"
        tb_require
        tb_cleanup "$all"
        ;;
    -h | --help | help) usage 0 ;;
    *) tb_die "unknown subcommand '$sub' (testbed.sh --help)" ;;
esac
