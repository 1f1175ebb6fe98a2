#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Runs inside one guest of a lane (tests/vm/check.sh run LANE
# tests/mutants/guest_batch.sh BATCH): several breakages, one after the
# other, each against the lane's whole list. tests/mutants/run.py writes
# BATCH; the lane's build (make MUTANT_TREES=mutants) builds a module
# breakage's module under mutants/NAME/module, and any other breakage's
# copy of the whole built tree under build/mutant-trees/NAME
# (tests/mutants/build_tree.sh).
#
# For a module breakage, the helper module is unloaded, the breakage's
# kvdmabuf.ko is bind-mounted over module/kvdmabuf.ko (the tests that
# reload the module load it from there) and loaded. For any other, its
# tree is bind-mounted over the build tree (its library, programs and
# scripts in the same paths); where its soft-RoCE module differs (a
# breakage of the rxe patches), the soft-RoCE devices are removed and made
# again on that rdma_rxe.ko (tests/vm/rxe-links.sh), and back after it.
# Then its own tests run first, then every program of tests/vm.list and
# tests/vm-LANE.list (the lane's "!LANE" marks kept), stopping at the
# first that fails or leaves a kernel report; where kmemleak runs (the
# debug lane), a leak in the code the suite drives counts as well (scanned
# after its own tests and after the list). The verdict line is
#
#   # mutant-verdict NAME caught|SURVIVED|ERROR SECONDS DETAIL
#
# A kernel report (but a warning of the breakage's own module:
# kernel_fit()), a program that does not die when killed (stuck in the
# kernel) or a module that does not unload leaves this kernel unfit for
# the next breakage: the batch stops with "# mutant-batch-stopped" and
# run.py boots a fresh guest for the rest.
#
# BATCH lines: "mutant NAME module|tree" starts a breakage, "run PROGRAM
# [ARGS]" names one of its own tests (a path under tests/).
set -u
build=${KVDMABUF_BUILD:?run by tests/vm/guest-run.sh}
batch=$1
lane=${KVDMABUF_LANE:-}
bindir=$build/tests
ko=$build/module/kvdmabuf.ko
scale=${KVDMABUF_TIMEOUT_SCALE:-1}
# per program: half again the lane's slowest (Mooncake's store, 132 s on
# 6.12; the demo, 350 s on debug, whose scale is 4): a breakage that makes
# a program hang costs this much
prog_timeout=$((200 * scale))
# Mooncake's user-space scenarios run on 6.12 only, as in the lane's suite
[ "$lane" = 6.12 ] || export KVDMABUF_MOONCAKE_SCENARIOS=0
. "$build/tests/vm/kmemleak.sh"
. "$build/tests/vm/rxe-links.sh"
rxe_ko=tests/rxe/build/rdma_rxe.ko
kmemleak=
kmemleak_on && kmemleak=1
# each breakage's leaks are judged here, not the batch's at its end
[ -z "$kmemleak" ] || kmemleak_judged
out=$(mktemp /tmp/kvd-mutant.XXXXXX)
klog=$(mktemp /tmp/kvd-mutant-klog.XXXXXX)
trap 'rm -f "$out" "$klog"' EXIT

# The lane's whole list, in order (tests/vm/run-tests.sh --names: the
# lane's marks applied); the programs that put another build of the module
# in place of the one under test are left out (dkms_module.py loads DKMS's
# build of the unbroken source).
lane_programs() {
	local list
	for list in "$bindir/vm.list" "$bindir/vm-$lane.list"; do
		[ -f "$list" ] || continue
		"$build/tests/vm/run-tests.sh" --names "$list" |
			grep -vx module/dkms_module.py
	done
}

# The kernel log since this breakage was loaded. Where its start marker
# is gone (the log wrapped round under a flood of messages), the log as it
# is and a line that counts as a report: a flood is never a clean run.
klog_since() { # name
	dmesg | tr -d '\r' | awk -v m="kvd-mutant-begin $1" \
		'{ all[na++] = $0 }
		 index($0, m) { keep = 1; n = 0; delete l; next }
		 keep { l[n++] = $0 }
		 END { if (!keep) {
			print "BUG: kernel log wrapped round: the breakage'"'"'s start marker is gone"
			for (i = 0; i < na; i++) print all[i]
		       } else for (i = 0; i < n; i++) print l[i] }' >"$klog"
}

