#!/usr/bin/env bash
# bench/probe-cost.sh - the cost of active checks over 10,000 backends, capataz against HAProxy,
# and the resident memory of each (and of nginx) holding 10,000 backends at idle.
#
# bench/probe_listener.c (compiled here with gcc) binds 10,000 listening sockets, one per
# address 127.0.1.1 .. 127.0.40.250, port 9600 (each address explicitly: nothing binds 0.0.0.0),
# answers each probe `200 OK` and counts probe arrivals (accepted connections) per address and
# per 10 ms. It runs pinned to LISTENER_CPU (default 1); each proxy runs alone on PROXY_CPU
# (default 0), one thread, no client traffic:
#   capataz  one pool of the 10,000 backends, active http GET /healthz, interval 1s, timeout
#            1s, rise 2, fall 3 (jitter default 10 %); admin on 127.0.0.1:9441 for /metrics
#   haproxy  one backend of the 10,000 servers, option httpchk GET /healthz, inter 1s rise 2
#            fall 3, timeout check 1s, nbthread 1; stats on 127.0.0.1:9451
#   nginx    (memory only: nginx OSS has no active checks) an upstream of the 10,000 servers
# For each proxy: start it, wait WARMUP s, then measure for DURATION s in WINDOW-s windows:
#   CPU per probe  utime+stime of the proxy (/proc/PID/stat) / probes that reached the listener
#   spread         probes per 100 ms bucket over the window: max / average, p99 / average, min /
#                  average (goal: max below 2x average), plus per-address coverage
#   memory         VmRSS (and VmHWM, PSS) at the end, with 10,000 backends and no traffic
#   wake-ups       how often the listener went to sleep and had to be woken, per second
# Medians over the windows (and rounds); a capataz /metrics scrape afterwards cross-checks the
# probe count and reports how large that scrape is with 10,000 backends.
# LISTENER_SPIN=1 makes the listener poll without sleeping (it then uses all of LISTENER_CPU):
# on loopback the kernel charges the wake-up of a sleeping listener to the prober's connect() and
# send(), which penalises the prober whose probes are the more evenly spread; spinning removes
# that term, leaving each prober's own cost.
#
# Usage: bench/probe-cost.sh     (env: BACKENDS=10000 DURATION=60 WINDOW=10 WARMUP=5 ROUNDS=1 LISTENER_SPIN=
#                                 TARGETS="capataz haproxy nginx" PROXY_CPU=0 LISTENER_CPU=1
#                                 RUN_DIR=/tmp/bench-probe CAPATAZ_BIN=...)
# Runtime: about 2.5 min with the defaults.
set -Eeuo pipefail
LOG_TAG=probe-cost
source "$(dirname "$0")/common.sh"

BACKENDS=${BACKENDS:-10000} DURATION=${DURATION:-60} WINDOW=${WINDOW:-10} WARMUP=${WARMUP:-5}
ROUNDS=${ROUNDS:-1} TARGETS=${TARGETS:-"capataz haproxy nginx"}
PROXY_CPU=${PROXY_CPU-0} LISTENER_CPU=${LISTENER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-probe}
PORT=9600
mkdir -p "$RUN_DIR"
STAMP=$(date +%Y%m%dT%H%M%S)
RES_DIR=$RUN_DIR/results/$STAMP
mkdir -p "$RES_DIR"

need_tools nginx haproxy python3 gcc taskset curl ss
for p in $PORT 9440 9441 9450 9451 9460; do
    if port_busy "$p"; then die "port $p already in use (not started by us)"; fi
done
build_capataz
gcc -O2 -Wall -o "$RUN_DIR/probe_listener" "$BENCH_DIR/probe_listener.c"
log "host: $(machine_line)"
log "backends=$BACKENDS listener_spin=${LISTENER_SPIN:-0} duration=$DURATION window=$WINDOW warmup=$WARMUP rounds=$ROUNDS targets='$TARGETS' proxy_cpu=${PROXY_CPU:-any} listener_cpu=${LISTENER_CPU:-any}"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ------------------------------------------------------------------- configs --
addr() { echo "127.0.$(( 1 + $1 / 250 )).$(( 1 + $1 % 250 ))"; }   # backend i -> its address

