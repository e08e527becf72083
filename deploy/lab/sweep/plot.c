/* sweep/plot: data columns, a gnuplot script and the PNGs (see
 * plot.h). One colour per configuration; its seeds are separate
 * lines of that colour (blocks of the data file), so the spread between
 * seeds stays visible. */
#include "deploy/lab/sweep/plot.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "deploy/launcher/spawn.h"
#include "deploy/lab/sweep/text.h"

int dp_sweep_find_gnuplot(char *path, size_t n)
{
    const char *env = getenv("PATH");
    char *copy = dp_strdup(env && *env ? env : "/usr/bin:/bin"), *save = NULL;
    int found = 0;
    for (char *d = strtok_r(copy, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, n, "%s/gnuplot", *d ? d : ".");
        found = access(path, X_OK) == 0;
    }
    free(copy);
    return found;
}

/* data/cNN.solve (an actor-critic configuration): "index env_steps", the
 * env step at which each seed's run was solved (its unsolved runs left
 * out); whether any was. */
static int s_write_solve(const dp_sweep_config_t *c, int index, const char *data, int *has_solve,
                         char *err)
{
    dp_sweep_text_t t = {0};
    char name[64];
    *has_solve = 0;
    dp_sweep_text_add(&t, "# %s: configuration env_steps_to_solve, one row per solved seed\n", c->label);
    for (int s = 0; s < c->n_run; s++) {
        const dp_sweep_result_t *r = &c->run[s].res;
        if (!r->ok || !r->rl || r->solved_at < 0) continue;
        dp_sweep_text_add(&t, "%d %.0f\n", index + 1, r->solved_at);
        *has_solve = 1;
    }
    snprintf(name, sizeof name, "%s.solve", c->id);
    return dp_sweep_text_save(&t, data, name, err);
}

/* data/cNN.curve: "updates seconds accuracy", one block per seed (an
 * actor-critic run's: "env_steps 0 return"); data/cNN.stale: "staleness
 * pushes fraction" over all seeds. Returns whether each has any rows. */
static int s_write_data(const dp_sweep_config_t *c, const char *data, int *has_curve,
                        int *has_hist, char *err)
{
    dp_sweep_text_t t = {0};
    char name[64];
    *has_curve = *has_hist = 0;
    dp_sweep_text_add(&t, "# %s: updates seconds test_accuracy, one block per seed\n", c->label);
    for (int s = 0; s < c->n_run; s++) {
        const dp_sweep_result_t *r = &c->run[s].res;
        if (!r->ok) continue;
        dp_sweep_text_add(&t, "# seed %s\n", c->run[s].seed);
        for (int i = 0; i < r->n_curve; i++)
            dp_sweep_text_add(&t, "%.0f %.3f %.5f\n", r->curve[i].updates, r->curve[i].seconds,
                              r->curve[i].accuracy);
        dp_sweep_text_add(&t, "\n\n");
        *has_curve |= r->n_curve > 0;
    }
    snprintf(name, sizeof name, "%s.curve", c->id);
    if (dp_sweep_text_save(&t, data, name, err) != 0) return -1;
    long total = 0, *sum = NULL;
    int n = 0;
    for (int s = 0; s < c->n_run; s++) {
        const dp_sweep_result_t *r = &c->run[s].res;
        if (!r->ok || r->n_hist == 0) continue;
        if (r->n_hist > n) {
            sum = dp_realloc(sum, (size_t)r->n_hist * sizeof(long));
            memset(sum + n, 0, (size_t)(r->n_hist - n) * sizeof(long));
            n = r->n_hist;
        }
        for (int v = 0; v < r->n_hist; v++) sum[v] += r->hist[v], total += r->hist[v];
    }
    dp_sweep_text_add(&t, "# %s: staleness pushes fraction (all workers, all seeds)\n", c->label);
    for (int v = 0; v < n; v++)
        if (sum[v] > 0) dp_sweep_text_add(&t, "%d %ld %.6g\n", v, sum[v], (double)sum[v] / total);
    *has_hist = total > 0;
    free(sum);
    snprintf(name, sizeof name, "%s.stale", c->id);
    return dp_sweep_text_save(&t, data, name, err);
}

