#!/usr/bin/env bash
# bench/instructions-h2c.sh - user-space instructions per HTTP/2 request through capataz,
# counted by callgrind, for comparing builds on a noisy machine (bench/instructions.sh does the
# same for HTTP/1.1 with wrk). The client speaks h2c (plaintext HTTP/2, prior knowledge) to a
# listener with `h2c = true`; capataz forwards over HTTP/1.1 keep-alive to one nginx backend.
#
# h2load sends a fixed number of requests (N, after a warm-up of 500) in each SHAPE:
#   "-c1 -m1"    one connection, one stream at a time: the connection has no stream between
#                two requests (what the patched h2 in vendor/h2 frees its buffers on)
#   "-c10 -m10"  ten connections of ten concurrent streams
# Counting starts after the warm-up (callgrind_control -z) and is dumped after the N requests;
# instructions / N. A fresh capataz under callgrind for each build and shape.
#
# Usage: bench/instructions-h2c.sh [BIN...]   (default: build this tree and measure it; the
#        word `haproxy` measures HAProxy 2.6 the same way: one thread, `bind ... proto h2`,
#        HTTP/1.1 keep-alive to the same nginx with `http-reuse safe`, no health check, as
#        capataz's `kind = "none"`)
#        env: N=4000 SHAPES="-c1 -m1|-c10 -m10" BASE=9750 OTHER_CPU=1
#        BODY_BYTES=N: the backend's answers carry N bytes (N-1 letters and a newline) instead
#        of "ok\n" (3 bytes), from a file above 4,000; h2 chains a DATA payload of 256 bytes
#        or more apart from its write buffer unless it fits in it (vendor/h2 patch 0010)
#        MEASURE=cpu: CPU time, not instructions: each build natively on PROXY_CPU (0), the
#        client and backend on OTHER_CPU, ROUNDS (3) rounds of the builds in turn, user and
#        system microseconds per request of the proxy's process (/proc/PID/stat) over N
#        (100,000) requests after 5,000 of warm-up, and h2load's req/s
#             RUN_DIR=/tmp/bench-instructions-h2c
#             CALLGRIND_OPTS= (more callgrind options, e.g. "--cache-sim=yes --branch-sim=yes":
#             the simulated cache misses per request are then printed too, I1mr the level-1
#             instruction cache's)
# Needs: valgrind (callgrind), h2load (nghttp2-client), nginx, ss. Loopback only; every
# process is stopped by its PID (bench/common.sh). About 10 s per build and shape.
set -Eeuo pipefail
LOG_TAG=instructions-h2c
source "$(dirname "$0")/common.sh"

read -r -a callgrind_opts <<<"${CALLGRIND_OPTS:-}"
MEASURE=${MEASURE:-instructions} ROUNDS=${ROUNDS:-3} PROXY_CPU=${PROXY_CPU-0}
if [[ $MEASURE == cpu ]]; then N=${N:-100000}; fi
N=${N:-4000} SHAPES=${SHAPES:--c1 -m1|-c10 -m10} BASE=${BASE:-9750} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-instructions-h2c}
BACKEND=$((BASE + 1)) LISTENER=$((BASE + 2))
ANSWER='return 200 "ok\n";'
mkdir -p "$RUN_DIR/nginx-backend/www"
if [[ -n ${BODY_BYTES:-} ]]; then
    { head -c $((BODY_BYTES - 1)) /dev/zero | tr '\0' a; echo; } >"$RUN_DIR/nginx-backend/www/body"
    # nginx takes a `return` text of up to 4 KB; a larger answer is the file (its head then
    # has Last-Modified, ETag and Accept-Ranges too).
    if ((BODY_BYTES <= 4000)); then
        ANSWER="return 200 \"$(head -c $((BODY_BYTES - 1)) /dev/zero | tr '\0' a)\\n\";"
    else
        ANSWER="root $RUN_DIR/nginx-backend/www; try_files /body =404;"
    fi
