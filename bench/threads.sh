#!/usr/bin/env bash
# bench/threads.sh - where each thread's time goes while a proxy with N threads serves wrk on a
# host it shares with wrk and the backends, nothing pinned (the harness's `peers.sh -l none -n
# N`): per thread of the proxy, of wrk and of the backend nginx, the CPU it ran, the time it
# waited runnable for a CPU, and how often it was switched out (of its own accord, or
# preempted), from /proc/PID/task/TID/schedstat and status over the middle of each wrk run.
# PERF=1 also records the scheduler's wake-ups and switches for 2 s mid-run and prints, per
# thread, how long it waited from its wake-up (or preemption) to running, and on which CPU.
#
# Usage: SESSION_NICE=-20 CAPATAZ_BIN=... flock /tmp/capataz-bench.lock bench/threads.sh
#        env: CONNS=50 DURATION=8 ROUNDS=3 THREADS=2 TARGETS="capataz haproxy"
#             CONFIG=bench/capataz.toml CAPATAZ2_BIN= (target capataz2: a second build, :9401)
#             CAPATAZ_ENV="" (more variables for capataz, e.g.
#             _RJEM_MALLOC_CONF=...) RUN_DIR=/tmp/bench-threads SHARED=../shared/bench PERF=
#             PIN= SOAK= (see below)
set -Eeuo pipefail
LOG_TAG=threads
source "$(dirname "$0")/common.sh"
in_own_session "$@"

CONNS=${CONNS:-50} DURATION=${DURATION:-8} ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-2}
RUN_DIR=${RUN_DIR:-/tmp/bench-threads}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
CONFIG=${CONFIG:-$BENCH_DIR/capataz.toml}
read -r -a TARGETS <<<"${TARGETS:-capataz haproxy}"
read -r -a XENV <<<"${CAPATAZ_ENV:-}"
mkdir -p "$RUN_DIR"/nginx-backend/{logs,tmp}

need_tools nginx haproxy curl wrk
for p in 9101 9102 9200 9400 9401; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done
build_capataz
log "host: $(machine_line); load average $(cut -d" " -f1-3 /proc/loadavg); session $(cat /proc/self/autogroup 2>/dev/null)"

cp "$SHARED/backend-nginx.conf" "$RUN_DIR/nginx-backend/nginx.conf"
start backend "" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
BE=$LAST_PID
wait_port 9101 "$BE"; wait_port 9102 "$BE"

declare -A PORT=([capataz]=9400 [capataz2]=9401 [haproxy]=9200) PID=()
for tgt in "${TARGETS[@]}"; do
    case $tgt in
        capataz) start "$tgt" "" env "${XENV[@]}" CAPATAZ_WORKER_THREADS="$THREADS" "$CAPATAZ_BIN" run --config "$CONFIG" ;;
        capataz2) # a second build beside the first, on :9401 (CAPATAZ2_BIN), for an A/B in one run
            sed 's/127\.0\.0\.1:9400/127.0.0.1:9401/' "$CONFIG" >"$RUN_DIR/capataz2.toml"
            start "$tgt" "" env "${XENV[@]}" CAPATAZ_WORKER_THREADS="$THREADS" "${CAPATAZ2_BIN:?set CAPATAZ2_BIN}" run --config "$RUN_DIR/capataz2.toml" ;;
        haproxy)
            sed -E "s/^([[:space:]]*nbthread) 1\b/\1 $THREADS/" "$SHARED/haproxy.cfg" >"$RUN_DIR/haproxy.cfg"
            start "$tgt" "" haproxy -db -f "$RUN_DIR/haproxy.cfg" ;;
        *) die "unknown target: $tgt" ;;
    esac
    PID[$tgt]=$LAST_PID
    wait_port "${PORT[$tgt]}" "$LAST_PID"
done
sleep 3  # both backends UP (rise 2, inter 1 s)
# SOAK=1 (diagnosis): a SCHED_IDLE busy loop on each CPU, which runs only when nothing else
# would, so that no CPU ever halts: a busy host's effect on wake-ups without its competition.
if [[ -n ${SOAK:-} ]]; then
    for ((cpu = 0; cpu < $(nproc); cpu++)); do
        start "soak-$cpu" "$cpu" chrt -i 0 bash -c 'while :; do :; done'
    done
fi
# PIN="capataz haproxy" (diagnosis): each of these proxies' threads pinned to a CPU of its own,
# in turn (jemalloc's background threads left alone).
if [[ -n ${PIN:-} ]]; then
    for tgt in $PIN; do
        cpu=0
        for t in /proc/"${PID[$tgt]}"/task/*; do
            [[ $(cat "$t/comm") == jemalloc* ]] && continue
            taskset -p -c "$cpu" "${t##*/}" >/dev/null
            log "$tgt: thread ${t##*/} ($(cat "$t/comm")) pinned to CPU $cpu"
            cpu=$(( (cpu + 1) % $(nproc) ))
        done
    done
fi

# snap LABEL PID...: one line per thread: label tid comm run_ns wait_ns slices voluntary involuntary
snap() {
    local label=$1 p t; shift
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            [[ -r $t/schedstat ]] || continue
            printf '%s %s %s %s %s %s\n' "$label" "${t##*/}" "$(tr ' ' '_' <"$t/comm")" "$(cat "$t/schedstat")" \
                "$(awk '/^voluntary_ctxt/ {v=$2} /^nonvoluntary_ctxt/ {n=$2} END {print v, n}' "$t/status")"
        done
    done
}

n=${#TARGETS[@]}
for round in $(seq "$ROUNDS"); do
    for ((i = 0; i < n; i++)); do
        tgt=${TARGETS[(i + round - 1) % n]}
        out=$RUN_DIR/wrk-$round-$tgt.txt
        wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:${PORT[$tgt]}/" >"$out" 2>&1 &
        load=$!
        started=$EPOCHREALTIME
        sleep 1
        pids=("${PID[$tgt]}" $(children "${PID[$tgt]}") "$load" $(children "$BE"))
        { snap a "${pids[@]}"; echo "ticks $(date +%s.%N)"; } >"$RUN_DIR/snap-$round-$tgt.txt"
        if [[ -n ${PERF:-} ]]; then
            sleep 1
            perf record -q -a -k CLOCK_MONOTONIC -o "$RUN_DIR/perf-$round-$tgt.data" \
                -e sched:sched_switch -e sched:sched_waking -e sched:sched_wakeup -- sleep 2 >/dev/null 2>&1
        fi
        # The second snapshot a second before wrk ends.
        sleep "$(calc "$started + $DURATION - 1 - ${EPOCHREALTIME}")"
        { snap b "${pids[@]}"; echo "ticks $(date +%s.%N)"; } >>"$RUN_DIR/snap-$round-$tgt.txt"
        wait "$load" || die "wrk failed: $(cat "$out")"
        python3 "$BENCH_DIR/threads.py" "$RUN_DIR/snap-$round-$tgt.txt" "$out" >"$RUN_DIR/threads-$round-$tgt.txt"
        if [[ -n ${PERF:-} ]]; then
            perf script -i "$RUN_DIR/perf-$round-$tgt.data" -F comm,pid,tid,cpu,time,event,trace 2>/dev/null |
                python3 "$BENCH_DIR/threads.py" --perf "$RUN_DIR/snap-$round-$tgt.txt" >>"$RUN_DIR/threads-$round-$tgt.txt"
        fi
        log "round $round $tgt"
        sed 's/^/    /' "$RUN_DIR/threads-$round-$tgt.txt" >&2
    done
done
log "files: $RUN_DIR; load average $(cut -d" " -f1-3 /proc/loadavg)"
