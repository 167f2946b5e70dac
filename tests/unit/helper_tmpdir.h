/* helper_tmpdir.h: the temporary directories tests make (helper_tmpdir.c; linked into every suite and the kv_tier
 * fuzz harness). */
#ifndef KVSERVE_TEST_HELPER_TMPDIR_H
#define KVSERVE_TEST_HELPER_TMPDIR_H

/* Removes the entries of dir (files only: it does not descend) and then dir itself. A missing dir is no error;
 * what cannot be removed is left, silently (tests call it on their way out). */
void tmpt_rm_flat(const char *dir);

#endif
