#!/usr/bin/env bash
# bench/overload.sh - the tail under load near each proxy's own maximum: capataz, HAProxy and
# nginx, same run, interleaved, with an open-loop (constant-rate) load.
#
# The shared harness's two nginx backends (127.0.0.1:9101/:9102) and the load generators on
# OTHER_CPU; each proxy one thread on PROXY_CPU (only the one under load is busy): capataz
# (bench/capataz.toml, :9400), HAProxy (the harness's haproxy.cfg, :9200), nginx (the
# harness's proxy-nginx.conf, :9300).
# 1. Each proxy's maximum: `wrk -t1 -cCONNS -dMAX_DURATION`, MAX_ROUNDS interleaved rounds,
#    the median requests/s.
# 2. FRACTION (0.9) of its own maximum, offered at a constant rate by bench/openload (open
#    loop: a request is due every CONNS/rate seconds on each connection whatever the answers
#    do, and a late one's latency counts from when it was due; see bench/openload/src/main.rs)
#    for DURATION seconds after 2 s of warm-up, ROUNDS interleaved rounds: per round the
#    latency percentiles, the achieved rate, the proxy's and openload's CPU time per request,
#    the share of each core the benchmark's processes used (the proxy on PROXY_CPU; openload
#    and the backends on OTHER_CPU) and how busy each core was (/proc/stat, anyone's work;
#    steal counts as busy), which tell whose core set the pace of a round that missed its rate.
# Then the medians per proxy and, round by round, capataz's p99 over HAProxy's and nginx's.
#
# Usage: flock /tmp/capataz-bench.lock bench/overload.sh
#        env: CONNS=50 FRACTION=0.9 DURATION=10 ROUNDS=5 MAX_DURATION=5s MAX_ROUNDS=3
#             PROXY_CPU=0 OTHER_CPU=1 RUN_DIR=/tmp/bench-overload SHARED=../shared/bench
#             CAPATAZ_BIN=... (default: a release build of this tree) TARGETS="capataz haproxy nginx"
#             RATE=N: offer N requests/s to every target instead (the maximums are still shown),
#             to compare builds or settings at one rate; OPENLOAD=path: that openload binary
#             instead of a release build of this tree's
# Needs: wrk, nginx, haproxy, curl. Runtime: about 30 s + targets x (MAX_ROUNDS x MAX_DURATION
# + ROUNDS x (DURATION + 3 s)): 4 minutes with the defaults.
set -Eeuo pipefail
LOG_TAG=overload
source "$(dirname "$0")/common.sh"
in_own_session "$@"

CONNS=${CONNS:-50} FRACTION=${FRACTION:-0.9} DURATION=${DURATION:-10} ROUNDS=${ROUNDS:-5}
MAX_DURATION=${MAX_DURATION:-5s} MAX_ROUNDS=${MAX_ROUNDS:-3}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-overload}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
read -r -a TARGETS <<<"${TARGETS:-capataz haproxy nginx}"
mkdir -p "$RUN_DIR"/nginx-{backend,proxy}/{logs,tmp}
RES=$RUN_DIR/results-$(date +%Y%m%dT%H%M%S).tsv
TICK_US=$(( 1000000 / CLK_TCK ))

need_tools wrk nginx haproxy curl ss
for p in 9101 9102 9200 9300 9400; do
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
BACKEND_PID=$LAST_PID
wait_port 9101 "$LAST_PID"; wait_port 9102 "$LAST_PID"

declare -A PORT=([capataz]=9400 [haproxy]=9200 [nginx]=9300) PID=() MAX=()
for tgt in "${TARGETS[@]}"; do
    case $tgt in
        capataz) CAPATAZ_WORKER_THREADS=1 start "$tgt" "$PROXY_CPU" "$CAPATAZ_BIN" run --config "$BENCH_DIR/capataz.toml" ;;
        haproxy)
            cp "$SHARED/haproxy.cfg" "$RUN_DIR/haproxy.cfg"
            haproxy -c -q -f "$RUN_DIR/haproxy.cfg" || die "haproxy config check failed"
            start "$tgt" "$PROXY_CPU" haproxy -db -f "$RUN_DIR/haproxy.cfg" ;;
        nginx)
            cp "$SHARED/proxy-nginx.conf" "$RUN_DIR/nginx-proxy/nginx.conf"
            start "$tgt" "$PROXY_CPU" nginx -p "$RUN_DIR/nginx-proxy/" -c "$RUN_DIR/nginx-proxy/nginx.conf" -e "$RUN_DIR/nginx-proxy/logs/error.log" ;;
        *) die "unknown target: $tgt" ;;
    esac
    PID[$tgt]=$LAST_PID
    wait_port "${PORT[$tgt]}" "$LAST_PID"
