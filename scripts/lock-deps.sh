#!/bin/sh
# Regenerate deploy/requirements.lock: every runtime dependency of pyproject.toml pinned to
# one version, with the sha256 of each of its files on PyPI, for the image's Python (3.11).
# deploy/Containerfile installs from it with --require-hashes. Run after changing
# [project] dependencies; tests/deploy checks that the lock covers them.
set -eu
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$python" -m venv "$tools"
"$tools/bin/pip" install --quiet --index-url https://pypi.org/simple pip-tools
# PyPI only (no local find-links), so the hashes are those of the files the image downloads.
env -u PIP_FIND_LINKS "$tools/bin/pip-compile" --quiet --generate-hashes --strip-extras \
    --index-url https://pypi.org/simple --no-emit-index-url --no-emit-find-links \
    --output-file deploy/requirements.lock pyproject.toml
