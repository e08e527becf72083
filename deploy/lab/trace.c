/* trace: a real run's step times for the simulator (see trace.h). */
#include "deploy/lab/trace.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/util.h"

#define DP_TRACE_MAX_MS 1e9
#define DP_TRACE_MAX_CLOCK_S 1e12

/* "worker-I.jsonl" with I a task index: I, else -1. */
static int s_task_of(const char *name)
{
    if (strncmp(name, "worker-", 7) != 0) return -1;
    const char *p = name + 7;
    long i = 0;
    if (!isdigit((unsigned char)*p)) return -1;
    for (; isdigit((unsigned char)*p); p++) {
        i = i * 10 + (*p - '0');
        if (i >= DP_TRACE_MAX_WORKERS) return -1;
    }
    return strcmp(p, ".jsonl") == 0 ? (int)i : -1;
}

static int s_cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The task indices of DIR/metrics/worker-I.jsonl, sorted, into t->task. */
static int s_list(dp_trace_t *t, const char *dir, const char *metrics, char *err)
{
    struct stat st;
    if (stat(dir, &st) != 0) return dp_err(err, "trace:%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return dp_err(err, "trace:%s: not a directory", dir);
    DIR *d = opendir(metrics);
    if (!d)
        return dp_err(err, "trace:%s: no %s (%s): give the --out of a downpour local run", dir,
                      metrics, strerror(errno));
    t->task = dp_calloc(DP_TRACE_MAX_WORKERS, sizeof *t->task);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int i = s_task_of(e->d_name);
        if (i >= 0) t->task[t->workers++] = i; /* one file per index: at most the array */
    }
    closedir(d);
    if (t->workers == 0)
        return dp_err(err, "trace:%s: no worker metrics in %s (worker-I.jsonl): give the --out "
                      "of a downpour local run", dir, metrics);
    qsort(t->task, (size_t)t->workers, sizeof *t->task, s_cmp_int);
    return 0;
}

