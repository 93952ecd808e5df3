#!/usr/bin/env python3
"""Paced HTTP/1.1 keep-alive load with a kill/restart timeline, for bench/failover.sh.

Sends GET / to one proxy at a fixed rate (default 2,000 req/s) over a set of keep-alive
connections: request k is due at t0 + k/rate and is taken by whichever connection is free, so a
stalled connection does not lower the rate (requests only start late when all are busy). Every
request is recorded: when it was due, sent and answered, its status (0 = no HTTP answer), which
backend served it (the X-Backend header the nginx backends add) and the error, if any.

At --kill-at seconds it sends SIGKILL to --kill-pid; at --restart-at it runs --restart-cmd
(its PID goes to --restart-pidfile, so the calling script stops it). Meanwhile it polls the
proxy's own view of the killed backend every --poll-ms: capataz GET /status, HAProxy
GET /stats;csv. Everything is on the wall clock (time.time()), like capataz's log timestamps.

Output: --out DIR/requests.csv (one line per request), DIR/poll.csv, DIR/summary.json.
Standard library only; loopback only.
"""

import argparse
import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True, help="host:port of the proxy (loopback)")
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--conns", type=int, default=64)
    p.add_argument("--duration", type=float, default=25.0)
    p.add_argument("--kill-at", type=float, default=5.0)
    p.add_argument("--restart-at", type=float, default=15.0)
    p.add_argument("--kill-pid", type=int, required=True)
    p.add_argument("--killed-name", default="b2")
    p.add_argument("--restart-cmd", required=True, help="JSON list: argv of the restarted backend")
    p.add_argument("--restart-pidfile", required=True)
    p.add_argument("--restart-log", default="/dev/null")
    p.add_argument("--poll", choices=["capataz", "haproxy", "none"], default="none")
    p.add_argument("--poll-target", default="", help="host:port of the admin/stats listener")
    p.add_argument("--poll-ms", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=10.0, help="per-request deadline, s")
    p.add_argument("--out", required=True)
    return p.parse_args()


def loopback(hostport):
    host, port = hostport.rsplit(":", 1)
    if not host.startswith("127."):
        sys.exit(f"refusing non-loopback target {hostport}")
    return host, int(port)


REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\nUser-Agent: failover-client\r\n\r\n"


async def read_response(reader):
    """Reads one response; returns (status, backend, keep_alive)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    backend = ""
    length = None
    chunked = False
    close = lines[0].startswith("HTTP/1.0")
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        name = name.strip().lower()
        value = value.strip()
        if name == "x-backend":
            backend = value
        elif name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
        elif name == "connection":
            close = value.lower() == "close"
    if chunked:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length is not None:
        await reader.readexactly(length)
    else:
        await reader.read()  # until EOF
        close = True
    return status, backend, close


class Load:
    def __init__(self, args):
        self.args = args
        self.host, self.port = loopback(args.target)
        self.records = []  # (k, due, sent, done, status, backend, error)
        self.next_k = 0
        self.total = int(args.rate * args.duration)

    async def worker(self, t0):
        reader = writer = None
        args = self.args
        while True:
            k = self.next_k
            if k >= self.total:
                break
            self.next_k += 1
            due = t0 + k / args.rate
            delay = due - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.time()
            status, backend, error = 0, "", ""
            try:
                if writer is None:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port), args.timeout)
                writer.write(REQUEST)
                status, backend, close = await asyncio.wait_for(read_response(reader), args.timeout)
                if close:
                    writer.close()
                    writer = None
            except asyncio.TimeoutError:
                error = "timeout"
            except asyncio.IncompleteReadError as e:
                error = "eof" if not e.partial else "truncated"
            except ConnectionResetError:
                error = "reset"
            except ConnectionRefusedError:
                error = "refused"
            except (OSError, ValueError, IndexError) as e:
                error = type(e).__name__
            if error and writer is not None:
                writer.close()
                writer = None
            self.records.append((k, due, sent, time.time(), status, backend, error))
        if writer is not None:
            writer.close()


async def http_get(hostport, path, timeout=1.0):
    host, port = loopback(hostport)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    return body.decode("utf-8", "replace")


async def poller(args, stop, rows):
    """The proxy's own view of the killed backend: (time, ejected 0/1, state text, extra)."""
    if args.poll == "none":
        return
    while not stop.is_set():
        t = time.time()
        try:
            if args.poll == "capataz":
                status = json.loads(await http_get(args.poll_target, "/status"))
                for pool in status["pools"]:
                    for b in pool["backends"]:
                        if b["name"] == args.killed_name:
                            eligible = b["eligible"]
                            rows.append((t, 0 if eligible else 1, b["state"],
                                         b["passive"]["ejection"]["state"] if isinstance(b["passive"].get("ejection"), dict) else str(b["passive"].get("ejection"))))
            else:
                text = await http_get(args.poll_target, "/stats;csv")
                lines = text.splitlines()
                hdr = lines[0].lstrip("# ").split(",")
                col = {name: i for i, name in enumerate(hdr)}
                for line in lines[1:]:
                    f = line.split(",")
                    if len(f) > col["status"] and f[col["svname"]] == args.killed_name:
                        st = f[col["status"]]
                        ejected = 0 if st.startswith("UP") or st == "no check" else 1
                        extra = "econ=%s eresp=%s wretr=%s wredis=%s" % (
                            f[col["econ"]], f[col["eresp"]], f[col["wretr"]], f[col["wredis"]])
                        rows.append((t, ejected, st, extra))
        except Exception as e:  # the poller must never stop the load
            rows.append((t, -1, "poll-error", type(e).__name__))
        await asyncio.sleep(args.poll_ms / 1000.0)


