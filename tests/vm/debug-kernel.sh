#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Builds (once) the debug-lane kernel from Debian's linux-source-6.1 with
# tests/vm/debug.config merged onto tinyconfig, and prints the folder that
# holds it: bzImage, build/ (the tree modules are built against) and
# mods/lib/modules/VERSION. The cache key is the fragment and the source
# package version, so a machine builds it once (11-20 min on 2 cores).
# Concurrent callers wait for the one build (a lock), and a build only
# becomes visible, by a rename, once it is complete.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}
tarball=/usr/src/linux-source-6.1.tar.xz
srcver=$(dpkg-query -W -f='${Version}' linux-source-6.1)
key=$(cat "$here/debug.config" <(echo "$srcver") | sha256sum | cut -c1-16)
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
echo "debug-kernel: building 6.1 ($srcver) debug kernel in $dir (once)" >&2
tar -xJf "$tarball" -C "$tmp"
mv "$tmp"/linux-source-6.1 "$tmp/build"
cd "$tmp/build"
{
	make tinyconfig
	scripts/kconfig/merge_config.sh -m .config "$here/debug.config"
	make olddefconfig
	# Every option of the fragment must have survived olddefconfig.
	missing=0
	while read -r line; do
		case "$line" in CONFIG_*) grep -qx "$line" .config ||
			{ echo "debug-kernel: lost $line" >&2; missing=1; } ;;
		esac
	done <"$here/debug.config"
	[ $missing = 0 ]
	make -j"$(nproc)" bzImage modules
	make modules_install INSTALL_MOD_PATH="$tmp/mods"
} >"$tmp/build.log" 2>&1 || {
	tail -30 "$tmp/build.log" >&2
	echo "debug-kernel: build failed, log in $tmp/build.log" >&2
	exit 1
}
cp arch/x86/boot/bzImage "$tmp/bzImage"
touch "$tmp/.done"
cd /
rm -rf "$dir"
mv "$tmp" "$dir"
echo "$dir"
