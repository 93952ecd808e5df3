#!/usr/bin/env bash
# The TCP mode tests against PostgreSQL (crates/capataz/tests/it/tcp_mode/postgres.rs) start their
# own servers: `initdb` into a temporary directory, then `postgres` on a loopback port, both from
# /usr/lib/postgresql/<version>/bin and run as the current user (as `nobody` through `setpriv`
# when that is root: PostgreSQL refuses to run as root); the client is `psql`. Installing does
# not start Debian's own cluster in containers (policy-rc.d); the tests never use it.
set -Eeuo pipefail
if ! command -v psql >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 \
    || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    .ci/apt-install postgresql postgresql-client
fi
