#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Runs inside one guest of a lane (tests/vm/check.sh run LANE
# tests/mutants/guest_batch.sh BATCH): several module breakages, one after
# the other, each against the lane's whole list. tests/mutants/run.py
# writes BATCH and builds each breakage's module under mutants/NAME/module
# of the build tree (make MUTANT_TREES=mutants).
#
# For each breakage: the helper module is unloaded, the breakage's
# kvdmabuf.ko is bind-mounted over module/kvdmabuf.ko (the tests that
# reload the module load it from there) and loaded; then its own tests run
# first, then every program of tests/vm.list and tests/vm-LANE.list (the
# lane's "!LANE" marks kept), stopping at the first that fails or leaves a
# kernel report; where kmemleak runs (the debug lane), a leak in the code
# the suite drives counts as well (scanned after its own tests and after
# the list). The verdict line is
#
#   # mutant-verdict NAME caught|SURVIVED|ERROR SECONDS DETAIL
#
# A kernel report, a program that does not die when killed (stuck in the
# kernel) or a module that does not unload leaves this kernel unfit for
# the next breakage: the batch stops with "# mutant-batch-stopped" and
# run.py boots a fresh guest for the rest.
#
# BATCH lines: "mutant NAME" starts a breakage, "run PROGRAM [ARGS]" names
# one of its own tests (a path under tests/).
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
kmemleak=
kmemleak_on && kmemleak=1
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

# The kernel log since this breakage was loaded.
klog_since() { # name
	dmesg | tr -d '\r' | awk -v m="kvd-mutant-begin $1" \
		'index($0, m) { keep = 1; n = 0; delete l; next }
		 keep { l[n++] = $0 } END { for (i = 0; i < n; i++) print l[i] }' >"$klog"
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
	if ! res=$(kmemleak_check); then
		echo "$res"
		detail="kmemleak: $(grep -m1 -o '[0-9]* unreferenced object(s)' <<<"$res") in code the suite drives"
	fi
}

verdict() { # name verdict detail
	echo "# mutant-verdict $1 $2 $((SECONDS - t_mutant)) $3"
}

# One breakage; sets $stop when this kernel must not run another.
one() { # name programs-file
	local name=$1 words prog res rc first detail t0 ran=0
	t_mutant=$SECONDS
	echo "kvd-mutant-begin $name" >/dev/kmsg
	if [ -d /sys/module/kvdmabuf ] && ! rmmod kvdmabuf; then
		verdict "$name" ERROR "the module before it did not unload"
		stop=1
		return
	fi
	if [ ! -f "$build/mutants/$name/module/kvdmabuf.ko" ]; then
		verdict "$name" ERROR "does not build"
		return
	fi
	mount --bind "$build/mutants/$name/module/kvdmabuf.ko" "$ko" || {
		verdict "$name" ERROR "bind mount failed"
		stop=1
		return
	}
	bound=1
	detail=
	# what earlier ones left unreferenced is theirs (the debug lane)
	[ -z "$kmemleak" ] || kmemleak_start
	if ! insmod "$ko"; then
		detail="insmod failed"
	fi
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
			stop=1
		fi
	done <"$2"
	leak_check
	if [ -z "$stop" ] && [ -d /sys/module/kvdmabuf ] && ! rmmod kvdmabuf; then
		detail="${detail:+$detail; }the module did not unload after the tests"
		stop=1
	fi
	[ -n "$stop" ] || { umount "$ko" && bound=; }
	if [ -n "$detail" ]; then
		verdict "$name" caught "$detail"
	else
		verdict "$name" SURVIVED "$ran programs passed"
	fi
}

stop= bound=
todo=$(mktemp /tmp/kvd-mutant-todo.XXXXXX)
name=
flush() {
	[ -n "$name" ] || return 0
	echo --own-tests-done-- >>"$todo"
	lane_programs | while read -r p; do
		# a program already run whole as one of its own tests
		grep -qx "$p" "$todo" || echo "$p"
	done >>"$todo"
	one "$name" "$todo"
	: >"$todo"
}
while read -r kind rest; do
	case $kind in
	mutant)
		flush
		[ -n "$stop" ] && break
		name=$rest
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
	# verdicts
	sleep 1
	echo b >/proc/sysrq-trigger
	sleep 60
fi
# the unbroken module back, for guest-run.sh's teardown
[ -z "$bound" ] || umount "$ko"
[ -d /sys/module/kvdmabuf ] || insmod "$ko"
exit 0
