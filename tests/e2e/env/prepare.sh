#!/usr/bin/env bash
# Prepare the e2e environment (QEMU, trixie's virtiofsd, a Debian kernel, a busybox initramfs)
# into $FHMON_E2E_CACHE (default /var/cache/fhmon-e2e). Idempotent; offline once cached.
# The work is done by prepare.py (stdlib only), run with Debian's own python3.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py=/usr/bin/python3
[ -x "$py" ] || py="$(command -v python3)"
exec "$py" "$here/prepare.py" "$@" >/dev/null
