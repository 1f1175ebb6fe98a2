#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Builds soft-RoCE (rdma_rxe.ko) with dma-buf memory regions out of tree:
# the rxe source of the kernel KDIR was built from (Debian's
# linux-source-X.Y package, /usr/src/linux-source-X.Y.tar.xz) plus our
# patch series tests/rxe/patches/X.Y/*.patch (tests/rxe/README.md).
#
#   build.sh KDIR OUT
#
# OUT/rdma_rxe.ko on success. Where this kernel has no series, or its
# source package is not installed, OUT/SKIP says why (exit status 0: the
# tests that need the module skip with that reason). The extracted and
# patched source is kept in OUT/src and reused while the tarball and the
# series are the same. Runs where the lane's modules are built (in the
# Debian 13 root for its lanes).
set -euo pipefail
kdir=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)	# kbuild wants M= absolute
rm -f "$out/SKIP" "$out/rdma_rxe.ko"

skip() {
	echo "$*" >"$out/SKIP"
	echo "rxe: not built: $*"
	exit 0
}

rel=$(cat "$kdir/include/config/kernel.release" 2>/dev/null) ||
	skip "no kernel.release in $kdir"
ver=$(echo "$rel" | sed -n 's/^\([0-9]*\.[0-9]*\).*/\1/p')
series=$here/patches/$ver
tarball=/usr/src/linux-source-$ver.tar.xz
[ -d "$series" ] || skip "no rxe dma-buf patch series for Linux $ver (tests/rxe/patches/$ver)"
[ -f "$tarball" ] || skip "linux-source-$ver is not installed ($tarball)"

# The stamp: the tarball and the series; a change of either re-extracts.
stamp=$( { stat -c '%n %s %Y' "$tarball"; cat "$series"/*.patch; } | sha256sum | cut -c1-16)
src=$out/src
if [ "$(cat "$src/.kvd-stamp" 2>/dev/null)" != "$stamp" ]; then
	rm -rf "$src" "$out/tree"
	mkdir -p "$out/tree"
	echo "rxe: extracting drivers/infiniband/sw/rxe from $tarball"
	tar -xJf "$tarball" -C "$out/tree" --strip-components=1 \
		"linux-source-$ver/drivers/infiniband/sw/rxe"
	for p in "$series"/*.patch; do
		echo "rxe: applying ${p##*/}"
		patch -s -p1 -d "$out/tree" <"$p"
	done
	mv "$out/tree/drivers/infiniband/sw/rxe" "$src"
	rm -rf "$out/tree"
	echo "$stamp" >"$src/.kvd-stamp"
fi
make -C "$kdir" M="$src" CONFIG_RDMA_RXE=m modules
cp "$src/rdma_rxe.ko" "$out/rdma_rxe.ko"
