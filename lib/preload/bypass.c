// SPDX-License-Identifier: MIT
/*
 * bypass.c - finds the loaded objects whose registration calls reach
 * libibverbs (or libmlx5) without passing the preload: an object loaded
 * with RTLD_DEEPBIND looks its symbols up in its own dependencies first,
 * so no interposer reaches its calls. Its registrations are never
 * recorded, so a sleep would leave them on the released memory: the sleep
 * check refuses and names the object. So does an object loaded by
 * dlmopen() into another link-map namespace, which has its own libibverbs
 * where no LD_PRELOAD is.
 *
 * How: the relocations of every loaded object (dl_iterate_phdr) against a
 * registration entry point are read as they were bound; a slot that holds
 * an address inside libibverbs.so.1 or libmlx5.so.1 is a bypass. A lazy
 * slot not yet bound (the object never called it) holds an address in
 * the object's own PLT and is not one: its first call binds it, and the
 * check after that sees it. Read at each sleep check, never on the
 * registration path. No lookup that takes the loader's lock is made while
 * dl_iterate_phdr holds its own (the address ranges are gathered first).
 * Objects loaded by dlmopen() into another link-map namespace (their own
 * libibverbs, no LD_PRELOAD there) are read the same way, namespace by
 * namespace (find_in_namespaces()).
 */
#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "elf_dyn.h"
#include "preload_internal.h"

#if defined(__ELF__) && defined(__LP64__)

/* The entry points whose direct use leaves a registration unseen. */
static const char *const watched[] = {
	"ibv_reg_mr", "ibv_reg_mr_iova", "ibv_reg_mr_iova2",
	"ibv_reg_dmabuf_mr", "ibv_reg_mr_ex", "ibv_rereg_mr",
	"mlx5dv_reg_dmabuf_mr",
};

#define KP_VERBS_OBJS 8

struct bypass_walk {
	struct {
		uintptr_t lo, hi;
		char name[64];
	} verbs[KP_VERBS_OBJS];         /* libibverbs, libmlx5 copies */
	unsigned int nr_verbs;
	const void *self;               /* an address in this preload */
	unsigned int ns;                /* link-map namespace, 0: ours */
	char *out;
	size_t out_len;
	bool found;
};

static const char *base_name(const char *path)
{
	const char *b = strrchr(path, '/');

	return b ? b + 1 : path;
}

/* rdma-core's own libraries: their calls between each other are theirs. */
static bool is_verbs_lib(const char *path)
{
	const char *b = base_name(path);

	return !strncmp(b, "libibverbs.so", 13) ||
	       !strncmp(b, "libmlx5.so", 10) || strstr(b, "-rdmav");
}

static bool contains(const struct dl_phdr_info *info, const void *p)
{
	uintptr_t a = (uintptr_t)p;
	int i;

	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && a >= lo && a - lo < ph->p_memsz)
			return true;
	}
	return false;
}

/* Pass 1: where libibverbs and libmlx5 are mapped. */
static int find_verbs(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct bypass_walk *w = arg;
	const char *b = base_name(info->dlpi_name);
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	int i;

	(void)size;
	if (w->nr_verbs == KP_VERBS_OBJS ||
	    (strncmp(b, "libibverbs.so", 13) && strncmp(b, "libmlx5.so", 10)))
		return 0;
	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t s = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type != PT_LOAD)
			continue;
		if (s < lo)
			lo = s;
		if (s + ph->p_memsz > hi)
			hi = s + ph->p_memsz;
	}
	w->verbs[w->nr_verbs].lo = lo;
	w->verbs[w->nr_verbs].hi = hi;
	snprintf(w->verbs[w->nr_verbs].name, sizeof(w->verbs[0].name), "%s", b);
	w->nr_verbs++;
	return 0;
}

static const char *verbs_lib_at(const struct bypass_walk *w, uintptr_t a)
{
	unsigned int i;

	for (i = 0; i < w->nr_verbs; i++)
		if (a >= w->verbs[i].lo && a < w->verbs[i].hi)
			return w->verbs[i].name;
	return NULL;
}

static bool is_watched(const char *name)
{
	size_t i;

	if (name[0] != 'i' && name[0] != 'm')
		return false;
	for (i = 0; i < sizeof(watched) / sizeof(watched[0]); i++)
		if (!strcmp(name, watched[i]))
			return true;
	return false;
}

