import json, re, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
def norm_client(c):
    if isinstance(c, str):
        c = re.sub(r"date: [^\r]*\r\n", "date: X\r\n", c)
        c = re.sub(r"x-request-id: [^\r]*", "x-request-id: X", c)
        return c
    return c
def nb(conns):
    return sorted(re.sub(r"sec-websocket-key: \S+", "sec-websocket-key: K", c) for c in conns)
def norm_client(c, _orig=norm_client):
    c = _orig(c)
    if isinstance(c, list):
        # frames per stream, in order within a stream
        per = {}
        for f in c:
            if isinstance(f, list) and f[0] in ("HEADERS", "DATA", "RST"): per.setdefault(f[1], []).append(f)
            else: per.setdefault("conn", []).append(f)
        return sorted(per.items(), key=str)
    return c
def norm_log(l):
    out = []
    for line in l.splitlines():
        try: d = json.loads(line)
        except Exception: out.append(line); continue
        for k in list(d):
            if k in ("client_port", "duration", "time", "ts", "request_id", "connect", "ttfb", "upstream_duration", "start") or "ms" in k or "time" in k or "duration" in k or "_at" in k:
                d.pop(k)
        out.append(d)
    return out
def norm_status(s):
    try: d = json.loads(s)
    except Exception: return s
    res = []
    for p in d["pools"]:
        for be in p["backends"]:
            pas = dict(be["passive"]); ej = dict(pas.get("ejection") or {}); ej.pop("since", None); ej.pop("until", None); pas["ejection"] = ej
            res.append({"state": be["state"], "history": be["history"]["traffic"], "passive": pas, "explain": re.sub(r"next probe in \d+ ms", "", re.sub(r"\d\d:\d\d:\d\d", "T", be["explain"])), "active": (be["active"]["last_probe"] or {}).get("outcome")})
    return res
def norm_metrics(m):
    keep = []
    for line in m.splitlines():
        if line.startswith("#"): continue
        if "seconds" in line or "process_" in line or "uptime" in line or "_created" in line or "start_time" in line or "bytes" in line or "build_info" in line: continue
        keep.append(line)
    return sorted(keep)
diffs = 0
for name in a:
    if name not in b: print("MISSING in new:", name); continue
    x, y = a[name], b[name]
    parts = {
        "client": (norm_client(x["client"]), norm_client(y["client"])),
        "backend": (nb(x["backend"]), nb(y["backend"])),
        "log": (norm_log(x["log"]), norm_log(y["log"])),
        "status": (norm_status(x["status"]), norm_status(y["status"])),
        "metrics": (norm_metrics(x["metrics"]), norm_metrics(y["metrics"])),
    }
    for part, (p, q) in parts.items():
        if p != q:
            diffs += 1
            print(f"=== {name} [{part}]")
            if part == "metrics":
                sp, sq = set(p), set(q)
                print(" old only:", sorted(sp - sq)[:20]); print(" new only:", sorted(sq - sp)[:20])
            else:
                print(" old:", json.dumps(p)[:1500]); print(" new:", json.dumps(q)[:1500])
print("cases compared:", len(a), "differences:", diffs)
