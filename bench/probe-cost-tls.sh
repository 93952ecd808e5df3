#!/usr/bin/env bash
# bench/probe-cost-tls.sh - the cost of active checks over TLS (HTTPS, HTTP/2, gRPC), capataz
# against HAProxy, the TLS handshake of each probe included.
#
# One nginx (one worker, pinned to LISTENER_CPU, default 1) is the backends: BACKENDS (default
# 250) TLS listeners, one per address 127.0.1.1 .. 127.0.1.250 port 9601 (each address
# explicitly, nothing on 0.0.0.0), with a self-signed ECDSA P-256 certificate for
# `probe.bench` made by openssl at the start of the run, answering `GET /healthz` with 200.
# Each proxy runs alone on PROXY_CPU (default 0), one thread, no client traffic, probing every
# backend every second (timeout 1s, rise 2, fall 3) and verifying the certificate against it:
#   MODE=https  HTTP/1.1 over TLS. capataz: `kind = "http"` on a pool with `[pools.probe.tls]`
#               (`ca_file` = the certificate, `server_name = "probe.bench"`). HAProxy:
#               `option httpchk` + `check check-ssl verify required ca-file ... check-sni`.
#   MODE=h2     HTTP/2 over TLS (ALPN h2; nginx `listen ... ssl http2`). capataz: the same with
#               `protocol = "h2"`; HAProxy: the same with `check-alpn h2`.
#   MODE=grpc   gRPC health checks over TLS + h2: capataz `kind = "grpc"` on the h2 pool; nginx
#               terminates TLS and passes `/grpc.health.v1.Health/Check` (grpc_pass, kept-alive
#               h2c) to one Python grpcio health server (bench/grpc_health_server.py, pinned
#               with nginx). HAProxy 2.6 has no gRPC check, so this mode runs capataz only.
# Probes are counted where they land: nginx's access log, one line per probe with
# $ssl_session_reused (`r` = an abbreviated, resumed handshake; `.` = a full one),
# $server_protocol, $ssl_protocol, $ssl_curve and $status. By default nginx refuses session
# resumption (`ssl_session_cache off; ssl_session_tickets off;`), so every probe of either
# proxy is a full handshake, which the log confirms; RESUMPTION=on leaves nginx's defaults
# (session tickets on), to see which prober resumes when the server allows it.
# For each proxy: start it, wait WARMUP s, then DURATION s in WINDOW-s windows:
#   CPU per probe   utime+stime of the proxy (/proc/PID/stat) / probes logged by nginx
#   backend CPU     utime+stime of nginx (and the gRPC server) / probes: what each prober's
#                   handshakes cost the backends' host
# Medians over windows and rounds; the ratio capataz/HAProxy per round; capataz's /metrics
# (capataz_probes_total) and HAProxy's stats (servers UP, chkfail) afterwards.
# PERF=1 also runs `perf record -F 999 -g` on each proxy for 10 s from the start of its first
# window (RES_DIR/TARGET-rN/perf.data, with a `perf report --sort dso,sym` summary beside it);
# perf's own overhead then lands in that run's figures, so use it in a run of its own.
#
# Usage: bench/probe-cost-tls.sh   (env: MODE=https|h2|grpc BACKENDS=250 DURATION=60 WINDOW=10
#                                   WARMUP=5 ROUNDS=1 RESUMPTION=off NICE=-10
#                                   TARGETS="capataz haproxy" PROXY_CPU=0 LISTENER_CPU=1
#                                   RUN_DIR=/tmp/bench-probe-tls CAPATAZ_BIN=...)
# Runtime: about 2.5 min per round with the defaults.
# 250 backends, not probe-cost.sh's 10,000 (nor 1,000): a full handshake costs nginx about
# 0.7-1 ms of CPU here, and HAProxy 2.6 (OpenSSL 3.0) about 2 ms per TLS check on its one thread,
# so at 1,000 checks a second HAProxy falls behind (Layer6 timeouts, servers marked DOWN) and
# its CPU per probe measures the collapse, not the probe; at 250 both proxies keep up with
# room to spare. BACKENDS=1000 TARGETS=capataz shows capataz alone at 1,000.
set -Eeuo pipefail
LOG_TAG=probe-cost-tls
source "$(dirname "$0")/common.sh"

