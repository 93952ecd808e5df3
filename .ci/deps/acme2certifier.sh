#!/usr/bin/env bash
# The ACME Renewal Information test (crates/capataz/tests/it/acme/ari.rs) orders from
# acme2certifier, a real ACME server in Python whose directory has `renewalInfo` (RFC 9773;
# Debian's pebble has none), with its OpenSSL CA handler. From PyPI at a pinned version, into a
# venv of its own at /opt/acme2certifier made by Debian's python3 (never pip into Debian's
# python itself); the test runs it under the standard library's WSGI server.
set -Eeuo pipefail
version=0.46.3
venv=/opt/acme2certifier
installed=$("$venv/bin/python" -c \
    'import importlib.metadata as m; print(m.version("acme2certifier"))' 2>/dev/null || true)
if [ "$installed" != "$version" ]; then
    if ! /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null; then
        .ci/apt-install python3-venv
    fi
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "acme2certifier==$version"
fi
