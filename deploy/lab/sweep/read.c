/* sweep/read: a finished run's numbers (see read.h). The chief
 * evaluates the weights it pulled for a step, so a periodic point's updates
 * are that push line's "version"; the final point is the summary's. */
#include "deploy/lab/sweep/read.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "deploy/lab/sweep/run.h"

#define DP_SWEEP_HIST_MAX 4096 /* staleness values kept apart; larger ones count in the last */

static double s_num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static double s_num_at(const cJSON *a, int i)
{
    const cJSON *v = cJSON_GetArrayItem(a, i);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static void s_curve_add(dp_sweep_result_t *r, double updates, double seconds, double acc);

static int s_read_summary(dp_sweep_result_t *r, const char *dir, char *err)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dp_read_file(path, &buf, &len, err) != 0) return -1;
    cJSON *o = cJSON_Parse((const char *)buf);
    free(buf);
    r->rl = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "env"));
    if (!o || (!r->rl && !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "test_accuracy"))) ||
        (r->rl && !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "return_mean_100")))) {
        cJSON_Delete(o);
        return dp_err(err, "%s: not a run summary (no test_accuracy or return_mean_100)", path);
    }
    r->test_accuracy = s_num(o, "test_accuracy", 0);
    r->test_auc = s_num(o, "test_auc", -1);
    r->return_mean_100 = s_num(o, "return_mean_100", 0);
    r->test_return = s_num(o, "test_return", 0);
    r->env_steps = s_num(o, "env_steps", 0);
    r->solved_at = s_num(o, "solved_at_env_steps", -1);
    r->solved_threshold = s_num(o, "solved_threshold", 0);
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(o, "return_curve"), *pt;
    cJSON_ArrayForEach(pt, rc) /* [[env step, mean return], ...] */
        if (cJSON_GetArraySize(pt) == 2 && r->n_curve < DP_SWEEP_HIST_MAX)
            s_curve_add(r, s_num_at(pt, 0), 0, s_num_at(pt, 1));
    /* Updates are optimizer steps: the final version (a sync step applies
     * several pushes at once); standalone has none, one update per step. */
    r->updates = s_num(o, "version", s_num(o, "updates_applied", 0));
    r->wall_s = s_num(o, "wall_s", 0);
    r->staleness_mean = s_num(o, "staleness_mean", 0);
    r->staleness_max = s_num(o, "staleness_max", 0);
    /* The servers' own counts per staleness, when the summary has them. */
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "staleness_histogram"), *it;
    int n = cJSON_GetArraySize(h);
    if (cJSON_IsArray(h) && n > 0 && n <= DP_SWEEP_HIST_MAX) {
        r->hist = dp_calloc((size_t)n, sizeof(long));
        cJSON_ArrayForEach(it, h) r->hist[r->n_hist++] = cJSON_IsNumber(it) ? (long)it->valuedouble : 0;
    }
    cJSON_Delete(o);
    return 0;
}

/* What the chief's step lines say, by step: the version its weights had
 * (-1: standalone, one update per step) and when the step was done. */
typedef struct {
    double *version, *t;
    long n, cap;
    double t0;        /* the chief's start line */
    double eval_s;    /* seconds the chief spent in evaluations so far */
    double eval_prev; /* ... before the last one */
} s_steps_t;

static void s_steps_set(s_steps_t *st, long step, double version, double t)
{
    if (step < 0 || step > 100000000L) return;
    if (step >= st->cap) {
        long cap = st->cap ? st->cap : 1024;
        while (cap <= step) cap *= 2;
        st->version = dp_realloc(st->version, (size_t)cap * sizeof(double));
        st->t = dp_realloc(st->t, (size_t)cap * sizeof(double));
        for (long i = st->cap; i < cap; i++) st->version[i] = st->t[i] = -1;
        st->cap = cap;
    }
    st->version[step] = version;
    st->t[step] = t;
    if (step >= st->n) st->n = step + 1;
}

static void s_curve_add(dp_sweep_result_t *r, double updates, double seconds, double acc)
{
    r->curve = dp_realloc(r->curve, (size_t)(r->n_curve + 1) * sizeof *r->curve);
    r->curve[r->n_curve++] = (dp_sweep_point_t){updates, seconds, acc};
}

/* An "eval" line after `step` steps: the weights the chief used for its
 * step step - 1, their version (standalone: step updates) and the time
 * that step was done, less the chief's earlier evaluations (they are the
 * sweep's cost, not the run's). */
static void s_curve_eval(dp_sweep_result_t *r, s_steps_t *st, long step, double t, double acc)
{
    long s = step - 1;
    int known = s >= 0 && s < st->n && st->t[s] >= 0;
    double updates = known && st->version[s] >= 0 ? st->version[s] : (double)step;
    double done_t = known ? st->t[s] : t;
    s_curve_add(r, updates, done_t - st->t0 - st->eval_s, acc);
    st->eval_prev = st->eval_s;
    st->eval_s += t - done_t;
}

