#!/usr/bin/env bash
# bench/instructions-tcp.sh - user-space instructions per relayed request and per session in
# TCP mode, capataz's and HAProxy's, counted by callgrind (the TCP counterpart of
# bench/instructions.sh; user space only, the kernel's share is not in it).
#
# One redis-server (:9130, no persistence) on OTHER_CPU; the proxy under callgrind with the
# configs of bench/tcp.sh (capataz: bench/capataz-tcp.toml on :9131, one worker thread;
# HAProxy: bench/haproxy-tcp.cfg on :9132); redis-benchmark on OTHER_CPU. After a warm-up
# (`-n 5000`), two counted windows (callgrind_control -z, load, -d), each a fixed number of
# requests, so the count does not depend on the machine's speed:
#   keep-alive  `-c CONNS -n REQUESTS -t ping_inline`: CONNS sessions, one PING after the
#               other on each (a read and a write each way per request); instructions / REQUESTS
#   sessions    `-c CONNS -n SESSIONS -t ping_inline -k 0`: a new client connection (and so a
#               new backend connection) for every request; instructions / SESSIONS, a whole
#               session (accept, connect, one request and answer, both closes)
#
# Usage: bench/instructions-tcp.sh [BIN...]   (default: build this tree, measure it, then
#        HAProxy; the word `haproxy` measures HAProxy)
#        env: CONNS=50 REQUESTS=100000 SESSIONS=10000 OTHER_CPU=1 RUN_DIR=/tmp/bench-instructions-tcp
# Needs: valgrind, redis-server and redis-benchmark (bash .ci/deps/redis.sh), haproxy.
set -Eeuo pipefail
LOG_TAG=instructions-tcp
source "$(dirname "$0")/common.sh"

CONNS=${CONNS:-50} REQUESTS=${REQUESTS:-100000} SESSIONS=${SESSIONS:-10000} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-instructions-tcp}
mkdir -p "$RUN_DIR"

for cmd in redis-server redis-benchmark redis-cli valgrind callgrind_control callgrind_annotate; do
    command -v "$cmd" >/dev/null || die "missing command: $cmd (bash .ci/deps/redis.sh; apt-get install valgrind)"
done
bins=("$@")
if [[ ${#bins[@]} -eq 0 ]]; then
    build_capataz
    bins=("$CAPATAZ_BIN" haproxy)
fi
if [[ " ${bins[*]} " == *" haproxy "* ]]; then command -v haproxy >/dev/null || die "missing command: haproxy"; fi
for p in 9130 9131 9132; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done
log "host: $(nproc) vCPU, kernel $(uname -r), $(redis-server --version | cut -d' ' -f1-3), $(haproxy -v | head -1)"

start redis "$OTHER_CPU" redis-server --port 9130 --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$RUN_DIR" --logfile "$RUN_DIR/redis.log"
wait_port 9130 "$LAST_PID"

bench() { # bench PORT ARGS...: redis-benchmark on OTHER_CPU, its CSV kept; fails on errors
    local port=$1; shift
    (pin "$OTHER_CPU" redis-benchmark -h 127.0.0.1 -p "$port" -c "$CONNS" -t ping_inline --csv "$@")
}
counted() { # counted CG_FILE: instructions in a callgrind dump
    callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

for bin in "${bins[@]}"; do
    name=$(basename "$bin")
    out=$RUN_DIR/$name.cg
    rm -f "$out" "$out".*
    if [[ $bin == haproxy ]]; then
        port=9132
        start haproxy "" valgrind --tool=callgrind --callgrind-out-file="$out" \
            haproxy -db -f "$BENCH_DIR/haproxy-tcp.cfg"
    else
        port=9131
        start capataz "" env CAPATAZ_WORKER_THREADS=1 valgrind --tool=callgrind \
            --callgrind-out-file="$out" "$bin" run --config "$BENCH_DIR/capataz-tcp.toml"
    fi
    pid=$LAST_PID
    wait_port "$port" "$pid" 60
    # Relayed, not refused: a PING through the proxy answers +PONG.
    [[ $(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]] ||
        die "$name: no PONG through 127.0.0.1:$port"
    bench "$port" -n 5000 >/dev/null
    callgrind_control -z "$pid" >/dev/null
    bench "$port" -n "$REQUESTS" >"$out.keepalive.csv"
    callgrind_control -d "$pid" >/dev/null
    callgrind_control -z "$pid" >/dev/null
    bench "$port" -n "$SESSIONS" -k 0 >"$out.sessions.csv"
    callgrind_control -d "$pid" >/dev/null
    stop_named "$pid"
    ka=$(counted "$out.1") se=$(counted "$out.2")
    printf '%s\tkeep-alive: %s requests, %s instructions, per request %s\tsessions: %s, %s instructions, per session %s\n' \
        "$bin" "$REQUESTS" "$ka" "$(calc "int($ka / $REQUESTS)")" "$SESSIONS" "$se" "$(calc "int($se / $SESSIONS)")"
done
