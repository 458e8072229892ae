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

# promtool and the Prometheus server, for the metrics tests (Debian package `prometheus`).
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if [ ! -e /dev/kvm ]; then
  echo "setup: warning: /dev/kvm is missing; the KVM tests will fail and say so" >&2
fi
