/* tbevents: TensorBoard event files (TFRecord framing, Event protobuf encoded
 * by hand). See tbevents.h for the format.
 *
 * Invariants: a record is assembled whole in memory and written with one
 * write call under the mutex, so records never interleave; the first record
 * of every file is the file_version event; a disabled writer has fd -1. */
#include "common/tbevents.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/checksum.h"
#include "common/util.h"

struct dp_tb {
    int fd;              /* -1: disabled writer */
    char *path;          /* the event file */
    pthread_mutex_t mu;  /* one record at a time */
    int warned_io;       /* warn about write errors once */
};

uint32_t dp_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* ---- protobuf wire format, just what Event needs ----------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} s_buf_t;

static void s_reserve(s_buf_t *b, size_t more)
{
    if (b->n + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + more) cap *= 2;
    b->p = dp_realloc(b->p, cap);
    b->cap = cap;
}

static void s_put_raw(s_buf_t *b, const void *data, size_t n)
{
    s_reserve(b, n);
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void s_put_varint(s_buf_t *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) tmp[n] |= 0x80;
        n++;
    } while (v);
    s_put_raw(b, tmp, n);
}

enum { S_VARINT = 0, S_FIXED64 = 1, S_LEN = 2, S_FIXED32 = 5 };

static void s_put_tag(s_buf_t *b, unsigned field, unsigned wire)
{
    s_put_varint(b, ((uint64_t)field << 3) | wire);
}

static void s_put_le(s_buf_t *b, uint64_t v, int bytes)
{
    uint8_t tmp[8];
    for (int i = 0; i < bytes; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    s_put_raw(b, tmp, (size_t)bytes);
}

static void s_put_double(s_buf_t *b, unsigned field, double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    s_put_tag(b, field, S_FIXED64);
    s_put_le(b, u, 8);
}

static void s_put_float(s_buf_t *b, unsigned field, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    s_put_tag(b, field, S_FIXED32);
    s_put_le(b, u, 4);
}

static void s_put_bytes(s_buf_t *b, unsigned field, const void *data, size_t n)
{
    s_put_tag(b, field, S_LEN);
    s_put_varint(b, n);
    s_put_raw(b, data, n);
}

/* Event fields. */
enum { S_EV_WALL_TIME = 1, S_EV_STEP = 2, S_EV_FILE_VERSION = 3, S_EV_SUMMARY = 5 };
/* Summary.value = 1; Summary.Value.tag = 1, .simple_value = 2. */
enum { S_SUM_VALUE = 1, S_VAL_TAG = 1, S_VAL_SIMPLE = 2 };

static double s_wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Frames data as one TFRecord and writes it with one call. */
static void s_write_record(dp_tb_t *tb, const s_buf_t *data)
{
    s_buf_t r = {0};
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)data->n >> (8 * i));
    s_put_raw(&r, len, 8);
    s_put_le(&r, dp_crc32c_mask(dp_crc32c(0, len, 8)), 4);
    s_put_raw(&r, data->p, data->n);
    s_put_le(&r, dp_crc32c_mask(dp_crc32c(0, data->p, data->n)), 4);

    pthread_mutex_lock(&tb->mu);
    const uint8_t *p = r.p;
    size_t left = r.n;
    while (left > 0) {
        ssize_t w = write(tb->fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            if (!tb->warned_io)
                dp_log_warn("tensorboard %s: write failed: %s (events are being dropped)",
                            tb->path, strerror(errno));
            tb->warned_io = 1;
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    pthread_mutex_unlock(&tb->mu);
    free(r.p);
}

/* mkdir -p: TensorFlow's summary writers create the log directory. */
static int s_mkdir_p(const char *dir, char *err)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return dp_err(err, "tensorboard logdir %s: path too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return dp_err(err, "tensorboard logdir %s: cannot create %s: %s", dir, path,
                              strerror(errno));
            *p = saved;
            if (saved == '\0') break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dp_err(err, "tensorboard logdir %s: not a directory", dir);
    return 0;
}

int dp_tb_new(dp_tb_t **out, const char *logdir, const char *suffix, char *err)
{
    *out = NULL;
    dp_tb_t *tb = dp_calloc(1, sizeof *tb);
    tb->fd = -1;
    if (!logdir || !logdir[0]) {
        *out = tb;
        return 0;
    }
    if (suffix && strchr(suffix, '/')) {
        free(tb);
        return dp_err(err, "tensorboard file suffix \"%s\" must not contain '/'", suffix);
    }
    if (s_mkdir_p(logdir, err) != 0) {
        free(tb);
        return -1;
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *h = host; *h; h++)
        if (*h == '/') *h = '_';

    char path[PATH_MAX];
    int fd = -1;
    /* Two writers in one second with one suffix would pick one name:
     * O_EXCL finds out, and the pid makes the second name unique. */
    for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
        int w = snprintf(path, sizeof path, "%s/events.out.tfevents.%ld.%s%s%s", logdir,
                         (long)time(NULL), host, suffix && suffix[0] ? "." : "",
                         suffix ? suffix : "");
        if (attempt == 1 && w > 0 && (size_t)w < sizeof path)
            w += snprintf(path + w, sizeof path - (size_t)w, ".%ld", (long)getpid());
        if (w < 0 || (size_t)w >= sizeof path) {
            free(tb);
            return dp_err(err, "tensorboard logdir %s: path too long", logdir);
        }
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int e = errno;
        free(tb);
        return dp_err(err, "tensorboard event file %s: cannot create: %s", path, strerror(e));
    }
    tb->fd = fd;
    tb->path = dp_strdup(path);
    pthread_mutex_init(&tb->mu, NULL);

    s_buf_t ev = {0};
    s_put_double(&ev, S_EV_WALL_TIME, s_wall_time());
    static const char version[] = "brain.Event:2";
    s_put_bytes(&ev, S_EV_FILE_VERSION, version, sizeof version - 1);
    s_write_record(tb, &ev);
    free(ev.p);
    if (tb->warned_io) {
        dp_tb_destroy(&tb);
        return dp_err(err, "tensorboard event file %s: cannot write", path);
    }
    *out = tb;
    return 0;
}

void dp_tb_scalar(dp_tb_t *tb, const char *tag, long step, float value)
{
    if (!tb || tb->fd < 0 || !tag) return;
    s_buf_t val = {0}, sum = {0}, ev = {0};
    s_put_bytes(&val, S_VAL_TAG, tag, strlen(tag));
    s_put_float(&val, S_VAL_SIMPLE, value);
    s_put_bytes(&sum, S_SUM_VALUE, val.p, val.n);
    s_put_double(&ev, S_EV_WALL_TIME, s_wall_time());
    /* int64 on the wire: a negative step is its two's complement varint. */
    if (step != 0) {
        s_put_tag(&ev, S_EV_STEP, S_VARINT);
        s_put_varint(&ev, (uint64_t)(int64_t)step);
    }
    s_put_bytes(&ev, S_EV_SUMMARY, sum.p, sum.n);
    s_write_record(tb, &ev);
    free(val.p);
    free(sum.p);
    free(ev.p);
}

const char *dp_tb_path(const dp_tb_t *tb)
{
    return tb && tb->fd >= 0 ? tb->path : NULL;
}

void dp_tb_destroy(dp_tb_t **tb_p)
{
    if (!tb_p || !*tb_p) return;
    dp_tb_t *tb = *tb_p;
    *tb_p = NULL;
    if (tb->fd >= 0) {
        close(tb->fd);
        pthread_mutex_destroy(&tb->mu);
    }
    free(tb->path);
    free(tb);
}
