#!/usr/bin/env python3
"""Turns one bench/failover.sh run into a row, and rows into a table of medians.

  failover_report.py run VARIANT OUTDIR TICKS CLK_TCK HWM_KB   -> JSON row on stdout
  failover_report.py show ROW.json                             -> one line for the log
  failover_report.py table RESULTS_DIR                         -> medians per variant

Time to eject, per proxy, from its own evidence:
  capataz   the first transition log line of b2 to DOWN after the kill (JSON log, microseconds)
  HAProxy   the first stats poll (every 20 ms) where b2's status is no longer UP
  nginx     the attempt that reaches max_fails=3: the 3rd failed attempt on b2 after the kill
            ($msec and $upstream_addr in its access log)
Requests sent to the dead b2 (each one a failure the proxy had to absorb or pass on):
  capataz   capataz_requests_total{backend="b2",class="error"} (+5xx)
  HAProxy   econ + eresp of b2 in the stats CSV
  nginx     access-log entries whose $upstream_addr lists b2 between kill and restart
"""

import csv
import datetime
import json
import os
import re
import statistics
import sys

KILLED_ADDR = "127.0.0.1:9112"
KILLED = "b2"


def iso(ts):
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def capataz_evidence(out, s):
    ev = {}
    kill, restart = s["kill_t"], s["restart_t"]
    transitions, active_changes = [], []
    try:
        with open(os.path.join(out, "proxy.log")) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get("event") == "transition" and j.get("backend") == KILLED:
                    transitions.append((iso(j["timestamp"]), j["to"], j.get("side"), j.get("reason")))
                elif j.get("event") == "active_change" and j.get("backend") == KILLED:
                    active_changes.append((iso(j["timestamp"]), j.get("to")))
    except OSError:
        pass
    ev["transitions"] = [(round(t - kill, 4), to, side, reason) for t, to, side, reason in transitions]
    # The active side's own changes while the verdict is held by an ejection ("active_change").
    ev["active_up_after_restart_s"] = None
    for t, to in active_changes:
        if t >= restart and to == "UP":
            ev["active_up_after_restart_s"] = round(t - restart, 4)
            break
    down = next((t for t in transitions if t[0] >= kill and t[1] == "DOWN"), None)
    up = next((t for t in transitions if t[0] >= restart and t[1] == "UP"), None)
    ev["eject_s"] = round(down[0] - kill, 4) if down else None
    ev["eject_by"] = f"{down[2]}: {down[3]}" if down else None
    ev["proxy_readmit_s"] = round(up[0] - restart, 4) if up else None
    dead = retries = 0
    try:
        with open(os.path.join(out, "metrics.txt")) as f:
            for line in f:
                if line.startswith("capataz_requests_total") and f'backend="{KILLED}"' in line and (
                        'class="error"' in line or 'class="5xx"' in line):
                    dead += float(line.split()[-1])
                elif line.startswith("capataz_retries_total"):
                    retries += float(line.split()[-1])
    except OSError:
        pass
    ev["sent_to_dead"] = int(dead)
    ev["proxy_retries"] = int(retries)
    return ev


def haproxy_evidence(out, s):
    ev = {"eject_s": s.get("eject_poll_s"), "proxy_readmit_s": s.get("readmit_poll_s"),
          "eject_by": "stats status (20 ms poll)"}
    try:
        with open(os.path.join(out, "stats.csv")) as f:
            rows = list(csv.reader(f))
        hdr = [h.lstrip("# ") for h in rows[0]]
        col = {h: i for i, h in enumerate(hdr)}
        for r in rows[1:]:
            if len(r) > col["svname"] and r[0] == "be" and r[col["svname"]] == KILLED:
                n = lambda k: int(r[col[k]] or 0)
                ev["sent_to_dead"] = n("econ") + n("eresp")
                ev["proxy_retries"] = n("wretr") + n("wredis")
                ev["wretr"], ev["wredis"] = n("wretr"), n("wredis")
            if len(r) > col["svname"] and r[0] == "be" and r[col["svname"]] == "BACKEND":
                ev["be_wretr"], ev["be_wredis"] = int(r[col["wretr"]] or 0), int(r[col["wredis"]] or 0)
    except (OSError, KeyError, IndexError):
        pass
    # State changes HAProxy printed on stderr, for the record.
    try:
        with open(os.path.join(out, "proxy.log")) as f:
            ev["transitions"] = [l.strip() for l in f if "Server be/b2" in l][:6]
    except OSError:
        pass
    return ev


def nginx_evidence(out, s):
    kill, restart = s["kill_t"], s["restart_t"]
    attempts = []  # (t, failed)
    try:
        with open(os.path.join(out, "access.log")) as f:
            for line in f:
                m = re.match(r'(\S+) (\d+) "([^"]*)" "([^"]*)"', line)
                if not m:
                    continue
                t = float(m.group(1))
                addrs = [a.strip() for a in m.group(3).split(",")]
                stats = [x.strip() for x in m.group(4).split(",")]
                for a, st in zip(addrs, stats):
                    if a == KILLED_ADDR and t >= kill:
                        attempts.append((t, st != "200"))
    except OSError:
        pass
    dead = [a for a in attempts if a[0] < restart + 0.5 and a[1]]
    failed = [a[0] for a in attempts if a[1]]
    third = failed[2] if len(failed) >= 3 else None
    later = [round(t - kill, 3) for t in failed[3:]]
    first_ok = next((t for t, bad in attempts if not bad and t >= restart), None)
    return {"eject_s": round(third - kill, 4) if third else None,
            "eject_by": "3rd failed attempt (max_fails), access log",
            "sent_to_dead": len(dead),
            "failed_attempts_after_eject_s": later[:10],
            "proxy_readmit_s": round(first_ok - restart, 4) if first_ok else None}


