#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Judges the skips of a lane's log against tests/vm/expected-skips: prints a
# failing TAP line, with the test's reason, for each skip not listed for
# LANE with that program, test and reason, and exits 1 if there was any (or
# if a line of the list has no reason). The program of each TAP line is the
# last "# ===== NAME" header of run-tests.sh before it.
#
#   skips.sh LANE LOG [LIST]
set -u
lane=$1 log=$2
list=${3:-$(cd "$(dirname "$0")/../.." && pwd)/tests/vm/expected-skips}
tr -d '\r' <"$log" | awk -v lane="$lane" -v list="$list" '
	function glob2re(g) {
		gsub(/[.+^$(){}|\[\]\\]/, "\\\\&", g)
		gsub(/\*/, ".*", g)
		gsub(/\?/, ".", g)
		return "^" g "$"
	}
	BEGIN {
		n = 0
		bad = 0
		while ((getline line < list) > 0) {
			ln++
			if (line ~ /^[ \t]*(#|$)/)
				continue
			# LANE PROGRAM TEST # REASON
			i = index(line, "#")
			why = i ? substr(line, i + 1) : ""
			sub(/^[ \t]+/, "", why)
			sub(/[ \t]+$/, "", why)
			if (split(i ? substr(line, 1, i - 1) : line, f) != 3 || why == "") {
				printf "not ok - %s:%d: not LANE PROGRAM TEST # REASON\n", list, ln
				bad = 1
				continue
			}
			if (f[1] != lane)
				continue
			n++
			prog[n] = f[2]
			test[n] = glob2re(f[3])
			reason_re[n] = glob2re(why)
			reason_glob[n] = why
		}
	}
	/^# ===== / { cur = $3; next }
	/^ok .*# SKIP/ {
		name = $0
		sub(/^ok [0-9]+ /, "", name)
		reason = name
		sub(/ # SKIP.*/, "", name)
		sub(/.*# SKIP ?/, "", reason)
		listed = ""
		for (i = 1; i <= n; i++) {
			if (prog[i] != cur || name !~ test[i])
				continue
			if (reason ~ reason_re[i])
				next
			listed = listed "; listed: " reason_glob[i]
		}
		if (listed != "")
			printf "not ok - skip on lane %s for another reason: %s %s: %s%s\n", lane, cur, name, reason, listed
		else
			printf "not ok - unexpected skip on lane %s: %s %s: %s\n", lane, cur, name, reason
		bad = 1
	}
	END { exit bad }'
