#!/usr/bin/env python3
"""Memory per client connection of a running proxy, step by step (used for BENCHMARKS.md).

  conn_memory.py PID PORT [N]

Against the proxy (pid PID) listening on 127.0.0.1:PORT, prints its VmRSS (KiB):
  1. at the start;
  2. with N client connections open and idle (no request yet);
  3. after one request on each, one connection at a time (the proxy needs one upstream
     connection at a time);
  4. after one request on each, all N in flight at once (the proxy needs N upstream
     connections);
  5. two seconds after all N client connections are closed.
Run it twice in a row to see whether the memory of step 4 is reused. Loopback only; standard
library only. Example, with bench/memory.sh's setup or by hand:
  CAPATAZ_WORKER_THREADS=1 capataz run --config bench/capataz.toml &   # + the 2 backends
  bench/conn_memory.py $! 9400 1000
"""

import socket
import sys
import time


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def read_response(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += sock.recv(65536)


def main():
    pid, port = int(sys.argv[1]), int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    req = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
    base = rss(pid)
    print(f"start                                   {base:>8} KiB")
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    time.sleep(1)
    r = rss(pid)
    print(f"{n} idle client connections           {r:>8} KiB  (+{(r - base) / n:.1f} KiB each)")
    prev = r
    for s in socks:
        s.sendall(req)
        read_response(s)
    time.sleep(1)
    r = rss(pid)
    print(f"+1 request each, one at a time          {r:>8} KiB  (+{(r - prev) / n:.1f} KiB each)")
    prev = r
    for s in socks:
        s.sendall(req)
    for s in socks:
        read_response(s)
    time.sleep(1)
    r = rss(pid)
    print(f"+1 request each, all {n} in flight     {r:>8} KiB  (+{(r - prev) / n:.1f} KiB each)")
    for s in socks:
        s.close()
    time.sleep(2)
    print(f"client connections closed               {rss(pid):>8} KiB")


if __name__ == "__main__":
    main()