/* A bound slot of @info's relocations [@rel, +@size) that bypasses us. */
static bool scan_relocs(struct bypass_walk *w, struct dl_phdr_info *info,
			const ElfW(Rela) *rel, size_t size,
			const ElfW(Sym) *sym, const char *str)
{
	size_t i, n = size / sizeof(*rel);

	for (i = 0; rel && i < n; i++) {
		const ElfW(Sym) *s = &sym[ELF64_R_SYM(rel[i].r_info)];
		const char *name, *lib;
		uintptr_t slot;

		if (!ELF64_R_SYM(rel[i].r_info) || s->st_shndx != SHN_UNDEF)
			continue;
		name = str + s->st_name;
		if (!is_watched(name))
			continue;
		slot = *(const uintptr_t *)(info->dlpi_addr + rel[i].r_offset);
		lib = verbs_lib_at(w, slot);
		if (!lib)
			continue;
		if (w->ns)
			snprintf(w->out, w->out_len, "%s calls %s of %s in "
				 "link-map namespace %u (loaded by dlmopen), "
				 "where no LD_PRELOAD is: its registrations "
				 "are not seen; load it with dlopen",
				 info->dlpi_name, name, lib, w->ns);
		else
			snprintf(w->out, w->out_len, "%s calls %s of %s "
				 "directly, past the preload (loaded with "
				 "RTLD_DEEPBIND?): its registrations are not "
				 "seen; load it without RTLD_DEEPBIND",
				 info->dlpi_name[0] ? info->dlpi_name :
				 "the program", name, lib);
		return true;
	}
	return false;
}

/* Pass 2: each other object's relocations against the watched names. */
static int find_bypass(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct bypass_walk *w = arg;
	struct kp_dyn d;

	(void)size;
	if (is_verbs_lib(info->dlpi_name) || contains(info, w->self) ||
	    !kp_dyn_read(info, &d))
		return 0;
	w->found = scan_relocs(w, info, d.rela, d.relasz, d.sym, d.str) ||
		   (d.pltrela &&
		    scan_relocs(w, info, d.jmprel, d.pltrelsz, d.sym, d.str));
	return w->found;
}

/*
 * The other link-map namespaces (dlmopen): dl_iterate_phdr() shows only
 * the caller's. glibc 2.35 and later chain one r_debug per namespace from
 * _r_debug (r_version 2); each object's program headers are read from
 * its ELF header, which its first segment maps at l_addr.
 */
struct ns_debug {
	struct r_debug base;
	struct ns_debug *next;          /* r_version >= 2 */
};

static bool map_info(const struct link_map *l, struct dl_phdr_info *info)
{
	const ElfW(Ehdr) *eh = (const void *)l->l_addr;

	if (!l->l_addr || memcmp(eh->e_ident, ELFMAG, SELFMAG))
		return false;
	memset(info, 0, sizeof(*info));
	info->dlpi_addr = l->l_addr;
	info->dlpi_name = l->l_name ? l->l_name : "";
	info->dlpi_phdr = (const void *)(l->l_addr + eh->e_phoff);
	info->dlpi_phnum = eh->e_phnum;
	return true;
}

/* Each other namespace's objects through both passes; run from a
 * dl_iterate_phdr() callback, whose lock keeps the lists still. */
static int find_in_namespaces(struct dl_phdr_info *unused, size_t size,
			      void *arg)
{
	const struct ns_debug *ns;
	const void *head = &_r_debug;
	struct bypass_walk *w = arg;
	struct dl_phdr_info info;
	const struct link_map *l;

	(void)unused;
	(void)size;
	if (_r_debug.r_version < 2)
		return 1;
	/* glibc's _r_debug is the head of a larger struct from 2.35 on */
	__asm__("" : "+r"(head));
	ns = head;
	for (ns = ns->next; ns && !w->found; ns = ns->next) {
		w->ns++;
		w->nr_verbs = 0;
		for (l = ns->base.r_map; l; l = l->l_next)
			if (map_info(l, &info))
				find_verbs(&info, sizeof(info), w);
		for (l = ns->base.r_map; w->nr_verbs && l && !w->found;
		     l = l->l_next)
			if (map_info(l, &info))
				find_bypass(&info, sizeof(info), w);
	}
	return 1;
}

bool kp_bypass_find(char *why, size_t len)
{
	struct bypass_walk w = { .self = (const void *)kp_bypass_find,
				 .out = why, .out_len = len };

	dl_iterate_phdr(find_verbs, &w);
	if (w.nr_verbs)
		dl_iterate_phdr(find_bypass, &w);
	if (!w.found)
		dl_iterate_phdr(find_in_namespaces, &w);
	return w.found;
}
#else
bool kp_bypass_find(char *why, size_t len)
{
	(void)why;
	(void)len;
	return false;
}
#endif
