#!/usr/bin/env bash
# vendor/h2 is h2 $VERSION as published on crates.io with the patches in vendor/h2/patches/
# applied in order (CAPATAZ.md says what each changes and why). This script rebuilds that tree
# from the pinned upstream crate (the steps are vendor/reapply-common.sh, shared with
# vendor/hyper/reapply.sh):
#
#   vendor/h2/reapply.sh check   upstream + patches must equal vendor/h2 (CI runs this)
#   vendor/h2/reapply.sh apply   vendor/h2 := upstream + patches (on an upgrade: set VERSION and
#                                SHA256 first; a patch that no longer applies stops it)
#   vendor/h2/reapply.sh diff    patches/*.patch := vendor/h2 - upstream, each patch over the
#                                files it already names (its description kept), in order: a
#                                file named by several patches is rewritten in the last of them
#
# The upstream crate is the `.crate` file in cargo's download cache; if it is not there yet,
# `cargo fetch` downloads it from crates.io (cargo checks it against the index's checksum), and
# this script checks its SHA-256 against SHA256 below either way. Nothing else is downloaded.
set -Eeuo pipefail

NAME=h2
VERSION=0.4.20
# crates.io's checksum of h2-0.4.20.crate (the `cksum` of its index entry; git commit
# b0e890842ac16d3c76836fd4fcc06421acb15fa7 of hyperium/h2, tag v0.4.20).
SHA256=7d29020232d6aa3fb1daca64c1127cf662cf97f254ae16c18c05b8ab635fc118
# Files of the published crate that are not vendored (examples, benches and their tables in
# Cargo.toml are dropped by patches/0003; none of them is built).
NOT_VENDORED=(.cargo_vcs_info.json .github .gitignore CHANGELOG.md CONTRIBUTING.md
    Cargo.toml.orig benches examples)
# capataz's own files in vendor/h2, not part of the comparison. (Cargo.lock is compared apart:
# upstream's, less what cargo drops with the dev-dependencies that patches/0003 removes.)
OURS=(CAPATAZ.md UPSTREAM.md UPSTREAM-instructions.md reapply.sh patches target Cargo.lock)

# shellcheck source=../reapply-common.sh
source "$(dirname "$0")/../reapply-common.sh"
