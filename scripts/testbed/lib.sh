# The multi-host test bed's functions (scripts/testbed/README.md). Source it; do not run it;
# scripts/testbed/testbed.sh is the command line around it. Needs root, `ip` and `tc`.
#
# A test bed ID (rpctb<PID>, from the PID of the process that made it) names:
#   ID-br          a namespace holding only the bridge br0 and one veth port per host, h1..hN
#   ID-h1..ID-hN   one namespace per host: lo and eth0 (SUBNET.i/24), the other end of port hi
# Nothing is created in the namespace the test bed is run from: the veth pairs are made inside
# the bridge's namespace with their peers placed straight into the hosts'. With a rate, each
# link is shaped in both directions: a tbf qdisc on the host's eth0 (what it sends) and one on
# the bridge's port hi (what it receives).
#
# State lives in $TESTBED_STATE_ROOT/ID (default /run/ggml-rpc-testbed/ID): hosts, subnet,
# rate, owner (PID and start time of the process the test bed belongs to: `cleanup` removes
# the test beds whose owner is gone), spawned (host, PID, start time and log of each `spawn`)
# and logs/.
# shellcheck shell=bash

TB_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TB_STATE_ROOT="${TESTBED_STATE_ROOT:-/run/ggml-rpc-testbed}"
# every namespace of every test bed is named ${TB_PREFIX}<digits>[x<digits>]-(br|h<digits>)
TB_PREFIX=rpctb
TB_MAX_HOSTS=32

tb_log() { printf '[testbed %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
tb_die() {
    printf '[testbed] ERROR: %s\n' "$*" >&2
    exit 2
}

# tb_require: root and the tools, or die.
tb_require() {
    [ "$(id -u)" = 0 ] || tb_die "the test bed needs root (network namespaces, veth, tc); run it as root"
    local tool
    for tool in ip tc setsid; do
        command -v "$tool" >/dev/null 2>&1 \
            || tb_die "'$tool' not found (apt-get install -y iproute2 util-linux)"
    done
}

# tb_proc_start PID: the process's start time (clock ticks since boot), to tell it from a later
# process that reuses its PID. Fails when there is no such process.
tb_proc_start() {
    local stat fields
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    # the command name may hold spaces and parentheses: fields restart after the last ") "
    read -ra fields <<<"${stat##*) }"
    echo "${fields[19]}"
}

# tb_alive PID START: whether that very process still runs.
tb_alive() {
    local now
    now=$(tb_proc_start "$1") || return 1
    [ "$now" = "$2" ]
}

tb_state() { echo "$TB_STATE_ROOT/$1"; }
tb_bridge_ns() { echo "$1-br"; }
tb_host_ns() { echo "$1-h$2"; }

# tb_new_id: rpctb<our PID>, with a suffix in the unlikely case that a stale test bed of a
# process that had the same PID is still there.
tb_new_id() {
    local id="$TB_PREFIX$$" n=1
    while [ -e "$(tb_state "$id")" ] || [ -n "$(tb_namespaces "$id")" ]; do
        n=$((n + 1))
        id="$TB_PREFIX$$x$n"
    done
    echo "$id"
}

# tb_namespaces ID: the namespaces of test bed ID that exist (all test beds' without ID).
tb_namespaces() {
    local pattern
    if [ -n "${1:-}" ]; then
        pattern="^$1-(br|h[0-9]+)\$"
    else
        pattern="^${TB_PREFIX}[0-9]+(x[0-9]+)?-(br|h[0-9]+)\$"
    fi
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "$pattern" || true
}

# tb_ids: the test beds that have a state directory.
tb_ids() {
    local dir
    [ -d "$TB_STATE_ROOT" ] || return 0
    for dir in "$TB_STATE_ROOT"/"$TB_PREFIX"*; do
        [ -d "$dir" ] && basename "$dir"
    done
    return 0
}

# tb_owner_alive ID: whether the process test bed ID belongs to still runs.
tb_owner_alive() {
    local pid start
    read -r pid start <"$(tb_state "$1")/owner" 2>/dev/null || return 1
    tb_alive "$pid" "$start"
}

# tb_parse_rate RATE: bits per second of a tc rate (NUMBER followed by bit, kbit, mbit, gbit
# or tbit); fails on anything else.
tb_parse_rate() {
    local rate=$1
    [[ $rate =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)$ ]] || return 1
    awk -v n="${BASH_REMATCH[1]}" -v unit="${BASH_REMATCH[3]}" 'BEGIN {
        m = 1
        if (unit == "kbit") m = 1e3; else if (unit == "mbit") m = 1e6
        else if (unit == "gbit") m = 1e9; else if (unit == "tbit") m = 1e12
        printf "%.0f\n", n * m
    }'
}

