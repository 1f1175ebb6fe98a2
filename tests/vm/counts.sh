#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The number of tests each program reports per lane, against
# tests/vm/expected-counts: a program dropped from a list, one that stops
# before its first test, or a test that disappears shows as a difference.
# A program's tests are its numbered TAP lines ("ok N", "not ok N") after
# run-tests.sh's "# ===== NAME" header.
#
#   counts.sh print LANE LOG          the lines "LANE PROGRAM N" of a log
#   counts.sh check LANE LOG [FILE]   a failing TAP line per difference with
#                                     FILE's lines for LANE; exit 1 if any
#                                     (a count N,M: either, for programs
#                                     whose tests depend on the machine)
#   counts.sh update [LOGDIR [FILE]]  rewrites FILE's lines of each lane
#                                     whose log is in LOGDIR (build/logs:
#                                     unit.log, vm-LANE.log), keeping the
#                                     other lanes' (make update-counts)
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
file=$here/expected-counts

count() { # lane log
	tr -d '\r' <"$2" | awk -v lane="$1" '
		/^# ===== / { cur = $3; if (!(cur in n)) { order[++k] = cur; n[cur] = 0 }; next }
		/^(not )?ok [0-9]+ / { if (cur != "") n[cur]++ }
		END { for (i = 1; i <= k; i++) printf "%-8s %-30s %d\n", lane, order[i], n[order[i]] }'
}

case "${1:-}" in
print)
	count "$2" "$3"
	;;
check)
	lane=$2 log=$3 list=${4:-$file}
	got=$(count "$lane" "$log")
	awk -v lane="$lane" '
		NR == FNR { sub(/#.*/, ""); if (NF == 3 && $1 == lane) want[$2] = $3; next }
		# N, or N,M,...: counts that differ by the machine (a toolkit)
		function ok(n, w,   a, i, k) {
			k = split(w, a, ",")
			for (i = 1; i <= k; i++)
				if (a[i] == n)
					return 1
			return 0
		}
		{ got[$2] = $3; order[++k] = $2 }
		END {
			bad = 0
			for (p in want)
				if (!(p in got)) {
					printf "not ok - lane %s: %s ran no test (expected %d; tests/vm/expected-counts)\n", lane, p, want[p]
					bad = 1
				}
			for (i = 1; i <= k; i++) {
				p = order[i]
				if (!(p in want)) {
					printf "not ok - lane %s: %s ran %d tests, tests/vm/expected-counts has none for it (make update-counts)\n", lane, p, got[p]
					bad = 1
				} else if (!ok(got[p], want[p])) {
					printf "not ok - lane %s: %s ran %d tests, tests/vm/expected-counts says %d\n", lane, p, got[p], want[p]
					bad = 1
				}
			}
			exit bad
		}' "$list" - <<<"$got"
	;;
update)
	logs=${2:-$repo/build/logs} list=${3:-$file}
	tmp=$(mktemp)
	{
		sed -n '/^#/p' "$list" 2>/dev/null
		for lane in unit 6.1 6.12 7.3 debug; do
			log=$logs/vm-$lane.log
			[ $lane = unit ] && log=$logs/unit.log
			# check.sh run (one program) writes the same log
			# without the list's headers: not a lane's.
			new=
			[ -f "$log" ] && new=$(count "$lane" "$log")
			if [ -n "$new" ]; then
				# A listed alternative (N,M) that holds stays.
				awk 'NR == FNR { if (!/^#/ && NF == 3) old[$1 " " $2] = $3; next }
				     { k = $1 " " $2; n = split(old[k], a, ",")
				       for (i = 1; i <= n; i++)
					       if (n > 1 && a[i] == $3) {
						       printf "%-8s %-30s %s\n", $1, $2, old[k]
						       next
					       }
				       print }' "$list" - <<<"$new"
				echo "counts: lane $lane from $log:" \
					"$(awk '{ n++; t += $3 } END { print n " programs, " t " tests" }' <<<"$new")" >&2
			else
				awk -v lane="$lane" '!/^#/ && $1 == lane' "$list" 2>/dev/null
				echo "counts: lane $lane kept (no lane log $log)" >&2
			fi
		done
	} >"$tmp"
	mv "$tmp" "$list"
	;;
*)
	echo "usage: $0 print LANE LOG | check LANE LOG [FILE] | update [LOGDIR [FILE]]" >&2
	exit 2
	;;
esac
