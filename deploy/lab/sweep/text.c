/* sweep/text: a growing text buffer (see text.h). */
#include "deploy/lab/sweep/text.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"

void dp_sweep_text_add(dp_sweep_text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0) return;
    if (t->len + (size_t)need + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + (size_t)need + 1) cap *= 2;
        t->s = dp_realloc(t->s, cap);
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)need;
}

int dp_sweep_text_save(dp_sweep_text_t *t, const char *dir, const char *name, char *err)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = dp_write_file_atomic(path, t->s ? t->s : "", t->len, err);
    free(t->s);
    t->s = NULL;
    t->len = t->cap = 0;
    return rc;
}
