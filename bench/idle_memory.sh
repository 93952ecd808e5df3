#!/usr/bin/env bash
# bench/idle_memory.sh - memory per idle client connection, capataz against HAProxy (issue 11's
# proof item), in five modes (see bench/idle_conns.py):
#   plain       plaintext HTTP/1.1, connected, no request yet
#   plain-kept  plaintext HTTP/1.1, idle after one request and its answer (keep-alive)
#   tls         TLS 1.3 (ALPN http/1.1), idle after the handshake
#   h2          TLS 1.3 with ALPN h2, idle after the preface and both SETTINGS (acked), no stream
#   h2c         plaintext HTTP/2 with prior knowledge, the same (capataz: a listener with
#               `h2c = true`; HAProxy: `bind ... proto h2`)
# For each proxy, mode and N in CONNS, a fresh proxy process is started (so that no memory freed
# by an earlier run is reused), its VmRSS is read, N connections are opened and left idle, and
# its VmRSS is read again 2 s later: (after - before) / N, in KiB. ROUNDS runs each; medians.
#
# Setup: one nginx backend (127.0.0.1:BASE+1, "ok\n"), HAProxy (nbthread 1, maxconn (ulimit -n - 200) / 2,
# timeouts 300 s) on BASE+10.., capataz (CAPATAZ_WORKER_THREADS=1, idle_timeout 300 s) on
# BASE+20..; a self-signed ECDSA P-256 certificate made by openssl for both. Both proxies are
# pinned to PROXY_CPU, the client and the backend to OTHER_CPU. RLIMIT_NOFILE is raised to the
# hard limit for every process started here (N up to about the hard limit minus 100).
# Everything is on loopback; every process is stopped by its PID (bench/common.sh).
#
# SETTLE=S (seconds): each measurement is a second wave of N connections, opened S seconds after
# a first wave of N (see bench/idle_conns.py): the cost of one more idle connection in a process
# that has served as many and let them settle, not the peak of a burst. With plain-kept, give
# HOLD=8 too: capataz's allocator gives the first wave's freed memory back within about a
# second, so the second wave's own burst is what HOLD=2 would read. Twice the connections:
# with plain-kept each proxy also holds a backend connection per client, so N up to about a
# quarter of the descriptor limit.
#
# WARMUP=K: the same scenario with K connections first (set up, idle HOLD s, closed), 2 s before
# VmRSS "before" is read (bench/idle_conns.py): a process's first idle connections fault in its
# code and its allocator's first slabs once, whatever N; with WARMUP that is in "before", for
# every proxy alike.
#
# HOLD=S (seconds, default 2): VmRSS "after" is read S seconds after the last connection is set
# up, not 2: with plain-kept, once every connection has been quiet long enough to park.
#
# Usage: bench/idle_memory.sh   (env: CONNS="1000 9900" MODES="plain plain-kept tls h2 h2c"
#        TARGETS="haproxy capataz" ROUNDS=3 BASE=9500 PROXY_CPU=0 OTHER_CPU=1
#        RUN_DIR=/tmp/bench-idle-memory CAPATAZ_BIN=...)
# Runtime: about 10 min with the defaults (TLS handshakes in Python are the slow part).
set -Eeuo pipefail
LOG_TAG=idle-memory
source "$(dirname "$0")/common.sh"

SETTLE=${SETTLE:-0} HOLD=${HOLD:-2} WARMUP=${WARMUP:-0}
CONNS=${CONNS:-1000 9900} MODES=${MODES:-plain plain-kept tls h2 h2c}
TARGETS=${TARGETS:-haproxy capataz} ROUNDS=${ROUNDS:-3} BASE=${BASE:-9500}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-idle-memory}
mkdir -p "$RUN_DIR/nginx-backend"/{logs,tmp}
STAMP=$(date +%Y%m%dT%H%M%S)
RES=$RUN_DIR/results-$STAMP.tsv

ulimit -n "$(ulimit -Hn)"
# HAProxy refuses to start unless 2 x maxconn (a server side per client) fits in its descriptor
# limit; a container whose hard limit is 20,000 (this one) allows 9,900 idle clients, not 10,000.
MAXCONN=$(( ($(ulimit -n) - 200) / 2 ))
WAVES=1; if [[ $SETTLE != 0 ]]; then WAVES=2; fi
for n in $CONNS; do (( WAVES * n <= MAXCONN )) || die "$WAVES x N=$n is above what HAProxy can take with ulimit -n $(ulimit -n) (maxconn $MAXCONN)"; done
need_tools nginx haproxy taskset ss openssl python3
BACKEND=$((BASE + 1))
declare -A PORT=(
    [haproxy:plain]=$((BASE + 10)) [haproxy:plain-kept]=$((BASE + 10)) [haproxy:tls]=$((BASE + 11))
    [haproxy:h2]=$((BASE + 12)) [haproxy:h2c]=$((BASE + 13))
    [capataz:plain]=$((BASE + 20)) [capataz:plain-kept]=$((BASE + 20)) [capataz:tls]=$((BASE + 21))
    [capataz:h2]=$((BASE + 22)) [capataz:h2c]=$((BASE + 23))
)
for p in "$BACKEND" "${PORT[@]}"; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (set BASE=...)"; fi
done
if [[ " $TARGETS " == *" capataz "* ]]; then build_capataz; fi
log "host: $(machine_line)"

