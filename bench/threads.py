#!/usr/bin/env python3
"""bench/threads.py - per-thread CPU, run-queue wait and switches, for bench/threads.sh.

threads.py SNAPFILE WRKOUT: from two snapshots ("a" and "b" lines: label tid comm run_ns
wait_ns slices voluntary involuntary, then a "ticks" line with the time) of
/proc/PID/task/TID/schedstat and status, each thread's share of a CPU it ran, the share it
waited runnable, its slices, switches per second, and wrk's req/s and latency percentiles.

threads.py --perf SNAPFILE < perf script output (sched_switch, sched_waking): per thread of the
snapshot, how long it waited from its wake-up (or from being preempted) to running: count, p50,
p90, p99, max; how long it ran at a time; on which CPUs.
Standard library only.
"""

import re
import sys
from collections import Counter, defaultdict


def read_snap(path):
    snaps = {"a": {}, "b": {}}
    times = []
    for line in open(path):
        f = line.split()
        if f[0] == "ticks":
            times.append(float(f[1]))
        elif len(f) == 8:
            snaps[f[0]][f[1]] = (f[2], *map(int, f[3:]))
    return snaps, times


def group(comm):
    if comm.startswith("wrk"):
        return "wrk"
    if comm.startswith("nginx"):
        return "backend"
    return "proxy"


def wrk_line(path):
    txt = open(path).read()
    rps = re.search(r"Requests/sec:\s+([\d.]+)", txt)
    pct = dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)", txt, re.M))
    return f"wrk: {rps.group(1) if rps else '?'} req/s, p50 {pct.get('50')}, p90 {pct.get('90')}, p99 {pct.get('99')}"


def snapshot(path, wrk):
    snaps, times = read_snap(path)
    span = times[1] - times[0]
    print(wrk_line(wrk))
    rps = re.search(r"Requests/sec:\s+([\d.]+)", open(wrk).read())
    proxy_ns = sum(
        b[1] - snaps["a"][tid][1] for tid, b in snaps["b"].items() if tid in snaps["a"] and group(b[0]) == "proxy"
    )
    if rps:
        print(f"proxy CPU per request (its threads' run time / wrk's rate): {proxy_ns / 1e3 / span / float(rps.group(1)):.2f} us")
    print(f"{'tid':>8} {'comm':16} {'cpu%':>6} {'waited%':>8} {'slices/s':>9} {'wait/slice us':>13} {'vol/s':>8} {'invol/s':>8}")
    for tid, b in snaps["b"].items():
        a = snaps["a"].get(tid)
        if a is None:
            continue
        comm = b[0]
        run, wait, sl, vol, inv = (b[i] - a[i] for i in range(1, 6))
        if run < span * 1e9 * 0.001:
            continue  # idle threads (under 0.1 % of a CPU)
        print(
            f"{tid:>8} {comm:16} {run / span / 1e7:6.1f} {wait / span / 1e7:8.1f} {sl / span:9.0f} "
            f"{(wait / sl / 1e3) if sl else 0:13.1f} {vol / span:8.0f} {inv / span:8.0f}"
        )


LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
SWITCH = re.compile(r"prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)")
WAKING = re.compile(r"comm=(.*?) pid=(\d+) prio=\d+ target_cpu=(\d+)")


SPAN = [1.0]


def pcts(xs):
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return "-"
    p = lambda q: xs[min(n - 1, int(q * n))] * 1e6
    over = lambda ms: sum(1 for x in xs if x > ms / 1e3) / SPAN[0]
    return (
        f"{n:6d} p50 {p(0.5):7.0f} p90 {p(0.9):7.0f} p99 {p(0.99):7.0f} max {xs[-1] * 1e6:7.0f}; "
        f"over 0.5/1/2 ms per s {over(0.5):5.1f} {over(1):5.1f} {over(2):5.1f}"
    )


