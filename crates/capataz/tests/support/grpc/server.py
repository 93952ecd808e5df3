"""A small gRPC server for capataz's tests, on Python's grpcio (see .ci/deps/grpcio.sh).

Usage: server.py NAME [STATUS]

Serves `test.Echo/Call` (raw bytes in, raw bytes out, no generated code) and the standard
health check, `grpc.health.v1.Health/Check`, on 127.0.0.1, an ephemeral port, and prints the
port on its first line of output. Each call answers NAME + b":" + the request; with STATUS (a
gRPC status code name such as UNAVAILABLE), every call fails with it instead (a trailers-only
answer), and the health check says NOT_SERVING. It stops when its standard input closes, so it
never outlives the test that started it.

Each line on its standard input sets a serving status of the health service at run time:
`SERVING` or `NOT_SERVING` (the server as a whole), or `SERVING shop.Cart` (a named service);
a service never set answers NOT_FOUND. The server prints `ok` once the status is set.

The health check is written here, not taken from the grpcio-health-checking package (which
Debian does not package): it answers as that package's `HealthServicer.Check` does, with the
two messages of grpc/health/v1/health.proto encoded by hand (`HealthCheckRequest { string
service = 1; }`, `HealthCheckResponse { ServingStatus status = 1; }`). grpcio does the rest.
"""

import sys
import threading
from concurrent import futures

import grpc

# grpc.health.v1.HealthCheckResponse.ServingStatus
SERVING_STATUS = {"UNKNOWN": 0, "SERVING": 1, "NOT_SERVING": 2, "SERVICE_UNKNOWN": 3}


def read_varint(data, at):
    """The varint at `at` in `data` and the index after it; ValueError if it is cut short."""
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def service_of(request):
    """The `service` field of an encoded HealthCheckRequest ("" when absent; the last one wins,
    as protobuf reads a repeated scalar field); unknown fields are skipped."""
    service, at = b"", 0
    while at < len(request):
        key, at = read_varint(request, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, at = read_varint(request, at)
        elif wire == 1:
            at += 8
        elif wire == 2:
            length, at = read_varint(request, at)
            if at + length > len(request):
                raise ValueError("truncated field")
            if field == 1:
                service = request[at : at + length]
            at += length
        elif wire == 5:
            at += 4
        else:
            raise ValueError(f"wire type {wire}")
    if at > len(request):
        raise ValueError("truncated field")
    return service.decode("utf-8")


def encode_response(status):
    """An encoded HealthCheckResponse; proto3 leaves a zero status (UNKNOWN) out."""
    return b"\x08" + bytes([status]) if status else b""


class Health:
    """The serving statuses, by service name ("" is the server as a whole)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.statuses = {}

    def set(self, service, status):
        with self.lock:
            self.statuses[service] = status

    def check(self, request, context):
        try:
            service = service_of(request)
        except (ValueError, UnicodeDecodeError) as error:
            context.abort(grpc.StatusCode.INTERNAL, f"cannot parse the request: {error}")
        with self.lock:
            status = self.statuses.get(service)
        if status is None:
            context.set_code(grpc.StatusCode.NOT_FOUND)
            return b""
        return encode_response(status)


def main():
    name = sys.argv[1].encode()
    failing = grpc.StatusCode[sys.argv[2]] if len(sys.argv) > 2 else None

    def call(request, context):
        if failing is not None:
            context.abort(failing, "told to fail")
        return name + b":" + request

    echo = grpc.method_handlers_generic_handler(
        "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)}
    )
    health = Health()
    health.set("", SERVING_STATUS["NOT_SERVING" if failing is not None else "SERVING"])
    checks = grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(health.check)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((echo, checks))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        health.set(words[1] if len(words) > 1 else "", SERVING_STATUS[words[0]])
        print("ok", flush=True)
    server.stop(0)


if __name__ == "__main__":
    main()
