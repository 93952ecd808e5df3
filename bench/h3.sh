#!/usr/bin/env bash
# bench/h3.sh - HTTP/3 against Caddy's, same run, interleaved: requests per second, latency and
# the proxies' CPU per request with kept-alive QUIC connections, and the CPU per full QUIC
# handshake, beside the same proxies' CPU per full TLS-over-TCP handshake.
#
# The shared harness's two nginx backends (127.0.0.1:9101/:9102, its backend-nginx.conf) and
# two proxies, each one thread, pinned alone to PROXY_CPU (only the one under load is busy):
#   capataz  bench/capataz-h3.toml: TCP and UDP 127.0.0.1:9400, `[listeners.tls.http3]`
#   caddy    the shared harness's Caddyfile (round robin, GET /healthz checks every 1 s) with
#            `https://:9500`, `tls CERT KEY` and `protocols h1 h2 h3`: TCP and UDP :9500,
#            GOMAXPROCS=1; its idle backend pool raised to CONNS x STREAMS (at least 64) as
#            the harness does for h2 (default 32 per backend: h3x would churn it)
# Both terminate TLS 1.3 with the same self-signed ECDSA P-256 certificate for localhost (made
# once with openssl in RUN_DIR/tls) and speak plaintext HTTP/1.1 with keep-alive to the backends.
# The load generator, on OTHER_CPU with the backends:
#   h3        bench/h3load -c CONNS -m 1: CONNS QUIC connections, one request in flight each
#   h3x       bench/h3load -c CONNS -m STREAMS: STREAMS requests in flight per connection
#   h3-new    bench/h3load --new -c CONNS: CONNS clients, each one request per QUIC connection
#             (a full handshake, no resumption, no 0-RTT), then the next
#   https-new hey -disable-keepalive -c CONNS (bench/hey-sni/hey): the same over TCP + TLS 1.3,
#             as `bench/peers.sh -P https-new` (skipped when hey is not installed)
#   https     wrk -t1 -c CONNS: HTTP/1.1 over TCP + TLS 1.3, kept alive, as `bench/peers.sh -P
#             https` (the TCP reference for h3)
# bench/h3load (bench/h3load/, quinn + h3 + rustls, as capataz's own listener) is the HTTP/3
# client because Debian's h2load is built without ngtcp2 and its curl without HTTP/3.
# Before measuring, each proxy must reach b1 and b2 (curl over TCP) and answer over HTTP/3
# (a short h3load run with no failure). ROUNDS rounds of DURATION per mode and proxy, the
# starting proxy alternating by round; CPU per request is the proxy's utime+stime from /proc
# over the run divided by the requests answered (per handshake in the *-new modes); conn/rq is
# the kernel's TCP PassiveOpens over the run per request (in the h3 modes only the proxies'
# backend connections are TCP: how often a proxy opened one); sys is the kernel's share of the
# proxy's CPU (stime); UDP drops are the kernel's Udp RcvbufErrors over the run (datagrams
# dropped for a full socket receive buffer, host-wide: each costs QUIC a retransmission).
# client_us is the load generator's own CPU per request (bash `times` around the run).
# Medians, and per round the ratio capataz / caddy (median of the per-round ratios, rounds
# capataz did better).
#
# Usage: flock /tmp/capataz-bench.lock bench/h3.sh
#        env: CONNS=50 STREAMS=10 DURATION=5 ROUNDS=5 MODES="h3 h3x h3-new https-new https"
#             PROXY_CPU=0 OTHER_CPU=1 RUN_DIR=/tmp/bench-h3 SHARED=../shared/bench
#             CAPATAZ_BIN=... H3LOAD_BIN=... (default: a release build of this tree)
# Needs: nginx, caddy, curl, openssl, taskset, hey (https-new), wrk (https). Runtime: about
# ROUNDS x MODES x 2 x (DURATION + 2 s) + 1 min.
set -Eeuo pipefail
LOG_TAG=h3
source "$(dirname "$0")/common.sh"

