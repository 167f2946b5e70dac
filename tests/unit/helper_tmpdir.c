/* helper_tmpdir.c: the temporary directories tests make (see helper_tmpdir.h). */
#include "helper_tmpdir.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void tmpt_rm_flat(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char p[1024];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p) unlink(p);
    }
    closedir(d);
    rmdir(dir);
}
