#!/usr/bin/env bash
# cargo-deny, for CI's check of the dependencies (deny.toml: bans, licenses, sources over the
# whole lock file; .ci/run runs it). Built from crates.io at a pinned version with its own lock
# file (`--locked`), once per machine. `--debug`: unoptimised, 2m26s to build on two cores
# (1m35s of CPU) against 4m02s (3m16s) for its release profile (fat LTO), and the check then
# takes 3 s instead of 1. Not a test's tool: .ci/test leaves it out.
set -Eeuo pipefail
version=0.20.2
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $version" ]; then
    cargo install --locked --debug --quiet cargo-deny --version "$version"
fi
