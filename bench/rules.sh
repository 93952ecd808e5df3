#!/usr/bin/env bash
# bench/rules.sh - the cost of header rules and a path rewrite: capataz with and without them,
# HAProxy with and without the same rules, same run, interleaved.
#
# The shared harness's two nginx backends (127.0.0.1:9101/:9102, its backend-nginx.conf plus
# two locations for the checks below) on OTHER_CPU; four proxies, each one thread, pinned to
# PROXY_CPU (only the one under load is busy):
#   capataz        bench/capataz.toml, :9400 (no rules)
#   capataz-rules  bench/capataz-rules.toml, :9401: a route on `/api/` that strips the prefix,
#                  removes `X-Debug`, sets `X-Env: prod`, and sets `X-Served: bench` on answers
#   haproxy        the shared harness's haproxy.cfg, :9200 (no rules)
#   haproxy-rules  bench/haproxy-rules.cfg, :9202: the same with the same rules (`use_backend
#                  api if { path_beg /api/ }`, in that backend `http-request replace-path`,
#                  `del-header`, `set-header` and `http-response set-header`)
# Every target gets the same requests: `wrk -t1 -cCONNS -H 'X-Debug: 1' http://.../api/`
# (pinned to OTHER_CPU); the backends answer `/` and `/api/` alike ("ok\n"). Before measuring,
# each target is checked: through the rules targets `/api/echo/` reaches the backend as
# `/echo/` (which echoes the path and the X-Env and X-Debug it got) with `X-Served: bench` on
# the answer; through the others it arrives as sent (`/api/echo/`: the backend's 404).
# ROUNDS rounds of DURATION per target, the starting target rotating by round; per target the
# median of requests/s, p99 and the proxy's CPU time (utime+stime from /proc) per request, and
# per round the ratio capataz-rules / capataz.
#
# Usage: flock /tmp/capataz-bench.lock bench/rules.sh
#        env: CONNS=50 DURATION=5s ROUNDS=5 PROXY_CPU=0 OTHER_CPU=1 RUN_DIR=/tmp/bench-rules
#             SHARED=../shared/bench CAPATAZ_BIN=... (default: a release build of this tree)
#             TARGETS="capataz capataz-rules haproxy haproxy-rules"
# Needs: wrk, nginx, haproxy, curl. Runtime: about ROUNDS x 4 x (DURATION + 1 s) + 30 s.
set -Eeuo pipefail
LOG_TAG=rules
source "$(dirname "$0")/common.sh"

CONNS=${CONNS:-50} DURATION=${DURATION:-5s} ROUNDS=${ROUNDS:-5}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-rules}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
read -r -a TARGETS <<<"${TARGETS:-capataz capataz-rules haproxy haproxy-rules}"
mkdir -p "$RUN_DIR/nginx-backend"/{logs,tmp}
RES=$RUN_DIR/results-$(date +%Y%m%dT%H%M%S).tsv
TICK_US=$(( 1000000 / CLK_TCK ))

need_tools wrk nginx haproxy curl ss
for p in 9101 9102 9200 9201 9202 9400 9401; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done
build_capataz
log "host: $(machine_line)"

# The backends: the harness's, plus `/echo/` (what the request looked like on arrival) and
# `/api/echo/` (a 404 only a request that was not rewritten reaches).
# shellcheck disable=SC2016  # nginx variables
echo_loc='location /echo/ { return 200 "path=$request_uri x-env=$http_x_env x-debug=$http_x_debug\\n"; }
        location /api/echo/ { return 404 "not rewritten\\n"; }'
awk -v add="$echo_loc" '{ print } /location = \/healthz/ { print "        " add }' \
    "$SHARED/backend-nginx.conf" >"$RUN_DIR/nginx-backend/nginx.conf"
start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port 9101 "$LAST_PID"; wait_port 9102 "$LAST_PID"

cp "$SHARED/haproxy.cfg" "$RUN_DIR/haproxy.cfg"
cp "$BENCH_DIR/haproxy-rules.cfg" "$RUN_DIR/haproxy-rules.cfg"

declare -A PORT=([capataz]=9400 [capataz-rules]=9401 [haproxy]=9200 [haproxy-rules]=9202) PID=()
for tgt in "${TARGETS[@]}"; do
    case $tgt in
        capataz) CAPATAZ_WORKER_THREADS=1 start "$tgt" "$PROXY_CPU" "$CAPATAZ_BIN" run --config "$BENCH_DIR/capataz.toml" ;;
        capataz-rules) CAPATAZ_WORKER_THREADS=1 start "$tgt" "$PROXY_CPU" "$CAPATAZ_BIN" run --config "$BENCH_DIR/capataz-rules.toml" ;;
        haproxy | haproxy-rules)
            cfg=$RUN_DIR/${tgt}.cfg
            haproxy -c -q -f "$cfg" || die "haproxy config check failed: $cfg"
            start "$tgt" "$PROXY_CPU" haproxy -db -f "$cfg" ;;
        *) die "unknown target: $tgt" ;;
    esac
    PID[$tgt]=$LAST_PID
    wait_port "${PORT[$tgt]}" "$LAST_PID"
