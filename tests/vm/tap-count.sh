#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Counts TAP results in a log: prints "PASS FAIL SKIP".
tr -d '\r' <"$1" | awk '
	/^not ok/ { fail++; next }
	/^ok .*# SKIP/ { skip++; next }
	/^ok/ { pass++ }
	END { printf "%d %d %d\n", pass, fail, skip }'
