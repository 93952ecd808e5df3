#!/usr/bin/env bash
# bench/instructions.sh - user-space instructions per proxied request, capataz's and HAProxy's,
# counted by callgrind: a deterministic figure for comparing two builds, or capataz with its
# peer, on a noisy machine where CPU time per request moves +-10 % with the neighbours. (It
# counts user space only; the kernel's share, about 2/3 of either proxy's CPU in this
# benchmark, is not in it: compare syscalls with strace -c for that.)
#
# Setup as in bench/peers.sh: the shared harness's backend nginx (127.0.0.1:9101/:9102) on
# OTHER_CPU, capataz with bench/capataz.toml (:9400, one worker thread) under callgrind, wrk -t1
# with CONNS connections. Counting starts after a 3 s warm-up (callgrind_control -z) and is
# dumped after DURATION of load; instructions / requests served in that window.
#
# Usage: bench/instructions.sh [BIN[,CONFIG]...]   (default: build this tree, measure it, then
#        HAProxy; the word `haproxy` measures HAProxy with the shared harness's haproxy.cfg on
#        :9200, the word `nginx` nginx with its proxy-nginx.conf on :9300 (one process, master
#        off); BIN,CONFIG runs BIN with CONFIG, on the port of CONFIG's first listener, and
#        haproxy,CFG runs HAProxy with CFG on its first `bind`, e.g. bench/haproxy-rules.cfg)
#        env: CONNS=50 DURATION=10s OTHER_CPU=1 RUN_DIR=/tmp/bench-instructions SHARED=../shared/bench
#             CONFIG=bench/capataz.toml (capataz's config when a BIN names none;
#             bench/capataz-latency.toml has latency outliers on, for the cost of latency tracking:
#             run both against the same binary)
#             URL_PATH=/ HEADER= (the path wrk asks for, and one header it sends, e.g.
#             URL_PATH=/api/ HEADER='X-Debug: 1' for bench/capataz-rules.toml, see bench/rules.sh)
#             CALLGRIND_OPTS= (more callgrind options for every target, e.g. "--cache-sim=yes
#             --branch-sim=yes" for simulated cache misses and mispredicted branches, shown by
#             callgrind_annotate; the per-request figure printed stays the instructions')
# Needs: valgrind (callgrind, callgrind_control, callgrind_annotate), wrk, nginx, curl, ss, and
# haproxy to measure it.
set -Eeuo pipefail
LOG_TAG=instructions
source "$(dirname "$0")/common.sh"

CONNS=${CONNS:-50} DURATION=${DURATION:-10s} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-instructions}
CONFIG=${CONFIG:-$BENCH_DIR/capataz.toml}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
URL_PATH=${URL_PATH:-/} HEADER=${HEADER:-}
read -r -a callgrind_opts <<<"${CALLGRIND_OPTS:-}"
wrk_args=()
if [[ -n $HEADER ]]; then wrk_args=(-H "$HEADER"); fi
mkdir -p "$RUN_DIR/nginx-backend"/{logs,tmp}

if ! command -v callgrind_control >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi
bins=("$@")
if [[ ${#bins[@]} -eq 0 ]]; then
    build_capataz
    bins=("$CAPATAZ_BIN" haproxy)
fi
tools=(wrk nginx curl ss valgrind callgrind_control callgrind_annotate)
if [[ " ${bins[*]} " == *" haproxy "* ]]; then tools+=(haproxy); fi
need_tools "${tools[@]}"
for p in 9101 9102 9200 9201 9202 9300 9400 9401; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done

cp "$SHARED/backend-nginx.conf" "$RUN_DIR/nginx-backend/nginx.conf"
start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port 9101 "$LAST_PID"; wait_port 9102 "$LAST_PID"

for arg in "${bins[@]}"; do
    bin=${arg%%,*} config=$CONFIG
    if [[ $arg == *,* ]]; then config=${arg#*,}; fi
    out=$RUN_DIR/$(basename "$bin")-$(basename "$config" .toml).cg
    rm -f "$out" "$out".*
    if [[ $bin == haproxy ]]; then
        # The peer, as peers.sh runs it: the shared harness's haproxy.cfg (:9200, one thread),
        # or the config given (on its first `bind`).
        if [[ $arg != *,* ]]; then config=$SHARED/haproxy.cfg; fi
        out=$RUN_DIR/haproxy-$(basename "$config" .cfg).cg
        rm -f "$out" "$out".*
        port=$(sed -n 's/^ *bind 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$config" | head -1)
        start haproxy "" valgrind --tool=callgrind ${callgrind_opts[@]+"${callgrind_opts[@]}"} --callgrind-out-file="$out" \
            haproxy -db -f "$config"
    elif [[ $bin == nginx ]]; then
        # The peer, as peers.sh runs it: the shared harness's proxy-nginx.conf (:9300, one
        # worker), as a single process (`master_process off`) so that callgrind sees the worker.
        mkdir -p "$RUN_DIR/nginx-proxy"/{logs,tmp}
        cp "$SHARED/proxy-nginx.conf" "$RUN_DIR/nginx-proxy/nginx.conf"
        out=$RUN_DIR/nginx-proxy.cg
        rm -f "$out" "$out".*
        port=9300
        start nginx-proxy "" valgrind --tool=callgrind ${callgrind_opts[@]+"${callgrind_opts[@]}"} --callgrind-out-file="$out" \
            nginx -p "$RUN_DIR/nginx-proxy/" -c "$RUN_DIR/nginx-proxy/nginx.conf" \
            -e "$RUN_DIR/nginx-proxy/logs/error.log" -g 'master_process off;'
    else
        port=$(sed -n 's/^address = "127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$config" | head -1)
        start capataz "" env CAPATAZ_WORKER_THREADS=1 valgrind --tool=callgrind \
            ${callgrind_opts[@]+"${callgrind_opts[@]}"} --callgrind-out-file="$out" "$bin" run --config "$config"
    fi
    pid=$LAST_PID
    wait_port "$port" "$pid" 60
    (pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d3s ${wrk_args[@]+"${wrk_args[@]}"} "http://127.0.0.1:$port$URL_PATH" >/dev/null)
    callgrind_control -z "$pid" >/dev/null
    (pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" ${wrk_args[@]+"${wrk_args[@]}"} "http://127.0.0.1:$port$URL_PATH" >"$out.wrk")
    callgrind_control -d "$pid" >/dev/null
    stop_named "$pid"
    requests=$(awk '/requests in/ {print $1}' "$out.wrk")
    ir=$(callgrind_annotate "$out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    printf '%s\trequests %s\tinstructions %s\tper request %s\n' "$arg" "$requests" "$ir" \
        "$(calc "int($ir / $requests)")"
done