CONNS=${CONNS:-50} STREAMS=${STREAMS:-10} DURATION=${DURATION:-5} ROUNDS=${ROUNDS:-5}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
RUN_DIR=${RUN_DIR:-/tmp/bench-h3}
SHARED=${SHARED:-$ROOT_DIR/../shared/bench}
read -r -a MODES <<<"${MODES:-h3 h3x h3-new https-new https}"
TARGETS=(capataz caddy)
declare -A PORT=([capataz]=9400 [caddy]=9500) PID=()
mkdir -p "$RUN_DIR/nginx-backend"/{logs,tmp} "$RUN_DIR/caddy" "$RUN_DIR/tls"
RES=$RUN_DIR/results-$(date +%Y%m%dT%H%M%S).tsv
TICK_US=$(( 1000000 / CLK_TCK ))

for cmd in nginx caddy curl openssl taskset ss; do
    command -v "$cmd" >/dev/null || die "missing command: $cmd (apt-get install -y nginx caddy curl openssl)"
done
if [[ " ${MODES[*]} " == *" https-new "* ]] && ! command -v hey >/dev/null; then
    log "hey is not installed: leaving out https-new (apt-get install -y hey)"
    read -r -a MODES <<<"$(tr ' ' '\n' <<<"${MODES[*]}" | grep -vx https-new | tr '\n' ' ')"
fi
if [[ " ${MODES[*]} " == *" https "* ]]; then command -v wrk >/dev/null || die "missing command: wrk (mode https)"; fi
for p in 9101 9102 9400 9500 9501; do
    if port_busy "$p" || [[ -n $(ss -Hlun "sport = :$p" 2>/dev/null) ]]; then
        die "127.0.0.1:$p already in use (not started by us)"
    fi
done

# The binaries: capataz and h3load from one release build of this tree (h3load's crates and
# features are a subset of capataz's, so they are compiled once for both).
if [[ -z ${CAPATAZ_BIN:-} || -z ${H3LOAD_BIN:-} ]]; then
    (cd "$ROOT_DIR" && cargo build --release --quiet -p capataz --bin capataz -p capataz-h3load --bin h3load)
    out=${CARGO_TARGET_DIR:-$ROOT_DIR/target}/release
    cp "$out/capataz" "$out/h3load" "$RUN_DIR/"
    CAPATAZ_BIN=${CAPATAZ_BIN:-$RUN_DIR/capataz} H3LOAD_BIN=${H3LOAD_BIN:-$RUN_DIR/h3load}
fi
log "capataz: $CAPATAZ_BIN ($(cd "$ROOT_DIR" && git rev-parse --short HEAD)), h3load: $H3LOAD_BIN"
log "UDP socket buffers: rmem_default $(cat /proc/sys/net/core/rmem_default), rmem_max $(cat /proc/sys/net/core/rmem_max)"
log "host: $(nproc) vCPU $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), kernel $(uname -r), $(nginx -v 2>&1 | sed 's/.*: //'), caddy $(caddy version | awk '{print $1}')"

# The certificate: self-signed ECDSA P-256 for localhost and 127.0.0.1, as the harness makes.
export BENCH_CERT=$RUN_DIR/tls/bench-cert.pem BENCH_KEY=$RUN_DIR/tls/bench-key.pem
if ! openssl x509 -in "$BENCH_CERT" -noout -checkend 86400 >/dev/null 2>&1; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -days 365 \
        -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
        -keyout "$BENCH_KEY" -out "$BENCH_CERT" >"$RUN_DIR/tls/openssl.log" 2>&1 || die "openssl req failed"
fi

cp "$SHARED/backend-nginx.conf" "$RUN_DIR/nginx-backend/nginx.conf"
start backend "$OTHER_CPU" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port 9101 "$LAST_PID"; wait_port 9102 "$LAST_PID"

# Caddy: the harness's Caddyfile over TLS with HTTP/3 (the lines it marks as rewritable).
pool=$(( CONNS * STREAMS > 64 ? CONNS * STREAMS : 64 ))
sed -E -e "s#^http://:9500 \{#https://:9500 {#" \
       -e "s#^([[:space:]]*)bind 127\.0\.0\.1\$#&\n\1tls $BENCH_CERT $BENCH_KEY#" \
       -e "s#^([[:space:]]*)\# no h3: .*#\1\# h3 on: bench/h3.sh (a UDP listener on :9500, Alt-Svc on TCP answers)#" \
       -e "s#^([[:space:]]*protocols) h1\$#\1 h1 h2 h3#" \
       -e "s#^([[:space:]]*)health_timeout 1s\$#&\n\1transport http {\n\1\tkeepalive_idle_conns_per_host $pool\n\1}#" \
    "$SHARED/Caddyfile" >"$RUN_DIR/caddy/Caddyfile"
