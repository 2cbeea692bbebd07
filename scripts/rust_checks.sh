#!/usr/bin/env bash
# The Rust crates' own checks: rustfmt, clippy (warnings denied), cargo test (units and the
# bounded property loop over every parser of target bytes), then a bounded fuzz run.
# clippy and cargo test run with and without the cargo feature test-hooks: without it is what
# a release wheel holds, with it what the tests and benchmarks call (the fuzz bodies,
# KeyRing.cost, Plane.panic_next_calls).
#   FHMON_FUZZ_SECONDS   seconds per cargo-fuzz target (default 10; 0 skips fuzzing)
# cargo-fuzz needs a nightly toolchain: without one (or without cargo-fuzz) the parsers get a
# longer stable property loop instead (native/tests/parsers.rs), and the script says so.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
    PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi
seconds=${FHMON_FUZZ_SECONDS:-10}
crates=(native native/fuzz)
[ -f bench/refmon/Cargo.toml ] && crates+=(bench/refmon)

for crate in "${crates[@]}"; do
    echo "rust_checks: $crate: fmt, clippy"
    (cd "$crate" && cargo fmt --all --check)
    if [ "$crate" = native/fuzz ]; then
        # run only by cargo fuzz, on nightly; type-checked here on stable, so that a fuzz
        # target that no longer compiles fails CI instead of waiting for a nightly machine
        (cd "$crate" && cargo check --quiet --locked --bins)
        continue
    fi
    (cd "$crate" && cargo clippy --quiet --locked --workspace --all-targets -- -D warnings)
done
# native: with and without the Python bindings, each with and without the test hooks (the
# plain run above is the release wheel's set: the bindings, no hooks)
(cd native && cargo clippy --quiet --locked --workspace --all-targets --features test-hooks \
    -- -D warnings)
(cd native && cargo clippy --quiet --locked --workspace --all-targets --no-default-features \
    -- -D warnings)
(cd native && cargo clippy --quiet --locked --workspace --all-targets --no-default-features \
    --features test-hooks -- -D warnings)

echo "rust_checks: native: cargo test"
(cd native && cargo test --quiet --locked --no-default-features)
# the same units and the property loop over the fuzz bodies (tests/parsers.rs)
(cd native && cargo test --quiet --locked --no-default-features --features test-hooks)
# the launcher (native/launcher): its units and its property loop
(cd native && cargo test --quiet --locked -p fhmon-launch --features test-hooks)
(cd native && cargo test --quiet --locked)  # with the Python bindings compiled in
(cd native && cargo test --quiet --locked --features test-hooks)  # and the test hooks

if [ "$seconds" -gt 0 ]; then
    if command -v cargo-fuzz >/dev/null && cargo +nightly --version >/dev/null 2>&1; then
        for target in $(cd native/fuzz && cargo +nightly fuzz list); do
            echo "rust_checks: cargo fuzz run $target for ${seconds}s"
            (cd native/fuzz && cargo +nightly fuzz run "$target" -- \
                -max_total_time="$seconds" -rss_limit_mb=1024 2>&1 | tail -1)
        done
    else
        echo "rust_checks: no cargo-fuzz or nightly toolchain: a longer stable property loop instead"
        (cd native && FHMON_FUZZ_ITERATIONS=$((seconds * 200000)) \
            cargo test --quiet --locked --no-default-features --features test-hooks \
                --release --test parsers)
        (cd native && FHMON_FUZZ_ITERATIONS=$((seconds * 50000)) \
            cargo test --quiet --locked -p fhmon-launch --features test-hooks \
                --release --test parsers)
    fi
fi
echo "rust_checks: ok"