gen_configs() {
    python3 - "$BACKENDS" "$PORT" "$RUN_DIR" <<'EOF'
import sys
n, port, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
addrs = [f"127.0.{1 + i // 250}.{1 + i % 250}:{port}" for i in range(n)]
with open(f"{d}/capataz.toml", "w") as f:
    f.write('[log]\nlevel = "warn"\n\n[admin]\naddress = "127.0.0.1:9441"\n\n'
            '[[listeners]]\nname = "probe"\naddress = "127.0.0.1:9440"\n\n[pools.probe]\nbackends = [\n')
    for i, a in enumerate(addrs):
        f.write(f'    {{ name = "s{i}", address = "{a}" }},\n')
    f.write(']\n\n[pools.probe.active]\nkind = "http"\npath = "/healthz"\ninterval = "1s"\n'
            'timeout = "1s"\nrise = 2\nfall = 3\n')
with open(f"{d}/haproxy.cfg", "w") as f:
    f.write("global\n    nbthread 1\n    maxconn 4000\n\ndefaults\n    mode http\n"
            "    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n"
            "    timeout check 1s\n\nfrontend fe\n    bind 127.0.0.1:9450\n    default_backend be\n\n"
            "backend be\n    balance roundrobin\n    option httpchk GET /healthz\n"
            "    http-check expect status 200\n    default-server inter 1s fall 3 rise 2\n")
    for i, a in enumerate(addrs):
        f.write(f"    server s{i} {a} check\n")
    f.write("\nlisten stats\n    bind 127.0.0.1:9451\n    stats enable\n    stats uri /stats\n")
import os
os.makedirs(f"{d}/nginx/logs", exist_ok=True)
os.makedirs(f"{d}/nginx/tmp", exist_ok=True)
with open(f"{d}/nginx/nginx.conf", "w") as f:
    f.write("worker_processes 1;\ndaemon off;\npid nginx.pid;\nerror_log logs/error.log warn;\n"
            "events { worker_connections 8192; }\nhttp {\n    access_log off;\n"
            "    client_body_temp_path tmp/cb; proxy_temp_path tmp/p; fastcgi_temp_path tmp/f;\n"
            "    uwsgi_temp_path tmp/u; scgi_temp_path tmp/s;\n    upstream be {\n")
    for a in addrs:
        f.write(f"        server {a} max_fails=3 fail_timeout=10s;\n")
    f.write("        keepalive 64;\n    }\n    server {\n        listen 127.0.0.1:9460;\n"
            "        location / { proxy_pass http://be; proxy_http_version 1.1; "
            "proxy_set_header Connection \"\"; }\n    }\n}\n")
EOF
}
gen_configs
haproxy -c -q -f "$RUN_DIR/haproxy.cfg" || die "haproxy config check failed"
# (exits non-zero on warnings; timeout = interval warns, and matches HAProxy's timeout check 1s)
check_out=$("$CAPATAZ_BIN" check "$RUN_DIR/capataz.toml" 2>&1 || true)
grep -q ': valid' <<<"$check_out" || die "capataz check failed: $check_out"

# ------------------------------------------------------------------ listener --
rm -f "$RUN_DIR"/probes.*
start listener "$LISTENER_CPU" "$RUN_DIR/probe_listener" "$BACKENDS" "$PORT" "$RUN_DIR/probes" ${LISTENER_SPIN:+spin}
LISTENER=$LAST_PID
for _ in $(seq 100); do grep -q ready "$RUN_DIR/listener.log" 2>/dev/null && break; alive "$LISTENER" || die "listener failed: $(cat "$RUN_DIR/listener.log")"; sleep 0.1; done
grep -q ready "$RUN_DIR/listener.log" || die "listener not ready"
curl -sf --max-time 2 "http://$(addr $(( BACKENDS - 1 ))):$PORT/healthz" >/dev/null || die "listener does not answer"
vcsw() { awk '/^voluntary_ctxt_switches/{print $2}' "/proc/$1/status"; }   # times it went to sleep
DUMPS=0
dump() { # dump: the listener writes its counts since the previous dump to DUMP_PATH
    local path=$RUN_DIR/probes.$DUMPS
    kill -USR1 "$LISTENER"
    for _ in $(seq 100); do [[ -s $path ]] && break; sleep 0.02; done
    sleep 0.05
    [[ -s $path ]] || die "listener did not write $path"
    DUMPS=$(( DUMPS + 1 ))
    DUMP_PATH=$path
}