# Runs one program with a deadline; its status, or "timeout" / "stuck".
run_prog() { # words...
	local pid t=0 rc
	setsid "$bindir/$1" "${@:2}" >"$out" 2>&1 </dev/null &
	pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		if [ $t -ge "$prog_timeout" ]; then
			kill -KILL -- "-$pid" 2>/dev/null
			for t in $(seq 20); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.5
			done
			cat "$out"
			kill -0 "$pid" 2>/dev/null && { echo stuck; return; }
			echo timeout
			return
		fi
		sleep 1
		t=$((t + 1))
	done
	wait "$pid"
	rc=$?
	cat "$out"
	echo "rc=$rc"
}

# A leak in the code the suite drives (kmemleak: the debug lane), found
# while the module is still loaded (its frames named); sets $detail.
leak_check() {
	local res
	[ -z "$detail" ] && [ -n "$kmemleak" ] || return 0
	# only what was made since it began: an earlier breakage's leak may
	# first show now (tests/vm/kmemleak.sh)
	if ! res=$(kmemleak_check "$since"); then
		echo "$res"
		detail="kmemleak: $(grep -m1 -o '[0-9]* unreferenced object(s)' <<<"$res") in code the suite drives"
	fi
}

verdict() { # name verdict detail
	echo "# mutant-verdict $1 $2 $((SECONDS - t_mutant)) $3"
}

# The breakage's module in place of the unbroken one; 1 when it cannot run.
put_module() { # name
	if [ -d /sys/module/kvdmabuf ] && ! rmmod kvdmabuf; then
		verdict "$1" ERROR "the module before it did not unload"
		stop=1
		return 1
	fi
	if [ ! -f "$build/mutants/$1/module/kvdmabuf.ko" ]; then
		verdict "$1" ERROR "does not build"
		return 1
	fi
	mount --bind "$build/mutants/$1/module/kvdmabuf.ko" "$ko" || {
		verdict "$1" ERROR "bind mount failed"
		stop=1
		return 1
	}
	bound=1
	# shellcheck disable=SC2086 # module parameters (guest-run.sh)
	insmod "$ko" ${KVDMABUF_KO_PARAMS:-} || detail="insmod failed"
}

take_module() {
	if [ -z "$stop" ] && [ -d /sys/module/kvdmabuf ] && ! rmmod kvdmabuf; then
		detail="${detail:+$detail; }the module did not unload after the tests"
		stop=1
	fi
	[ -n "$stop" ] || { umount "$ko" && bound=; }
}

# Soft-RoCE's devices again, on the rdma_rxe.ko now at the build tree's path.
rxe_swap() {
	local msg
	msg=$(rxe_links_del "$KVDMABUF_RXE_LINKS" && rmmod rdma_rxe &&
	      insmod "$build/$rxe_ko" && rxe_links_add "$KVDMABUF_RXE_LINKS") ||
		{ echo "soft-RoCE with $rxe_ko: ${msg:-failed}"; return 1; }
}

# The breakage's tree over the build tree; 1 when it cannot run.
put_tree() { # name
	local t=$build/build/mutant-trees/$1 msg
	if [ ! -f "$t/.built" ]; then
		verdict "$1" ERROR "does not build"
		return 1
	fi
	rxe_new=
	if [ -n "${KVDMABUF_RXE_LINKS:-}" ] && [ -f "$t/$rxe_ko" ] &&
	   ! cmp -s "$t/$rxe_ko" "$build/$rxe_ko"; then
		rxe_new=1
	fi
	mount --bind "$t" "$build" || {
		verdict "$1" ERROR "bind mount failed"
		stop=1
		return 1
	}
	tree_bound=1
	# a soft-RoCE that does not come up, or the unbroken module (a module
	# breakage before it unloaded its own) that does not load, is no verdict
	if [ -n "$rxe_new" ] && ! msg=$(rxe_swap); then
		verdict "$1" ERROR "$msg"
		stop=1
		return 1
	fi
	# shellcheck disable=SC2086 # module parameters (guest-run.sh)
	if [ ! -d /sys/module/kvdmabuf ] && ! insmod "$ko" ${KVDMABUF_KO_PARAMS:-}; then
		verdict "$1" ERROR "the unbroken module did not load"
		stop=1
		return 1
	fi
}

take_tree() {
	local msg
	[ -z "$stop" ] || return 0
	if ! umount "$build"; then
		detail="${detail:+$detail; }its tree did not unmount after the tests"
		stop=1
		return
	fi
	tree_bound=
	if [ -n "$rxe_new" ] && ! msg=$(rxe_swap); then
		detail="${detail:+$detail; }the lane's own $msg"
		stop=1
	fi
}

