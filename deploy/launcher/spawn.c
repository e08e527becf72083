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

int dp_spawn(pid_t *pid_out, const char *const *argv, const char *log, char *err)
{
    return dp_spawn_env(pid_out, argv, NULL, log, err);
}

int dp_spawn_env(pid_t *pid_out, const char *const *argv, const char *const *env, const char *log,
                 char *err)
{
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
