/* SPDX-License-Identifier: MIT */
/*
 * cuda_export.h - the CUDA export shared by the library (cuda.c) and the
 * preload (preload/preload_cuda.c): cuda_export.c.
 */
#ifndef KVDMABUF_CUDA_EXPORT_H
#define KVDMABUF_CUDA_EXPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda_api.h"

kvd_CUresult kvd_cuda_export_range(kvd_cuMemGetHandleForAddressRange_fn *ex,
				   int mapping, bool *pcie_refused,
				   kvd_CUdeviceptr dptr, size_t len, int *fd,
				   unsigned long long *flags);

#endif /* KVDMABUF_CUDA_EXPORT_H */
