#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Runs inside the VM guest (chrooted into the shared root): prepares what the
# suite needs exactly as an admin would on a real machine (vgem, soft-RoCE
# rxe0/rxe1 on a veth pair, the kvdmabuf module and the test importer), runs
# the test list, unloads the project's modules and prints the kernel log.
#
#   guest-run.sh BUILD_DIR MODROOT LIST [LIST..] run test lists, in order
#   guest-run.sh BUILD_DIR MODROOT -- CMD ARGS   run one program (make demo)
#
# BUILD_DIR is the lane's build tree as the guest sees it. MODROOT is the
# folder holding lib/modules/VERSION for a kernel whose modules are not
# installed in the root (the debug lane), or "-".
set -u
# where a lane's fixed time goes (docs/testing.md): boot, then set-up
up() { cut -d' ' -f1 /proc/uptime; }
echo "# guest: up $(up) s when the set-up began"
build=$1
modroot=${2#-}
shift 2
modprobe() { command modprobe ${modroot:+-d "$modroot"} "$@"; }
export KVDMABUF_BUILD=$build
failed=0

setup_fail() {
	echo "not ok - vm setup: $*"
	failed=1
}

mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
# The tests read the module's state in debugfs: without it they would skip.
mountpoint -q /sys/kernel/debug ||
	mount -t debugfs debugfs /sys/kernel/debug || setup_fail "mount debugfs"
# kmemleak (the debug lane boots with kmemleak=on): what boot leaked is
# found and set aside now, so that a report after the suite is the suite's.
. "$(dirname "$0")/kmemleak.sh"
kmemleak=
if kmemleak_on; then
	kmemleak=1
	t0=$SECONDS
	kmemleak_start || setup_fail "kmemleak: scan and clear at start"
	echo "# kmemleak: the start's scan in $((SECONDS - t0)) s"
fi
# A report from the kernel's own start-up, before any module of ours (KASAN
# under TCG reported rcu_is_watching from an interrupt in identify_cpu):
# stop before the suite's first line, so that tests/vm/check.sh boots once
# more now rather than after a whole suite that could not pass (the debug
# lane's suite takes half an hour). One guest only: of two, the other
# would wait for its peer.
if [ -z "${KVDMABUF_NODE:-}" ] &&
   dmesg | grep -q -E 'BUG:|WARNING:|Oops|KASAN|Kernel panic|Call Trace:'; then
	echo "KVD-VM-FATAL: a kernel report during start-up, before the suite"
	dmesg | grep -m 3 -E 'BUG:|WARNING:|Oops|KASAN|Kernel panic'
	exit 1
fi
cpus=$(getconf _NPROCESSORS_ONLN)
echo "# kvdmabuf VM lane: kernel $(uname -r), $cpus CPUs, build $build"
# Races and the fuzzer must run truly in parallel.
[ "$cpus" -ge "${KVDMABUF_MIN_CPUS:-2}" ] ||
	setup_fail "$cpus CPU(s) online, the lane needs ${KVDMABUF_MIN_CPUS:-2}"

modprobe vgem || setup_fail "modprobe vgem"

# Soft-RoCE on both ends of a veth pair; no packet leaves the guest. One
# node of two (KVDMABUF_NODE=1 or 2, tests/vm/two-node.sh): soft-RoCE rxe0
# on the guest's NIC, on qemu's socket network to the other guest, with
# address 10.77.0.NODE; the program reaches the other node at
# KVDMABUF_NODE_PEER.
node=${KVDMABUF_NODE:-}
if [ -n "$node" ]; then
	modprobe virtio_net || setup_fail "modprobe virtio_net"
	nic=
	for i in $(seq 50); do
		nic=$(ls /sys/class/net | grep -v '^lo$' | head -1)
		[ -n "$nic" ] && break
		sleep 0.1
	done
	[ -n "$nic" ] || setup_fail "no network interface"
	rxe_links="rxe0:$nic"
	export KVDMABUF_NODE_PEER=10.77.0.$((3 - node))
else
	modprobe veth || setup_fail "modprobe veth"
	ip link add kvd0 type veth peer name kvd1 || setup_fail "veth pair"
	nic="kvd0 kvd1"
	rxe_links="rxe0:kvd0 rxe1:kvd1"
fi
for l in $nic; do
	echo 0 >/proc/sys/net/ipv6/conf/$l/accept_dad
	ip link set $l up || setup_fail "link $l up"
done
[ -n "$node" ] && { ip addr add "10.77.0.$node/24" dev "$nic" ||
	setup_fail "address of $nic"; }
modprobe ib_uverbs || setup_fail "modprobe ib_uverbs"
# Soft-RoCE with dma-buf MRs where the lane built it (tests/rxe): the
# in-tree module's dependencies, then ours in its place; and rdma-core's
# rxe provider with dma-buf registration, loaded by path.
rxe_ko=$build/tests/rxe/build/rdma_rxe.ko
if [ -f "$rxe_ko" ]; then
	for m in $(modprobe --show-depends rdma_rxe |
		   sed -n 's|^insmod .*/\([^/]*\)\.ko[.a-z]* *$|\1|p'); do
		[ "$m" = rdma_rxe ] || modprobe "$m" || setup_fail "modprobe $m"
	done
	insmod "$rxe_ko" || setup_fail "insmod $rxe_ko"
	for so in "$build"/tests/rxe/build/provider/librxe-rdmav*.so; do
		[ -f "$so" ] && export RDMAV_DRIVERS=${so%-rdmav*.so}
	done
else
	modprobe rdma_rxe || setup_fail "modprobe rdma_rxe"
fi
# The guests' only verbs devices are soft-RoCE's, and libibverbs dlopens
# every provider /etc/libibverbs.d names at a process's first device list
# (17 on Debian: 4-5 s of every verbs process on the debug lane, over its
# 9p root): this guest's configuration names rxe alone (the patched
# provider above comes first).
ibv_conf=$(mktemp -d /tmp/kvd-ibverbs.XXXXXX) &&
	echo "driver rxe" >"$ibv_conf/rxe.driver" &&
	mount --bind "$ibv_conf" /etc/libibverbs.d ||
	setup_fail "rxe-only /etc/libibverbs.d"
. "$(dirname "$0")/rxe-links.sh"
msg=$(rxe_links_add "$rxe_links") || setup_fail "$msg"
# for a batch of breakages that loads another rdma_rxe (make mutants)
export KVDMABUF_RXE_LINKS=$rxe_links

# The module's parameters for the lane (check.sh: the debug lane's small
# layout blocks); every insmod of it in the guest takes them.
export KVDMABUF_KO_PARAMS=${KVDMABUF_KO_PARAMS:-}
for ko in module/kvdmabuf.ko tests/kmod/kvd_importer.ko; do
	if [ -f "$build/$ko" ]; then
		params=
		[ "$ko" = module/kvdmabuf.ko ] && params=$KVDMABUF_KO_PARAMS
		# shellcheck disable=SC2086 # module parameters, one word each
		insmod "$build/$ko" $params || setup_fail "insmod $ko"
	else
		setup_fail "$ko missing from $build"
	fi
done

echo "# guest: up $(up) s when the set-up ended"
cd /tmp
if [ "$1" = -- ]; then
	shift
	"$@" || failed=1
else
	for list; do
		"$(dirname "$0")/run-tests.sh" "$list" "$build/tests" || failed=1
	done
fi

# Every object the suite left unreferenced, scanned while the modules are
# still loaded (what they hold is referenced from them, and the frames of
# their code still have names): a leak in code the suite drives fails the
# lane (tests/vm/kmemleak.sh), unless the program judged them itself.
if [ -n "$kmemleak" ] && [ ! -e "$kmemleak_judged_mark" ]; then
	kmemleak_check || failed=1
fi

# Unloading must work once the tests are done: nothing may be left held.
for m in kvd_importer kvdmabuf; do
	if [ -d /sys/module/$m ]; then
		rmmod $m || {
			echo "not ok - vm teardown: rmmod $m"
			failed=1
		}
	fi
done

echo "KVD-DMESG-BEGIN"
dmesg || echo "KVD-VM-FATAL: dmesg failed: the kernel log was not checked"
echo "KVD-DMESG-END"
exit $failed
