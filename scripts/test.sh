#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, unit tests and the functional KVM end-to-end
# tests (the main gate), then the accuracy tests on their own, one at a time, on a host the
# functional tests have left idle. Stops at the first failure. The fuzz targets' property checks
# run in `cargo test` (seeds and regressions replayed); the fuzzers themselves are not run here
# (scripts/fuzz.sh, docs/fuzzing.md), which keeps CI within its time and off cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
# The fuzz crate is a workspace of its own (docs/fuzzing.md), outside `--all`.
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The accuracy target is `test = false` (left out of --all-targets and of a plain cargo test).
cargo clippy -p ppa-vmm --test accuracy -- -D warnings
# What the fuzz targets link: the `fuzzing` feature's module outside the unit tests.
cargo clippy -p ppa-vmm --features fuzzing -- -D warnings
cargo test --workspace --release
cargo test --release -p ppa-vmm --test accuracy -- --test-threads=1
