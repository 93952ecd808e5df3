#!/usr/bin/env bash
# The manual page's test (crates/capataz/tests/it/manual.rs) renders `capataz man` with groff,
# as man(1) would, and fails on any of its warnings.
set -Eeuo pipefail
if ! command -v groff >/dev/null; then
    .ci/apt-install groff-base
fi
