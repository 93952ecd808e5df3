#!/usr/bin/env bash
# vendor/hyper is hyper $VERSION as published on crates.io with the patches in vendor/hyper/patches/
# applied in order (CAPATAZ.md says what each changes and why). This script rebuilds that tree
# from the pinned upstream crate (the steps are vendor/reapply-common.sh, shared with
# vendor/h2/reapply.sh):
#
#   vendor/hyper/reapply.sh check   upstream + patches must equal vendor/hyper (CI runs this)
#   vendor/hyper/reapply.sh apply   vendor/hyper := upstream + patches (on an upgrade: set VERSION and
#                                  SHA256 first; a patch that no longer applies stops it)
#   vendor/hyper/reapply.sh diff    patches/*.patch := vendor/hyper - upstream, each patch over the
#                                  files it already names (its description kept), in order: a
#                                  file named by several patches is rewritten in the last of them
#
# The upstream crate is the `.crate` file in cargo's download cache; if it is not there yet,
# `cargo fetch` downloads it from crates.io (cargo checks it against the index's checksum), and
# this script checks its SHA-256 against SHA256 below either way. Nothing else is downloaded.
set -Eeuo pipefail

NAME=hyper
VERSION=1.12.0
# crates.io's checksum of hyper-1.12.0.crate (the `cksum` of its index entry, and Cargo.lock's;
# git commit 7f67699ce32d717081deb7018b4da7d679277ac0 of hyperium/hyper, tag v1.12.0).
SHA256=2c3e324da4c95177d6291d4c8730197c0d1822f8a9766814a4a44fa5ab797c9c
# Files of the published crate that are not vendored (it ships no examples, benches or tests).
NOT_VENDORED=(.cargo_vcs_info.json Cargo.toml.orig)
# capataz's own files in vendor/hyper, not part of the comparison. (Cargo.lock is compared
# apart: it is upstream's, unchanged.)
OURS=(CAPATAZ.md reapply.sh patches target Cargo.lock)
# shellcheck source=../reapply-common.sh
source "$(dirname "$0")/../reapply-common.sh"
