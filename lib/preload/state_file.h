/* SPDX-License-Identifier: MIT */
/*
 * state_file.h - the file each process under the preload keeps for
 * `kvdmabuf status` (kvdmabuf_preload.h, "State file"): where it goes,
 * written whole (temporary file, then rename), removed at exit, and the
 * files dead writers of our user left swept. The caller serialises every
 * call (preload.c's kp.file_lock) and writes the body.
 */
#ifndef KVDMABUF_PRELOAD_STATE_FILE_H
#define KVDMABUF_PRELOAD_STATE_FILE_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

struct kp_state_file {
	bool dir_known;
	bool swept;                     /* dead writers' files removed */
	char dir[256];                  /* "": none */
	pid_t published;                /* the pid whose file we wrote, or 0 */
	char tmp[330];                  /* the file being written */
};

/* At load: a file of our pid is a former image's (exec) or a dead
 * process's; removed. */
void kp_state_unlink_stale(void);
/* A new temporary file with the header written, or NULL (no folder, or
 * it cannot be written: best effort). */
FILE *kp_state_begin(struct kp_state_file *sf);
/* Closes @f and puts it in place of this process's file. */
void kp_state_commit(struct kp_state_file *sf, FILE *f);
/* At exit: this process's file removed. */
void kp_state_remove(struct kp_state_file *sf);
/* In a forked child: the parent's file is not ours. */
void kp_state_forget(struct kp_state_file *sf);

#endif
