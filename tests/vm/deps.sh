#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Installs what the build and the VM lanes need, and nothing when it is all
# there (a second run does not touch the network). Run as root.
#
#   deps.sh host    Debian 12 packages on this machine (also the 6.1 lane)
#   deps.sh debug   + what building the debug-lane kernel needs
#   deps.sh 6.12    + a Debian 13 root (kernel 6.12, gcc-14, -dev packages)
#                   built with debootstrap under $KVDMABUF_CACHE
#
# KVDMABUF_CACHE (default /var/cache/kvdmabuf) holds everything built here
# that outlives a checkout.
set -euo pipefail

CACHE=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}
MIRROR=${KVDMABUF_MIRROR:-http://deb.debian.org/debian}

HOST_PKGS="make gcc libc6-dev pkg-config linux-image-amd64 linux-headers-amd64
 qemu-system-x86 busybox-static rdma-core ibverbs-utils libibverbs-dev
 libdrm-dev libyaml-dev debootstrap rsync cpio xz-utils zstd iproute2 kmod
 util-linux coreutils locales"

DEBUG_PKGS="linux-source-6.1 flex bison bc libelf-dev libssl-dev"

# Debian 13 root: built inside it are the 6.12 modules and the lane's tests;
# the guest runs it as its user space.
TRIXIE_PKGS="build-essential,gcc-14,linux-image-amd64,linux-headers-amd64,\
libibverbs-dev,libdrm-dev,libyaml-dev,rdma-core,ibverbs-utils,kmod,iproute2,\
busybox-static,rsync"
TRIXIE_ROOT=$CACHE/trixie-root
# Bump when TRIXIE_PKGS changes, so that cached roots get rebuilt.
TRIXIE_STAMP=$TRIXIE_ROOT/.kvdmabuf-root-v1

need_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "deps.sh: missing dependencies and not root: $*" >&2
		exit 1
	fi
}

host_deps() {
	local missing=() p
	for p in $HOST_PKGS "$@"; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null |
			grep -q '^install ok installed$' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	need_root "${missing[*]}"
	echo "deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

trixie_root() {
	[ -f "$TRIXIE_STAMP" ] && return 0
	need_root "Debian 13 root in $TRIXIE_ROOT"
	local tmp=$TRIXIE_ROOT.tmp
	echo "deps: building the Debian 13 root in $TRIXIE_ROOT (a few minutes, once)"
	mkdir -p "$CACHE"
	rm -rf "$tmp"
	debootstrap --variant=minbase --include="$TRIXIE_PKGS" trixie "$tmp" \
		"$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
		tail -20 "$CACHE/debootstrap.log" >&2
		echo "deps: debootstrap failed, log in $CACHE/debootstrap.log" >&2
		exit 1
	}
	rm -rf "$TRIXIE_ROOT"
	mv "$tmp" "$TRIXIE_ROOT"
	touch "$TRIXIE_STAMP"
}

case "${1:-host}" in
host | 6.1)
	host_deps
	;;
6.12)
	host_deps
	trixie_root
	;;
debug)
	host_deps $DEBUG_PKGS
	;;
*)
	echo "usage: $0 host|6.1|6.12|debug" >&2
	exit 2
	;;
esac
