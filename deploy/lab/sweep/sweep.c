/* sweep: `downpour sweep` — runs a grid of configurations (mode x workers x
 * staleness bound x lr x lr policy x momentum x ... x seeds; the grid from a
 * file and/or flags, grid.h) on the local cluster (`downpour local`,
 * or `downpour-worker --standalone` for mode standalone) or the simulated
 * one (`downpour sim`), one run after another, each in its own directory
 * OUT/runs/cNN-sSEED, and writes the report into OUT (report.h).
 *
 * Runs one at a time on purpose: runs that share cores disturb each other's
 * timing, and the time to an accuracy is one of the figures.
 * Resumable: a run whose directory holds it complete (same command) is not
 * run again, so an interrupted sweep is finished by repeating its command. */
#include "deploy/launcher/commands.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/opts.h"
#include "common/signals.h"
#include "common/util.h"
#include "deploy/launcher/spawn.h"
#include "deploy/lab/sweep/grid.h"
#include "deploy/lab/sweep/report.h"
#include "deploy/lab/sweep/run.h"
#include "worker/train/progress.h"

static volatile sig_atomic_t s_stop;

static const char s_synopsis[] =
"usage: downpour sweep [--grid FILE] [--mode LIST] [--workers LIST] [--lr LIST] ... [--out DIR]\n"
"\n"
"Runs every combination of the listed values (LIST: comma-separated), one run at a\n"
"time, each seed of each configuration in OUT/runs/cNN-sSEED, then writes OUT/report.md\n"
"(a table: final test accuracy mean +- std over seeds, seconds and updates to each\n"
"target accuracy, staleness mean and max), OUT/results.json and, with gnuplot\n"
"(Debian: gnuplot-nox), OUT/accuracy_vs_updates.png, accuracy_vs_seconds.png and\n"
"staleness.png. Runs already complete in OUT (same command) are not run again.\n"
"\n"
"A grid file holds one 'key = v1, v2, ...' per line ('#' comments); its keys are the\n"
"flags below without '--' (mode, workers, staleness, lr, lr-policy, delay-lr,\n"
"delay-compensation, local-steps, outer-optimizer, momentum, optimizer, replicas,\n"
"straggler, compute, compress, error-feedback, model, precision, churn, env, envs, t-max,\n"
"entropy, gamma, reward-scale, obs-norm, clip-norm, env-steps, seed, cluster, args,\n"
"eval-every, eval-limit, targets).\n"
"Flags given on the command line replace the file's line. A model value is a spec or\n"
"a preset (model = resnet20, fc:128 relu fc:10 softmax); a --model in args overrides\n"
"it. With env (an actor-critic run, A3C / A2C) the table has the runs' returns\n"
"instead of test accuracy: the last 100 episodes', the greedy test return, solved.\n"
"\n";

static const char s_epilog[] =
"Example: downpour sweep --mode sync,async --workers 2 --lr 0.001,0.002 --seeds 1,2 \\\n"
"             --args '--steps 100 --batch 64' --out runs/sweep\n";

typedef struct {
    const char *grid, *out;
    const char *axis[DP_SWEEP_N_AXES];   /* the axes' flags as given */
    const char *cluster, *args, *every, *limit, *targets;
    int no_plots, dry_run, force;
    dp_progress_mode_t progress;
} s_flags_t;