MODE=${MODE:-https} BACKENDS=${BACKENDS:-250} DURATION=${DURATION:-60} WINDOW=${WINDOW:-10}
WARMUP=${WARMUP:-5} ROUNDS=${ROUNDS:-1} RESUMPTION=${RESUMPTION:-off} NICE=${NICE:--10}
PROXY_CPU=${PROXY_CPU-0} LISTENER_CPU=${LISTENER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-probe-tls}
case $MODE in
    https|h2) TARGETS=${TARGETS:-"capataz haproxy"} ;;
    grpc) TARGETS=${TARGETS:-capataz} ;;
    *) die "MODE must be https, h2 or grpc (not '$MODE')" ;;
esac
case $RESUMPTION in on|off) ;; *) die "RESUMPTION must be on or off" ;; esac
[[ $NICE =~ ^-?[0-9]+$ ]] || die "NICE must be an integer"
# The kernel schedules by autogroup (one per session, kernel.sched_autogroup_enabled): a
# process's nice value only counts against its own session, and on a machine shared with other
# builders each of their sessions weighs as much as the whole benchmark. Each process started
# here gets a session of its own (setsid) whose autogroup gets nice NICE, so that the backends
# keep up and the proxies are not starved into 1 s timeouts; the figures are per-process CPU
# counters either way. NICE=0 leaves the defaults.
NICED=(setsid)
prioritise() { # prioritise PID: the autogroup of PID's own session gets nice NICE
    local pid=$1 _
    for _ in $(seq 100); do [[ $(ps -o sid= -p "$pid" | tr -d ' ') == "$pid" ]] && break; sleep 0.02; done
    [[ $(ps -o sid= -p "$pid" | tr -d ' ') == "$pid" ]] || die "pid $pid did not get a session of its own"
    (( NICE == 0 )) && return
    echo "$NICE" >"/proc/$pid/autogroup" 2>/dev/null || log "could not set the autogroup nice of pid $pid (not root?)"
}
[[ $MODE == grpc && $TARGETS == *haproxy* ]] && die "HAProxy 2.6 has no gRPC health check: MODE=grpc runs capataz only"
(( BACKENDS >= 1 && BACKENDS <= 10000 )) || die "BACKENDS must be 1-10000"
PORT=9601 GRPC_PORT=9602 SNI=probe.bench
CAPATAZ_PORT=9480 CAPATAZ_ADMIN=9481 HAPROXY_PORT=9490 HAPROXY_STATS=9491
mkdir -p "$RUN_DIR"
STAMP=$(date +%Y%m%dT%H%M%S)
RES_DIR=$RUN_DIR/results/$STAMP-$MODE
mkdir -p "$RES_DIR"

need_tools nginx haproxy python3 openssl taskset curl ss
for p in $PORT $GRPC_PORT $CAPATAZ_PORT $CAPATAZ_ADMIN $HAPROXY_PORT $HAPROXY_STATS; do
    if port_busy "$p"; then die "port $p already in use (not started by us)"; fi
done
if [[ -n ${CAPATAZ_BIN:-} ]]; then    # a copy, so a rebuild by someone else mid-run changes nothing
    cp "$CAPATAZ_BIN" "$RUN_DIR/capataz"
    log "capataz: $CAPATAZ_BIN (given; copied to $RUN_DIR/capataz)"
    CAPATAZ_BIN=$RUN_DIR/capataz
else
    build_capataz
fi
log "host: $(machine_line), $(openssl version | awk '{print $1, $2}')"
log "mode=$MODE backends=$BACKENDS resumption=$RESUMPTION nice=$NICE duration=$DURATION window=$WINDOW warmup=$WARMUP rounds=$ROUNDS targets='$TARGETS' proxy_cpu=${PROXY_CPU:-any} listener_cpu=${LISTENER_CPU:-any}"
log "load: $(cut -d' ' -f1-3 /proc/loadavg), autogroup scheduling $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo '?')"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# --------------------------------------------------------------- certificate --
# Self-signed, ECDSA P-256, for probe.bench; CA:FALSE, since webpki (capataz) refuses a CA
# certificate as the server's own. The same file is the CA both proxies verify against.
CERT=$RUN_DIR/cert.pem KEY=$RUN_DIR/key.pem
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -days 2 \
    -subj "/CN=$SNI" -addext "subjectAltName=DNS:$SNI" -addext "basicConstraints=critical,CA:FALSE" \
    -addext "keyUsage=critical,digitalSignature" -addext "extendedKeyUsage=serverAuth" \
    -keyout "$KEY" -out "$CERT" >"$RUN_DIR/openssl.log" 2>&1 || die "openssl req failed, see $RUN_DIR/openssl.log"
