#!/usr/bin/env bash
# The DNS source's integration tests (crates/capataz/tests/it/dns_source.rs and
# dns_srv_targets.rs) start a real authoritative server, Knot DNS (`knotd`, driven with
# `knotc`), on loopback.
set -Eeuo pipefail
if ! command -v knotd >/dev/null || ! command -v knotc >/dev/null; then
    .ci/apt-install knot
fi
