#!/usr/bin/env bash
# bench/paired.sh RESULTS_DIR - capataz against each peer of a run of the shared harness
# (../shared/bench/peers.sh, or bench/peers.sh, which calls this at its end), HAProxy first,
# round by round: each round runs the targets back to back, so a round that lands in a busy
# minute of the host weighs on both. Prints the median of the per-round ratios (req/s, p99, CPU
# per request) and how many rounds capataz won, for each peer that has rounds in
# RESULTS_DIR/results.tsv (the directory the harness prints as "raw:").
set -Eeuo pipefail
res=${1:?usage: bench/paired.sh RESULTS_DIR}
[[ -f $res/results.tsv ]] || { echo "bench/paired.sh: no $res/results.tsv" >&2; exit 1; }
for peer in haproxy nginx pingora caddy; do
    awk -F'\t' -v peer="$peer" '
    $2 == peer || $2 == "extra" { v[$1, $3, $2] = $4 " " $8 " " $13; conns[$1]; rounds[$1, $3] }
    function median(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
        return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
    }
    END {
        names["haproxy"] = "HAProxy"; names["nginx"] = "nginx"; names["pingora"] = "Pingora"; names["caddy"] = "Caddy"
        header = 0
        for (c in conns) {
            n = 0; wr = 0; wc = 0; wp = 0
            for (k in rounds) {
                split(k, kc, SUBSEP); if (kc[1] != c) continue
                if (!((c, kc[2], peer) in v) || !((c, kc[2], "extra") in v)) continue
                split(v[c, kc[2], peer], h, " "); split(v[c, kc[2], "extra"], x, " ")
                if (h[1] <= 0 || h[2] <= 0 || h[3] <= 0) continue
                n++; r[n] = x[1] / h[1]; p[n] = x[2] / h[2]; u[n] = x[3] / h[3]
                wr += (x[1] > h[1]); wp += (x[2] <= h[2]); wc += (x[3] < h[3])
            }
            if (n && !header++) printf "# capataz / %s, round by round (median of the per-round ratios; rounds capataz won)\n", names[peer]
            if (n) printf "conns %-4s rounds %2d   req/s %.2fx (more in %d)   p99 %.2fx (lower or equal in %d)   CPU/req %.2fx (less in %d)\n", c, n, median(r, n), wr, median(p, n), wp, median(u, n), wc
        }
    }' "$res/results.tsv"
done
