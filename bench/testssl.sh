#!/usr/bin/env bash
# bench/testssl.sh - Debian's testssl.sh against a capataz TLS listener with default settings.
#
# Starts `capataz demo --tls` (a TLS listener with every `[listeners.tls]` default and the
# demo's self-signed ECDSA P-256 certificate) on loopback, runs testssl.sh against it, and
# lists every finding of severity HIGH or CRITICAL; exits 1 if there is one about capataz's
# TLS settings. Findings about the certificate itself (`cert_*`: the demo's is self-signed, so
# "chain of trust" is CRITICAL, and it names no CRL or OCSP URI) are listed apart: they come
# with whatever certificate the operator configures, not from capataz.
#   bench/testssl.sh            # needs: apt-get install testssl.sh (installed if apt-get is there)
set -Eeuo pipefail
cd "$(dirname "$0")/.."
if ! command -v testssl >/dev/null; then
    apt-get update -qq && apt-get install -y -qq testssl.sh >/dev/null
fi
cargo build --quiet --bin capataz
port=${PORT:-18443}
out=$(mktemp -d)
trap 'kill "$demo" 2>/dev/null || true; rm -rf "$out"' EXIT
target/debug/capataz demo --listen 127.0.0.1:0 --admin 127.0.0.1:0 --rate 0 \
    --tls "127.0.0.1:$port" --duration 900 >"$out/demo.log" 2>&1 &
demo=$!
for _ in $(seq 100); do
    grep -qs '^TLS: https://' "$out/demo.log" && break
    sleep 0.1
done
testssl --quiet --color 0 --warnings batch --jsonfile "$out/testssl.json" \
    "127.0.0.1:$port" >"$out/testssl.txt" || true
python3 - "$out/testssl.json" <<'PY'
import json, sys
findings = json.load(open(sys.argv[1]))
severe = [f for f in findings if f.get("severity") in ("HIGH", "CRITICAL")]
trust = [f for f in severe if f["id"].startswith("cert_")]
other = [f for f in severe if f not in trust]
print(f"testssl.sh: {len(findings)} findings, {len(other)} HIGH/CRITICAL "
      f"about the TLS settings (plus {len(trust)} about the demo's self-signed certificate)")
for f in trust:
    print(f"  (certificate) {f['severity']:8} {f['id']}: {f['finding']}")
for f in other:
    print(f"  {f['severity']:8} {f['id']}: {f['finding']}")
sys.exit(1 if other else 0)
PY
