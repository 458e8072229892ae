#!/usr/bin/env bash
# Runs this build's ppa-vmm inside a nested test host: QEMU in pure emulation (TCG, `-cpu max`,
# an AMD CPU with SVM and nested paging) boots Debian's 6.1 cloud kernel with a busybox
# initramfs, loads kvm-amd for a /dev/kvm, and runs `ppa-vmm ARGS...` there. Its stdout, stderr
# and exit code become this script's own. For hosts whose KVM cannot boot Linux (docs/linux.md).
#
# Usage: scripts/nested-run.sh [--timeout SECONDS] [--tries N] [--tap NAME=IP/PREFIX] [--side FILE] [--prepare] -- ARGS...
#   --timeout S   hard limit of one try, boot included (default 90; NESTED_TIMEOUT)
#   --tries N     tries when the nested host hangs or dies (default 3; NESTED_TRIES); a run that
#                 reaches its end is never retried, whatever ppa-vmm's exit code
#   --tap T=A     before ppa-vmm starts, the nested host makes the tap T (tun.ko; multi-queue with
#                 NESTED_TAP_QUEUES=N for --net ...,queues=N), gives it the address A and runs
#                 ppa-workload's UDP echo (port 7), blaster (9999) and sink (9001) on it for a
#                 Linux guest with --net tap=T (docs/linux.md). The nested host has no NIC
#                 (-nodefaults): nothing the guest sends leaves the emulated machine.
#   --side FILE   a shell script the nested host runs beside ppa-vmm (started just before it,
#                 stopped 5 s after it ends): e.g. `ppa-vmm ctl` against its --api-sock; its
#                 output is appended to ppa-vmm's stderr, each line starting "nested-side: "
#   --prepare     only build the outer machine's image (cached in target/nested/)
# Environment: PPA_VMM (default target/release/ppa-vmm), PPA_AGENT (the guest image's agent;
# default ppa-agent beside PPA_VMM when it was built: the image is rebuilt when the agent is
# newer than it; PPA_AGENT= (empty) builds an image without one), NESTED_KVM_AMD (kvm-amd parameters, e.g. npt=0),
# NESTED_SMP (2), NESTED_MEM (4G), NESTED_VERBOSE=1 (copy the outer console to stderr),
# NESTED_ROOTFS (default images/linux/out/rootfs.ext4 when it exists; empty: none): the Debian
# image, a copy-on-write disk of the outer machine, inside at /images/linux/rootfs.ext4,
# NESTED_GUEST_ELF=1 (also the guest's ELF kernel, /images/linux/vmlinux: 53 MB more to boot),
# NESTED_LOCK (/tmp/ppa-vmm-nested.lock: one nested host at a time on the machine),
# NESTED_TRACE=1 (the nested host traces its KVM events; a failed ppa-vmm run sends the last 3000
# lines back, saved beside the run's result as result-N.txt.lf.trace).
# Inside, the Linux guest image is at /images/linux/vmlinuz and /images/linux/initrd.img, and the
# Debian image (when built) at /images/linux/rootfs.ext4 (a link to the outer machine's disk).
#
# Exit codes: ppa-vmm's own; 124 no try finished in time (or the host died every time);
# 125 the nested host could not be prepared or started (a missing tool, no kvm-amd).
# Messages of this script go to stderr, each starting with "nested-run:"; the last one says how
# many tries it took. target/nested/history.log keeps one line per try (how often the host hangs).
set -euo pipefail
shopt -s inherit_errexit

root=$(cd "$(dirname "$0")/.." && pwd)
nested="$root/target/nested"
timeout_s=${NESTED_TIMEOUT:-90}
tries=${NESTED_TRIES:-3}
prepare_only=
tap=
side=
while [ $# -gt 0 ]; do
	case "$1" in
	--tap) tap=${2:?--tap needs NAME=IP/PREFIX}; shift 2 ;;
	--tap=*) tap=${1#--tap=}; shift ;;
	--timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
	--timeout=*) timeout_s=${1#--timeout=}; shift ;;
	--tries) tries=${2:?--tries needs a number}; shift 2 ;;
	--tries=*) tries=${1#--tries=}; shift ;;
	--side) side=${2:?--side needs a file}; shift 2 ;;
	--side=*) side=${1#--side=}; shift ;;
	--prepare) prepare_only=1; shift ;;
	--) shift; break ;;
	-h | --help) sed -n '2,35p' "$0"; exit 0 ;;
	*) echo "nested-run: unknown argument '$1' (ppa-vmm's arguments go after --; see --help)" >&2; exit 125 ;;
	esac
