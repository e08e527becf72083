/* sweep/report: report.md and results.json (see report.h). The
 * table's figures are computed once, in s_stats, and both files print
 * them, so the table and the JSON never disagree. */
#include "deploy/lab/sweep/report.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "deploy/lab/sweep/plot.h"
#include "deploy/lab/sweep/text.h"

/* One configuration's figures over its seeds. */
typedef struct {
    int n_ok, n_failed;
    double acc_mean, acc_std;          /* sample std (n - 1); 0 for one seed */
    double stale_mean, stale_max;
    int reached[DP_SWEEP_TARGETS];     /* seeds that reached target t */
    double t_mean[DP_SWEEP_TARGETS];   /* over those seeds */
    double u_mean[DP_SWEEP_TARGETS];
    int rl;                            /* actor-critic runs: their return figures */
    double ret_mean, ret_std;          /* return_mean_100 over the seeds */
    double test_mean, test_std;        /* test_return */
    int solved;                        /* seeds that solved the environment */
    double solved_mean;                /* solved_at_env_steps over those */
    int auc;                           /* a sparse model's runs: their test AUC too */
    double auc_mean, auc_std;
} s_stats_t;

/* Mean and sample std (n - 1; 0 for one) of field over the runs read. */
static void s_mean_std(const dp_sweep_config_t *c, size_t field, double *mean, double *std)
{
    double sum = 0, sq = 0;
    int n = 0;
    for (int s = 0; s < c->n_run; s++)
        if (c->run[s].res.ok) sum += *(const double *)((const char *)&c->run[s].res + field), n++;
    *mean = n ? sum / n : 0;
    for (int s = 0; s < c->n_run; s++)
        if (c->run[s].res.ok) sq += pow(*(const double *)((const char *)&c->run[s].res + field) - *mean, 2);
    *std = n > 1 ? sqrt(sq / (n - 1)) : 0;
}

/* An actor-critic configuration's figures. */
static void s_stats_rl(const dp_sweep_config_t *c, s_stats_t *st)
{
    s_mean_std(c, offsetof(dp_sweep_result_t, return_mean_100), &st->ret_mean, &st->ret_std);
    s_mean_std(c, offsetof(dp_sweep_result_t, test_return), &st->test_mean, &st->test_std);
    for (int s = 0; s < c->n_run; s++) {
        const dp_sweep_result_t *r = &c->run[s].res;
        st->rl |= r->ok && r->rl;
        if (!r->ok || r->solved_at < 0) continue;
        st->solved++;
        st->solved_mean += r->solved_at;
    }
    if (st->solved) st->solved_mean /= st->solved;
}

static void s_stats(const dp_sweep_grid_t *g, const dp_sweep_config_t *c, s_stats_t *st)
{
    memset(st, 0, sizeof *st);
    double sum = 0, sq = 0;
    for (int s = 0; s < c->n_run; s++) {
        const dp_sweep_result_t *r = &c->run[s].res;
        if (!r->ok) {
            st->n_failed += c->run[s].status > 0;
            continue;
        }
        st->n_ok++;
        sum += r->test_accuracy;
        st->stale_mean += r->staleness_mean;
        if (r->staleness_max > st->stale_max) st->stale_max = r->staleness_max;
        for (int t = 0; t < g->n_target; t++) {
            double u, sec;
            if (!dp_sweep_reached(r, g->target[t], &u, &sec)) continue;
            st->reached[t]++;
            st->t_mean[t] += sec;
            st->u_mean[t] += u;
        }
    }
    if (st->n_ok == 0) return;
    st->acc_mean = sum / st->n_ok;
    st->stale_mean /= st->n_ok;
    for (int s = 0; s < c->n_run; s++)
        if (c->run[s].res.ok) sq += pow(c->run[s].res.test_accuracy - st->acc_mean, 2);
    st->acc_std = st->n_ok > 1 ? sqrt(sq / (st->n_ok - 1)) : 0;
    s_stats_rl(c, st);
    for (int s = 0; s < c->n_run; s++) st->auc |= c->run[s].res.ok && c->run[s].res.test_auc >= 0;
    if (st->auc) s_mean_std(c, offsetof(dp_sweep_result_t, test_auc), &st->auc_mean, &st->auc_std);
    for (int t = 0; t < g->n_target; t++) {
        if (!st->reached[t]) continue;
        st->t_mean[t] /= st->reached[t];
        st->u_mean[t] /= st->reached[t];
    }
}

/* A time or update count to a target: "-" when no seed reached it, the
 * mean with "(k/n)" when only k of n did. */