grep -q "protocols h1 h2 h3" "$RUN_DIR/caddy/Caddyfile" && grep -q "tls $BENCH_CERT" "$RUN_DIR/caddy/Caddyfile" &&
    grep -q "keepalive_idle_conns_per_host $pool" "$RUN_DIR/caddy/Caddyfile" || die "could not rewrite the Caddyfile"
CADDY_ENV=(HOME="$RUN_DIR/caddy" XDG_CONFIG_HOME="$RUN_DIR/caddy/config" XDG_DATA_HOME="$RUN_DIR/caddy/data" GOMAXPROCS=1)
env "${CADDY_ENV[@]}" caddy validate --config "$RUN_DIR/caddy/Caddyfile" --adapter caddyfile >"$RUN_DIR/caddy-validate.log" 2>&1 ||
    die "caddy config check failed, see $RUN_DIR/caddy-validate.log"

for tgt in "${TARGETS[@]}"; do
    case $tgt in
        capataz) CAPATAZ_WORKER_THREADS=1 start capataz "$PROXY_CPU" "$CAPATAZ_BIN" run --config "$BENCH_DIR/capataz-h3.toml" ;;
        caddy) start caddy "$PROXY_CPU" env "${CADDY_ENV[@]}" caddy run --config "$RUN_DIR/caddy/Caddyfile" --adapter caddyfile ;;
    esac
    PID[$tgt]=$LAST_PID
    wait_port "${PORT[$tgt]}" "$LAST_PID"
done

h3load() { # h3load TARGET OUT ARGS...: pinned with the backends
    local tgt=$1 out=$2; shift 2
    (pin "$OTHER_CPU" timeout -k 5 $(( DURATION + 60 )) "$H3LOAD_BIN" --cert "$BENCH_CERT" "$@" \
        "https://127.0.0.1:${PORT[$tgt]}/") >"$out" 2>&1
}

# The checks: both backends in rotation, TLS 1.3, and HTTP/3 answering with no failure.
for tgt in "${TARGETS[@]}"; do
    url=https://localhost:${PORT[$tgt]}/
    deadline=$(( SECONDS + 15 ))
    until [[ $(for _ in 1 2 3 4; do curl -sk --http1.1 --max-time 2 -D - -o /dev/null "$url"; done |
               tr -d '\r' | awk -F': ' 'tolower($1)=="x-backend"{print $2}' | sort -u | tr '\n' ' ') == "b1 b2 " ]]; do
        (( SECONDS < deadline )) || die "$tgt: $url does not reach both b1 and b2"
        sleep 0.5
    done
    tls=$(curl -skv --http1.1 --max-time 2 -o /dev/null "$url" 2>&1 | sed -n 's/^\* SSL connection using \(.*\)$/\1/p' | head -1)
    [[ $tls == TLSv1.3* ]] || die "$tgt: expected TLS 1.3, curl saw '${tls:-no TLS}'"
    DURATION=1 h3load "$tgt" "$RUN_DIR/check-$tgt.txt" -c 2 -m 2 -d 1 ||
        die "$tgt: HTTP/3 check failed, see $RUN_DIR/check-$tgt.txt"
    grep -q '^requests: [1-9][0-9]* ok, 0 failed$' "$RUN_DIR/check-$tgt.txt" ||
        die "$tgt: HTTP/3 check had failures, see $RUN_DIR/check-$tgt.txt"
    log "check $tgt: b1 and b2 in rotation, $tls, HTTP/3 $(sed -n 's/^requests: //p' "$RUN_DIR/check-$tgt.txt")"
done

wrk_us() { # wrk_us FILE 50%|99%: that line of wrk --latency, in microseconds
    awk -v q="$2" '$1==q { v=$2; u=v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
                           m = (u=="us") ? 1 : (u=="ms") ? 1000 : (u=="s") ? 1000000 : 0; print v*m }' "$1"
}