static dp_opts_result_t s_parse(s_flags_t *f, int argc, char **argv, char *err)
{
    const dp_opts_flag_t t[] = {
        DP_FLAG_STR("grid", "FILE", &f->grid, 0, "the grid file (key = v1, v2, ... lines)"),
        DP_FLAG_STR("out", "DIR", &f->out, 0, "the report and the runs (default runs/sweep)"),
        DP_FLAG_STR("cluster", "local|sim", &f->cluster, 0,
                    "real processes (downpour local; default) or downpour sim"),
        DP_FLAG_STR("mode", "LIST", &f->axis[DP_SWEEP_MODE], 0, "sync, async, ssp, standalone (default async)"),
        DP_FLAG_STR("workers", "LIST", &f->axis[DP_SWEEP_WORKERS], 0,
                    "worker counts (MIN:MAX: an elastic crew)"),
        DP_FLAG_STR("staleness", "LIST", &f->axis[DP_SWEEP_STALENESS], 0, "ssp staleness bounds"),
        DP_FLAG_STR("lr", "LIST", &f->axis[DP_SWEEP_LR], 0, "learning rates"),
        DP_FLAG_STR("lr-policy", "LIST", &f->axis[DP_SWEEP_LR_POLICY], 0,
                    "fixed, staleness (--lr-staleness: lr / staleness)"),
        DP_FLAG_STR("delay-lr", "LIST", &f->axis[DP_SWEEP_DELAY_LR], 0,
                    "none, inverse, adaptive, threshold[:K] (--delay-lr)"),
        DP_FLAG_STR("delay-compensation", "LIST", &f->axis[DP_SWEEP_DELAY_COMPENSATION], 0,
                    "off, const:LAMBDA, adaptive:LAMBDA0 (--delay-compensation)"),
        DP_FLAG_STR("local-steps", "LIST", &f->axis[DP_SWEEP_LOCAL_STEPS], 0,
                    "--local-steps H values (a push every H steps of --optimizer;\n"
                    "auto[:H]: DyLU)"),
        DP_FLAG_STR("outer-optimizer", "LIST", &f->axis[DP_SWEEP_OUTER_OPTIMIZER], 0,
                    "sgd, nesterov, delayed-nesterov (with --local-steps)"),
        DP_FLAG_STR("momentum", "LIST", &f->axis[DP_SWEEP_MOMENTUM], 0, "momentum values"),
        DP_FLAG_STR("optimizer", "LIST", &f->axis[DP_SWEEP_OPTIMIZER], 0,
                    "sgd, momentum, nesterov, adam, adagrad, rmsprop"),
        DP_FLAG_STR("replicas", "LIST", &f->axis[DP_SWEEP_REPLICAS], 0,
                    "sync: --replicas-to-aggregate (the other workers are backups)"),
        DP_FLAG_STR("straggler", "LIST", &f->axis[DP_SWEEP_STRAGGLER], 0, "none or I:MS[:exp] (sim: I:FACTOR)"),
        DP_FLAG_STR("compute", "LIST", &f->axis[DP_SWEEP_COMPUTE], 0,
                    "sim: const:MS, exp:MEAN_MS, lognormal:MU:SIGMA"),
        DP_FLAG_STR("compress", "LIST", &f->axis[DP_SWEEP_COMPRESS], 0,
                    "none, topk:FRACTION, sign (the workers' --compress)"),
        DP_FLAG_STR("error-feedback", "LIST", &f->axis[DP_SWEEP_ERROR_FEEDBACK], 0,
                    "on, off (--error-feedback)"),
        DP_FLAG_STR("model", "LIST", &f->axis[DP_SWEEP_MODEL], 0,
                    "model specs or presets (resnet20, 'fc:128 relu fc:10 softmax')"),
        DP_FLAG_STR("precision", "LIST", &f->axis[DP_SWEEP_PRECISION], 0,
                    "fp32, bf16 (the workers' --precision)"),
        DP_FLAG_STR("churn", "LIST", &f->axis[DP_SWEEP_CHURN], 0,
                    "sim: none, leave:S, kill:S (--churn, with workers MIN:MAX)"),
        DP_FLAG_STR("env", "LIST", &f->axis[DP_SWEEP_ENV], 0,
                    "actor-critic runs in cartpole-v1, acrobot-v1 (--env; no --data)"),
        DP_FLAG_STR("envs", "LIST", &f->axis[DP_SWEEP_ENVS], 0, "with env: environments a worker (--envs)"),
        DP_FLAG_STR("t-max", "LIST", &f->axis[DP_SWEEP_T_MAX], 0, "with env: steps a segment (--t-max)"),
        DP_FLAG_STR("entropy", "LIST", &f->axis[DP_SWEEP_ENTROPY], 0, "with env: entropy weights (--entropy)"),
        DP_FLAG_STR("gamma", "LIST", &f->axis[DP_SWEEP_GAMMA], 0, "with env: discounts (--gamma)"),
        DP_FLAG_STR("reward-scale", "LIST", &f->axis[DP_SWEEP_REWARD_SCALE], 0,
                    "with env: reward scales (--reward-scale)"),
        DP_FLAG_STR("obs-norm", "LIST", &f->axis[DP_SWEEP_OBS_NORM], 0, "with env: off, on (--obs-norm)"),
        DP_FLAG_STR("clip-norm", "LIST", &f->axis[DP_SWEEP_CLIP_NORM], 0,
                    "with env: global-norm clipping, 0 off (--clip-norm)"),
        DP_FLAG_STR("env-steps", "LIST", &f->axis[DP_SWEEP_ENV_STEPS], 0,
                    "with env: the run's budget in env steps (--env-steps)"),
        DP_FLAG_STR("seeds", "LIST", &f->axis[DP_SWEEP_SEED], 0, "seeds (default 1)"),
        DP_FLAG_STR("args", "FLAGS", &f->args, 0, "more flags for every run, blank-separated ('--steps 200')"),
        DP_FLAG_STR("eval-every", "N", &f->every, 0, "the chief's test evaluation every N steps (default 50; 0: end only)"),
        DP_FLAG_STR("eval-limit", "K", &f->limit, 0, "test samples per periodic evaluation (default 2000; 0: all)"),
        DP_FLAG_STR("targets", "LIST", &f->targets, 0, "accuracies to time (default 0.80,0.85,0.88)"),
        DP_FLAG_SET("no-plots", &f->no_plots, 1, 0, "the table only (no gnuplot)"),
        DP_FLAG_SET("dry-run", &f->dry_run, 1, 0, "print the runs' commands, run nothing"),
        DP_FLAG_SET("force", &f->force, 1, 0, "run again the runs already complete"),
        DP_FLAG_SET("no-progress", &f->progress, DP_PROGRESS_OFF, 0, "no progress line"),
    };
    static dp_opts_t o;
    dp_opts_init(&o, "downpour sweep", s_synopsis, s_epilog);
    dp_opts_add(&o, t, (int)(sizeof t / sizeof t[0]));
    return dp_opts_parse(&o, argc, argv, err);
}

