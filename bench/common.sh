# bench/common.sh - helpers shared by bench/failover.sh, bench/probe-cost.sh, bench/probe-cost-tls.sh,
# bench/memory.sh.
# Sourced, not run. Every process is started with `start` (which records its PID) and stopped
# by PID from the EXIT trap, whatever way the script ends; nothing is ever stopped by name.
# Everything binds and targets 127.0.0.0/8 only.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT_DIR=$(cd "$BENCH_DIR/.." && pwd)
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[%s %s] %s\n' "${LOG_TAG:-bench}" "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ------------------------------------------------------------------ processes --
declare -a PIDS=()
declare -A PNAME=()
EXTRA_PIDFILES=()          # PIDs written by children (e.g. a restarted backend), also stopped

pstate() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; s=${s##*) }; echo "${s%% *}"; }
alive()  { local st; st=$(pstate "$1"); [[ -n $st && $st != Z ]]; }
children() { cat /proc/"$1"/task/*/children 2>/dev/null || true; }

stop_pid() { # stop_pid PID [NAME]: TERM, wait up to 5 s, then KILL; its children too
    local pid=$1 name=${2:-${PNAME[$1]:-pid}} kids k
    if ! alive "$pid"; then wait "$pid" 2>/dev/null || true; return 0; fi
    kids=$(children "$pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then log "$name (pid $pid) ignored TERM, sending KILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || true
    for k in $kids; do
        if alive "$k"; then kill -KILL "$k" 2>/dev/null || true; fi
    done
}

forget_pid() { # forget_pid PID: drop from the cleanup list once stopped
    local i
    for i in "${!PIDS[@]}"; do [[ ${PIDS[i]} == "$1" ]] && unset 'PIDS[i]'; done
    PIDS=("${PIDS[@]}")
}

stop_named() { # stop_named PID: stop one process we started and forget it
    stop_pid "$1"; forget_pid "$1"
}

stop_pidfiles() {
    local f pid
    for f in "${EXTRA_PIDFILES[@]}"; do
        [[ -s $f ]] || continue
        pid=$(cat "$f")
        [[ $pid =~ ^[0-9]+$ ]] && stop_pid "$pid" "$(basename "$f")"
        rm -f "$f"
    done
}

cleanup() {
    local rc=$? i
    trap - EXIT INT TERM ERR
    set +e
    stop_pidfiles
    for ((i=${#PIDS[@]}-1; i>=0; i--)); do stop_pid "${PIDS[i]}"; done
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# in_own_session "$@": with SESSION_NICE=N (-20..19), runs the calling script again in a session
# of its own whose autogroup has nice N. With the kernel's autogroups (sched_autogroup_enabled,
# Debian's default) CPU time is shared first between sessions, each its own group, and a
# process's nice counts only within its session: a `nice -n 19 cargo build` started from
# another shell still takes half of a shared core from the proxy under test, in slices of
# 10-40 ms (bench/stalls.sh sees them). SESSION_NICE=-20 gives the benchmark's session (the
# proxies, the backends, the load generator) about 98 % of a core against each such build.
in_own_session() {
    [[ -n ${SESSION_NICE:-} && -z ${IN_OWN_SESSION:-} ]] || return 0
    [[ -w /proc/self/autogroup ]] || die "SESSION_NICE needs /proc/self/autogroup (CONFIG_SCHED_AUTOGROUP)"
    IN_OWN_SESSION=1 exec setsid --wait bash -c 'echo "$SESSION_NICE" >/proc/self/autogroup && exec "$@"' _ "$0" "$@"
}

pin() { # pin CPU cmd... (empty CPU = no pinning); exec'd so $! is the real PID
    local cpu=$1; shift
    if [[ -n $cpu ]]; then exec taskset -c "$cpu" "$@"; else exec "$@"; fi
}

start() { # start NAME CPU cmd... ; sets LAST_PID
    local name=$1 cpu=$2; shift 2
    ( pin "$cpu" "$@" ) >"$RUN_DIR/$name.log" 2>&1 &
    LAST_PID=$!
    PIDS+=("$LAST_PID"); PNAME[$LAST_PID]=$name
    log "started $name (pid $LAST_PID, cpu ${cpu:-any})"
}

port_busy() { [[ -n $(ss -Hltn "sport = :$1" 2>/dev/null) ]]; }

wait_port() { # wait_port PORT PID [SECONDS]
    local port=$1 pid=$2 deadline=$(( SECONDS + ${3:-15} ))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        alive "$pid" || die "${PNAME[$pid]:-pid $pid} exited before :$port opened; see $RUN_DIR/${PNAME[$pid]:-}.log"
        (( SECONDS < deadline )) || die "timeout waiting for 127.0.0.1:$port"
        sleep 0.05
    done
}

# ---------------------------------------------------------------- measurement --
proc_ticks() { # utime+stime ticks of PID and its children (all threads)
    local p s sum=0
    for p in $1 $(children "$1"); do
        s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
        s=${s##*) }
        read -r -a f <<<"$s"        # f[0] is field 3: utime=f[11], stime=f[12]
        sum=$(( sum + f[11] + f[12] ))
    done
    echo "$sum"
}

mem_kb() { # mem_kb PID FIELD: sum of FIELD (VmRSS, VmHWM) over PID and its children, KiB
    local p sum=0 v
    for p in $1 $(children "$1"); do
        v=$(awk -v k="$2:" '$1==k{print $2}' "/proc/$p/status" 2>/dev/null) || continue
        sum=$(( sum + ${v:-0} ))
    done
    echo "$sum"
}

pss_kb() { # proportional set size of PID and its children, KiB (shared pages split)
    local p sum=0 v
    for p in $1 $(children "$1"); do
        v=$(awk '$1=="Pss:"{print $2}' "/proc/$p/smaps_rollup" 2>/dev/null) || continue
        sum=$(( sum + ${v:-0} ))
    done
    echo "$sum"
}

median() { sort -g | awk '{a[NR]=$1} END {if (!NR) {print "nan"; exit} print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
calc() { awk "BEGIN { print $* }"; }

need_tools() {
    local missing=0 cmd
    for cmd in "$@"; do command -v "$cmd" >/dev/null || missing=1; done
    if (( missing )); then
        log "installing wrk nginx haproxy"
        apt-get update -qq && apt-get install -y -qq wrk nginx haproxy >/dev/null
    fi
    for cmd in "$@"; do command -v "$cmd" >/dev/null || die "missing command: $cmd"; done
}

build_capataz() { # builds the release binary and copies it, so a rebuild by someone else mid-run changes nothing
    if [[ -n ${CAPATAZ_BIN:-} ]]; then
        log "capataz: $CAPATAZ_BIN (given; not built from this tree)"
        return
    fi
    (cd "$ROOT_DIR" && cargo build --release --quiet --bin capataz)
    cp "${CARGO_TARGET_DIR:-$ROOT_DIR/target}/release/capataz" "$RUN_DIR/capataz"
    CAPATAZ_BIN=$RUN_DIR/capataz
    log "capataz: $CAPATAZ_BIN ($(cd "$ROOT_DIR" && git rev-parse --short HEAD 2>/dev/null)$(cd "$ROOT_DIR" && git diff --quiet HEAD -- crates 2>/dev/null || echo ', working tree differs from HEAD'))"
}

machine_line() {
    echo "$(nproc) vCPU $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), kernel $(uname -r), $(nginx -v 2>&1 | sed 's/.*: //'), haproxy $(haproxy -v | head -1 | awk '{print $3}')"
}
