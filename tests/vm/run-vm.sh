#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Boots a kernel under qemu (TCG: nested KVM does not work on the machines
# this runs on) with ROOT shared read-only over virtio-9p as its user space,
# runs COMMAND there (inside a chroot into ROOT), streams the console to
# stdout and to LOG, and fails when the command failed, the guest did not
# finish, or the guest's kernel log shows a warning, BUG, Oops, lockdep or
# KASAN report.
#
#   run-vm.sh KERNEL_IMAGE MODULE_DIR ROOT LOG TIMEOUT_S COMMAND...
#
# MODULE_DIR is the kernel's /lib/modules/VERSION as seen from this machine:
# the virtio and 9p modules the guest needs before it can mount ROOT are
# copied from there into a small busybox initramfs built for each run.
# Runs are serialised with a lock: two emulated guests on a 2-core machine
# only slow each other down.
#
# KVDMABUF_VM_MACHINE: qemu machine (pc or q35). KVDMABUF_VM_IOMMU=1 (q35
# only) adds an emulated intel-iommu in strict mode and qemu's edu PCI
# device, a DMA engine behind it (tests/module/proxy_edu). virtio-9p does not use
# the IOMMU (no VIRTIO_F_ACCESS_PLATFORM), so the root stays as fast.
# KVDMABUF_VM_NET: qemu arguments of the guest's network (tests/vm/two-node.sh:
# a socket network between two guests on the host's loopback); default none.
set -euo pipefail

kernel=$1 moddir=$2 root=$3 log=$4 timeout_s=$5
shift 5
guest_cmd="$*"
here=$(cd "$(dirname "$0")" && pwd)
mem=${KVDMABUF_VM_MEM:-3072}
extra_append=${KVDMABUF_VM_APPEND:-}
machine=${KVDMABUF_VM_MACHINE:-pc}
iommu_args=()
if [ "${KVDMABUF_VM_IOMMU:-0}" = 1 ]; then
	[ "$machine" = q35 ] || { echo "run-vm: the IOMMU needs -machine q35" >&2; exit 1; }
	# The IOMMU before any PCI device it translates for.
	iommu_args=(-device intel-iommu -device edu)
	extra_append="$extra_append intel_iommu=on iommu.strict=1"
fi
# A kernel whose modules are not under ROOT's /lib/modules (the debug lane)
# names the folder that holds lib/modules/VERSION, as ROOT sees it.
modroot=${KVDMABUF_VM_MODROOT:-}
net_args=(-nic none)
[ -n "${KVDMABUF_VM_NET:-}" ] && read -ra net_args <<<"$KVDMABUF_VM_NET"

busybox=/bin/busybox
[ -x "$busybox" ] || { echo "run-vm: busybox-static missing" >&2; exit 1; }
for f in "$kernel" "$moddir/modules.dep"; do
	[ -e "$f" ] || { echo "run-vm: $f missing" >&2; exit 1; }
done

