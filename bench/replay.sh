#!/usr/bin/env bash
# bench/replay.sh - throughput and memory of `capataz replay` on a generated probe log.
#
# Generates a deterministic 10-million-line script over 1,000 backends (70 % PROBE, 30 % OBSERVE),
# then runs, interleaved, REPEATS times each:
#   peer     `wc -l` over the same file: the cost of just reading it, the I/O ceiling;
#   capataz  `capataz replay FILE > /dev/null`, pinned to one core.
# Prints the median wall time of each, capataz's commands per second, the ratio to the peer,
# and capataz's peak resident memory (which must not grow with the input).
#
# Usage: bench/replay.sh [LINES] [REPEATS]     (defaults 10000000 and 5)
set -Eeuo pipefail
cd "$(dirname "$0")/.."
LINES=${1:-10000000} REPEATS=${2:-5}
SCRIPT=${RUN_DIR:-/tmp}/capataz-replay-$LINES.txt

cargo build --release --quiet --bin capataz --example replay_script
BIN=target/release/capataz
if [[ ! -s $SCRIPT ]]; then
    target/release/examples/replay_script "$LINES" 1000 > "$SCRIPT"
fi
echo "script: $SCRIPT ($(wc -l < "$SCRIPT") lines, $(du -h "$SCRIPT" | cut -f1))"
cat "$SCRIPT" > /dev/null   # warm the page cache

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
now() { date +%s.%N; }
calc() { awk "BEGIN { print $* }"; }
peer=() capataz=() rss=()
for ((i = 0; i < REPEATS; i++)); do
    t0=$(now); taskset -c 0 wc -l "$SCRIPT" > /dev/null; t1=$(now)
    peer+=("$(calc "$t1 - $t0")")
    t0=$(now)
    /usr/bin/time -f %M -o /tmp/capataz-replay-rss taskset -c 0 "$BIN" replay "$SCRIPT" > /dev/null
    t1=$(now)
    capataz+=("$(calc "$t1 - $t0")")
    rss+=("$(cat /tmp/capataz-replay-rss)")
done
p=$(printf '%s\n' "${peer[@]}" | median)
c=$(printf '%s\n' "${capataz[@]}" | median)
m=$(printf '%s\n' "${rss[@]}" | median)
printf 'wc -l (peer)     median %.3f s\n' "$p"
printf 'capataz replay   median %.3f s  = %.2f M commands/s, %.1fx the peer'"'"'s time, peak RSS %d KiB\n' \
    "$c" "$(calc "$LINES / $c / 1000000")" "$(calc "$c / $p")" "$m"
