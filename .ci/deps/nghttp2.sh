#!/usr/bin/env bash
# The HTTP/2 tests (crates/capataz/tests/it/h2/curl.rs) drive capataz with h2load, a
# third-party HTTP/2 client with many streams per connection (Debian's nghttp2-client).
set -Eeuo pipefail
if ! command -v h2load >/dev/null; then
    .ci/apt-install nghttp2-client
fi