work=$(mktemp -d /tmp/kvd-vm.XXXXXX)
cleanup() {
	local pid
	pid=$(cat "$work/qemu.pid" 2>/dev/null) || pid=
	if [ -n "$pid" ] && grep -q qemu "/proc/$pid/comm" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- initramfs: busybox + the modules needed to mount the 9p root -------
ird=$work/initramfs
mkdir -p "$ird"/{bin,mods,proc,sys,dev,newroot}
cp "$busybox" "$ird/bin/busybox"

declare -A seen=()
order=()
mod_path() { # module name -> path relative to moddir, or nothing if built in
	local n=${1//-/_}
	awk -F: -v n="$n" '{ b = $1; sub(/.*\//, "", b); sub(/\.ko(\.xz|\.zst|\.gz)?$/, "", b);
		gsub(/-/, "_", b); if (b == n) { print $1; exit } }' "$moddir/modules.dep"
}
add_mod() {
	local rel deps d
	rel=$(mod_path "$1")
	[ -n "$rel" ] || return 0 # built in
	[ -n "${seen[$rel]:-}" ] && return 0
	seen[$rel]=1
	deps=$(awk -F': *' -v r="$rel" '$1 == r { print $2; exit }' "$moddir/modules.dep")
	for d in $deps; do
		d=${d##*/}
		add_mod "${d%%.ko*}"
	done
	order+=("$rel")
}
for m in virtio_pci 9pnet_virtio 9p; do
	add_mod "$m"
done
for rel in "${order[@]}"; do
	base=${rel##*/}
	case "$base" in
	*.ko.xz) xz -dc "$moddir/$rel" >"$ird/mods/${base%.xz}" ;;
	*.ko.zst) zstd -qdc "$moddir/$rel" >"$ird/mods/${base%.zst}" ;;
	*.ko.gz) gzip -dc "$moddir/$rel" >"$ird/mods/${base%.gz}" ;;
	*) cp "$moddir/$rel" "$ird/mods/$base" ;;
	esac
	echo "${base%%.ko*}.ko" >>"$ird/mods/order"
done
touch "$ird/mods/order"

# The kernel runs its module loader in the initramfs, not in the chroot:
# point it at the real modprobe of ROOT.
cat >"$ird/kvd-modprobe" <<EOS
#!/bin/busybox sh
exec /bin/busybox chroot /newroot /sbin/modprobe ${modroot:+-d $modroot} "\$@"
EOS
cat >"$ird/init" <<EOS
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in \$(cat /mods/order); do
	insmod /mods/\$m || echo "KVD-VM-FATAL: insmod \$m failed"
done
# cache=loose: the guest keeps what it read (the root is read-only, and
# nothing changes it while a guest runs: check.sh builds before the boot,
# one lane at a time). Without it every exec and open goes to qemu: the
# debug lane's set-up (modprobe, ip, rdma) took 181 s, with it 42 s.
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose kvdroot /newroot; then
	echo "KVD-VM-FATAL: cannot mount the 9p root"
	reboot -f
fi
echo /kvd-modprobe >/proc/sys/kernel/modprobe
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp
mount -t tmpfs tmpfs /newroot/run
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
chroot /newroot /usr/bin/env -i HOME=/root TERM=dumb \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	$guest_cmd
echo "KVD-VM-DONE rc=\$?"
reboot -f
EOS
chmod +x "$ird/init" "$ird/kvd-modprobe"
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

# --- boot ------------------------------------------------------------------
if [ -z "${KVDMABUF_VM_LOCKED:-}" ]; then
	exec 9>/tmp/kvdmabuf-vm.lock
	flock 9
fi

: >"$log"
# log_buf_len: the kernel log of a whole lane, and of a breakage's flood of
# reports, stays whole (the default 128 KiB lost make mutants' marker under
# a few dozen WARNs); the checks read it from its start marker.
append="console=ttyS0 panic=-1 oops=panic rdinit=/init loglevel=4 tsc=reliable log_buf_len=16M $extra_append"
timeout -k 10 "$timeout_s" qemu-system-x86_64 \
	-machine "$machine",accel=tcg -cpu max -smp 2 -m "$mem" \
	"${iommu_args[@]}" \
	-display none -monitor none -serial stdio -no-reboot "${net_args[@]}" \
	-kernel "$kernel" -initrd "$work/initrd.gz" -append "$append" \
	-fsdev local,id=kvdroot,path="$root",security_model=none,readonly=on,multidevs=remap \
	-device virtio-9p-pci,fsdev=kvdroot,mount_tag=kvdroot \
	-pidfile "$work/qemu.pid" </dev/null 2>&1 | tee -a "$log" &
# Waiting in the background lets a signal reach the trap (which kills qemu).
wait $! || true

# --- verdict -----------------------------------------------------------------
exec "$here/verdict.sh" "$log"
