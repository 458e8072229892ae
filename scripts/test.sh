#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, unit tests and the KVM end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release
