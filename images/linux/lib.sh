# Shell functions shared by images/linux/build.sh and scripts/nested-run.sh: Debian packages
# fetched once into a cache under target/, a busybox root, binaries with their shared libraries,
# and an uncompressed newc cpio. Sourced, not run; the caller sets PPA_CACHE and PPA_DIE_CODE,
# `set -eEuo pipefail`, `shopt -s inherit_errexit` (a failure inside $(...) must end the script)
# and `trap 'ppa_on_err $? $LINENO "$BASH_COMMAND"' ERR`.

# Ends the script with PPA_DIE_CODE. A die inside $(...) ends only that subshell; the caller's
# ERR trap (ppa_on_err) sees the code and ends the script with it, without a second message.
ppa_die() {
	echo "$(basename "$0"): error: $*" >&2
	exit "${PPA_DIE_CODE:-1}"
}

# The ERR trap of the scripts that source this: names the command that failed, unless it failed
# through ppa_die (whose message is already out), and exits with PPA_DIE_CODE.
ppa_on_err() {
	local rc=$1 line=$2 cmd=$3
	if [ "$rc" -ne "${PPA_DIE_CODE:-1}" ]; then
		echo "$(basename "$0"): error: line $line: \"$cmd\" failed with exit code $rc" >&2
	fi
	exit "${PPA_DIE_CODE:-1}"
}

ppa_log() {
	echo "$(basename "$0"): $*" >&2
}

# The Debian kernel package both the guest image and the nested host boot: Debian 12's 6.1
# cloud kernel, whose package carries kvm.ko, kvm-amd.ko and irqbypass.ko (the generic flavour
# also needs ccp.ko). PPA_KERNEL_PKG names one explicitly; otherwise the newest one cached;
# otherwise the one apt's linux-image-cloud-amd64 depends on now.
ppa_kernel_pkg() {
	if [ -n "${PPA_KERNEL_PKG:-}" ]; then
		echo "$PPA_KERNEL_PKG"
		return
	fi
	local cached
	cached=$(find "$PPA_CACHE/debs" -maxdepth 1 -name 'linux-image-6.1.0-*-cloud-amd64_*.deb' \
		-printf '%f\n' 2>/dev/null | sort -V | tail -n 1 || true)
	if [ -n "$cached" ]; then
		echo "${cached%%_*}"
		return
	fi
	local pkg
	pkg=$(ppa_apt_cache depends linux-image-cloud-amd64 |
		sed -n 's/^ *Depends: \(linux-image-6\.1\.0-[0-9]*-cloud-amd64\)$/\1/p' | head -n 1)
	[ -n "$pkg" ] || ppa_die "apt knows no linux-image-6.1.0-*-cloud-amd64 package and" \
		"$PPA_CACHE/debs has none cached: this needs Debian 12 (bookworm) apt sources and" \
		"'apt-get update', or a copy of the .deb in that directory"
	echo "$pkg"
}

# apt-cache, after one 'apt-get update' (as root) when its lists know nothing yet.
ppa_apt_cache() {
	local out
	out=$(apt-cache "$@" 2>/dev/null || true)
	if [ -z "$out" ] && [ "$(id -u)" -eq 0 ] && [ -z "${PPA_APT_UPDATED:-}" ]; then
		PPA_APT_UPDATED=1
		apt-get update -qq >/dev/null 2>&1 || true
		out=$(apt-cache "$@" 2>/dev/null || true)
	fi
	echo "$out"
}

# Prints the path of NAME's .deb in the cache, downloading it with apt-get only when no copy is
# cached. A download goes to a temporary directory first, so a broken one is never taken as cached.
ppa_deb() {
	local name=$1 cached
	cached=$(find "$PPA_CACHE/debs" -maxdepth 1 -name "${name}_*.deb" -printf '%p\n' 2>/dev/null |
		sort -V | tail -n 1 || true)
	if [ -n "$cached" ]; then
		echo "$cached"
		return
	fi
	command -v apt-get >/dev/null || ppa_die "no cached $name .deb in $PPA_CACHE/debs and no apt-get to fetch one"
	mkdir -p "$PPA_CACHE/debs"
	local tmp
	tmp=$(mktemp -d "$PPA_CACHE/debs/.download.XXXXXX")
	ppa_log "downloading $name (once; cached in $PPA_CACHE/debs)"
	if ! (cd "$tmp" && apt-get download -q "$name" >"$tmp/log" 2>&1); then
		if [ "$(id -u)" -eq 0 ] && [ -z "${PPA_APT_UPDATED:-}" ]; then
			PPA_APT_UPDATED=1
			apt-get update -qq >/dev/null 2>&1 || true
		fi
		if ! (cd "$tmp" && apt-get download -q "$name" >"$tmp/log" 2>&1); then
			local why
			why=$(grep -E '^(E|Err):' "$tmp/log" | head -n 3)
			rm -rf "$tmp"
			ppa_die "cannot download the Debian package $name and $PPA_CACHE/debs has no copy" \
				"(offline, or apt's lists are stale: run 'apt-get update'). apt said: ${why:-nothing}"
		fi
	fi
	local deb
	deb=$(find "$tmp" -maxdepth 1 -name "${name}_*.deb" | head -n 1)
	[ -n "$deb" ] || { rm -rf "$tmp"; ppa_die "apt-get download $name left no .deb"; }
	dpkg-deb --info "$deb" >/dev/null 2>&1 || { rm -rf "$tmp"; ppa_die "the downloaded $deb is not a valid .deb"; }
	mv "$deb" "$PPA_CACHE/debs/"
	rm -rf "$tmp"
	echo "$PPA_CACHE/debs/$(basename "$deb")"
}

