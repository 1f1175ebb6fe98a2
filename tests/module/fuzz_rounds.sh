#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The fuzzer's fixed seeds (or KVDMABUF_FUZZ_SEEDS), each ROUNDS times in a
# row for SECONDS each, in one guest (make fuzz ROUNDS=N): a race that one
# lane run hits now and then shows here. Stops at the first failing run.
#
#   fuzz_rounds.sh ROUNDS SECONDS
set -u
rounds=${1:?rounds} secs=${2:?seconds}
fuzz=$(dirname "$0")/proxy_fuzz
seeds=$(echo "${KVDMABUF_FUZZ_SEEDS:-12345,1796127092}" | tr , ' ')
i=1
while [ "$i" -le "$rounds" ]; do
	for s in $seeds; do
		echo "# fuzz round $i of $rounds, seed $s, ${secs}s"
		"$fuzz" --seed "$s" --seconds "$secs" || {
			echo "not ok - fuzz round $i seed $s"
			exit 1
		}
	done
	i=$((i + 1))
done
echo "ok - fuzz: $rounds rounds of seeds $seeds"
