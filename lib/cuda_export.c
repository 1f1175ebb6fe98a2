// SPDX-License-Identifier: MIT
/*
 * cuda_export.c - the one CUDA export of a device range as a dma-buf fd,
 * for the library (cuda.c) and the preload (preload/preload_cuda.c), which
 * each reach the driver through their own table of entry points and call
 * this with the current context set to the memory's device.
 */
#include "cuda_export.h"
#include "internal.h"

/*
 * @mapping (enum kvd_cuda_mapping, the configuration's cuda_dmabuf_mapping):
 * the PCIe mapping for AUTO and PCIE, flags 0 for DEFAULT. AUTO falls back
 * to flags 0 where the driver refuses the flag (before CUDA 12.8, or a GPU
 * without it) and then sets *@pcie_refused, so that later exports of the
 * same caller ask with flags 0 at once. *@flags: the flags of the export
 * made (or of the last one tried).
 */
kvd_CUresult kvd_cuda_export_range(kvd_cuMemGetHandleForAddressRange_fn *ex,
				   int mapping, bool *pcie_refused,
				   kvd_CUdeviceptr dptr, size_t len, int *fd,
				   unsigned long long *flags)
{
	kvd_CUresult r;

	*flags = 0;
	if (mapping == KVD_CUDA_MAPPING_PCIE ||
	    (mapping == KVD_CUDA_MAPPING_AUTO && !*pcie_refused))
		*flags = KVD_CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE;
	r = ex(fd, dptr, len, KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, *flags);
	if (r == KVD_CUDA_SUCCESS || mapping != KVD_CUDA_MAPPING_AUTO ||
	    !*flags ||
	    (r != KVD_CUDA_ERROR_NOT_SUPPORTED && r != KVD_CUDA_ERROR_INVALID_VALUE))
		return r;
	*flags = 0;
	r = ex(fd, dptr, len, KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (r == KVD_CUDA_SUCCESS)
		*pcie_refused = true;
	return r;
}
