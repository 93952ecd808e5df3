#!/usr/bin/env bash
# The packaging test (crates/capataz/tests/it/packaging.rs) checks contrib/systemd/capataz.service
# with `systemd-analyze verify`, and fails under CI without it. (No systemd needs to run.)
set -Eeuo pipefail
if ! command -v systemd-analyze >/dev/null; then
    .ci/apt-install systemd
fi
