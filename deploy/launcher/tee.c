/* tee: see tee.h. */
#include "deploy/launcher/tee.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* One log from *at: its whole lines (and, final, the rest) printed. */
static void s_follow(const dp_child_t *c, off_t *at, int final)
{
    int fd = open(c->log, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return; /* not started yet */
    char buf[65536];
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof buf, *at);
        if (n <= 0) break;
        ssize_t used = 0;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') continue;
            printf("[%d]: %.*s\n", c->task, (int)(i - used), buf + used);
            used = i + 1;
        }
        /* A line longer than the buffer is printed in pieces; a part line
         * waits for its newline, unless the run is over. */
        if (used == 0 && (n == (ssize_t)sizeof buf || final)) {
            printf("[%d]: %.*s\n", c->task, (int)n, buf);
            used = n;
        }
        *at += used;
        if (used < n && !final) break;
        if (used == 0) break;
    }
    close(fd);
}

void dp_tee_follow(dp_tee_t *t, const dp_crew_t *crew, int final)
{
    for (int i = 0; i < crew->n; i++)
        if (crew->kids[i].is_worker) s_follow(&crew->kids[i], &t->read[i], final);
    fflush(stdout);
}