static void s_cell(dp_sweep_text_t *t, const s_stats_t *st, int target, int secs)
{
    if (!st->reached[target]) {
        dp_sweep_text_add(t, " - |");
        return;
    }
    dp_sweep_text_add(t, secs ? " %.1f" : " %.0f", secs ? st->t_mean[target] : st->u_mean[target]);
    if (st->reached[target] < st->n_ok) dp_sweep_text_add(t, " (%d/%d)", st->reached[target], st->n_ok);
    dp_sweep_text_add(t, " |");
}

/* The runs' seeds column: how many were read, failed, not run. */
static void s_seeds_cell(dp_sweep_text_t *t, const dp_sweep_config_t *c, const s_stats_t *s)
{
    dp_sweep_text_add(t, "| %s %s | %d", c->id, c->label, s->n_ok);
    if (s->n_failed) dp_sweep_text_add(t, " (%d failed)", s->n_failed);
    if (s->n_ok + s->n_failed < c->n_run) dp_sweep_text_add(t, " (%d not run)", c->n_run - s->n_ok - s->n_failed);
}

/* An actor-critic sweep's table: returns instead of accuracy and targets. */
static void s_table_rl(dp_sweep_text_t *t, const dp_sweep_config_t *cfg, int n_cfg, const s_stats_t *st)
{
    dp_sweep_text_add(t, "| config | seeds | return of the last 100 | greedy test return | solved | "
                         "env steps to solve | staleness mean | staleness max |\n"
                         "|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n_cfg; i++) {
        const s_stats_t *s = &st[i];
        s_seeds_cell(t, &cfg[i], s);
        if (s->n_ok == 0) {
            dp_sweep_text_add(t, " | - | - | - | - | - | - |\n");
            continue;
        }
        dp_sweep_text_add(t, " | %.1f ± %.1f | %.1f ± %.1f | %d/%d |", s->ret_mean, s->ret_std, s->test_mean,
                          s->test_std, s->solved, s->n_ok);
        if (s->solved) dp_sweep_text_add(t, " %.0f |", s->solved_mean);
        else dp_sweep_text_add(t, " - |");
        dp_sweep_text_add(t, " %.2f | %.0f |\n", s->stale_mean, s->stale_max);
    }
}

static void s_table(dp_sweep_text_t *t, const dp_sweep_grid_t *g, const dp_sweep_config_t *cfg,
                    int n_cfg, const s_stats_t *st)
{
    int rl = 0;
    for (int i = 0; i < n_cfg; i++) rl |= st[i].rl;
    if (rl) {
        s_table_rl(t, cfg, n_cfg, st);
        return;
    }
    int auc = 0; /* a sparse model's runs: the headline is the test AUC, a column first */
    for (int i = 0; i < n_cfg; i++) auc |= st[i].auc;
    dp_sweep_text_add(t, "| config | seeds |%s final test accuracy |", auc ? " final test AUC |" : "");
    for (int k = 0; k < g->n_target; k++) dp_sweep_text_add(t, " s to %.0f%% |", g->target[k] * 100);
    for (int k = 0; k < g->n_target; k++) dp_sweep_text_add(t, " updates to %.0f%% |", g->target[k] * 100);
    dp_sweep_text_add(t, " staleness mean | staleness max |\n|---|---|---|%s", auc ? "---|" : "");
    for (int k = 0; k < 2 * g->n_target; k++) dp_sweep_text_add(t, "---|");
    dp_sweep_text_add(t, "---|---|\n");
    for (int i = 0; i < n_cfg; i++) {
        const s_stats_t *s = &st[i];
        s_seeds_cell(t, &cfg[i], s);
        if (s->n_ok == 0) {
            dp_sweep_text_add(t, " | - |%s", auc ? " - |" : "");
            for (int k = 0; k < 2 * g->n_target + 2; k++) dp_sweep_text_add(t, " - |");
            dp_sweep_text_add(t, "\n");
            continue;
        }
        dp_sweep_text_add(t, " |");
        if (auc && s->auc) dp_sweep_text_add(t, " %.4f ± %.4f |", s->auc_mean, s->auc_std);
        else if (auc) dp_sweep_text_add(t, " - |");
        dp_sweep_text_add(t, " %.4f ± %.4f |", s->acc_mean, s->acc_std);
        for (int k = 0; k < g->n_target; k++) s_cell(t, s, k, 1);
        for (int k = 0; k < g->n_target; k++) s_cell(t, s, k, 0);
        dp_sweep_text_add(t, " %.2f | %.0f |\n", s->stale_mean, s->stale_max);
    }
}

/* Every plot a sweep may draw (deploy/lab/sweep/plot.c), in the report's order. */
static const struct {
    const char *file, *what;
} s_pngs[] = {
    {"accuracy_vs_updates.png", "test accuracy against server updates"},
    {"accuracy_vs_seconds.png", "test accuracy against seconds"},
    {"return_vs_env_steps.png", "mean return of the last 100 episodes against env steps"},
    {"env_steps_to_solve.png", "env steps to solve, per configuration"},
    {"staleness.png", "staleness histogram"},
};

