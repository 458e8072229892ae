#!/usr/bin/env bash
# Installs what a fresh machine lacks to build and test PPA-VMM. Idempotent; safe to re-run.
set -euo pipefail

need_components=()
for c in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || need_components+=("$c")
done
if [ ${#need_components[@]} -gt 0 ]; then
  rustup component add "${need_components[@]}"
fi

if [ ! -e /dev/kvm ]; then
  echo "setup: warning: /dev/kvm is missing; the KVM tests will fail and say so" >&2
fi
