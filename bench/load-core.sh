#!/usr/bin/env bash
# bench/load-core.sh [CAPATAZ_BIN] - what each proxy leaves the load's core to do, in the shared
# harness's split layout: the proxy alone on CPU 0, wrk and the backends on CPU 1.
#
# Starts the harness's backend nginx (../shared/bench/backend-nginx.conf, 127.0.0.1:9101-9102,
# CPU 1), HAProxy (haproxy.cfg, :9200), nginx as a proxy (proxy-nginx.conf, :9300) and capataz
# (bench/capataz.toml, :9400, one worker), the three proxies on CPU 0; then, ROUNDS times (3),
# for each proxy in turn, `wrk -t1 -c50 -d5s` on CPU 1 under `perf stat -a -A`, and prints per
# request and per CPU: system calls (all, and epoll_wait, epoll_ctl, read, write, recvfrom,
# writev, sendto), context switches, packets sent on the loopback (net:net_dev_xmit) and
# softirqs. On the loopback a packet's receive path runs on the CPU that sent it, so CPU 1's
# figures are the work of wrk and the backends, and how a proxy batches and frames its writes
# is what it can change there. The heads each proxy sends are printed first.
# Needs perf with tracepoints (linux-perf), wrk, nginx, haproxy. About 2 minutes.
# Everything binds 127.0.0.1 and is stopped by PID (common.sh). The harness's ports must be free:
# run it under `flock /tmp/capataz-bench.lock`.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
LOG_TAG=load-core
. bench/common.sh
in_own_session "$@"
need_tools wrk nginx haproxy taskset curl ss
command -v perf >/dev/null || die "needs perf (apt-get install linux-perf)"
RUN_DIR=${RUN_DIR:-/tmp/capataz-load-core}
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"/{be,px}/{logs,tmp}
if [[ -n ${1:-} ]]; then CAPATAZ_BIN=$(realpath "$1"); fi
build_capataz
shared=${SHARED:-../shared/bench}
rounds=${ROUNDS:-3}
cp "$shared/backend-nginx.conf" "$RUN_DIR/be/nginx.conf"
cp "$shared/proxy-nginx.conf" "$RUN_DIR/px/nginx.conf"
cp "$shared/haproxy.cfg" "$RUN_DIR/haproxy.cfg"

for port in 9101 9102 9200 9201 9300 9400; do
    ! port_busy "$port" || die "127.0.0.1:$port is taken (another benchmark? take /tmp/capataz-bench.lock)"
done
start backend 1 nginx -p "$RUN_DIR/be/" -c "$RUN_DIR/be/nginx.conf" -e "$RUN_DIR/be/logs/error.log"
wait_port 9101 "$LAST_PID"
start haproxy 0 haproxy -db -f "$RUN_DIR/haproxy.cfg"
wait_port 9200 "$LAST_PID"
start nginx 0 nginx -p "$RUN_DIR/px/" -c "$RUN_DIR/px/nginx.conf" -e "$RUN_DIR/px/logs/error.log"
wait_port 9300 "$LAST_PID"
start capataz 0 env CAPATAZ_WORKER_THREADS=1 "$CAPATAZ_BIN" run --config bench/capataz.toml
wait_port 9400 "$LAST_PID"
targets=(haproxy:9200 nginx:9300 capataz:9400)
sleep 3 # every proxy's checks see both backends up
for t in "${targets[@]}"; do
    echo "== ${t%%:*}'s answer to the client:"
    curl -sf -D - -o /dev/null --max-time 2 "http://127.0.0.1:${t#*:}/" | tr -d '\r' | sed 's/^/   /' ||
        die "${t%%:*}: no answer on :${t#*:}"
done

events=context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait
events+=,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_read,syscalls:sys_enter_write
events+=,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_sendto
events+=,net:net_dev_xmit,irq:softirq_entry
for ((r = 1; r <= rounds; r++)); do
    for t in "${targets[@]}"; do
        name=${t%%:*}
        perf stat -a -A -x, -e "$events" -o "$RUN_DIR/$name.$r.perf" -- \
            taskset -c 1 wrk -t1 -c50 -d5s "http://127.0.0.1:${t#*:}/" >"$RUN_DIR/$name.$r.wrk" 2>&1
        awk -v name="$name" -v r="$r" '
            /^Requests\/sec/ { rate = $2 }
            / requests in / { n = $1 }
            END { printf "%s round %d: %s req/s, %d requests\n", name, r, rate, n }' "$RUN_DIR/$name.$r.wrk"
        n=$(awk '/ requests in /{print $1}' "$RUN_DIR/$name.$r.wrk")
        awk -F, -v n="$n" '/^CPU/ { v[$4] = v[$4] sprintf("  %s %7.3f", $1, $2 / n) }
            END { for (e in v) printf "   %-34s%s\n", e, v[e] }' "$RUN_DIR/$name.$r.perf" | sort
    done
done
echo "# per request; CPU0 = the proxy, CPU1 = wrk and the backends; raw: $RUN_DIR"
