/* metrics: JSON-lines metrics files and the atomic summary file (see
 * metrics.h for the format).
 *
 * Invariants: buf holds only whole lines; it reaches the file through
 * s_flush_locked, which writes the whole buffer or, on an I/O error, warns
 * once and drops it (a full disk must not stop training). The flusher thread
 * wakes every second; close stops it, joins it, then flushes what is left.
 * A disabled writer has fd -1 and no thread. */
#include "common/metrics.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define S_BUF_CAP (64 * 1024) /* flushed early when a line would not fit */

struct dp_metrics {
    int fd;                 /* -1: disabled writer */
    char *path;             /* for warnings */
    double t0;              /* dp_now() at open */
    pthread_mutex_t mu;     /* guards everything below */
    pthread_cond_t wake;    /* signalled by close to stop the flusher */
    pthread_t flusher;
    int stop;               /* set by close */
    char *buf;              /* whole lines not yet written */
    size_t len;             /* bytes in buf */
    int warned_io;          /* warn about write errors once */
    int warned_invalid;     /* warn about bodies that are not JSON once */
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
    m->t0 = dp_now();
    if (!path || !path[0]) {
        *out = m;
        return 0;
    }
    m->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (m->fd < 0) {
        int e = errno;
        free(m);
        *out = NULL;
        return dp_err(err, "metrics file %s: cannot create: %s", path, strerror(e));
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

double dp_metrics_elapsed(const dp_metrics_t *m)
{
    return m && m->fd >= 0 ? dp_now() - m->t0 : 0.0;
}

/* Is the bare token at s (letters only, any case) nan / inf / infinity? */
static size_t s_nonfinite_len(const char *s)
{
    size_t n = 0;
    while (isalpha((unsigned char)s[n])) n++;
    if (isalnum((unsigned char)s[n]) || s[n] == '_' || s[n] == '(') return 0;
    if ((n == 3 && strncasecmp(s, "nan", 3) == 0) || (n == 3 && strncasecmp(s, "inf", 3) == 0) ||
        (n == 8 && strncasecmp(s, "infinity", 8) == 0))
        return n;
    return 0;
}

char *dp_json_nonfinite_to_null(const char *s)
{
    size_t n = strlen(s);
    /* Worst growth: "nan" -> "null", 3 bytes to 4. */
    char *out = dp_malloc(n + n / 3 + 2);
    size_t o = 0;
    int in_str = 0;
    char prev = ':'; /* last non-blank outside strings; the start is a value position */
    for (size_t i = 0; i < n;) {
        char ch = s[i];
        if (in_str) {
            out[o++] = ch;
            if (ch == '\\' && i + 1 < n) {
                out[o++] = s[i + 1];
                i += 2;
                continue;
            }
            if (ch == '"') in_str = 0;
            i++;
            continue;
        }
        if (ch == '"') {
            in_str = 1;
            prev = ch;
            out[o++] = ch;
            i++;
            continue;
        }
        if (prev == ':' || prev == ',' || prev == '[') {
            size_t sign = (ch == '-' || ch == '+') ? 1 : 0;
            size_t tok = s_nonfinite_len(s + i + sign);
            if (tok) {
                memcpy(out + o, "null", 4);
                o += 4;
                i += sign + tok;
                prev = 'l';
                continue;
            }
        }
        if (!isspace((unsigned char)ch)) prev = ch;
        out[o++] = ch;
        i++;
    }
    out[o] = '\0';
    return out;
}

void dp_metrics_write(dp_metrics_t *m, const char *fmt, ...)
{
    if (!m || m->fd < 0) return;
    /* Wall-clock time, so that the lines of every process of a run (workers
     * and parameter servers, on any machine) line up. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9;

    /* Body, on the stack when it is small (the common case). */
    char small[512];
    char *body = small;
    va_list ap;
    va_start(ap, fmt);
    int bn = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (bn < 0) bn = 0, small[0] = '\0';
    if ((size_t)bn >= sizeof small) {
        body = dp_malloc((size_t)bn + 1);
        va_start(ap, fmt);
        vsnprintf(body, (size_t)bn + 1, fmt, ap);
        va_end(ap);
    }
    char *fixed = dp_json_nonfinite_to_null(body);
    if (body != small) free(body);

    /* Blank body -> {"t":...}; otherwise {"t":...,body}. */
    const char *b = fixed;
    while (isspace((unsigned char)*b)) b++;
    size_t cap = strlen(b) + 64;
    char *line = dp_malloc(cap);
    int ln = snprintf(line, cap, *b ? "{\"t\":%.3f,%s}" : "{\"t\":%.3f}", t, b);
    /* Checked here rather than trusted: one bad format string must not make
     * the whole file unreadable by a JSON-lines reader. */
    cJSON *check = cJSON_ParseWithOpts(line, NULL, 1);
    int bad = check == NULL || !cJSON_IsObject(check);
    cJSON_Delete(check);
    if (bad) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "t", round(t * 1000) / 1000); /* as %.3f */
        cJSON_AddStringToObject(o, "invalid", fixed);
        char *p = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        free(line);
        line = dp_strdup(p ? p : "{}");
        cJSON_free(p);
        ln = (int)strlen(line);
    }
    free(fixed);

    pthread_mutex_lock(&m->mu);
    if (bad && !m->warned_invalid) {
        m->warned_invalid = 1;
        dp_log_warn("metrics %s: a line body is not JSON; written as \"invalid\": %.80s", m->path,
                    line);
    }
    size_t need = (size_t)ln + 1;
    if (m->len + need > S_BUF_CAP) s_flush_locked(m);
    if (need > S_BUF_CAP) {
        /* A huge line goes straight out, still whole. */
        line[ln] = '\n';
        if (s_write_all(m->fd, line, need) != 0 && !m->warned_io) {
            m->warned_io = 1;
            dp_log_warn("metrics %s: write failed: %s", m->path, strerror(errno));
        }
    } else {
        memcpy(m->buf + m->len, line, (size_t)ln);
        m->buf[m->len + (size_t)ln] = '\n';
        m->len += need;
    }
    pthread_mutex_unlock(&m->mu);
    free(line);
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
