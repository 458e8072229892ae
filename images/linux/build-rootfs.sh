#!/usr/bin/env bash
# Builds the Debian image: images/linux/out/rootfs.ext4, an ext4 root file system of Debian 12
# (bookworm) minbase with systemd, udev and iproute2, the PPA guest agent as an enabled systemd
# service (ExecCondition on `ppa-agent --probe`: skipped where the VMM offers no PPA page),
# ppa-workload, and ppa-workload.service, which runs the workload named by `ppa.workload=` on
# the kernel command line once the system reached its multi-user target and then reboots.
# Boot it with the image's kernel and initramfs (images/linux/build.sh) and `root=/dev/vda`:
#
#   ppa-vmm run --kernel images/linux/out/vmlinuz --initrd images/linux/out/initrd.img \
#       --disk path=images/linux/out/rootfs.ext4 --cmdline "root=/dev/vda ppa.workload=spin"
#
# Usage: images/linux/build-rootfs.sh [--agent PATH] [--size MIB]
#   --agent PATH  the ppa-agent binary (also PPA_AGENT; default target/release/ppa-agent:
#                 cargo build --release -p ppa-agent)
#   --size MIB    the file system's size (default 768; the file is sparse)
# Environment: PPA_CACHE (default target/linux-image): the Debian base (mmdebstrap's tarball,
# made once per package list and mirror, never downloaded again) under PPA_CACHE/rootfs;
# PPA_DEBIAN_MIRROR (default http://deb.debian.org/debian).
# Equal inputs (the cached base, the agent, the workload runner, the files here, the size) give
# a byte-identical image: fixed times (SOURCE_DATE_EPOCH), UUIDs and hash seed, every inode's
# times set to the epoch. Needs mmdebstrap and e2fsprogs (scripts/setup.sh installs them).
# As root, mmdebstrap makes the base in its root mode and the tree is assembled as root; as
# another user, mmdebstrap's unshare mode and fakeroot do the same where the kernel allows
# unprivileged user namespaces.
set -eEuo pipefail
shopt -s inherit_errexit

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
agent=${PPA_AGENT:-$root/target/release/ppa-agent}
size_mib=768
while [ $# -gt 0 ]; do
	case "$1" in
	--agent) agent=${2:?--agent needs a path}; shift 2 ;;
	--agent=*) agent=${1#--agent=}; shift ;;
	--size) size_mib=${2:?--size needs MiB}; shift 2 ;;
	--size=*) size_mib=${1#--size=}; shift ;;
	-h | --help) sed -n '2,27p' "$0"; exit 0 ;;
	*) echo "build-rootfs.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
case "$size_mib" in '' | *[!0-9]*) echo "build-rootfs.sh: --size takes whole MiB" >&2; exit 2 ;; esac

export PPA_CACHE=${PPA_CACHE:-$root/target/linux-image}
PPA_DIE_CODE=1
# shellcheck source=images/linux/lib.sh
. "$here/lib.sh"
trap 'ppa_on_err $? $LINENO "$BASH_COMMAND"' ERR

for tool in mmdebstrap mke2fs debugfs dumpe2fs e2fsck tar gcc sha256sum; do
	command -v "$tool" >/dev/null || ppa_die "$tool is missing (scripts/setup.sh installs what this needs)"
done
[ -f "$agent" ] && [ -x "$agent" ] ||
	ppa_die "no ppa-agent binary at $agent: run 'cargo build --release -p ppa-agent' (or give --agent PATH)"
asroot=()
if [ "$(id -u)" -ne 0 ]; then
	command -v fakeroot >/dev/null || ppa_die "not root and no fakeroot to give the files their owners"
	asroot=(fakeroot)
fi

