#!/usr/bin/env bash
# bench/pgo.sh - a profile-guided release build of capataz: the release binary (fat LTO, as
# Cargo.toml's `[profile.release]`) built a second time with what an instrumented build of the
# same tree counted while it served a training load, so that the compiler lays out, inlines
# and optimises the code by how often it runs (LLVM's PGO: hot paths together and straight,
# cold ones out of the way). BENCHMARKS.md, "A profile-guided build", has what it changes.
#
# The training load, on loopback (127.0.0.1:TRAIN_BASE...), against two nginx backends, each
# part TRAIN_SECONDS long, every part with the same capataz process:
#   HTTP/1.1 plaintext (wrk -c50, and -c1), the same through a route with header rules, a
#   path rewrite, an access log and latency outliers on, h2c (h2load -c10 -m10, and -c1 -m1),
#   HTTPS keep-alive (wrk -c50), a TLS handshake per request (wrk, `Connection: close`),
#   HTTP/2 over TLS (h2load -c50 -m10), request bodies (h2load -d, HTTP/1.1 and HTTP/2), TCP
#   mode, a pool of HTTP/2 backends (`protocol = "h2c"`, nginx's h2c, from HTTP/1.1 and h2c
#   clients), and HTTP/3 (bench/h3load) unless H3=0.
# What the training does not run is laid out as cold: it still works, but may run slower than in
# the plain release build (`cargo build --release`). The profile comes from this tree only; it
# is not kept in the repository, so it never goes stale.
#
# Usage: bench/pgo.sh [OUT]   (default OUT: target/pgo/capataz)
#        env: PROFDATA=llvm-profdata (an llvm-profdata that reads the raw profiles of rustc's
#             LLVM; default: rustup's llvm-tools when installed (`rustup component add
#             llvm-tools`, rustc's own LLVM), else the newest /usr/lib/llvm-*/bin/llvm-profdata)
#             TRAIN_SECONDS=4 TRAIN_BASE=9660 H3=1 PGO_DIR=target/pgo
#             CARGO_PROFILE_RELEASE_LTO=thin (quicker builds; not the shipped settings)
# Needs: cargo, nginx, wrk, h2load (nghttp2-client), openssl, curl, ss, and llvm-profdata
#        (rustup's llvm-tools, or Debian: apt-get install llvm-19; rustc 1.95's LLVM 22 writes
#        raw profiles that llvm-profdata 19 reads). Two release builds: about twice `cargo
#        build --release`. The Containerfile's image is this build (its build stage runs it).
set -Eeuo pipefail
LOG_TAG=pgo
source "$(dirname "$0")/common.sh"

TRAIN_SECONDS=${TRAIN_SECONDS:-4} TRAIN_BASE=${TRAIN_BASE:-9660} H3=${H3:-1}
PGO_DIR=${PGO_DIR:-$ROOT_DIR/target/pgo}
OUT=${1:-$PGO_DIR/capataz}
RUN_DIR=$PGO_DIR/run
BACKEND1=$((TRAIN_BASE + 1)) BACKEND2=$((TRAIN_BASE + 2))
BACKEND3=$((TRAIN_BASE + 3)) BACKEND4=$((TRAIN_BASE + 4)) # nginx's h2c, for the HTTP/2 pool
PLAIN=$((TRAIN_BASE + 10)) H2C=$((TRAIN_BASE + 11)) RULES=$((TRAIN_BASE + 12))
TLS=$((TRAIN_BASE + 13)) TCP=$((TRAIN_BASE + 14)) H2UP=$((TRAIN_BASE + 15))
ADMIN=$((TRAIN_BASE + 19))