done

# Each proxy must reach both backends (the harness's backends answer with X-Backend).
for tgt in "${TARGETS[@]}"; do
    deadline=$(( SECONDS + 15 ))
    until [[ $(for _ in 1 2 3 4; do curl -s --max-time 2 -D - -o /dev/null "http://127.0.0.1:${PORT[$tgt]}/"; done |
               tr -d '\r' | awk -F': ' 'tolower($1)=="x-backend"{print $2}' | sort -u | tr '\n' ' ') == "b1 b2 " ]]; do
        (( SECONDS < deadline )) || die "$tgt: does not reach both b1 and b2"
        sleep 0.5
    done
done

n=${#TARGETS[@]}
rm -f "$RUN_DIR"/max-*.txt  # an earlier run's rounds in the same RUN_DIR are not this run's median
for round in $(seq "$MAX_ROUNDS"); do
    for ((i = 0; i < n; i++)); do
        tgt=${TARGETS[(i + round - 1) % n]}
        out=$RUN_DIR/max-$round-$tgt.txt
        (pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d"$MAX_DURATION" "http://127.0.0.1:${PORT[$tgt]}/" >"$out")
        log "max round $round $tgt: $(awk '/^Requests\/sec/ {print $2}' "$out") req/s"
    done
done
for tgt in "${TARGETS[@]}"; do
    MAX[$tgt]=$(cat "$RUN_DIR"/max-*-"$tgt".txt | awk '/^Requests\/sec/ {print $2}' | median)
    log "$tgt: maximum ${MAX[$tgt]} req/s (median of $MAX_ROUNDS); offered $(calc "int(${MAX[$tgt]} * $FRACTION)")"
done

printf 'round\ttarget\toffered\tachieved\tp50_us\tp90_us\tp99_us\tp999_us\tmax_us\tcpu_us_per_req\tfailed\topenload_us_per_req\tproxy_share\tproxy_cpu_busy\tload_share\tother_cpu_busy\n' >"$RES"
field() { awk -v k="$2" '/^latency_us:/ { for (i = 2; i < NF; i += 2) if ($i == k) print $(i+1) }' "$1"; }
# cpu_jiffies N: CPU N's busy and total jiffies so far (/proc/stat: user..steal; guest time is
# already in user; idle and iowait are not busy, steal is: the vCPU wanted to run).
cpu_jiffies() { [[ -z $1 ]] || awk -v c="cpu$1" '$1 == c { t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
busy_pct() { [[ -z $1 || -z $2 ]] || awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); if (y[2] > x[2]) printf "%.0f", 100 * (y[1] - x[1]) / (y[2] - x[2]) }'; }
for round in $(seq "$ROUNDS"); do
    for ((i = 0; i < n; i++)); do
        tgt=${TARGETS[(i + round - 1) % n]}
        out=$RUN_DIR/open-$round-$tgt.txt
        rate=${RATE:-$(calc "int(${MAX[$tgt]} * $FRACTION)")}
        before=$(proc_ticks "${PID[$tgt]}") bbefore=$(proc_ticks "$BACKEND_PID")
        pbefore=$(cpu_jiffies "$PROXY_CPU") obefore=$(cpu_jiffies "$OTHER_CPU") t0=$(date +%s%N)
        (pin "$OTHER_CPU" "$RUN_DIR/openload" -r "$rate" -c "$CONNS" -d "$DURATION" -w 2 "http://127.0.0.1:${PORT[$tgt]}/" >"$out") ||
            die "$tgt: openload failed: $(cat "$out")"
        wall_us=$(( ($(date +%s%N) - t0) / 1000 ))
        after=$(proc_ticks "${PID[$tgt]}") bafter=$(proc_ticks "$BACKEND_PID")
        pbusy=$(busy_pct "$pbefore" "$(cpu_jiffies "$PROXY_CPU")") obusy=$(busy_pct "$obefore" "$(cpu_jiffies "$OTHER_CPU")")
        achieved=$(awk '/^rate:/ {print $5}' "$out")
        answered=$(awk '/^requests:/ {print $4}' "$out")
        failed=$(awk '/^requests:/ {print $6}' "$out")
        # The proxy's CPU over the whole run, warm-up included, per request sent.
        cpu=$(calc "($after - $before) * $TICK_US / ($rate * ($DURATION + 2))")
        # openload's own CPU (its cpu_us: line; none from an older build) per request, and the
        # share of the run's wall time each core gave the benchmark's processes: the proxy on
        # PROXY_CPU, openload and the backends on OTHER_CPU.
        gen=$(awk '/^cpu_us:/ {print $7}' "$out") gen_us=$(awk '/^cpu_us:/ {print $3 + $5}' "$out")
        pshare=$(calc "int(100 * ($after - $before) * $TICK_US / $wall_us + 0.5)")
        oshare=$([[ -z $gen_us ]] || calc "int(100 * (($bafter - $bbefore) * $TICK_US + $gen_us) / $wall_us + 0.5)")
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$tgt" "$rate" "$achieved" \
            "$(field "$out" p50)" "$(field "$out" p90)" "$(field "$out" p99)" "$(field "$out" p99.9)" \
            "$(field "$out" max)" "$cpu" "$failed" "$gen" "$pshare" "$pbusy" "$oshare" "$obusy" >>"$RES"
        log "round $round $tgt: offered $rate, achieved $achieved ($answered answered, $failed failed), p99 $(field "$out" p99) us, CPU $cpu us/request, openload ${gen:-?} us/request; CPU ${PROXY_CPU:-*}: proxy $pshare %, busy ${pbusy:-?} %; CPU ${OTHER_CPU:-*}: openload and backends ${oshare:-?} %, busy ${obusy:-?} %"
        # A round whose rate was not sustained measured a queue, not a tail: the proxy, or the
        # load generator and backends on OTHER_CPU, could not keep up with the rate that wrk's
        # maximum implied. Near 100 %, a share says whose core was full; a core busy well
        # beyond the benchmark's share ran something else too (another session's work).
        if [[ $(calc "($achieved < 0.99 * $rate) ? 1 : 0") == 1 ]]; then
            log "WARNING: round $round $tgt did not sustain the offered rate: its latencies are a queue's; lower FRACTION or see which core was saturated (shares above)"
        fi
    done
done

echo
echo "open loop at $FRACTION of each proxy's maximum (wrk -c$CONNS), $CONNS connections, ${DURATION} s x $ROUNDS rounds; medians:"
printf '%-8s %9s %9s %9s %8s %8s %8s %9s %9s %7s %9s %7s %7s\n' target max_rps offered achieved p50_us p90_us p99_us p99.9_us cpu_us_rq failed load_us_rq proxy_% load_%
col() { awk -F'\t' -v t="$1" -v c="$2" 'NR > 1 && $2==t && $c != "" {print $c}' "$RES" | median; }
for tgt in "${TARGETS[@]}"; do
    printf '%-8s %9s %9s %9s %8s %8s %8s %9s %9s %7s %9s %7s %7s\n' "$tgt" "${MAX[$tgt]}" "$(col "$tgt" 3)" "$(col "$tgt" 4)" \
        "$(col "$tgt" 5)" "$(col "$tgt" 6)" "$(col "$tgt" 7)" "$(col "$tgt" 8)" "$(col "$tgt" 10)" "$(col "$tgt" 11)" \
        "$(col "$tgt" 12)" "$(col "$tgt" 13)" "$(col "$tgt" 15)"
done
echo "(load_us_rq: openload's CPU per request; proxy_%: the proxy's share of PROXY_CPU; load_%: openload's and the backends' share of OTHER_CPU)"
has() { [[ " ${TARGETS[*]} " == *" $1 "* ]]; }
for peer in haproxy nginx; do
    has capataz && has "$peer" || continue
    per=$(awk -F'\t' -v p="$peer" 'NR > 1 && $2=="capataz" {x[$1]=$7} NR > 1 && $2==p {y[$1]=$7}
        END { for (r in x) if (r in y && y[r] > 0) printf "%.3f\n", x[r]/y[r] }' "$RES" | sort -g | tr '\n' ' ')
    printf 'p99 capataz / %s, per round: %s(median %sx)\n' "$peer" "$per" "$(tr ' ' '\n' <<<"$per" | grep . | median)"
done
log "raw figures: $RES"
