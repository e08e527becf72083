/* scale: `downpour scale DIR N` and its request file (see scale.h). */
#include "deploy/launcher/scale.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/util.h"
#include "deploy/launcher/commands.h"
#include "deploy/launcher/crew.h"

/* How long the command waits for a launcher to take its request. */
#define S_WAIT_S 10.0

void dp_scale_request_path(const char *dir, char *out, size_t n)
{
    snprintf(out, n, "%s/scale.request", dir);
}

static void s_lock_path(const char *dir, char *out, size_t n)
{
    snprintf(out, n, "%s/scale.lock", dir);
}

int dp_scale_listen(const char *dir, int max, char *err)
{
    char path[PATH_MAX];
    s_lock_path(dir, path, sizeof path);
    /* 0600, and so made again over an earlier run's 0644: a lock another
     * user can open, they can hold (a shared flock), and no launcher could
     * then start on this directory */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return dp_err(err, "%s: %s", path, strerror(errno));
    if (fchmod(fd, 0600) != 0) {
        int e = errno;
        close(fd);
        return dp_err(err, "%s: cannot make it 0600: %s", path, strerror(e));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        return dp_err(err, "%s: %s", path,
                      e == EWOULDBLOCK ? "another elastic launcher (downpour local or launch --workers MIN:MAX) runs on this --out"
                                       : strerror(e));
    }
    /* the crew's MAX, for the command to refuse a count above it itself */
    char text[16];
    int len = snprintf(text, sizeof text, "%d\n", max);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != len) {
        int e = errno;
        close(fd);
        return dp_err(err, "%s: %s", path, strerror(e));
    }
    return fd;
}

int dp_scale_listening(const char *dir, int *max)
{
    char path[PATH_MAX], text[16] = "";
    *max = 0;
    s_lock_path(dir, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ssize_t got = held ? pread(fd, text, sizeof text - 1, 0) : -1;
    close(fd); /* drops a shared lock taken just now */
    long v = 0;
    if (got > 0) {
        text[got] = 0;
        text[strcspn(text, "\n")] = 0;
        if (dp_opts_parse_long("MAX", text, 1, DP_CREW_MAX, &v, NULL) == 0) *max = (int)v;
    }
    return held;
}

/* The request file's text into line (NUL-terminated): 1, 0 when there is
 * none, -1 with err for one that is no regular file (a FIFO, which a plain
 * open would block the launcher's loop on; a symlink). */
static int s_read_request(const char *path, char *line, size_t n, char *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) return 0;
    if (fd < 0) return dp_err(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dp_err(err, "%s: not a regular file", path);
    }
    ssize_t got = read(fd, line, n - 1);
    close(fd);
    line[got > 0 ? got : 0] = 0;
    return 1;
}

int dp_scale_take(const char *dir, int *n, char *err)
{
    char path[PATH_MAX], line[32];
    dp_scale_request_path(dir, path, sizeof path);
    int r = s_read_request(path, line, sizeof line, err);
    if (r == 0) return 0; /* none (or not yet whole: renamed) */
    unlink(path);
    if (r < 0) return -1;
    line[strcspn(line, "\n")] = 0;
    long v = 0;
    if (dp_opts_parse_long("scale", line, 1, DP_CREW_MAX, &v, err) != 0) return -1;
    *n = (int)v;
    return 1;
}

static const char s_usage[] =
    "usage: downpour scale DIR N\n"
    "Asks the `downpour local --workers MIN:MAX --out DIR` running on DIR to keep N\n"
    "workers live: the lowest free task indexes below MAX start, the highest ones\n"
    "other than the chief (task 0) leave by SIGTERM (each ends its step in flight,\n"
    "says so to the servers and exits 0). Waits until the launcher took the request\n"
    "(exit 0); refuses N above the crew's MAX (exit 2); fails at once when no\n"
    "launcher runs on DIR, or after 10 s when the one that runs did not take it.\n"
    "The launcher's log says what it did.\n";

int dp_scale_main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        fputs(s_usage, stdout);
        return 0;
    }
    char err[DP_ERR_LEN];
    long n = 0;
    if (argc != 3) {
        fputs(s_usage, stderr);
        return 2;
    }
    if (dp_opts_parse_long("N", argv[2], 1, DP_CREW_MAX, &n, err) != 0) {
        fprintf(stderr, "downpour scale: %s\n", err);
        return 2;
    }
    char path[PATH_MAX], text[32];
    dp_scale_request_path(argv[1], path, sizeof path);
    int len = snprintf(text, sizeof text, "%ld\n", n);
    struct stat st;
    if (stat(argv[1], &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "downpour scale: %s: no such directory (the --out of a downpour local)\n",
                argv[1]);
        return 1;
    }
    int max = 0;
    if (!dp_scale_listening(argv[1], &max)) {
        fprintf(stderr, "downpour scale: no downpour local --workers MIN:MAX runs on %s (its "
                "scale.lock is not held)\n", argv[1]);
        return 1;
    }
    if (max > 0 && n > max) {
        fprintf(stderr, "downpour scale: N %ld is above the MAX %d of the crew on %s (--workers "
                "MIN:%d): give 1..%d\n", n, max, argv[1], max, max);
        return 2;
    }
    if (dp_write_file_atomic(path, text, (size_t)len, err) != 0) {
        fprintf(stderr, "downpour scale: %s\n", err);
        return 1;
    }
    for (double until = dp_now() + S_WAIT_S; access(path, F_OK) == 0;) {
        if (dp_now() > until) {
            unlink(path);
            fprintf(stderr, "downpour scale: no downpour local took the request in %s within %.0f s "
                    "(is one running there with --workers MIN:MAX?)\n", argv[1], S_WAIT_S);
            return 1;
        }
        usleep(50 * 1000);
    }
    printf("downpour scale: %s: %ld worker(s) asked for\n", argv[1], n);
    return 0;
}