done
case "$timeout_s$tries" in *[!0-9]*) echo "nested-run: --timeout and --tries take whole numbers" >&2; exit 125 ;; esac
case "$tap" in
'' | [a-z]*=[0-9]*.[0-9]*.[0-9]*.[0-9]*/[0-9]*) ;;
*) echo "nested-run: --tap takes NAME=IPv4/PREFIX (e.g. tap0=10.0.0.1/24), not '$tap'" >&2; exit 125 ;;
esac
[ "$tries" -ge 1 ] || tries=1
[ -z "$side" ] || [ -f "$side" ] || { echo "nested-run: --side: no file '$side'" >&2; exit 125; }

export PPA_CACHE="$root/target/linux-image"
# This script's own failures are setup failures: exit 125, never a code ppa-vmm could give.
PPA_DIE_CODE=125
# shellcheck source=images/linux/lib.sh
. "$root/images/linux/lib.sh"
set -E
trap 'ppa_on_err $? $LINENO "$BASH_COMMAND"' ERR

for tool in qemu-system-x86_64 cpio dpkg-deb base64 flock timeout ldd; do
	command -v "$tool" >/dev/null ||
		ppa_die "$tool is missing; scripts/setup.sh installs what the nested host needs (qemu-system-x86, busybox-static, cpio)"
done
mkdir -p "$nested"
# One nested host at a time on this machine, from whichever checkout: QEMU TCG takes every core,
# and the outer machine hangs more often on a loaded host.
lock=${NESTED_LOCK:-/tmp/ppa-vmm-nested.lock}
exec 9>>"$lock"
flock -w 1800 9 || ppa_die "another nested run held $lock for 30 minutes"

# --- The image of the outer machine, rebuilt only when an input changed -------------------------
vmm=${PPA_VMM:-$root/target/release/ppa-vmm}
[ -x "$vmm" ] || ppa_die "no ppa-vmm binary at $vmm: run 'cargo build --release' (or set PPA_VMM)"

guest_dir="$root/images/linux"
# The agent of the same build as ppa-vmm (target/release, or the test suite's target/ci).
agent=${PPA_AGENT-$(dirname "$vmm")/ppa-agent}
[ -x "$agent" ] || agent=
guest_stale=
for f in "$guest_dir/out/vmlinuz" "$guest_dir/out/initrd.img"; do
	[ -f "$f" ] || guest_stale=1
