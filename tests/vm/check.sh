#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The test driver behind make check / check-unit / check-vm.
#
#   check.sh unit          host-only tests (tests/unit.list)
#   check.sh vm LANE       VM suite (tests/vm.list, then tests/vm-LANE.list
#                          where there is one) on one kernel lane: 6.1
#                          (Debian 12), 6.12 (Debian 13), 7.3 (Debian 13 with
#                          the newest 7.x kernel of trixie-backports), debug
#                          (that kernel's source with lockdep, KASAN, DMA API
#                          and dma-buf debugging, 2 CPUs)
#   check.sh twonode LANE  make demo NODES=2 once (one cycle) on LANE, then
#                          the vLLM stand-in with the plugin on node 1 and
#                          the Mooncake store on node 2 (mooncake_vllm.py)
#   check.sh all           unit + every lane (6.1, 6.12, 7.3, debug), then
#                          twonode on 6.12
#   check.sh run LANE PROG ARGS  one program of the build tree in a VM of LANE
#                          (make demo, make fuzz); its status is the exit status
#   check.sh run2 LANE PROG ARGS  the same in two VMs of LANE at once, on a
#                          socket network between them (tests/vm/two-node.sh;
#                          make demo NODES=2): fails when either fails
#
# Each stage prints its time; the last line is the total over every test of
# every program and lane: "N passed, N failed, N skipped".
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${KVDMABUF_CACHE:-/var/cache/kvdmabuf}
# A guard against a hung guest, not a performance bound: the debug lane
# (4x slower) gets twice as long.
vm_timeout=${KVDMABUF_VM_TIMEOUT:-2400}
jobs=${KVDMABUF_JOBS:-$(nproc)}
# KVDMABUF_VM_BUILT=1 (check.sh run only): the lane was built by a run of
# this tree a moment ago (make mutants' later guests of one batch): its
# files are synced again, nothing is built or checked.
prebuilt=
logs=$repo/build/logs
mkdir -p "$logs"
# Build trees of the lanes whose guest runs this machine's root: not under
# the checkout, which may lie in /tmp or /run (the guest mounts tmpfs
# there), but in the cache, one folder per checkout.
lanes=$cache/lanes/$(printf '%s' "$repo" | sha1sum | cut -c1-12)
total_pass=0 total_fail=0 total_skip=0 stage_failed=0 run_mode= nodes=1
# Every failing line of every stage, repeated at the end: CI shows only a
# run's last lines.
failures=

newest() { ls -d "$@" 2>/dev/null | sort -V | tail -1; }

# make in a lane's build tree inside the Debian 13 root (its compiler and C
# library: Debian 13's headers need them); /dev, /proc and BIND (a host
# folder, mounted at /mnt/kvd-bind) vanish with the namespace.
make_in_root() { # root build-dir-in-root kdir-in-root [bind]
	unshare -m --propagation private sh -c '
		mount --rbind /dev "$1/dev" && mount -t proc proc "$1/proc" &&
		if [ -n "$5" ]; then
			mkdir -p "$1/mnt/kvd-bind" &&
			mount --bind "$5" "$1/mnt/kvd-bind" || exit 1
		fi &&
		exec chroot "$1" make -C "$2" -j"$3" all KDIR="$4" $6' \
		- "$1" "$2" "$jobs" "$3" "${4:-}" "${KVDMABUF_MAKE_ARGS:-}"
}

sync_tree() { # source tree -> a lane's build tree
	mkdir -p "$2"
	rsync -a --delete --filter="merge $here/sync-filter" "$1/" "$2/"
}

# "# STAGE: PROGRAM: not ok ..." for each failing TAP line of LOG, each
# named by the program whose "# ===== PROGRAM" header came before it.
failed_lines() { # stage log
	[ -f "$2" ] || return 0
	tr -d '\r' <"$2" | awk -v st="$1" '
		/^# ===== / { prog = $3 }
		/^not ok/ { printf "# %s: %s: %s\n", st, prog, $0 }'
}