find_profdata() {
    if [[ -n ${PROFDATA:-} ]]; then echo "$PROFDATA"; return; fi
    local sysroot found
    sysroot=$(rustc --print sysroot)
    found=$(ls "$sysroot"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -1 || true)
    if [[ -z $found ]]; then
        found=$(ls -d /usr/lib/llvm-*/bin/llvm-profdata 2>/dev/null | sort -V | tail -1 || true)
    fi
    [[ -n $found ]] || found=$(command -v llvm-profdata || true)
    [[ -n $found ]] || die "no llvm-profdata: apt-get install llvm-19, or set PROFDATA"
    echo "$found"
}

need_tools nginx wrk curl ss
for tool in h2load openssl cargo rustc; do
    command -v "$tool" >/dev/null || die "missing command: $tool"
done
PROFDATA=$(find_profdata)
for p in "$BACKEND1" "$BACKEND2" "$BACKEND3" "$BACKEND4" "$PLAIN" "$H2C" "$RULES" "$TLS" "$TCP" \
    "$H2UP" "$ADMIN"; do
    if port_busy "$p"; then die "127.0.0.1:$p already in use (set TRAIN_BASE=...)"; fi
done
rm -rf "$RUN_DIR" "$PGO_DIR/raw" "$PGO_DIR/raw-other"
mkdir -p "$RUN_DIR/nginx-backend"/{logs,tmp,www} "$PGO_DIR/raw" "$PGO_DIR/raw-other"

log "instrumented build (target dir $PGO_DIR/generate)"
(cd "$ROOT_DIR" && CARGO_TARGET_DIR=$PGO_DIR/generate \
    RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$PGO_DIR/raw" \
    cargo build --release --locked --quiet -p capataz --bin capataz)
TRAINEE=$PGO_DIR/generate/release/capataz
if [[ $H3 == 1 ]]; then
    # The load generator, built apart (uninstrumented): its profile is not capataz's.
    (cd "$ROOT_DIR" && CARGO_TARGET_DIR=$PGO_DIR/h3load cargo build --release --locked --quiet \
        -p capataz-h3load --bin h3load)
fi

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$RUN_DIR/key.pem" -out "$RUN_DIR/cert.pem" 2>/dev/null
head -c 16383 /dev/zero | tr '\0' a >"$RUN_DIR/nginx-backend/www/big"

cat >"$RUN_DIR/nginx-backend/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid nginx.pid;
error_log logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_timeout 65s;
    keepalive_requests 1000000;
    default_type text/plain;
    client_body_temp_path tmp/client_body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    server {
        listen 127.0.0.1:$BACKEND1;
        listen 127.0.0.1:$BACKEND2;
        location = /healthz { return 200 "ok\n"; }
        location = /big { root $RUN_DIR/nginx-backend/www; }
        location / { return 200 "ok\n"; }
    }
    server {
        listen 127.0.0.1:$BACKEND3 http2;
        listen 127.0.0.1:$BACKEND4 http2;
        http2_max_requests 1000000;
        location = /big { root $RUN_DIR/nginx-backend/www; }
        location / { return 200 "ok\n"; }
    }
}
NGINX

