#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# DKMS in the Debian 13 root, as an admin would use it: the helper module's
# sources from this tree (make dkms-src) under /usr/src, then dkms add,
# build and install for every kernel of the root that has headers (6.12 and
# the 7.x from backports). The guests of those lanes load the module from
# /lib/modules/RELEASE/updates/dkms (tests/module/dkms_module.py).
#
#   dkms.sh REPO [KVER]   every kernel of the root, or KVER alone; prints
#                         one line per kernel; exit status 1 on a failure
set -euo pipefail
repo=$(cd "${1:?repository}" && pwd)
cache=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}
root=$cache/trixie-root
ver=$(awk '/define KVDMABUF_VERSION_(MAJOR|MINOR|PATCH) / \
	{ v = v (v == "" ? "" : ".") $3 } END { print v }' "$repo/lib/kvdmabuf.h")

in_root() {
	unshare -m --propagation private sh -c '
		r=$1; shift
		mount --rbind /dev "$r/dev" && mount -t proc proc "$r/proc" &&
		exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
			HOME=/root LC_ALL=C "$@"' - "$root" "$@"
}

[ -x "$root/usr/sbin/dkms" ] || {
	echo "dkms.sh: no dkms in $root (tests/vm/deps.sh 6.12 installs it)" >&2
	exit 1
}
# A fresh copy every time: the module's sources may have changed.
in_root dkms remove "kvdmabuf/$ver" --all >/dev/null 2>&1 || true
rm -rf "$root/usr/src/kvdmabuf-$ver"
make -s -C "$repo" dkms-src DESTDIR="$root"
in_root dkms add "kvdmabuf/$ver" >/dev/null
rc=0
for build in "$root"/lib/modules/${2:-*}/build; do
	[ -d "$build" ] || { echo "dkms: no headers for ${2:-any kernel} in $root" >&2; exit 1; }
	kver=$(basename "$(dirname "$build")")
	if in_root dkms install "kvdmabuf/$ver" -k "$kver" --force \
		>"$cache/dkms-$kver.log" 2>&1; then
		echo "dkms: kvdmabuf/$ver installed for $kver"
	else
		tail -20 "$cache/dkms-$kver.log" >&2
		echo "dkms: kvdmabuf/$ver failed for $kver (log $cache/dkms-$kver.log)" >&2
		rc=1
	fi
done
exit $rc