# Unpacks a .deb once into $PPA_CACHE/unpacked/<its file name without .deb>; prints that directory.
ppa_unpack() {
	local deb=$1 dir
	dir="$PPA_CACHE/unpacked/$(basename "$deb" .deb)"
	if [ ! -e "$dir/.complete" ]; then
		rm -rf "$dir" "$dir.tmp"
		mkdir -p "$dir.tmp"
		dpkg-deb -x "$deb" "$dir.tmp"
		touch "$dir.tmp/.complete"
		mv "$dir.tmp" "$dir"
	fi
	echo "$dir"
}

# The unpacked kernel package: prints its directory (boot/vmlinuz-*, lib/modules/*).
ppa_kernel_dir() {
	local pkg deb
	pkg=$(ppa_kernel_pkg)
	deb=$(ppa_deb "$pkg")
	ppa_unpack "$deb"
}

# The workload runner, a static C program (so the initramfs needs no libc of its own), built
# into the cache from the sources in DIR/src when they are newer; prints its path.
ppa_workload_bin() {
	local dir=$1 bin="$PPA_CACHE/ppa-workload" src stale=
	[ -x "$bin" ] || stale=1
	for src in "$dir"/src/*.c; do
		if [ "$src" -nt "$bin" ]; then stale=1; fi
	done
	if [ -n "$stale" ]; then
		gcc -O2 -Wall -Wextra -Werror -static -pthread -o "$bin.tmp" "$dir"/src/*.c ||
			ppa_die "cannot build ppa-workload statically (is libc6-dev installed?)"
		mv "$bin.tmp" "$bin"
	fi
	echo "$bin"
}

# A static busybox: the host's when its busybox-static package is installed, else the package's.
ppa_busybox() {
	if dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' &&
		[ -x /bin/busybox ]; then
		echo /bin/busybox
		return
	fi
	local deb dir
	deb=$(ppa_deb busybox-static)
	dir=$(ppa_unpack "$deb")
	[ -x "$dir/bin/busybox" ] || ppa_die "the busybox-static package has no bin/busybox"
	echo "$dir/bin/busybox"
}

# Lays out a busybox root in STAGING: /bin/busybox, a link per applet, the mount points.
ppa_busybox_root() {
	local staging=$1 busybox applet
	busybox=$(ppa_busybox)
	mkdir -p "$staging"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc,root}
	cp "$busybox" "$staging/bin/busybox"
	for applet in $("$busybox" --list-full); do
		[ -e "$staging/$applet" ] || ln -s /bin/busybox "$staging/$applet"
	done
}

# Copies the ELF binary SRC to STAGING/DEST and the shared libraries `ldd` lists for it (with
# their directories), so a dynamically linked program runs in a root that has no libc.
ppa_install_with_libs() {
	local src=$1 staging=$2 dest=$3 lib
	mkdir -p "$staging/$(dirname "$dest")"
	cp "$src" "$staging/$dest"
	chmod 755 "$staging/$dest"
	# "not a dynamic executable" (a static binary) lists nothing; ldd then fails, which is fine.
	for lib in $(ldd "$src" 2>/dev/null | grep -oE '/[^ ]+'); do
		[ -e "$staging$lib" ] && continue
		mkdir -p "$staging$(dirname "$lib")"
		cp -L "$lib" "$staging$lib"
	done
	if ldd "$src" 2>/dev/null | grep -q 'not found'; then
		ppa_die "$src needs shared libraries this host lacks: $(ldd "$src" | grep 'not found' | tr -s ' \t' ' ')"
	fi
}

# Writes STAGING as an uncompressed newc cpio to OUT (the kernel unpacks it about twice as fast
# as a gzipped one), owned by root and with fixed times, so equal inputs give equal bytes.
ppa_cpio() {
	local staging=$1 out=$2
	find "$staging" -exec touch -h -d @0 {} +
	(cd "$staging" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
		cpio --null -o -H newc --owner=0:0 --reproducible --quiet) >"$out.tmp"
	mv "$out.tmp" "$out"
}

# Writes the ELF vmlinux inside the bzImage BZ to OUT (for an ELF loader and the PVH entry note,
# XEN_ELFNOTE_PHYS32_ENTRY, that the bzImage does not expose). Debian's 6.1 kernel compresses it
# with LZ4 (CONFIG_KERNEL_LZ4): the payload starts at the LZ4 legacy frame magic 02 21 4c 18.
ppa_extract_vmlinux() {
	local bz=$1 out=$2 off
	command -v lz4 >/dev/null || ppa_die "lz4 is missing: it unpacks the ELF vmlinux (scripts/setup.sh installs it)"
	for off in $(LC_ALL=C grep -abo $'\x02\x21\x4c\x18' "$bz" | cut -d: -f1 || true); do
		# lz4 complains about the bytes after the frame (the bzImage's tail); the ELF is whole.
		tail -c +$((off + 1)) "$bz" | lz4 -dc >"$out.tmp" 2>/dev/null || true
		if [ "$(head -c 4 "$out.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
			mv "$out.tmp" "$out"
			return
		fi
	done
	rm -f "$out.tmp"
	ppa_die "found no LZ4-compressed ELF kernel in $bz"
}