async def timeline(args, t0, marks):
    await asyncio.sleep(max(0.0, t0 + args.kill_at - time.time()))
    marks["kill"] = time.time()
    try:
        os.kill(args.kill_pid, signal.SIGKILL)
    except ProcessLookupError:
        marks["kill_error"] = "no such process"
    await asyncio.sleep(max(0.0, t0 + args.restart_at - time.time()))
    argv = json.loads(args.restart_cmd)
    log = open(args.restart_log, "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    marks["restart"] = time.time()
    with open(args.restart_pidfile, "w") as f:
        f.write(str(proc.pid))
    marks["restart_pid"] = proc.pid


def summarize(args, load, polls, marks):
    kill, restart = marks.get("kill"), marks.get("restart")
    recs = sorted(load.records, key=lambda r: r[3])
    errors = [r for r in recs if r[6] or r[4] != 200]
    by_kind = {}
    for r in errors:
        kind = r[6] or f"http_{r[4]}"
        by_kind[kind] = by_kind.get(kind, 0) + 1
    killed = args.killed_name
    served_killed_before = [r[3] for r in recs if r[5] == killed and r[4] == 200 and r[3] <= kill]
    served_killed_dead = [r[3] for r in recs if r[5] == killed and r[4] == 200 and kill < r[3] < restart]
    readmit_first = next((r[3] for r in recs if r[5] == killed and r[4] == 200 and r[3] >= restart), None)
    start = recs[0][2] if recs else 0
    end = recs[-1][3] if recs else 0
    lat = sorted(r[3] - r[2] for r in recs)
    late = sorted(r[2] - r[1] for r in recs)
    slow = sum(1 for x in lat if x > 1.0)

    def pct(v, q):
        return v[min(len(v) - 1, int(q * len(v)))] if v else None

    eject_poll = readmit_poll = None
    for t, ej, _st, _x in polls:
        if kill and t >= kill and ej == 1 and eject_poll is None:
            eject_poll = t
        if restart and t >= restart and ej == 0 and eject_poll is not None and readmit_poll is None:
            readmit_poll = t
    s = {
        "target": args.target,
        "requests": len(recs),
        "achieved_rps": round(len(recs) / (end - start), 1) if end > start else 0,
        "errors": len(errors),
        "errors_by_kind": by_kind,
        "first_error_after_kill_s": round(min(r[3] for r in errors) - kill, 4) if errors else None,
        "last_error_after_kill_s": round(max(r[3] for r in errors) - kill, 4) if errors else None,
        "slow_over_1s": slow,
        "latency_p50_ms": round(1000 * pct(lat, 0.5), 3) if lat else None,
        "latency_p99_ms": round(1000 * pct(lat, 0.99), 3) if lat else None,
        "latency_max_ms": round(1000 * lat[-1], 3) if lat else None,
        "start_late_p99_ms": round(1000 * pct(late, 0.99), 3) if late else None,
        "kill_t": kill,
        "restart_t": restart,
        "t0": marks.get("t0"),
        "killed_served_before_kill": len(served_killed_before),
        "killed_served_while_dead": len(served_killed_dead),
        "readmit_first_response_s": round(readmit_first - restart, 4) if readmit_first else None,
        "eject_poll_s": round(eject_poll - kill, 4) if eject_poll else None,
        "readmit_poll_s": round(readmit_poll - restart, 4) if readmit_poll else None,
        "poll_ms": args.poll_ms if args.poll != "none" else None,
        "poll_errors": sum(1 for p in polls if p[1] == -1),
    }
    return s


async def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    load = Load(args)
    polls, marks = [], {}
    stop = asyncio.Event()
    t0 = time.time() + 0.2
    marks["t0"] = t0
    poll_task = asyncio.create_task(poller(args, stop, polls))
    tl_task = asyncio.create_task(timeline(args, t0, marks))
    workers = [asyncio.create_task(load.worker(t0)) for _ in range(args.conns)]
    await asyncio.gather(*workers)
    await tl_task
    stop.set()
    await poll_task
    with open(os.path.join(args.out, "requests.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["k", "due", "sent", "done", "status", "backend", "error"])
        for r in sorted(load.records):
            w.writerow([r[0], f"{r[1]:.6f}", f"{r[2]:.6f}", f"{r[3]:.6f}", r[4], r[5], r[6]])
    with open(os.path.join(args.out, "poll.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["t", "ejected", "state", "extra"])
        for r in polls:
            w.writerow([f"{r[0]:.6f}", r[1], r[2], r[3]])
    summary = summarize(args, load, polls, marks)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    asyncio.run(main())
