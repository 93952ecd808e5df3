#!/usr/bin/env bash
# cargo-deny, for CI's check of the dependencies (deny.toml: bans, licenses, sources over the
# whole lock file; .ci/run runs it). Built from crates.io at a pinned version with its own lock
# file (`--locked`): 3-4 minutes on two cores, once per machine. Not a test's tool: .ci/test
# leaves it out.
set -Eeuo pipefail
version=0.20.2
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $version" ]; then
    cargo install --locked --quiet cargo-deny --version "$version"
fi