# Every kind of listener in one process, each on its own port; the pool and its checks as in
# bench/capataz.toml (active HTTP checks, passive accounting on).
pool() { # pool NAME [PROTOCOL PORT PORT]: round robin over two backends (default the HTTP/1.1 pair)
    local protocol="" a=${3:-$BACKEND1} b=${4:-$BACKEND2}
    if [[ -n ${2:-} ]]; then protocol=$'\nprotocol = "'"$2"'"'; fi
    cat <<POOL
[pools.$1]
algorithm = "round_robin"$protocol
backends = [
    { name = "b1", address = "127.0.0.1:$a" },
    { name = "b2", address = "127.0.0.1:$b" },
]

[pools.$1.active]
kind = "http"
path = "/healthz"
interval = "1s"
timeout = "1s"
rise = 2
fall = 3

POOL
}
{
    cat <<CONFIG
[log]
level = "warn"

[admin]
address = "127.0.0.1:$ADMIN"

[[listeners]]
name = "plain"
address = "127.0.0.1:$PLAIN"
forwarded_headers = false

[[listeners.routes]]
name = "all"
pool = "bench"

[[listeners]]
name = "h2c"
address = "127.0.0.1:$H2C"
h2c = true

[[listeners.routes]]
name = "all"
pool = "bench"

[[listeners]]
name = "rules"
address = "127.0.0.1:$RULES"

[listeners.access_log]
path = "$RUN_DIR/access.log"

[[listeners.routes]]
name = "api"
path_prefix = "/api/"
strip_prefix = true
pool = "rules"
request_headers = { remove = ["x-debug"], set = { "x-env" = "prod" } }
response_headers = { set = { "x-served" = "bench" } }

[[listeners]]
name = "tls"
address = "127.0.0.1:$TLS"

[listeners.tls]
certificates = [{ cert = "$RUN_DIR/cert.pem", key = "$RUN_DIR/key.pem" }]
alpn = ["h2", "http/1.1"]
CONFIG
    if [[ $H3 == 1 ]]; then printf '\n[listeners.tls.http3]\n'; fi
    cat <<CONFIG

[[listeners.routes]]
name = "all"
pool = "bench"

[[listeners]]
name = "tcp"
address = "127.0.0.1:$TCP"
mode = "tcp"
pool = "tcp"

[[listeners]]
name = "h2up"
address = "127.0.0.1:$H2UP"
h2c = true

[[listeners.routes]]
name = "all"
pool = "h2up"

CONFIG
    pool bench
    pool rules
    cat <<CONFIG
[pools.rules.passive.latency_outliers]
enabled = true
percentile = "p99"
window = "10s"

[pools.tcp]
protocol = "tcp"
backends = [{ name = "b1", address = "127.0.0.1:$BACKEND1" }]

[pools.tcp.active]
kind = "tcp"
interval = "1s"

CONFIG
    pool h2up h2c "$BACKEND3" "$BACKEND4"
} >"$RUN_DIR/capataz.toml"

start backend "" nginx -p "$RUN_DIR/nginx-backend/" -c "$RUN_DIR/nginx-backend/nginx.conf" \
    -e "$RUN_DIR/nginx-backend/logs/error.log"
wait_port "$BACKEND1" "$LAST_PID"
"$TRAINEE" check --config "$RUN_DIR/capataz.toml" >/dev/null ||
    die "the training configuration does not load: $("$TRAINEE" check --config "$RUN_DIR/capataz.toml" 2>&1 | tail -3)"
start capataz "" env CAPATAZ_WORKER_THREADS=1 LLVM_PROFILE_FILE="$PGO_DIR/raw/capataz-%p-%m.profraw" \
    "$TRAINEE" run --config "$RUN_DIR/capataz.toml"