# Counts a stage's results; a stage that failed without a failing TAP line
# (a build error, a guest that never finished) counts as one failure.
account() { # name rc log seconds
	local name=$1 rc=$2 log=$3 secs=$4 p f s fl
	read -r p f s < <("$here/tap-count.sh" "$log")
	if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
		f=1
		echo "not ok - stage $name failed (see $log)"
		failures+="# $name: stage failed (see $log)"$'\n'
	fi
	fl=$(failed_lines "$name" "$log")
	[ -n "$fl" ] && failures+="$fl"$'\n'
	[ "$rc" != 0 ] && stage_failed=1
	total_pass=$((total_pass + p))
	total_fail=$((total_fail + f))
	total_skip=$((total_skip + s))
	if [ -n "$run_mode" ]; then
		printf '# %s: %ds in all, exit status %d\n' "$name" "$secs" "$rc"
		return
	fi
	printf '# stage %-8s %4ds  %d passed, %d failed, %d skipped\n' \
		"$name" "$secs" "$p" "$f" "$s"
}

# A skip that tests/vm/expected-skips does not list for the lane fails it; the
# failing lines (with the tests' reasons) go to the log and the console.
judge_skips() { # lane log
	local out
	out=$("$here/skips.sh" "$1" "$2") && return 0
	echo "$out" | tee -a "$2"
	return 1
}

# A program whose number of tests differs from tests/vm/expected-counts
# for the lane (one dropped from a list, one that stopped early) fails it.
judge_counts() { # lane log
	local out
	out=$("$here/counts.sh" check "$1" "$2") && return 0
	echo "$out" | tee -a "$2"
	return 1
}

