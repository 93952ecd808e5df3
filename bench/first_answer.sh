#!/usr/bin/env bash
# The newcomer's first command: from the README's `cargo run --no-default-features -- demo` on a
# fresh target directory (crates already downloaded, as after a first `cargo fetch`) to the
# demo's first answer on 127.0.0.1:8080.
#
# Usage: bench/first_answer.sh [FEATURE ARGS...]   (default: --no-default-features)
#   e.g. bench/first_answer.sh --release           (the old command, with jemalloc)
#
# It builds with `cargo build --timings ARGS` in a new temporary target directory (timed: wall
# clock, and the CPU time of cargo and everything it ran), then starts `cargo run ARGS -- demo`
# (nothing left to build) and polls `curl 127.0.0.1:8080/` every 0.2 s; the figure is from the
# start of the build to the first answer (any HTTP answer). It stops the demo by its PID
# (SIGINT, as Ctrl-C) and removes the target directory, keeping cargo's timing report in
# /tmp/capataz-first-answer-timings.html. Nothing else may listen on 8080 or 9901.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--no-default-features)
if ss -ltn | grep -qE ':(8080|9901) '; then
    echo "first_answer: 127.0.0.1:8080 or :9901 is in use; stop what listens there" >&2
    exit 1
fi
export CARGO_TARGET_DIR
CARGO_TARGET_DIR=$(mktemp -d /tmp/capataz-first-answer.XXXXXX)
log=$CARGO_TARGET_DIR.log
demo=
cleanup() {
    if [ -n "$demo" ] && kill -0 "$demo" 2>/dev/null; then
        kill -INT "$demo"
        wait "$demo" || true
    fi
    rm -rf "$CARGO_TARGET_DIR" "$log"
}
trap cleanup EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s%N)
TIMEFORMAT='build: %R s wall, %U s user + %S s system CPU'
time cargo build --timings "${args[@]}" >"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
cp "$CARGO_TARGET_DIR"/cargo-timings/cargo-timing.html /tmp/capataz-first-answer-timings.html
# cargo run replaces itself with the binary: $! is the demo's PID.
cargo run "${args[@]}" -- demo >>"$log" 2>&1 &
demo=$!
until curl -s -o /dev/null --max-time 2 http://127.0.0.1:8080/; do
    kill -0 "$demo" 2>/dev/null || { echo "the demo exited:" >&2; tail -20 "$log" >&2; exit 1; }
    sleep 0.2
done
end=$(date +%s%N)
elapsed=$(( (end - start) / 100000000 ))
echo "first answer $((elapsed / 10)).$((elapsed % 10)) s after the build of \`cargo run ${args[*]} -- demo\` started (fresh target dir)"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
