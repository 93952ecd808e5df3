#!/usr/bin/env bash
# The dashboard test (crates/capataz/tests/dashboard.rs) drives headless Chromium through
# ChromeDriver, and fails without them.
set -Eeuo pipefail
if ! command -v chromedriver >/dev/null; then
    .ci/apt-install chromium chromium-driver
fi
