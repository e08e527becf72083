/* crew: a launcher's children (see crew.h). */
#include "deploy/launcher/crew.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "deploy/launcher/spawn.h"

/* path made where missing, then refused unless this user's own and not
 * writable by others (a group-writable one is the operator's choice). */
static int s_own_dir(const char *path, char *err)
{
    struct stat st;
    if (dp_mkdirs(path, 0755, err) != 0) return -1;
    if (stat(path, &st) != 0) return dp_err(err, "%s: %s", path, strerror(errno));
    if (st.st_uid != geteuid())
        return dp_err(err, "--out: %s belongs to uid %u, not to this user (uid %u): another user may "
                      "have made it first; give an --out of your own", path, (unsigned)st.st_uid,
                      (unsigned)geteuid());
    if (st.st_mode & S_IWOTH)
        return dp_err(err, "--out: %s is writable by others (mode %04o): chmod o-w it, or give an "
                      "--out of your own", path, (unsigned)(st.st_mode & 07777));
    return 0;
}

int dp_crew_make_out(const char *dir, char *err)
{
    char path[PATH_MAX + 16];
    if (s_own_dir(dir, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/logs", dir);
    if (s_own_dir(path, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/metrics", dir);
    return s_own_dir(path, err);
}

/* Reap what ended of c's process group without waiting: the child itself
 * (its status), and the processes of its group this process adopted when
 * their parent ended. 1 while any of the group is this process's to wait
 * for, 0 once none is (and the guard is told). Without the subreaper a
 * group's orphans are not ours: they are then not waited for. */
static int s_reap_group(dp_child_t *c)
{
    if (c->pid > 0) c->pgid = c->pid; /* spawn.h: the child leads a group of its own */
    if (c->pgid <= 0) return 0;
    int st;
    pid_t p;
    while ((p = waitpid(-c->pgid, &st, WNOHANG)) > 0 || (p < 0 && errno == EINTR))
        if (p == c->pid) {
            c->status = st;
            c->pid = 0;
        }
    if (p == 0) return 1;
    dp_spawn_forget(c->pgid); /* ECHILD: nothing of the group is left to wait for */
    c->pgid = 0;
    return 0;
}

/* SIGKILL what is left of c's group, and wait for all of it. */
static void s_kill_group(dp_child_t *c)
{
    if (!s_reap_group(c)) return;
    kill(-c->pgid, SIGKILL);
    int st;
    pid_t p;
    while ((p = waitpid(-c->pgid, &st, 0)) > 0 || (p < 0 && errno == EINTR))
        if (p == c->pid) {
            c->status = st;
            c->pid = 0;
        }
    s_reap_group(c);
}

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
    s_kill_group(c); /* what its last life left (the record's group is the next life's) */
    c->lives++;
    c->stopping = 0;
    c->status = 0;
    c->failed_unseen = 0;
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
    s_reap_group(c);
    if (c->pid > 0) return 0;
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
    dp_child_t *failed = NULL;
    *alive = *workers_alive = 0;
    for (int i = 0; i < w->n; i++) {
        dp_child_t *c = &w->kids[i];
        int was_running = c->pid > 0;
        s_reap_group(c);
        if (was_running && c->pid == 0 && (!WIFEXITED(c->status) || WEXITSTATUS(c->status) != 0))
            c->failed_unseen = 1;
        if (c->failed_unseen && !failed) failed = c;
        if (c->pid > 0) {
            (*alive)++;
            *workers_alive += c->is_worker;
        }
    }
    if (failed) failed->failed_unseen = 0;
    return failed;
}

void dp_crew_stop_all(dp_crew_t *w, double grace_s)
{
    /* The whole group: SIGTERM to the child alone leaves what a `sh -c`
     * or a wrapper script started running. */
    for (int i = 0; i < w->n; i++)
        if (s_reap_group(&w->kids[i])) kill(-w->kids[i].pgid, SIGTERM);
    double until = dp_now() + grace_s;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < w->n; i++) alive += s_reap_group(&w->kids[i]);
        if (!alive || dp_now() > until) break;
        usleep(50 * 1000);
    }
    for (int i = 0; i < w->n; i++) s_kill_group(&w->kids[i]);
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