def run(variant, out, ticks, clk, hwm):
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    if variant.startswith("capataz"):
        ev = capataz_evidence(out, s)
    elif variant.startswith("haproxy"):
        ev = haproxy_evidence(out, s)
    else:
        ev = nginx_evidence(out, s)
    rss = []
    try:
        with open(os.path.join(out, "rss.txt")) as f:
            rss = [int(l.split()[1]) for l in f if len(l.split()) == 2]
    except OSError:
        pass
    row = {"variant": variant, "out": out}
    row.update({k: s[k] for k in ("requests", "achieved_rps", "errors", "errors_by_kind",
                                  "first_error_after_kill_s", "last_error_after_kill_s",
                                  "slow_over_1s", "latency_p50_ms", "latency_p99_ms",
                                  "latency_max_ms", "killed_served_while_dead",
                                  "readmit_first_response_s", "poll_errors")})
    row.update(ev)
    row["proxy_cpu_us_per_req"] = round(int(ticks) * 1e6 / int(clk) / max(1, s["requests"]), 2)
    row["rss_max_kb"] = max(rss) if rss else None
    row["vmhwm_kb"] = int(hwm)
    print(json.dumps(row))


def fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}{unit}"
    return f"{v}{unit}"


def show(path):
    with open(path) as f:
        r = json.load(f)
    print(f"  {r['variant']:<14} errors {r['errors']:>5} {r['errors_by_kind']}  "
          f"eject {fmt(r.get('eject_s'), 's')} ({r.get('eject_by')})  sent-to-dead {fmt(r.get('sent_to_dead'))}  "
          f"readmit(client) {fmt(r.get('readmit_first_response_s'), 's')} (proxy {fmt(r.get('proxy_readmit_s'), 's')})  "
          f">1s {r['slow_over_1s']}  p99 {fmt(r['latency_p99_ms'], 'ms')}  rps {r['achieved_rps']}  "
          f"cpu {r['proxy_cpu_us_per_req']}us/req  rss max {r['rss_max_kb']} KiB")


def med(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return statistics.median(vals)


def table(res_dir):
    rows = []
    for d in sorted(os.listdir(res_dir)):
        p = os.path.join(res_dir, d, "row.json")
        if os.path.exists(p):
            with open(p) as f:
                rows.append(json.load(f))
    known = ["capataz", "capataz-ej5s", "haproxy", "haproxy-tuned", "nginx"]
    rows.sort(key=lambda r: (known.index(r["variant"]) if r["variant"] in known else len(known), r["out"]))
    order = []
    for r in rows:
        if r["variant"] not in order:
            order.append(r["variant"])
    cols = [("errors", "errors", ""), ("slow_over_1s", ">1s", ""), ("eject_s", "eject", "s"),
            ("sent_to_dead", "to-dead", ""), ("readmit_first_response_s", "readmit", "s"),
            ("proxy_readmit_s", "px-readmit", "s"), ("latency_p99_ms", "p99", "ms"),
            ("latency_max_ms", "max", "ms"), ("achieved_rps", "req/s", ""),
            ("proxy_cpu_us_per_req", "cpu-us/rq", ""), ("rss_max_kb", "rss-KiB", "")]
    print(f"{'variant':<14} {'runs':>4} " + " ".join(f"{h:>10}" for _, h, _ in cols))
    for v in order:
        rs = [r for r in rows if r["variant"] == v]
        cells = []
        for k, _, unit in cols:
            m = med([r.get(k) for r in rs])
            if m is None:
                # e.g. no readmission within the run
                nulls = sum(1 for r in rs if r.get(k) is None)
                cells.append(f"{'none' if nulls else '-':>10}")
            elif isinstance(m, float) and unit == "s":
                cells.append(f"{m:>9.3f}s")
            elif isinstance(m, float):
                cells.append(f"{m:>10.1f}")
            else:
                cells.append(f"{m:>10}")
        print(f"{v:<14} {len(rs):>4} " + " ".join(cells))
    print("# per run (errors by kind; eject evidence):")
    for r in rows:
        print(f"#  {r['variant']:<14} {os.path.basename(r['out'])}: errors {r['errors']} {r['errors_by_kind']}; "
              f"eject {fmt(r.get('eject_s'), 's')} by {r.get('eject_by')}; readmit {fmt(r.get('readmit_first_response_s'), 's')}"
              + (f"; active checks UP again {fmt(r.get('active_up_after_restart_s'), 's')} after restart"
                 if r.get("active_up_after_restart_s") is not None else ""))
    print("# errors: client saw a non-200 or no answer; >1s: requests slower than 1 s; eject: kill -> proxy")
    print("# stops choosing b2; to-dead: requests the proxy sent to the dead b2; readmit: restart -> first")
    print("# 200 from b2 seen by the client ('none': not within the run); px-readmit: the proxy's own view.")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "run":
        run(*sys.argv[2:7])
    elif cmd == "show":
        show(sys.argv[2])
    elif cmd == "table":
        table(sys.argv[2])
