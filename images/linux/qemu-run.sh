#!/usr/bin/env bash
# Boots the Linux guest image (images/linux/out/, built first when missing) directly under QEMU
# in pure emulation, to check its init and workloads on a host whose KVM cannot boot Linux,
# without the VMM. The console (ttyS0) goes to stdout; the run ends with the guest's reboot.
#
# Usage: images/linux/qemu-run.sh [--timeout SECONDS] [KERNEL-PARAMETER...]
#   e.g. images/linux/qemu-run.sh ppa.workload=spin:threads=2,ms=500
#   --timeout S   hard limit of the run (default 60)
# Environment: QEMU_SMP (2), QEMU_MEM (1G).
# Exit codes: 0 the init printed PPA-WORKLOAD-DONE with rc=0; 1 it did not, or the workload
# failed; 124 the run did not end in time; 125 QEMU or the image is missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
timeout_s=60
if [ "${1:-}" = --timeout ]; then
	timeout_s=${2:?--timeout needs seconds}
	shift 2
fi
case "$timeout_s" in '' | *[!0-9]*) echo "qemu-run.sh: --timeout takes whole seconds" >&2; exit 125 ;; esac
command -v qemu-system-x86_64 >/dev/null || {
	echo "qemu-run.sh: qemu-system-x86_64 is missing (scripts/setup.sh installs qemu-system-x86)" >&2
	exit 125
}
if [ ! -f "$here/out/vmlinuz" ] || [ ! -f "$here/out/initrd.img" ]; then
	"$here/build.sh" || exit 125
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
nice -n 10 timeout -k 5 "$timeout_s" qemu-system-x86_64 \
	-accel tcg,thread=multi -cpu max -smp "${QEMU_SMP:-2}" -m "${QEMU_MEM:-1G}" \
	-nodefaults -display none -monitor none -no-reboot -serial stdio \
	-kernel "$here/out/vmlinuz" -initrd "$here/out/initrd.img" \
	-append "console=ttyS0 tsc=reliable panic=-1 quiet $*" </dev/null | tee "$log" || rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
	echo "qemu-run.sh: the guest did not end within $timeout_s s" >&2
	exit 124
fi
if tr -d '\r' <"$log" | grep -q '^PPA-WORKLOAD-DONE .* rc=0 '; then
	exit 0
fi
echo "qemu-run.sh: no PPA-WORKLOAD-DONE line with rc=0 on the console (QEMU exit $rc)" >&2
exit 1
