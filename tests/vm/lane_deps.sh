#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Each kernel lane installs what its own build reads, whatever lane ran
# before it (a fresh machine runs 7.3 before debug): deps.sh's plan of
# every lane that check.sh runs, against what the lane's build reads.
#  - Every lane builds tests/rxe (make all) from its kernel's source where
#    tests/rxe/patches has a series: its plan has rxe_source, and
#    rxe_source installs the very tarball tests/rxe/build.sh opens.
#  - The debug lane builds its kernel from the source of the 7.x kernel:
#    bpo_kernel, then debug_source, then debug_tools, in its own plan.
#  - Every step a plan names is a function of deps.sh.
# Runs no step (deps.sh plan), so it needs neither root nor the network.
set -u
here=$(cd "$(dirname "$0")" && pwd)
deps=$here/deps.sh
n=0 failed=0

ok() { # cond description
	n=$((n + 1))
	if [ "$1" = 0 ]; then
		echo "ok $n $2"
	else
		echo "not ok $n $2"
		failed=1
	fi
}

# The lanes make check runs, as check.sh lists them.
lanes=$(sed -n 's/^[[:space:]]*for lane in \(.*\); do$/\1/p' "$here/check.sh" | head -1)
echo "TAP version 13"
echo "1..$((3 * $(echo "$lanes" | wc -w) + 2))"

has() { grep -qx "$1" <<<"$2"; }

for lane in $lanes; do
	plan=$("$deps" plan "$lane" 2>&1)
	rc=$?
	ok $rc "lane $lane: deps.sh plan $lane succeeds"
	bad=
	while read -r step _; do
		grep -q "^$step() {" "$deps" || bad="$bad $step"
	done <<<"$plan"
	[ -z "$bad" ]
	ok $? "lane $lane: every step of its plan is a function of deps.sh${bad:+ (not:$bad)}"
	has "rxe_source $lane" "$plan"
	ok $? "lane $lane: its plan installs its kernel's source for tests/rxe (rxe_source $lane)"
done

plan=$("$deps" plan debug)
order=$(grep -nx -e bpo_kernel -e debug_source -e debug_tools <<<"$plan" | cut -d: -f2 | tr '\n' ' ')
[ "$order" = "bpo_kernel debug_source debug_tools " ]
ok $? "lane debug: bpo_kernel, debug_source, debug_tools in that order (got: $order)"

# The tarball build.sh opens is the one kernel_source checks for.
want=$(sed -n 's/^tarball=\(.*\)$/\1/p' "$here/../rxe/build.sh")
grep -q "\"\$root$want\"" "$deps"
ok $? "deps.sh's kernel_source checks for tests/rxe/build.sh's tarball ($want)"
exit $failed