run_mode() { # run_mode MODE TARGET OUT: the load; fills REQS RPS P50 P99 FAILED
    local mode=$1 tgt=$2 out=$3
    # The load generator's CPU: bash `times` (this shell's reaped children, a subshell's own
    # children included once it waited for them) just before and after it, into files, since
    # `times` in a $(...) subshell would count that subshell's children only.
    times >"$RUN_DIR/.times0"
    case $mode in
        h3) h3load "$tgt" "$out" -c "$CONNS" -m 1 -d "$DURATION" || true ;;
        h3x) h3load "$tgt" "$out" -c "$CONNS" -m "$STREAMS" -d "$DURATION" || true ;;
        h3-new) h3load "$tgt" "$out" --new -c "$CONNS" -d "$DURATION" || true ;;
        https)
            (pin "$OTHER_CPU" timeout -k 5 $(( DURATION + 60 )) wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency \
                "https://127.0.0.1:${PORT[$tgt]}/") >"$out" 2>&1 || true ;;
        https-new)
            (pin "$OTHER_CPU" timeout -k 5 $(( DURATION + 60 )) "$BENCH_DIR/hey-sni/hey" -cpus 1 \
                -disable-keepalive -c "$CONNS" -z "${DURATION}s" "https://127.0.0.1:${PORT[$tgt]}/") >"$out" 2>&1 || true ;;
    esac
    times >"$RUN_DIR/.times1"
    if [[ $mode == https ]]; then
        REQS=$(awk '/ requests in / {print $1}' "$out"); RPS=$(awk '/^Requests\/sec:/ {print $2}' "$out")
        P50=$(wrk_us "$out" 50%); P99=$(wrk_us "$out" 99%)
        FAILED=$(awk '/Socket errors:/ {gsub(",", ""); n += $4 + $6 + $8 + $10} /Non-2xx or 3xx/ {n += $5} END {print n+0}' "$out")
    elif [[ $mode == https-new ]]; then
        REQS=$(awk '/^  \[200\]/ {print $2}' "$out"); RPS=$(awk '/^  Requests\/sec:/ {print $2}' "$out")
        P50=$(awk '/^  50% in / {print $3 * 1e6}' "$out"); P99=$(awk '/^  99% in / {print $3 * 1e6}' "$out")
        FAILED=$(awk '/^Error distribution:/ {e=1} e && /^  \[[0-9]+\]/ {n+=substr($1, 2)} /^  \[[0-9]+\] [0-9]+ responses/ && $1 != "[200]" {n+=$2} END {print n+0}' "$out")
    else
        REQS=$(awk '/^requests: / {print $2}' "$out"); FAILED=$(awk '/^requests: / {print $4}' "$out")
        RPS=$(awk '/^req_per_s: / {print $2}' "$out")
        P50=$(awk '/^latency_us: / {print $3}' "$out"); P99=$(awk '/^latency_us: / {print $9}' "$out")
    fi
    [[ ${REQS:-0} -gt 0 ]] || die "$mode $tgt: no request answered, see $out"
}

