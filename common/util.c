/* util: error strings, aborting allocation, logging, clock, hashing, and
 * whole-file I/O (atomic on write). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char s_program[64] = "downpour";
static int s_debug = 0; /* DP_LOG=debug (common/opts.h's dp_log_env) */

int dp_err(char *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, DP_ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void s_oom(size_t bytes)
{
    fprintf(stderr, "%s: out of memory allocating %zu bytes\n", s_program, bytes);
    abort();
}

void *dp_malloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) s_oom(bytes);
    return p;
}

void *dp_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) s_oom(n * size);
    return p;
}

void *dp_realloc(void *p, size_t bytes)
{
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) s_oom(bytes);
    return q;
}

char *dp_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = dp_malloc(n);
    memcpy(d, s, n);
    return d;
}

void *dp_aligned_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) s_oom(bytes);
    return p;
}

void dp_log_init(const char *program)
{
    snprintf(s_program, sizeof s_program, "%s", program);
}

static void s_log(const char *level, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    /* One write per line so lines of concurrent processes do not interleave. */
    fprintf(stderr, "%s: %s%s\n", s_program, level, line);
}

#define DP_LOG_FN(fn, level)                                                   \
    void fn(const char *fmt, ...)                                              \
    {                                                                          \
        va_list ap;                                                            \
        va_start(ap, fmt);                                                     \
        s_log(level, fmt, ap);                                                 \
        va_end(ap);                                                            \
    }
DP_LOG_FN(dp_log_info, "")
DP_LOG_FN(dp_log_warn, "warning: ")
DP_LOG_FN(dp_log_error, "error: ")

void dp_log_set_debug(int on)
{
    s_debug = on;
}

void dp_log_debug(const char *fmt, ...)
{
    if (s_debug <= 0) return;
    va_list ap;
    va_start(ap, fmt);
    s_log("debug: ", fmt, ap);
    va_end(ap);
}

double dp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t dp_fnv1a(uint64_t h, const void *data, size_t n)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

int dp_read_file(const char *path, uint8_t **out, size_t *len, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return dp_err(err, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = dp_malloc(cap + 1);
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        cap *= 2;
        buf = dp_realloc(buf, cap + 1);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return dp_err(err, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

/* fsync the directory holding path so the rename itself is durable. */
static int s_sync_dir(const char *path)
{
    char *copy = dp_strdup(path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    if (close(fd) != 0) rc = -1;
    return rc;
}

/* mkdir -p dir; on failure -1 with the directory that failed in *failed
 * (dir itself when it exists as something else) and errno set. */
static int s_mkdirs(const char *dir, mode_t mode, char *failed, size_t n)
{
    char path[4096];
    size_t len = strlen(dir);
    snprintf(failed, n, "%s", dir);
    if (len == 0) return errno = ENOENT, -1;
    if (len >= sizeof path) return errno = ENAMETOOLONG, -1;
    memcpy(path, dir, len + 1);
    while (len > 1 && path[len - 1] == '/') path[--len] = '\0';
    /* Each prefix ending before a '/', then the whole: EEXIST is fine
     * (a file in the way fails at the next level, or at the stat below). */
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, mode) != 0 && errno != EEXIST) {
            int e = errno;
            snprintf(failed, n, "%s", path);
            return errno = e, -1;
        }
        *p = saved;
        if (saved == '\0') break;
    }
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) return errno = ENOTDIR, -1;
    return 0;
}

int dp_mkdirs(const char *dir, mode_t mode, char *err)
{
    char failed[4096];
    if (s_mkdirs(dir, mode, failed, sizeof failed) != 0)
        return dp_err(err, "%s: cannot create: %s", failed, strerror(errno));
    return 0;
}

