#!/usr/bin/env bash
# bench/fleet.sh - capataz following a fleet from etcd (issue 12 §4), three measurements:
#
#   follow   one capataz following 5,000 backends (FOLLOW_BACKENDS) from an etcd prefix, probes
#            on (http GET /healthz, interval 1s, timeout 1s, rise 2, fall 3): the initial load
#            (capataz start -> every backend in the pool -> every backend UP), the steady state
#            (MEASURE s), churn (CHURN_RATES: for each, that many puts and deletes a second,
#            half each, for CHURN s, new backends taken from 1,000 spare addresses; then how
#            long until a key written after the last one is in the pool), and the same 5,000 backends as a
#            static list for comparison. Per phase: capataz's CPU (utime+stime from /proc, as a
#            share of one core), VmRSS (end and peak), probes/s that reached the backends.
#   death    N = 1 and 3 capataz (DEATH_NS) following 10 backends from etcd, probes as above:
#            a backend SIGKILLed (DEATH_ROUNDS times, a different one each time, restarted
#            and UP again on every instance between rounds); the time from the kill to each
#            instance's transition to DOWN (its JSON log line, microseconds): the first, and
#            the last (= every instance excludes it). No client traffic: probes alone decide.
#   probes   N = 1, 3, 5 capataz (PROBE_NS) following 1,000 backends (PROBE_BACKENDS): probes
#            per backend per second, counted by the backends, over MEASURE s.
#   burst    (not in `all`) BURST puts written at once into a pool of FOLLOW_BACKENDS: the time
#            until the last one is in the pool, and in how many membership updates; then
#            SINGLES puts one at a time, each once the last is applied (the cost of one update:
#            from the put to capataz's `membership updated` log line; median, min, max), and
#            capataz's RSS before the burst, after it and after the single puts;
#            with probes on, then with `active.kind = "none"`.
#
# Backends: bench/probe_listener.c (compiled here), one process binding one socket per address
# 127.0.1.1, 127.0.1.2, ... port 9620 (each address explicitly), answering 200 and counting
# probes per address; in `death`, one probe_listener per backend on 127.0.1.1:9730+j, so one
# can be killed. etcd: Debian's etcd-server (3.4), one node, data in RUN_DIR, client port 9701.
# capataz instances: listener 9710+i, admin 9720+i, one worker thread each.
#
# Shared probing (issue 12 §2): EXTRA_CONFIG=FILE appends FILE to every instance's config (a
# [fleet] table, see BENCHMARKS.md "Fleets"), and LABEL names the column in the summary.
#
# Usage: bench/fleet.sh [follow|death|probes|burst|all]   (default all)
#   env: FOLLOW_BACKENDS=5000 CHURN_RATES="10 100" CHURN=30 CATCH_UP=120 MEASURE=30 DEATH_NS="1 3" DEATH_ROUNDS=5
#        PROBE_NS="1 3 5" PROBE_BACKENDS=1000 BURST=20 SINGLES=20 PROXY_CPU=0 OTHER_CPU=1 EXTRA_CONFIG= LABEL=shared-off
#        RUN_DIR=/tmp/bench-fleet CAPATAZ_BIN=...
# Runtime: follow ~3 min, death ~1 min per N, probes ~45 s per N.
set -Eeuo pipefail
LOG_TAG=fleet
source "$(dirname "$0")/common.sh"

WHAT=${1:-all}
FOLLOW_BACKENDS=${FOLLOW_BACKENDS:-5000} CHURN_RATES=${CHURN_RATES:-"10 100"} CHURN=${CHURN:-30} CATCH_UP=${CATCH_UP:-120}
MEASURE=${MEASURE:-30} DEATH_NS=${DEATH_NS:-"1 3"} DEATH_ROUNDS=${DEATH_ROUNDS:-5}
PROBE_NS=${PROBE_NS:-"1 3 5"} PROBE_BACKENDS=${PROBE_BACKENDS:-1000} BURST=${BURST:-20} SINGLES=${SINGLES:-20}
PROXY_CPU=${PROXY_CPU-0} OTHER_CPU=${OTHER_CPU-1}
EXTRA_CONFIG=${EXTRA_CONFIG:-} LABEL=${LABEL:-shared-off}
RUN_DIR=${RUN_DIR:-/tmp/bench-fleet}
SPARE=1000 PORT=9620 ETCD=http://127.0.0.1:9701
mkdir -p "$RUN_DIR"
STAMP=$(date +%Y%m%dT%H%M%S)
RES=$RUN_DIR/results/$STAMP
mkdir -p "$RES"
HELPER="python3 $BENCH_DIR/fleet_etcd.py"

