/* crew: a launcher's children (see crew.h). */
#include "deploy/launcher/crew.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "deploy/launcher/spawn.h"

dp_child_t *dp_crew_add(dp_crew_t *w, const char *dir, const char *kind, int i)
{
    dp_child_t *c = &w->kids[w->n++];
    memset(c, 0, sizeof *c);
    c->is_worker = strcmp(kind, "worker") == 0;
    c->task = i;
    c->lives = 1;
    snprintf(c->name, sizeof c->name, "%s-%d", kind, i);
    snprintf(c->log, sizeof c->log, "%s/logs/%s-%d.log", dir, kind, i);
    snprintf(c->metrics, sizeof c->metrics, "%s/metrics/%s-%d.jsonl", dir, kind, i);
    return c;
}

dp_child_t *dp_crew_worker(dp_crew_t *w, int i)
{
    for (int k = 0; k < w->n; k++)
        if (w->kids[k].is_worker && w->kids[k].task == i) return &w->kids[k];
    return NULL;
}

dp_child_t *dp_crew_running_worker(dp_crew_t *w, int i)
{
    dp_child_t *c = dp_crew_worker(w, i);
    return c && c->pid > 0 ? c : NULL;
}

dp_child_t *dp_crew_worker_life(dp_crew_t *w, const char *dir, int i)
{
    dp_child_t *c = dp_crew_worker(w, i);
    if (!c) return w->n < (int)(sizeof w->kids / sizeof w->kids[0]) ? dp_crew_add(w, dir, "worker", i) : NULL;
    if (c->pid > 0) return NULL;
    c->lives++;
    c->stopping = 0;
    c->status = 0;
    snprintf(c->log, sizeof c->log, "%s/logs/worker-%d.%d.log", dir, i, c->lives);
    return c;
}

void dp_crew_ready_path(const char *dir, int i, char *out, size_t n)
{
    snprintf(out, n, "%s/logs/ps-%d.endpoint", dir, i);
}

/* Shard i's endpoint, appended to out: 1 when there, 0 while not yet, -1
 * with err when the shard died first. */
static int s_read_endpoint(dp_crew_t *w, const char *dir, int i, char *out, size_t n, char *err)
{
    dp_child_t *c = &w->kids[i];
    char ready[PATH_MAX], ep[256];
    dp_crew_ready_path(dir, i, ready, sizeof ready);
    if (dp_spawn_read_ready(ready, ep, sizeof ep)) {
        size_t used = strlen(out);
        snprintf(out + used, n - used, "%s%s", i ? "," : "", ep);
        return 1;
    }
    if (waitpid(c->pid, &c->status, WNOHANG) != c->pid) return 0;
    c->pid = 0;
    char how[64], last[512];
    dp_child_describe_exit(c, how, sizeof how);
    dp_last_line(c->log, last, sizeof last);
    return dp_err(err, "%s %s before listening; last log line: %s", c->name, how,
                  last[0] ? last : "(empty)");
}

int dp_crew_await_shards(dp_crew_t *w, const char *dir, int k, char *out, size_t n,
                         const volatile sig_atomic_t *stop, char *err)
{
    const double limit_s = 60;
    double until = dp_now() + limit_s;
    out[0] = 0;
    for (int i = 0; i < k; i++) {
        int r;
        while ((r = s_read_endpoint(w, dir, i, out, n, err)) == 0) {
            if (*stop) return dp_err(err, "stopped by signal %d while starting", (int)*stop);
            if (dp_now() > until)
                return dp_err(err, "%s (downpour-ps) did not report its endpoint in %s/logs within %.0f s",
                              w->kids[i].name, dir, limit_s);
            usleep(20 * 1000);
        }
        if (r < 0) return -1;
    }
    return 0;
}

const dp_child_t *dp_crew_reap(dp_crew_t *w, int *alive, int *workers_alive)
{
    const dp_child_t *failed = NULL;
    *alive = *workers_alive = 0;
    for (int i = 0; i < w->n; i++) {
        dp_child_t *c = &w->kids[i];
        if (c->pid > 0 && waitpid(c->pid, &c->status, WNOHANG) == c->pid) {
            c->pid = 0;
            if (!failed && (!WIFEXITED(c->status) || WEXITSTATUS(c->status) != 0)) failed = c;
        }
        if (c->pid > 0) {
            (*alive)++;
            *workers_alive += c->is_worker;
        }
    }
    return failed;
}

void dp_crew_stop_all(dp_crew_t *w, double grace_s)
{
    for (int i = 0; i < w->n; i++)
        if (w->kids[i].pid > 0) kill(w->kids[i].pid, SIGTERM);
    double until = dp_now() + grace_s;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < w->n; i++) {
            dp_child_t *c = &w->kids[i];
            if (c->pid <= 0) continue;
            if (waitpid(c->pid, &c->status, WNOHANG) == c->pid) c->pid = 0;
            else alive++;
        }
        if (!alive) return;
        if (dp_now() > until) break;
        usleep(50 * 1000);
    }
    for (int i = 0; i < w->n; i++) {
        dp_child_t *c = &w->kids[i];
        if (c->pid <= 0) continue;
        kill(-c->pid, SIGKILL);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &c->status, 0);
        c->pid = 0;
    }
}

void dp_child_describe_exit(const dp_child_t *c, char *out, size_t n)
{
    if (WIFEXITED(c->status)) snprintf(out, n, "exited with status %d", WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status)) snprintf(out, n, "killed by signal %d", WTERMSIG(c->status));
    else snprintf(out, n, "ended");
}

void dp_last_line(const char *path, char *out, size_t n)
{
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char buf[8192];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = 0;
    while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r')) buf[--got] = 0;
    char *start = strrchr(buf, '\n');
    start = start ? start + 1 : buf;
    /* A live "\r" line: keep its last state. */
    char *cr = strrchr(start, '\r');
    if (cr) start = cr + 1;
    snprintf(out, n, "%s", start);
}
