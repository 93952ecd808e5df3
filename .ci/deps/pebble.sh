#!/usr/bin/env bash
# The ACME tests (crates/capataz/tests/it/acme/) start Let's Encrypt's test server, `pebble`, on
# loopback and order certificates from it; without it they fail under CI.
set -Eeuo pipefail
if [ ! -x /usr/bin/pebble ]; then
    .ci/apt-install pebble
fi