# ------------------------------------------------------------------ one run --
measure() { # measure TARGET ROUND
    local tgt=$1 r=$2 pid port out=$RES_DIR/$1-r$2
    mkdir -p "$out"
    case $tgt in
        capataz) start capataz "$PROXY_CPU" env CAPATAZ_WORKER_THREADS=1 "$CAPATAZ_BIN" run --config "$RUN_DIR/capataz.toml"; port=9440 ;;
        haproxy) start haproxy "$PROXY_CPU" haproxy -db -f "$RUN_DIR/haproxy.cfg"; port=9450 ;;
        nginx)   start nginx "$PROXY_CPU" nginx -p "$RUN_DIR/nginx/" -c "$RUN_DIR/nginx/nginx.conf" -e "$RUN_DIR/nginx/logs/error.log"; port=9460 ;;
    esac
    pid=$LAST_PID
    local t_start; t_start=$(date +%s.%N)
    wait_port "$port" "$pid" 60
    log "$tgt round $r: listening after $(calc "$(date +%s.%N) - $t_start") s; warm-up ${WARMUP}s"
    sleep "$WARMUP"
    if [[ $tgt == nginx ]]; then   # no active checks: memory only
        sleep 2
        printf '{"target":"nginx","round":%d,"rss_kb":%d,"hwm_kb":%d,"pss_kb":%d}\n' "$r" \
            "$(mem_kb "$pid" VmRSS)" "$(mem_kb "$pid" VmHWM)" "$(pss_kb "$pid")" >"$out/memory.json"
        cat "$out/memory.json" >&2
        stop_named "$pid"
        return
    fi
    dump                                         # forget the warm-up
    local w t0 t1 k0 k1 files=() ticks=() lw0 lw1 lt0 lt1
    lw0=$(vcsw "$LISTENER"); lt0=$(date +%s.%N)
    for ((w = 0; w < DURATION / WINDOW; w++)); do
        k0=$(proc_ticks "$pid"); t0=$(date +%s.%N)
        sleep "$WINDOW"
        k1=$(proc_ticks "$pid"); t1=$(date +%s.%N)
        dump; files+=("$DUMP_PATH")
        ticks+=("$(( k1 - k0 ))")
    done
    lw1=$(vcsw "$LISTENER"); lt1=$(date +%s.%N)
    local rss hwm pss
    rss=$(mem_kb "$pid" VmRSS) hwm=$(mem_kb "$pid" VmHWM) pss=$(pss_kb "$pid")
    local extra=""
    if [[ $tgt == capataz ]]; then
        local s0 s1 size
        s0=$(date +%s.%N)
        curl -s --max-time 120 http://127.0.0.1:9441/metrics >"$out/metrics.txt" || true
        s1=$(date +%s.%N)
        size=$(stat -c %s "$out/metrics.txt")
        extra=$(awk -v secs="$(calc "$s1 - $s0")" -v size="$size" '
            /^capataz_probes_total/ { if ($0 ~ /result="fail"/) fail += $NF; else pass += $NF }
            END { printf "\"metrics_probes_pass\":%d,\"metrics_probes_fail\":%d,\"metrics_scrape_s\":%.3f,\"metrics_bytes\":%d", pass, fail, secs, size }' "$out/metrics.txt")
        extra+=",\"uptime_s\":$(calc "$(date +%s.%N) - $t_start")"
    else
        curl -s --max-time 30 'http://127.0.0.1:9451/stats;csv' >"$out/stats.csv" || true
        extra=$(awk -F, 'NR==1 { sub(/^# /, ""); for (i = 1; i <= NF; i++) c[$i] = i; next }
            $1=="be" && $2 ~ /^s[0-9]+$/ { n++; if ($c["status"] ~ /^UP/) up++; chkfail += $c["chkfail"] }
            END { printf "\"servers_up\":%d,\"servers\":%d,\"chkfail\":%d", up, n, chkfail }' "$out/stats.csv")
    fi
    extra+=",\"listener_wakeups_per_s\":$(calc "($lw1 - $lw0) / ($lt1 - $lt0)")"
    stop_named "$pid"
    python3 "$BENCH_DIR/probe_report.py" run "$tgt" "$r" "$CLK_TCK" "$BACKENDS" \
        "${ticks[*]}" "${files[*]}" "{\"rss_kb\":$rss,\"hwm_kb\":$hwm,\"pss_kb\":$pss,$extra}" >"$out/row.json"
    python3 "$BENCH_DIR/probe_report.py" show "$out/row.json" >&2
}

for ((r = 1; r <= ROUNDS; r++)); do
    for tgt in $TARGETS; do measure "$tgt" "$r"; done
done

{
    echo
    echo "# probe-cost.sh $STAMP: $(machine_line)"
    echo "# $BACKENDS backends (127.0.1.1-127.0.$(( 1 + (BACKENDS - 1) / 250 )).$(( 1 + (BACKENDS - 1) % 250 )):$PORT), interval 1s, no traffic, listener $([[ -n ${LISTENER_SPIN:-} ]] && echo spinning || echo 'sleeping in epoll_wait'); ${DURATION}s in ${WINDOW}s windows x $ROUNDS round(s); proxy cpu ${PROXY_CPU:-any}, listener cpu ${LISTENER_CPU:-any}; raw: $RES_DIR"
    python3 "$BENCH_DIR/probe_report.py" table "$RES_DIR"
} | tee "$RES_DIR/summary.txt"
