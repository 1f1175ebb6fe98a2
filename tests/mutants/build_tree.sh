#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make mutants (tests/mutants/run.py): a breakage that is not the module's
# alone, built for a lane's batch, in the lane's build tree once the tree is
# built (make MUTANT_TREES=DIR; the Makefile's mutant-tree/DIR/NAME).
#
#   build_tree.sh DIR/NAME KDIR
#
# DIR/NAME/overlay holds the files the breakage edits, whole. Its tree,
# build/mutant-trees/NAME, is the lane's sources with those files laid
# over them, its own build of the library, the command and the tests (and
# of soft-RoCE where the breakage edits its patches), and the lane's
# kernel modules. The tree is kept between runs and made again the way a
# lane's build tree is: sources copied where they changed, a breakage's
# file written where it changed, make rebuilding what they feed. The guest
# runs the breakage's tests in that tree, bind-mounted over the build tree
# (tests/mutants/guest_batch.sh); build/mutant-trees/NAME/.built says it
# built.
set -euo pipefail
src=$1 kdir=$2
here=$(cd "$(dirname "$0")" && pwd)
dst=build/mutant-trees/${src##*/}
files=$(cd "$src/overlay" && find . -type f | sed 's|^\./||')
rxe=
grep -q '^tests/rxe/' <<<"$files" && rxe=1
# A new tree starts as a copy of the built one, times kept: its first build
# is the breakage's files and what they feed, not everything
[ -d "$dst" ] || { mkdir -p "$dst" && rsync -a --exclude=/build/ --exclude=/mutants/ \
	--exclude=/tests/rxe/build/src/ ./ "$dst/"; }
rm -f "$dst/.built"
# The sources, but the breakage's files (build outputs are the tree's own:
# excluded, and kept by --delete)
excl=()
for f in $files; do
	excl+=("--exclude=/$f")
done
rsync -a --delete "${excl[@]}" --exclude=/mutants/ \
	--filter="merge $here/../vm/sync-filter" ./ "$dst/"
# The lane's kernel modules, and soft-RoCE's build unless the breakage
# builds its own (its source kept in the tree: rebuilt only when the
# patches change, tests/rxe/build.sh)
rsync -a -m --exclude=/build/ --exclude=/mutants/ --exclude=/tests/rxe/ \
	--include='*/' --include='*.ko' --exclude='*' ./ "$dst/"
[ -n "$rxe" ] ||
	rsync -a --delete --exclude=/src/ tests/rxe/build/ "$dst/tests/rxe/build/"
for f in $files; do
	cmp -s "$src/overlay/$f" "$dst/$f" || cp "$src/overlay/$f" "$dst/$f"
done
targets="lib cli tests"
[ -z "$rxe" ] || targets+=" rxe"
# shellcheck disable=SC2086 # the targets are words
make -C "$dst" $targets KDIR="$kdir"
touch "$dst/.built"