# tb_shape NS DEV RATE: a tbf on DEV's egress inside NS. The bucket holds 4 ms at the rate and
# at least 64 KiB (a whole GSO packet); at most 50 ms of packets wait in it.
tb_shape() {
    local ns=$1 dev=$2 rate=$3 bits burst
    bits=$(tb_parse_rate "$rate") || tb_die "bad rate '$rate'"
    burst=$(awk -v b="$bits" 'BEGIN { x = b / 8 / 250; if (x < 65536) x = 65536; printf "%.0f\n", x }')
    tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms \
        || tb_die "tc tbf on $dev in $ns failed"
}

# tb_up ID HOSTS RATE SUBNET OWNER_PID: make test bed ID. RATE is a tc rate or "none"; host i
# gets SUBNET.i/24. On failure what was made stays for tb_down (the callers' traps).
tb_up() {
    local id=$1 hosts=$2 rate=$3 subnet=$4 owner=$5 state br i ns start
    [[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le "$TB_MAX_HOSTS" ] \
        || tb_die "--hosts must be 2..$TB_MAX_HOSTS (got '$hosts')"
    [ "$rate" = none ] || tb_parse_rate "$rate" >/dev/null \
        || tb_die "--rate must be none or a tc rate such as 200mbit or 1gbit (got '$rate')"
    [[ $subnet =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] && [ "${BASH_REMATCH[1]}" -le 255 ] \
        && [ "${BASH_REMATCH[2]}" -le 255 ] && [ "${BASH_REMATCH[3]}" -le 255 ] \
        || tb_die "--subnet must be the first three octets, such as 10.77.0 (got '$subnet')"
    start=$(tb_proc_start "$owner") || tb_die "owner process $owner does not exist"
    state=$(tb_state "$id")
    [ ! -e "$state" ] || tb_die "test bed $id exists already"
    # the state first: whatever follows can be found and removed
    mkdir -p "$state/logs"
    echo "$owner $start" >"$state/owner"
    echo "$hosts" >"$state/hosts"
    echo "$rate" >"$state/rate"
    echo "$subnet" >"$state/subnet"
    : >"$state/spawned"

    br=$(tb_bridge_ns "$id")
    ip netns add "$br" || tb_die "ip netns add $br failed"
    ip -n "$br" link set lo up
    ip -n "$br" link add br0 type bridge
    ip -n "$br" link set br0 up
    for i in $(seq 1 "$hosts"); do
        ns=$(tb_host_ns "$id" "$i")
        ip netns add "$ns" || tb_die "ip netns add $ns failed"
        ip -n "$ns" link set lo up
        ip -n "$br" link add "h$i" type veth peer name eth0 netns "$ns" \
            || tb_die "veth h$i <-> $ns/eth0 failed"
        ip -n "$br" link set "h$i" master br0
        ip -n "$br" link set "h$i" up
        ip -n "$ns" addr add "$subnet.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        if [ "$rate" != none ]; then
            tb_shape "$ns" eth0 "$rate"
            tb_shape "$br" "h$i" "$rate"
        fi
    done
    touch "$state/up"
}

# tb_host_index ID HOST: the host number of HOST (i, hi or SUBNET.i) in test bed ID.
tb_host_index() {
    local id=$1 host=$2 hosts subnet state
    state=$(tb_state "$id")
    hosts=$(cat "$state/hosts" 2>/dev/null) || tb_die "no test bed $id"
    subnet=$(cat "$state/subnet")
    host=${host#h}
    host=${host#"$subnet."}
    [[ $host =~ ^[0-9]+$ ]] && [ "$host" -ge 1 ] && [ "$host" -le "$hosts" ] \
        || tb_die "no host '$2' in test bed $id (hosts 1..$hosts)"
    echo "$host"
}

# tb_exec ID HOST CMD...: run CMD inside host HOST (replaces the calling shell).
tb_exec() {
    local id=$1 host
    host=$(tb_host_index "$id" "$2") || exit 2
    shift 2
    exec ip netns exec "$(tb_host_ns "$id" "$host")" "$@"
}

# tb_spawn ID HOST CMD...: start CMD inside host HOST in the background, stdin from /dev/null,
# stdout and stderr to a log in the state directory; records it for tb_down and prints
# "PID LOG".
tb_spawn() {
    local id=$1 host state n log pid start
    host=$(tb_host_index "$id" "$2") || exit 2
    shift 2
    state=$(tb_state "$id")
    n=$(($(wc -l <"$state/spawned") + 1))
    log="$state/logs/h$host-$n-$(basename "$1").log"
    ip netns exec "$(tb_host_ns "$id" "$host")" "$@" </dev/null >"$log" 2>&1 &
    pid=$!
    start=$(tb_proc_start "$pid") || start=gone
    echo "$host $pid $start $log" >>"$state/spawned"
    echo "$pid $log"
}

# tb_stop PID...: TERM, up to 3 s, then KILL.
tb_stop() {
    local pid left
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null || true
    for _ in $(seq 1 30); do
        left=0
        for pid in "$@"; do
            if kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" != Z ]; then
                left=1
            fi
        done
        [ "$left" = 1 ] || return 0
        sleep 0.1
    done
    kill -KILL "$@" 2>/dev/null || true
}

# tb_down ID: stop what was spawned and everything else still running in the test bed's
# namespaces, delete the namespaces (with them every veth, the bridge and the qdiscs) and the
# state. Fails if a namespace of ID is left.
tb_down() {
    local id=$1 state host pid start log ns pids=() nspids
    state=$(tb_state "$id")
    if [ -f "$state/spawned" ]; then
        while read -r host pid start log; do
            [ -n "$pid" ] && tb_alive "$pid" "$start" && pids+=("$pid")
        done <"$state/spawned"
        tb_stop "${pids[@]}"
    fi
    for ns in $(tb_namespaces "$id"); do
        # whatever else entered the namespace (tb_exec, or children of spawned commands)
        mapfile -t nspids < <(ip netns pids "$ns" 2>/dev/null)
        tb_stop "${nspids[@]}"
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$state"
    if [ -n "$(tb_namespaces "$id")" ]; then
        tb_log "test bed $id: namespaces left: $(tb_namespaces "$id" | tr '\n' ' ')"
        return 1
    fi
    return 0
}

# tb_cleanup [--all]: remove the test beds whose owner process is gone (all with --all), and
# namespaces named like a test bed's that have no state.
tb_cleanup() {
    local all=${1:-} id ns rc=0 known
    for id in $(tb_ids); do
        if [ "$all" = --all ] || ! tb_owner_alive "$id"; then
            tb_log "removing test bed $id"
            tb_down "$id" || rc=1
        fi
    done
    known=$(tb_ids)
    for ns in $(tb_namespaces ""); do
        id=${ns%-*}
        if ! grep -qx "$id" <<<"$known"; then
            tb_log "removing orphan namespace $ns"
            mapfile -t nspids < <(ip netns pids "$ns" 2>/dev/null)
            tb_stop "${nspids[@]}"
            ip netns del "$ns" || rc=1
        fi
    done
    return "$rc"
}

# tb_env ID: the test bed as shell assignments (eval them, or `export` them).
tb_env() {
    local id=$1 state hosts subnet i
    state=$(tb_state "$id")
    hosts=$(cat "$state/hosts" 2>/dev/null) || tb_die "no test bed $id"
    subnet=$(cat "$state/subnet")
    echo "TESTBED=$TB_LIB_DIR/testbed.sh"
    echo "TESTBED_ID=$id"
    echo "TESTBED_HOSTS=$hosts"
    echo "TESTBED_RATE=$(cat "$state/rate")"
    echo "TESTBED_SUBNET=$subnet"
    echo "TESTBED_STATE=$state"
    echo "TESTBED_BRIDGE_NS=$(tb_bridge_ns "$id")"
    for i in $(seq 1 "$hosts"); do
        echo "TESTBED_NS_$i=$(tb_host_ns "$id" "$i")"
        echo "TESTBED_ADDR_$i=$subnet.$i"
    done
}

# tb_select [ID]: ID, else $TESTBED_ID, else the one test bed there is.
tb_select() {
    local id=${1:-${TESTBED_ID:-}} ids
    if [ -z "$id" ]; then
        ids=$(tb_ids)
        case "$(grep -c . <<<"$ids")" in
            0) tb_die "no test bed is up (testbed.sh up)" ;;
            1) id=$ids ;;
            *) tb_die "several test beds are up ($(tr '\n' ' ' <<<"$ids")): name one with --id or TESTBED_ID" ;;
        esac
    fi
    [ -f "$(tb_state "$id")/hosts" ] || tb_die "no test bed $id"
    echo "$id"
}
