#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# trace_wake.sh - where a FOLLOW wake's time goes in the kernel, by size:
# kvdmabuf-bench --wake-only at 64 MiB and at 1 GiB under the
# function_graph tracer, restricted to the calls of the wake (the slot's
# attach, pin and map, the swap, the importer's map) and of the floor's
# dma-buf MR registration; prints the bench's figure 1 lines and, per
# traced function, the calls, mean and median duration. Not a test: run
# it in a guest of a lane with tracefs (KVDMABUF_VM_MEM=6144
# tests/vm/check.sh run 6.12 tests/bench/trace_wake.sh);
# docs/results/2026-12-06-evening.md has a run. The tracer's own cost
# inflates what it times.
T=/sys/kernel/tracing
mountpoint -q $T || mount -t tracefs nodev $T
B=$(dirname "$(readlink -f "$0")")/kvdmabuf-bench
funcs="kvd_ioctl_attach kvd_backing_build kvd_slot_create kvd_wait_kernel_fences kvd_swap kvd_map_dma_buf kvd_unmap_dma_buf kvd_dev_ioctl kvd_ioctl
dma_buf_dynamic_attach dma_buf_map_attachment dma_buf_unmap_attachment dma_buf_pin dma_buf_unpin dma_buf_detach dma_buf_move_notify dma_buf_invalidate_mappings
ib_umem_dmabuf_map_pages ib_umem_dmabuf_unmap_pages ib_umem_dmabuf_get ib_umem_release kvd_umem_ioctl drm_gem_map_dma_buf drm_gem_unmap_dma_buf drm_gem_map_attach drm_gem_shmem_get_sg_table drm_prime_pages_to_sg dma_map_sgtable dma_unmap_sg_attrs iommu_dma_map_sg ib_umem_find_best_pgsz"
echo nop > $T/current_tracer
: > $T/set_ftrace_filter
for f in $funcs; do
	if grep -q "^$f\b" $T/available_filter_functions; then
		echo "$f" >> $T/set_ftrace_filter 2>/dev/null || echo "# cannot trace $f"
	else
		echo "# no $f"
	fi
done
echo "# tracing: $(tr '\n' ' ' < $T/set_ftrace_filter)"
echo 65536 > $T/buffer_size_kb
echo function_graph > $T/current_tracer
echo 1 > $T/options/funcgraph-tail
for size in 64 1024; do
	echo 0 > $T/tracing_on
	: > $T/trace
	echo 1 > $T/tracing_on
	"$B" --wake-only --sizes $size --reps 1 --allow-unmeasured > /tmp/bench.$size 2>&1
	echo 0 > $T/tracing_on
	grep -E "name=(follow_wake|follow_first_access|dmabuf_mr_register|follow_vs_register) " /tmp/bench.$size
	awk -v size=$size '
	{
		d = ""; n = ""
		if (match($0, /[0-9.]+ us/)) d = substr($0, RSTART, RLENGTH - 3)
		if (match($0, /\/\* [A-Za-z0-9_.]+/)) n = substr($0, RSTART + 3, RLENGTH - 3)
		else if (match($0, /[A-Za-z0-9_.]+( \[[a-z_0-9]+\])?\(\);/)) { n = substr($0, RSTART, RLENGTH); sub(/( \[.*)?\(\);/, "", n) }
		if (d != "" && n != "") { c[n]++; s[n] += d; v[n, c[n]] = d + 0 }
	}
	END {
		for (n in c) {
			k = c[n]
			for (i = 1; i <= k; i++) a[i] = v[n, i] + 0
			# insertion sort for the median
			for (i = 2; i <= k; i++) { x = a[i]; j = i - 1; while (j > 0 && a[j] > x) { a[j + 1] = a[j]; j-- } a[j + 1] = x }
			printf "TRACE size=%s %-32s n=%5d mean=%10.1f us median=%10.1f us\n", size, n, k, s[n] / k, a[int((k + 1) / 2)]
		}
	}' $T/trace | sort -k3
	grep -c . $T/trace | sed 's/^/# trace lines: /'
done
echo nop > $T/current_tracer
