/* SPDX-License-Identifier: MIT */
/*
 * elf_dyn.h - the dynamic section of a loaded object, as the preload reads
 * it: bypass.c for the relocations against the verbs entry points,
 * preload_cuda.c for glibc's own dlsym and dlvsym.
 */
#ifndef KVDMABUF_PRELOAD_ELF_DYN_H
#define KVDMABUF_PRELOAD_ELF_DYN_H

#include <link.h>
#include <stdbool.h>
#include <stddef.h>

#include "preload_internal.h"

struct kp_dyn {
	const ElfW(Sym) *sym;
	const char *str;
	const ElfW(Word) *hash, *gnu_hash;      /* DT_HASH, DT_GNU_HASH */
	const ElfW(Half) *versym;
	const ElfW(Rela) *rela, *jmprel;
	size_t relasz, pltrelsz;
	bool pltrela;                           /* DT_PLTREL is DT_RELA */
};

/* @info's dynamic section, its pointers made absolute; false: no symbol
 * or string table (nothing to read). */
KP_HIDDEN bool kp_dyn_read(const struct dl_phdr_info *info, struct kp_dyn *d);

#endif
