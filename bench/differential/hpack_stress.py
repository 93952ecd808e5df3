#!/usr/bin/env python3
"""Many h2c requests on one connection through capataz (BIN), responses with fields whose values
change and repeat (the encoder's dynamic table, evictions at a small table size); nghttp
decodes each answer; the decoded headers must be what the backend sent."""
import os, re, socket, subprocess, sys, threading, time
BIN, TABLE = sys.argv[1], sys.argv[2]
LPORT, APORT, BPORT = 19490, 19491, 19492
D = f"/tmp/hostile/stress-{os.path.basename(BIN)}"; os.makedirs(D, exist_ok=True)
open(f"{D}/c.toml", "w").write(f"""
[log]
level = "warn"
[[listeners]]
address = "127.0.0.1:{LPORT}"
h2c = true
forwarded_headers = false
[pools.p]
backends = [{{ address = "127.0.0.1:{BPORT}" }}]
[pools.p.active]
kind = "none"
[pools.p.timeouts]
connect = "5s"
response_header = "10s"
""")
def answer(path):
    n = int(path.strip("/"))
    fields = [("X-N", str(n % 5)), ("Set-Cookie", f"s={n % 3}"), ("X-Long", "y" * (100 + n % 4) ), ("Cache-Control", ["no-store", "max-age=1"][n % 2]), ("X-Path", path)]
    head = "HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "Content-Length: 2\r\n\r\nok"
    return head.encode(), fields
def serve(c):
    buf = b""
    while True:
        d = c.recv(65536)
        if not d: break
        buf += d
        while b"\r\n\r\n" in buf:
            head, buf = buf.split(b"\r\n\r\n", 1)
            path = head.split(b" ")[1].decode()
            c.sendall(answer(path)[0])
    c.close()
def backend():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", BPORT)); s.listen(256)
    while True:
        c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=backend, daemon=True).start()
p = subprocess.Popen([BIN, "run", f"{D}/c.toml"], stderr=open(f"{D}/err", "w"))
try:
    for _ in range(100):
        try: socket.create_connection(("127.0.0.1", LPORT)).close(); break
        except OSError: time.sleep(0.05)
    N = 30
    urls = [f"http://127.0.0.1:{LPORT}/{i}" for i in range(N)]
    out = subprocess.run(["nghttp", "-v", "-n", "-m", "1", f"--header-table-size={TABLE}"] + urls, capture_output=True, text=True, timeout=60)
    text = out.stdout
    # Per stream: the decoded response fields.
    got = {}
    for m in re.finditer(r"recv \(stream_id=(\d+)\) (\S+): (.*)", text):
        got.setdefault(int(m.group(1)), []).append((m.group(2), m.group(3)))
    bad = 0; checked = 0
    for sid, fields in got.items():
        d = dict((k, v) for k, v in fields if k != "set-cookie")
        if ":status" not in d: continue
        path = d.get("x-path")
        if path is None: bad += 1; print("no x-path", sid, fields); continue
        want = [(k.lower(), v) for k, v in answer(path)[1]]
        have = [(k, v) for k, v in fields if not k.startswith(":") and k not in ("date", "content-length")]
        checked += 1
        if sorted(want) != sorted(have):
            bad += 1; print("MISMATCH", sid, path, want, have)
    print(f"table={TABLE} streams checked={checked} bad={bad} rc={out.returncode} errors={out.stderr[-300:]!r}")
finally:
    p.terminate(); p.wait(5)