need_tools python3 gcc taskset curl ss etcd
for p in $PORT 9701 9702 $(seq 9710 9714) $(seq 9720 9724) $(seq 9730 9739); do
    if port_busy "$p"; then die "port $p already in use (not started by us)"; fi
done
build_capataz
gcc -O2 -Wall -o "$RUN_DIR/probe_listener" "$BENCH_DIR/probe_listener.c"
log "host: $(machine_line), $(etcd --version | head -1)"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ------------------------------------------------------------------ pieces --
start_etcd() {
    rm -rf "$RUN_DIR/etcd"
    start etcd "$OTHER_CPU" etcd --name=n1 --data-dir="$RUN_DIR/etcd" \
        --listen-client-urls=$ETCD --advertise-client-urls=$ETCD \
        --listen-peer-urls=http://127.0.0.1:9702 --initial-advertise-peer-urls=http://127.0.0.1:9702 \
        --initial-cluster=n1=http://127.0.0.1:9702 --log-level=warn --logger=zap
    ETCD_PID=$LAST_PID
    wait_port 9701 "$ETCD_PID" 30
    until curl -sf --max-time 1 $ETCD/health | grep -q true; do alive "$ETCD_PID" || die "etcd died"; sleep 0.1; done
}

start_listener() { # start_listener NAME COUNT PORT
    rm -f "$RUN_DIR/$1".count.*
    DUMPS=0
    start "$1" "$OTHER_CPU" "$RUN_DIR/probe_listener" "$2" "$3" "$RUN_DIR/$1.count"
    LISTENER=$LAST_PID
    for _ in $(seq 100); do grep -q ready "$RUN_DIR/$1.log" 2>/dev/null && break; alive "$LISTENER" || die "$1 failed"; sleep 0.05; done
    grep -q ready "$RUN_DIR/$1.log" || die "$1 not ready"
}

DUMPS=0
dump() { # dump: the listener $LISTENER writes its counts since the previous dump; sets DUMP_PATH
    local path=$RUN_DIR/listener.count.$DUMPS
    kill -USR1 "$LISTENER"
    for _ in $(seq 100); do [[ -s $path ]] && break; sleep 0.02; done
    sleep 0.05
    [[ -s $path ]] || die "listener did not write $path"
    DUMPS=$(( DUMPS + 1 ))
    DUMP_PATH=$path
}

dump_rate() { # dump_rate FILE BACKENDS: "probes/s per backend: mean min max" over the dump
    awk -v n="$2" 'NR==1 { secs = ($2 - $1) / 1e9; total = $4 }
        NR==3 { min = -1; for (i = 1; i <= n; i++) { v = $i; if (min < 0 || v < min) min = v; if (v > max) max = v } }
        END { printf "%.3f %.3f %.3f %.1f\n", total / n / secs, min / secs, max / secs, total / secs }' "$1"
}

capataz_conf() { # capataz_conf FILE INDEX PREFIX [static COUNT]
    local file=$1 i=$2 prefix=$3
    {
        printf '[log]\nformat = "json"\nlevel = "info"\n\n[admin]\naddress = "127.0.0.1:%d"\n\n' $(( 9720 + i ))
        printf '[[listeners]]\nname = "front"\naddress = "127.0.0.1:%d"\n\n' $(( 9710 + i ))
        if [[ ${4:-} == static ]]; then
            printf '[pools.web]\nbackends = [\n'
            for ((j = 0; j < $5; j++)); do
                printf '    { name = "s%05d", address = "127.0.%d.%d:%d" },\n' "$j" $(( 1 + j / 250 )) $(( 1 + j % 250 )) $PORT
            done
            printf ']\n\n'
        else
            printf '[pools.web.source]\nkind = "etcd"\nendpoints = ["%s"]\nprefix = "%s"\n\n' "$ETCD" "$prefix"
        fi
        if [[ ${ACTIVE_KIND:-http} == none ]]; then
            printf '[pools.web.active]\nkind = "none"\n'
        else
            printf '[pools.web.active]\nkind = "http"\npath = "/healthz"\ninterval = "1s"\ntimeout = "1s"\nrise = 2\nfall = 3\n'
        fi
        if [[ -n $EXTRA_CONFIG ]]; then printf '\n'; cat "$EXTRA_CONFIG"; fi
    } >"$file"
    local out; out=$("$CAPATAZ_BIN" check "$file" 2>&1 || true)
    grep -q ': valid' <<<"$out" || die "capataz check $file: $out"
}

