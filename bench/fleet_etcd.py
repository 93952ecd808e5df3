#!/usr/bin/env python3
"""etcd and capataz helpers of bench/fleet.sh (standard library only; loopback only).

  fleet_etcd.py fill ENDPOINT PREFIX FIRST COUNT PORT    put COUNT backends, indexes FIRST..
  fleet_etcd.py churn ENDPOINT PREFIX COUNT SPARE PORT RATE SECONDS [STATE]
                                                          RATE operations a second (half puts
                                                          of new backends from the SPARE
                                                          addresses after the first COUNT,
                                                          half deletes of present ones), then
                                                          print the operations, the seconds
                                                          and the number of keys; STATE, a
                                                          file, carries the keys present from
                                                          one run to the next
  fleet_etcd.py updates ENDPOINT PREFIX FIRST COUNT PORT LOG
                                                          put COUNT backends one at a time, each
                                                          once the last one's `membership
                                                          updated` line is in capataz's JSON
                                                          LOG; print for each the seconds from
                                                          the put to that line's timestamp
  fleet_etcd.py count ENDPOINT PREFIX                     keys under PREFIX
  fleet_etcd.py wait ADMIN POOL BACKEND TIMEOUT           until /status/POOL/BACKEND answers
  fleet_etcd.py wait_pool ADMIN POOL TOTAL HEALTHY TIMEOUT
                                                          until /status says POOL has TOTAL
                                                          backends, at least HEALTHY in rotation
  fleet_etcd.py excluded ADMINS POOL BACKEND TIMEOUT      until every admin address (comma-
                                                          separated) says BACKEND is not serving
  fleet_etcd.py serving ADMINS POOL BACKEND TIMEOUT       until every one says it is serving

Backend i is named s<i> (5 digits) at 127.0.(1 + i // 250).(1 + i % 250):PORT, the addresses
bench/probe_listener.c binds. Writes go through etcd's JSON gateway (/v3/kv/...) over one
keep-alive connection. Every wait prints the seconds it took, and exits 1 at its timeout.
"""

import base64
import datetime
import http.client
import json
import random
import sys
import time


def b64(text):
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix):
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def addr(i, port):
    return f"127.0.{1 + i // 250}.{1 + i % 250}:{port}"


class Etcd:
    def __init__(self, endpoint):
        host, port = endpoint.replace("http://", "").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def call(self, path, body):
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        answer = self.conn.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise SystemExit(f"etcd {path}: {answer.status} {data[:200]!r}")
        return json.loads(data)

    def put(self, prefix, i, port):
        value = json.dumps({"address": addr(i, port)})
        self.call("/v3/kv/put", {"key": b64(f"{prefix}s{i:05d}"), "value": b64(value)})

    def delete(self, prefix, i):
        self.call("/v3/kv/deleterange", {"key": b64(f"{prefix}s{i:05d}")})

    def count(self, prefix):
        got = self.call("/v3/kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix),
                                         "count_only": True})
        return int(got.get("count", 0))


def admin_get(admin, path):
    host, port = admin.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def until(timeout, done, what):
    start = time.time()
    while not done():
        if time.time() - start > timeout:
            print(f"timeout after {timeout} s waiting for {what}", file=sys.stderr)
            sys.exit(1)
        time.sleep(0.02)
    print(f"{time.time() - start:.3f}")


def pool_state(admin, pool):
    status, body = admin_get(admin, "/status")
    if status != 200:
        return None
    for p in json.loads(body)["pools"]:
        if p["name"] == pool:
            return p["backends_total"], p["healthy"]
    return None


def serving(admin, pool, backend):
    status, body = admin_get(admin, f"/status/{pool}/{backend}")
    return status == 200 and json.loads(body).get("serving") is True


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "fill":
        endpoint, prefix, first, count, port = args[0], args[1], int(args[2]), int(args[3]), args[4]
        etcd = Etcd(endpoint)
        start = time.time()
        for i in range(first, first + count):
            etcd.put(prefix, i, port)
        print(f"{time.time() - start:.3f}")
    elif cmd == "churn":
        endpoint, prefix = args[0], args[1]
        count, spare, port, rate, seconds = int(args[2]), int(args[3]), args[4], float(args[5]), float(args[6])
        etcd = Etcd(endpoint)
        present = list(range(count))
        state = args[7] if len(args) > 7 else None
        if state:
            try:
                with open(state) as f:
                    present = [int(x) for x in f.read().split()]
            except FileNotFoundError:
                pass
        taken = set(present)
        absent = [i for i in range(count + spare) if i not in taken]
        rng = random.Random(12 + len(absent))
        start = time.time()
        ops = 0
        while time.time() - start < seconds:
            due = start + ops / rate
            now = time.time()
            if due > now:
                time.sleep(due - now)
            if ops % 2 == 0 and present:
                i = present.pop(rng.randrange(len(present)))
                etcd.delete(prefix, i)
                absent.append(i)
            elif absent:
                i = absent.pop(rng.randrange(len(absent)))
                etcd.put(prefix, i, port)
                present.append(i)
            ops += 1
        if state:
            with open(state, "w") as f:
                f.write(" ".join(map(str, present)))
        print(f"{ops} {time.time() - start:.3f} {len(present)}")
    elif cmd == "updates":
        endpoint, prefix, first, count, port, log = args[0], args[1], int(args[2]), int(args[3]), args[4], args[5]
        etcd = Etcd(endpoint)
        for i in range(first, first + count):
            with open(log, "rb") as f:
                f.seek(0, 2)
                offset = f.tell()
            start = time.time()
            etcd.put(prefix, i, port)
            applied = None
            while applied is None:
                if time.time() - start > 600:
                    raise SystemExit(f"no membership update in {log} within 600 s of put {i}")
                time.sleep(0.002)
                with open(log, "rb") as f:
                    f.seek(offset)
                    for line in f.read().decode(errors="replace").splitlines():
                        if "membership updated:" in line:
                            stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
                            applied = datetime.datetime.fromisoformat(stamp).timestamp()
                            break
            print(f"{applied - start:.4f}")
    elif cmd == "count":
        print(Etcd(args[0]).count(args[1]))
    elif cmd == "wait":
        admin, pool, backend, timeout = args[0], args[1], args[2], float(args[3])
        until(timeout, lambda: admin_get(admin, f"/status/{pool}/{backend}")[0] == 200,
              f"{backend} in {pool}")
    elif cmd == "wait_pool":
        admin, pool, total, healthy, timeout = args[0], args[1], int(args[2]), int(args[3]), float(args[4])

        def done():
            state = pool_state(admin, pool)
            if state is None:
                return False
            time.sleep(0.3)   # /status of thousands of backends is not free: ask less often
            return state[0] == total and state[1] >= healthy
        until(timeout, done, f"{pool} at {total} backends, {healthy} healthy")
    elif cmd in ("excluded", "serving"):
        admins, pool, backend, timeout = args[0].split(","), args[1], args[2], float(args[3])
        want = cmd == "serving"
        until(timeout, lambda: all(serving(a, pool, backend) == want for a in admins),
              f"{backend} {cmd} on {admins}")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
