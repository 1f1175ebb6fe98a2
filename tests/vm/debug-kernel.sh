#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Builds (once) the debug-lane kernel from the newest linux-source-7.x that
# deps.sh installed (from trixie-backports) into the Debian 13 root, with
# tests/vm/debug.config merged onto tinyconfig, inside that root (Debian
# 13's gcc-14 and tools), and prints the folder that holds it: bzImage,
# build/ (the tree modules are built against; it must be bind-mounted at
# /mnt/kvd-bind in the root, where it was built) and mods/lib/modules/VERSION.
# The cache key is the fragment and the source package version, so a
# machine builds it once. Concurrent callers wait for the one build (a
# lock), and a build only becomes visible, by a rename, once it is complete.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}
root=$cache/trixie-root
jobs=${KVDMABUF_JOBS:-$(nproc)}
tarball=$(ls "$root"/usr/src/linux-source-7.*.tar.xz 2>/dev/null | sort -V | tail -1)
[ -n "$tarball" ] || { echo "debug-kernel: no linux-source-7.* in $root (deps.sh debug)" >&2; exit 1; }
srcname=$(basename "$tarball" .tar.xz)
srcver=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' "$srcname")
key=$(cat "$here/debug.config" <(echo "$srcname $srcver") | sha256sum | cut -c1-16)
dir=$cache/debug-kernel/$key
mkdir -p "$cache/debug-kernel"
exec 7>"$cache/debug-kernel/.lock"
flock 7
if [ -f "$dir/.done" ]; then
	echo "$dir"
	exit 0
fi
tmp=$dir.tmp
rm -rf "$tmp"
mkdir -p "$tmp"
echo "debug-kernel: building $srcname ($srcver) debug kernel in $dir (once)" >&2
t0=$SECONDS
tar -xJf "$tarball" -C "$tmp"
mv "$tmp/$srcname" "$tmp/build"
cp "$here/debug.config" "$tmp/debug.config"
# The build runs in the root with $tmp at /mnt/kvd-bind, the path the
# lanes mount it at again to build modules against it.
unshare -m --propagation private sh -c '
	r=$1 tmp=$2 jobs=$3
	mount --rbind /dev "$r/dev" && mount -t proc proc "$r/proc" &&
	mkdir -p "$r/mnt/kvd-bind" && mount --bind "$tmp" "$r/mnt/kvd-bind" &&
	exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
		HOME=/root LC_ALL=C JOBS="$jobs" /bin/bash -ec "
	cd /mnt/kvd-bind/build
	make tinyconfig
	scripts/kconfig/merge_config.sh -m .config ../debug.config
	make olddefconfig
	# Every option of the fragment must have survived olddefconfig.
	missing=0
	while read -r line; do
		case \"\$line\" in CONFIG_*) grep -qx \"\$line\" .config ||
			{ echo \"debug-kernel: lost \$line\" >&2; missing=1; } ;;
		esac
	done <../debug.config
	[ \$missing = 0 ]
	make -j\$JOBS bzImage modules
	make modules_install INSTALL_MOD_PATH=/mnt/kvd-bind/mods
	"' - "$root" "$tmp" "$jobs" >"$tmp/build.log" 2>&1 || {
	grep 'debug-kernel: lost' "$tmp/build.log" >&2 || true
	tail -30 "$tmp/build.log" >&2
	echo "debug-kernel: build failed, log in $tmp/build.log" >&2
	exit 1
}
cp "$tmp/build/arch/x86/boot/bzImage" "$tmp/bzImage"
echo "built in $((SECONDS - t0)) s on $jobs jobs ($srcname $srcver)" >"$tmp/build-time"
echo "debug-kernel: built in $((SECONDS - t0)) s" >&2
touch "$tmp/.done"
rm -rf "$dir"
mv "$tmp" "$dir"
echo "$dir"
