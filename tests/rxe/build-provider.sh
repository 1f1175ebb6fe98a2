#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Builds rdma-core's user-space rxe provider with dma-buf MR registration
# (tests/rxe/rdma-core/MAJOR/*.patch: the provider API differs between
# releases) from the rdma-core release of the
# libibverbs installed in ROOT (a provider links against libibverbs'
# private ABI), once per release and series, on this machine, and copies it
# into OUT for a guest that uses ROOT. It never touches ROOT's or this
# machine's libraries: the guest loads it by path with RDMAV_DRIVERS
# (tests/vm/guest-run.sh).
#
#   build-provider.sh ROOT OUT
#
# The source, first found of: $KVDMABUF_RDMA_CORE_GIT (a git copy of
# linux-rdma/rdma-core with its release tags, local or a URL);
# $KVDMABUF_CACHE/rdma-core.git (a bare clone kept there); the source
# distribution named in tests/rxe/rdma-core/MAJOR/source, fetched
# hash-checked from the Python package index pip uses (pyverbs' sdist
# carries the whole rdma-core tree of its release); GitHub's rdma-core.
# Where none can be had, OUT/SKIP says why and the exit status is 0.
set -euo pipefail
root=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}/rdma-core
git_src=${KVDMABUF_RDMA_CORE_GIT:-}
if [ -z "$git_src" ] && [ -d "$cache.git" ]; then
	git_src=$cache.git
fi
jobs=${KVDMABUF_JOBS:-$(nproc)}
mkdir -p "$out" "$cache"
rm -f "$out/SKIP" "$out"/librxe-rdmav*.so

skip() {
	echo "$*" >"$out/SKIP"
	echo "rxe provider: not built: $*"
	exit 0
}

ver=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' libibverbs1 2>/dev/null) ||
	skip "no libibverbs1 in $root"
ver=${ver%%-*}		# Debian revision
ver=${ver#*:}		# epoch
tag=v$ver
series=$here/rdma-core/${ver%%.*}
[ -d "$series" ] || skip "no rxe provider patch for rdma-core $ver (tests/rxe/rdma-core/${ver%%.*})"
key=$ver-$(cat "$series"/*.patch | sha256sum | cut -c1-12)
dir=$cache/$key

exec 7>"$cache/.lock"
flock 7
if [ ! -f "$dir/.done" ]; then
	echo "rxe provider: building rdma-core $tag with tests/rxe/rdma-core (once)"
	rm -rf "$dir"
	mkdir -p "$dir/src"
	# VERSION PACKAGE FILE SHA256 TREE of the sdist for this release.
	sdist=$(awk -v v="$ver" '$1 == v { print $2, $3, $4, $5 }' \
		"$series/source" 2>/dev/null || true)
	if [ -d "$git_src" ]; then
		git -C "$git_src" archive "$tag" | tar -x -C "$dir/src" ||
			skip "no tag $tag in $git_src"
	elif [ -z "$git_src" ] && [ -n "$sdist" ]; then
		set -- $sdist
		python3 "$here/fetch-sdist.py" "$1" "$2" "$3" "$dir/$2" \
			>"$dir/fetch.log" 2>&1 ||
			skip "cannot fetch $2 from the package index: $(tail -1 "$dir/fetch.log")"
		tar -xzf "$dir/$2" -C "$dir/src" --strip-components=2 "$4"
		rm -f "$dir/$2"
	else
		git_src=${git_src:-https://github.com/linux-rdma/rdma-core.git}
		git clone -q --depth 1 --branch "$tag" "$git_src" "$dir/src.git" \
			>"$dir/clone.log" 2>&1 ||
			skip "cannot fetch rdma-core $tag from $git_src (set KVDMABUF_RDMA_CORE_GIT)"
		git -C "$dir/src.git" archive "$tag" | tar -x -C "$dir/src"
		rm -rf "$dir/src.git"
	fi
	for p in "$series"/*.patch; do
		patch -s -p1 -d "$dir/src" <"$p"
	done
	mkdir -p "$dir/build"
	(
		cd "$dir/build"
		cmake -GNinja -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 \
			-DCMAKE_BUILD_TYPE=RelWithDebInfo ../src
		# Only the provider (and what it needs to link).
		target=$(ninja -t targets all | sed -n 's/^\(rxe-rdmav[0-9]*\): .*/\1/p' | head -1)
		ninja -j"$jobs" "$target"
	) >"$dir/build.log" 2>&1 || {
		tail -20 "$dir/build.log" >&2
		echo "rxe provider: build failed, log in $dir/build.log" >&2
		exit 1
	}
	touch "$dir/.done"
fi
cp "$dir"/build/lib/librxe-rdmav*.so "$out/"
