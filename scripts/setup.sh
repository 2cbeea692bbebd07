#!/usr/bin/env bash
# Set up fhmon on a fresh Debian 12 machine, as root: system packages, then a venv in .venv
# with fhmon and its test tools. Idempotent: a second run only checks.
# Arguments: more Debian packages to install the same way (scripts/test.sh asks for perf).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: run as root (fhmon serves as root; its tests start targets as uid 65534)" >&2
    exit 1
fi

need=()
for pkg in python3 python3-venv python3-pip libseccomp2 ca-certificates "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "setup.sh: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Debian's python3 (3.11 on bookworm): world-executable, so tests can run helpers as uid 65534.
PY=/usr/bin/python3
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
    echo "setup.sh: fhmon needs Python >= 3.11; $PY is $($PY --version)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
    echo "setup.sh: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.fhmon-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup.sh: installing fhmon and its test tools into .venv"
    .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
    touch "$stamp"
fi
echo "setup.sh: ready (.venv/bin/fhmon)"