proc_sys_ticks() { # stime ticks of PID (all threads): the kernel's share of proc_ticks
    local s; s=$(cat "/proc/$1/stat"); s=${s##*) }; read -r -a f <<<"$s"; echo "${f[12]}"
}

times_secs() { # times_secs FILE: user+sys seconds of reaped children in a `times` output
    awk 'NR==2 { s=0; for (i=1; i<=2; i++) { split($i, a, "m"); s += a[1]*60 + a[2] } printf "%.3f\n", s }' "$1"
}

udp_drops() { # the kernel's count of UDP datagrams dropped for a full receive buffer (host-wide)
    awk '/^Udp:/ { if (!h) { for (i = 2; i <= NF; i++) if ($i == "RcvbufErrors") c = i; h = 1 } else print $c }' /proc/net/snmp
}

passive_opens() { # the kernel's count of accepted TCP connections (host-wide)
    awk '/^Tcp:/ { if (!h) { for (i = 2; i <= NF; i++) if ($i == "PassiveOpens") c = i; h = 1 } else print $c }' /proc/net/snmp
}

for mode in "${MODES[@]}"; do   # warm-up: connections, pools, caches
    for tgt in "${TARGETS[@]}"; do DURATION=2 run_mode "$mode" "$tgt" "$RUN_DIR/warmup.txt"; done
done
printf 'round\tmode\ttarget\treq_s\tp50_us\tp99_us\tcpu_us_per_req\tbackend_conns_per_req\tfailed\trequests\tsys_us_per_req\tudp_rcvbuf_drops\tclient_cpu_us_per_req\n' >"$RES"
for round in $(seq "$ROUNDS"); do
    for mode in "${MODES[@]}"; do
        for ((i = 0; i < 2; i++)); do
            tgt=${TARGETS[(i + round - 1) % 2]}
            out=$RUN_DIR/$mode-$round-$tgt.txt
            before=$(proc_ticks "${PID[$tgt]}"); sys0=$(proc_sys_ticks "${PID[$tgt]}"); po0=$(passive_opens); ud0=$(udp_drops)
            run_mode "$mode" "$tgt" "$out"
            after=$(proc_ticks "${PID[$tgt]}"); sys1=$(proc_sys_ticks "${PID[$tgt]}"); po1=$(passive_opens); ud1=$(udp_drops)
            client=$(calc "($(times_secs "$RUN_DIR/.times1") - $(times_secs "$RUN_DIR/.times0")) * 1000000 / $REQS")
            cpu=$(calc "($after - $before) * $TICK_US / $REQS")
            sys=$(calc "($sys1 - $sys0) * $TICK_US / $REQS")
            conns=$(calc "($po1 - $po0) / $REQS")
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.3f\t%s\t%s\t%.2f\t%s\t%.2f\n' "$round" "$mode" "$tgt" "$RPS" "$P50" "$P99" \
                "$cpu" "$conns" "$FAILED" "$REQS" "$sys" $(( ud1 - ud0 )) "$client" >>"$RES"
            log "round $round $mode $tgt: $RPS req/s, p50 $P50 us, p99 $P99 us, CPU $(printf %.2f "$cpu") us/request ($(printf %.2f "$sys") in the kernel), conn/rq $(printf %.3f "$conns"), UDP drops $(( ud1 - ud0 )), client CPU $(printf %.2f "$client") us/request, failed $FAILED"
        done
    done
done

echo
echo "CONNS=$CONNS STREAMS=$STREAMS DURATION=${DURATION}s ROUNDS=$ROUNDS; medians (CPU: the proxy's, per request; *-new: per handshake)"
printf '%-10s %-8s %10s %9s %9s %11s %11s %8s %9s %10s %7s\n' mode target req_s p50_us p99_us cpu_us_req sys_us_req conn/rq udp_drops client_us failed
col() { awk -F'\t' -v m="$1" -v t="$2" -v c="$3" '$2==m && $3==t {print $c}' "$RES" | median; }
for mode in "${MODES[@]}"; do
    for tgt in "${TARGETS[@]}"; do
        printf '%-10s %-8s %10.0f %9.0f %9.0f %11.2f %11.2f %8.3f %9s %10.2f %7s\n' "$mode" "$tgt" "$(col "$mode" "$tgt" 4)" \
            "$(col "$mode" "$tgt" 5)" "$(col "$mode" "$tgt" 6)" "$(col "$mode" "$tgt" 7)" "$(col "$mode" "$tgt" 11)" \
            "$(col "$mode" "$tgt" 8)" "$(col "$mode" "$tgt" 12)" "$(col "$mode" "$tgt" 13)" "$(awk -F'\t' -v m="$mode" -v t="$tgt" '$2==m && $3==t {n+=$9} END {print n+0}' "$RES")"
    done
done
echo "capataz / caddy, round by round (median of the per-round ratios; rounds capataz won):"
for mode in "${MODES[@]}"; do
    awk -F'\t' -v m="$mode" '
        function median(a, n,   i, j, t) {
            for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
            return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        $2 == m { v[$1, $3] = $4 " " $6 " " $7; r[$1] }
        END {
            for (k in r) if ((k, "capataz") in v && (k, "caddy") in v) {
                split(v[k, "capataz"], x, " "); split(v[k, "caddy"], y, " ")
                if (y[1] <= 0 || y[2] <= 0 || y[3] <= 0) continue
                n++; q[n] = x[1] / y[1]; p[n] = x[2] / y[2]; u[n] = x[3] / y[3]
                wq += x[1] > y[1]; wp += x[2] <= y[2]; wu += x[3] < y[3]
            }
            if (n) printf "%-10s rounds %d  req/s %.2fx (more in %d)  p99 %.2fx (lower or equal in %d)  CPU/req %.2fx (less in %d)\n",
                m, n, median(q, n), wq, median(p, n), wp, median(u, n), wu
        }' "$RES"
done
log "raw figures: $RES (and $RUN_DIR/<mode>-<round>-<target>.txt)"
