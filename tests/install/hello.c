// SPDX-License-Identifier: MIT
/* Built by tests/python/lib_install.py against an installed kvdmabuf, with
 * pkg-config only: the headers, the library and its version agree. */
#include <stdio.h>
#include <kvdmabuf.h>
#include <linux/kvdmabuf.h>

int main(void)
{
	char reason[256];
	int gate = kvdmabuf_gate("/nonexistent.yaml", reason, sizeof(reason));

	printf("version %u header %u api %u gate %d\n", kvdmabuf_version(),
	       KVDMABUF_VERSION, KVDMABUF_API_VERSION_MAJOR, gate);
	return kvdmabuf_version() == KVDMABUF_VERSION && gate < 0 ? 0 : 1;
}
