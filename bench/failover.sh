#!/usr/bin/env bash
# bench/failover.sh - a backend killed under steady load: client-visible errors, time to eject,
# time to readmit, for capataz, HAProxy and nginx, one after the other (interleaved per round).
#
# Three nginx backends, one process each (master_process off, so SIGKILL takes the whole
# backend), on 127.0.0.1:9111/9112/9113 (b1, b2, b3), each answering "bN\n" with an X-Backend
# header, and /healthz. For each variant, fresh backends and a fresh proxy:
#   capataz        :9410 (admin :9411) round robin, active http /healthz interval 1s rise 2
#                  fall 3, passive consecutive_errors 3, everything else default (ejection_time
#                  30s, retries attempts 1); CAPATAZ_WORKER_THREADS=1
#   capataz-ej5s   the same with passive ejection_time = "5s"
#   haproxy        :9420 (stats :9421) inter 1s rise 2 fall 3, option httpchk, HAProxy defaults
#                  otherwise (retries 3 to the same server, no redispatch); nbthread 1
#   haproxy-tuned  the same + retries 3, option redispatch, observe layer7, error-limit 3,
#                  on-error mark-down
#   nginx          :9430 max_fails=3 fail_timeout=10s, proxy_next_upstream error timeout
#                  http_502 http_503; 1 worker; access log with $upstream_addr (to see ejection)
# bench/failover_client.py then sends GET / at RATE req/s over 64 keep-alive connections for
# DURATION s, SIGKILLs b2 at KILL_AT s and starts it again at RESTART_AT s, and records every
# request (status, serving backend, times) plus the proxy's own view of b2 (capataz /status or
# HAProxy stats CSV, polled every 20 ms).
#
# Figures per run: errors seen by the client (non-200 or no answer), requests slower than 1 s,
# time to eject (kill -> the proxy stops sending to b2: capataz's transition log line; HAProxy's
# stats status leaving UP; nginx: the attempt to b2 that reaches max_fails, from its access log),
# requests the proxy sent to the dead b2, and time to readmit (restart -> first 200 served by b2
# as seen by the client). Medians over ROUNDS rounds.
#
# Usage: bench/failover.sh                 (env: ROUNDS=1 RATE=2000 DURATION=25 KILL_AT=5
#                                          RESTART_AT=15 VARIANTS="capataz capataz-ej5s haproxy
#                                          haproxy-tuned nginx" PROXY_CPU=0 OTHER_CPU=1
#                                          RUN_DIR=/tmp/bench-failover CAPATAZ_BIN=...)
# Runtime: about 30 s per variant and round (2.5 min for the default round).
set -Eeuo pipefail
LOG_TAG=failover
source "$(dirname "$0")/common.sh"

ROUNDS=${ROUNDS:-1} RATE=${RATE:-2000} DURATION=${DURATION:-25}
KILL_AT=${KILL_AT:-5} RESTART_AT=${RESTART_AT:-15}
VARIANTS=${VARIANTS:-"capataz capataz-ej5s haproxy haproxy-tuned nginx"}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-failover}
mkdir -p "$RUN_DIR"
STAMP=$(date +%Y%m%dT%H%M%S)
RES_DIR=$RUN_DIR/results/$STAMP
mkdir -p "$RES_DIR"

need_tools nginx haproxy python3 taskset curl ss
for p in 9111 9112 9113 9410 9411 9420 9421 9430; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (not started by us)"; fi
done
build_capataz
log "host: $(machine_line)"
log "rounds=$ROUNDS rate=$RATE duration=$DURATION kill_at=$KILL_AT restart_at=$RESTART_AT variants='$VARIANTS' proxy_cpu=${PROXY_CPU:-any} other_cpu=${OTHER_CPU:-any}"

# ------------------------------------------------------------------- configs --
backend_conf() { # backend_conf NAME PORT -> prefix dir with nginx.conf
    local name=$1 port=$2 dir=$RUN_DIR/$1
    mkdir -p "$dir"/{logs,tmp}
    cat >"$dir/nginx.conf" <<EOF
# failover backend $name: one process (master_process off), so SIGKILL takes all of it.
master_process off;
daemon         off;
pid            nginx.pid;
error_log      logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off; server_tokens off; default_type text/plain;
    keepalive_timeout 65s; keepalive_requests 1000000;
    client_body_temp_path tmp/cb; proxy_temp_path tmp/p; fastcgi_temp_path tmp/f;
    uwsgi_temp_path tmp/u; scgi_temp_path tmp/s;
    server {
        listen 127.0.0.1:$port backlog=4096;
        location = /healthz { return 200 "ok\n"; }
        location /          { add_header X-Backend $name; return 200 "$name\n"; }
    }
}
EOF
    echo "$dir"
}