stage_unit() {
	local log=$logs/unit.log t0=$SECONDS rc=0
	"$here/deps.sh" host || { account unit 1 /dev/null 0; return; }
	: >"$log"
	echo "# === unit (host)"
	make -C "$repo" -j"$jobs" lib tests asan >>"$log" 2>&1 || {
		tail -30 "$log"
		rc=1
	}
	# Every C program runs under ASan as well (make asan builds each; the
	# tsan/ twins are extra, for the preload's locking).
	local prog
	for prog in $(sed 's/#.*//' "$repo/tests/unit.list"); do
		case $prog in asan/* | tsan/* | *.py | *.sh) continue ;; esac
		grep -qx "asan/$prog" "$repo/tests/unit.list" || {
			echo "not ok - tests/unit.list lists $prog but not asan/$prog" |
				tee -a "$log"
			rc=1
		}
	done
	if [ $rc = 0 ]; then
		"$here/run-tests.sh" "$repo/tests/unit.list" "$repo/tests" 2>&1 |
			tee -a "$log"
		rc=${PIPESTATUS[0]}
	fi
	judge_skips unit "$log" || rc=1
	judge_counts unit "$log" || rc=1
	account unit $rc "$log" $((SECONDS - t0))
}

stage_vm() { # lane [-- command to run instead of tests/vm.list]
	local lane=$1
	local name=vm-$lane
	[ "$nodes" = 2 ] && name=2node-$lane
	local log=$logs/$name.log t0=$SECONDS rc=0
	local kver kernel moddir root build guest_build blog=$logs/build-$lane.log
	local modroot= dk machine=pc iommu=0 append=${KVDMABUF_VM_APPEND:-}
	# Environment of the guest's tests (NAME=VALUE words for env).
	local guest_env=(KVDMABUF_FUZZ_SECONDS=10)
	[ -n "$prebuilt" ] || "$here/deps.sh" "$lane" ||
		{ account "$name" 1 /dev/null 0; return; }
	echo "# === ${name%%-*} $lane"
	# One lane run at a time on this machine, build included: another
	# run of the same tree must not rebuild binaries a guest is running.
	exec 8>/tmp/kvdmabuf-vm.lock
	flock 8
	case $lane in
	6.1)
		kver=$(newest /lib/modules/6.1.*-amd64/build)
		kver=$(basename "$(dirname "$kver")")
		kernel=/boot/vmlinuz-$kver moddir=/lib/modules/$kver root=/
		build=$lanes/lane-6.1 guest_build=$build
		# The IOMMU variant (tests/module/proxy_edu) on every kernel.
		machine=q35 iommu=1
		# Mooncake's wheel, in a venv of this root (deps.sh host); its
		# user-space scenarios run once, on 6.12 (mooncake_store.py),
		# and wherever one program runs alone (check.sh run).
		guest_env+=(KVDMABUF_MOONCAKE_VENV=$cache/mooncake-venv)
		[ -n "$run_mode" ] || guest_env+=(KVDMABUF_MOONCAKE_SCENARIOS=0)
		sync_tree "$repo" "$build"
		[ -n "$prebuilt" ] ||
			make -C "$build" -j"$jobs" all KDIR="$moddir/build" ${KVDMABUF_MAKE_ARGS:-} >"$blog" 2>&1 || rc=1
		# Debian 12's DKMS builds and installs the helper module for
		# this kernel into a folder of the cache, not into the host's
		# /lib/modules (tests/vm/dkms.sh); tests/module/dkms_module.py lays
		# it over the guest's.
		[ $rc = 0 ] && [ -z "$prebuilt" ] &&
			{ "$here/dkms.sh" --host "$repo" "$kver" >>"$blog" 2>&1 || rc=1; }
		guest_env+=(KVDMABUF_DKMS_MODULES=$cache/dkms-host/$kver/modules)
		;;
	6.12 | 7.3)
		# Debian 13's user space; 7.3: the newest 7.x kernel of
		# trixie-backports, which deps.sh added to that root.
		root=$cache/trixie-root
		case $lane in
		6.12) kver=$(newest "$root"/lib/modules/6.12.*) ;;
		7.3) kver=$(newest "$root"/lib/modules/7.*-amd64) ;;
		esac
		# The IOMMU variant (tests/module/proxy_edu) on every kernel.
		machine=q35 iommu=1
		kver=$(basename "$kver")
		# Mooncake's wheel, in a venv of that root (deps.sh); its
		# user-space scenarios run once, on 6.12 (mooncake_store.py),
		# and wherever one program runs alone (check.sh run).
		guest_env+=(KVDMABUF_MOONCAKE_VENV=/opt/kvdmabuf-mooncake-venv)
		[ "$lane" = 6.12 ] || [ -n "$run_mode" ] ||
			guest_env+=(KVDMABUF_MOONCAKE_SCENARIOS=0)
		# One build tree per checkout and lane, as for the other lanes.
		guest_build=/kvdmabuf-lanes/${lanes##*/}/lane-$lane
		kernel=$root/boot/vmlinuz-$kver moddir=$root/lib/modules/$kver
		build=$root$guest_build
		sync_tree "$repo" "$build"
		[ -n "$prebuilt" ] ||
			make_in_root "$root" "$guest_build" /lib/modules/"$kver"/build \
			>"$blog" 2>&1 || rc=1
		# The helper module through DKMS as well, for this kernel
		# (tests/module/dkms_module.py loads it in the guest).
		[ $rc = 0 ] && [ -z "$prebuilt" ] &&
			{ "$here/dkms.sh" "$repo" "$kver" >>"$blog" 2>&1 || rc=1; }
		;;
	debug)
		# The newest kernel, built from linux-source-7.x with lockdep,
		# KASAN, DMA API and dma-buf debugging, on Debian 13's user
		# space (its modules and tests are built in that root).
		dk=$("$here/debug-kernel.sh") || { account vm-debug 1 /dev/null 0; exec 8>&-; return; }
		root=$cache/trixie-root
		kver=$(basename "$(newest "$dk"/mods/lib/modules/*)")
		kernel=$dk/bzImage moddir=$dk/mods/lib/modules/$kver
		# Installed in the root the guest runs, as a kernel package
		# would be (its own release name; tinyconfig: a few MiB of
		# modules): the tests' own modprobe finds them, and its config
		# is where the tests look.
		rsync -a --delete "$dk/mods/lib/modules/$kver/" "$root/lib/modules/$kver/"
		cp "$dk/build/.config" "$root/boot/config-$kver"
		# q35: its ACPI tables show both CPUs under TCG; and the
		# IOMMU variant, under lockdep, KASAN and DMA API debugging.
		machine=q35 iommu=1
		# kmemleak: scanned at the end of the suite (guest-run.sh)
		append="$append kmemleak=on"
		# KASAN and lockdep under TCG: slower, and the fuzzer's full run;
		# Mooncake's programs are !debug in tests/vm.list; run alone
		# (check.sh run debug ...), the store runs its FOLLOW test only.
		# The module's ranges layouts in blocks of 3 pieces, not 64:
		# every batch of the suite and the fuzzer crosses, splits and
		# shares blocks here (guest-run.sh loads it so).
		guest_env=(KVDMABUF_TIMEOUT_SCALE=4 KVDMABUF_PROGRAM_TIMEOUT=3600
			KVDMABUF_KO_PARAMS=layout_block_pieces=3
			KVDMABUF_FUZZ_SECONDS=60 KVDMABUF_FUZZ_SEEDS=12345
			KVDMABUF_MOONCAKE_VENV=/opt/kvdmabuf-mooncake-venv
			KVDMABUF_MOONCAKE_SCENARIOS=0)
		guest_build=/kvdmabuf-lanes/${lanes##*/}/lane-debug
		build=$root$guest_build
		sync_tree "$repo" "$build"
		# The kernel tree was built at /mnt/kvd-bind in the root.
		[ -n "$prebuilt" ] ||
			make_in_root "$root" "$guest_build" /mnt/kvd-bind/build "$dk" \
			>"$blog" 2>&1 || rc=1
		;;
	*)
		echo "unknown lane $lane (6.1, 6.12, 7.3 or debug)" >&2
		account "$name" 1 /dev/null 0
		return
		;;
	esac
	# The lists' "!LANE" marks leave programs out (tests/vm/run-tests.sh).
	guest_env+=(KVDMABUF_LANE=$lane)
	# Soft-RoCE with dma-buf MRs (tests/rxe): where the lane built the
	# patched rdma_rxe, rdma-core's rxe provider for the root's libibverbs.
	[ $rc = 0 ] && [ -z "$prebuilt" ] && [ -f "$build/tests/rxe/build/rdma_rxe.ko" ] && {
		"$repo/tests/rxe/build-provider.sh" "${root:-/}" \
			"$build/tests/rxe/build/provider" >>"$blog" 2>&1 || rc=1
	}
	# make mutants' breakage trees, built with the tree before the
	# provider (tests/mutants/build_tree.sh), load it from their own path
	local mt
	for mt in "$build"/build/mutant-trees/*/tests/rxe/build; do
		[ -d "$mt" ] && [ -z "$prebuilt" ] || continue
		[ $rc = 0 ] && [ -d "$build/tests/rxe/build/provider" ] || break
		rsync -a --delete "$build/tests/rxe/build/provider/" "$mt/provider/" || rc=1
	done
	# Our own copy of the console: runs of other trees may share $logs.
	local plog
	plog=$(mktemp /tmp/kvd-console.XXXXXX)
	case "$lanes" in
	/tmp/* | /run/* | /dev/* | /proc/* | /sys/*)
		echo "check.sh: KVDMABUF_CACHE ($cache) must not be under a folder the guest mounts over" >&2
		exec 8>&-
		account "$name" 1 /dev/null 0
		return
		;;
	esac
	# and the lane's own list after it (tests/vm-6.1.list, vm-6.12.list,
	# vm-debug.list: the demo)
	local run=("$guest_build/tests/vm.list")
	[ -f "$repo/tests/vm-$lane.list" ] && run+=("$guest_build/tests/vm-$lane.list")
	if [ "${2:-}" = -- ]; then
		run=(-- "$guest_build/${3#./}" "${@:4}")
	fi
	if [ $rc != 0 ]; then
		echo "# build for lane $lane failed:" | tee "$log"
		tail -30 "$blog" | tee -a "$log"
	else
		echo "# built in $((SECONDS - t0))s; booting $kver"
		local boot lane_timeout=$vm_timeout launcher=$here/run-vm.sh
		[ "$lane" = debug ] && lane_timeout=$((2 * vm_timeout))
		[ "$nodes" = 2 ] && launcher=$here/two-node.sh
		for boot in 1 2 3; do
			# The debug kernel boots on q35 (its own ACPI tables and
			# MP table: both CPUs online under TCG).
			KVDMABUF_VM_LOCKED=1 KVDMABUF_VM_MODROOT=$modroot \
			KVDMABUF_VM_MACHINE=$machine KVDMABUF_VM_IOMMU=$iommu \
			KVDMABUF_VM_APPEND=$append "$launcher" "$kernel" "$moddir" "$root" "$plog" \
				"$lane_timeout" "${guest_env[@]}" /bin/bash \
				"$guest_build/tests/vm/guest-run.sh" "$guest_build" \
				"${modroot:--}" "${run[@]}" | tr -d '\r' |
				{ grep -v -E '^(\[[12]\] )?\[ *[0-9]+\.[0-9]+\]' || true; }
			rc=${PIPESTATUS[0]}
			# A guest that died before its first line of ours (TCG
			# has crashed early boot, in text patching; a single
			# guest stops there itself on a report of the kernel's
			# own start-up, guest-run.sh), or failed only on such a
			# report, ran none of our code: boot again, three boots
			# at most (the debug kernel's KASAN under TCG reported
			# rcu_is_watching in identify_cpu in two boots running on
			# 2026-12-07). Anything later counts. Of two nodes, each
			# must have started: the other one only waited for its
			# peer.
			[ "$rc" != 0 ] && [ "$boot" -lt 3 ] &&
				{ ! suite_started "$plog" ||
				  boot_report_only "$plog"; } || break
			echo "# a guest died or reported before the suite started; booting again"
			cat "$plog" >"$log.boot$boot"
		done
		cat "$plog" >"$log"
		if [ "${2:-}" != -- ]; then
			judge_skips "$lane" "$log" || rc=1
			judge_counts "$lane" "$log" || rc=1
		fi
	fi
	rm -f "$plog" "$plog".node[12]
	# Still under the lock: no other run of this tree rewrites $log.
	account "$name" $rc "$log" $((SECONDS - t0))
	exec 8>&-
}

# Whether every guest of the run whose console is in LOG printed the
# suite's first line (tests/vm/guest-run.sh); two nodes each have their own
# console, LOG.node1 and LOG.node2 (tests/vm/two-node.sh).
suite_started() { # log
	local f
	if [ "$nodes" = 2 ]; then
		for f in "$1.node1" "$1.node2"; do
			grep -q '^# kvdmabuf VM lane:' "$f" 2>/dev/null || return 1
		done
		return 0
	fi
	grep -q '^# kvdmabuf VM lane:' "$1"
}

# Whether LOG's guest has a kernel report from the kernel's own start-up,
# printed before the suite's first line: a trace through start_kernel,
# before any module of ours is loaded (KASAN under TCG reported
# rcu_is_watching from an interrupt in identify_cpu once). One guest only.
boot_report_only() { # log
	[ "$nodes" = 1 ] || return 1
	tr -d '\r' <"$1" | awk '
		/^# kvdmabuf VM lane:/ { exit }
		/BUG:|WARNING:|Oops|KASAN|Kernel panic/ { rep = 1 }
		rep && / start_kernel\+/ { boot = 1 }
		END { exit !(rep && boot) }'
}

# make demo NODES=2 once, one cycle, on a lane whose tree is built already
# in make check: two guests on a socket network, RDMA between them
# (tests/twonode); then, in the same guests, the vLLM stand-in with the
# plugin on node 1, the Mooncake store's master and segment on node 2
# (tests/mooncake/mooncake_vllm.py picks its part by KVDMABUF_NODE):
# tests/twonode/check_stage.sh.
stage_twonode() { # lane
	nodes=2
	stage_vm "$1" -- tests/twonode/check_stage.sh
	nodes=1
}

t_all=$SECONDS
case "${1:-all}" in
unit) stage_unit || stage_failed=1 ;;
vm) stage_vm "${2:?lane}" || stage_failed=1 ;;
twonode) stage_twonode "${2:?lane}" || stage_failed=1 ;;
run | run2)
	run_mode=1
	prebuilt=${KVDMABUF_VM_BUILT:-}
	[ "$1" = run2 ] && nodes=2
	lane=${2:?lane}
	shift 2
	stage_vm "$lane" -- "$@" || stage_failed=1
	exit $stage_failed
	;;
all)
	stage_unit || stage_failed=1
	for lane in 6.1 6.12 7.3 debug; do
		stage_vm $lane || stage_failed=1
	done
	stage_twonode 6.12 || stage_failed=1
	;;
*)
	echo "usage: $0 unit | vm LANE | twonode LANE | all" >&2
	exit 2
	;;
esac
echo "# total time $((SECONDS - t_all))s"
[ -n "$failures" ] && printf '# failed:\n%s' "$failures"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ $stage_failed = 0 ] && [ $total_fail = 0 ]