# Fixed for every build: the epoch of every time in the image, its UUID and hash seed.
epoch=${SOURCE_DATE_EPOCH:-1735689600}
uuid=5050412d-524f-4f54-8000-000000000001
hash_seed=5050412d-4841-5348-8000-000000000001
suite=bookworm
packages=systemd,systemd-sysv,udev,iproute2
mirror=${PPA_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# --- The Debian base: made once per (suite, packages, mirror, epoch), then cached -------------
mkdir -p "$PPA_CACHE/rootfs" "$here/out"
base_key=$(printf '%s\n' "$suite" minbase "$packages" "$mirror" "$epoch" | sha256sum | cut -c1-16)
base="$PPA_CACHE/rootfs/base-$base_key.tar"
if [ ! -f "$base" ]; then
	ppa_log "making the Debian $suite base with mmdebstrap from $mirror (once; cached as $base)"
	started=$(date +%s)
	SOURCE_DATE_EPOCH=$epoch mmdebstrap --quiet --format=tar --variant=minbase --include="$packages" \
		--customize-hook='rm -f "$1/etc/resolv.conf"' \
		--customize-hook='echo ppa-guest >"$1/etc/hostname"' \
		"$suite" "$base.tmp" "$mirror" ||
		ppa_die "mmdebstrap could not make the base from $mirror (offline? see its messages above)"
	mv "$base.tmp" "$base"
	ppa_log "the base took $(($(date +%s) - started)) s ($(du -m "$base" | cut -f1) MiB)"
fi

# --- The image, rebuilt only when an input changed -------------------------------------------
workload_bin=$(ppa_workload_bin "$here")
inputs=("$base" "$agent" "$workload_bin" "$here/run-workload" "$root/guest-agent/ppa-agent.service"
	"$root/guest-agent/ppa-agent.conf" "$0")
while IFS= read -r f; do inputs+=("$f"); done < <(find "$here/rootfs" -type f | LC_ALL=C sort)
stamp=$({ printf '%s\n' "${inputs[@]#"$root"/}" "size=$size_mib" "epoch=$epoch"; cat "${inputs[@]}"; } |
	sha256sum | cut -d' ' -f1)
out="$here/out/rootfs.ext4"
if [ -f "$out" ] && [ "$(cat "$here/out/rootfs.stamp" 2>/dev/null)" = "$stamp" ]; then
	ppa_log "$out is up to date"
	exit 0
fi
started=$(date +%s)
stage=$(mktemp -d "$PPA_CACHE/rootfs/stage.XXXXXX")
trap 'rm -rf "$stage" "$out.tmp" "$out.cmds"' EXIT

# Everything from the tree's extraction to the file system in one (fake)root session, so the
# files keep their owners and modes.
"${asroot[@]}" bash -eEuo pipefail -c '
	stage=$1 base=$2 here=$3 root=$4 agent=$5 workload=$6 out=$7 size=$8 epoch=$9
	uuid=${10} seed=${11}
	tar -C "$stage" --numeric-owner -xpf "$base"
	cp -a "$here/rootfs/." "$stage/"
	install -m 755 "$agent" "$stage/usr/sbin/ppa-agent"
	install -m 644 "$root/guest-agent/ppa-agent.conf" "$stage/etc/ppa-agent.conf"
	# The workload unit ends in a clean shutdown, which takes the agent more than its default
	# 3 samples to reach under emulation: the VMM reads the page at the power-off, so exited
	# threads stay published for 60 samples (a minute) and the workload'"'"'s are still listed.
	sed -i "s/^linger = .*/linger = 60/" "$stage/etc/ppa-agent.conf"
	grep -qx "linger = 60" "$stage/etc/ppa-agent.conf"
	install -m 644 "$root/guest-agent/ppa-agent.service" "$stage/etc/systemd/system/ppa-agent.service"
	install -m 755 "$workload" "$stage/usr/bin/ppa-workload"
	install -D -m 755 "$here/run-workload" "$stage/usr/lib/ppa/run-workload"
	chown -R 0:0 "$stage/etc/systemd/system" "$stage/etc/sysctl.d" "$stage/etc/fstab" "$stage/etc/hostname"
	# Enabled: what systemctl enable would link.
	wants="$stage/etc/systemd/system/multi-user.target.wants"
	mkdir -p "$wants"
	ln -sf /etc/systemd/system/ppa-agent.service "$wants/ppa-agent.service"
	ln -sf /etc/systemd/system/ppa-workload.service "$wants/ppa-workload.service"
	# Masked: logins on the console (the workload owns it) and what only costs boot time.
	for u in serial-getty@ttyS0.service getty@tty1.service apt-daily.timer \
		apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
		systemd-journal-flush.service; do
		ln -sf /dev/null "$stage/etc/systemd/system/$u"
	done
	find "$stage" -exec touch -h -d "@$epoch" {} +
	E2FSPROGS_FAKE_TIME=$epoch mke2fs -q -F -t ext4 -L ppa-root -U "$uuid" \
		-E "hash_seed=$seed,root_owner=0:0,nodiscard,lazy_itable_init=1" -m 0 \
		-d "$stage" "$out.tmp" "${size}M" >/dev/null
' _ "$stage" "$base" "$here" "$root" "$agent" "$workload_bin" "$out" "$size_mib" "$epoch" "$uuid" "$hash_seed"

# mke2fs copies each file's access and change times from the tree (the change time is when it
# was extracted): every inode in use gets the epoch instead, so equal inputs give equal bytes.
inodes=$(dumpe2fs -h "$out.tmp" 2>/dev/null | awk -F: '/^Inode count/ {n=$2} /^Free inodes/ {f=$2} END {print n - f + 16}')
for ((i = 1; i <= inodes; i++)); do
	echo "sif <$i> atime @$epoch"
	echo "sif <$i> ctime @$epoch"
done >"$out.cmds"
E2FSPROGS_FAKE_TIME=$epoch debugfs -w -f "$out.cmds" "$out.tmp" >/dev/null 2>&1
e2fsck -fn "$out.tmp" >/dev/null 2>&1 || ppa_die "the new file system does not check clean (e2fsck -fn $out.tmp)"
mv "$out.tmp" "$out"
echo "$stamp" >"$here/out/rootfs.stamp"
{
	echo "base=$(basename "$base") suite=$suite packages=$packages mirror=$mirror epoch=$epoch"
	echo "agent=$agent sha256=$(sha256sum <"$agent" | cut -d' ' -f1)"
	echo "size_mib=$size_mib used_mib=$(($(dumpe2fs -h "$out" 2>/dev/null | awk -F: '/^Block count/ {n=$2} /^Free blocks/ {f=$2} /^Block size/ {b=$2} END {print (n - f) * b}') >> 20))"
	echo "sha256=$(sha256sum <"$out" | cut -d' ' -f1)"
} >"$here/out/rootfs-info.txt"
ppa_log "wrote $out ($(sed -n 's/^size_mib=\([0-9]*\) used_mib=\([0-9]*\)$/\1 MiB, \2 MiB used/p' "$here/out/rootfs-info.txt"), in $(($(date +%s) - started)) s)"
