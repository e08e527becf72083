/* metrics: JSON-lines metrics files and the atomic summary file (see
 * metrics.h for the format).
 *
 * Invariants: a line is printed by cJSON outside the lock and copied whole
 * into buf under it, so buf holds only whole lines; it reaches the file through
 * s_flush_locked, which writes the whole buffer or, on an I/O error, warns
 * once and drops it (a full disk must not stop training). The flusher thread
 * wakes every second; close stops it, joins it, then flushes what is left.
 * A disabled writer has fd -1 and no thread. */
#include "common/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define S_BUF_CAP (64 * 1024) /* flushed early when a line would not fit */
#define S_LINE_CAP 1024       /* a line printed on the stack (the common case) */

struct dp_metrics {
    int fd;                 /* -1: disabled writer */
    char *path;             /* for warnings */
    pthread_mutex_t mu;     /* guards everything below */
    pthread_cond_t wake;    /* signalled by close to stop the flusher */
    pthread_t flusher;
    int stop;               /* set by close */
    char *buf;              /* whole lines not yet written */
    size_t len;             /* bytes in buf */
    int warned_io;          /* warn about write errors once */
};

/* Writes all of p, retrying short writes and EINTR. */
static int s_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void s_flush_locked(dp_metrics_t *m)
{
    if (m->len == 0) return;
    if (s_write_all(m->fd, m->buf, m->len) != 0 && !m->warned_io) {
        m->warned_io = 1;
        dp_log_warn("metrics %s: write failed: %s (lines are being dropped)", m->path,
                    strerror(errno));
    }
    m->len = 0;
}

static void *s_flusher_main(void *arg)
{
    dp_metrics_t *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&m->wake, &m->mu, &until);
        s_flush_locked(m);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int dp_metrics_new(dp_metrics_t **out, const char *path, char *err)
{
    dp_metrics_t *m = dp_calloc(1, sizeof *m);
    m->fd = -1;
    if (!path || !path[0]) {
        *out = m;
        return 0;
    }
    char e2[DP_ERR_LEN];
    if (dp_mkdir_parents(path, e2) != 0) {
        free(m);
        *out = NULL;
        return dp_err(err, "metrics file %s: %s", path, e2);
    }
    /* O_NOFOLLOW: a symlink planted as the file is refused, never appended through */
    m->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (m->fd < 0) {
        int e = errno;
        free(m);
        *out = NULL;
        return dp_err(err, "metrics file %s: cannot open for appending: %s", path, strerror(e));
    }
    m->path = dp_strdup(path);
    m->buf = dp_malloc(S_BUF_CAP);
    pthread_mutex_init(&m->mu, NULL);
    /* The flusher waits on the monotonic clock: a wall-clock jump must not
     * stall it. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->wake, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&m->flusher, NULL, s_flusher_main, m);
    if (rc != 0) {
        close(m->fd);
        pthread_mutex_destroy(&m->mu);
        pthread_cond_destroy(&m->wake);
        free(m->buf);
        free(m->path);
        free(m);
        *out = NULL;
        return dp_err(err, "metrics file %s: cannot start flusher thread: %s", path,
                      strerror(rc));
    }
    *out = m;
    return 0;
}

cJSON *dp_metrics_line(const dp_metrics_t *m)
{
    if (!m || m->fd < 0) return NULL;
    /* Wall-clock time, so that the lines of every process of a run (workers
     * and parameter servers, on any machine) line up; to the millisecond. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    cJSON *line = cJSON_CreateObject();
    double ms = (double)ts.tv_sec * 1000 + round(ts.tv_nsec * 1e-6);
    cJSON_AddNumberToObject(line, "t", ms / 1000);
    return line;
}

double dp_metrics_round(double v, int digits)
{
    if (v == 0 || !isfinite(v)) return v;
    /* v * 10^p is an integer of `digits` digits; dividing it by an exact
     * power of ten (up to 1e22) gives the double nearest the decimal. */
    int p = digits - 1 - (int)floor(log10(fabs(v)));
    if (p >= 0) {
        double f = pow(10.0, p);
        return round(v * f) / f;
    }
    double f = pow(10.0, -p);
    return round(v / f) * f;
}

