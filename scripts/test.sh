#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, unit tests and the functional KVM end-to-end
# tests (the main gate), then the accuracy tests on their own, one at a time, on a host the
# functional tests have left idle, then each fuzzer for a bounded time. Stops at the first
# failure. The fuzz targets' property checks also run in `cargo test` (seeds and regressions
# replayed). FUZZ_SECONDS (default 30) is each fuzzer's time; 0 leaves the fuzzers out
# (docs/fuzzing.md: a crash is saved under fuzz/regressions/ and fails the run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
# The fuzz crate is a workspace of its own (docs/fuzzing.md), outside `--all`.
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The accuracy target is `test = false` (left out of --all-targets and of a plain cargo test).
cargo clippy -p ppa-vmm-cli --test accuracy -- -D warnings
# What the fuzz targets link: the `fuzzing` feature's module outside the unit tests.
cargo clippy -p ppa-vmm --features fuzzing -- -D warnings
# The fake hypervisor made public (the library's feature, which cli/'s feature of the same name
# turns on), and the test target only that feature builds.
cargo clippy -p ppa-vmm -p ppa-vmm-cli --all-targets --features fake-hypervisor -- -D warnings
cargo test --workspace --release
# The tests where KVM is not the point, on the fake hypervisor (they need no /dev/kvm).
cargo test --release -p ppa-vmm-cli --features fake-hypervisor --test fake_backend
cargo test --release -p ppa-vmm-cli --test accuracy -- --test-threads=1
# Last: the fuzzers load both cores, and nothing timed runs after them.
fuzz_seconds="${FUZZ_SECONDS:-30}"
if [ "$fuzz_seconds" != 0 ]; then
  scripts/fuzz.sh --seconds "$fuzz_seconds"
fi
