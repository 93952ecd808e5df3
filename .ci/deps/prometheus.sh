#!/usr/bin/env bash
# The metrics tests (crates/capataz/tests/it/prometheus.rs) run `promtool check metrics` on both
# exposition formats and a real Prometheus server scraping capataz, and fail under CI without
# them.
set -Eeuo pipefail
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    .ci/apt-install prometheus
fi
