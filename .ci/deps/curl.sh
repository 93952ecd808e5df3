#!/usr/bin/env bash
# The TLS tests (crates/capataz/tests/it/tls/curl.rs) use curl, built with OpenSSL, as a
# third-party TLS client.
set -Eeuo pipefail
if ! command -v curl >/dev/null; then
    .ci/apt-install curl
fi