/* One plot of the script: "plot" with one entry per configuration that has
 * data (has[i]); nothing when none has. */
static void s_plot_cmd(dp_sweep_text_t *t, const dp_sweep_config_t *cfg, int n_cfg, const int *has,
                       const char *file_ext, const char *columns, const char *style)
{
    int first = 1;
    for (int i = 0; i < n_cfg; i++) {
        if (!has[i]) continue;
        dp_sweep_text_add(t, "%s'data/%s.%s' using %s %s lc %d title '%s %s'", first ? "plot " : ", \\\n     ",
                          cfg[i].id, file_ext, columns, style, i + 1, cfg[i].id, cfg[i].label);
        first = 0;
    }
    dp_sweep_text_add(t, "\n");
}

static int s_any(const int *has, int n)
{
    for (int i = 0; i < n; i++)
        if (has[i]) return 1;
    return 0;
}

/* An actor-critic sweep's plots: the return curve, with the environment's
 * "solved" line, and the env steps each seed took to solve. */
static void s_script_rl(dp_sweep_text_t *t, const dp_sweep_config_t *cfg, int n_cfg, const int *curve,
                        const int *solve)
{
    double threshold = 0;
    for (int i = 0; i < n_cfg; i++)
        for (int s = 0; s < cfg[i].n_run; s++)
            if (cfg[i].run[s].res.ok) threshold = cfg[i].run[s].res.solved_threshold;
    if (s_any(curve, n_cfg)) {
        dp_sweep_text_add(t, "set output 'return_vs_env_steps.png'\nset xlabel 'env steps'\n"
                             "set ylabel 'mean return of the last 100 episodes'\n"
                             "set arrow 1 from graph 0, first %g to graph 1, first %g nohead dt 2\n"
                             "set title 'Return against env steps (one line per seed; dashed: solved at %g)'\n",
                          threshold, threshold, threshold);
        s_plot_cmd(t, cfg, n_cfg, curve, "curve", "1:3", "with lines");
        dp_sweep_text_add(t, "unset arrow 1\n");
    }
    if (s_any(solve, n_cfg)) {
        dp_sweep_text_add(t, "set output 'env_steps_to_solve.png'\nset xlabel 'configuration'\n"
                             "set ylabel 'env steps to solve'\nset xrange [0:%d]\nset xtics 1\nset yrange [0:*]\n"
                             "set title 'Env steps to solve, one point per solved seed'\n", n_cfg + 1);
        s_plot_cmd(t, cfg, n_cfg, solve, "solve", "1:2", "with points pt 7 ps 1.2");
        dp_sweep_text_add(t, "set autoscale x\nset xtics autofreq\nset autoscale y\n");
    }
}

static void s_script(dp_sweep_text_t *t, const dp_sweep_config_t *cfg, int n_cfg, const int *curve,
                     const int *hist, const int *solve, int simulated, int rl)
{
    dp_sweep_text_add(t, "# Written by downpour sweep; run in this directory: gnuplot plots.gp\n"
                         "set terminal png size 900,640 noenhanced\n"
                         "set grid\nset key below\nset ylabel 'test accuracy'\n");
    if (rl) s_script_rl(t, cfg, n_cfg, curve, solve);
    else if (s_any(curve, n_cfg)) {
        dp_sweep_text_add(t, "set output 'accuracy_vs_updates.png'\nset xlabel 'server updates'\n"
                             "set title 'Test accuracy against updates (one line per seed)'\n");
        s_plot_cmd(t, cfg, n_cfg, curve, "curve", "1:3", "with linespoints pt 7 ps 0.6");
        dp_sweep_text_add(t, "set output 'accuracy_vs_seconds.png'\nset xlabel '%s'\n"
                             "set title 'Test accuracy against %s time (one line per seed)'\n",
                          simulated ? "simulated seconds" : "seconds", simulated ? "simulated" : "wall-clock");
        s_plot_cmd(t, cfg, n_cfg, curve, "curve", "2:3", "with linespoints pt 7 ps 0.6");
    }
    if (s_any(hist, n_cfg)) {
        dp_sweep_text_add(t, "set output 'staleness.png'\nset xlabel 'staleness (versions)'\n"
                             "set ylabel 'share of pushes'\nset logscale y\n"
                             "set title 'Staleness histogram (all workers and seeds)'\n");
        s_plot_cmd(t, cfg, n_cfg, hist, "stale", "1:3", "with linespoints pt 7 ps 0.8");
    }
}

