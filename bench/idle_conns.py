#!/usr/bin/env python3
"""Memory per idle client connection of a running proxy (used by bench/idle_memory.sh).

  idle_conns.py PID PORT N MODE

Opens N client connections to 127.0.0.1:PORT and leaves them idle, then prints one line:
  MODE N RSS_BEFORE_KIB RSS_AFTER_KIB KIB_PER_CONNECTION
where RSS is the VmRSS of the proxy's process PID (the one process serving them), read before
the first connection and two seconds after the last one is set up. MODE:
  plain       plaintext HTTP/1.1, no request sent yet
  plain-kept  plaintext HTTP/1.1, after one request and its answer (keep-alive)
  tls         TLS (ALPN http/1.1), after the handshake, no request sent yet
  h2          TLS with ALPN h2, after the client's preface + SETTINGS, the server's SETTINGS
              and both acknowledgements, no stream
  h2c         plaintext HTTP/2 with prior knowledge, the same exchange as h2
With SETTLE=S in the environment (seconds, default 0), a first wave of N connections is opened
the same way and left idle for S seconds before RSS_BEFORE is read, and the N connections
measured are a second wave: what one more idle connection costs a process that has already
served as many and let them settle (memory its allocator freed meanwhile is reused), rather
than the peak of a burst from a fresh start. Both waves stay open until the end.
With WARMUP=K (default 0), the same scenario runs first with K connections (set up the same
way, idle HOLD seconds, closed), 2 s before RSS_BEFORE is read: a process's first idle
connections fault in its code and its allocator's first slabs once, whatever N is; WARMUP
leaves that out of the per-connection figure.
With HOLD=S (seconds, default 2), RSS_AFTER is read S seconds after the last connection is set
up instead of two.
Loopback only; standard library only; needs RLIMIT_NOFILE above N (raised here to the hard
limit). Every connection is checked: the script fails if one is refused or closed.
"""

import os
import resource
import socket
import ssl
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"          # empty SETTINGS
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed by the proxy")
        data += chunk
    return data


def read_response(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the proxy")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(f"unexpected answer: {head[:40]!r}")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the proxy")
        body += chunk


def h2_handshake(sock):
    """Preface + SETTINGS, then frames until the server's SETTINGS (acked) and its ack of ours."""
    sock.sendall(PREFACE + SETTINGS)
    got_settings = got_ack = False
    while not (got_settings and got_ack):
        head = recv_exact(sock, 9)
        length = int.from_bytes(head[:3], "big")
        kind, flags = head[3], head[4]
        recv_exact(sock, length)
        if kind == 4 and flags & 1:
            got_ack = True
        elif kind == 4:
            got_settings = True
            sock.sendall(SETTINGS_ACK)
        elif kind == 7:
            raise ConnectionError("GOAWAY from the proxy")


def open_one(port, mode, ctx):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if mode in ("tls", "h2"):
        sock = ctx.wrap_socket(sock, server_hostname="localhost")
        want = "h2" if mode == "h2" else "http/1.1"
        if sock.selected_alpn_protocol() != want:
            raise ConnectionError(f"ALPN: wanted {want}, got {sock.selected_alpn_protocol()}")
    if mode == "plain-kept":
        sock.sendall(REQUEST)
        read_response(sock)
    elif mode in ("h2", "h2c"):
        h2_handshake(sock)
    return sock


def main():
    pid, port, n, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if mode not in ("plain", "plain-kept", "tls", "h2", "h2c"):
        sys.exit(f"unknown mode {mode}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    settle = float(os.environ.get("SETTLE", "0"))
    hold = float(os.environ.get("HOLD", "2"))
    waves = 2 if settle > 0 else 1
    if hard < waves * n + 100:
        sys.exit(f"RLIMIT_NOFILE hard limit {hard} is too low for {n} connections")
    ctx = None
    if mode in ("tls", "h2"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"] if mode == "h2" else ["http/1.1"])
    # WARMUP=K: the same scenario with K connections first (set up the mode's way, left idle
    # HOLD seconds, closed), then 2 s, before anything is read: the code and allocator state
    # that a process's first idle connections bring in once (pages of the binary faulted in,
    # the allocator's first slabs of each size) are then in RSS_BEFORE, not charged to the N.
    warmup = int(os.environ.get("WARMUP", "0"))
    if warmup > 0:
        warm = [open_one(port, mode, ctx) for _ in range(warmup)]
        time.sleep(hold)
        for s in warm:
            s.close()
        time.sleep(2)
    first = []
    if settle > 0:
        first = [open_one(port, mode, ctx) for _ in range(n)]
        time.sleep(settle)
    before = rss(pid)
    socks = [open_one(port, mode, ctx) for _ in range(n)]
    time.sleep(hold)
    after = rss(pid)
    # Still open? A proxy that closed some would look cheaper than it is.
    for s in first + socks:
        s.setblocking(False)
        try:
            if s.recv(1) == b"" and mode != "h2c":
                raise ConnectionError("a connection was closed by the proxy while idle")
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
    print(f"{mode} {n} {before} {after} {(after - before) / n:.2f}")
    for s in first + socks:
        s.close()


if __name__ == "__main__":
    main()
