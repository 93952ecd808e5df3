#!/usr/bin/env bash
# bench/ab.sh - CPU per request of two or more capataz builds (and HAProxy, if asked), round by
# round on the peers.sh layout, for deciding whether a change pays on a noisy shared machine.
#
# The shared harness's backend nginx (127.0.0.1:9101/:9102) on OTHER_CPU; every target runs at
# once, idle but for its health checks, pinned to PROXY_CPU with one thread: capataz build N on
# 127.0.0.1:(9470+N) with bench/capataz.toml (admin on 9970+N), HAProxy with the shared
# haproxy.cfg on :9200. Each round loads every target in turn with `wrk -t1 -c CONNS` for
# DURATION after a 1 s warm-up, the order rotating from round to round, and reads the target's
# CPU time from /proc (user + system, children included) around the run.
# Figures: per target the median req/s, p99 and CPU us/req over the rounds; then each target
# against the first, round by round: the median of the per-round CPU ratios, and in how many
# rounds it was the cheaper. A round lands in a quiet or a busy minute of the host for every
# target alike, which is what pairing buys.
#
# Usage: bench/ab.sh BIN_A BIN_B... [haproxy]
#        env: ROUNDS=9 DURATION=5s CONNS=50 PROXY_CPU=0 OTHER_CPU=1 RUN_DIR=/tmp/bench-ab
#             SHARED=../shared/bench
# Runtime: about ROUNDS x targets x (DURATION + 1.5 s).
set -Eeuo pipefail
LOG_TAG=ab
source "$(dirname "$0")/common.sh"

ROUNDS=${ROUNDS:-9} DURATION=${DURATION:-5s} CONNS=${CONNS:-50}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-ab}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
(( $# >= 2 )) || die "usage: bench/ab.sh BIN_A BIN_B... [haproxy]"
(( $# <= 9 )) || die "at most 9 targets"
need_tools wrk nginx haproxy curl ss
mkdir -p "$RUN_DIR/nginx-backend"/{logs,tmp}
ports=(9101 9102)
for ((i = 0; i < $#; i++)); do ports+=($((9470 + i)) $((9970 + i))); done
for p in "${ports[@]}" 9200 9201; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done

cp "$SHARED/backend-nginx.conf" "$RUN_DIR/nginx-backend/nginx.conf"
start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port 9101 "$LAST_PID"; wait_port 9102 "$LAST_PID"

names=() urls=() pids=()
i=0
for target in "$@"; do
    if [[ $target == haproxy ]]; then
        start haproxy "$PROXY_CPU" haproxy -db -f "$SHARED/haproxy.cfg"
        names+=(haproxy) urls+=(http://127.0.0.1:9200/) pids+=("$LAST_PID")
        wait_port 9200 "$LAST_PID"
    else
        [[ -x $target ]] || die "not an executable: $target"
        port=$((9470 + i)) admin=$((9970 + i))
        config=$RUN_DIR/capataz-$i.toml
        sed "s/127\.0\.0\.1:9400/127.0.0.1:$port/" "$BENCH_DIR/capataz.toml" >"$config"
        printf '\n[admin]\naddress = "127.0.0.1:%s"\n' "$admin" >>"$config"
        start "capataz-$i" "$PROXY_CPU" env CAPATAZ_WORKER_THREADS=1 "$target" run --config "$config"
        names+=("$i:$(basename "$target")") urls+=("http://127.0.0.1:$port/") pids+=("$LAST_PID")
        wait_port "$port" "$LAST_PID"
    fi
    i=$((i + 1))
done
sleep 2.5   # health checks: rise 2 at 1 s

results=$RUN_DIR/results.tsv
printf 'round\ttarget\trps\tp99_ms\tcpu_us_per_req\n' >"$results"
n=${#names[@]}
for ((r = 1; r <= ROUNDS; r++)); do
    for ((k = 0; k < n; k++)); do
        t=$(((k + r - 1) % n))
        (pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d1s "${urls[t]}" >/dev/null)
        before=$(proc_ticks "${pids[t]}")
        out=$(pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --latency "${urls[t]}")
        after=$(proc_ticks "${pids[t]}")
        requests=$(awk '/requests in/ {print $1}' <<<"$out")
        rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
        p99=$(awk '$1 == "99%" {v = $2; if (v ~ /us$/) v = v / 1000; else if (v ~ /ms$/) v = v + 0; else if (v ~ /s$/) v = v * 1000; print v}' <<<"$out")
        cpu=$(calc "($after - $before) * 1000000 / $CLK_TCK / $requests")
        printf '%s\t%s\t%s\t%s\t%.2f\n' "$r" "${names[t]}" "$rps" "$p99" "$cpu" >>"$results"
        log "round $r ${names[t]}: $rps req/s, p99 $p99 ms, $(printf '%.2f' "$cpu") us/req"
    done
done

echo "# bench/ab.sh $(date +%Y%m%dT%H%M%S): $(machine_line)"
echo "# wrk -t1 -c$CONNS -d$DURATION, $ROUNDS rounds, targets on cpu $PROXY_CPU; raw: $results"
printf '%-28s %10s %9s %12s   %s\n' target "req/s" "p99 ms" "CPU us/req" "against ${names[0]} (median per-round CPU ratio, rounds cheaper)"
for ((k = 0; k < n; k++)); do
    col() { awk -F'\t' -v t="${names[k]}" -v c="$1" 'NR > 1 && $2 == t {print $c}' "$results" | median; }
    versus=$(awk -F'\t' -v a="${names[0]}" -v b="${names[k]}" '
        NR > 1 && $2 == a { base[$1] = $5 }
        NR > 1 && $2 == b { mine[$1] = $5 }
        END {
            for (r in mine) if (r in base && base[r] > 0) { n++; q[n] = mine[r] / base[r]; w += (mine[r] < base[r]) }
            for (i = 2; i <= n; i++) for (j = i; j > 1 && q[j-1] > q[j]; j--) { t = q[j]; q[j] = q[j-1]; q[j-1] = t }
            if (n) printf "%.3fx, cheaper in %d of %d", (n % 2) ? q[(n+1)/2] : (q[n/2] + q[n/2+1]) / 2, w, n
        }' "$results")
    printf '%-28s %10.0f %9.2f %12.2f   %s\n' "${names[k]}" "$(col 3)" "$(col 4)" "$(col 5)" "$versus"
done
