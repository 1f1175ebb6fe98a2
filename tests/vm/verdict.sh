#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Judges a guest console log (run-vm.sh): fails when the guest did not
# finish, its command failed, its init hit a fatal step, or the kernel
# printed a warning, BUG, Oops, lockdep, KASAN or list-corruption report
# anywhere (a report before the guest's own dmesg dump, such as a panic,
# counts too). Prints the reason and the log around the first report.
#
#   verdict.sh LOG
#   verdict.sh --reports LOG   only the kernel reports of a kernel log (one
#                              breakage's part of it, tests/mutants): the
#                              first report's line on stdout, exit 1
#   verdict.sh --unfit LOG MODULE...
#                              of those reports, the first that leaves the
#                              kernel unfit for another breakage, exit 1;
#                              0 when each is a WARNING in one of MODULEs
#                              (loaded afresh before the next breakage: its
#                              WARN_ON_ONCE sites speak again) or a test
#                              importer's own message. A WARNING in the
#                              kernel's own code may be a WARN_ON_ONCE that
#                              never speaks again, KASAN and DMA API
#                              debugging report once per boot, lockdep
#                              turns itself off, an oops leaves locks held.
set -u
reports_only= unfit_only=
case $1 in
--reports) reports_only=1; shift ;;
--unfit) unfit_only=1; shift ;;
esac
log=$1
status=0
clean=$(tr -d '\r' <"$log")
# Lockdep's reports (not its banner: 'RCU lockdep checking is enabled'),
# DMA API debugging's reports ("DMA-API: DRIVER DEVICE: ...", not its
# banner lines at boot), and the test importers' own error messages.
bad='WARNING:|BUG:|Oops|general protection fault|kernel BUG|possible circular locking|possible recursive locking|inconsistent lock state|lockdep is turned off|DEBUG_LOCKS_WARN_ON|suspicious RCU usage|bad unlock balance|KASAN|UBSAN|list_add corruption|list_del corruption|refcount_t:|sleeping function called from invalid context|blocked for more than|Kernel panic|Call Trace:|DMA-API: [^ :]+ [^ :]+: |DMA-API: debugging out of memory|move notification on a pinned import'
if [ -n "$unfit_only" ]; then
	shift
	mods=$(IFS='|'; echo "$*")
	# a warning's trace, and the test importers' own message (above)
	fit='Call Trace:|move notification on a pinned import'
	[ -z "$mods" ] || fit="$fit|WARNING: .* \\[($mods)\\](,|$)"
	grep -E "$bad" <<<"$clean" | grep -E -v -m1 "$fit" && exit 1
	exit 0
fi
first=$(grep -E -n "$bad" <<<"$clean" | head -1 | cut -d: -f1)
if [ -n "$reports_only" ]; then
	[ -z "$first" ] || { sed -n "${first}p" <<<"$clean"; exit 1; }
	exit 0
fi
if ! grep -q '^KVD-VM-DONE rc=' <<<"$clean"; then
	echo "run-vm: the guest did not finish (time-out or crash)" >&2
	status=1
elif ! grep -q '^KVD-VM-DONE rc=0$' <<<"$clean"; then
	echo "run-vm: the guest command failed" >&2
	status=1
fi
if grep -q '^KVD-VM-FATAL' <<<"$clean"; then
	grep '^KVD-VM-FATAL' <<<"$clean" >&2
	status=1
fi
if [ -n "$first" ]; then
	echo "run-vm: the guest kernel log has reports:" >&2
	sed -n "$((first > 5 ? first - 5 : 1)),$((first + 40))p" <<<"$clean" >&2
	status=1
fi
exit $status
