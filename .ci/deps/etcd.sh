#!/usr/bin/env bash
# The etcd source's integration tests (crates/capataz/tests/it/etcd_source.rs) start a real
# single-node etcd (Debian's etcd-server, 3.4) on loopback; `etcdctl` (etcd-client) is used to
# write keys and compact the store the way an operator would.
set -Eeuo pipefail
if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
    .ci/apt-install etcd-server etcd-client
fi
