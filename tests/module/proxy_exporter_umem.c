// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_exporter_umem: proxy_exporter with the importer on ib_core's
 * dma-buf MR code (/dev/kvd_umem, tests/kmod/kvd_umem.c).
 */
#define KVD_IMP_UMEM 1
#include "proxy_exporter.c"
