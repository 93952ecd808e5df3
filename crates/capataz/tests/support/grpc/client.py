"""A real gRPC client for capataz's tests, on Python's grpcio (see .ci/deps/grpcio.sh).

Usage: client.py TARGET CALLS [CA_FILE SERVER_NAME]

Makes CALLS unary calls of `test.Echo/Call` (raw bytes, as tests/support/grpc/server.py
serves it) to TARGET (host:port), one after the other on one channel: over h2c (HTTP/2 with
prior knowledge), or over TLS trusting CA_FILE and verifying SERVER_NAME when both are given.
Prints one line per call: the status code name, a space, and the answer (empty on an error).
Each call has a 5 s deadline, so the script always ends.
"""

import sys

import grpc


def main():
    target, calls = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 4:
        with open(sys.argv[3], "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        options = (("grpc.ssl_target_name_override", sys.argv[4]),)
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target)
    call = channel.unary_unary("/test.Echo/Call")
    for i in range(calls):
        try:
            answer = call(b"m%d" % i, timeout=5)
            print("OK", answer.decode(), flush=True)
        except grpc.RpcError as error:
            print(error.code().name, "", flush=True)
    channel.close()


if __name__ == "__main__":
    main()
