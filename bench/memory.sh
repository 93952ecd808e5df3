#!/usr/bin/env bash
# bench/memory.sh - resident memory of capataz, HAProxy and nginx idle and under the peer
# benchmark's load (../shared/bench/peers.sh: 2 nginx backends, wrk -t1, 50 connections).
#
# Uses the shared harness's configs as they are: backend-nginx.conf (127.0.0.1:9101/:9102),
# haproxy.cfg (:9200, stats :9201, nbthread 1) and proxy-nginx.conf (:9300, 1 worker), plus
# bench/capataz.toml (:9400, CAPATAZ_WORKER_THREADS=1). All three proxies run at once, pinned to
# PROXY_CPU (default 0); the backend and wrk share OTHER_CPU (default 1). wrk loads one proxy at a
# time, interleaved, ROUNDS times per connection count; while it runs, the proxy's VmRSS (process
# and children: nginx's master + worker) is sampled every 0.2 s.
# Figures: idle RSS after start-up (checks running, no traffic), peak RSS under load, RSS after
# the load, PSS (shared pages split between nginx's processes), and req/s as a sanity check.
#
# Usage: bench/memory.sh       (env: CONNS="50" DURATION=10s ROUNDS=3 PROXY_CPU=0 OTHER_CPU=1
#                               RUN_DIR=/tmp/bench-memory CAPATAZ_BIN=... SHARED=../shared/bench)
# Runtime: about 1 min with the defaults (10 s x 3 proxies x 3 rounds).
set -Eeuo pipefail
LOG_TAG=memory
source "$(dirname "$0")/common.sh"

CONNS=${CONNS:-50} DURATION=${DURATION:-10s} ROUNDS=${ROUNDS:-3}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-memory}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
mkdir -p "$RUN_DIR"
STAMP=$(date +%Y%m%dT%H%M%S)
RES=$RUN_DIR/results-$STAMP.tsv

need_tools wrk nginx haproxy taskset curl ss
for p in 9101 9102 9200 9201 9300 9400; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us; is peers.sh running?)"; fi
done
for f in backend-nginx.conf haproxy.cfg proxy-nginx.conf; do [[ -f $SHARED/$f ]] || die "missing $SHARED/$f"; done
build_capataz
log "host: $(machine_line)"

for d in nginx-backend nginx-proxy; do mkdir -p "$RUN_DIR/$d"/{logs,tmp}; done
cp "$SHARED/backend-nginx.conf" "$RUN_DIR/nginx-backend/nginx.conf"
cp "$SHARED/proxy-nginx.conf" "$RUN_DIR/nginx-proxy/nginx.conf"
cp "$SHARED/haproxy.cfg" "$RUN_DIR/haproxy.cfg"

start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port 9101 "$LAST_PID"; wait_port 9102 "$LAST_PID"
declare -A PX=() URL=([capataz]=http://127.0.0.1:9400/ [haproxy]=http://127.0.0.1:9200/ [nginx]=http://127.0.0.1:9300/)
start haproxy "$PROXY_CPU" haproxy -db -f "$RUN_DIR/haproxy.cfg"; PX[haproxy]=$LAST_PID; wait_port 9200 "$LAST_PID"
start nginx "$PROXY_CPU" nginx -p "$RUN_DIR/nginx-proxy/" -c "$RUN_DIR/nginx-proxy/nginx.conf" -e "$RUN_DIR/nginx-proxy/logs/error.log"; PX[nginx]=$LAST_PID; wait_port 9300 "$LAST_PID"
start capataz "$PROXY_CPU" env CAPATAZ_WORKER_THREADS=1 "$CAPATAZ_BIN" run --config "$BENCH_DIR/capataz.toml"; PX[capataz]=$LAST_PID; wait_port 9400 "$LAST_PID"
sleep 3   # a few rounds of health checks
TARGETS="capataz haproxy nginx"
for t in $TARGETS; do
    curl -sf --max-time 2 -o /dev/null "${URL[$t]}" || die "$t does not answer"
done
printf 'target\tphase\tconns\tround\trss_kb\tpss_kb\trps\n' >"$RES"
for t in $TARGETS; do
    printf '%s\tidle\t0\t0\t%d\t%d\t0\n' "$t" "$(mem_kb "${PX[$t]}" VmRSS)" "$(pss_kb "${PX[$t]}")" >>"$RES"
done

for c in $CONNS; do
    for ((r = 1; r <= ROUNDS; r++)); do
        for t in $TARGETS; do
            pid=${PX[$t]} out=$RUN_DIR/wrk-$t-c$c-r$r.txt peak=0
            ( pin "$OTHER_CPU" wrk -t1 -c"$c" -d"$DURATION" "${URL[$t]}" ) >"$out" 2>&1 &
            wrk_pid=$!; PIDS+=("$wrk_pid"); PNAME[$wrk_pid]=wrk
            while alive "$wrk_pid"; do
                v=$(mem_kb "$pid" VmRSS); (( v > peak )) && peak=$v
                sleep 0.2
            done
            wait "$wrk_pid" || die "wrk failed: $(cat "$out")"
            forget_pid "$wrk_pid"
            rps=$(awk '/^Requests\/sec:/{print $2}' "$out")
            errs=$(awk '/Socket errors|Non-2xx/' "$out")
            [[ -z $errs ]] || log "$t: $errs"
            printf '%s\tpeak\t%d\t%d\t%d\t%d\t%s\n' "$t" "$c" "$r" "$peak" "$(pss_kb "$pid")" "$rps" >>"$RES"
            printf '%s\tafter\t%d\t%d\t%d\t%d\t0\n' "$t" "$c" "$r" "$(mem_kb "$pid" VmRSS)" "$(pss_kb "$pid")" >>"$RES"
            log "$t c=$c round $r: $rps req/s, peak RSS $peak KiB"
        done
    done
done

{
    echo
    echo "# memory.sh $STAMP: $(machine_line)"
    echo "# wrk -t1 -d$DURATION, proxies on cpu ${PROXY_CPU:-any}, backend+wrk on cpu ${OTHER_CPU:-any}, medians of $ROUNDS; raw: $RES"
    printf '%-8s %6s %10s %12s %12s %12s %10s\n' target conns "idle KiB" "peak KiB" "after KiB" "peak PSS" "req/s"
    for t in $TARGETS; do
        idle=$(awk -F'\t' -v t="$t" '$1==t && $2=="idle"{print $5}' "$RES")
        for c in $CONNS; do
            peak=$(awk -F'\t' -v t="$t" -v c="$c" '$1==t && $2=="peak" && $3==c{print $5}' "$RES" | median)
            after=$(awk -F'\t' -v t="$t" -v c="$c" '$1==t && $2=="after" && $3==c{print $5}' "$RES" | median)
            pss=$(awk -F'\t' -v t="$t" -v c="$c" '$1==t && $2=="peak" && $3==c{print $6}' "$RES" | median)
            rps=$(awk -F'\t' -v t="$t" -v c="$c" '$1==t && $2=="peak" && $3==c{print $7}' "$RES" | median)
            printf '%-8s %6s %10s %12s %12s %12s %10.0f\n' "$t" "$c" "$idle" "$peak" "$after" "$pss" "$rps"
        done
    done
    echo "# RSS of the process and its children (nginx: master + 1 worker; PSS splits their shared pages)."
} | tee "$RUN_DIR/summary-$STAMP.txt"