fi
mkdir -p "$RUN_DIR/nginx-backend"/{logs,tmp}
tools=(valgrind callgrind_control callgrind_annotate h2load nginx ss)
if [[ " $* " == *" haproxy "* ]]; then tools+=(haproxy); fi
need_tools "${tools[@]}"
for p in "$BACKEND" "$LISTENER"; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (set BASE=...)"; fi
done
bins=("$@")
if [[ ${#bins[@]} -eq 0 ]]; then
    build_capataz
    bins=("$CAPATAZ_BIN")
fi

cat >"$RUN_DIR/nginx-backend/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid nginx.pid;
error_log logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    client_body_temp_path tmp/client_body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    server {
        listen 127.0.0.1:$BACKEND;
        location / { $ANSWER }
    }
}
NGINX
cat >"$RUN_DIR/capataz.toml" <<CAPATAZ
[log]
level = "warn"

[[listeners]]
name = "h2c"
address = "127.0.0.1:$LISTENER"
forwarded_headers = false
h2c = true

[pools.bench]
backends = [{ name = "b1", address = "127.0.0.1:$BACKEND" }]
[pools.bench.active]
kind = "none"
CAPATAZ

cat >"$RUN_DIR/haproxy.cfg" <<HAPROXY
global
    nbthread 1
defaults
    mode http
    option http-keep-alive
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend h2c
    bind 127.0.0.1:$LISTENER proto h2
    default_backend bench
backend bench
    http-reuse safe
    server b1 127.0.0.1:$BACKEND
HAPROXY

start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port "$BACKEND" "$LAST_PID"

IFS='|' read -r -a shapes <<<"$SHAPES"
if [[ $MEASURE == cpu ]]; then
    # CPU time instead of instructions: each binary natively on PROXY_CPU, ROUNDS rounds of the
    # binaries in turn, user and system time of the proxy's process from /proc/PID/stat over N
    # requests after 5,000 of warm-up.
    tck=$(getconf CLK_TCK)
    us() { awk "BEGIN { printf \"%.2f\", ($1) * 1e6 / $tck / $N }"; }   # clock ticks -> us per request
    for ((r = 1; r <= ROUNDS; r++)); do
        for bin in "${bins[@]}"; do
            for shape in "${shapes[@]}"; do
                read -r -a h2args <<<"$shape"
                out=$RUN_DIR/$(basename "$bin")${shape// /}.cpu
                if [[ $bin == haproxy ]]; then
                    start haproxy "$PROXY_CPU" haproxy -db -f "$RUN_DIR/haproxy.cfg"
                else
                    start capataz "$PROXY_CPU" env CAPATAZ_WORKER_THREADS=1 "$bin" run \
                        --config "$RUN_DIR/capataz.toml"
                fi
                pid=$LAST_PID
                wait_port "$LISTENER" "$pid" 60
                (pin "$OTHER_CPU" h2load "${h2args[@]}" -n 5000 "http://127.0.0.1:$LISTENER/" >/dev/null)
                read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
                (pin "$OTHER_CPU" h2load "${h2args[@]}" -n "$N" "http://127.0.0.1:$LISTENER/" >"$out")
                read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
                stop_named "$pid"
                ok=$(awk '/^requests:/ {print $8}' "$out")
                [[ $ok == "$N" ]] || die "$bin $shape: $ok of $N requests succeeded (see $out)"
                rps=$(awk '/^finished in/ {print $4}' "$out")
                printf '%s\t%s\tround %s\tuser %s\tsystem %s\ttotal %s us per request\t%s req/s\n' \
                    "$bin" "$shape" "$r" "$(us "$u1 - $u0")" "$(us "$s1 - $s0")" \
                    "$(us "$u1 - $u0 + $s1 - $s0")" "$rps"
            done
        done
    done
    exit 0
fi
for bin in "${bins[@]}"; do
    for shape in "${shapes[@]}"; do
        read -r -a h2args <<<"$shape"
        out=$RUN_DIR/$(basename "$bin")${shape// /}.cg
        rm -f "$out" "$out".*
        if [[ $bin == haproxy ]]; then
            start haproxy "" valgrind --tool=callgrind \
                ${callgrind_opts[@]+"${callgrind_opts[@]}"} --callgrind-out-file="$out" \
                haproxy -db -f "$RUN_DIR/haproxy.cfg"
        else
            start capataz "" env CAPATAZ_WORKER_THREADS=1 valgrind --tool=callgrind \
                ${callgrind_opts[@]+"${callgrind_opts[@]}"} --callgrind-out-file="$out" "$bin" run --config "$RUN_DIR/capataz.toml"
        fi
        pid=$LAST_PID
        wait_port "$LISTENER" "$pid" 60
        (pin "$OTHER_CPU" h2load "${h2args[@]}" -n 500 "http://127.0.0.1:$LISTENER/" >/dev/null)
        callgrind_control -z "$pid" >/dev/null
        (pin "$OTHER_CPU" h2load "${h2args[@]}" -n "$N" "http://127.0.0.1:$LISTENER/" >"$out.h2load")
        callgrind_control -d "$pid" >/dev/null
        stop_named "$pid"
        ok=$(awk '/^requests:/ {print $8}' "$out.h2load")
        [[ $ok == "$N" ]] || die "$bin $shape: $ok of $N requests succeeded (see $out.h2load)"
        ir=$(callgrind_annotate "$out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
        printf '%s\t%s\trequests %s\tinstructions %s\tper request %s' "$bin" "$shape" "$N" "$ir" \
            "$(calc "int($ir / $N)")"
        if [[ -n ${CALLGRIND_OPTS:-} ]]; then
            # callgrind_annotate's event names and PROGRAM TOTALS line, each total per request.
            callgrind_annotate "$out.1" 2>/dev/null | awk -v n="$N" '
                /^Events shown:/ { for (i = 3; i <= NF; i++) ev[++ne] = $i }
                /PROGRAM TOTALS/ { k = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9,]+$/) {
                    v = $i; gsub(",", "", v); if (++k > 1 && k <= ne) printf "\t%s %.1f", ev[k], v / n } }'
        fi
        echo
    done
done
