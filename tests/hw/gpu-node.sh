#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# gpu-node.sh - what a GPU node (no RDMA NIC needed, root not needed) says
# about the CUDA facts kvdmabuf rests on, in one command and a few minutes:
#
#   tests/hw/gpu-node.sh [--mib N] [--load-modules]
#
# From a built tree (make lib tests). Runs tests/hw/cuda_vmm (the driver
# alone; the library's CUDA path on fake NICs; the module's proxy where
# /dev/kvdmabuf and the test importer are there), then its preload tests
# again under LD_PRELOAD=lib/libkvdmabuf-preload.so (the driver's and the
# CUDA runtime's lookups, the engine's own cuMemUnmap and cuMemSetAccess as
# sleep and wake), and prints what the node is and a table of the results.
#
# Safe on a serving node: N MiB of GPU memory at a time (default 256), no
# netdev, no fuzzer. Modules are loaded only with --load-modules (root; the
# tree's module/kvdmabuf.ko and tests/kmod/kvd_importer.ko, built for the
# running kernel), and unloaded again at the end.
#
# KVDMABUF_CUDA_LIBRARY: the libcuda to test (default libcuda.so.1);
# KVDMABUF_CUDART_LIBRARY: the CUDA runtime (default: libcudart.so.13/12).
# Exit status (kselftest): 0 all ran passed, 1 a failure, 4 all skipped.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
mib=256 load=0
while [ $# -gt 0 ]; do
	case $1 in
	--mib) mib=${2:?--mib N}; shift ;;
	--load-modules) load=1 ;;
	-h | --help) sed -n '3,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpu-node.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
	esac
	shift
done
case $mib in '' | *[!0-9]*) echo "gpu-node.sh: --mib takes a number" >&2; exit 2 ;; esac

prog=$top/tests/hw/cuda_vmm
preload=$top/lib/libkvdmabuf-preload.so
for f in "$prog" "$preload"; do
	[ -x "$f" ] || [ -f "$f" ] || {
		echo "gpu-node.sh: $f missing: run make lib tests first" >&2
		exit 2
	}
done
missing=$(ldd "$prog" 2>/dev/null | awk '/not found/ { print $1 }' | tr '\n' ' ')
if [ -n "$missing" ]; then
	echo "gpu-node.sh: $prog cannot start: $missing not found" \
	     "(install libibverbs1, libdrm2, libyaml-0-2)" >&2
	exit 2
fi
logdir=$(mktemp -d /tmp/kvdmabuf-gpu-node.XXXXXX)
loaded=

unload() {
	local m
	for m in $loaded; do rmmod "$m" 2>/dev/null; done
}
trap unload EXIT

# ---- what the node is ----
row() { printf '# %-22s %s\n' "$1" "$2"; }
echo "# kvdmabuf GPU node check ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
row kernel "$(uname -r)"
if command -v nvidia-smi >/dev/null; then
	row GPU "$(nvidia-smi --query-gpu=name,driver_version,memory.total \
		   --format=csv,noheader 2>&1 | head -1)"
else
	row GPU "no nvidia-smi"
fi
if [ -r /proc/driver/nvidia/version ]; then
	if grep -q 'Open Kernel Module' /proc/driver/nvidia/version; then
		row "kernel driver" "open kernel modules (dma-buf export possible)"
	else
		row "kernel driver" "proprietary kernel modules (no dma-buf export)"
	fi
else
	row "kernel driver" "no /proc/driver/nvidia/version"
fi
# the library a test loads: the variable's, else what ld.so finds
found() { # variable-value ldconfig-pattern
	local p=${1:-$(ldconfig -p 2>/dev/null | awk -v re="$2" '$1 ~ re { print $NF; exit }')}
	echo "${p:-not found}"
}
row libcuda "$(found "${KVDMABUF_CUDA_LIBRARY:-}" '^libcuda[.]so[.]1$')"
row libcudart "$(found "${KVDMABUF_CUDART_LIBRARY:-}" '^libcudart[.]so[.][0-9]+$')"
row user "$(id -un) (uid $(id -u))"

if [ $load = 1 ]; then
	for ko in module/kvdmabuf.ko tests/kmod/kvd_importer.ko; do
		m=$(basename "$ko" .ko)
		if [ "$(id -u)" != 0 ]; then
			row "load $m" "not root: not loaded"
		elif grep -q "^$m " /proc/modules; then
			row "load $m" "already loaded"
		elif [ ! -f "$top/$ko" ]; then
			row "load $m" "$ko not built (make KDIR=...)"
		elif out=$(insmod "$top/$ko" 2>&1); then
			row "load $m" "loaded (unloaded at the end)"
			loaded="$m $loaded"
		else
			row "load $m" "insmod failed: $out (Secure Boot? another kernel?)"
		fi
	done
fi
for dev in /dev/kvdmabuf /dev/kvd_importer; do
	if [ -e "$dev" ]; then row "$dev" present; else row "$dev" absent; fi
done

# ---- the tests ----
export KVDMABUF_HW_MIB=$mib
pre_tests=$("$prog" -l | grep '^preload_')
timeout 300 "$prog" >"$logdir/driver.tap" 2>&1
rc1=$?
args=()
for t in $pre_tests; do args+=(-t "$t"); done
timeout 240 env LD_PRELOAD="$preload" "$prog" "${args[@]}" \
	>"$logdir/preload.tap" 2>&1
rc2=$?

# ---- the table ----
pass=0 fail=0 skip=0
echo "#"
printf '# %-8s %-50s %s\n' run test result
summarize() { # run-name log rc
	local line name res why
	while IFS= read -r line; do
		case $line in
		'ok '*'# SKIP'*) res=SKIP ;;
		'ok '*) res=PASS ;;
		'not ok '*) res=FAIL ;;
		*) continue ;;
		esac
		name=${line#*ok [0-9]* }
		name=${name%% *}
		why=
		[ $res = SKIP ] && why=${line#*# SKIP }
		# the plain run's preload tests are the preloaded run's
		[ "$1" = driver ] && case $name in preload_*) continue ;; esac
		case $res in PASS) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;;
		SKIP) skip=$((skip + 1)) ;; esac
		printf '# %-8s %-50s %s%s\n' "$1" "$name" "$res" "${why:+: $why}"
	done < <(tr -d '\r' <"$2")
	if [ "$3" = 124 ]; then
		printf '# %-8s %-50s %s\n' "$1" "(run)" "FAIL: timed out"
		fail=$((fail + 1))
	fi
}
summarize driver "$logdir/driver.tap" $rc1
summarize preload "$logdir/preload.tap" $rc2
echo "# measurements (free memory, lookups, export): grep -h '^# ' $logdir/*.tap"
echo "$pass passed, $fail failed, $skip skipped (logs in $logdir)"
[ $fail = 0 ] || exit 1
[ $pass = 0 ] && exit 4
exit 0