capataz_conf() { # capataz_conf FILE [EJECTION_TIME]
    cat >"$1" <<EOF
[log]
format = "json"
level = "info"

[admin]
address = "127.0.0.1:9411"

[[listeners]]
name = "failover"
address = "127.0.0.1:9410"

[pools.fo]
algorithm = "round_robin"
backends = [
    { name = "b1", address = "127.0.0.1:9111" },
    { name = "b2", address = "127.0.0.1:9112" },
    { name = "b3", address = "127.0.0.1:9113" },
]

[pools.fo.active]
kind = "http"
path = "/healthz"
interval = "1s"
timeout = "1s"
rise = 2
fall = 3

[pools.fo.passive]
consecutive_errors = 3
${2:+ejection_time = \"$2\"}

[pools.fo.timeouts]
connect = "2s"
response_header = "30s"
EOF
}

haproxy_conf() { # haproxy_conf FILE tuned|defaults
    local extra_be="" extra_srv=""
    if [[ $2 == tuned ]]; then
        extra_be=$'    retries 3\n    option redispatch'
        extra_srv=" observe layer7 error-limit 3 on-error mark-down"
    fi
    cat >"$1" <<EOF
global
    nbthread 1
    maxconn  8000

defaults
    mode    http
    option  http-keep-alive
    timeout connect          2s
    timeout client           30s
    timeout server           30s
    timeout http-keep-alive  30s
    timeout check            1s

frontend fe
    bind 127.0.0.1:9420
    default_backend be

backend be
    balance roundrobin
    option  httpchk GET /healthz
    http-check expect status 200
    http-reuse safe
$extra_be
    default-server inter 1s fall 3 rise 2$extra_srv
    server b1 127.0.0.1:9111 check
    server b2 127.0.0.1:9112 check
    server b3 127.0.0.1:9113 check

listen stats
    bind 127.0.0.1:9421
    stats enable
    stats uri /stats
EOF
}

nginx_proxy_conf() { # nginx_proxy_conf DIR
    mkdir -p "$1"/{logs,tmp}
    cat >"$1/nginx.conf" <<'EOF'
worker_processes  1;
daemon            off;
pid               nginx.pid;
error_log         logs/error.log warn;
events { worker_connections 8192; }
http {
    log_format fo '$msec $status "$upstream_addr" "$upstream_status"';
    access_log logs/access.log fo buffer=256k flush=1s;
    server_tokens off;
    keepalive_timeout 65s; keepalive_requests 1000000;
    client_body_temp_path tmp/cb; proxy_temp_path tmp/p; fastcgi_temp_path tmp/f;
    uwsgi_temp_path tmp/u; scgi_temp_path tmp/s;
    upstream be {
        server 127.0.0.1:9111 max_fails=3 fail_timeout=10s;
        server 127.0.0.1:9112 max_fails=3 fail_timeout=10s;
        server 127.0.0.1:9113 max_fails=3 fail_timeout=10s;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:9430 backlog=4096;
        location / {
            proxy_pass http://be;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout http_502 http_503;
        }
    }
}
EOF
}

# ------------------------------------------------------------------ one run --
wait_all_up() { # wait_all_up VARIANT: the proxy sees b1..b3 healthy and serves all three
    local v=$1 deadline=$(( SECONDS + 20 )) seen
    while :; do
        case $v in
            capataz*) [[ $(curl -s --max-time 1 http://127.0.0.1:9411/status | grep -c '"eligible": true') == 3 ]] && break ;;
            haproxy*) [[ $(curl -s --max-time 1 'http://127.0.0.1:9421/stats;csv' | awk -F, '$1=="be" && $2 ~ /^b[123]$/ && $18=="UP"' | wc -l) == 3 ]] && break ;;
            nginx) break ;;
        esac
        (( SECONDS < deadline )) || die "$v: backends not all UP after 20 s"
        sleep 0.2
    done
    seen=$(for _ in 1 2 3 4 5 6; do curl -s --max-time 2 "http://127.0.0.1:${PORT[$v]}/"; done | sort -u | tr '\n' ' ')
    [[ $seen == "b1 b2 b3 " ]] || die "$v: round robin reaches '$seen', not b1 b2 b3"
}

declare -A PORT=([capataz]=9410 [capataz-ej5s]=9410 [haproxy]=9420 [haproxy-tuned]=9420 [nginx]=9430)

run_variant() { # run_variant VARIANT ROUND
    local v=$1 r=$2 out=$RES_DIR/$1-r$2 b pid px poll=none poll_target="" be_pids=() b2cmd
    mkdir -p "$out"
    for b in 1 2 3; do
        local dir; dir=$(backend_conf "b$b" "911$b")
        start "b$b" "$OTHER_CPU" nginx -p "$dir/" -c "$dir/nginx.conf" -e "$dir/logs/error.log"
        be_pids+=("$LAST_PID")
        wait_port "911$b" "$LAST_PID"
    done
    case $v in
        capataz|capataz-ej5s)
            local ej=""; [[ $v == capataz-ej5s ]] && ej=5s
            capataz_conf "$out/capataz.toml" "$ej"
            start "$v" "$PROXY_CPU" env CAPATAZ_WORKER_THREADS=1 "$CAPATAZ_BIN" run --config "$out/capataz.toml"
            poll=capataz poll_target=127.0.0.1:9411 ;;
        haproxy|haproxy-tuned)
            haproxy_conf "$out/haproxy.cfg" "$([[ $v == haproxy-tuned ]] && echo tuned || echo defaults)"
            haproxy -c -q -f "$out/haproxy.cfg" || die "haproxy config check failed"
            start "$v" "$PROXY_CPU" haproxy -db -f "$out/haproxy.cfg"
            poll=haproxy poll_target=127.0.0.1:9421 ;;
        nginx)
            nginx_proxy_conf "$RUN_DIR/nginx-proxy"
            rm -f "$RUN_DIR/nginx-proxy/logs/access.log"
            start "$v" "$PROXY_CPU" nginx -p "$RUN_DIR/nginx-proxy/" -c "$RUN_DIR/nginx-proxy/nginx.conf" -e "$RUN_DIR/nginx-proxy/logs/error.log" ;;
        *) die "unknown variant $v" ;;
    esac
    px=$LAST_PID
    wait_port "${PORT[$v]}" "$px"
    wait_all_up "$v"
    # Warm up keep-alive pools for a second, then the timed run.
    timeout 5 bash -c "for i in \$(seq 200); do curl -s -o /dev/null http://127.0.0.1:${PORT[$v]}/; done" || true
    local rss_file=$out/rss.txt
    ( while alive "$px"; do echo "$(date +%s.%N) $(mem_kb "$px" VmRSS)"; sleep 0.5; done ) >"$rss_file" 2>/dev/null &
    local sampler=$!
    PIDS+=("$sampler"); PNAME[$sampler]=rss-sampler
    local t0ticks; t0ticks=$(proc_ticks "$px")
    b2cmd=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \
        ${OTHER_CPU:+taskset -c "$OTHER_CPU"} nginx -p "$RUN_DIR/b2/" -c "$RUN_DIR/b2/nginx.conf" -e "$RUN_DIR/b2/logs/error.log")
    EXTRA_PIDFILES+=("$out/b2-restarted.pid")
    log "$v round $r: load ${RATE}/s for ${DURATION}s, SIGKILL b2 (pid ${be_pids[1]}) at ${KILL_AT}s, restart at ${RESTART_AT}s"
    ${OTHER_CPU:+taskset -c "$OTHER_CPU"} python3 "$BENCH_DIR/failover_client.py" \
        --target "127.0.0.1:${PORT[$v]}" --rate "$RATE" --duration "$DURATION" \
        --kill-at "$KILL_AT" --restart-at "$RESTART_AT" --kill-pid "${be_pids[1]}" \
        --restart-cmd "$b2cmd" --restart-pidfile "$out/b2-restarted.pid" --restart-log "$out/b2-restarted.log" \
        --poll "$poll" --poll-target "$poll_target" --out "$out" >"$out/client.out"
    local ticks=$(( $(proc_ticks "$px") - t0ticks ))
    local hwm; hwm=$(mem_kb "$px" VmHWM)
    # Proxy-side evidence, then stop everything of this run.
    case $v in
        capataz*) curl -s --max-time 5 http://127.0.0.1:9411/metrics >"$out/metrics.txt" || true ;;
        haproxy*) curl -s --max-time 5 'http://127.0.0.1:9421/stats;csv' >"$out/stats.csv" || true ;;
    esac
    stop_named "$px"
    stop_named "$sampler"
    case $v in
        capataz*) cp "$RUN_DIR/$v.log" "$out/proxy.log" ;;
        nginx) cp "$RUN_DIR/nginx-proxy/logs/access.log" "$out/access.log"; cp "$RUN_DIR/$v.log" "$out/proxy.log" ;;
        haproxy*) cp "$RUN_DIR/$v.log" "$out/proxy.log" ;;
    esac
    stop_pidfiles; EXTRA_PIDFILES=()
    for pid in "${be_pids[@]}"; do stop_named "$pid"; done
    python3 "$BENCH_DIR/failover_report.py" run "$v" "$out" "$ticks" "$CLK_TCK" "$hwm" >"$out/row.json"
    python3 "$BENCH_DIR/failover_report.py" show "$out/row.json" >&2
}

for ((r = 1; r <= ROUNDS; r++)); do
    for v in $VARIANTS; do run_variant "$v" "$r"; done
done

{
    echo
    echo "# failover.sh $STAMP: $(machine_line)"
    echo "# rate $RATE req/s, 64 conns, ${DURATION}s, SIGKILL b2 at ${KILL_AT}s, restart at ${RESTART_AT}s, medians of $ROUNDS round(s); raw: $RES_DIR"
    python3 "$BENCH_DIR/failover_report.py" table "$RES_DIR"
} | tee "$RES_DIR/summary.txt"
