#!/usr/bin/env bash
# bench/peers.sh - capataz against HAProxy and nginx in the shared loopback harness, same run.
#
# Builds capataz in release mode and runs ../shared/bench/peers.sh with capataz as the extra
# target on 127.0.0.1:9400 (bench/capataz.toml), one worker thread (HAProxy runs one thread).
# Arguments are passed to the harness; the default is the issue's measurement:
#   bench/peers.sh                       # = -d 10s -c "1 50" -r 3 -l split
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
cargo build --release --quiet --bin capataz
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(-d 10s -c "1 50" -r 3 -l split)
EXTRA_NAME=capataz EXTRA_URL=http://127.0.0.1:9400/ \
EXTRA_CMD="env CAPATAZ_WORKER_THREADS=1 $PWD/target/release/capataz run --config $PWD/bench/capataz.toml" \
    bash "$HARNESS" "${args[@]}"
