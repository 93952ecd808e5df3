#!/usr/bin/env bash
# The gRPC tests (crates/capataz/tests/it/grpc*.rs, probe_kinds.rs) run a real gRPC server and
# client, Python's grpcio (crates/capataz/tests/support/grpc/*.py), under Debian's own Python,
# /usr/bin/python3 (the tests run that interpreter, whatever else is first on PATH; see
# tests/support/python.rs). Debian packages grpcio as python3-grpcio; nothing is installed
# with pip (Debian's Python refuses it: externally-managed-environment).
set -Eeuo pipefail
if ! /usr/bin/python3 -c 'import grpc' 2>/dev/null; then
    .ci/apt-install python3 python3-grpcio
fi
