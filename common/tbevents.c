/* tbevents: TensorBoard event files (TFRecord framing around Event messages
 * packed by protoc-c from common/tb_event.proto). See tbevents.h for the
 * format.
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
#include "common/tb_event.pb-c.h"
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

static double s_wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void s_put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Packs ev as one TFRecord — length (8 bytes LE) | its masked CRC (4) |
 * Event | its masked CRC (4) — and writes it with one call. */
static void s_write_record(dp_tb_t *tb, const Tensorflow__Event *ev)
{
    size_t n = tensorflow__event__get_packed_size(ev);
    uint8_t *r = dp_malloc(8 + 4 + n + 4);
    s_put_le(r, n, 8);
    s_put_le(r + 8, dp_crc32c_mask(dp_crc32c(0, r, 8)), 4);
    tensorflow__event__pack(ev, r + 12);
    s_put_le(r + 12 + n, dp_crc32c_mask(dp_crc32c(0, r + 12, n)), 4);

    pthread_mutex_lock(&tb->mu);
    const uint8_t *p = r;
    size_t left = 12 + n + 4;
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
    free(r);
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
    /* mkdir -p, as TensorFlow's summary writers create the log directory. */
    char e2[DP_ERR_LEN];
    if (dp_mkdirs(logdir, 0755, e2) != 0) {
        free(tb);
        return dp_err(err, "tensorboard logdir %s: %s", logdir, e2);
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

    Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
    ev.wall_time = s_wall_time();
    ev.what_case = TENSORFLOW__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    s_write_record(tb, &ev);
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
    Tensorflow__Summary__Value val = TENSORFLOW__SUMMARY__VALUE__INIT;
    val.tag = (char *)tag; /* only read by pack */
    val.value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    val.simple_value = value;
    Tensorflow__Summary__Value *vals[1] = {&val};
    Tensorflow__Summary sum = TENSORFLOW__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = vals;
    Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
    ev.wall_time = s_wall_time();
    ev.step = step;
    ev.what_case = TENSORFLOW__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    s_write_record(tb, &ev);
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
