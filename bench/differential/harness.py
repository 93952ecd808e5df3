#!/usr/bin/env python3
"""Differential harness: run one capataz binary per case against a raw-socket backend.

Usage: harness.py BINARY OUT.json [case-name-filter]
"""
import re, json, os, socket, subprocess, sys, threading, time, urllib.request, struct
sys.path.insert(0, os.path.dirname(__file__))
import harness_hp as hp
import importlib; CASES = importlib.import_module(os.environ.get("CASES", "cases")).CASES

BIN, OUT = sys.argv[1], sys.argv[2]
FILTER = sys.argv[3] if len(sys.argv) > 3 else None
LPORT, APORT, BPORT = 19480, 19481, 19482
DIR = f"/tmp/hostile/run-{os.path.basename(BIN)}"
os.makedirs(DIR, exist_ok=True)

CONFIG = f"""
[log]
level = "warn"
[admin]
address = "127.0.0.1:{APORT}"
[[listeners]]
name = "l"
address = "127.0.0.1:{LPORT}"
h2c = true
forwarded_headers = false
[listeners.access_log]
path = "{DIR}/access.log"
format = "json"
[pools.p]
backends = [{{ name = "b", address = "127.0.0.1:{BPORT}" }}]
[pools.p.active]
kind = "none"
[pools.p.passive]
consecutive_errors = 2
[pools.p.timeouts]
connect = "1s"
response_header = "2s"
"""

state = {"resp": b"", "conns": []}

def backend():
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", BPORT)); srv.listen(64)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()

def serve(c):
    rec = bytearray()
    state["conns"].append(rec)
    c.settimeout(0.4)
    answered = 0
    pat = re.compile(rb"(?:^|\n)[A-Z]+ \S+ HTTP/1\.[01]\r\n")
    try:
        while True:
            try:
                d = c.recv(65536)
            except socket.timeout:
                break
            if not d:
                break
            rec += d
            time.sleep(0.05)
            c.setblocking(False)
            try:
                rec += c.recv(65536)
            except BlockingIOError:
                pass
            c.settimeout(0.4)
            heads = len(pat.findall(bytes(rec)))
            while answered < heads and b"\r\n\r\n" in rec:
                c.sendall(state["resp"]); answered += 1
    except OSError as e:
        rec += f"<<{e}>>".encode()
    c.close()

threading.Thread(target=backend, daemon=True).start()

def h1_client(data):
    s = socket.create_connection(("127.0.0.1", LPORT))
    s.settimeout(1.0)
    s.sendall(data)
    out = bytearray()
    try:
        while True:
            d = s.recv(65536)
            if not d: break
            out += d
    except socket.timeout:
        out += b"<<timeout>>"
    except OSError as e:
        out += f"<<{e}>>".encode()
    s.close()
    return out

def hpack(headers):
    """A header block of literal fields without indexing (harness_hp.lit)."""
    return b"".join(hp.lit(name, value) for name, value in headers)

def frame(typ, flags, sid, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([typ, flags]) + struct.pack(">I", sid) + payload

def h2_client(spec):
    s = socket.create_connection(("127.0.0.1", LPORT))
    s.settimeout(1.0)
    data = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")
    for sid, headers, body in spec:
        split = None
        if isinstance(headers, tuple):
            block, split = headers[1], headers[2]
        else:
            block = hpack(headers)
        es = 1 if body is None else 0
        if split is None:
            data += frame(1, 4 | es, sid, block)
        else:
            data += frame(1, es, sid, block[:split])
            rest = block[split:]
            while len(rest) > 3:
                data += frame(9, 0, sid, rest[:3]); rest = rest[3:]
            data += frame(9, 4, sid, rest)
        if body is not None:
            data += frame(0, 1, sid, body)
    s.sendall(data)
    buf = bytearray(); frames = []
    t0 = time.time()
    try:
        while time.time() - t0 < 2.5:
            d = s.recv(65536)
            if not d: break
            buf += d
            while len(buf) >= 9:
                ln = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + ln: break
                typ, fl = buf[3], buf[4]; sid = int.from_bytes(buf[5:9], "big") & 0x7fffffff
                pl = bytes(buf[9:9 + ln]); del buf[:9 + ln]
                if typ == 4 and not fl & 1:
                    s.sendall(frame(4, 1, 0, b""))
                if typ == 4 or typ == 8: continue  # settings / window update
                if typ == 1: desc = ("HEADERS", sid, fl, pl[:1].hex())
                elif typ == 0: desc = ("DATA", sid, fl, pl.decode("latin1"))
                elif typ == 3: desc = ("RST", sid, int.from_bytes(pl, "big"))
                elif typ == 7: desc = ("GOAWAY", int.from_bytes(pl[4:8], "big"), pl[8:].decode("latin1"))
                else: desc = (typ, sid, fl, pl.hex())
                frames.append(desc)
    except socket.timeout:
        frames.append("<<timeout>>")
    except OSError as e:
        frames.append(f"<<{e}>>")
    s.close()
    return frames

def wait_port(p):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", p)).close(); return
        except OSError: time.sleep(0.05)
    raise SystemExit("capataz did not start")

def get(path):
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{APORT}{path}", timeout=2).read().decode()
    except Exception as e:
        return f"<<{e}>>"

results = {}
for case in CASES:
    name = case["name"]
    if FILTER and FILTER not in name: continue
    cfg = f"{DIR}/capataz.toml"
    conf = CONFIG
    if case["proto"] == "probe":
        conf = conf.replace('kind = "none"', 'kind = "http"\ninterval = "300ms"\nfast_interval = "300ms"\njitter = "0%"\nbody_contains = "ok"\nrise = 1\nfall = 1')
    open(cfg, "w").write(conf)
    try: os.unlink(f"{DIR}/access.log")
    except FileNotFoundError: pass
    state["resp"] = case.get("resp", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    state["conns"].clear()
    proc = subprocess.Popen([BIN, "run", "--config", cfg],
                            stdout=open(f"{DIR}/stdout", "w"), stderr=open(f"{DIR}/stderr.{name}", "w"))
    try:
        wait_port(LPORT); wait_port(APORT)
        if case["proto"] == "h1":
            client = h1_client(case["req"]).decode("latin1")
        elif case["proto"] == "h2":
            client = h2_client(case["req"])
        else:
            time.sleep(1.5); client = ""
        time.sleep(0.6)
        status = get("/status")
        metrics = get("/metrics")
    finally:
        proc.terminate()
        try: proc.wait(5)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()
    try: log = open(f"{DIR}/access.log").read()
    except FileNotFoundError: log = ""
    results[name] = {
        "client": client,
        "backend": [bytes(c).decode("latin1") for c in state["conns"]],
        "status": status, "metrics": metrics, "log": log,
        "stderr": open(f"{DIR}/stderr.{name}").read(),
    }
    print(name, "done", flush=True)
json.dump(results, open(OUT, "w"), indent=1)