start_capataz() { # start_capataz INDEX CONFIG CPU [TAG]; sets LAST_PID
    start "capataz${4:-}$1" "$3" env CAPATAZ_WORKER_THREADS=1 "$CAPATAZ_BIN" run --config "$2"
    wait_port $(( 9720 + $1 )) "$LAST_PID" 30
}

cpu_pct() { calc "100 * ($2 - $1) / $CLK_TCK / $3"; }   # cpu_pct TICKS0 TICKS1 SECONDS

# ----------------------------------------------------------------- follow --
follow() {
    local n=$FOLLOW_BACKENDS out=$RES/follow.txt
    log "follow: $n backends from etcd, $SPARE spare addresses"
    rm -f "$RUN_DIR/churn.state"
    start_listener listener $(( n + SPARE )) $PORT
    start_etcd
    local fill; fill=$($HELPER fill $ETCD /fleet/ 0 "$n" $PORT)
    log "etcd filled with $n keys in ${fill}s"
    capataz_conf "$RUN_DIR/follow.toml" 0 /fleet/
    local t0 t_members t_up pid k0 k1 t1 t2 w0 w1
    t0=$(date +%s.%N)
    start_capataz 0 "$RUN_DIR/follow.toml" "$PROXY_CPU"; pid=$LAST_PID
    $HELPER wait 127.0.0.1:9720 web "s$(printf %05d $(( n - 1 )))" 60 >/dev/null
    t_members=$(calc "$(date +%s.%N) - $t0")
    $HELPER wait_pool 127.0.0.1:9720 web "$n" "$n" 120 >/dev/null
    t_up=$(calc "$(date +%s.%N) - $t0")
    local rss_load; rss_load=$(mem_kb "$pid" VmHWM)
    log "follow: membership of $n after ${t_members}s, all UP after ${t_up}s, peak RSS ${rss_load} kB"
    sleep 5
    # steady state
    dump; k0=$(proc_ticks "$pid"); w0=$(date +%s.%N)
    sleep "$MEASURE"
    k1=$(proc_ticks "$pid"); w1=$(date +%s.%N); dump
    local steady_cpu steady_rss steady_rate etcd_k0 etcd_k1
    steady_cpu=$(cpu_pct "$k0" "$k1" "$(calc "$w1 - $w0")")
    steady_rss=$(mem_kb "$pid" VmRSS)
    steady_rate=$(dump_rate "$DUMP_PATH" "$n")
    log "follow steady: cpu ${steady_cpu}% rss ${steady_rss} kB probes/s per backend (mean min max, total) $steady_rate"
    # churn at each rate of CHURN_RATES in turn (each from where the last left the keys)
    local -a churn_lines=()
    local round=0 rate
    for rate in $CHURN_RATES; do
        round=$(( round + 1 ))
        local peak=0 r ops etcd_keys t_catch updates0 updates1 churn_cpu etcd_cpu churn_rate sentinel
        updates0=$(grep -c 'membership updated:' "$RUN_DIR/capataz0.log" || true)
        dump; k0=$(proc_ticks "$pid"); etcd_k0=$(proc_ticks "$ETCD_PID"); w0=$(date +%s.%N)
        $HELPER churn $ETCD /fleet/ "$n" $SPARE $PORT "$rate" "$CHURN" "$RUN_DIR/churn.state" >"$RUN_DIR/churn.out" &
        local churner=$!
        while kill -0 "$churner" 2>/dev/null; do
            r=$(mem_kb "$pid" VmRSS); (( r > peak )) && peak=$r
            sleep 1
        done
        wait "$churner" || die "churn failed"
        k1=$(proc_ticks "$pid"); etcd_k1=$(proc_ticks "$ETCD_PID"); w1=$(date +%s.%N); dump
        read -r ops _ etcd_keys <"$RUN_DIR/churn.out"
        churn_cpu=$(cpu_pct "$k0" "$k1" "$(calc "$w1 - $w0")")
        etcd_cpu=$(cpu_pct "$etcd_k0" "$etcd_k1" "$(calc "$w1 - $w0")")
        # probes/s per pool member while churning (the addresses change, so: total / members)
        churn_rate=$(awk -v n="$n" 'NR==1 { printf "%.3f", $4 / ((($2 - $1) / 1e9) * n) }' "$DUMP_PATH")
        # Caught up: a key written right after the last operation is in the pool (the watch
        # reports changes in order). Index n + SPARE + round: past every churned address.
        sentinel=$(( n + SPARE + round ))
        $HELPER fill $ETCD /fleet/ "$sentinel" 1 $PORT >/dev/null
        t_catch=$($HELPER wait 127.0.0.1:9720 web "s$(printf %05d "$sentinel")" "$CATCH_UP" 2>/dev/null) \
            || t_catch="over $CATCH_UP"
        updates1=$(grep -c 'membership updated:' "$RUN_DIR/capataz0.log" || true)
        sleep 10
        local after_rss series; after_rss=$(mem_kb "$pid" VmRSS)
        # Backends with a series in /metrics (capataz_probes_total), against those in the pool.
        series=$(curl -s --max-time 60 http://127.0.0.1:9720/metrics \
            | grep '^capataz_probes_total{' | sed 's/.*backend="\([^"]*\)".*/\1/' | sort -u | wc -l)
        churn_lines+=("etcd source churn $round: $ops ops in ${CHURN}s at $rate/s: capataz cpu ${churn_cpu}% (etcd ${etcd_cpu}%), probes/s per member $churn_rate, $(( updates1 - updates0 )) membership updates applied, caught up ${t_catch}s after the last op (a key written then is in the pool), peak RSS $(( peak / 1024 )) MiB, RSS 10 s after $(( after_rss / 1024 )) MiB; /metrics has probe series for $series backends")
        log "${churn_lines[-1]}"
    done
    stop_named "$pid"
    # the same backends as a static list
    capataz_conf "$RUN_DIR/static.toml" 0 /fleet/ static "$n"
    t0=$(date +%s.%N)
    start_capataz 0 "$RUN_DIR/static.toml" "$PROXY_CPU" static; pid=$LAST_PID
    $HELPER wait_pool 127.0.0.1:9720 web "$n" "$n" 120 >/dev/null
    local s_up; s_up=$(calc "$(date +%s.%N) - $t0")
    sleep 5
    dump; k0=$(proc_ticks "$pid"); w0=$(date +%s.%N)
    sleep "$MEASURE"
    k1=$(proc_ticks "$pid"); w1=$(date +%s.%N); dump
    local s_cpu s_rss s_rate
    s_cpu=$(cpu_pct "$k0" "$k1" "$(calc "$w1 - $w0")")
    s_rss=$(mem_kb "$pid" VmRSS)
    s_rate=$(dump_rate "$DUMP_PATH" "$n")
    stop_named "$pid"
    stop_named "$ETCD_PID"; stop_named "$LISTENER"
    {
        echo "# fleet.sh follow $STAMP ($LABEL): $(machine_line); $n backends, probes 1s; capataz cpu ${PROXY_CPU:-any}"
        echo "etcd fill: ${fill}s for $n puts"
        echo "etcd source: membership loaded ${t_members}s, all UP ${t_up}s, peak RSS during load $(( rss_load / 1024 )) MiB"
        echo "etcd source steady: cpu ${steady_cpu}%, RSS $(( steady_rss / 1024 )) MiB, probes/s per backend (mean min max total) $steady_rate"
        printf '%s\n' "${churn_lines[@]}"
        echo "static list: all UP ${s_up}s, steady cpu ${s_cpu}%, RSS $(( s_rss / 1024 )) MiB, probes/s per backend $s_rate"
    } | tee "$out"
}

