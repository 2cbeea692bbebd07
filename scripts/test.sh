#!/usr/bin/env bash
# One command: set up, then run every test (unit, kernel, adversarial, deploy, end-to-end).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`); without any,
# the kernel, adversarial and end-to-end suites run a second time against the Python
# reference data plane (the default is the native one), so both answer the same tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# linux-perf: for the benchmark's CPU split (bench.run --perf and its smoke test);
# mmdebstrap, umoci: the image build (scripts/build-image.sh) that tests/deploy runs under runc
bash scripts/setup.sh linux-perf mmdebstrap umoci
if [ -x tests/e2e/env/prepare.sh ] || [ -f tests/e2e/env/prepare.sh ]; then
    bash tests/e2e/env/prepare.sh
fi
.venv/bin/ruff check monitor protocol tests bench build_backend
bash scripts/rust_checks.sh
.venv/bin/mypy monitor protocol build_backend
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
fi
.venv/bin/python -m pytest -p no:cacheprovider tests
echo "test.sh: the kernel, adversarial and e2e suites again, on the Python reference plane"
FHMON_TEST_CONFIG="$PWD/tests/configs/python-plane.toml" \
    exec .venv/bin/python -m pytest -p no:cacheprovider tests/kernel tests/adversarial tests/e2e
