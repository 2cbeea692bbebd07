#!/usr/bin/env bash
# Build the native launcher (native/launcher, `fhmon-launch`) into monitor/_bin/, where
# `fhmon launch` execs it, `fhmon install-launcher` copies it from, and the wheel takes it
# (pyproject.toml's include). Static (glibc's libc.a, +crt-static) so that it runs in any
# image, KubeVirt's included. Run by the build backend (build_backend/fhmon_build.py) before
# maturin, so that a plain `pip install .` builds it; by scripts/setup.sh on a rebuild.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
flags_var="CARGO_TARGET_$(echo "$host" | tr 'a-z.-' 'A-Z__')_RUSTFLAGS"
(cd native && env "$flags_var=-C target-feature=+crt-static" \
    cargo build --quiet --locked --profile launcher -p fhmon-launch --target "$host")
mkdir -p monitor/_bin
# cargo's target directory: native/target, or CARGO_TARGET_DIR (relative to native/, as cargo ran)
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=native/$target ;; esac
install -m 0755 "$target/$host/launcher/fhmon-launch" monitor/_bin/fhmon-launch
