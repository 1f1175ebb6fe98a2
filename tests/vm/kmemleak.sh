# SPDX-License-Identifier: GPL-2.0
# kmemleak in a guest (the debug lane boots with kmemleak=on), sourced by
# tests/vm/guest-run.sh (the whole suite) and tests/mutants/guest_batch.sh
# (each breakage).
#
#   kmemleak_on           whether the kernel runs kmemleak
#   kmemleak_start        stop the kernel's own periodic scans; set aside
#                         what is unreferenced now (boot's)
#   kmemleak_check [J]    scan; prints the report; 1 when an unreferenced
#                         object's backtrace has a frame of the code the
#                         suite drives (the project's modules, the patched
#                         rdma_rxe, ib_core's dma-buf umem, the dma-buf
#                         core, DRM PRIME); others are printed only. With
#                         J, only objects made at jiffies J or later count
#   kmemleak_jiffies      the kernel's jiffies now (0 if unknown)
#   kmemleak_judged       tell guest-run.sh that the program it ran judged
#                         kmemleak's findings itself (make mutants, per
#                         breakage): no check of the whole run after it
kmemleak_file=/sys/kernel/debug/kmemleak
kmemleak_judged_mark=/dev/shm/kvd-kmemleak-judged

kmemleak_on() {
	[ -w "$kmemleak_file" ]
}

kmemleak_start() {
	# Our scans only: the kernel's own thread scans all memory 60 s
	# after boot and every 10 min, on a CPU the suite needs (the debug
	# lane runs about 20 min under TCG), and its findings are ours to
	# judge at the end anyway.
	echo scan=off >"$kmemleak_file" &&
		echo scan >"$kmemleak_file" && echo clear >"$kmemleak_file"
}

# A leaked object may stay referenced for a while (a stale pointer in a
# freed task's cached stack, overwritten only when the stack is reused),
# so it is first reported during a later part: each object carries the
# jiffies it was made at, and a part judges only its own.
kmemleak_jiffies() {
	# the scheduler's debug header (debugfs) has them on every kernel
	awk '$1 == "jiffies" && $2 == ":" { print $3; found = 1; exit }
	     END { if (!found) print 0 }' /sys/kernel/debug/sched/debug 2>/dev/null ||
		echo 0
}

kmemleak_judged() {
	: >"$kmemleak_judged_mark"
}

kmemleak_check() { # [since-jiffies]
	local report n rc=0 ours='kvd|rxe_|ib_umem_dmabuf|dma_buf|drm_prime|drm_gem_prime'
	local t0=$SECONDS
	# an object is reported once it is older than 5 s and unchanged
	# (its checksum) since the scan before: two scans
	sleep 6
	echo scan >"$kmemleak_file"
	echo scan >"$kmemleak_file"
	report=$(awk -v since="${1:-0}" '
		function flush() { if (blk != "" && j >= since) printf "%s", blk; blk = ""; j = 0 }
		/^unreferenced object/ { flush() }
		match($0, /jiffies [0-9]+/) { j = substr($0, RSTART + 8, RLENGTH - 8) + 0 }
		{ blk = blk $0 "\n" }
		END { flush() }' "$kmemleak_file")
	echo "# kmemleak: two scans in $((SECONDS - t0 - 6)) s"
	if [ -z "$report" ]; then
		echo "# kmemleak: nothing unreferenced"
		return 0
	fi
	n=$(grep -c '^unreferenced object' <<<"$report")
	if grep -Eq "^ +\[<[0-9a-f]+>\] ($ours)" <<<"$report" ||
		grep -Eq "^ +($ours)[a-z_0-9]*\+0x" <<<"$report"; then
		echo "KVD-VM-FATAL: kmemleak: $n unreferenced object(s), in code the suite drives:"
		rc=1
	else
		echo "# kmemleak: $n unreferenced object(s), none in code the suite drives:"
	fi
	head -80 <<<"$report" | sed 's/^/# kmemleak| /'
	return $rc
}
