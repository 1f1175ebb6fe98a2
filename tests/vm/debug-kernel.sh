#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Builds (once) the debug-lane kernel from Debian's linux-source-6.1 with
# tests/vm/debug.config merged onto tinyconfig, and prints the folder that
# holds it: bzImage, build/ (the tree modules are built against) and
# mods/lib/modules/VERSION. The cache key is the fragment, this script and
# the source package version, so a machine builds it once (about 11 min on
# 2 cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}
tarball=/usr/src/linux-source-6.1.tar.xz
srcver=$(dpkg-query -W -f='${Version}' linux-source-6.1)
key=$(cat "$here/debug.config" "$0" <(echo "$srcver") | sha256sum | cut -c1-16)
dir=$cache/debug-kernel/$key
if [ -f "$dir/.done" ]; then
	echo "$dir"
	exit 0
fi
rm -rf "$dir"
mkdir -p "$dir"
echo "debug-kernel: building 6.1 ($srcver) debug kernel in $dir" >&2
tar -xJf "$tarball" -C "$dir"
mv "$dir"/linux-source-6.1 "$dir/build"
cd "$dir/build"
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
	make modules_install INSTALL_MOD_PATH="$dir/mods"
} >"$dir/build.log" 2>&1 || {
	tail -30 "$dir/build.log" >&2
	echo "debug-kernel: build failed, log in $dir/build.log" >&2
	exit 1
}
cp arch/x86/boot/bzImage "$dir/bzImage"
touch "$dir/.done"
echo "$dir"