def perf(path):
    snaps, _ = read_snap(path)
    comms = {int(t): v[0] for t, v in snaps["b"].items()}
    ready = {}  # tid -> when it became runnable
    since = {}  # tid -> when it started running
    waits = defaultdict(list)
    wake_waits = defaultdict(list)
    runs = defaultdict(list)
    cpus = defaultdict(Counter)
    first = last = None
    # Who ran on a CPU while one of ours waited for it (time, by comm), per group.
    ran_instead = defaultdict(Counter)
    current = {}  # cpu -> (comm, since)
    idle_spans = defaultdict(list)
    for line in sys.stdin:
        m = LINE.match(line)
        if not m:
            continue
        _comm, _pid, _tid, cpu, ts, event, rest = m.groups()
        ts = float(ts)
        cpu = int(cpu)
        first = ts if first is None else first
        last = ts
        if event == "sched:sched_waking":
            w = WAKING.search(rest)
            if w and int(w.group(2)) in comms:
                ready.setdefault(int(w.group(2)), (ts, "wake"))
        elif event == "sched:sched_wakeup":
            # The CPU the wake-up chose, and whether it was idle then (a vCPU in halt).
            w = WAKING.search(rest)
            if w and int(w.group(2)) in comms and int(w.group(2)) in ready:
                t0, _ = ready[int(w.group(2))]
                target = int(w.group(3))
                idle = current.get(target, ("swapper",))[0].startswith("swapper")
                # Placed on a busy CPU while another CPU is idle: the wait a packing scheduler
                # makes.
                other_idle = any(c != target and v[0].startswith("swapper") for c, v in current.items())
                why = "idle" if idle else ("busy, another idle" if other_idle else "busy")
                ready[int(w.group(2))] = (t0, why)
        elif event == "sched:sched_switch":
            s = SWITCH.search(rest)
            if not s:
                continue
            prev, state, nxt = int(s.group(2)), s.group(3), int(s.group(5))
            if cpu in current:
                c, t0 = current[cpu]
                waiting = {group(comms[t]) for t in ready if t in comms}
                for g in waiting:
                    ran_instead[g][c] += ts - t0
            if cpu in current and current[cpu][0].startswith("swapper"):
                idle_spans[cpu].append(ts - current[cpu][1])
            current[cpu] = (s.group(4), ts)
            if prev in comms:
                if prev in since:
                    runs[prev].append(ts - since.pop(prev))
                if state.startswith("R"):
                    ready[prev] = (ts, "preempt")
            if nxt in comms:
                cpus[nxt][cpu] += 1
                since[nxt] = ts
                if nxt in ready:
                    t0, why = ready.pop(nxt)
                    waits[nxt].append(ts - t0)
                    if why != "preempt":
                        wake_waits[nxt, why].append(ts - t0)
    SPAN[0] = last - first
    for cpu in sorted(idle_spans):
        print(f"CPU {cpu} idle: {sum(idle_spans[cpu]) * 1e3:.0f} ms in {len(idle_spans[cpu])} spans: {pcts(idle_spans[cpu])} us")
    print(f"perf: {last - first:.2f} s; waits from runnable (woken or preempted) to running, us:")
    for tid in sorted(waits, key=lambda t: (group(comms[t]), t)):
        print(f"  {tid:>8} {comms[tid]:16} all {pcts(waits[tid])}")
        print(f"  {'':>8} {'':16} woken, CPU busy {pcts(wake_waits[tid, 'busy'])}")
        print(f"  {'':>8} {'':16} woken, CPU idle {pcts(wake_waits[tid, 'idle'])}")
        print(f"  {'':>8} {'':16} woken, busy, another idle {pcts(wake_waits[tid, 'busy, another idle'])}")
        print(f"  {'':>8} {'':16} ran {pcts(runs[tid])}; on CPU " + " ".join(f"{c}:{k}" for c, k in sorted(cpus[tid].items())))
    for g, c in ran_instead.items():
        print(f"  while a {g} thread waited, ran: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in c.most_common(6)))


if __name__ == "__main__":
    if sys.argv[1] == "--perf":
        perf(sys.argv[2])
    else:
        snapshot(sys.argv[1], sys.argv[2])
