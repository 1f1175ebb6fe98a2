// SPDX-License-Identifier: MIT
/*
 * elf_dyn.c - reads a loaded object's dynamic section (elf_dyn.h).
 */
#include <string.h>

#include "elf_dyn.h"

bool kp_dyn_read(const struct dl_phdr_info *info, struct kp_dyn *out)
{
	const ElfW(Dyn) *d = NULL;
	uintptr_t b = info->dlpi_addr;
	int i;

	memset(out, 0, sizeof(*out));
	out->pltrela = true;
	for (i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			d = (const ElfW(Dyn) *)(b + info->dlpi_phdr[i].p_vaddr);
	for (; d && d->d_tag != DT_NULL; d++) {
		/* glibc relocates these in place; an offset if not */
		uintptr_t p = d->d_un.d_ptr < b ? b + d->d_un.d_ptr :
			      d->d_un.d_ptr;

		switch (d->d_tag) {
		case DT_SYMTAB: out->sym = (const void *)p; break;
		case DT_STRTAB: out->str = (const void *)p; break;
		case DT_HASH: out->hash = (const void *)p; break;
		case DT_GNU_HASH: out->gnu_hash = (const void *)p; break;
		case DT_VERSYM: out->versym = (const void *)p; break;
		case DT_RELA: out->rela = (const void *)p; break;
		case DT_RELASZ: out->relasz = d->d_un.d_val; break;
		case DT_JMPREL: out->jmprel = (const void *)p; break;
		case DT_PLTRELSZ: out->pltrelsz = d->d_un.d_val; break;
		case DT_PLTREL: out->pltrela = d->d_un.d_val == DT_RELA; break;
		}
	}
	return out->sym && out->str;
}