log "certificate: $(openssl x509 -in "$CERT" -noout -subject -ext subjectAltName | tr '\n' ' ')(ECDSA P-256)"

# ------------------------------------------------------------------- configs --
addr() { echo "127.0.$(( 1 + $1 / 250 )).$(( 1 + $1 % 250 ))"; }   # backend i -> its address

python3 - "$MODE" "$BACKENDS" "$PORT" "$GRPC_PORT" "$RUN_DIR" "$CERT" "$KEY" "$SNI" "$RESUMPTION" \
    "$CAPATAZ_PORT" "$CAPATAZ_ADMIN" "$HAPROXY_PORT" "$HAPROXY_STATS" <<'EOF'
import os, sys
mode, n, port, gport, d, cert, key, sni, resumption = sys.argv[1:10]
cport, cadmin, hport, hstats = sys.argv[10:14]
n = int(n)
addrs = [f"127.0.{1 + i // 250}.{1 + i % 250}:{port}" for i in range(n)]
with open(f"{d}/capataz.toml", "w") as f:
    f.write(f'[log]\nlevel = "warn"\n\n[admin]\naddress = "127.0.0.1:{cadmin}"\n\n'
            f'[[listeners]]\nname = "probe"\naddress = "127.0.0.1:{cport}"\n\n[pools.probe]\n')
    if mode in ("h2", "grpc"):
        f.write('protocol = "h2"\n')
    f.write('backends = [\n')
    for i, a in enumerate(addrs):
        f.write(f'    {{ name = "s{i}", address = "{a}" }},\n')
    f.write(f']\n\n[pools.probe.tls]\nca_file = "{cert}"\nserver_name = "{sni}"\n\n[pools.probe.active]\n')
    f.write('kind = "grpc"\n' if mode == "grpc" else 'kind = "http"\npath = "/healthz"\n')
    f.write('interval = "1s"\ntimeout = "1s"\nrise = 2\nfall = 3\n')
with open(f"{d}/haproxy.cfg", "w") as f:
    alpn = " check-alpn h2" if mode == "h2" else ""
    f.write("global\n    nbthread 1\n    maxconn 4000\n\ndefaults\n    mode http\n"
            "    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n"
            f"    timeout check 1s\n\nfrontend fe\n    bind 127.0.0.1:{hport}\n    default_backend be\n\n"
            "backend be\n    balance roundrobin\n    option httpchk\n"
            f"    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host {sni}\n"
            "    http-check expect status 200\n"
            f"    default-server inter 1s fall 3 rise 2 check-ssl verify required ca-file {cert} check-sni {sni}{alpn}\n")
    for i, a in enumerate(addrs):
        f.write(f"    server s{i} {a} check\n")
    f.write(f"\nlisten stats\n    bind 127.0.0.1:{hstats}\n    stats enable\n    stats uri /stats\n")
ng = f"{d}/nginx"
os.makedirs(f"{ng}/logs", exist_ok=True)
os.makedirs(f"{ng}/tmp", exist_ok=True)
h2 = " http2" if mode in ("h2", "grpc") else ""
with open(f"{ng}/nginx.conf", "w") as f:
    f.write("worker_processes 1;\ndaemon off;\npid nginx.pid;\nerror_log logs/error.log warn;\n"
            "worker_rlimit_nofile 16384;\nevents { worker_connections 8192; }\nhttp {\n"
            "    log_format probe '$msec $ssl_session_reused $server_protocol $ssl_protocol "
            "$ssl_cipher $ssl_curve $status $request_uri';\n"
            "    access_log logs/probes.log probe;\n"
            "    client_body_temp_path tmp/cb; proxy_temp_path tmp/p; fastcgi_temp_path tmp/f;\n"
            "    uwsgi_temp_path tmp/u; scgi_temp_path tmp/s;\n"
            f"    ssl_certificate {cert};\n    ssl_certificate_key {key};\n"
            "    ssl_protocols TLSv1.2 TLSv1.3;\n")
    if resumption == "off":
        f.write("    ssl_session_cache off;\n    ssl_session_tickets off;\n")
    if mode == "grpc":
        f.write(f"    upstream grpc_health {{ server 127.0.0.1:{gport}; keepalive 16; }}\n")
    f.write("    server {\n")
    for a in addrs:
        f.write(f"        listen {a} ssl{h2};\n")
    f.write(f"        server_name {sni};\n        location = /healthz {{ return 200 \"ok\\n\"; }}\n")
    if mode == "grpc":
        f.write("        location = /grpc.health.v1.Health/Check { grpc_pass grpc://grpc_health; }\n")
    f.write("        location / { return 404; }\n    }\n}\n")
