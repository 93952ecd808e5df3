#!/usr/bin/env python3
"""Figures of bench/probe-cost-tls.sh from nginx's probe log and the CPU counters.

  probe_tls_report.py run TARGET ROUND CLK_TCK PROBES_LOG WINDOWS_FILE EXTRA_JSON -> JSON row
  probe_tls_report.py show ROW.json
  probe_tls_report.py table RESULTS_DIR

WINDOWS_FILE: one line per window, "SECONDS PROXY_TICKS BACKEND_TICKS LOG_START LOG_END WAIT_NS"
(byte offsets into the log; WAIT_NS: how long the proxy's threads waited runnable, schedstat). Each log line (nginx log_format `probe`) is
"$msec $ssl_session_reused $server_protocol $ssl_protocol $ssl_cipher $ssl_curve $status $request_uri".
"""

import collections
import json
import os
import statistics
import sys


def read_lines(path, start, end):
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return [line.split() for line in data.decode(errors="replace").splitlines() if line.strip()]


def run(target, rnd, clk, log, windows_file, extra):
    clk = int(clk)
    windows = []
    tally = {k: collections.Counter() for k in ("reused", "protocol", "tls", "cipher", "curve", "status", "uri")}
    with open(windows_file) as f:
        for line in f:
            secs, pticks, bticks, start, end, wait = line.split()
            secs, pticks, bticks, start, end = float(secs), int(pticks), int(bticks), int(start), int(end)
            rows = read_lines(log, start, end)
            probes = len(rows)
            for r in rows:
                for k, i in (("reused", 1), ("protocol", 2), ("tls", 3), ("cipher", 4), ("curve", 5),
                             ("status", 6), ("uri", 7)):
                    tally[k][r[i] if len(r) > i else "?"] += 1
            cpu = pticks / clk
            bcpu = bticks / clk
            windows.append({
                "seconds": round(secs, 3), "probes": probes, "probes_per_s": round(probes / secs, 1),
                "cpu_s": cpu, "cpu_pct": round(100 * cpu / secs, 2),
                "cpu_us_per_probe": round(cpu * 1e6 / probes, 1) if probes else None,
                "backend_cpu_pct": round(100 * bcpu / secs, 2),
                "backend_us_per_probe": round(bcpu * 1e6 / probes, 1) if probes else None,
                "resumed": sum(1 for r in rows if len(r) > 1 and r[1] == "r"),
                "runqueue_wait_pct": round(100 * int(wait) / 1e9 / secs, 2),
            })
    total_probes = sum(w["probes"] for w in windows)
    total_cpu = sum(w["cpu_s"] for w in windows)
    total_secs = sum(w["seconds"] for w in windows)
    def med(k):
        xs = [w[k] for w in windows if w[k] is not None]
        return round(statistics.median(xs), 1) if xs else None
    row = {"target": target, "round": int(rnd), "windows": windows, "probes": total_probes,
           "seconds": round(total_secs, 3), "probes_per_s": round(total_probes / total_secs, 1),
           "cpu_pct": round(100 * total_cpu / total_secs, 2),
           "cpu_us_per_probe": round(total_cpu * 1e6 / total_probes, 1) if total_probes else None,
           "cpu_us_per_probe_median_window": med("cpu_us_per_probe"),
           "backend_us_per_probe_median_window": med("backend_us_per_probe"),
           "resumed": sum(w["resumed"] for w in windows),
           "runqueue_wait_pct_median_window": med("runqueue_wait_pct"),
           "log": {k: dict(v.most_common()) for k, v in tally.items()}}
    row.update(json.loads(extra))
    print(json.dumps(row))