/* Appends text and a newline to the buffer, whole. */
static void s_append(dp_metrics_t *m, const char *text, size_t n)
{
    pthread_mutex_lock(&m->mu);
    if (m->len + n + 1 > S_BUF_CAP) s_flush_locked(m);
    if (n + 1 > S_BUF_CAP) {
        /* A huge line goes straight out, still whole: one write with its
         * newline. */
        char *whole = dp_malloc(n + 1);
        memcpy(whole, text, n);
        whole[n] = '\n';
        if (s_write_all(m->fd, whole, n + 1) != 0 && !m->warned_io) {
            m->warned_io = 1;
            dp_log_warn("metrics %s: write failed: %s", m->path, strerror(errno));
        }
        free(whole);
    } else {
        memcpy(m->buf + m->len, text, n);
        m->buf[m->len + n] = '\n';
        m->len += n + 1;
    }
    pthread_mutex_unlock(&m->mu);
}

void dp_metrics_write(dp_metrics_t *m, cJSON **line_p)
{
    cJSON *line = line_p ? *line_p : NULL;
    if (line_p) *line_p = NULL;
    if (line && m && m->fd >= 0) {
        /* Printed on the stack when it fits, so a line per push costs no
         * allocation beyond its object's. */
        char small[S_LINE_CAP];
        if (cJSON_PrintPreallocated(line, small, (int)sizeof small, 0)) {
            s_append(m, small, strlen(small));
        } else {
            char *text = cJSON_PrintUnformatted(line);
            if (text) s_append(m, text, strlen(text));
            cJSON_free(text);
        }
    }
    cJSON_Delete(line);
}

void dp_metrics_flush(dp_metrics_t *m)
{
    if (!m || m->fd < 0) return;
    pthread_mutex_lock(&m->mu);
    s_flush_locked(m);
    pthread_mutex_unlock(&m->mu);
}

void dp_metrics_destroy(dp_metrics_t **m_p)
{
    if (!m_p || !*m_p) return;
    dp_metrics_t *m = *m_p;
    *m_p = NULL;
    if (m->fd >= 0) {
        pthread_mutex_lock(&m->mu);
        m->stop = 1;
        pthread_cond_signal(&m->wake);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->flusher, NULL);
        s_flush_locked(m);
        if (close(m->fd) != 0 && !m->warned_io)
            dp_log_warn("metrics %s: close failed: %s", m->path, strerror(errno));
        pthread_mutex_destroy(&m->mu);
        pthread_cond_destroy(&m->wake);
    }
    free(m->buf);
    free(m->path);
    free(m);
}

int dp_summary_write(const char *path, const cJSON *obj, char *err)
{
    if (!path || !path[0]) return dp_err(err, "summary: no path given");
    if (!obj) return dp_err(err, "summary %s: nothing to write", path);
    char *text = cJSON_Print(obj);
    if (!text) return dp_err(err, "summary %s: cannot print JSON", path);
    size_t n = strlen(text);
    char *data = dp_malloc(n + 2);
    memcpy(data, text, n);
    data[n] = '\n';
    data[n + 1] = '\0';
    cJSON_free(text);
    int rc = dp_write_file_atomic(path, data, n + 1, err);
    free(data);
    return rc;
}

/* The file's last 64 KiB are read: a step's line is far shorter, and
 * events (a crew's joins and leaves) come in tens, not thousands, after
 * the last step. The line that window cuts is passed over. */
#define S_TAIL_BYTES (64 * 1024)

cJSON *dp_metrics_last(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = dp_malloc(S_TAIL_BYTES + 1);
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    long from = size > S_TAIL_BYTES ? size - S_TAIL_BYTES : 0;
    size_t got = size >= 0 && fseek(f, from, SEEK_SET) == 0 ? fread(buf, 1, S_TAIL_BYTES, f) : 0;
    fclose(f);
    buf[got] = 0;
    cJSON *found = NULL;
    for (char *end = buf + got; !found && end > buf;) {
        *end = 0;
        char *start = end;
        while (start > buf && start[-1] != '\n') start--;
        int whole = start > buf || from == 0; /* not the line the window cut */
        if (whole && *start == '{') {
            found = cJSON_ParseWithOpts(start, NULL, 1);
            if (found && cJSON_GetObjectItemCaseSensitive(found, "event")) {
                cJSON_Delete(found);
                found = NULL;
            }
        }
        end = start > buf ? start - 1 : buf;
    }
    free(buf);
    return found;
}
