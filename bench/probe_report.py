#!/usr/bin/env python3
"""Figures of bench/probe-cost.sh from the listener's dumps (see probe_listener.c).

  probe_report.py run TARGET ROUND CLK_TCK BACKENDS "TICKS..." "DUMPS..." EXTRA_JSON -> JSON row
  probe_report.py show ROW.json
  probe_report.py table RESULTS_DIR

Per window (one dump each): probes that reached the listener, the proxy's CPU time, CPU
microseconds per probe, probes per second, addresses probed, and the spread of arrivals over
100 ms buckets (only whole buckets): max/avg, p99/avg, min/avg, coefficient of variation.
"""

import json
import os
import statistics
import sys


def load_dump(path):
    with open(path) as f:
        start, end, bucket_ns, probes, seen = (int(x) for x in f.readline().split())
        buckets = [int(x) for x in f.readline().split()]
        per_addr = [int(x) for x in f.readline().split()]
    return start, end, bucket_ns, probes, seen, buckets, per_addr


def spread(buckets10, bucket_ns, start, end, agg=10):
    """Probes per (agg x 10 ms) bucket over the whole buckets of [start, end)."""
    whole = (end - start) // (bucket_ns * agg)
    b = [sum(buckets10[i * agg:(i + 1) * agg]) for i in range(whole)]
    if not b:
        return {}
    avg = sum(b) / len(b)
    s = sorted(b)
    return {"buckets": len(b), "avg": avg, "max_over_avg": s[-1] / avg if avg else None,
            "p99_over_avg": s[min(len(s) - 1, int(0.99 * len(s)))] / avg if avg else None,
            "min_over_avg": s[0] / avg if avg else None,
            "cv": statistics.pstdev(b) / avg if avg else None}


