/* spawn: children of the launcher (see spawn.h). */
#include "deploy/launcher/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"

void dp_spawn_bin_dir(char *out, size_t n, const char *argv0)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0) {
        self[len] = 0;
    } else {
        snprintf(self, sizeof self, "%s", argv0);
    }
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    else snprintf(self, sizeof self, ".");
    snprintf(out, n, "%s", self);
}

/* ---- the guard ----------------------------------------------------------
 * A SIGKILL'd launcher runs no code: PR_SET_PDEATHSIG reaches its direct
 * children only, not what a `sh -c` or a wrapper started. The guard, a
 * child forked before any other, holds the other end of a socket whose
 * launcher's end only the kernel closes when the launcher ends. It is
 * told each group as it is started (pgid > 0) and as none of it is left
 * (-pgid); at the end of file, whatever ended the launcher, it sends
 * SIGTERM to every group it still knows, then SIGKILL after S_GUARD_GRACE_S. */

#define S_GUARD_MAX 1024        /* groups it keeps at once (more are not guarded) */
#define S_GUARD_GRACE_S 10.0

static int s_guard_fd = -1; /* the launcher's end; -1: no guard */
static pid_t s_guard_pid;   /* the guard, while the launcher has it */

static void s_guard_tell(pid_t pgid)
{
    int32_t v = (int32_t)pgid;
    if (s_guard_fd >= 0 && send(s_guard_fd, &v, sizeof v, MSG_NOSIGNAL) != (ssize_t)sizeof v) {
        close(s_guard_fd); /* the guard is gone: no point in telling it more */
        s_guard_fd = -1;
    }
}

void dp_spawn_forget(pid_t pgid) { s_guard_tell(-pgid); }

/* The guard's life: read the groups until the launcher's end closes, then
 * stop the ones still listed. */
static void s_guard_run(int fd)
{
    static pid_t groups[S_GUARD_MAX];
    int n = 0;
    int32_t v;
    ssize_t got;
    while ((got = recv(fd, &v, sizeof v, MSG_WAITALL)) != 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got != (ssize_t)sizeof v) break; /* the launcher's end closed mid-record */
        if (v > 0 && n < S_GUARD_MAX) groups[n++] = v;
        for (int i = 0; v < 0 && i < n; i++)
            if (groups[i] == -v) groups[i--] = groups[--n];
    }
    for (int i = 0; i < n; i++) kill(-groups[i], SIGTERM);
    for (double until = dp_now() + S_GUARD_GRACE_S; n > 0 && dp_now() < until; usleep(50 * 1000))
        for (int i = 0; i < n; i++)
            if (kill(-groups[i], 0) != 0) groups[i--] = groups[--n];
    for (int i = 0; i < n; i++) kill(-groups[i], SIGKILL);
}

/* At the launcher's exit (atexit): its end closed, the guard reaped, so
 * that not even the guard outlives a launcher that ended by itself (with
 * every group stopped, it has nothing to do). */
static void s_guard_end(void)
{
    if (s_guard_fd >= 0) close(s_guard_fd);
    s_guard_fd = -1;
    while (s_guard_pid > 0 && waitpid(s_guard_pid, NULL, 0) < 0 && errno == EINTR) {}
    s_guard_pid = 0;
}

int dp_spawn_guard(char *err)
{
    /* Adopt the orphans: a grandchild whose parent ended becomes this
     * process's child, so waitpid(-pgid) sees (and reaps) it. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        return dp_err(err, "prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return dp_err(err, "socketpair: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return dp_err(err, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(sv[0]);
        /* Ctrl-C and SIGTERM are the launcher's to act on; the guard ends
         * with the launcher's end of the socket. Its own group: a SIGKILL
         * to the launcher's whole job (kill -9 -PGID) spares it. */
        setpgid(0, 0);
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        signal(SIGQUIT, SIG_IGN);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) { /* hold no pipe of the caller's (`downpour launch | tee`) open */
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        s_guard_run(sv[1]);
        _exit(0);
    }
    close(sv[1]);
    s_guard_fd = sv[0];
    s_guard_pid = pid;
    atexit(s_guard_end);
    return 0;
}

int dp_spawn(pid_t *pid_out, const char *const *argv, const char *log, char *err)
{
    return dp_spawn_env(pid_out, argv, NULL, log, err);
}

int dp_spawn_env(pid_t *pid_out, const char *const *argv, const char *const *env, const char *log,
                 char *err)
{
    /* O_NOFOLLOW: a symlink planted as a log is refused, never written through */
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return dp_err(err, "%s: cannot create: %s", log, strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        return dp_err(err, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);  /* the launcher died before prctl */
        dup2(fd, 1);
        dup2(fd, 2);
        /* Default dispositions, as a daemon started by hand has them
         * (an ignored SIGPIPE would survive exec). */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        /* Several processes share the cores: OpenMP threads that spin for
         * long at each barrier steal them from each other (a 2-thread step
         * measured 10x slower). A short spin costs nothing on a quiet machine. */
        setenv("GOMP_SPINCOUNT", "10000", 0);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]); /* the child's own copy */
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "%s: cannot execute: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    setpgid(pid, pid);
    s_guard_tell(pid);
    *pid_out = pid;
    return 0;
}

int dp_spawn_read_ready(const char *ready_file, char *out, size_t n)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dp_read_file(ready_file, &buf, &len, NULL) != 0) return 0;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) len--;
    snprintf(out, n, "%.*s", (int)len, (const char *)buf);
    free(buf);
    return len > 0;
}

int dp_spawn_wait_ready(const char *ready_file, pid_t pid, const char *log, double timeout_s,
                        char *out, size_t n, char *err)
{
    double deadline = dp_now() + timeout_s;
    while (dp_now() < deadline) {
        if (dp_spawn_read_ready(ready_file, out, n)) return 0;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return dp_err(err, "the server exited before it was ready (see %s)", log);
        usleep(20 * 1000);
    }
    return dp_err(err, "the server wrote no %s within %.0f s (see %s)", ready_file, timeout_s, log);
}