# ------------------------------------------------------------------ death --
death() {
    local n ports=10 out=$RES/death.txt
    : >"$out"
    for n in $DEATH_NS; do
        log "death: $n instance(s), $ports backends, $DEATH_ROUNDS rounds"
        start_etcd
        local -a bpids=() admins=() cpids=()
        local j i
        for ((j = 0; j < ports; j++)); do
            start "b$j" "$OTHER_CPU" "$RUN_DIR/probe_listener" 1 $(( 9730 + j )) "$RUN_DIR/b$j.count"
            bpids[j]=$LAST_PID
            curl -s --max-time 1 -X POST $ETCD/v3/kv/put -d "{\"key\":\"$(printf '/death/b%d' $j | base64 -w0)\",\"value\":\"$(printf '{"address":"127.0.1.1:%d"}' $(( 9730 + j )) | base64 -w0)\"}" >/dev/null
        done
        for ((i = 0; i < n; i++)); do
            capataz_conf "$RUN_DIR/death$i.toml" "$i" /death/
            start_capataz "$i" "$RUN_DIR/death$i.toml" ""
            cpids[i]=$LAST_PID; admins[i]=127.0.0.1:$(( 9720 + i ))
        done
        for a in "${admins[@]}"; do $HELPER wait_pool "$a" web $ports $ports 60 >/dev/null; done
        local r victim kill_at list; list=$(IFS=,; echo "${admins[*]}")
        for ((r = 0; r < DEATH_ROUNDS; r++)); do
            victim=$(( (r * 3) % ports ))
            kill_at=$(date +%s.%N)
            kill -KILL "${bpids[victim]}"
            wait "${bpids[victim]}" 2>/dev/null || true
            forget_pid "${bpids[victim]}"
            $HELPER excluded "$list" web "b$victim" 60 >/dev/null
            local delays=()
            for ((i = 0; i < n; i++)); do
                delays+=("$(python3 - "$RUN_DIR/capataz$i.log" "b$victim" "$kill_at" <<'EOF'
import datetime, json, sys
path, backend, kill = sys.argv[1], sys.argv[2], float(sys.argv[3])
best = None
for line in open(path, errors="replace"):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j.get("event") == "transition" and j.get("backend") == backend and j.get("to") == "DOWN":
        t = datetime.datetime.fromisoformat(j["timestamp"].replace("Z", "+00:00")).timestamp()
        if t >= kill and best is None:
            best = t - kill
print(f"{best:.3f}" if best is not None else "nan")
EOF
)")
            done
            echo "n=$n round=$r backend=b$victim delays=${delays[*]}" | tee -a "$out"
            start "b$victim" "$OTHER_CPU" "$RUN_DIR/probe_listener" 1 $(( 9730 + victim )) "$RUN_DIR/b$victim.count"
            bpids[victim]=$LAST_PID
            $HELPER serving "$list" web "b$victim" 60 >/dev/null
        done
        for ((i = 0; i < n; i++)); do stop_named "${cpids[i]}"; done
        for ((j = 0; j < ports; j++)); do stop_named "${bpids[j]}"; done
        stop_named "$ETCD_PID"
    done
    python3 - "$out" "$LABEL" <<'EOF' | tee -a "$out"
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("n="):
        continue
    f = dict(kv.split("=", 1) for kv in line.split(" ", 3)[:3])
    delays = [float(x) for x in line.split("delays=")[1].split()]
    rows.setdefault(int(f["n"]), []).append((min(delays), max(delays)))
print(f"# death -> every instance excludes it ({sys.argv[2]}): medians over rounds")
for n, r in sorted(rows.items()):
    firsts, lasts = [a for a, _ in r], [b for _, b in r]
    print(f"N={n}: first instance {statistics.median(firsts):.3f}s, last instance "
          f"{statistics.median(lasts):.3f}s (min {min(lasts):.3f}, max {max(lasts):.3f}), "
          f"spread {statistics.median([b - a for a, b in r]):.3f}s, {len(r)} rounds")
EOF
}

