#!/usr/bin/env python3
"""How long a reload of a big pool holds capataz's runtime thread.

usage: bench/reload_stall.py BIN [RUNS] [BACKENDS]   (defaults: 20 runs, 10,000 backends)

Starts BIN (`capataz run`) with CAPATAZ_WORKER_THREADS=1 (a single-threaded runtime) on a
config of one pool `web` of BACKENDS weight-1 backends, `active.kind = "none"`, and an admin
listener, all on loopback ports picked here. Each run sends `POST /reload` (the same file, so
every backend is kept) and, 50 ms into it, `GET /status/web/b1` back to back until the reload
answers. Prints the medians, minimums and maximums of the reload's duration, of the first GET's
latency, and of each run's slowest GET. Stops the balancer by PID when done or interrupted.
"""
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    binary = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    admin, listen = free_port(), free_port()
    lines = [f'[admin]\naddress = "127.0.0.1:{admin}"\n',
             f'[[listeners]]\naddress = "127.0.0.1:{listen}"\n', "[pools.web]\nbackends = ["]
    for i in range(1, count + 1):
        lines.append(f'  {{ name = "b{i}", address = "127.0.0.1:{1 + i % 60000}", weight = 1 }},')
    lines.append(']\n[pools.web.active]\nkind = "none"\n')
    workdir = tempfile.mkdtemp(prefix="capataz-reload-stall-")
    config = os.path.join(workdir, "capataz.toml")
    with open(config, "w") as f:
        f.write("\n".join(lines))
    env = dict(os.environ, CAPATAZ_WORKER_THREADS="1")
    proc = subprocess.Popen([binary, "run", "--config", config], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def request(method, path):
        conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=30)
        conn.request(method, path)
        answer = conn.getresponse()
        answer.read()
        conn.close()
        return answer.status

    try:
        for _ in range(600):
            try:
                if request("GET", "/status/web/b1") == 200:
                    break
            except OSError:
                time.sleep(0.05)
        request("POST", "/reload")  # warm-up
        reloads, first, slowest = [], [], []
        for _ in range(runs):
            out = {}

            def reload():
                start = time.perf_counter()
                out["status"] = request("POST", "/reload")
                out["ms"] = (time.perf_counter() - start) * 1000

            thread = threading.Thread(target=reload)
            thread.start()
            time.sleep(0.05)
            latencies = []
            while thread.is_alive() or not latencies:
                start = time.perf_counter()
                assert request("GET", "/status/web/b1") == 200
                latencies.append((time.perf_counter() - start) * 1000)
            thread.join()
            assert out["status"] == 200, out
            reloads.append(out["ms"])
            first.append(latencies[0])
            slowest.append(max(latencies))
            time.sleep(0.2)

        def summary(xs):
            return f"median {statistics.median(xs):.1f} ms, min {min(xs):.1f}, max {max(xs):.1f}"

        print(f"{binary}: {runs} runs, {count} backends")
        print(f"  POST /reload:                        {summary(reloads)}")
        print(f"  GET /status/web/b1 sent at +50 ms:   {summary(first)}")
        print(f"  slowest GET from +50 ms to the end:  {summary(slowest)}")
    finally:
        proc.terminate()
        proc.wait()
        os.remove(config)
        os.rmdir(workdir)


if __name__ == "__main__":
    main()
