#!/usr/bin/env bash
# bench/instructions.sh - capataz's user-space instructions per proxied request, counted by
# callgrind: a deterministic figure for comparing two builds on a noisy machine, where CPU time
# per request moves +-10 % with the neighbours. (It counts user space only; the kernel's share,
# about 60 % of capataz's CPU in this benchmark, is not in it.)
#
# Setup as in bench/peers.sh: the shared harness's backend nginx (127.0.0.1:9101/:9102) on
# OTHER_CPU, capataz with bench/capataz.toml (:9400, one worker thread) under callgrind, wrk -t1
# with CONNS connections. Counting starts after a 3 s warm-up (callgrind_control -z) and is
# dumped after DURATION of load; instructions / requests served in that window.
#
# Usage: bench/instructions.sh [BIN...]   (default: build and measure this tree)
#        env: CONNS=50 DURATION=10s OTHER_CPU=1 RUN_DIR=/tmp/bench-instructions SHARED=../shared/bench
# Needs: valgrind (callgrind, callgrind_control, callgrind_annotate), wrk, nginx, curl, ss.
set -Eeuo pipefail
LOG_TAG=instructions
source "$(dirname "$0")/common.sh"

CONNS=${CONNS:-50} DURATION=${DURATION:-10s} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-instructions}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
mkdir -p "$RUN_DIR/nginx-backend"/{logs,tmp}

if ! command -v callgrind_control >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi
need_tools wrk nginx curl ss valgrind callgrind_control callgrind_annotate
for p in 9101 9102 9400; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done
bins=("$@")
if [[ ${#bins[@]} -eq 0 ]]; then
    build_capataz
    bins=("$CAPATAZ_BIN")
fi

cp "$SHARED/backend-nginx.conf" "$RUN_DIR/nginx-backend/nginx.conf"
start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port 9101 "$LAST_PID"; wait_port 9102 "$LAST_PID"

for bin in "${bins[@]}"; do
    out=$RUN_DIR/$(basename "$bin").cg
    rm -f "$out" "$out".*
    start capataz "" env CAPATAZ_WORKER_THREADS=1 valgrind --tool=callgrind \
        --callgrind-out-file="$out" "$bin" run --config "$BENCH_DIR/capataz.toml"
    pid=$LAST_PID
    wait_port 9400 "$pid" 60
    (pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d3s http://127.0.0.1:9400/ >/dev/null)
    callgrind_control -z "$pid" >/dev/null
    (pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" http://127.0.0.1:9400/ >"$out.wrk")
    callgrind_control -d "$pid" >/dev/null
    stop_named "$pid"
    requests=$(awk '/requests in/ {print $1}' "$out.wrk")
    ir=$(callgrind_annotate "$out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    printf '%s\trequests %s\tinstructions %s\tper request %s\n' "$bin" "$requests" "$ir" \
        "$(calc "int($ir / $requests)")"
done
