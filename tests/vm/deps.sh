#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Installs what the build and the VM lanes need, and nothing when it is all
# there (a second run does not touch the network). Run as root.
#
#   deps.sh host    Debian 12 packages on this machine
#   deps.sh 6.1     + Mooncake's wheel in a virtual environment of this
#                   root's python3 ($KVDMABUF_CACHE/mooncake-venv), which
#                   the lane's guests share
#   deps.sh debug   + in that root, the 7.3 lane's kernel, its
#                   linux-source-7.x and the kernel build tools: the
#                   debug-lane kernel is built there, with Debian 13's gcc-14
#   deps.sh 6.12    + a Debian 13 root (kernel 6.12, gcc-14, -dev packages)
#                   built with debootstrap under $KVDMABUF_CACHE
#   deps.sh 7.3     + in that root, from trixie-backports, the newest 7.x
#                   kernel image and headers (the dma-buf revoke API)
#   deps.sh plan LANE   prints the steps LANE runs, one per line, and runs
#                   none (tests/harness/deps_plan.sh checks them)
#   Every lane whose kernel has an rxe patch series (tests/rxe/patches/X.Y)
#   gets that kernel's linux-source-X.Y in the root it builds in: the one
#   step kernel_source, whatever other lane ran before.
#   (6.12, 7.3 and debug: + Mooncake's wheel in a virtual environment of
#   that root's python3, /opt/kvdmabuf-mooncake-venv in it)
#
# KVDMABUF_CACHE (default /var/cache/kvdmabuf) holds everything built here
# that outlives a checkout.
set -euo pipefail

CACHE=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}
# Debian's archive as this machine reaches it (a site mirror or proxy):
# KVDMABUF_MIRROR, else the first source of apt's own lists that carries a
# Debian release (debian_mirror below); looked up only when a step
# downloads.
MIRROR=${KVDMABUF_MIRROR:-}

HOST_PKGS="make gcc libc6-dev pkg-config linux-image-amd64 linux-headers-amd64
 qemu-system-x86 busybox-static rdma-core ibverbs-utils libibverbs-dev
 libdrm-dev libyaml-dev debootstrap rsync cpio xz-utils zstd iproute2 kmod
 util-linux coreutils locales python3 python3-pyverbs mandoc
 python3-venv python3-pip python3-setuptools libnuma1 libcurl4 perftest
 cmake ninja-build libnl-3-dev libnl-route-3-dev git patch dkms"

# Mooncake (transfer engine, store, mooncake_master), pinned by version and
# by the sha256 of each wheel (one per CPython ABI: cp311 for Debian 12's
# python3, cp313 for Debian 13's): tests/vm/mooncake-requirements.txt.
# Installed hash-checked, binary only, without its Python dependencies
# (aiohttp, requests, msgpack: only its HTTP tools use them, not the engine
# or the store), into a virtual environment that sees the system's packages
# (pyverbs). At run time it needs libibverbs1, libnuma1 and libcurl4.
MOONCAKE_REQ=$(cd "$(dirname "$0")" && pwd)/mooncake-requirements.txt



