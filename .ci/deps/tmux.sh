#!/usr/bin/env bash
# The `capataz top` terminal test (crates/capataz/tests/it/top_screen.rs) runs it in a tmux
# window of 80x24 and reads the screen with `capture-pane`; it fails without tmux.
set -Eeuo pipefail
if ! command -v tmux >/dev/null; then
    .ci/apt-install tmux
fi
