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
# python3-dev: the Python headers, for building the Rust extension (monitor._native);
# libc6-dev: glibc's libc.a, for the static launcher (scripts/build-launcher.sh);
# runc: the OCI runtime the KubeVirt tests run the injected pod's containers under
for pkg in python3 python3-venv python3-pip python3-dev libc6-dev libseccomp2 ca-certificates \
        runc "$@"; do
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

# The data plane (native/) is a Rust extension built by maturin during `pip install`: it
# needs cargo and rustc new enough for the crate's edition (Debian 12's own cargo is too old).
RUST_MIN=1.85
if [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
    PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi
if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
    echo "setup.sh: cargo and rustc >= $RUST_MIN are missing; fhmon's data plane (native/) is" \
         "Rust. Install them with rustup (https://rustup.rs: 'curl -sSf https://sh.rustup.rs | sh')" \
         "and run setup.sh again." >&2
    exit 1
fi
rust_version=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$RUST_MIN" "${rust_version%%-*}" | sort -V | head -1)" != "$RUST_MIN" ]; then
    echo "setup.sh: rustc $rust_version is too old for native/ (needs >= $RUST_MIN);" \
         "run 'rustup update stable'." >&2
    exit 1
fi
if ! "$PY" -c 'import sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)'; then
    echo "setup.sh: the Python headers (Python.h) are missing: apt-get install python3-dev" >&2
    exit 1
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup.sh: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.fhmon-installed
# This install's extension carries the test hooks (the crate's cargo feature test-hooks:
# KeyRing.cost, Plane.panic_next_calls, which the tests and bench/levers.py call); a plain
# `pip install .` or `pip wheel .` (deploy/Containerfile) builds the release one, without.
# maturin's --features replaces pyproject.toml's [tool.maturin] features: they are repeated.
dev_features="pyo3/extension-module,test-hooks"
# Rebuild when the build recipe or the crate changed (an editable install does not rebuild
# Rust by itself; the crate compiles in protocol/refusals.toml, native/build.rs), or when
# the extension there lacks the hooks (a `pip install -e .` since).
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
        || [ -n "$(find native/src native/build.rs native/Cargo.toml native/Cargo.lock \
            protocol/refusals.toml -newer "$stamp" 2>/dev/null | head -1)" ] \
        || ! .venv/bin/python -c 'import sys, monitor._native as n; sys.exit(not n.TEST_HOOKS)' 2>/dev/null; then
    echo "setup.sh: installing fhmon and its test tools into .venv"
    .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
    MATURIN_PEP517_ARGS="${MATURIN_PEP517_ARGS:+$MATURIN_PEP517_ARGS }--features $dev_features" \
        .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
    touch "$stamp"
fi
# The native launcher (native/launcher): `fhmon launch` execs it, and `fhmon install-launcher`
# copies it into KubeVirt's pods (scripts/build-launcher.sh says how it is built).
launcher=monitor/_bin/fhmon-launch
if [ ! -x "$launcher" ] \
        || [ -n "$(find native/src native/build.rs native/launcher native/Cargo.toml \
            native/Cargo.lock protocol/refusals.toml -newer "$launcher" 2>/dev/null | head -1)" ]; then
    echo "setup.sh: building the native launcher ($launcher)"
    bash scripts/build-launcher.sh
fi
echo "setup.sh: ready (.venv/bin/fhmon)"