int dp_mkdir_parents(const char *path, char *err)
{
    char dir[4096], failed[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return dp_err(err, "%s: path too long", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return 0; /* in the working directory */
    while (slash > dir && slash[-1] == '/') slash--;
    if (slash == dir) return 0; /* in / */
    *slash = '\0';
    if (s_mkdirs(dir, 0755, failed, sizeof failed) != 0)
        return dp_err(err, "%s: cannot create its folder %s: %s", path, failed, strerror(errno));
    return 0;
}

/* Does the test hook named env select path? ("1": every path.) */
static int s_test_hook(const char *env, const char *path)
{
    const char *v = getenv(env);
    return v && v[0] && (strcmp(v, "1") == 0 || strstr(path, v));
}

int dp_atomic_open(dp_atomic_t *a, const char *path, mode_t mode, char *err)
{
    memset(a, 0, sizeof *a);
    a->fd = -1;
    if (snprintf(a->path, sizeof a->path, "%s", path) >= (int)sizeof a->path ||
        snprintf(a->tmp, sizeof a->tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof a->tmp)
        return dp_err(err, "%s: path too long", path);
    a->mode = mode;
    a->fail = s_test_hook("DP_TEST_WRITE_FAIL", path);
    /* A checkpoint, record or summary may be the first thing in its folder. */
    if (dp_mkdir_parents(path, err) != 0) return -1;
    /* mkostemp opens with O_CREAT | O_EXCL: never an existing name. */
    a->fd = mkostemp(a->tmp, O_CLOEXEC);
    if (a->fd < 0) return dp_err(err, "%s: cannot create temporary file: %s", path, strerror(errno));
    return 0;
}

int dp_atomic_write(dp_atomic_t *a, const void *data, size_t len, char *err)
{
    const uint8_t *p = data;
    if (a->fd < 0) return dp_err(err, "%s: write after close", a->path);
    while (len > 0) {
        ssize_t w = a->fail ? (errno = ENOSPC, -1) : write(a->fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return dp_err(err, "%s: write failed: %s", a->path, strerror(errno));
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

void dp_atomic_abort(dp_atomic_t *a)
{
    if (a->fd < 0) return;
    close(a->fd);
    a->fd = -1;
    unlink(a->tmp);
}

int dp_atomic_commit(dp_atomic_t *a, char *err)
{
    if (a->fd < 0) return dp_err(err, "%s: commit after close", a->path);
    if (fsync(a->fd) != 0) {
        dp_err(err, "%s: fsync failed: %s", a->path, strerror(errno));
        goto fail;
    }
    /* mkstemp made it 0600: a secret never exists with wider rights. */
    if (a->mode != 0600 && fchmod(a->fd, a->mode) != 0) {
        dp_err(err, "%s: chmod failed: %s", a->path, strerror(errno));
        goto fail;
    }
    /* close reports what a network file system deferred (EIO, ENOSPC). */
    int fd = a->fd;
    a->fd = -1;
    if (close(fd) != 0) {
        dp_err(err, "%s: close failed: %s", a->path, strerror(errno));
        unlink(a->tmp);
        return -1;
    }
    if (s_test_hook("DP_TEST_CRASH_BEFORE_RENAME", a->path)) {
        fprintf(stderr, "%s: DP_TEST_CRASH_BEFORE_RENAME: exiting before renaming %s\n",
                s_program, a->path);
        _exit(3);
    }
    if (rename(a->tmp, a->path) != 0) {
        dp_err(err, "%s: rename failed: %s", a->path, strerror(errno));
        unlink(a->tmp);
        return -1;
    }
    if (s_sync_dir(a->path) != 0)
        return dp_err(err, "%s: written, but syncing its directory failed: %s", a->path,
                      strerror(errno));
    return 0;
fail:
    dp_atomic_abort(a);
    return -1;
}

/* name is base + ".tmp." + 6 characters of mkstemp's alphabet. */
static int s_is_stale_name(const char *name, const char *base)
{
    size_t bl = strlen(base);
    if (strncmp(name, base, bl) != 0 || strncmp(name + bl, ".tmp.", 5) != 0) return 0;
    const char *x = name + bl + 5;
    if (strlen(x) != 6) return 0;
    for (int i = 0; i < 6; i++)
        if (!((x[i] >= 'A' && x[i] <= 'Z') || (x[i] >= 'a' && x[i] <= 'z') ||
              (x[i] >= '0' && x[i] <= '9')))
            return 0;
    return 1;
}

int dp_atomic_remove_stale(const char *path, char *err)
{
    char *dcopy = dp_strdup(path), *bcopy = dp_strdup(path);
    const char *dir = dirname(dcopy), *base = basename(bcopy);
    int n = -1;
    DIR *d = opendir(dir);
    if (!d) {
        dp_err(err, "%s: cannot read: %s", dir, strerror(errno));
        goto out;
    }
    n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (!s_is_stale_name(e->d_name, base) ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) n++;
    }
    closedir(d);
out:
    free(dcopy);
    free(bcopy);
    return n;
}

int dp_write_file_atomic(const char *path, const void *data, size_t len, char *err)
{
    return dp_write_file_atomic_mode(path, data, len, 0644, err);
}

int dp_write_file_atomic_mode(const char *path, const void *data, size_t len, mode_t mode,
                              char *err)
{
    dp_atomic_t a;
    if (dp_atomic_open(&a, path, mode, err) != 0) return -1;
    if (dp_atomic_write(&a, data, len, err) != 0) {
        dp_atomic_abort(&a);
        return -1;
    }
    return dp_atomic_commit(&a, err);
}
