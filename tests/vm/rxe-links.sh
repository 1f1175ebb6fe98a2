# SPDX-License-Identifier: GPL-2.0
# Soft-RoCE devices in a guest, sourced by tests/vm/guest-run.sh (the
# suite's set-up) and tests/mutants/guest_batch.sh (a breakage of the rxe
# patches: the module loaded again under the same devices' names).
#
#   rxe_links_add LINKS   "NAME:NETDEV ..." added, each waited for until its
#                         link-local GID (index 0, what the tests address
#                         each other by) is there; 1 with a message if not
#   rxe_links_del LINKS   the same devices removed

rxe_links_add() { # links
	local rl g i
	for rl in $1; do
		rdma link add "${rl%%:*}" type rxe netdev "${rl#*:}" || {
			echo "rdma link add ${rl%%:*} failed"
			return 1
		}
	done
	for rl in $1; do
		for i in $(seq 50); do
			g=$(cat "/sys/class/infiniband/${rl%%:*}/ports/1/gids/0" 2>/dev/null)
			case "$g" in fe80*) break ;; esac
			sleep 0.1
		done
		case "$g" in fe80*) ;; *)
			echo "${rl%%:*}: GID not populated"
			return 1
			;;
		esac
	done
}

rxe_links_del() { # links
	local rl
	for rl in $1; do
		rdma link delete "${rl%%:*}" || return 1
	done
}