# After a kernel report: whether this kernel can still judge the next
# breakage. Yes where each report is a WARNING in a module loaded afresh
# before the next one (the breakage's own module; soft-RoCE where the
# breakage brought its own), lockdep is still on, and the module unloads
# (take_module()): a warning of the module's need not cost a boot.
kernel_fit() { # kind
	local mods=
	[ "$1" = module ] && mods=kvdmabuf
	[ -n "$rxe_new" ] && mods="$mods rdma_rxe"
	"$build/tests/vm/verdict.sh" --unfit "$klog" $mods >/dev/null || return 1
	[ ! -r /proc/lockdep_stats ] ||
		grep -Eq '^ *debug_locks: +1$' /proc/lockdep_stats
}

# One breakage; sets $stop when this kernel must not run another.
one() { # name module|tree programs-file
	local name=$1 kind=$2 words prog res rc first detail='' t0 ran=0 since=0
	t_mutant=$SECONDS
	echo "kvd-mutant-begin $name" >/dev/kmsg
	[ -z "$kmemleak" ] || since=$(kmemleak_jiffies)
	case $kind in
	module) put_module "$name" || return ;;
	*) put_tree "$name" || return ;;
	esac
	while [ -z "$detail" ] && read -r words; do
		if [ "$words" = --own-tests-done-- ]; then
			# a leak its own tests made, before the lane's list
			leak_check
			continue
		fi
		read -r -a prog <<<"$words"
		echo "# ===== mutant $name: ${prog[*]}"
		t0=$SECONDS
		res=$(run_prog "${prog[@]}")
		echo "$res" | head -n -1
		echo "# time: mutant $name: ${prog[0]} $((SECONDS - t0)) s"
		rc=${res##*$'\n'}
		ran=$((ran + 1))
		case $rc in
		rc=0 | rc=4) ;;
		stuck)
			detail="${prog[0]}: stuck in the kernel after SIGKILL"
			stop=1
			;;
		timeout) detail="${prog[0]}: no end after ${prog_timeout}s" ;;
		*)
			first=$(grep -m1 '^not ok' <<<"$res")
			detail="${prog[0]}: ${first:-exit status ${rc#rc=}}"
			;;
		esac
		klog_since "$name"
		if ! first=$("$build/tests/vm/verdict.sh" --reports "$klog"); then
			first=$(sed 's/^\[ *[0-9.]*\] //' <<<"$first")
			detail="${detail:+$detail; }kernel log after ${prog[0]}: ${first:0:100}"
			kernel_fit "$kind" || stop=1
		fi
	done <"$3"
	leak_check
	case $kind in
	module) take_module ;;
	*) take_tree ;;
	esac
	if [ -n "$detail" ]; then
		verdict "$name" caught "$detail"
	else
		verdict "$name" SURVIVED "$ran programs passed"
	fi
}

stop= bound= tree_bound= rxe_new=
todo=$(mktemp /tmp/kvd-mutant-todo.XXXXXX)
name= mkind=
flush() {
	[ -n "$name" ] || return 0
	echo --own-tests-done-- >>"$todo"
	lane_programs | while read -r p; do
		# a program already run whole as one of its own tests
		grep -qx "$p" "$todo" || echo "$p"
	done >>"$todo"
	one "$name" "$mkind" "$todo"
	: >"$todo"
}
while read -r kind rest; do
	case $kind in
	mutant)
		flush
		[ -n "$stop" ] && break
		read -r name mkind <<<"$rest"
		;;
	run) echo "$rest" >>"$todo" ;;
	esac
done <"$build/$batch"
[ -z "$stop" ] && flush
rm -f "$todo"
if [ -n "$stop" ]; then
	echo "# mutant-batch-stopped"
	# this kernel is unfit: no teardown, no unloading (guest-run.sh would
	# fail on it), no orderly power-off (it waits for what is stuck): an
	# immediate reboot, which ends qemu (-no-reboot); the console has the
	# verdicts. reboot(2) itself, as sysrq's b: the debug kernel has no
	# sysrq, and the root's reboot command asks systemd, which is not here.
	sleep 1
	python3 -c 'import ctypes; ctypes.CDLL(None).reboot(0x01234567)'
	sleep 60
fi
# the unbroken module back, for guest-run.sh's teardown
[ -z "$bound" ] || umount "$ko"
[ -z "$tree_bound" ] || umount "$build"
# shellcheck disable=SC2086 # module parameters (guest-run.sh)
[ -d /sys/module/kvdmabuf ] || insmod "$ko" ${KVDMABUF_KO_PARAMS:-}
exit 0