# ----------------------------------------------------------------- probes --
probes() {
    local n b=$PROBE_BACKENDS out=$RES/probes.txt
    : >"$out"
    start_listener listener "$b" $PORT
    start_etcd
    $HELPER fill $ETCD /probes/ 0 "$b" $PORT >/dev/null
    for n in $PROBE_NS; do
        local -a cpids=()
        local i
        for ((i = 0; i < n; i++)); do
            capataz_conf "$RUN_DIR/probes$i.toml" "$i" /probes/
            start_capataz "$i" "$RUN_DIR/probes$i.toml" ""
            cpids[i]=$LAST_PID
        done
        for ((i = 0; i < n; i++)); do $HELPER wait_pool 127.0.0.1:$(( 9720 + i )) web "$b" "$b" 120 >/dev/null; done
        sleep 3
        dump
        sleep "$MEASURE"
        dump
        local rate; rate=$(dump_rate "$DUMP_PATH" "$b")
        echo "N=$n $LABEL probes/s per backend (mean min max; total) $rate" | tee -a "$out"
        for ((i = 0; i < n; i++)); do stop_named "${cpids[i]}"; done
    done
    stop_named "$ETCD_PID"; stop_named "$LISTENER"
}

# ------------------------------------------------------------------ burst --
burst() { # BURST puts at once into a pool of FOLLOW_BACKENDS, probes on, then off
    local n=$FOLLOW_BACKENDS out=$RES/burst.txt kind
    : >"$out"
    for kind in http none; do
        start_listener listener $(( n + SPARE )) $PORT
        start_etcd
        $HELPER fill $ETCD /fleet/ 0 "$n" $PORT >/dev/null
        ACTIVE_KIND=$kind capataz_conf "$RUN_DIR/burst.toml" 0 /fleet/
        start_capataz 0 "$RUN_DIR/burst.toml" "$PROXY_CPU" "burst-$kind"
        local pid=$LAST_PID
        $HELPER wait 127.0.0.1:9720 web "s$(printf %05d $(( n - 1 )))" 60 >/dev/null
        [[ $kind == none ]] || $HELPER wait_pool 127.0.0.1:9720 web "$n" "$n" 300 >/dev/null
        sleep 5
        local before after took rss0 rss1 rss2
        rss0=$(mem_kb "$pid" VmRSS)
        before=$(grep -c 'membership updated:' "$RUN_DIR/capatazburst-${kind}0.log" || true)
        $HELPER fill $ETCD /fleet/ "$n" "$BURST" $PORT >/dev/null
        took=$($HELPER wait 127.0.0.1:9720 web "s$(printf %05d $(( n + BURST - 1 )))" 600)
        after=$(grep -c 'membership updated:' "$RUN_DIR/capatazburst-${kind}0.log" || true)
        rss1=$(mem_kb "$pid" VmRSS)
        echo "burst ($LABEL): $BURST puts into $n backends, active kind $kind: all in the pool after ${took}s, in $(( after - before )) membership updates" | tee -a "$out"
        # One put at a time (SINGLES of them), each once the last is applied: the cost of one
        # update of a pool this size (from the put to capataz's `membership updated` log
        # line), and RSS across them.
        local singles
        singles=$($HELPER updates $ETCD /fleet/ $(( n + BURST )) "$SINGLES" $PORT "$RUN_DIR/capatazburst-${kind}0.log" \
            | sort -g | awk '{ v[NR] = $1 } END { printf "median %.3fs (min %.3f, max %.3f)", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1], v[NR] }')
        rss2=$(mem_kb "$pid" VmRSS)
        echo "single puts ($LABEL), active kind $kind: $SINGLES puts one at a time into $(( n + BURST )) backends, from the put to its update: $singles; RSS before the burst $(( rss0 / 1024 )) MiB, after it $(( rss1 / 1024 )) MiB, after the single puts $(( rss2 / 1024 )) MiB" | tee -a "$out"
        stop_named "$pid"; stop_named "$ETCD_PID"; stop_named "$LISTENER"
    done
}

case $WHAT in
    follow) follow ;;
    death) death ;;
    probes) probes ;;
    burst) burst ;;
    all) follow; death; probes ;;
    *) die "usage: bench/fleet.sh [follow|death|probes|burst|all]" ;;
esac
log "results: $RES"