def run(target, rnd, clk, backends, ticks, dumps, extra):
    clk, backends = int(clk), int(backends)
    ticks = [int(t) for t in ticks.split()]
    windows = []
    addr_counts = None
    for t, path in zip(ticks, dumps.split()):
        start, end, bucket_ns, probes, seen, buckets, per_addr = load_dump(path)
        secs = (end - start) / 1e9
        cpu_s = t / clk
        sp = spread(buckets, bucket_ns, start, end)
        sp10 = spread(buckets, bucket_ns, start, end, agg=1)
        windows.append({
            "seconds": round(secs, 3), "probes": probes, "probes_per_s": round(probes / secs, 1),
            "addresses": seen, "cpu_s": cpu_s, "cpu_pct": round(100 * cpu_s / secs, 2),
            "cpu_us_per_probe": round(cpu_s * 1e6 / probes, 3) if probes else None,
            "spread100_max": round(sp.get("max_over_avg") or 0, 3),
            "spread100_p99": round(sp.get("p99_over_avg") or 0, 3),
            "spread100_min": round(sp.get("min_over_avg") or 0, 3),
            "spread100_cv": round(sp.get("cv") or 0, 4),
            "spread10_max": round(sp10.get("max_over_avg") or 0, 3),
        })
        addr_counts = per_addr if addr_counts is None else [a + b for a, b in zip(addr_counts, per_addr)]
    total_probes = sum(w["probes"] for w in windows)
    total_cpu = sum(w["cpu_s"] for w in windows)
    total_secs = sum(w["seconds"] for w in windows)
    row = {"target": target, "round": int(rnd), "backends": backends, "windows": windows,
           "probes": total_probes, "seconds": round(total_secs, 3),
           "probes_per_s": round(total_probes / total_secs, 1),
           "cpu_pct": round(100 * total_cpu / total_secs, 2),
           "cpu_us_per_probe": round(total_cpu * 1e6 / total_probes, 3) if total_probes else None,
           "cpu_us_per_probe_median_window": statistics.median(w["cpu_us_per_probe"] for w in windows if w["cpu_us_per_probe"]),
           "spread100_max_worst_window": max(w["spread100_max"] for w in windows),
           "spread100_max_median_window": statistics.median(w["spread100_max"] for w in windows),
           "spread100_p99_median_window": statistics.median(w["spread100_p99"] for w in windows),
           "spread100_min_median_window": statistics.median(w["spread100_min"] for w in windows),
           "spread100_cv_median_window": statistics.median(w["spread100_cv"] for w in windows),
           "spread10_max_median_window": statistics.median(w["spread10_max"] for w in windows)}
    if addr_counts:
        probed = [c for c in addr_counts if c > 0]
        row["addresses_probed"] = len(probed)
        s = sorted(addr_counts)
        row["per_address_min_med_max"] = [s[0], s[len(s) // 2], s[-1]]
    row.update(json.loads(extra))
    print(json.dumps(row))


def show(path):
    with open(path) as f:
        r = json.load(f)
    print(f"  {r['target']:<8} r{r['round']}: {r['probes_per_s']:.0f} probes/s over {r['addresses_probed']} addresses "
          f"(per address min/med/max {r['per_address_min_med_max']}), CPU {r['cpu_pct']}% = "
          f"{r['cpu_us_per_probe']} us/probe (median window {r['cpu_us_per_probe_median_window']}); "
          f"100 ms buckets max/avg {r['spread100_max_median_window']} (worst window {r['spread100_max_worst_window']}), "
          f"p99/avg {r['spread100_p99_median_window']}, min/avg {r['spread100_min_median_window']}; "
          f"RSS {r['rss_kb']} KiB (HWM {r['hwm_kb']}, PSS {r['pss_kb']})")
    for w in r["windows"]:
        print(f"      window: {w['probes_per_s']:>8.0f}/s cpu {w['cpu_pct']:>6.2f}% {w['cpu_us_per_probe']:>7} us/probe "
              f"spread max {w['spread100_max']} p99 {w['spread100_p99']} min {w['spread100_min']} cv {w['spread100_cv']}")


def table(res_dir):
    rows, mem = [], []
    for d in sorted(os.listdir(res_dir)):
        p = os.path.join(res_dir, d, "row.json")
        if os.path.exists(p):
            with open(p) as f:
                rows.append(json.load(f))
        p = os.path.join(res_dir, d, "memory.json")
        if os.path.exists(p):
            with open(p) as f:
                mem.append(json.load(f))
    order = []
    for r in rows:
        if r["target"] not in order:
            order.append(r["target"])
    m = lambda rs, k: statistics.median(r[k] for r in rs)
    print(f"{'target':<8} {'runs':>4} {'probes/s':>9} {'addrs':>6} {'cpu%':>6} {'us/probe':>9} {'us/p(med w)':>11} "
          f"{'max/avg':>8} {'worst':>6} {'p99/avg':>8} {'min/avg':>8} {'cv':>6} {'10ms max':>8} {'RSS KiB':>8} {'PSS KiB':>8}")
    for t in order:
        rs = [r for r in rows if r["target"] == t]
        print(f"{t:<8} {len(rs):>4} {m(rs, 'probes_per_s'):>9.0f} {m(rs, 'addresses_probed'):>6.0f} {m(rs, 'cpu_pct'):>6.2f} "
              f"{m(rs, 'cpu_us_per_probe'):>9.3f} {m(rs, 'cpu_us_per_probe_median_window'):>11.3f} "
              f"{m(rs, 'spread100_max_median_window'):>8.3f} {max(r['spread100_max_worst_window'] for r in rs):>6.3f} "
              f"{m(rs, 'spread100_p99_median_window'):>8.3f} {m(rs, 'spread100_min_median_window'):>8.3f} "
              f"{m(rs, 'spread100_cv_median_window'):>6.3f} {m(rs, 'spread10_max_median_window'):>8.2f} "
              f"{m(rs, 'rss_kb'):>8.0f} {m(rs, 'pss_kb'):>8.0f}")
    for r in rows:
        extra = {k: r[k] for k in ("metrics_probes_pass", "metrics_probes_fail", "metrics_scrape_s",
                                   "metrics_bytes", "uptime_s", "servers_up", "servers", "chkfail",
                                   "listener_wakeups_per_s") if k in r}
        print(f"# {r['target']} r{r['round']}: {extra}")
    for x in mem:
        print(f"# nginx r{x['round']} (memory only, {rows[0]['backends'] if rows else '?'} upstream servers, no checks): "
              f"RSS {x['rss_kb']} KiB, PSS {x['pss_kb']} KiB (master + 1 worker)")
    print("# us/probe: proxy CPU time / probes that reached the listener; max/avg etc.: probes per 100 ms bucket")
    print("# relative to the average bucket (median over windows; 'worst' = worst window); 10ms max: the same")
    print("# over 10 ms buckets. RSS/PSS at the end of the run, no client traffic. listener_wakeups_per_s:")
    print("# how often the listener slept and was woken (on loopback the prober pays for those wake-ups).")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "run":
        run(*sys.argv[2:9])
    elif cmd == "show":
        show(sys.argv[2])
    elif cmd == "table":
        table(sys.argv[2])