/* The grid: the file, then each flag given in place of its line. */
static int s_grid(dp_sweep_grid_t *g, const s_flags_t *f, char *err)
{
    if (f->grid && dp_sweep_grid_load(g, f->grid, err) != 0) return -1;
    char e[DP_ERR_LEN];
    for (int a = 0; a < DP_SWEEP_N_AXES; a++)
        if (f->axis[a] && dp_sweep_grid_set(g, dp_sweep_axis_name(a), f->axis[a], e) != 0)
            return dp_err(err, "--%s", e);
    const char *key[] = {"cluster", "args", "eval-every", "eval-limit", "targets"};
    const char *val[] = {f->cluster, f->args, f->every, f->limit, f->targets};
    for (int i = 0; i < 5; i++)
        if (val[i] && dp_sweep_grid_set(g, key[i], val[i], e) != 0) return dp_err(err, "--%s", e);
    return 0;
}

/* --out's folder and those above it. */
static int s_mkdir(const char *path, char *err) { return dp_mkdirs(path, 0755, err); }

/* The configurations and their runs' directories. */
static int s_configs(const dp_sweep_grid_t *g, const char *out, dp_sweep_config_t **cfg_out,
                     char *err)
{
    long total = dp_sweep_grid_configs(g);
    if (total * dp_sweep_grid_seeds(g) > 10000)
        return dp_err(err, "the grid has %ld runs: more than 10000", total * dp_sweep_grid_seeds(g));
    dp_sweep_config_t *cfg = dp_calloc((size_t)total, sizeof *cfg);
    int n = 0;
    for (long i = 0; i < total; i++) {
        dp_sweep_config_t *c = &cfg[n];
        if (!dp_sweep_grid_pick(g, i, c->pick)) continue;
        snprintf(c->id, sizeof c->id, "c%02d", n + 1);
        dp_sweep_grid_label(g, c->pick, c->label, sizeof c->label);
        c->n_run = dp_sweep_grid_seeds(g);
        c->run = dp_calloc((size_t)c->n_run, sizeof *c->run);
        for (int s = 0; s < c->n_run; s++) {
            dp_sweep_seed_run_t *r = &c->run[s];
            int pick[DP_SWEEP_N_AXES];
            memcpy(pick, c->pick, sizeof pick);
            pick[DP_SWEEP_SEED] = s;
            const char *seed = dp_sweep_grid_value(g, pick, DP_SWEEP_SEED);
            snprintf(r->seed, sizeof r->seed, "%s", seed ? seed : "1");
            snprintf(r->dir, sizeof r->dir, "%s/runs/%s-s%s", out, c->id, r->seed);
            r->status = -1;
        }
        n++;
    }
    *cfg_out = cfg;
    (void)err;
    return n;
}