done
if [ -z "$guest_stale" ]; then
	# An image built without the agent (or with another) is stale once an agent is there.
	grep -qx "agent=${agent:-none}" "$guest_dir/out/build-info.txt" 2>/dev/null || guest_stale=1
	for src in "$guest_dir"/init "$guest_dir"/run-workload "$guest_dir"/lib.sh "$guest_dir"/build.sh "$guest_dir"/src/* $agent; do
		if [ "$src" -nt "$guest_dir/out/initrd.img" ]; then guest_stale=1; fi
	done
fi
if [ -n "$guest_stale" ]; then
	PPA_AGENT=$agent "$guest_dir/build.sh" >&2 || ppa_die "images/linux/build.sh failed"
fi

kernel_dir=$(ppa_kernel_dir)
vmlinuz=$(find "$kernel_dir/boot" -maxdepth 1 -name 'vmlinuz-*' | head -n 1)
modules=$(find "$kernel_dir/lib/modules" -maxdepth 1 -mindepth 1 -type d | head -n 1)
if [ -z "$vmlinuz" ] || [ -z "$modules" ]; then
	ppa_die "the kernel package in $kernel_dir has no vmlinuz or modules"
fi
ko() {
	local f
	f=$(find "$modules/kernel" -name "$1.ko" | head -n 1)
	[ -n "$f" ] || ppa_die "the kernel package has no $1.ko (the cloud flavour carries irqbypass, kvm and kvm-amd)"
	echo "$f"
}
ko_irqbypass=$(ko irqbypass)
ko_kvm=$(ko kvm)
ko_kvm_amd=$(ko kvm-amd)
ko_tun=$(ko tun)
# The outer machine's virtio-blk disk (the guest's Debian image, below): virtio over PCI.
disk_kos=()
for m in virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk; do
	disk_kos+=("$(ko "$m")")
done
# The workload runner the guest image carries, also the nested host's UDP echo (--tap).
workload_bin="$PPA_CACHE/ppa-workload"
[ -x "$workload_bin" ] || ppa_die "no $workload_bin: images/linux/build.sh builds it"

inputs=("$vmm" "$root/scripts/nested/init" "$guest_dir/out/vmlinuz" "$guest_dir/out/initrd.img"
	"$vmlinuz" "$ko_irqbypass" "$ko_kvm" "$ko_kvm_amd" "$ko_tun" "${disk_kos[@]}" "$workload_bin"
	"$(ppa_busybox)")
guest_elf=
if [ -n "${NESTED_GUEST_ELF:-}" ]; then
	guest_elf="$guest_dir/out/vmlinux"
	[ -f "$guest_elf" ] || ppa_die "NESTED_GUEST_ELF is set but $guest_elf is missing: run images/linux/build.sh"
	inputs+=("$guest_elf")
fi
stamp=$({ printf '%s\n' "${inputs[@]}"; ldd "$vmm" 2>/dev/null | sed "s/ (0x[0-9a-f]*)//" || true; cat "${inputs[@]}"; } | sha256sum | cut -d' ' -f1)
if [ ! -f "$nested/initrd.img" ] || [ "$(cat "$nested/initrd.stamp" 2>/dev/null)" != "$stamp" ]; then
	staging=$(mktemp -d "$nested/staging.XXXXXX")
	ppa_busybox_root "$staging"
	install -m 755 "$root/scripts/nested/init" "$staging/init"
	mkdir -p "$staging/lib/modules" "$staging/images/linux" "$staging/nested"
	cp "$ko_irqbypass" "$staging/lib/modules/irqbypass.ko"
	cp "$ko_kvm" "$staging/lib/modules/kvm.ko"
	cp "$ko_kvm_amd" "$staging/lib/modules/kvm-amd.ko"
	cp "$ko_tun" "$staging/lib/modules/tun.ko"
	for ko in "${disk_kos[@]}"; do cp "$ko" "$staging/lib/modules/"; done
	install -m 755 "$workload_bin" "$staging/usr/bin/ppa-workload"
	ppa_install_with_libs "$vmm" "$staging" /usr/bin/ppa-vmm
	cp "$guest_dir/out/vmlinuz" "$guest_dir/out/initrd.img" "$staging/images/linux/"
	if [ -n "$guest_elf" ]; then cp "$guest_elf" "$staging/images/linux/"; fi
	ppa_cpio "$staging" "$nested/initrd.img"
	rm -rf "$staging"
	cp "$vmlinuz" "$nested/vmlinuz"
	echo "$stamp" >"$nested/initrd.stamp"
	echo "nested-run: built the nested host's image in $nested ($(du -k "$nested/initrd.img" | cut -f1) KiB initramfs)" >&2
fi
[ -z "$prepare_only" ] || exit 0

# --- The runs ---------------------------------------------------------------------------------
run_dir="$nested/run"
rm -rf "$run_dir"
mkdir -p "$run_dir/args/nested"
for a in "$@"; do
	printf '%s' "$a" | base64 -w0
	echo
done >"$run_dir/args/nested/args"
[ -z "$side" ] || install -m 755 "$side" "$run_dir/args/nested/side"
ppa_cpio "$run_dir/args" "$run_dir/args.cpio"
# The kernel unpacks concatenated newc archives in turn: the cached image, then this run's args.
cat "$nested/initrd.img" "$run_dir/args.cpio" >"$run_dir/initrd.img"

append="console=ttyS0 tsc=reliable panic=-1"
# The Debian image, when it was built (images/linux/build-rootfs.sh): a virtio-blk disk of the
# outer machine in QEMU's snapshot mode (its writes go to a temporary overlay: the file here
# never changes), which the outer init links as /images/linux/rootfs.ext4.
rootfs=${NESTED_ROOTFS-$guest_dir/out/rootfs.ext4}
disk_args=()
if [ -n "$rootfs" ] && [ -f "$rootfs" ]; then
	disk_args=(-drive "file=$rootfs,format=raw,if=none,id=rootfs,snapshot=on,cache=unsafe"
		-device virtio-blk-pci,drive=rootfs)
	append+=" nested.rootfs=1"
fi
[ -z "${NESTED_KVM_AMD:-}" ] || append+=" nested.kvm_amd=$NESTED_KVM_AMD"
[ -z "${NESTED_TRACE:-}" ] || append+=" nested.trace=1"
[ -z "$tap" ] || append+=" nested.tap=$tap nested.tapq=${NESTED_TAP_QUEUES:-1}"

# Prints the lines of stream $2 in result file $1, decoded, to stdout; fails when the byte count
# announced before them does not match.
stream() {
	local file=$1 name=$2 want got
	want=$(sed -n "s/^PPA-NESTED-DATA $name \([0-9]*\)$/\1/p" "$file" | head -n 1)
	[ -n "$want" ] || return 1
	sed -n "/^PPA-NESTED-DATA $name /,/^PPA-NESTED-DATA-END $name\$/p" "$file" | sed '1d;$d' |
		base64 -d >"$file.$name" 2>/dev/null || return 1
	got=$(wc -c <"$file.$name")
	[ "$got" -eq "$want" ]
}

tail_console() {
	echo "nested-run: the outer console's last lines ($1):" >&2
	if [ -s "$1" ]; then
		tr -d '\r' <"$1" | tail -n 15 | sed 's/^/nested-run:   | /' >&2 || true
	else
		echo "nested-run:   (empty: the outer kernel printed nothing)" >&2
	fi
}

try=1
while [ "$try" -le "$tries" ]; do
	console="$run_dir/console-$try.log"
	result="$run_dir/result-$try.txt"
	: >"$console"
	: >"$result"
	started=$(date +%s.%N)
	# The extra 10 s of timeout(1) only guard the loop below; the loop's own deadline comes first.
	nice -n 10 timeout -k 5 $((timeout_s + 10)) qemu-system-x86_64 \
		-accel tcg,thread=multi -cpu max -smp "${NESTED_SMP:-2}" -m "${NESTED_MEM:-4G}" \
		-nodefaults -display none -monitor none -no-reboot \
		-chardev "file,id=console,path=$console" -serial chardev:console \
		-chardev "file,id=result,path=$result" -serial chardev:result \
		"${disk_args[@]}" \
		-kernel "$nested/vmlinuz" -initrd "$run_dir/initrd.img" -append "$append" \
		</dev/null >"$run_dir/qemu-$try.log" 2>&1 &
	qemu=$!
	deadline=$(($(date +%s%N) + timeout_s * 1000000000))
	why=
	ended_at=
	while kill -0 "$qemu" 2>/dev/null; do
		if grep -q '^PPA-NESTED-END' "$result" 2>/dev/null; then
			# The result is complete; the power-off gets 10 s before the machine is ended.
			ended_at=${ended_at:-$(date +%s)}
			if [ $(($(date +%s) - ended_at)) -ge 10 ]; then
				kill -TERM "$qemu" 2>/dev/null || true
				break
			fi
		elif [ "$(date +%s%N)" -ge "$deadline" ]; then
			why="the nested host did not finish within $timeout_s s (hung); ended it"
			kill -TERM "$qemu" 2>/dev/null || true
			break
		fi
		sleep 0.2
	done
	qemu_rc=0
	wait "$qemu" || qemu_rc=$?
	elapsed=$(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
	[ -z "${NESTED_VERBOSE:-}" ] || tr -d '\r' <"$console" | sed 's/^/nested-run: console | /' >&2
	tr -d '\r' <"$result" >"$result.lf"
	status=$(sed -n 's/^PPA-NESTED-STATUS kvm=//p' "$result.lf" | head -n 1)
	if [ -n "$status" ] && [ "$status" != ok ]; then
		tail_console "$console"
		ppa_die "the nested host has no usable KVM: $status"
	fi
	if [ -z "$why" ]; then
		exit_line=$(grep -E '^PPA-NESTED-EXIT [0-9]+' "$result.lf" | head -n 1 || true)
		if [ -z "$exit_line" ] || ! grep -q '^PPA-NESTED-END' "$result.lf"; then
			why="the nested host stopped before ppa-vmm's result was complete (QEMU exit $qemu_rc)"
		elif ! stream "$result.lf" stdout || ! stream "$result.lf" stderr; then
			why="ppa-vmm's output came back damaged (a byte count or base64 mismatch)"
		fi
	fi
	if [ -z "$why" ]; then
		read -r _ rc vmm_start vmm_end <<<"$exit_line"
		cat "$result.lf.stdout"
		cat "$result.lf.stderr" >&2
		if stream "$result.lf" trace; then
			echo "nested-run: ppa-vmm failed; the last lines of the nested host's KVM trace are in $result.lf.trace" >&2
		fi
		inside=$(awk -v s="$vmm_start" -v e="$vmm_end" 'BEGIN { printf "%.1f", e - s }')
		echo "$(date -u +%FT%TZ) try=$try ok elapsed_s=$elapsed rc=$rc" >>"$nested/history.log"
		echo "nested-run: ppa-vmm exited with $rc after $try of $tries tries; this try took $elapsed s (ppa-vmm ran $inside s inside, from $vmm_start s of the host's uptime)" >&2
		exit "$rc"
	fi
	# The next run reuses $run_dir: a failed try's logs are kept apart (the last 5 failures).
	kept="$nested/failed/$(date -u +%Y%m%dT%H%M%SZ)-try$try"
	mkdir -p "$kept"
	cp "$console" "$result" "$run_dir/qemu-$try.log" "$kept/" 2>/dev/null || true
	find "$nested/failed" -mindepth 1 -maxdepth 1 -type d | sort | head -n -5 | xargs -r rm -rf
	echo "nested-run: try $try of $tries failed after $elapsed s: $why (its logs: $kept)" >&2
	echo "$(date -u +%FT%TZ) try=$try failed elapsed_s=$elapsed why=$why logs=$kept" >>"$nested/history.log"
	tail_console "$console"
	try=$((try + 1))
done
echo "nested-run: error: no try of $tries finished; the nested host hung or died each time (logs in $run_dir)" >&2
exit 124
