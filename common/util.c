/* util: error strings, aborting allocation, logging, clock, hashing, and
 * whole-file I/O (atomic on write). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common/util.h"

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
static int s_debug = -1;

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

void dp_log_debug(const char *fmt, ...)
{
    if (s_debug < 0) {
        const char *e = getenv("DP_LOG");
        s_debug = e && strcmp(e, "debug") == 0;
    }
    if (!s_debug) return;
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
static void s_sync_dir(const char *path)
{
    char *copy = dp_strdup(path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

/* Test hook, read here only: DP_TEST_CRASH_BEFORE_RENAME=TEXT makes the
 * process _exit(3) once a file whose path contains TEXT ("1": any file) is
 * written and synced but not yet renamed into place — a crash in the middle
 * of a write, for the tests that check the previous file survives. */
static void s_test_crash_before_rename(const char *path)
{
    const char *v = getenv("DP_TEST_CRASH_BEFORE_RENAME");
    if (!v || !v[0] || (strcmp(v, "1") != 0 && !strstr(path, v))) return;
    fprintf(stderr, "%s: DP_TEST_CRASH_BEFORE_RENAME: exiting before renaming %s\n", s_program, path);
    _exit(3);
}

int dp_write_file_atomic(const char *path, const void *data, size_t len, char *err)
{
    return dp_write_file_atomic_mode(path, data, len, 0644, err);
}

int dp_write_file_atomic_mode(const char *path, const void *data, size_t len, mode_t mode,
                              char *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
        return dp_err(err, "%s: path too long", path);
    int fd = mkstemp(tmp);
    if (fd < 0) return dp_err(err, "%s: cannot create temporary file: %s", path, strerror(errno));
    const uint8_t *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            dp_err(err, "%s: write failed: %s", path, strerror(errno));
            goto fail;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        dp_err(err, "%s: fsync failed: %s", path, strerror(errno));
        goto fail;
    }
    /* mkstemp made it 0600: a secret never exists with wider rights. */
    if (mode != 0600 && fchmod(fd, mode) != 0) {
        dp_err(err, "%s: chmod failed: %s", path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    s_test_crash_before_rename(path);
    if (rename(tmp, path) != 0) {
        dp_err(err, "%s: rename failed: %s", path, strerror(errno));
        goto fail;
    }
    s_sync_dir(path);
    return 0;
fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
    return -1;
}
