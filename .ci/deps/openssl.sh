#!/usr/bin/env bash
# The OCSP stapling tests (crates/capataz/tests/it/ocsp.rs) run OpenSSL's OCSP responder
# (`openssl ocsp -index`), make responses with it and read what capataz staples with
# `openssl s_client -status`; without it they fail under CI.
set -Eeuo pipefail
if ! command -v openssl >/dev/null; then
    .ci/apt-install openssl
fi
