/* crew: a launcher's children, one record each (its name, log, metrics file
 * and how it ended), and what a launcher does with all of them: wait for
 * the shards to report where they listen, say how one ended with its last
 * log line, stop them all. Used by `downpour local` (downpour-worker
 * children) and `downpour launch` (any command as the workers). Children
 * are started with spawn.h, each in its own process group. */
#ifndef DP_CREW_H
#define DP_CREW_H

#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#define DP_CREW_MAX 64 /* processes of each kind */

typedef struct {
    char name[32];      /* "ps-0", "worker-1" */
    char log[PATH_MAX]; /* its stdout + stderr: DIR/logs/NAME.log */
    char metrics[PATH_MAX]; /* DIR/metrics/NAME.jsonl */
    pid_t pid;          /* 0 once reaped */
    pid_t pgid;         /* its process group (its pid), until none of the group is left: what
                         * a `sh -c` started outlives the child and is stopped with it */
    int status;         /* wait status once reaped */
    int is_worker;
    int task;           /* its index (worker I: --task-index) */
    int lives;          /* starts under this record: 1, then 2, ... (an elastic crew's restarts) */
    int stopping;       /* the launcher asked it to leave (SIGTERM) or killed it (--chaos) */
    int failed_unseen;  /* it ended badly and dp_crew_reap has not returned it yet */
} dp_child_t;

typedef struct {
    dp_child_t kids[2 * DP_CREW_MAX];
    int n;
} dp_crew_t;

/* DIR, DIR/logs and DIR/metrics made where missing (and the folders above
 * DIR), each refused with one line unless it is this user's own and not
 * writable by others: in a directory another local user made first (a
 * shared /tmp path), the logs and metrics could be links that user planted
 * (to a file of this user's, which a run would then write over). */
int dp_crew_make_out(const char *dir, char *err);

/* The next child's record: kind-i, its log and metrics paths under dir. */
dp_child_t *dp_crew_add(dp_crew_t *w, const char *dir, const char *kind, int i);

/* Worker i's record for a start: its earlier record once that child has
 * ended (its next life, logging to DIR/logs/worker-I.L.log), else a new
 * one; NULL when it is running or the crew is full. */
dp_child_t *dp_crew_worker_life(dp_crew_t *w, const char *dir, int i);
/* Worker i's record (running or ended), or NULL when it never started. */
dp_child_t *dp_crew_worker(dp_crew_t *w, int i);
/* The running child of worker i, or NULL. */
dp_child_t *dp_crew_running_worker(dp_crew_t *w, int i);

/* DIR/logs/ps-I.endpoint: where shard I writes the endpoint it bound. */
void dp_crew_ready_path(const char *dir, int i, char *out, size_t n);

/* Wait (at most 60 s, or until *stop) for shards 0..k-1, the crew's first
 * k children, to write their ready files; their endpoints into out,
 * comma-separated in shard order. -1 with err naming a shard that died
 * first (with its last log line), or the wait's end. */
int dp_crew_await_shards(dp_crew_t *w, const char *dir, int k, char *out, size_t n,
                         const volatile sig_atomic_t *stop, char *err);

/* Reap what ended, without waiting (the children, and what their process
 * groups left that this process adopted): a child that ended badly (killed,
 * or a status other than 0) not returned before, or NULL; each such child
 * is returned once, so two that end in the same pass come out of two
 * calls. *alive and *workers_alive count the children still running. */
const dp_child_t *dp_crew_reap(dp_crew_t *w, int *alive, int *workers_alive);

/* SIGTERM every child's whole process group, then SIGKILL the groups of
 * which anything is left after grace_s; returns once none is left (the
 * launcher adopts a group's orphans, dp_spawn_guard, and reaps them). */
void dp_crew_stop_all(dp_crew_t *w, double grace_s);

/* How c ended: "exited with status N", "killed by signal N". */
void dp_child_describe_exit(const dp_child_t *c, char *out, size_t n);

/* The last non-empty line of a file into out ("" when none); a line
 * rewritten in place with "\r" gives its last state. */
void dp_last_line(const char *path, char *out, size_t n);

#endif
