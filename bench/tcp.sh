#!/usr/bin/env bash
# bench/tcp.sh - TCP mode against HAProxy's `mode tcp`, same run: redis-benchmark through each
# proxy to the same redis-server, requests per second and proxy CPU per request.
#
# One redis-server (Debian's, :9130, no persistence) on OTHER_CPU; capataz (a `mode = "tcp"`
# listener on :9131, bench/capataz-tcp.toml, CAPATAZ_WORKER_THREADS=1, its tcp PING/+PONG probe
# and passive checks on, as an operator would run it) and HAProxy (bench/haproxy-tcp.cfg: `mode
# tcp`, `nbthread 1`, a `tcp-check` PING probe, :9132) both pinned to PROXY_CPU;
# redis-benchmark (`-c CONNS -n REQUESTS -t TESTS`, keep-alive connections, no pipelining) on
# OTHER_CPU, against each proxy in turn, ROUNDS times,
# interleaved. Per proxy and test: the median over rounds of redis-benchmark's requests/s and
# p99, and of the proxy's CPU time (utime+stime from /proc) per request over the run.
#
# Usage: bench/tcp.sh   (env: CONNS=50 REQUESTS=200000 TESTS=ping_inline,set,get ROUNDS=5
#                        PROXY_CPU=0 OTHER_CPU=1 RUN_DIR=/tmp/bench-tcp CAPATAZ_BIN=...)
# Runtime: about 2-3 min with the defaults.
set -Eeuo pipefail
LOG_TAG=tcp
source "$(dirname "$0")/common.sh"

CONNS=${CONNS:-50} REQUESTS=${REQUESTS:-200000} TESTS=${TESTS:-ping_inline,set,get}
ROUNDS=${ROUNDS:-5} PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-tcp}
mkdir -p "$RUN_DIR"
STAMP=$(date +%Y%m%dT%H%M%S)
RES=$RUN_DIR/results-$STAMP.tsv
TICK_US=$(( 1000000 / $(getconf CLK_TCK) ))

for cmd in redis-server redis-benchmark haproxy; do
    command -v "$cmd" >/dev/null || die "missing command: $cmd (bash .ci/deps/redis.sh; apt-get install haproxy)"
done
for p in 9130 9131 9132; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done
build_capataz
log "host: $(nproc) vCPU $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), kernel $(uname -r), $(redis-server --version | cut -d' ' -f1-3), $(haproxy -v | head -1)"

start redis "$OTHER_CPU" redis-server --port 9130 --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$RUN_DIR" --logfile "$RUN_DIR/redis.log"
wait_port 9130 "$LAST_PID"

cp "$BENCH_DIR/capataz-tcp.toml" "$RUN_DIR/capataz.toml"
CAPATAZ_WORKER_THREADS=1 start capataz "$PROXY_CPU" "$CAPATAZ_BIN" run --config "$RUN_DIR/capataz.toml"
wait_port 9131 "$LAST_PID"
PID_capataz=$LAST_PID

cp "$BENCH_DIR/haproxy-tcp.cfg" "$RUN_DIR/haproxy.cfg"
start haproxy "$PROXY_CPU" haproxy -f "$RUN_DIR/haproxy.cfg" -db
wait_port 9132 "$LAST_PID"
PID_haproxy=$LAST_PID
declare -A PORT=([capataz]=9131 [haproxy]=9132) PID=([capataz]=$PID_capataz [haproxy]=$PID_haproxy)

printf 'round\tproxy\ttest\treq_s\tp99_ms\tcpu_us_per_req\n' >"$RES"
for round in $(seq "$ROUNDS"); do
    for proxy in capataz haproxy; do
        before=$(proc_ticks "${PID[$proxy]}")
        out=$(taskset -c "$OTHER_CPU" redis-benchmark -h 127.0.0.1 -p "${PORT[$proxy]}" \
            -c "$CONNS" -n "$REQUESTS" -t "$TESTS" --csv)
        after=$(proc_ticks "${PID[$proxy]}")
        tests=$(grep -c '^"' <<<"$out" | awk '{print $1 - 1}')
        cpu=$(calc "($after - $before) * $TICK_US / ($REQUESTS * $tests)")
        # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
        while IFS=, read -r test rps _ _ _ _ p99 _; do
            test=${test//\"/} rps=${rps//\"/} p99=${p99//\"/}
            [[ $test == test ]] && continue
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$proxy" "$test" "$rps" "$p99" "$cpu" >>"$RES"
        done <<<"$out"
        log "round $round $proxy: $(awk -F'\t' -v r="$round" -v p="$proxy" '$1==r && $2==p {printf "%s %s req/s p99 %s ms; ", $3, $4, $5}' "$RES") CPU ${cpu} us/request"
    done
done

echo
echo "redis-benchmark -c $CONNS -n $REQUESTS x $ROUNDS rounds, medians (CPU: the proxy's, per request over all tests):"
printf '%-8s %-12s %10s %8s %12s\n' proxy test req_s p99_ms cpu_us_req
for proxy in capataz haproxy; do
    for test in $(awk -F'\t' 'NR>1{print $3}' "$RES" | sort -u); do
        col() { awk -F'\t' -v p="$proxy" -v t="$test" -v c="$1" '$2==p && $3==t {print $c}' "$RES" | median; }
        printf '%-8s %-12s %10s %8s %12s\n' "$proxy" "$test" "$(col 4)" "$(col 5)" "$(col 6)"
    done
done
log "raw figures: $RES"
