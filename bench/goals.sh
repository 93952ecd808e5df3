#!/usr/bin/env bash
# bench/goals.sh [CAPATAZ_BIN] - issue 25's side-by-side measurements of one capataz binary, in
# one go, each part in the shared harness (../shared/bench/peers.sh) as BENCHMARKS.md's goal
# table reads them, 5 rounds of 5 s:
#   1. plaintext HTTP/1.1, one thread each, split layout, 50 connections, peers first
#      (`bench/peers.sh -l split -d 5s -r 5 -c 50 -T "haproxy nginx pingora extra"`);
#   2. the same, capataz first (`-T "extra nginx haproxy"`): a target's place in the round is
#      a bias a single order cannot show;
#   3. HTTP/2 over TLS (`-P h2`, 50 connections x 10 streams), HAProxy first, then
#   4. capataz first;
#   5. two worker threads each, nothing pinned by the harness (`-l none -n 2 -c "50 100"`),
#      HAProxy nbthread 2, nginx 2 workers, Pingora 2 threads, capataz 2 workers;
#   6. plaintext in the harness's default layout (`-l shared`: wrk alone on CPU 1, the proxy
#      and the backends share CPU 0, so the server side's CPU sets the pace), peers first, and
#   7. the same, capataz first. In the split layout of parts 1-2 wrk and the backends share a
#      core that is 96-98 % busy behind capataz and nginx alike, and that core sets both
#      proxies' requests per second (BENCHMARKS.md, "Plaintext where the proxy sets the pace").
# Each part prints the harness's table and bench/paired.sh's ratios (capataz against each
# peer, median of per-round ratios, rounds won). Pingora joins parts 1 and 5 when PINGORA_BIN
# names its binary (`PINGORA_BIN=$(../shared/bench/pingora-lb/build.sh)`). Without an argument
# capataz is built from this tree (release). Each part takes /tmp/capataz-bench.lock; with
# SESSION_NICE=-20 the whole run is a session of its own at that autogroup nice (common.sh).
# PARTS="1 3" runs some parts only. About 13 minutes with Pingora.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
in_own_session "$@"
if [[ -n ${1:-} ]]; then
    bin=$(realpath "$1")
else
    cargo build --release --quiet --bin capataz
    bin=$PWD/target/release/capataz
fi
harness=${HARNESS:-../shared/bench/peers.sh}
parts=${PARTS:-1 2 3 4 5 6 7}
pingora=
[[ -n ${PINGORA_BIN:-} ]] && pingora=pingora
export CAPATAZ_BIN=$bin HARNESS=$harness

part() { # part N TITLE -- command...
    local n=$1 title=$2
    shift 3
    [[ " $parts " == *" $n "* ]] || return 0
    local lock
    exec {lock}>/tmp/capataz-bench.lock
    flock "$lock"
    echo "=== part $n: $title ($(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))"
    "$@"
    flock -u "$lock"
    exec {lock}>&-
}

part 1 "plaintext, peers first" -- \
    bench/peers.sh -l split -d 5s -r 5 -c 50 -T "haproxy nginx $pingora extra"
part 2 "plaintext, capataz first" -- \
    bench/peers.sh -l split -d 5s -r 5 -c 50 -T "extra nginx haproxy"
part 3 "HTTP/2 over TLS, HAProxy first" -- \
    bench/peers.sh -P h2 -l split -d 5s -r 5 -c 50 -T "haproxy extra"
part 4 "HTTP/2 over TLS, capataz first" -- \
    bench/peers.sh -P h2 -l split -d 5s -r 5 -c 50 -T "extra haproxy"
# Two threads: the harness's own command with capataz as its extra target (bench/peers.sh
# would give capataz one worker).
two_threads() {
    local log res
    log=$(mktemp)
    EXTRA_NAME=capataz EXTRA_URL=http://127.0.0.1:9400/ \
    EXTRA_CMD="env CAPATAZ_WORKER_THREADS=\$PROXY_THREADS $bin run --config $PWD/bench/capataz.toml" \
        bash "$harness" -l none -n 2 -c "50 100" -r 5 -d 5s -T "haproxy nginx $pingora extra" 2>&1 | tee "$log"
    res=$(sed -n 's/.*raw: \(.*\)$/\1/p' "$log" | tail -1)
    rm -f "$log"
    [[ -n $res ]] && bench/paired.sh "$res"
}
part 5 "two threads" -- two_threads
part 6 "plaintext, shared layout, peers first" -- \
    bench/peers.sh -l shared -d 5s -r 5 -c 50 -T "haproxy nginx $pingora extra"
part 7 "plaintext, shared layout, capataz first" -- \
    bench/peers.sh -l shared -d 5s -r 5 -c 50 -T "extra nginx haproxy $pingora"
