#!/usr/bin/env bash
# bench/peers.sh - capataz against HAProxy and nginx in the shared loopback harness, same run.
#
# Builds capataz in release mode and runs ../shared/bench/peers.sh with capataz as the extra
# target on 127.0.0.1:9400 (bench/capataz.toml), one worker thread (HAProxy runs one thread).
# Arguments are passed to the harness; the default is the issue's measurement:
#   bench/peers.sh                       # = -d 5s -c "1 50" -r 11 -l split
#   bench/peers.sh -P https|https-new|h2 ...   # TLS modes: bench/capataz-https.toml / -h2.toml
#   CONFIG=bench/capataz-latency.toml bench/peers.sh ...   # another plaintext config
#   CAPATAZ_BIN=/tmp/capataz-REV bench/peers.sh ...          # a given binary, no build
# Eleven short rounds rather than three long ones: on a shared host a round lands in a quiet
# or a busy minute, and more pairs average that out. After the harness's table comes a paired
# view of capataz against HAProxy (median of per-round ratios, rounds won).
# Needs: apt-get install -y wrk nginx haproxy (the script installs them if apt-get is there).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
HARNESS=${HARNESS:-../shared/bench/peers.sh}
for cmd in wrk nginx haproxy; do
    if ! command -v "$cmd" >/dev/null; then
        apt-get update -qq && apt-get install -y -qq wrk nginx haproxy >/dev/null
        break
    fi
done
# CAPATAZ_BIN=PATH measures that binary instead of building this tree (a build of another
# commit, to compare two in turn against the same peers).
if [[ -n ${CAPATAZ_BIN:-} ]]; then
    bin=$(realpath "$CAPATAZ_BIN")
else
    cargo build --release --quiet --bin capataz
    bin=$PWD/target/release/capataz
fi
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(-d 5s -c "1 50" -r 11 -l split)
# The protocol mode (-P) picks capataz's config: plaintext, or TLS with the harness's certificate.
mode=http
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in -P) mode=${args[i+1]:-http} ;; -P*) mode=${args[i]#-P} ;; esac
done
case $mode in
    http) config=${CONFIG:-bench/capataz.toml} scheme=http ;;
    https) config=bench/capataz-https.toml scheme=https ;;
    # hey 0.1.4 (Debian's, the harness's client for https-new) sends the request's Host, port
    # included ("127.0.0.1:9400"), as its TLS server name. That is not a host name: rustls
    # refuses the ClientHello (illegal_parameter) where OpenSSL ignores the name. bench/hey-sni/hey
    # runs the same hey with `-host localhost` for every target of the run (see that script).
    https-new) config=bench/capataz-https.toml scheme=https
               export PATH="$PWD/bench/hey-sni:$PATH" ;;
    h2) config=bench/capataz-h2.toml scheme=https ;;
    *) echo "bench/peers.sh: unknown -P mode '$mode'" >&2; exit 2 ;;
esac
log=$(mktemp)
trap 'rm -f "$log"' EXIT
EXTRA_NAME=capataz EXTRA_URL=$scheme://127.0.0.1:9400/ \
EXTRA_CMD="env CAPATAZ_WORKER_THREADS=1 $bin run --config $PWD/$config" \
    bash "$HARNESS" "${args[@]}" 2>&1 | tee "$log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || exit "${PIPESTATUS[0]}"

# Paired view: capataz against each peer of the run, round by round (bench/paired.sh).
res=$(sed -n 's/.*raw: \(.*\)$/\1/p' "$log" | tail -1)
if [[ -n $res && -f $res/results.tsv ]]; then
    bash "$(dirname "$0")/paired.sh" "$res"
fi