/* One line of the chief's metrics. */
static void s_curve_line(dp_sweep_result_t *r, const cJSON *o, s_steps_t *st)
{
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
    double t = s_num(o, "t", 0), step = s_num(o, "step", -1);
    if (st->t0 < 0) st->t0 = t;
    if (!cJSON_IsString(ev)) {
        if (step >= 0) s_steps_set(st, (long)step, s_num(o, "version", -1), t);
        return;
    }
    if (strcmp(ev->valuestring, "start") == 0) st->t0 = t;
    if (strcmp(ev->valuestring, "eval") == 0 && step >= 0)
        s_curve_eval(r, st, (long)step, t, s_num(o, "test_accuracy", 0));
}

static void s_read_curve(dp_sweep_result_t *r, const char *dir, double last_push_t)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics/worker-0.jsonl", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    s_steps_t st = {.t0 = -1};
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        if (o) s_curve_line(r, o, &st);
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    /* The last evaluation is the end of the run's: the summary's figures,
     * at the last push of any worker (the chief may finish first). */
    if (r->n_curve > 0) {
        dp_sweep_point_t *p = &r->curve[r->n_curve - 1];
        p->updates = r->updates;
        p->accuracy = r->test_accuracy;
        if (last_push_t > 0) p->seconds = last_push_t - st.t0 - st.eval_prev;
    }
    free(st.version);
    free(st.t);
}

static void s_hist_file(dp_sweep_result_t *r, const char *path, double *last_t, int count)
{
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        if (!strstr(line, "\"staleness\"")) continue;
        cJSON *o = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "staleness");
        int push = cJSON_IsNumber(s) && !cJSON_GetObjectItemCaseSensitive(o, "event") && s->valuedouble >= 0;
        if (push && s_num(o, "t", 0) > *last_t) *last_t = s_num(o, "t", 0);
        if (push && count) {
            long v = lround(s->valuedouble);
            if (v >= DP_SWEEP_HIST_MAX) v = DP_SWEEP_HIST_MAX - 1;
            if (v >= r->n_hist) {
                r->hist = dp_realloc(r->hist, (size_t)(v + 1) * sizeof(long));
                memset(r->hist + r->n_hist, 0, (size_t)(v + 1 - r->n_hist) * sizeof(long));
                r->n_hist = (int)v + 1;
            }
            r->hist[v]++;
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
}

/* The time of the last push of any worker, and the histogram from the
 * push lines when the summary had none. */
static void s_read_hist(dp_sweep_result_t *r, const char *dir, double *last_t)
{
    int count = r->n_hist == 0;
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/metrics", dir);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "worker-", 7) != 0 || !strstr(e->d_name, ".jsonl")) continue;
        snprintf(path, sizeof path, "%s/metrics/%s", dir, e->d_name);
        s_hist_file(r, path, last_t, count);
    }
    closedir(d);
}

/* A simulated run: its metrics' "eval" lines (updates, simulated seconds)
 * and the result, run.log's last line, for the final point's seconds. */
static int s_read_sim(dp_sweep_result_t *r, const char *dir)
{
    char path[PATH_MAX + 32], last[16384];
    snprintf(path, sizeof path, "%s/metrics/sim.jsonl", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
        if (cJSON_IsString(ev) && strcmp(ev->valuestring, "eval") == 0)
            s_curve_add(r, s_num(o, "updates", 0), s_num(o, "sim_s", 0), s_num(o, "test_accuracy", 0));
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    /* The final evaluation: the last eval line when the simulator writes
     * one (at the last update), else a point of its own at the result's
     * simulated seconds (run.log's last line); the summary's figures. */
    dp_sweep_run_last_line(dir, last, sizeof last);
    cJSON *res = cJSON_Parse(last);
    if (r->n_curve == 0 || r->curve[r->n_curve - 1].updates < r->updates)
        s_curve_add(r, r->updates, s_num(res, "sim_s", r->wall_s), r->test_accuracy);
    r->curve[r->n_curve - 1].accuracy = r->test_accuracy;
    cJSON_Delete(res);
    return 1;
}

int dp_sweep_read(dp_sweep_result_t *r, const char *dir, char *err)
{
    memset(r, 0, sizeof *r);
    if (s_read_summary(r, dir, err) != 0) return -1;
    double last_push_t = 0;
    s_read_hist(r, dir, &last_push_t);
    if (!r->rl && !s_read_sim(r, dir)) s_read_curve(r, dir, last_push_t);
    if (!r->rl && r->n_curve == 0) s_curve_add(r, r->updates, r->wall_s, r->test_accuracy);
    r->ok = 1;
    return 0;
}

void dp_sweep_result_fini(dp_sweep_result_t *r)
{
    free(r->curve);
    free(r->hist);
    memset(r, 0, sizeof *r);
}

int dp_sweep_reached(const dp_sweep_result_t *r, double target, double *updates, double *seconds)
{
    for (int i = 0; i < r->n_curve; i++) {
        if (r->curve[i].accuracy >= target) {
            *updates = r->curve[i].updates;
            *seconds = r->curve[i].seconds;
            return 1;
        }
    }
    return 0;
}
