/* progress: rate-limited status line. */
#include "worker/train/progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "common/util.h"

void dp_progress_init(dp_progress_t *p, dp_progress_mode_t mode)
{
    p->tty = isatty(2);
    p->enabled = mode != DP_PROGRESS_OFF;
    p->last = 0;
    p->dirty = 0;
}

int dp_progress_due(const dp_progress_t *p, int force)
{
    if (!p->enabled) return 0;
    return force || dp_now() - p->last >= (p->tty ? 0.2 : 10.0);
}

void dp_progress_update(dp_progress_t *p, int force, const char *fmt, ...)
{
    if (!dp_progress_due(p, force)) return;
    double now = dp_now();
    p->last = now;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (p->tty) {
        fprintf(stderr, "\r\033[K%s", line);
        p->dirty = 1;
    } else {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
}

void dp_progress_done(dp_progress_t *p)
{
    if (p->dirty) fputc('\n', stderr);
    p->dirty = 0;
}
