#!/usr/bin/env python3
"""bench/stalls.py - how long a proxy's thread is away from its I/O at a time.

Reads `perf script` output of `raw_syscalls:sys_enter`/`sys_exit` (filtered to the epoll_wait
family) and `sched:sched_switch` on the proxy's CPU, recorded by `bench/stalls.sh`, and prints,
for the thread TID: the stretches between an epoll_wait's return and the next epoll_wait call
(the time the event loop spends on the events it got, plus any time the thread was switched
out meanwhile), how many exceed 1, 2, 5 and 10 ms per 10 s, the longest, and for each long
stretch how much of it the thread was off the CPU and who ran instead.

Usage: perf script -F comm,pid,tid,cpu,time,event,trace -i FILE | bench/stalls.py TID [MIN_MS]
Standard library only.
"""

import re
import sys
from collections import Counter

EPOLL = {232, 281, 441}  # epoll_wait, epoll_pwait, epoll_pwait2 (x86_64)
LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
SWITCH = re.compile(r"prev_comm=(.*?) prev_pid=(\d+) .*?==> next_comm=(.*?) next_pid=(\d+)")
WAKEUP = re.compile(r"comm=(.*?) pid=(\d+) prio=")
# Besides the proxy's thread, the wake-up latency of these (the load generator and the
# backends on the other CPU, and the kernel threads that take over loopback packets when a
# CPU's softirq work runs long): a late one makes a tail no proxy caused.
OTHERS = ("openload", "nginx", "ksoftirqd/0", "ksoftirqd/1")