done

# The checks: both backends in rotation, and the rules applied exactly where configured.
for tgt in "${TARGETS[@]}"; do
    url=http://127.0.0.1:${PORT[$tgt]}
    deadline=$(( SECONDS + 15 ))
    until [[ $(for _ in 1 2 3 4; do curl -s --max-time 2 -D - -o /dev/null -H 'X-Debug: 1' "$url/api/"; done |
               tr -d '\r' | awk -F': ' 'tolower($1)=="x-backend"{print $2}' | sort -u | tr '\n' ' ') == "b1 b2 " ]]; do
        (( SECONDS < deadline )) || die "$tgt: /api/ does not reach both b1 and b2"
        sleep 0.5
    done
    head=$(curl -s --max-time 2 -D - -o "$RUN_DIR/check-$tgt.body" -H 'X-Debug: 1' "$url/api/echo/" | tr -d '\r')
    body=$(cat "$RUN_DIR/check-$tgt.body")
    served=$(awk -F': ' 'tolower($1)=="x-served"{print $2}' <<<"$head")
    if [[ $tgt == *-rules ]]; then
        want="path=/echo/ x-env=prod x-debug="
        [[ $body == "$want" && $served == bench ]] ||
            die "$tgt: rules not applied: backend saw '$body' (want '$want'), X-Served '$served'"
    else
        [[ $body == "not rewritten" && -z $served ]] ||
            die "$tgt: expected the request as sent: '$body', X-Served '$served'"
    fi
    log "check $tgt: /api/echo/ -> backend saw '$body'${served:+, answer X-Served: $served}"
done

wrk_p99_us() { # the 99% line of wrk --latency, in microseconds
    awk '$1=="99%" { v=$2; u=v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
                     m = (u=="us") ? 1 : (u=="ms") ? 1000 : (u=="s") ? 1000000 : 0; print v*m }' "$1"
}

for tgt in "${TARGETS[@]}"; do
    (pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d2s -H 'X-Debug: 1' "http://127.0.0.1:${PORT[$tgt]}/api/" >/dev/null)
done
printf 'round\ttarget\treq_s\tp99_us\tcpu_us_per_req\terrors\n' >"$RES"
n=${#TARGETS[@]}
for round in $(seq "$ROUNDS"); do
    for ((i = 0; i < n; i++)); do
        tgt=${TARGETS[(i + round - 1) % n]}
        out=$RUN_DIR/wrk-$round-$tgt.txt
        before=$(proc_ticks "${PID[$tgt]}")
        (pin "$OTHER_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --latency -H 'X-Debug: 1' "http://127.0.0.1:${PORT[$tgt]}/api/" >"$out")
        after=$(proc_ticks "${PID[$tgt]}")
        reqs=$(awk '/requests in/ {print $1}' "$out")
        rps=$(awk '/^Requests\/sec/ {print $2}' "$out")
        errs=$(awk '/Non-2xx|Socket errors/ {print}' "$out" | tr '\n' ' ')
        cpu=$(calc "($after - $before) * $TICK_US / $reqs")
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$tgt" "$rps" "$(wrk_p99_us "$out")" "$cpu" "${errs:-0}" >>"$RES"
        log "round $round $tgt: $rps req/s, p99 $(wrk_p99_us "$out") us, CPU $cpu us/request${errs:+, $errs}"
    done
done

echo
echo "wrk -t1 -c$CONNS -d$DURATION x $ROUNDS rounds, GET /api/ with X-Debug; medians (CPU: the proxy's, per request):"
printf '%-14s %10s %8s %12s\n' target req_s p99_us cpu_us_req
col() { awk -F'\t' -v t="$1" -v c="$2" '$2==t {print $c}' "$RES" | median; }
for tgt in "${TARGETS[@]}"; do
    printf '%-14s %10s %8s %12s\n' "$tgt" "$(col "$tgt" 3)" "$(col "$tgt" 4)" "$(col "$tgt" 5)"
done
ratio() { # ratio A B: per-round CPU-per-request ratio A/B, their median, and the ratio of medians
    local per
    per=$(awk -F'\t' -v a="$1" -v b="$2" '$2==a {x[$1]=$5} $2==b {y[$1]=$5}
        END { for (r in x) if (r in y) printf "%.3f\n", x[r]/y[r] }' "$RES" | sort -g | tr '\n' ' ')
    printf 'CPU/request %s / %s: ratio of the medians %.3fx; per round %s(median %sx)\n' "$1" "$2" \
        "$(calc "$(col "$1" 5) / $(col "$2" 5)")" "$per" "$(tr ' ' '\n' <<<"$per" | grep . | median)"
}
has() { [[ " ${TARGETS[*]} " == *" $1 "* ]]; }
if has capataz-rules && has capataz; then ratio capataz-rules capataz; fi
if has haproxy-rules && has haproxy; then ratio haproxy-rules haproxy; fi
if has haproxy-rules && has capataz-rules; then ratio capataz-rules haproxy-rules; fi
if has haproxy-rules && has capataz; then ratio haproxy-rules capataz; fi
log "raw figures: $RES"
