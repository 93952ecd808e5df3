#!/usr/bin/env python3
"""The gRPC backend of bench/probe-cost-tls.sh MODE=grpc: grpcio's standard health service.

Usage: grpc_health_server.py HOST:PORT

Serves `grpc.health.v1.Health` (the server as a whole SERVING) over h2c on HOST:PORT, for
nginx to pass the probes to (nginx terminates their TLS). Runs until terminated.
"""

import signal
import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    checker = health.HealthServicer()
    checker.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    server.add_insecure_port(sys.argv[1])
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
