#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# DKMS in the Debian 13 root, as an admin would use it: the helper module's
# sources from this tree (make dkms-src) under /usr/src, then dkms add,
# build and install for every kernel of the root that has headers (6.12 and
# the 7.x from backports). The guests of those lanes load the module from
# /lib/modules/RELEASE/updates/dkms (tests/module/dkms_module.py).
#
# The 6.1 lane's guest runs this machine's own root (Debian 12), so there
# DKMS must not install into the host's /lib/modules: Debian 12's dkms runs
# here as an admin would, but in a mount namespace where the kernel's
# module folder is an overlay whose upper layer is a folder of the cache,
# and with its own DKMS and source trees there. Everything it writes (the
# module under updates/dkms, depmod's indexes) lands in that folder; the
# 6.1 guest lays it over its /lib/modules/RELEASE (tests/module/dkms_module.py).
#
#   dkms.sh REPO [KVER]         every kernel of the root, or KVER alone;
#                               prints one line per kernel; exit status 1
#                               on a failure
#   dkms.sh --host REPO KVER    Debian 12's dkms on this machine, for KVER,
#                               into $KVDMABUF_CACHE/dkms-host/KVER/modules
set -euo pipefail
host=0
[ "${1:-}" = --host ] && { host=1; shift; }
repo=$(cd "${1:?repository}" && pwd)
cache=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}
root=$cache/trixie-root
ver=$(awk '/define KVDMABUF_VERSION_(MAJOR|MINOR|PATCH) / \
	{ v = v (v == "" ? "" : ".") $3 } END { print v }' "$repo/lib/kvdmabuf.h")

if [ $host = 1 ]; then
	kver=${2:?kernel release}
	out=$cache/dkms-host/$kver
	command -v dkms >/dev/null || {
		echo "dkms.sh: no dkms on this machine (tests/vm/deps.sh host installs it)" >&2
		exit 1
	}
	rm -rf "$out"
	mkdir -p "$out/modules" "$out/work" "$out/dkms"
	make -s -C "$repo" dkms-src DESTDIR="$out/src"
	if unshare -m --propagation private sh -ec '
		kver=$1 out=$2 ver=$3
		mount -t overlay overlay -o "lowerdir=/lib/modules/$kver,upperdir=$out/modules,workdir=$out/work" \
			"/lib/modules/$kver"
		set -- --dkmstree "$out/dkms" --sourcetree "$out/src/usr/src"
		dkms add "kvdmabuf/$ver" "$@"
		dkms install "kvdmabuf/$ver" -k "$kver" "$@"' - "$kver" "$out" "$ver" \
		>"$out.log" 2>&1; then
		echo "dkms: kvdmabuf/$ver installed for $kver in $out/modules"
		exit 0
	fi
	tail -20 "$out.log" >&2
	echo "dkms: kvdmabuf/$ver failed for $kver (log $out.log)" >&2
	exit 1
fi

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