def show(path):
    with open(path) as f:
        r = json.load(f)
    extra = {k: r[k] for k in ("metrics_probes_pass", "metrics_probes_fail", "servers_up", "servers", "chkfail") if k in r}
    print(f"  {r['target']:<8} r{r['round']}: {r['probes_per_s']:.0f} probes/s, CPU {r['cpu_pct']}% = "
          f"{r['cpu_us_per_probe']} us/probe (median window {r['cpu_us_per_probe_median_window']}), backends "
          f"{r['backend_us_per_probe_median_window']} us/probe; resumed {r['resumed']} of {r['probes']}; {extra}")
    print(f"      log: {r['log']}")
    for w in r["windows"]:
        print(f"      window: {w['probes_per_s']:>7.0f}/s cpu {w['cpu_pct']:>6.2f}% {str(w['cpu_us_per_probe']):>7} us/probe, "
              f"backends {w['backend_cpu_pct']:>6.2f}% {str(w['backend_us_per_probe']):>7} us/probe, resumed {w['resumed']}, "
              f"proxy waited runnable {w['runqueue_wait_pct']}%")


def table(res_dir):
    rows = []
    for d in sorted(os.listdir(res_dir)):
        p = os.path.join(res_dir, d, "row.json")
        if os.path.exists(p):
            with open(p) as f:
                rows.append(json.load(f))
    order = []
    for r in rows:
        if r["target"] not in order:
            order.append(r["target"])
    def m(rs, k):
        xs = [r[k] for r in rs if r.get(k) is not None]
        return statistics.median(xs) if xs else float("nan")
    print(f"{'target':<8} {'runs':>4} {'probes/s':>9} {'cpu%':>6} {'us/probe':>9} {'(per round)':<18} {'vs haproxy':>10} "
          f"{'backend us/p':>12} {'resumed':>8} {'waited%':>7} {'protocol / tls / curve':<40}")
    base = {r["round"]: r["cpu_us_per_probe_median_window"] for r in rows if r["target"] == "haproxy"}
    for t in order:
        rs = [r for r in rows if r["target"] == t]
        per = ", ".join(str(r["cpu_us_per_probe_median_window"]) for r in rs)
        ratios = [r["cpu_us_per_probe_median_window"] / base[r["round"]] for r in rs
                  if base.get(r["round"]) and r["cpu_us_per_probe_median_window"]]
        vs = f"{statistics.median(ratios):.2f}x" if ratios and t != "haproxy" else ""
        resumed = sum(r["resumed"] for r in rs)
        probes = sum(r["probes"] for r in rs)
        kinds = lambda k: "+".join(sorted({x for r in rs for x in r["log"][k]}))
        print(f"{t:<8} {len(rs):>4} {m(rs, 'probes_per_s'):>9.0f} {m(rs, 'cpu_pct'):>6.2f} "
              f"{m(rs, 'cpu_us_per_probe_median_window'):>9.1f} {'(' + per + ')':<18} {vs:>10} "
              f"{m(rs, 'backend_us_per_probe_median_window'):>12.1f} {f'{resumed}/{probes}':>8} "
              f"{m(rs, 'runqueue_wait_pct_median_window'):>7.1f} "
              f"{kinds('protocol')} / {kinds('tls')} / {kinds('curve')}")
        if ratios and t != "haproxy":
            print(f"#   {t} / haproxy per round: {', '.join(f'{x:.2f}' for x in ratios)}")
    for r in rows:
        extra = {k: r[k] for k in ("metrics_probes_pass", "metrics_probes_fail", "servers_up", "servers", "chkfail") if k in r}
        print(f"# {r['target']} r{r['round']}: {extra} status {r['log']['status']} cipher {r['log']['cipher']}")
    print("# us/probe: the proxy's utime+stime / probes in nginx's log (median over windows); backend us/p: the")
    print("# same for nginx (+ the gRPC server); resumed: probes whose handshake nginx logged as resumed")
    print("# ($ssl_session_reused = r) of all probes logged; waited%: time the proxy's threads spent runnable")
    print("# but not running (schedstat run delay) per second of the window, median: the neighbours' pressure.")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "run":
        run(*sys.argv[2:8])
    elif cmd == "show":
        show(sys.argv[2])
    elif cmd == "table":
        table(sys.argv[2])