EOF
haproxy -c -q -f "$RUN_DIR/haproxy.cfg" || die "haproxy config check failed"
check_out=$("$CAPATAZ_BIN" check "$RUN_DIR/capataz.toml" 2>&1 || true)
grep -q ': valid' <<<"$check_out" || die "capataz check failed: $check_out"
nginx -t -q -p "$RUN_DIR/nginx/" -c "$RUN_DIR/nginx/nginx.conf" -e "$RUN_DIR/nginx/logs/error.log" \
    || die "nginx config check failed"

# ------------------------------------------------------------------ backends --
LOGF=$RUN_DIR/nginx/logs/probes.log
rm -f "$LOGF"
BACKEND_PIDS=()
if [[ $MODE == grpc ]]; then
    start grpc_server "$LISTENER_CPU" "${NICED[@]}" python3 "$BENCH_DIR/grpc_health_server.py" "127.0.0.1:$GRPC_PORT"
    BACKEND_PIDS+=("$LAST_PID")
    prioritise "$LAST_PID"
    wait_port "$GRPC_PORT" "$LAST_PID" 30
fi
start nginx "$LISTENER_CPU" "${NICED[@]}" nginx -p "$RUN_DIR/nginx/" -c "$RUN_DIR/nginx/nginx.conf" -e "$RUN_DIR/nginx/logs/error.log"
BACKEND_PIDS+=("$LAST_PID")
NGINX=$LAST_PID
prioritise "$NGINX"
last=$(addr $(( BACKENDS - 1 )))
for _ in $(seq 100); do
    curl -sk --max-time 1 -o /dev/null "https://$last:$PORT/healthz" 2>/dev/null && break
    alive "$NGINX" || die "nginx failed: $(cat "$RUN_DIR/nginx.log" "$RUN_DIR/nginx/logs/error.log")"
    sleep 0.1
done
curl -sf --max-time 2 --cacert "$CERT" --resolve "$SNI:$PORT:$last" "$([[ $MODE == https ]] && echo --http1.1 || echo --http2)" \
    "https://$SNI:$PORT/healthz" >/dev/null 2>&1 || die "nginx does not answer https://$SNI:$PORT/healthz at $last"
