#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Judges the skips of a lane's log against tests/vm/expected-skips: prints a
# failing TAP line, with the test's reason, for each skip not listed for
# LANE, and exits 1 if there was any. The program of each TAP line is the
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
		while ((getline line < list) > 0) {
			sub(/#.*/, "", line)
			if (split(line, f) < 2 || f[1] != lane)
				continue
			n++
			prog[n] = f[2]
			test[n] = glob2re(f[3] == "" ? "*" : f[3])
		}
		bad = 0
	}
	/^# ===== / { cur = $3; next }
	/^ok .*# SKIP/ {
		name = $0
		sub(/^ok [0-9]+ /, "", name)
		reason = name
		sub(/ # SKIP.*/, "", name)
		sub(/.*# SKIP ?/, "", reason)
		for (i = 1; i <= n; i++)
			if (prog[i] == cur && name ~ test[i])
				next
		printf "not ok - unexpected skip on lane %s: %s %s: %s\n", lane, cur, name, reason
		bad = 1
	}
	END { exit bad }'