CAPATAZ_PID=$LAST_PID
for p in "$PLAIN" "$H2C" "$RULES" "$TLS" "$TCP" "$H2UP"; do wait_port "$p" "$CAPATAZ_PID" 60; done
for port in "$PLAIN" "$H2UP"; do # the backends UP (rise 2 at 1 s)
    for _ in $(seq 100); do
        if [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/") == 200 ]]; then break; fi
        sleep 0.1
    done
done
sleep 2.5

d=${TRAIN_SECONDS}s n=$((TRAIN_SECONDS * 10000))
train() { # train WHAT cmd...: one part of the load; a part that fails stops the build
    log "training: $1"
    shift
    "$@" >"$RUN_DIR/last.out" 2>&1 || die "training step failed: $* ($(tail -3 "$RUN_DIR/last.out"))"
}
wrkok() { ! grep -q 'Non-2xx\|Socket errors' "$RUN_DIR/last.out" || die "wrk saw errors: $(grep -m2 'Non-2xx\|Socket errors' "$RUN_DIR/last.out")"; }
h2ok() { grep -q ' 0 failed, 0 errored' "$RUN_DIR/last.out" || die "h2load saw failures: $(grep -m1 'requests:' "$RUN_DIR/last.out")"; }
train "HTTP/1.1, 50 connections" wrk -t1 -c50 -d"$d" "http://127.0.0.1:$PLAIN/"
wrkok
train "HTTP/1.1, one connection" wrk -t1 -c1 -d2s "http://127.0.0.1:$PLAIN/"
wrkok
train "HTTP/1.1, 16 KB answers" wrk -t1 -c20 -d2s "http://127.0.0.1:$PLAIN/big"
wrkok
train "HTTP/1.1, request bodies" h2load --h1 -c10 -n 20000 -d "$RUN_DIR/nginx-backend/www/big" "http://127.0.0.1:$PLAIN/"
h2ok
train "rules, rewrite and access log" wrk -t1 -c50 -d"$d" -H 'X-Debug: 1' "http://127.0.0.1:$RULES/api/x"
wrkok
train "h2c, 10 x 10 streams" h2load -c10 -m10 -n "$n" "http://127.0.0.1:$H2C/"
h2ok
train "h2c, one stream" h2load -c1 -m1 -n 10000 "http://127.0.0.1:$H2C/"
h2ok
train "HTTPS keep-alive" wrk -t1 -c50 -d"$d" "https://127.0.0.1:$TLS/"
wrkok
train "HTTPS, a handshake per request" wrk -t1 -c20 -d"$d" -H 'Connection: close' "https://127.0.0.1:$TLS/"
wrkok
train "HTTP/2 over TLS, 50 x 10 streams" h2load -c50 -m10 -n "$n" "https://127.0.0.1:$TLS/"
h2ok
train "HTTP/2 over TLS, request bodies" h2load -c10 -m10 -n 10000 -d "$RUN_DIR/nginx-backend/www/big" "https://127.0.0.1:$TLS/"
h2ok
train "TCP mode" wrk -t1 -c50 -d"$d" "http://127.0.0.1:$TCP/"
wrkok
train "HTTP/2 backends, HTTP/1.1 clients" wrk -t1 -c50 -d2s "http://127.0.0.1:$H2UP/"
wrkok
train "HTTP/2 backends, h2c clients" h2load -c10 -m10 -n 10000 "http://127.0.0.1:$H2UP/"
h2ok
if [[ $H3 == 1 ]]; then
    train "HTTP/3" env LLVM_PROFILE_FILE="$PGO_DIR/raw-other/h3load-%p.profraw" \
        "$PGO_DIR/h3load/release/h3load" --cert "$RUN_DIR/cert.pem" -c 20 -m 5 -d "$TRAIN_SECONDS" \
        "https://127.0.0.1:$TLS/"
fi
stop_named "$CAPATAZ_PID"
shopt -s nullglob
raw=("$PGO_DIR"/raw/*.profraw)
((${#raw[@]})) || die "the instrumented capataz wrote no profile (did it exit cleanly?)"
"$PROFDATA" merge -o "$PGO_DIR/capataz.profdata" "${raw[@]}" ||
    die "$PROFDATA could not read rustc's raw profiles (rustc: $(rustc -vV | sed -n 's/^LLVM version: //p')); set PROFDATA to a newer llvm-profdata"

log "optimised build (target dir $PGO_DIR/use)"
(cd "$ROOT_DIR" && CARGO_TARGET_DIR=$PGO_DIR/use \
    RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$PGO_DIR/capataz.profdata -Cllvm-args=-pgo-warn-missing-function=false" \
    cargo build --release --locked --quiet -p capataz --bin capataz)
mkdir -p "$(dirname "$OUT")"
cp "$PGO_DIR/use/release/capataz" "$OUT"
# Which tree it was built from, when it is a git checkout (the container's build stage is not).
if rev=$(cd "$ROOT_DIR" && git rev-parse --short HEAD 2>/dev/null); then
    (cd "$ROOT_DIR" && git diff --quiet HEAD -- crates vendor) || rev+=", working tree differs from HEAD"
    log "built $OUT ($rev)"
else
    log "built $OUT"
fi