# Prints the URI of the first apt source of this machine, one-line
# (sources.list, *.list) or deb822 (*.sources, its URIs: and Suites:), of
# type deb, not disabled, whose suites include a Debian release (bookworm,
# trixie, ..., stable, sid: not -updates or -security); fails with a
# message naming KVDMABUF_MIRROR if there is none.
debian_mirror() {
	local f files=()
	[ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
	for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] && files+=("$f")
	done
	[ ${#files[@]} -gt 0 ] && awk '
		function release(s) {
			return s ~ /^(buster|bullseye|bookworm|trixie|forky|duke|sid|oldoldstable|oldstable|stable|testing|unstable)$/
		}
		function stanza(   i, n, u, s) {
			if (!found && types ~ /(^|[ \t])deb([ \t]|$)/ && enabled !~ /^[ \t]*no/) {
				n = split(suites, s)
				split(uris, u)
				for (i = 1; i <= n; i++)
					if (release(s[i]) && u[1] != "") {
						print u[1]
						found = 1
						exit
					}
			}
			types = uris = suites = enabled = ""
		}
		FNR == 1 { stanza(); deb822 = FILENAME ~ /\.sources$/ }
		/^[ \t]*#/ { next }
		!deb822 {
			sub(/\[[^]]*\]/, "")
			if ($1 == "deb" && release($3)) {
				print $2
				found = 1
				exit
			}
			next
		}
		/^[ \t]*$/ { stanza(); next }
		tolower($1) == "types:" { $1 = ""; types = $0 }
		tolower($1) == "uris:" { $1 = ""; uris = $0 }
		tolower($1) == "suites:" { $1 = ""; suites = $0 }
		tolower($1) == "enabled:" { $1 = ""; enabled = $0 }
		END { stanza() }' "${files[@]}" | grep . && return 0
	echo "deps: no Debian release in this machine's apt sources" \
		"(/etc/apt/sources.list, /etc/apt/sources.list.d): set" \
		"KVDMABUF_MIRROR to Debian's archive or a mirror of it" >&2
	return 1
}

# Sets MIRROR, once, for a step that downloads.
need_mirror() {
	[ -n "$MIRROR" ] || MIRROR=$(debian_mirror) || exit 1
}

# Debian 13 root: built inside it are the 6.12 modules and the lane's tests;
# the guest runs it as its user space.
TRIXIE_PKGS="build-essential,gcc-14,linux-image-amd64,linux-headers-amd64,\
libibverbs-dev,libdrm-dev,libyaml-dev,rdma-core,ibverbs-utils,kmod,iproute2,\
busybox-static,rsync"
TRIXIE_ROOT=$CACHE/trixie-root
# Bump when TRIXIE_PKGS changes, so that cached roots get rebuilt.
TRIXIE_STAMP=$TRIXIE_ROOT/.kvdmabuf-root-v1
# What is added to that root from trixie-backports, in place (no new
# debootstrap): the newest 7.x kernel (deps.sh 7.3 and debug) and the
# kernel build tools (deps.sh debug). Bump a stamp's -vN when its package
# set changes: cached roots then get the step run again. The kernel's stamp
# holds the kernel version it installed.
BPO_SUITE=trixie-backports
BPO_KERNEL_STAMP=$TRIXIE_ROOT/.kvdmabuf-bpo-kernel-v1
BPO_DEBUG_STAMP=$TRIXIE_ROOT/.kvdmabuf-bpo-debug-v2
BPO_DEBUG_PKGS="flex bison bc libelf-dev libssl-dev cpio xz-utils"
# The rxe patch series, one folder per kernel X.Y (tests/rxe/build.sh).
RXE_SERIES=$(cd "$(dirname "$0")/../rxe/patches" && pwd)
# Added to that root in place too (stamped the same way): what the Python
# tests run on (python3, rdma-core's pyverbs), DKMS (tests/vm/dkms.sh) and
# an OCI runtime that reads CDI specs (tests/module/cdi_container.py).
ROOT_EXTRA_PKGS="python3 python3-pyverbs dkms perftest podman crun"
ROOT_EXTRA_STAMP=$TRIXIE_ROOT/.kvdmabuf-root-extras-v4
# Mooncake's run-time libraries and python3's venv in that root (Debian 13
# names libcurl4 libcurl4t64); its venv, at this path inside the root.
ROOT_MOONCAKE_PKGS="python3-venv libnuma1 libcurl4t64"
ROOT_MOONCAKE_STAMP=$TRIXIE_ROOT/.kvdmabuf-root-mooncake-v1
ROOT_MOONCAKE_VENV=/opt/kvdmabuf-mooncake-venv

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
	need_mirror
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

# Runs a command in the Debian 13 root (its /dev and /proc mounted in a
# private namespace: they vanish with it).
in_root() {
	unshare -m --propagation private sh -c '
		r=$1; shift
		mount --rbind /dev "$r/dev" && mount -t proc proc "$r/proc" &&
		exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
			HOME=/root LC_ALL=C DEBIAN_FRONTEND=noninteractive "$@"' \
		- "$TRIXIE_ROOT" "$@"
}

# Packages added to the Debian 13 root in place, once per stamp.
root_install() { # stamp log-name packages
	local stamp=$1 log=$CACHE/$2.log pkgs=$3
	[ -f "$stamp" ] && return 0
	need_root "$pkgs in $TRIXIE_ROOT"
	echo "deps: installing $pkgs into $TRIXIE_ROOT"
	cp /etc/resolv.conf "$TRIXIE_ROOT/etc/resolv.conf" 2>/dev/null || true
	{ in_root apt-get update -qq &&
	  in_root apt-get install -y -qq --no-install-recommends \
		$pkgs; } >"$log" 2>&1 || {
		tail -20 "$log" >&2
		echo "deps: installing $pkgs failed, log in $log" >&2
		exit 1
	}
	touch "$stamp"
}

root_extras() {
	root_install "$ROOT_EXTRA_STAMP" root-extras "$ROOT_EXTRA_PKGS"
}

# linux-source-X.Y in the root a lane builds in (/ for 6.1, the Debian 13
# root for the others), from trixie-backports for 7.x. Checked by the
# tarball itself, not a stamp: it is what tests/rxe/build.sh and
# tests/vm/debug-kernel.sh read.
kernel_source() { # X.Y
	local ver=$1 root=$TRIXIE_ROOT run=(in_root) opt=() log
	[ "$ver" = 6.1 ] && { root=; run=(); }
	[ -f "$root/usr/src/linux-source-$ver.tar.xz" ] && return 0
	need_root "linux-source-$ver in ${root:-/}"
	log=$CACHE/linux-source-$ver.log
	mkdir -p "$CACHE"
	case $ver in 7.*) bpo_update; opt=(-t "$BPO_SUITE") ;; esac
	[ -n "$root" ] && cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
	echo "deps: installing linux-source-$ver into ${root:-/}"
	{ [ ${#opt[@]} -gt 0 ] || "${run[@]}" apt-get update -qq; } >"$log" 2>&1
	"${run[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends "${opt[@]}" "linux-source-$ver" >>"$log" 2>&1 &&
		[ -f "$root/usr/src/linux-source-$ver.tar.xz" ] || {
		tail -20 "$log" >&2
		echo "deps: installing linux-source-$ver failed, log in $log" >&2
		exit 1
	}
}

# X.Y of the kernel a lane boots: 6.1 and 6.12 by name, 7.3 and debug the
# 7.x kernel bpo_kernel installed.
lane_kernel_xy() { # lane
	case $1 in
	6.1 | 6.12) echo "$1" ;;
	*) sed -n 's/^\([0-9]*\.[0-9]*\).*/\1/p' "$BPO_KERNEL_STAMP" ;;
	esac
}

# The source of the lane's kernel where tests/rxe has a patch series for it
# (soft-RoCE with dma-buf MRs is built from it; without the source its
# tests would skip).
rxe_source() { # lane
	local xy
	xy=$(lane_kernel_xy "$1")
	[ -d "$RXE_SERIES/$xy" ] || return 0
	kernel_source "$xy"
}

# The debug kernel is built from its lane's kernel source.
debug_source() {
	kernel_source "$(lane_kernel_xy debug)"
}

# The backports suite in the root's sources, and a fresh package index.
bpo_update() {
	local list=$TRIXIE_ROOT/etc/apt/sources.list.d/kvdmabuf-backports.list
	need_mirror
	echo "deb $MIRROR $BPO_SUITE main" >"$list"
	cp /etc/resolv.conf "$TRIXIE_ROOT/etc/resolv.conf" 2>/dev/null || true
	in_root apt-get update -qq >/dev/null
}

# The newest 7.x kernel of trixie-backports, by its headers package
# (linux-headers-7.X.Y+debNN-amd64): prints 7.X.Y+debNN-amd64.
bpo_newest_kernel() {
	in_root apt-cache pkgnames linux-headers-7. |
		sed -n 's/^linux-headers-\(7\.[0-9.]*+deb[0-9]*-amd64\)$/\1/p' |
		sort -V | tail -1
}

# Installs the newest 7.x kernel image (a meta package in 7.x: the kernel
# is in linux-binary-*, the modules in linux-modules-*) and its headers.
bpo_kernel() {
	local kver
	if [ -f "$BPO_KERNEL_STAMP" ]; then
		kver=$(cat "$BPO_KERNEL_STAMP")
		[ -e "$TRIXIE_ROOT/boot/vmlinuz-$kver" ] &&
			[ -d "$TRIXIE_ROOT/lib/modules/$kver/build" ] && return 0
	fi
	need_root "kernel 7.x from $BPO_SUITE in $TRIXIE_ROOT"
	bpo_update
	kver=$(bpo_newest_kernel)
	[ -n "$kver" ] || {
		echo "deps: no linux-headers-7.* in $BPO_SUITE" >&2
		exit 1
	}
	echo "deps: installing kernel $kver from $BPO_SUITE into $TRIXIE_ROOT"
	in_root apt-get install -y -qq --no-install-recommends -t "$BPO_SUITE" \
		"linux-image-$kver" "linux-headers-$kver" \
		>"$CACHE/bpo-kernel.log" 2>&1 || {
		tail -20 "$CACHE/bpo-kernel.log" >&2
		echo "deps: installing $kver failed, log in $CACHE/bpo-kernel.log" >&2
		exit 1
	}
	[ -e "$TRIXIE_ROOT/boot/vmlinuz-$kver" ] || {
		echo "deps: $kver installed no /boot/vmlinuz-$kver" >&2
		exit 1
	}
	echo "$kver" >"$BPO_KERNEL_STAMP"
}

# What building a kernel needs, in the root: the debug-lane kernel is built
# there with Debian 13's gcc-14.
debug_tools() {
	root_install "$BPO_DEBUG_STAMP" bpo-debug "$BPO_DEBUG_PKGS"
}

# A virtual environment of /usr/bin/python3 with the pinned Mooncake wheel.
# Host root (6.1): at $1, under $KVDMABUF_CACHE, which the lane's guests
# share read-only. Debian 13 root (the others): at $1 inside $2, the path
# the guests see. Stamped with the requirements file's hash: a new pin
# installs anew. A venv records its own path, so it is built in place, by
# the root's own python3 (chroot). The wheel for that python3's ABI is
# fetched on this machine (its pip settings: a site index or proxy) and
# installed in the root from that folder only (--no-index); both steps
# check the pinned hash and take wheels only.
mooncake_venv() { # venv-dir [root]
	local venv=$1 root=${2:-} stamp dir log=$CACHE/mooncake-venv${2:+-root}.log
	local run=() abi
	[ -n "$root" ] && run=(in_root)
	stamp=$root$venv/.kvdmabuf-mooncake-$(sha256sum <"$MOONCAKE_REQ" | cut -c1-16)
	[ -f "$stamp" ] && return 0
	need_root "Mooncake in $root$venv"
	echo "deps: installing $(sed -n 's/^\([a-z-]*==[^ ]*\).*/\1/p' "$MOONCAKE_REQ") into $root$venv"
	rm -rf "$root$venv"
	mkdir -p "$(dirname "$root$venv")"
	# The wheels' folder, where the root's pip reads it.
	dir=$(mktemp -d "$root/tmp/kvd-mooncake.XXXXXX")
	cp "$MOONCAKE_REQ" "$dir/requirements.txt"
	{ abi=$("${run[@]}" /usr/bin/python3 -c \
		'import sys; print("%d.%d" % sys.version_info[:2])') &&
	  /usr/bin/python3 -m pip download -q --disable-pip-version-check \
		--no-deps --require-hashes --only-binary=:all: \
		--implementation cp --python-version "$abi" \
		--abi "cp${abi/./}" --platform manylinux_2_28_x86_64 \
		-d "$dir" -r "$MOONCAKE_REQ" &&
	  "${run[@]}" /usr/bin/python3 -m venv --system-site-packages "$venv" &&
	  "${run[@]}" "$venv/bin/pip" install -q --disable-pip-version-check \
		--no-index --find-links "${dir#"$root"}" \
		--no-deps --require-hashes --only-binary=:all: \
		-r "${dir#"$root"}/requirements.txt" &&
	  "${run[@]}" "$venv/bin/python3" -c 'import mooncake.engine, mooncake.store'
	} >"$log" 2>&1 || {
		tail -20 "$log" >&2
		echo "deps: installing Mooncake failed, log in $log" >&2
		rm -rf "$root$venv" "$dir"
		exit 1
	}
	rm -rf "$dir"
	touch "$stamp"
}

# Mooncake in the Debian 13 root: what its wheel runs on (libibverbs1 is
# there with rdma-core) and python3's venv, then the venv at
# ROOT_MOONCAKE_VENV (the guests' path; tests/vm/check.sh passes it).
root_mooncake() {
	root_install "$ROOT_MOONCAKE_STAMP" root-mooncake "$ROOT_MOONCAKE_PKGS"
	mooncake_venv "$ROOT_MOONCAKE_VENV" "$TRIXIE_ROOT"
}

# Each lane's steps, in order. PLAN=1 prints them instead of running them.
step() {
	if [ -n "${PLAN:-}" ]; then
		echo "$*"
	else
		"$@"
	fi
}

lane() {
	case $1 in
	host)
		step host_deps
		;;
	6.1)
		step host_deps
		step rxe_source 6.1
		step mooncake_venv "$CACHE/mooncake-venv"
		;;
	6.12)
		step host_deps
		step trixie_root
		step root_extras
		step rxe_source 6.12
		step root_mooncake
		;;
	7.3)
		step host_deps
		step trixie_root
		step root_extras
		step bpo_kernel
		step rxe_source 7.3
		step root_mooncake
		;;
	debug)
		step host_deps
		step trixie_root
		step root_extras
		step bpo_kernel
		step rxe_source debug
		step debug_source
		step debug_tools
		step root_mooncake
		;;
	*)
		echo "usage: $0 [plan] host|6.1|6.12|7.3|debug" >&2
		exit 2
		;;
	esac
}

if [ "${1:-}" = plan ]; then
	PLAN=1 lane "${2:-host}"
else
	lane "${1:-host}"
fi
