#!/usr/bin/env bash
# The TCP mode tests (crates/capataz/tests/it/tcp_mode/) proxy to real Redis servers
# (`redis-server`, started by the tests on loopback ports, no persistence) and probe them with
# `PING` / `+PONG`; redis-tools brings `redis-cli` and `redis-benchmark` for the benchmark.
set -Eeuo pipefail
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
    .ci/apt-install redis-server redis-tools
fi