/* gnuplot plots.gp in out: WHOLE, or NO_PLOTS with why. */
static dp_sweep_report_t s_run_gnuplot(const char *out, char *why)
{
    char gp[PATH_MAX], cd[PATH_MAX + 16], log[PATH_MAX + 16], e[DP_ERR_LEN];
    if (!dp_sweep_find_gnuplot(gp, sizeof gp)) {
        snprintf(why, DP_ERR_LEN, "gnuplot not found on PATH: no plots drawn (Debian: apt-get install "
                                  "gnuplot-nox; then cd %.120s && gnuplot plots.gp)", out);
        return DP_SWEEP_REPORT_NO_PLOTS;
    }
    /* gnuplot's single-quoted strings double a quote. */
    size_t k = (size_t)snprintf(cd, sizeof cd, "cd '");
    for (const char *p = out; *p && k + 3 < sizeof cd; p++) {
        if (*p == '\'') cd[k++] = '\'';
        cd[k++] = *p;
    }
    snprintf(cd + k, sizeof cd - k, "'");
    snprintf(log, sizeof log, "%s/plots.log", out);
    const char *argv[] = {gp, "-e", cd, "plots.gp", NULL};
    pid_t pid;
    int st = 0;
    if (dp_spawn(&pid, argv, log, e) != 0) {
        snprintf(why, DP_ERR_LEN, "gnuplot: %.200s", e);
        return DP_SWEEP_REPORT_NO_PLOTS;
    }
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(why, DP_ERR_LEN, "gnuplot failed (see %.180s): no plots drawn", log);
        return DP_SWEEP_REPORT_NO_PLOTS;
    }
    return DP_SWEEP_REPORT_WHOLE;
}

dp_sweep_report_t dp_sweep_plot(const dp_sweep_config_t *cfg, int n_cfg, const char *out,
                                int simulated, int draw, char *why, char *err)
{
    char data[PATH_MAX + 16];
    snprintf(data, sizeof data, "%s/data", out);
    if (mkdir(data, 0755) != 0 && errno != EEXIST) {
        dp_err(err, "%s: cannot create: %s", data, strerror(errno));
        return DP_SWEEP_REPORT_BAD;
    }
    int *curve = dp_calloc((size_t)n_cfg + 1, sizeof(int));
    int *hist = dp_calloc((size_t)n_cfg + 1, sizeof(int));
    int *solve = dp_calloc((size_t)n_cfg + 1, sizeof(int));
    int rc = 0, rl = 0;
    for (int i = 0; i < n_cfg; i++)
        for (int s = 0; s < cfg[i].n_run; s++) rl |= cfg[i].run[s].res.ok && cfg[i].run[s].res.rl;
    for (int i = 0; i < n_cfg && rc == 0; i++) {
        rc = s_write_data(&cfg[i], data, &curve[i], &hist[i], err);
        if (rc == 0 && rl) rc = s_write_solve(&cfg[i], i, data, &solve[i], err);
    }
    if (rc == 0) {
        dp_sweep_text_t t = {0};
        s_script(&t, cfg, n_cfg, curve, hist, solve, simulated, rl);
        rc = dp_sweep_text_save(&t, out, "plots.gp", err);
    }
    free(curve);
    free(hist);
    free(solve);
    if (rc != 0) return DP_SWEEP_REPORT_BAD;
    return draw ? s_run_gnuplot(out, why) : DP_SWEEP_REPORT_WHOLE;
}
