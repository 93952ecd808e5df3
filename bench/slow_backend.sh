#!/usr/bin/env bash
# bench/slow_backend.sh - the latency-aware choice with one slow backend: round_robin,
# least_request and peak_ewma in the same run, the client's p50 and p99 for each.
#
# Three backends (bench/delay_backend.py, Debian's python3: b1 and b2 answer at once, b3 after
# SLOW_MS, default 50 ms) behind three capataz instances, one per algorithm (:9410
# round_robin, :9411 least_request, :9412 peak_ewma; CAPATAZ_WORKER_THREADS=1, pinned to
# PROXY_CPU), all over the same backends. wrk (-t1, CONNS connections, DURATION, --latency,
# on OTHER_CPU with the backends) loads one instance at a time, interleaved, ROUNDS times.
# Figures per algorithm: median over rounds of wrk's p50, p99 and requests/s, and the slow
# backend's share of the requests (read from the backends' /count before and after each run).
# No peer proxy: HAProxy and nginx OSS have no latency-aware algorithm (HAProxy's leastconn
# is least_request's kind).
#
# Usage: bench/slow_backend.sh   (env: SLOW_MS=50 CONNS=16 DURATION=10s ROUNDS=3 PROXY_CPU=0
#                                 OTHER_CPU=1 RUN_DIR=/tmp/bench-slow-backend CAPATAZ_BIN=...)
# Runtime: about 2 min with the defaults (10 s x 3 algorithms x 3 rounds, plus start-up).
set -Eeuo pipefail
LOG_TAG=slow-backend
source "$(dirname "$0")/common.sh"

SLOW_MS=${SLOW_MS:-50} CONNS=${CONNS:-16} DURATION=${DURATION:-10s} ROUNDS=${ROUNDS:-3}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-slow-backend}
PYTHON=${PYTHON:-/usr/bin/python3}
mkdir -p "$RUN_DIR"
STAMP=$(date +%Y%m%dT%H%M%S)
RES=$RUN_DIR/results-$STAMP.tsv
ALGORITHMS=(round_robin least_request peak_ewma)

command -v wrk >/dev/null || need_tools wrk
for p in 9121 9122 9123 9410 9411 9412; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done
build_capataz
log "host: $(nproc) vCPU $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), kernel $(uname -r), $(wrk -v 2>&1 | head -1)"

start b1 "$OTHER_CPU" "$PYTHON" "$BENCH_DIR/delay_backend.py" 9121 b1 0; wait_port 9121 "$LAST_PID"
start b2 "$OTHER_CPU" "$PYTHON" "$BENCH_DIR/delay_backend.py" 9122 b2 0; wait_port 9122 "$LAST_PID"
start b3 "$OTHER_CPU" "$PYTHON" "$BENCH_DIR/delay_backend.py" 9123 b3 "$SLOW_MS"; wait_port 9123 "$LAST_PID"

port=9410
declare -A PORT=()
for algorithm in "${ALGORITHMS[@]}"; do
    cat >"$RUN_DIR/$algorithm.toml" <<TOML
[log]
level = "warn"

[[listeners]]
address = "127.0.0.1:$port"
forwarded_headers = false

[pools.bench]
algorithm = "$algorithm"
backends = [
    { name = "b1", address = "127.0.0.1:9121" },
    { name = "b2", address = "127.0.0.1:9122" },
    { name = "b3", address = "127.0.0.1:9123" },
]

[pools.bench.active]
kind = "none"
TOML
    CAPATAZ_WORKER_THREADS=1 start "capataz-$algorithm" "$PROXY_CPU" "$CAPATAZ_BIN" run --config "$RUN_DIR/$algorithm.toml"
    wait_port "$port" "$LAST_PID"
    PORT[$algorithm]=$port
    port=$((port + 1))
done

count() { curl -fsS "http://127.0.0.1:$1/count"; }
to_ms() { # wrk's "1.23ms", "456.00us", "1.02s" in milliseconds
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000; print n }'
}

printf 'round\talgorithm\tp50_ms\tp99_ms\treq_s\tslow_share\n' >"$RES"
for round in $(seq "$ROUNDS"); do
    for algorithm in "${ALGORITHMS[@]}"; do
        before=($(count 9121) $(count 9122) $(count 9123))
        out=$(taskset -c "$OTHER_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:${PORT[$algorithm]}/")
        after=($(count 9121) $(count 9122) $(count 9123))
        p50=$(to_ms "$(awk '$1=="50%"{print $2}' <<<"$out")")
        p99=$(to_ms "$(awk '$1=="99%"{print $2}' <<<"$out")")
        rps=$(awk '/^Requests\/sec/{print $2}' <<<"$out")
        total=$(( after[0] - before[0] + after[1] - before[1] + after[2] - before[2] ))
        share=$(calc "$(( after[2] - before[2] )) / ($total > 0 ? $total : 1)")
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$algorithm" "$p50" "$p99" "$rps" "$share" >>"$RES"
        log "round $round $algorithm: p50 ${p50} ms, p99 ${p99} ms, ${rps} req/s, slow share $share"
    done
done

echo
echo "slow backend +${SLOW_MS} ms, $CONNS connections, $DURATION x $ROUNDS rounds (medians):"
printf '%-14s %10s %10s %10s %11s\n' algorithm p50_ms p99_ms req_s slow_share
for algorithm in "${ALGORITHMS[@]}"; do
    col() { awk -F'\t' -v a="$algorithm" -v c="$1" '$2==a{print $c}' "$RES" | median; }
    printf '%-14s %10s %10s %10s %11s\n' "$algorithm" "$(col 3)" "$(col 4)" "$(col 5)" "$(col 6)"
done
log "raw figures: $RES"
