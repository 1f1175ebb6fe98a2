// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_races_umem: proxy_races with the importer on ib_core's dma-buf MR
 * code (/dev/kvd_umem, tests/kmod/kvd_umem.c) instead of kvd_importer.
 */
#define KVD_IMP_UMEM 1
#include "proxy_races.c"
