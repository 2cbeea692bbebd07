#!/usr/bin/env bash
# One command: set up, then run fhmon in the foreground on its embedded default
# (everything under /var/lib/fhmon; it prints where). Extra arguments go to `fhmon serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/fhmon serve "$@"
