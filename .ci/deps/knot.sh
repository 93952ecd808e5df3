#!/usr/bin/env bash
# The DNS source's integration tests (crates/capataz/tests/it/dns_source.rs and
# dns_srv_targets.rs) start a real authoritative server, Knot DNS (`knotd`, driven with
# `knotc`), on loopback; so do the ACME DNS-01 tests (crates/capataz/tests/it/acme/dns01.rs),
# which update its zone by RFC 2136 with a TSIG key.
set -Eeuo pipefail
if ! command -v knotd >/dev/null || ! command -v knotc >/dev/null; then
    .ci/apt-install knot
fi