static void s_markdown(dp_sweep_text_t *t, const char *out, const dp_sweep_grid_t *g, const dp_sweep_config_t *cfg,
                       int n_cfg, const s_stats_t *st, int plots)
{
    dp_sweep_text_add(t, "# Sweep report\n\n%d configuration(s) x %d seed(s) on the %s cluster",
                      n_cfg, dp_sweep_grid_seeds(g), strcmp(g->cluster, "sim") == 0 ? "simulated" : "local");
    int fixed = 0;
    for (int a = 0; a < DP_SWEEP_SEED; a++)
        if (g->n[a] == 1)
            dp_sweep_text_add(t, "%s%s=%s", fixed++ ? " " : "; every run with ", dp_sweep_axis_name(a),
                              g->value[a][0]);
    if (g->args) dp_sweep_text_add(t, "%s`%s`", fixed ? " " : "; every run with ", g->args);
    int rl = 0;
    for (int i = 0; i < n_cfg; i++) rl |= st[i].rl;
    if (rl)
        dp_sweep_text_add(t, ".\n\nActor-critic runs (env): the return of the last 100 episodes (the run's, "
                             "all workers') and the greedy policy's test return over 100 fresh "
                             "episodes, mean ± sample standard deviation over the seeds; the seeds "
                             "whose mean of the last 100 reached the environment's threshold, and the "
                             "env step at which it first did, averaged over them. Staleness: the runs' "
                             "summary.json, mean of the means and max of the maxima.\n\n");
    else
        dp_sweep_text_add(t, ".\n\nFinal test accuracy: the final weights on the whole test set, mean ± "
                         "sample standard deviation over the seeds. Seconds and updates to a target: "
                         "the first evaluation at or above it (every %ld chief steps, or updates when "
                         "simulated, on the first %d test samples; seconds from the chief's start, "
                         "its evaluations taken out, or simulated seconds), averaged over the seeds "
                         "that reached it, \"(k/n)\" when only k of n did, \"-\" when none did. "
                         "Staleness: the runs' summary.json, mean of the means and max of the maxima.\n\n",
                      g->eval_every, g->eval_limit);
    s_table(t, g, cfg, n_cfg, st);
    if (plots) /* the plots gnuplot drew: a sweep's data may give some only */
        for (size_t i = 0; i < sizeof s_pngs / sizeof s_pngs[0]; i++) {
            char path[PATH_MAX + 64];
            snprintf(path, sizeof path, "%s/%s", out, s_pngs[i].file);
            if (access(path, F_OK) == 0) dp_sweep_text_add(t, "\n![%s](%s)\n", s_pngs[i].what, s_pngs[i].file);
        }
    dp_sweep_text_add(t, "\n## Runs\n\n");
    for (int i = 0; i < n_cfg; i++)
        for (int s = 0; s < cfg[i].n_run; s++) {
            const dp_sweep_seed_run_t *r = &cfg[i].run[s];
            dp_sweep_text_add(t, "- %s seed %s: `%s`", cfg[i].id, r->seed, r->dir);
            if (r->res.ok && r->res.rl)
                dp_sweep_text_add(t, " return of the last 100 %.1f, test return %.1f\n", r->res.return_mean_100,
                                  r->res.test_return);
            else if (r->res.ok) dp_sweep_text_add(t, " test accuracy %.4f\n", r->res.test_accuracy);
            else if (r->status > 0) dp_sweep_text_add(t, " failed (exit status %d; see its run.log)\n", r->status);
            else dp_sweep_text_add(t, " not run\n");
        }
}