static void s_configs_free(dp_sweep_config_t *cfg, int n)
{
    for (int i = 0; i < n; i++) {
        for (int s = 0; s < cfg[i].n_run; s++) dp_sweep_result_fini(&cfg[i].run[s].res);
        free(cfg[i].run);
    }
    free(cfg);
}

/* Every run's command, for the dry run and to refuse a grid the runner
 * cannot express before anything starts. */
static int s_commands(const dp_sweep_grid_t *g, const dp_sweep_config_t *cfg, int n,
                      const char *bin_dir, int print, char *err)
{
    dp_sweep_cmd_t *cmd = dp_malloc(sizeof *cmd);
    char line[16384];
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        for (int s = 0; s < cfg[i].n_run && rc == 0; s++) {
            rc = dp_sweep_cmd_build(cmd, g, cfg[i].pick, cfg[i].run[s].seed, bin_dir, cfg[i].run[s].dir, err);
            if (rc == 0 && print) {
                dp_sweep_cmd_line(cmd, line, sizeof line);
                printf("%s\n", line);
            }
        }
    free(cmd);
    return rc;
}

typedef struct {
    int total, done, skipped, failed;
    double run_s;                    /* seconds of the runs made so far */
} s_tally_t;

/* What a run (s_one) and the loop over them (s_run_all) leave the sweep to do. */
typedef enum {
    S_GO_ON,    /* the next run: this one was made, skipped as complete, or failed (counted) */
    S_STOP,     /* stop (err says why): a signal, or a run that could not be started */
    S_BAD_GRID, /* stop (err names it): a run refused its flags (exit 2: every run would) */
} s_next_t;

/* One run, unless complete. */
static s_next_t s_one(const dp_sweep_grid_t *g, dp_sweep_config_t *c, int s, const char *bin_dir,
                      int force, dp_progress_t *pr, s_tally_t *tl, char *err)
{
    dp_sweep_seed_run_t *r = &c->run[s];
    dp_sweep_cmd_t *cmd = dp_malloc(sizeof *cmd);
    int rc = dp_sweep_cmd_build(cmd, g, c->pick, r->seed, bin_dir, r->dir, err);
    if (rc == 0 && !force && dp_sweep_run_complete(cmd, r->dir)) {
        r->status = 0;
        tl->skipped++;
        free(cmd);
        return S_GO_ON;
    }
    char prefix[700];
    int made = tl->done - tl->skipped, left = tl->total - tl->done;
    double eta = made > 0 ? tl->run_s / made * left : 0;
    snprintf(prefix, sizeof prefix, "sweep %d/%d  %s seed %s  %.60s", tl->done + 1, tl->total, c->id,
             r->seed, c->label);
    if (eta > 0) snprintf(prefix + strlen(prefix), sizeof prefix - strlen(prefix), "  ~%.0f min left", eta / 60);
    double t0 = dp_now();
    if (rc == 0) rc = dp_sweep_run_exec(cmd, r->dir, pr, prefix, &s_stop, &r->status, err);
    free(cmd);
    tl->run_s += dp_now() - t0;
    if (rc != 0) return S_STOP;
    if (r->status == 0) return S_GO_ON;
    char last[512];
    dp_sweep_run_last_line(r->dir, last, sizeof last);
    if (r->status == 2) {
        dp_err(err, "run %s seed %s refused its flags: %s", c->id, r->seed, last);
        return S_BAD_GRID;
    }
    dp_progress_done(pr);
    fprintf(stderr, "downpour sweep: run %s seed %s failed (exit status %d): %s\n", c->id, r->seed,
            r->status, last);
    tl->failed++;
    return S_GO_ON;
}

