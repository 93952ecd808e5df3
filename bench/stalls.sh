#!/usr/bin/env bash
# bench/stalls.sh - how long each proxy's one thread is away from its I/O at a time, under an
# open-loop load at a fixed rate: the long event-loop turns that make a tail.
#
# The layout of bench/overload.sh (the harness's two nginx backends and the load generator on
# OTHER_CPU, each proxy one thread on PROXY_CPU). Per round and target: bench/openload offers
# RATE requests/s for DURATION s after 2 s of warm-up, and meanwhile `perf record` (on
# OTHER_CPU) records, on PROXY_CPU, every epoll_wait entry and return and every context switch
# for DURATION - 1 s; bench/stalls.py turns that into the loop's turns (from an epoll_wait's
# return to the next call): how many took over 1, 2, 5, 10 ms per 10 s, the longest, and how
# much of a long turn the thread spent switched out (and who ran instead). PROFILE=1 also
# samples the proxy's stacks (`perf record -g -e cpu-clock`, kept as perf-ROUND-TARGET-cpu.data
# in RUN_DIR) for a look at what ran in a long turn.
#
# Usage: RATE=36000 flock /tmp/capataz-bench.lock bench/stalls.sh
#        env: RATE (required) CONNS=50 DURATION=10 ROUNDS=3 TARGETS="capataz haproxy"
#             CAPATAZ_BIN=... CONFIG=bench/capataz.toml (a copy, for diagnosis) MIN_MS=2
#             PROXY_CPU=0 OTHER_CPU=1 RUN_DIR=/tmp/bench-stalls SHARED=../shared/bench PROFILE=
# Needs: perf (with tracepoints: root or perf_event_paranoid <= -1), nginx, haproxy, curl.
set -Eeuo pipefail
LOG_TAG=stalls
source "$(dirname "$0")/common.sh"
in_own_session "$@"

RATE=${RATE:?set RATE (requests/s)} CONNS=${CONNS:-50} DURATION=${DURATION:-10} ROUNDS=${ROUNDS:-3}
PROXY_CPU=${PROXY_CPU:-0} OTHER_CPU=${OTHER_CPU:-1} MIN_MS=${MIN_MS:-2}
RUN_DIR=${RUN_DIR:-/tmp/bench-stalls}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
CONFIG=${CONFIG:-$BENCH_DIR/capataz.toml}
read -r -a TARGETS <<<"${TARGETS:-capataz haproxy}"
mkdir -p "$RUN_DIR"/nginx-backend/{logs,tmp}

need_tools nginx haproxy curl ss perf
for p in 9101 9102 9200 9400; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done
build_capataz
if [[ -z ${OPENLOAD:-} ]]; then
    (cd "$ROOT_DIR" && cargo build --release --quiet -p capataz-openload)
    OPENLOAD=${CARGO_TARGET_DIR:-$ROOT_DIR/target}/release/openload
fi
cp "$OPENLOAD" "$RUN_DIR/openload"
log "host: $(machine_line); load average $(cut -d" " -f1-3 /proc/loadavg); session $(cat /proc/self/autogroup 2>/dev/null)"

cp "$SHARED/backend-nginx.conf" "$RUN_DIR/nginx-backend/nginx.conf"
start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port 9101 "$LAST_PID"; wait_port 9102 "$LAST_PID"

declare -A PORT=([capataz]=9400 [haproxy]=9200) PID=()
for tgt in "${TARGETS[@]}"; do
    case $tgt in
        capataz) CAPATAZ_WORKER_THREADS=1 start "$tgt" "$PROXY_CPU" "$CAPATAZ_BIN" run --config "$CONFIG" ;;
        haproxy)
            cp "$SHARED/haproxy.cfg" "$RUN_DIR/haproxy.cfg"
            start "$tgt" "$PROXY_CPU" haproxy -db -f "$RUN_DIR/haproxy.cfg" ;;
        *) die "unknown target: $tgt" ;;
    esac
    PID[$tgt]=$LAST_PID
    wait_port "${PORT[$tgt]}" "$LAST_PID"
done
sleep 3  # both backends UP (rise 2, inter 1 s)

field() { awk -v k="$2" '/^latency_us:/ { for (i = 2; i < NF; i += 2) if ($i == k) print $(i+1) }' "$1"; }
n=${#TARGETS[@]}
for round in $(seq "$ROUNDS"); do
    for ((i = 0; i < n; i++)); do
        tgt=${TARGETS[(i + round - 1) % n]}
        out=$RUN_DIR/open-$round-$tgt.txt data=$RUN_DIR/perf-$round-$tgt.data
        (pin "$OTHER_CPU" "$RUN_DIR/openload" -r "$RATE" -c "$CONNS" -d "$DURATION" -w 2 ${SLOW_MS:+-s "$SLOW_MS"} "http://127.0.0.1:${PORT[$tgt]}/" >"$out") &
        load=$!
        sleep 2.5
        # The proxy's epoll_wait family (SYSCALLS=1: its every syscall, to see what a long turn did).
        filter="common_pid == ${PID[$tgt]} && (id == 232 || id == 281 || id == 441)"
        [[ -z ${SYSCALLS:-} ]] || filter="common_pid == ${PID[$tgt]}"
        (pin "$OTHER_CPU" perf record -q -a -k CLOCK_MONOTONIC -o "$data" \
            -e raw_syscalls:sys_enter --filter "$filter" -e raw_syscalls:sys_exit --filter "$filter" \
            -e sched:sched_switch -e sched:sched_waking -- sleep $(( DURATION - 1 ))) >/dev/null 2>&1 &
        rec=$!
        # The proxy's page faults meanwhile (a fault is a trip into the kernel, and on a VM
        # whose free memory goes back to the host, maybe into the host's too).
        (pin "$OTHER_CPU" perf stat -x, -e page-faults,major-faults -p "${PID[$tgt]}" -o "$RUN_DIR/faults-$round-$tgt.csv" \
            -- sleep $(( DURATION - 1 ))) >/dev/null 2>&1 &
        faults=$!
        prof=
        if [[ -n ${PROFILE:-} ]]; then
            (pin "$OTHER_CPU" perf record -q -k CLOCK_MONOTONIC -g -e cpu-clock -F 4000 -p "${PID[$tgt]}" -o "$RUN_DIR/perf-$round-$tgt-cpu.data" \
                -- sleep $(( DURATION - 1 ))) >/dev/null 2>&1 &
            prof=$!
        fi
        wait "$rec" || die "perf record failed"
        wait "$faults" || true
        [[ -z $prof ]] || wait "$prof" || true
        wait "$load" || die "$tgt: openload failed: $(cat "$out")"
        perf script -i "$data" -F comm,pid,tid,cpu,time,event,trace 2>/dev/null |
            python3 "$BENCH_DIR/stalls.py" "${PID[$tgt]}" "$MIN_MS" >"$RUN_DIR/stalls-$round-$tgt.txt"
        log "round $round $tgt: $(awk '/^rate:/ {print "achieved", $5}' "$out"), p50/p99/p99.9 $(field "$out" p50)/$(field "$out" p99)/$(field "$out" p99.9) us"
        awk -F, '$3 ~ /faults/ {printf "%s %s, ", $1, $3} END {print "in", '"$(( DURATION - 1 ))"', "s"}' "$RUN_DIR/faults-$round-$tgt.csv" >>"$RUN_DIR/stalls-$round-$tgt.txt"
        sed -n "1,18s/^/    /p" "$RUN_DIR/stalls-$round-$tgt.txt" >&2
    done
done
log "files: $RUN_DIR"
