"""A small gRPC server for capataz's tests, on Python's grpcio (see .ci/deps/grpcio.sh).

Usage: server.py NAME [STATUS]

Serves `test.Echo/Call` (raw bytes in, raw bytes out, no generated code) and the standard
`grpc.health.v1.Health` service on 127.0.0.1, an ephemeral port, and prints the port on its
first line of output. Each call answers NAME + b":" + the request; with STATUS (a gRPC status
code name such as UNAVAILABLE), every call fails with it instead (a trailers-only answer), and
the health service says NOT_SERVING. It stops when its standard input closes, so it never
outlives the test that started it.

Each line on its standard input sets a serving status of the health service at run time:
`SERVING` or `NOT_SERVING` (the server as a whole), or `SERVING shop.Cart` (a named service);
a service never set answers NOT_FOUND. The server prints `ok` once the status is set.
"""

import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def main():
    name = sys.argv[1].encode()
    failing = grpc.StatusCode[sys.argv[2]] if len(sys.argv) > 2 else None

    def call(request, context):
        if failing is not None:
            context.abort(failing, "told to fail")
        return name + b":" + request

    handler = grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Call": grpc.unary_unary_rpc_method_handler(
                call,
                request_deserializer=None,
                response_serializer=None,
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    checker = health.HealthServicer()
    checker.set(
        "",
        health_pb2.HealthCheckResponse.NOT_SERVING
        if failing is not None
        else health_pb2.HealthCheckResponse.SERVING,
    )
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        status = health_pb2.HealthCheckResponse.ServingStatus.Value(words[0])
        checker.set(words[1] if len(words) > 1 else "", status)
        print("ok", flush=True)
    server.stop(0)


if __name__ == "__main__":
    main()
