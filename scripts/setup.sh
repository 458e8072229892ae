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

# The Linux guest image (images/linux/build.sh) and the nested test host (scripts/nested-run.sh,
# tests/nested.rs): QEMU, a static busybox, cpio, lz4 (to unpack the ELF kernel), and gcc with a
# static libc for the workload runner.
need_debs=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_debs+=(qemu-system-x86)
command -v cpio >/dev/null 2>&1 || need_debs+=(cpio)
# The network tests (tests/net.rs) make a namespace and a tap with `ip` (iproute2).
command -v ip >/dev/null 2>&1 || need_debs+=(iproute2)
command -v lz4 >/dev/null 2>&1 || need_debs+=(lz4)
command -v gcc >/dev/null 2>&1 || need_debs+=(gcc)
# The fuzz targets (scripts/fuzz.sh, docs/fuzzing.md): libfuzzer-sys compiles libFuzzer, C++.
command -v g++ >/dev/null 2>&1 || need_debs+=(g++)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need_debs+=(libc6-dev)
# busybox-static replaces the dynamic busybox package; where that one is installed, the image
# scripts fetch busybox-static's .deb into their cache instead.
if ! dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' &&
  ! dpkg-query -W -f '${Status}' busybox 2>/dev/null | grep -q 'ok installed'; then
  need_debs+=(busybox-static)
fi
if [ ${#need_debs[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_debs[@]}" >/dev/null
fi

# The Firecracker client of tests/firecracker.rs (docs/firecracker.md): the pinned PyPI
# packages of scripts/firecracker-client.txt in a virtual environment under target/, made
# again when the pins change.
fc_dir="$(dirname "$0")/../target/firecracker-client"
fc_pins="$(dirname "$0")/firecracker-client.txt"
if ! cmp -s "$fc_pins" "$fc_dir/pins.txt" || [ ! -x "$fc_dir/venv/bin/python" ]; then
  rm -rf "$fc_dir"
  mkdir -p "$fc_dir"
  if ! python3 -m venv "$fc_dir/venv" 2>/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$fc_dir/venv"
  fi
  "$fc_dir/venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$fc_pins"
  cp "$fc_pins" "$fc_dir/pins.txt"
fi

if [ ! -e /dev/kvm ]; then
  echo "setup: warning: /dev/kvm is missing; the KVM tests will fail and say so" >&2
fi
