#!/usr/bin/env bash
# The HTTP/2 backend tests (crates/capataz/tests/it/h2_backends.rs, nginx_*) proxy to a real
# nginx (Debian's `nginx`), started by the test itself as a child process on loopback with its
# own config, prefix, PID and log files in a temporary directory (tests/support/nginx.rs).
set -Eeuo pipefail
if ! command -v nginx >/dev/null; then
    .ci/apt-install nginx
fi