static s_next_t s_run_all(const dp_sweep_grid_t *g, dp_sweep_config_t *cfg, int n,
                          const char *bin_dir, const s_flags_t *f, s_tally_t *tl, char *err)
{
    dp_progress_t pr;
    dp_progress_init(&pr, f->progress);
    s_next_t next = S_GO_ON;
    for (int i = 0; i < n && next == S_GO_ON; i++)
        for (int s = 0; s < cfg[i].n_run && next == S_GO_ON; s++) {
            next = s_one(g, &cfg[i], s, bin_dir, f->force, &pr, tl, err);
            tl->done++;
        }
    dp_progress_done(&pr);
    return next;
}

/* Reads every complete run, writes the report, says where it is. */
static int s_report(const dp_sweep_grid_t *g, dp_sweep_config_t *cfg, int n, const char *out,
                    const s_flags_t *f, const s_tally_t *tl, char *err)
{
    char e[DP_ERR_LEN], why[DP_ERR_LEN];
    for (int i = 0; i < n; i++)
        for (int s = 0; s < cfg[i].n_run; s++)
            if (cfg[i].run[s].status == 0 && dp_sweep_read(&cfg[i].run[s].res, cfg[i].run[s].dir, e) != 0)
                fprintf(stderr, "downpour sweep: %s\n", e);
    dp_sweep_report_t rc = dp_sweep_report_write(g, cfg, n, out, !f->no_plots, why, err);
    if (rc == DP_SWEEP_REPORT_BAD) return -1;
    if (rc == DP_SWEEP_REPORT_NO_PLOTS) fprintf(stderr, "downpour sweep: %s\n", why);
    printf("downpour sweep: %d run(s): %d made, %d already complete, %d failed; report in %s/report.md\n",
           tl->total, tl->done - tl->skipped, tl->skipped, tl->failed, out);
    return rc == DP_SWEEP_REPORT_NO_PLOTS || tl->failed ? 1 : 0;
}

int dp_sweep_main(int argc, char **argv)
{
    s_flags_t f = {.out = "runs/sweep", .progress = DP_PROGRESS_AUTO};
    char err[DP_ERR_LEN] = "", bin_dir[PATH_MAX], runs[PATH_MAX + 8];
    dp_opts_result_t r = s_parse(&f, argc, argv, err);
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("downpour sweep", r, err);
    dp_sweep_grid_t g;
    dp_sweep_grid_init(&g);
    dp_sweep_config_t *cfg = NULL;
    int n = 0, rc = 2;
    dp_spawn_bin_dir(bin_dir, sizeof bin_dir, argv[0]);
    if (s_grid(&g, &f, err) != 0 || (n = s_configs(&g, f.out, &cfg, err)) < 0 ||
        s_commands(&g, cfg, n, bin_dir, f.dry_run, err) != 0)
        goto done;
    rc = 1;
    if (f.dry_run) {
        rc = 0;
        goto done;
    }
    snprintf(runs, sizeof runs, "%s/runs", f.out);
    if (s_mkdir(f.out, err) != 0 || s_mkdir(runs, err) != 0) goto done;
    dp_signals_install(&s_stop, 1);
    s_tally_t tl = {.total = n * dp_sweep_grid_seeds(&g)};
    char stop_err[DP_ERR_LEN] = "";
    s_next_t next = s_run_all(&g, cfg, n, bin_dir, &f, &tl, stop_err);
    int stopped = next != S_GO_ON;
    if (stopped) fprintf(stderr, "downpour sweep: %s\n", stop_err);
    /* A run that refused its flags is a bad grid: status 2, as for a bad
     * file, and no report. Otherwise the report holds what is complete. */
    if (next == S_BAD_GRID) {
        rc = 2;
        goto done;
    }
    rc = s_report(&g, cfg, n, f.out, &f, &tl, err);
    if (rc >= 0) err[0] = 0;
    if (stopped || rc < 0) rc = 1;
done:
    if (err[0]) fprintf(stderr, "downpour sweep: %s\n", err);
    s_configs_free(cfg, n);
    dp_sweep_grid_fini(&g);
    return rc;
}
