#!/usr/bin/env bash
# The TCP mode tests against MariaDB (crates/capataz/tests/it/tcp_mode/mariadb.rs) start their own
# servers: `mariadb-install-db` into a temporary directory, then `mariadbd` on a loopback port,
# run as the current user (as `nobody` when that is root); the client is `mariadb`. Installing
# does not start Debian's own server in containers (policy-rc.d); the tests never use it.
set -Eeuo pipefail
# mariadbd is in /usr/sbin, which a user's PATH may lack.
if [ ! -x /usr/sbin/mariadbd ] || ! command -v mariadb-install-db >/dev/null \
    || ! command -v mariadb >/dev/null; then
    .ci/apt-install mariadb-server mariadb-client
fi