def main():
    tid = int(sys.argv[1])
    min_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    stretches = []  # (start, end, off_cpu_s, Counter of who ran, Counter of syscalls)
    calls = Counter()
    loop_start = None
    off_since = None
    off_total = 0.0
    ran = Counter()
    running_other = None  # (comm, since) on the proxy's CPU while the thread is off it
    first = last = None
    unseen = 0  # switches back in that were not recorded
    woken = {}  # tid -> when it was woken
    wake_lat = {}  # who -> [latencies]
    for line in sys.stdin:
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, t, _cpu, ts, event, rest = m.groups()
        ts = float(ts)
        t = int(t)
        first = ts if first is None else first
        last = ts
        if event in ("sched:sched_wakeup", "sched:sched_waking"):
            w = WAKEUP.search(rest)
            if w:
                wt = int(w.group(2))
                if wt == tid or w.group(1) in OTHERS:
                    woken.setdefault(wt, ts)
            continue
        if event == "sched:sched_switch":
            s = SWITCH.search(rest)
            if not s:
                continue
            prev_comm, prev_pid, next_comm, next_pid = s.group(1), int(s.group(2)), s.group(3), int(s.group(4))
            if next_pid in woken:
                who = "proxy" if next_pid == tid else next_comm
                wake_lat.setdefault(who, []).append(ts - woken.pop(next_pid))
            if prev_pid == tid and " prev_state=R" in rest:
                # Preempted: runnable from now on.
                woken[tid] = ts
            if running_other is not None:
                ran[running_other[0]] += ts - running_other[1]
                running_other = None
            if prev_pid == tid:
                off_since = ts
            if next_pid == tid:
                if off_since is not None and loop_start is not None:
                    off_total += ts - off_since
                off_since = None
            elif off_since is not None and loop_start is not None:
                running_other = (next_comm or "?", ts)
            continue
        if t != tid:
            continue
        if off_since is not None:
            # The thread runs again but its switch back in was not recorded (a lost event, or
            # a task whose switch perf does not see): count the time up to now as switched
            # out, an upper bound.
            if loop_start is not None:
                off_total += ts - off_since
            off_since = None
            unseen += 1
        nr = re.search(r"NR (\d+)", rest)
        if not nr:
            continue
        if int(nr.group(1)) not in EPOLL:
            if event == "raw_syscalls:sys_enter" and loop_start is not None:
                calls[int(nr.group(1))] += 1
            continue
        if event == "raw_syscalls:sys_exit":
            loop_start = ts
            off_total = 0.0
            ran = Counter()
            calls = Counter()
        elif event == "raw_syscalls:sys_enter" and loop_start is not None:
            stretches.append((loop_start, ts, off_total, ran, calls))
            loop_start = None
    if not stretches or first is None:
        print("no stretches found for tid", tid)
        return 1
    span = last - first
    per10 = 10.0 / span if span > 0 else 0.0
    durs = sorted(e - s for s, e, _, _, _ in stretches)
    n = len(durs)

    def pct(p):
        return durs[min(n - 1, int(p * n))] * 1e3

    counts = {ms: sum(1 for d in durs if d > ms / 1e3) for ms in (1, 2, 5, 10)}
    print(
        f"span {span:.2f} s, {n} loop turns; turn ms p50 {pct(0.5):.3f} p99 {pct(0.99):.3f} "
        f"p99.9 {pct(0.999):.3f} max {durs[-1] * 1e3:.2f}"
    )
    print(
        "turns over 1/2/5/10 ms per 10 s: "
        + " ".join(f"{counts[ms] * per10:.1f}" for ms in (1, 2, 5, 10))
    )
    # The same turns less the time the thread was switched out: the proxy's own work (and the
    # interrupts and softirqs that ran in its time), whatever its neighbours did.
    on = sorted(e - s - o for s, e, o, _, _ in stretches)
    print(
        "turns on the CPU over 1/2/5/10 ms per 10 s: "
        + " ".join(f"{sum(1 for d in on if d > ms / 1e3) * per10:.1f}" for ms in (1, 2, 5, 10))
        + f"; longest {on[-1] * 1e3:.2f} ms"
    )
    for who in sorted(wake_lat, key=lambda w: w != "proxy"):
        lat = sorted(wake_lat[who])
        k = len(lat)
        print(
            f"runnable to running, {who}: {k} times, p99 {lat[min(k - 1, int(0.99 * k))] * 1e3:.3f} ms, "
            f"max {lat[-1] * 1e3:.2f} ms, over 1/2/5 ms per 10 s: "
            + " ".join(f"{sum(1 for d in lat if d > ms / 1e3) * per10:.1f}" for ms in (1, 2, 5))
            + f", {sum(lat) * 1e3:.0f} ms in all"
        )
    when = [f"{s - first:.2f}" for s, e, o, _, _ in stretches if (e - s - o) * 1e3 > min_ms]
    if when:
        print(f"turns on the CPU over {min_ms:g} ms, at (s): " + " ".join(when[:40]))
    if unseen:
        print(f"switches back in not recorded: {unseen} (their time counted as switched out)")
    switched = sum(o for _, _, o, _, _ in stretches)
    print(f"switched out during turns: {switched * 1e3:.1f} ms in all")
    long = [x for x in stretches if (x[1] - x[0]) * 1e3 > min_ms]
    long_time = sum(e - s for s, e, _, _, _ in long)
    long_off = sum(o for _, _, o, _, _ in long)
    print(
        f"turns over {min_ms:g} ms: {len(long)}, {long_time * 1e3:.1f} ms in all, "
        f"{long_off * 1e3:.1f} ms of it off the CPU"
    )
    who = Counter()
    for _, _, _, r, _ in long:
        who.update(r)
    if who:
        print("  ran instead: " + ", ".join(f"{c} {t * 1e3:.1f} ms" for c, t in who.most_common(6)))
    for s, e, o, _, c in sorted(stretches, key=lambda x: x[0] + x[2] - x[1])[:8]:
        sc = " ".join(f"{k}x{v}" for k, v in c.most_common(6))
        print(f"  on CPU at {s - first:7.3f} s ({s:.6f}): {(e - s - o) * 1e3:6.2f} ms (turn {(e - s) * 1e3:.2f} ms) syscalls {sc}")
    for s, e, o, r, _ in sorted(long, key=lambda x: x[0] - x[1])[:8]:
        others = ", ".join(f"{c} {t * 1e3:.2f}" for c, t in r.most_common(3))
        print(f"  at {s - first:7.3f} s ({s:.6f}): {(e - s) * 1e3:6.2f} ms, off CPU {o * 1e3:5.2f} ms {others}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