wait_ns() { # nanoseconds PID and its children's threads have waited runnable (schedstat run delay)
    local p t s=0 v
    for p in $1 $(children "$1"); do
        for t in /proc/"$p"/task/*/schedstat; do
            read -r -a v <"$t" 2>/dev/null || continue
            s=$(( s + v[1] ))
        done
    done
    echo "$s"
}
backend_ticks() { local p s=0; for p in "${BACKEND_PIDS[@]}"; do s=$(( s + $(proc_ticks "$p") )); done; echo "$s"; }
log_bytes() { stat -c %s "$LOGF" 2>/dev/null || echo 0; }

# ------------------------------------------------------------------ one run --
measure() { # measure TARGET ROUND
    local tgt=$1 r=$2 pid port out=$RES_DIR/$1-r$2
    mkdir -p "$out"
    case $tgt in
        capataz) start capataz "$PROXY_CPU" "${NICED[@]}" env CAPATAZ_WORKER_THREADS=1 "$CAPATAZ_BIN" run --config "$RUN_DIR/capataz.toml"; port=$CAPATAZ_PORT ;;
        haproxy) start haproxy "$PROXY_CPU" "${NICED[@]}" haproxy -db -f "$RUN_DIR/haproxy.cfg"; port=$HAPROXY_PORT ;;
        *) die "unknown target $tgt" ;;
    esac
    pid=$LAST_PID
    prioritise "$pid"
    wait_port "$port" "$pid" 60
    log "$tgt round $r: listening; warm-up ${WARMUP}s"
    sleep "$WARMUP"
    local w k0 k1 b0 b1 o0 o1 t0 t1 q0 q1 windows=() perf_pid=""
    if [[ -n ${PERF:-} ]]; then
        perf record -F 999 -g -p "$pid" -o "$out/perf.data" -- sleep 10 >"$out/perf.log" 2>&1 &
        perf_pid=$!
    fi
    o0=$(log_bytes)
    for ((w = 0; w < DURATION / WINDOW; w++)); do
        k0=$(proc_ticks "$pid"); b0=$(backend_ticks); q0=$(wait_ns "$pid"); t0=$(date +%s.%N)
        sleep "$WINDOW"
        k1=$(proc_ticks "$pid"); b1=$(backend_ticks); q1=$(wait_ns "$pid"); t1=$(date +%s.%N); o1=$(log_bytes)
        windows+=("$(calc "$t1 - $t0") $(( k1 - k0 )) $(( b1 - b0 )) $o0 $o1 $(( q1 - q0 ))")
        o0=$o1
    done
    if [[ -n $perf_pid ]]; then
        wait "$perf_pid" || log "perf record failed: $(tail -2 "$out/perf.log")"
        perf report -i "$out/perf.data" --no-children --sort dso,sym --stdio -g none >"$out/perf.txt" 2>/dev/null || true
    fi
    local extra
    if [[ $tgt == capataz ]]; then
        curl -s --max-time 30 "http://127.0.0.1:$CAPATAZ_ADMIN/metrics" >"$out/metrics.txt" || true
        extra=$(awk '/^capataz_probes_total/ { if ($0 ~ /result="fail"/) fail += $NF; else pass += $NF }
            END { printf "{\"metrics_probes_pass\":%d,\"metrics_probes_fail\":%d}", pass, fail }' "$out/metrics.txt")
    else
        curl -s --max-time 30 "http://127.0.0.1:$HAPROXY_STATS/stats;csv" >"$out/stats.csv" || true
        extra=$(awk -F, 'NR==1 { sub(/^# /, ""); for (i = 1; i <= NF; i++) c[$i] = i; next }
            $1=="be" && $2 ~ /^s[0-9]+$/ { n++; if ($c["status"] ~ /^UP/) up++; chkfail += $c["chkfail"] }
            END { printf "{\"servers_up\":%d,\"servers\":%d,\"chkfail\":%d}", up, n, chkfail }' "$out/stats.csv")
    fi
    stop_named "$pid"
    printf '%s\n' "${windows[@]}" >"$out/windows.txt"
    python3 "$BENCH_DIR/probe_tls_report.py" run "$tgt" "$r" "$CLK_TCK" "$LOGF" "$out/windows.txt" \
        "$extra" >"$out/row.json"
    python3 "$BENCH_DIR/probe_tls_report.py" show "$out/row.json" >&2
}

for ((r = 1; r <= ROUNDS; r++)); do
    for tgt in $TARGETS; do measure "$tgt" "$r"; done
done
if grep -qv 'closed keepalive\|^$' "$RUN_DIR/nginx/logs/error.log" 2>/dev/null; then
    log "nginx error log (first lines): $(grep -v 'closed keepalive' "$RUN_DIR/nginx/logs/error.log" | head -3)"
fi

{
    echo
    echo "# probe-cost-tls.sh $STAMP: $(machine_line), $(openssl version | awk '{print $1, $2}')"
    echo "# MODE=$MODE: $BACKENDS backends (nginx, 127.0.1.1-$(addr $(( BACKENDS - 1 ))):$PORT, ECDSA P-256), interval 1s, no traffic, nginx resumption $RESUMPTION, nice $NICE; ${DURATION}s in ${WINDOW}s windows x $ROUNDS round(s); proxy cpu ${PROXY_CPU:-any}, backends cpu ${LISTENER_CPU:-any}; load at end $(cut -d' ' -f1-3 /proc/loadavg); raw: $RES_DIR"
    python3 "$BENCH_DIR/probe_tls_report.py" table "$RES_DIR"
} | tee "$RES_DIR/summary.txt"
