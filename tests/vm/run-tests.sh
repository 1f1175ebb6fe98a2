#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Runs the test programs named in a list file (one name per line, '#'
# comments), streaming their TAP output. A name may be followed by
# "!LANE[,LANE..]": the lanes that leave the program out (KVDMABUF_LANE,
# set by tests/vm/check.sh; the list says why), with a "# omitted" line. A program that ends with a status
# other than pass (0) or skip (4) without reporting a failing test itself,
# or that is missing, is reported as one failing test, so that a crash can
# never look like a pass.
#
#   run-tests.sh LIST BINDIR
#   run-tests.sh --names LIST   only the names of the programs it would run
#                               (the lane's marks applied), one a line
#
# Exits 1 when anything failed. Used on the host (unit lane) and inside the
# VM (kernel lanes) alike.
set -u
names_only=
[ "$1" = --names ] && { names_only=1; shift; }
list=$1
bindir=${2:-}
per_program_timeout=${KVDMABUF_PROGRAM_TIMEOUT:-1200}
out=$(mktemp /tmp/kvd-test.XXXXXX)
trap 'rm -f "$out"' EXIT
failed=0

while read -r name not _; do
	case "$name" in '' | '#'*) continue ;; esac
	case "$not" in
	'!'*)
		if [[ -n "${KVDMABUF_LANE:-}" && ",${not#!}," == *",$KVDMABUF_LANE,"* ]]; then
			[ -n "$names_only" ] ||
				echo "# omitted on lane $KVDMABUF_LANE: $name ($list)"
			continue
		fi
		;;
	esac
	if [ -n "$names_only" ]; then
		echo "$name"
		continue
	fi
	echo "# ===== $name"
	if [ ! -x "$bindir/$name" ]; then
		echo "not ok - $name: not built ($bindir/$name)"
		failed=1
		continue
	fi
	t0=$SECONDS
	timeout -k 5 "$per_program_timeout" "$bindir/$name" 2>&1 | tee "$out"
	rc=${PIPESTATUS[0]}
	# where a lane's time goes (docs/testing.md)
	echo "# time: $name $((SECONDS - t0)) s"
	case $rc in
	0 | 4) ;;
	*)
		failed=1
		grep -q '^not ok' "$out" ||
			echo "not ok - $name: exited with status $rc"
		;;
	esac
done <"$list"
exit $failed
