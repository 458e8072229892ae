#!/usr/bin/env bash
# Builds the Linux guest image: images/linux/out/vmlinuz (Debian 12's 6.1 cloud kernel, a
# bzImage), out/vmlinux (the same kernel as an ELF with its PVH entry note) and out/initrd.img (an
# uncompressed busybox initramfs whose /init runs the workload named by `ppa.workload=` on the
# kernel command line, or with `root=` mounts that disk and hands over to its systemd; see
# images/linux/init and docs/linux.md). The Debian image (a root file system) is
# images/linux/build-rootfs.sh's.
#
# Usage: images/linux/build.sh [--agent PATH]
#   --agent PATH   install this ppa-agent binary as /usr/bin/ppa-agent (also PPA_AGENT=PATH);
#                  without it the image has no agent and init says agent=absent.
# Environment: PPA_CACHE (default target/linux-image) holds the downloaded .debs and what they
# unpack to; nothing is downloaded twice. PPA_KERNEL_PKG names a kernel package explicitly.
# Needs: apt-get/dpkg-deb (Debian), gcc with static glibc (libc6-dev), cpio, ldd, lz4.
set -eEuo pipefail
shopt -s inherit_errexit

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
agent=${PPA_AGENT:-}
while [ $# -gt 0 ]; do
	case "$1" in
	--agent)
		[ $# -ge 2 ] || { echo "build.sh: --agent needs a path" >&2; exit 2; }
		agent=$2
		shift 2
		;;
	--agent=*) agent=${1#--agent=}; shift ;;
	-h | --help) sed -n '2,12p' "$0"; exit 0 ;;
	*) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done

export PPA_CACHE=${PPA_CACHE:-$root/target/linux-image}
PPA_DIE_CODE=1
# shellcheck source=images/linux/lib.sh
. "$here/lib.sh"
trap 'ppa_on_err $? $LINENO "$BASH_COMMAND"' ERR

for tool in dpkg-deb cpio gcc ldd lz4; do
	command -v "$tool" >/dev/null || ppa_die "$tool is missing (scripts/setup.sh installs what this needs)"
done
if [ -n "$agent" ]; then
	if [ ! -f "$agent" ] || [ ! -x "$agent" ]; then
		ppa_die "the agent binary '$agent' is not an executable file"
	fi
fi
mkdir -p "$PPA_CACHE" "$here/out"

kernel_pkg=$(ppa_kernel_pkg)
kernel_dir=$(ppa_kernel_dir)
vmlinuz=$(find "$kernel_dir/boot" -maxdepth 1 -name 'vmlinuz-*' | head -n 1)
[ -n "$vmlinuz" ] || ppa_die "$kernel_pkg has no boot/vmlinuz-*"

workload_bin=$(ppa_workload_bin "$here")

staging=$(mktemp -d "$PPA_CACHE/initrd.XXXXXX")
trap 'rm -rf "$staging"' EXIT
ppa_busybox_root "$staging"
install -m 755 "$here/init" "$staging/init"
install -m 755 "$here/run-workload" "$staging/usr/bin/run-workload"
install -m 755 "$workload_bin" "$staging/usr/bin/ppa-workload"
# The virtio network stack and virtio_blk, as modules in Debian's kernels (docs/linux.md): init
# loads them in this order; virtio_mmio binds the LNRO0005 devices of the DSDT, virtio_net
# makes eth0, virtio_blk the disks (/dev/vda: the Debian image's root with root=).
modules_dir=$(find "$kernel_dir/lib/modules" -maxdepth 1 -mindepth 1 -type d | head -n 1)
mkdir -p "$staging/lib/modules"
for m in virtio_ring virtio virtio_mmio failover net_failover virtio_net virtio_blk; do
	ko=$(find "$modules_dir/kernel" -name "$m.ko" | head -n 1)
	if [ -n "$ko" ]; then
		cp "$ko" "$staging/lib/modules/$m.ko"
	elif [ -n "$(find "$modules_dir/kernel" -name "$m.ko.*" | head -n 1)" ]; then
		ppa_die "$m is compressed in $kernel_pkg; busybox insmod needs it decompressed first"
	fi
	# Not found at all: built into this kernel.
done
if [ -n "$agent" ]; then
	ppa_install_with_libs "$agent" "$staging" /usr/bin/ppa-agent
fi
ppa_cpio "$staging" "$here/out/initrd.img"
cp "$vmlinuz" "$here/out/vmlinuz.tmp"
mv "$here/out/vmlinuz.tmp" "$here/out/vmlinuz"
# The ELF is unpacked once per kernel into the cache, then copied.
elf="$kernel_dir.vmlinux"
[ -f "$elf" ] || ppa_extract_vmlinux "$vmlinuz" "$elf"
cp "$elf" "$here/out/vmlinux.tmp"
mv "$here/out/vmlinux.tmp" "$here/out/vmlinux"
{
	echo "kernel_package=$kernel_pkg"
	echo "kernel_release=$(basename "$vmlinuz" | sed 's/^vmlinuz-//')"
	echo "agent=${agent:-none}"
} >"$here/out/build-info.txt"
ppa_log "wrote $here/out/vmlinuz and vmlinux ($kernel_pkg) and $here/out/initrd.img ($(du -k "$here/out/initrd.img" | cut -f1) KiB, agent: ${agent:-none})"