# The certificate (and HAProxy's combined PEM).
CERT=$RUN_DIR/cert.pem KEY=$RUN_DIR/key.pem PEM=$RUN_DIR/haproxy.pem
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -days 30 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$KEY" -out "$CERT" >"$RUN_DIR/openssl.log" 2>&1 || die "openssl failed, see $RUN_DIR/openssl.log"
cat "$CERT" "$KEY" >"$PEM"

cat >"$RUN_DIR/nginx-backend/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid nginx.pid;
error_log logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_timeout 300s;
    client_body_temp_path tmp/client_body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    server {
        listen 127.0.0.1:$BACKEND;
        location / { return 200 "ok\n"; }
    }
}
NGINX

cat >"$RUN_DIR/haproxy.cfg" <<HAPROXY
global
    nbthread 1
    maxconn $MAXCONN
defaults
    mode http
    option http-keep-alive
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    timeout http-request 300s
    timeout http-keep-alive 300s
frontend fe
    bind 127.0.0.1:${PORT[haproxy:plain]}
    bind 127.0.0.1:${PORT[haproxy:tls]} ssl crt $PEM alpn http/1.1
    bind 127.0.0.1:${PORT[haproxy:h2]} ssl crt $PEM alpn h2
    bind 127.0.0.1:${PORT[haproxy:h2c]} proto h2
    default_backend be
backend be
    server b1 127.0.0.1:$BACKEND
HAPROXY

cat >"$RUN_DIR/capataz.toml" <<CAPATAZ
[log]
level = "warn"

[[listeners]]
name = "plain"
address = "127.0.0.1:${PORT[capataz:plain]}"
idle_timeout = "300s"
forwarded_headers = false

[[listeners]]
name = "tls"
address = "127.0.0.1:${PORT[capataz:tls]}"
idle_timeout = "300s"
forwarded_headers = false
[listeners.tls]
certificates = [{ cert = "$CERT", key = "$KEY" }]
alpn = ["http/1.1"]

[[listeners]]
name = "h2"
address = "127.0.0.1:${PORT[capataz:h2]}"
idle_timeout = "300s"
forwarded_headers = false
[listeners.tls]
certificates = [{ cert = "$CERT", key = "$KEY" }]
alpn = ["h2"]

[[listeners]]
name = "h2c"
address = "127.0.0.1:${PORT[capataz:h2c]}"
idle_timeout = "300s"
forwarded_headers = false
h2c = true

[pools.bench]
backends = [{ name = "b1", address = "127.0.0.1:$BACKEND" }]
[pools.bench.active]
kind = "none"
CAPATAZ

start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port "$BACKEND" "$LAST_PID"

start_proxy() { # start_proxy TARGET; sets PX
    case $1 in
        haproxy) start haproxy "$PROXY_CPU" haproxy -db -f "$RUN_DIR/haproxy.cfg" ;;
        capataz) start capataz "$PROXY_CPU" env CAPATAZ_WORKER_THREADS=1 "$CAPATAZ_BIN" run --config "$RUN_DIR/capataz.toml" ;;
    esac
    PX=$LAST_PID
    local m; for m in $MODES; do wait_port "${PORT[$1:$m]}" "$PX"; done
    sleep 1
}

printf 'target\tmode\tconns\tround\tbefore_kib\tafter_kib\tkib_per_conn\n' >"$RES"
for n in $CONNS; do
    for mode in $MODES; do
        for ((r = 1; r <= ROUNDS; r++)); do
            for t in $TARGETS; do
                start_proxy "$t"
                out=$( (pin "$OTHER_CPU" env SETTLE="$SETTLE" HOLD="$HOLD" WARMUP="$WARMUP" python3 "$BENCH_DIR/idle_conns.py" "$PX" "${PORT[$t:$mode]}" "$n" "$mode") 2>"$RUN_DIR/client.err") ||
                    die "$t $mode $n: client failed: $(tail -3 "$RUN_DIR/client.err")"
                read -r _ _ before after per <<<"$out"
                printf '%s\t%s\t%d\t%d\t%d\t%d\t%s\n' "$t" "$mode" "$n" "$r" "$before" "$after" "$per" >>"$RES"
                log "$t $mode n=$n round $r: $before -> $after KiB, $per KiB each"
                stop_named "$PX"
            done
        done
    done
done

{
    echo
    echo "# idle_memory.sh $STAMP: $(machine_line)"
    echo "# KiB of VmRSS per idle client connection (after - before) / N, medians of $ROUNDS fresh starts, read ${HOLD} s after the last$( [[ $WARMUP != 0 ]] && echo ", after a warm-up of $WARMUP held ${HOLD} s and closed 2 s before")$( [[ $SETTLE != 0 ]] && echo ", second wave ${SETTLE} s after a first of N"); raw: $RES"
    printf '%-11s %7s' mode conns
    for t in $TARGETS; do printf ' %10s' "$t"; done
    if [[ $TARGETS == "haproxy capataz" ]]; then printf ' %9s' ratio; fi
    echo
    for n in $CONNS; do
        for mode in $MODES; do
            printf '%-11s %7d' "$mode" "$n"
            declare -A med=()
            for t in $TARGETS; do
                med[$t]=$(awk -F'\t' -v t="$t" -v m="$mode" -v n="$n" '$1==t && $2==m && $3==n{print $7}' "$RES" | median)
                printf ' %10.2f' "${med[$t]}"
            done
            if [[ $TARGETS == "haproxy capataz" ]]; then printf ' %8.2fx' "$(calc "${med[capataz]} / ${med[haproxy]}")"; fi
            echo
        done
    done
} | tee "$RUN_DIR/summary-$STAMP.txt"
