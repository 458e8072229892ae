#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, unit tests and the functional KVM end-to-end
# tests (the main gate), then the accuracy tests on their own, one at a time, on a host the
# functional tests have left idle. Stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The accuracy target is `test = false` (left out of --all-targets and of a plain cargo test).
cargo clippy -p ppa-vmm --test accuracy -- -D warnings
cargo test --workspace --release
cargo test --release -p ppa-vmm --test accuracy -- --test-threads=1