static cJSON *s_config_json(const dp_sweep_grid_t *g, const dp_sweep_config_t *c, const s_stats_t *s)
{
    cJSON *o = cJSON_CreateObject(), *axes = cJSON_AddObjectToObject(o, "axes");
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "label", c->label);
    for (int a = 0; a < DP_SWEEP_SEED; a++) {
        const char *v = dp_sweep_grid_value(g, c->pick, a);
        if (v) cJSON_AddStringToObject(axes, dp_sweep_axis_name(a), v);
    }
    cJSON_AddNumberToObject(o, "seeds_ok", s->n_ok);
    cJSON_AddNumberToObject(o, "final_accuracy_mean", s->acc_mean);
    cJSON_AddNumberToObject(o, "final_accuracy_std", s->acc_std);
    if (s->auc) {
        cJSON_AddNumberToObject(o, "final_auc_mean", s->auc_mean);
        cJSON_AddNumberToObject(o, "final_auc_std", s->auc_std);
    }
    cJSON_AddNumberToObject(o, "staleness_mean", s->stale_mean);
    cJSON_AddNumberToObject(o, "staleness_max", s->stale_max);
    if (s->rl) {
        cJSON_AddNumberToObject(o, "return_mean_100_mean", s->ret_mean);
        cJSON_AddNumberToObject(o, "return_mean_100_std", s->ret_std);
        cJSON_AddNumberToObject(o, "test_return_mean", s->test_mean);
        cJSON_AddNumberToObject(o, "test_return_std", s->test_std);
        cJSON_AddNumberToObject(o, "solved", s->solved);
        if (s->solved) cJSON_AddNumberToObject(o, "solved_at_env_steps_mean", s->solved_mean);
    }
    cJSON *targets = cJSON_AddArrayToObject(o, "targets");
    for (int t = 0; t < g->n_target; t++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "target", g->target[t]);
        cJSON_AddNumberToObject(x, "reached", s->reached[t]);
        if (s->reached[t]) {
            cJSON_AddNumberToObject(x, "seconds_mean", s->t_mean[t]);
            cJSON_AddNumberToObject(x, "updates_mean", s->u_mean[t]);
        }
        cJSON_AddItemToArray(targets, x);
    }
    cJSON *runs = cJSON_AddArrayToObject(o, "runs");
    for (int i = 0; i < c->n_run; i++) {
        const dp_sweep_seed_run_t *r = &c->run[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "seed", r->seed);
        cJSON_AddStringToObject(x, "dir", r->dir);
        cJSON_AddNumberToObject(x, "status", r->status);
        if (r->res.ok) {
            cJSON_AddNumberToObject(x, "test_accuracy", r->res.test_accuracy);
            if (r->res.test_auc >= 0) cJSON_AddNumberToObject(x, "test_auc", r->res.test_auc);
            cJSON_AddNumberToObject(x, "updates", r->res.updates);
            cJSON_AddNumberToObject(x, "wall_s", r->res.wall_s);
            cJSON_AddNumberToObject(x, "staleness_mean", r->res.staleness_mean);
            cJSON_AddNumberToObject(x, "staleness_max", r->res.staleness_max);
            if (r->res.rl) {
                cJSON_AddNumberToObject(x, "env_steps", r->res.env_steps);
                cJSON_AddNumberToObject(x, "return_mean_100", r->res.return_mean_100);
                cJSON_AddNumberToObject(x, "test_return", r->res.test_return);
                if (r->res.solved_at >= 0) cJSON_AddNumberToObject(x, "solved_at_env_steps", r->res.solved_at);
            }
        }
        cJSON_AddItemToArray(runs, x);
    }
    return o;
}

static int s_json(const dp_sweep_grid_t *g, const dp_sweep_config_t *cfg, int n_cfg,
                  const s_stats_t *st, const char *out, char *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "cluster", g->cluster);
    cJSON *arr = cJSON_AddArrayToObject(root, "configs");
    for (int i = 0; i < n_cfg; i++) cJSON_AddItemToArray(arr, s_config_json(g, &cfg[i], &st[i]));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    dp_sweep_text_t t = {0};
    dp_sweep_text_add(&t, "%s\n", text);
    cJSON_free(text);
    return dp_sweep_text_save(&t, out, "results.json", err);
}

dp_sweep_report_t dp_sweep_report_write(const dp_sweep_grid_t *g, const dp_sweep_config_t *cfg,
                                        int n_cfg, const char *out, int plots, char *why,
                                        char *err)
{
    why[0] = 0;
    s_stats_t *st = dp_calloc((size_t)n_cfg + 1, sizeof *st);
    for (int i = 0; i < n_cfg; i++) s_stats(g, &cfg[i], &st[i]);
    /* Plots of an earlier report must not pass for this one's. */
    for (size_t i = 0; i < sizeof s_pngs / sizeof s_pngs[0]; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/%s", out, s_pngs[i].file);
        unlink(path);
    }
    dp_sweep_report_t drawn =
        dp_sweep_plot(cfg, n_cfg, out, strcmp(g->cluster, "sim") == 0, plots, why, err);
    int rc = drawn == DP_SWEEP_REPORT_BAD ? -1 : 0;
    dp_sweep_text_t t = {0};
    if (rc == 0) {
        s_markdown(&t, out, g, cfg, n_cfg, st, plots && drawn == DP_SWEEP_REPORT_WHOLE);
        rc = dp_sweep_text_save(&t, out, "report.md", err);
    }
    if (rc == 0) rc = s_json(g, cfg, n_cfg, st, out, err);
    free(st);
    return rc != 0 ? DP_SWEEP_REPORT_BAD : drawn;
}
