#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, unit tests and the functional KVM end-to-end
# tests (the main gate), then the accuracy tests on their own, one at a time, on a host the
# functional tests have left idle, then each fuzzer for a bounded time. Stops at the first
# failure. The fuzz targets' property checks also run in `cargo test` (seeds and regressions
# replayed). FUZZ_SECONDS (default 10) is each fuzzer's time; 0 leaves the fuzzers out
# (docs/fuzzing.md: a crash is saved under fuzz/regressions/ and fails the run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
# The fuzz crate is a workspace of its own (docs/fuzzing.md), outside `--all`.
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
# Clippy over every target and feature in two builds, not four (no code is compiled only
# without a feature): the workspace's targets with the `fuzzing` feature's module that the
# fuzz targets link and the fake hypervisor made public (ppa-vmm's feature, which cli/'s of
# the same name turns on) with the test target only that feature builds; then the accuracy
# target, which is `test = false` and so outside --all-targets (and not added by --test
# beside it).
cargo clippy --workspace --all-targets --features ppa-vmm/fuzzing,ppa-vmm-cli/fake-hypervisor \
  -- -D warnings
cargo clippy -p ppa-vmm-cli --test accuracy --features ppa-vmm/fuzzing,fake-hypervisor -- -D warnings
# Every test, the fake hypervisor's included (tests/fake_backend.rs: the tests where KVM is
# not the point); the accuracy tests then reuse this build (same features, no rebuild).
# Built with the `ci` profile (Cargo.toml: release without LTO, which costs most of the build,
# and unwinding, so that the dependencies are built once).
# The tiny guest is left out: it is no_std and aborts, `ci` unwinds (Cargo.toml), and
# vmm/build.rs builds the image the VMM embeds with `release` anyway.
ci_build=(--workspace --exclude ppa-tiny-guest --profile ci --features ppa-vmm-cli/fake-hypervisor)
cargo test "${ci_build[@]}"
# The same packages and features as above, so nothing is built again but the accuracy target
# (with `-p ppa-vmm-cli` the features resolve differently and ppa-vmm was rebuilt: 2 minutes).
cargo test "${ci_build[@]}" --test accuracy -- --test-threads=1
# Last: the fuzzers load both cores, and nothing timed runs after them.
fuzz_seconds="${FUZZ_SECONDS:-10}"
if [ "$fuzz_seconds" != 0 ]; then
  FUZZ_CODEGEN_UNITS="${FUZZ_CODEGEN_UNITS:-16}" scripts/fuzz.sh --seconds "$fuzz_seconds"
fi
