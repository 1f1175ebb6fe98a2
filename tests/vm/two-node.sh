#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Boots two guests of one lane (tests/vm/run-vm.sh each, at the same time)
# on a qemu socket network on the host's loopback: node 1's qemu listens on
# 127.0.0.1:PORT, node 2's connects to it; no other address is used and no
# packet leaves the host. Each guest runs COMMAND with KVDMABUF_NODE=1 or 2
# (tests/vm/guest-run.sh puts soft-RoCE on that network). Both share ROOT
# read-only; each has its own work folder here and its own tmpfs /tmp in
# the guest, MAC and address.
#
#   two-node.sh KERNEL_IMAGE MODULE_DIR ROOT LOG TIMEOUT_S COMMAND...
#
# The consoles go to stdout, each line prefixed with its node ([1] or [2]),
# and to LOG.node1 and LOG.node2; LOG gets both, node 1 first. Fails when
# either guest fails (run-vm.sh's verdict). The caller holds the VM lock
# (both guests run under it: KVDMABUF_VM_LOCKED=1).
set -uo pipefail
kernel=$1 moddir=$2 root=$3 log=$4 timeout_s=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
t0=$SECONDS
work=$(mktemp -d /tmp/kvd-2node.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A free port of the loopback for the socket network.
port=
for _ in $(seq 20); do
	p=$(shuf -i 20000-60000 -n 1)
	ss -Htan "( sport = :$p or dport = :$p )" | grep -q . || { port=$p; break; }
done
[ -n "$port" ] || { echo "two-node: no free port on 127.0.0.1" >&2; exit 1; }

pids=()
for node in 1 2; do
	mac=52:54:00:4b:56:0$node
	case $node in
	1) sock="listen=127.0.0.1:$port" ;;
	2) sock="connect=127.0.0.1:$port"
	   # node 2's qemu connects at start: node 1's must listen already
	   for _ in $(seq 300); do
		ss -Hltn "( sport = :$port )" | grep -q . && break
		sleep 0.2
	   done ;;
	esac
	# the guest's command runs under env: KVDMABUF_NODE goes first
	{
		KVDMABUF_VM_LOCKED=1 \
		KVDMABUF_VM_NET="-netdev socket,id=n0,$sock -device virtio-net-pci,netdev=n0,mac=$mac" \
			"$here/run-vm.sh" "$kernel" "$moddir" "$root" \
			"$log.node$node" "$timeout_s" KVDMABUF_NODE=$node "$@"
		echo $? >"$work/rc$node"
	} 2>&1 | sed -u "s/^/[$node] /" &
	pids+=($!)
done
# Waiting in the background lets a signal reach the trap.
wait "${pids[@]}"
rc=0
for node in 1 2; do
	r=$(cat "$work/rc$node" 2>/dev/null) || r=killed
	[ $r = 0 ] || echo "# two-node: node $node failed (status $r)"
	[ $r = 0 ] || rc=1
done
cat "$log.node1" "$log.node2" >"$log" 2>/dev/null
echo "# two-node: both guests done in $((SECONDS - t0))s (boots included), status $rc"
exit $rc
