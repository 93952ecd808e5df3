#!/usr/bin/env bash
# The gRPC tests (crates/capataz/tests/it/grpc/) run a real gRPC server, Python's grpcio with
# its health-checking service (crates/capataz/tests/support/grpc/server.py), behind capataz.
set -Eeuo pipefail
if ! python3 -c 'import grpc, grpc_health.v1' 2>/dev/null; then
    python3 -m pip install --quiet grpcio grpcio-health-checking
fi