/* A step line's time key: a number in [0, max], else one line in err. */
static int s_time(const cJSON *o, const char *key, double max, const char *path, long no, double *out,
                  char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        return dp_err(err, "trace: %s:%ld: a step without \"%s\" (a run from before the trace's "
                      "fields?)", path, no, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > max) {
        char *shown = cJSON_PrintUnformatted(v);
        dp_err(err, "trace: %s:%ld: \"%s\" %.40s is not a time in [0, %g]", path, no, key,
               shown ? shown : "?", max);
        cJSON_free(shown);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

/* One line of a worker file (its number no, without its newline): a step
 * line's times appended to *ms (n triples of cap: the weights held, the
 * pull's and the push's, those 0 where the loop did not measure them, each
 * at most step_ms), the first one's start into
 * *start_s; any other line checked only to be a JSON object. */
static int s_line(const char *path, long no, const char *text, size_t len, double **ms, long *n, long *cap,
                  double *start_s, char *err)
{
    cJSON *o = cJSON_ParseWithLength(text, len);
    int rc = -1;
    if (!cJSON_IsObject(o)) {
        dp_err(err, "trace: %s:%ld is not a JSON object (a line cut short or damaged)", path, no);
        goto out;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, "event") || !cJSON_GetObjectItemCaseSensitive(o, "step")) {
        rc = 0; /* an event's line: the start, an evaluation, the histogram */
        goto out;
    }
    double step_ms, clock_s, pull_ms = 0, push_ms = 0;
    if (s_time(o, "step_ms", DP_TRACE_MAX_MS, path, no, &step_ms, err) != 0 ||
        s_time(o, "clock_s", DP_TRACE_MAX_CLOCK_S, path, no, &clock_s, err) != 0 ||
        (cJSON_GetObjectItemCaseSensitive(o, "pull_ms") &&
         (s_time(o, "pull_ms", step_ms, path, no, &pull_ms, err) != 0 ||
          s_time(o, "push_ms", step_ms, path, no, &push_ms, err) != 0)))
        goto out;
    if (*n == 0) *start_s = clock_s - step_ms / 1e3; /* its first step began then */
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        *ms = dp_realloc(*ms, (size_t)*cap * 3 * sizeof **ms);
    }
    double *at = *ms + 3 * (*n)++;
    at[0] = fmax(0, step_ms - pull_ms - push_ms); /* with the weights: the rounding's last digit */
    at[1] = pull_ms;
    at[2] = push_ms;
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

/* Traced worker k's file, every line checked, its steps' times kept. */
static int s_read(dp_trace_t *t, int k, const char *metrics, char *err)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/worker-%d.jsonl", metrics, t->task[k]);
    FILE *f = fopen(path, "r");
    if (!f) return dp_err(err, "trace: %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t size = 0;
    ssize_t got;
    long no = 0, cap = 0;
    int rc = 0;
    while (rc == 0 && (got = getline(&line, &size, f)) > 0) {
        no++;
        if (line[got - 1] != '\n')
            rc = dp_err(err, "trace: %s:%ld is cut short (no newline at its end)", path, no);
        else
            rc = s_line(path, no, line, (size_t)got - 1, &t->ms[k], &t->n[k], &cap, &t->start_s[k], err);
    }
    if (rc == 0 && ferror(f)) rc = dp_err(err, "trace: %s: %s", path, strerror(errno));
    if (rc == 0 && t->n[k] == 0)
        rc = dp_err(err, "trace: %s has no step with \"step_ms\" (the worker pushed nothing)", path);
    free(line);
    fclose(f);
    return rc;
}

int dp_trace_load(dp_trace_t *t, const char *dir, char *err)
{
    memset(t, 0, sizeof *t);
    char metrics[PATH_MAX];
    if (snprintf(metrics, sizeof metrics, "%s/metrics", dir) >= (int)sizeof metrics)
        return dp_err(err, "trace:%.64s...: the path is too long", dir);
    if (s_list(t, dir, metrics, err) != 0) goto fail;
    t->ms = dp_calloc((size_t)t->workers, sizeof *t->ms);
    t->n = dp_calloc((size_t)t->workers, sizeof *t->n);
    t->start_s = dp_calloc((size_t)t->workers, sizeof *t->start_s);
    for (int k = 0; k < t->workers; k++)
        if (s_read(t, k, metrics, err) != 0) goto fail;
    double first = t->start_s[0]; /* the starts from the earliest */
    for (int k = 1; k < t->workers; k++) first = fmin(first, t->start_s[k]);
    for (int k = 0; k < t->workers; k++) t->start_s[k] -= first;
    return 0;
fail:
    dp_trace_free(t);
    return -1;
}

void dp_trace_free(dp_trace_t *t)
{
    for (int k = 0; t->ms && k < t->workers; k++) free(t->ms[k]);
    free(t->ms);
    free(t->n);
    free(t->start_s);
    free(t->task);
    memset(t, 0, sizeof *t);
}

void dp_trace_cursor(const dp_trace_t *t, int w, int M, dp_trace_cursor_t *c)
{
    int T = t->workers, i = w % T;
    long copies = (M - i + T - 1) / T; /* simulated workers on series i */
    c->ms = t->ms[i];
    c->n = t->n[i];
    c->pos = (long)((w / T) * (double)c->n / (double)copies); /* c/k of the way in */
    c->start_ms = w < T ? t->start_s[i] * 1e3 : 0;
}

double dp_trace_first(const dp_trace_cursor_t *c)
{
    return c->start_ms + c->ms[3 * c->pos + 1];
}

double dp_trace_next(dp_trace_cursor_t *c, double *gap_ms)
{
    const double *at = c->ms + 3 * c->pos;
    if (++c->pos == c->n) c->pos = 0;
    *gap_ms = at[2] + c->ms[3 * c->pos + 1]; /* its push's, the next step's pull */
    return at[0];
}
