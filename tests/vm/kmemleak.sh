# SPDX-License-Identifier: GPL-2.0
# kmemleak in a guest (the debug lane boots with kmemleak=on), sourced by
# tests/vm/guest-run.sh (the whole suite) and tests/mutants/guest_batch.sh
# (each breakage).
#
#   kmemleak_on           whether the kernel runs kmemleak
#   kmemleak_start        stop the kernel's own periodic scans; set aside
#                         what is unreferenced now (boot's, an earlier
#                         part's)
#   kmemleak_check        scan; prints the report; 1 when an unreferenced
#                         object's backtrace has a frame of the code the
#                         suite drives (the project's modules, the patched
#                         rdma_rxe, ib_core's dma-buf umem, the dma-buf
#                         core, DRM PRIME); others are printed only
kmemleak_file=/sys/kernel/debug/kmemleak

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

kmemleak_check() {
	local report n rc=0 ours='kvd|rxe_|ib_umem_dmabuf|dma_buf|drm_prime|drm_gem_prime'
	local t0=$SECONDS
	# an object is reported once it is older than 5 s and unchanged
	# (its checksum) since the scan before: two scans
	sleep 6
	echo scan >"$kmemleak_file"
	echo scan >"$kmemleak_file"
	report=$(cat "$kmemleak_file")
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
