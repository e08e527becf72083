/* local: `downpour local` — a whole cluster on this machine. Starts K
 * downpour-ps shards and N downpour-worker processes on free loopback
 * ports, shows one live progress line, and stops everything cleanly when
 * the run ends, when any process fails (naming it and its last log line) or
 * on Ctrl-C / SIGTERM / SIGHUP. Leaves DIR/summary.json,
 * DIR/model.safetensors, DIR/metrics/ (JSON lines) and DIR/logs/.
 *
 * The flags it passes on are the daemons' own: the launcher's option table
 * is its few flags plus every entry of dp_ps_options and dp_worker_options
 * marked DP_OPTS_PASS, parsed into scratch configurations with the daemons'
 * parsers — so a bad value is refused here, before anything starts, exactly
 * as the daemon would refuse it, and the run's length, mode and data are
 * read from what the daemons will see.
 *
 * Invariant: no child outlives the launcher — each runs in its own process
 * group (so a terminal's Ctrl-C reaches the launcher alone, which then stops
 * them in order, each group whole) with PR_SET_PDEATHSIG, and a guard stops
 * the groups left when the launcher is killed (spawn.h, dp_spawn_guard). */
#include "deploy/launcher/commands.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/dataset.h"
#include "common/metrics.h"
#include "common/model.h"
#include "common/opts.h"
#include "common/signals.h"
#include "common/util.h"
#include "deploy/lab/rl.h"
#include "deploy/launcher/crew.h"
#include "deploy/launcher/local_device.h"
#include "deploy/launcher/local_elastic.h"
#include "deploy/launcher/local_keys.h"
#include "deploy/launcher/scale.h"
#include "deploy/launcher/spawn.h"
#include "server/args.h"
#include "server/core/policy.h"
#include "server/core/record.h"
#include "worker/args.h"
#include "worker/exec/a3c.h"
#include "worker/exec/sparse_data.h"

#define DP_LOCAL_MAX DP_CREW_MAX
/* argv entries per child: what the launcher sets, plus each flag of a
 * table passed on at most once (flag and value). */
#define DP_LOCAL_ARGS (32 + 2 * DP_OPTS_MAX)

typedef struct {
    int workers, shards;         /* workers: started at the start (elastic: MIN) */
    int min_workers, max_workers; /* --workers MIN:MAX (min 0: a fixed crew of max = workers) */
    const char *chaos;           /* --chaos kill:SECONDS, or NULL */
    double chaos_s;
    dp_elastic_t elastic;        /* an elastic crew's changes (deploy/launcher/local_elastic.h) */
    const char *gpus;            /* "0,1" or NULL */
    dp_local_device_t ps_device; /* --ps-device: the shards' device (local_device.h) */
    const char *out;
    char delay_ms[DP_LOCAL_MAX][24]; /* --straggler I:MS: worker I's injected delay, "" none */
    int delay_exp[DP_LOCAL_MAX];     /* ... drawn from an exponential (I:MS:exp) */
    dp_progress_mode_t progress; /* the live line */
    /* The option tables: the launcher's (its own flags and those passed
     * on) and the daemons', whose targets are the scratch configurations. */
    dp_opts_t opts, ps_opts, worker_opts;
    dp_ps_config_t ps;           /* what the shards will make of the flags passed on */
    dp_cluster_t ps_cluster;     /* target of the ps table's cluster flags (never passed on) */
    dp_worker_args_t wk;         /* what the workers will make of them */
    char flag_names[DP_OPTS_MAX][48]; /* "--name" of the launcher's table entry i */
    char bin_dir[PATH_MAX];
    char out_default[64];
    char input[48];              /* CxHxW of the data, for the shards */
    char env_model[DP_MODEL_SPEC_LEN]; /* --env: the model with its actions, for every daemon */
    char env_envs[16], env_t_max[16]; /* --env: the workers' --envs, --t-max, for the shards */
    char schedule[64];           /* the default lr schedule, for the shards (with
                                  * --local-steps: for the workers' inner optimizer) */
    long worker_steps;           /* each worker's data steps (s_run_steps) */
    char run_id[40];             /* a fresh --run-id for the shards, unless given */
    char endpoints[DP_LOCAL_MAX * 48]; /* the shards, for the workers */
    char summary[PATH_MAX];      /* DIR/summary.json, written by the chief */
    const char *ps_args[DP_LOCAL_ARGS];
    int n_ps_args;
    const char *worker_args[DP_LOCAL_ARGS];
    int n_worker_args;
    dp_crew_t crew;              /* the shards first, then the workers */
    int secure;                  /* --secure: every daemon on CURVE keys from DIR/keys */
    int ps_threads;              /* --ps-threads: each shard's optimizer threads; 0 = the
                                  * daemon's rule (dp_ps_config_threads_on) on cores / K */
    const char *record;          /* --record FILE: the run's schedule (shards' records merged) */
    dp_local_keys_t keys;
} dp_local_t;

static volatile sig_atomic_t s_signal;

static const char s_synopsis[] =
"usage: downpour local --workers N|MIN:MAX [--ps-shards K] [--gpus 0,1,...] [--ps-device cpu|gpu]\n"
"                      [--mode sync|async|ssp]\n"
"                      [--out DIR] [flags for downpour-ps and downpour-worker]\n"
"\n"
"Runs K parameter-server shards and N workers on this machine (loopback ports),\n"
"shows one progress line and leaves in DIR (default runs/local-<time>):\n"
"  summary.json  model.safetensors  metrics/*.jsonl  tensorboard/  logs/*.log\n"
"\n";

static const char s_epilog[] =
"The learning rate anneals to zero over the run (cosine) unless --lr-schedule is given.\n"
DP_MODEL_SPEC_HELP;

/* --out's folder and those above it (`--out runs/sync` in a fresh directory). */
static int s_mkdir(const char *path, char *err) { return dp_mkdirs(path, 0755, err); }

/* Parse the last complete JSON line of a metrics file, or NULL. */

static double s_num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* Total steps per worker, read once from the worker's first metrics line
 * (with its steps per epoch and batch); an elastic crew's worker, whose
 * batches shard 0 deals, has none: -epochs. */
static long s_total_steps(const char *path, long *steps_per_epoch, long *batch)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    long total = 0;
    if (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        if (o) {
            total = (long)s_num(o, "total_steps", -s_num(o, "epochs", 0));
            *steps_per_epoch = (long)s_num(o, "steps_per_epoch", 0);
            *batch = (long)s_num(o, "batch", 0);
            cJSON_Delete(o);
        }
    }
    fclose(f);
    return total;
}

/* --env's progress line from the workers' metrics: the run's env steps
 * (the servers' count, the latest any worker's ACK said), the episodes
 * the workers' own counts add to, the mean of their last-100 means. */
static void s_show_env_progress(dp_local_t *L, double t0, int live)
{
    double run = 0, episodes = 0, ret = 0;
    int n = 0;
    for (int i = 0; i < L->crew.n; i++) {
        dp_child_t *c = &L->crew.kids[i];
        if (!c->is_worker) continue;
        cJSON *o = dp_metrics_last(c->metrics); /* a step's, not an event's */
        if (!o) continue;
        double r = s_num(o, "run_env_steps", s_num(o, "env_steps", 0));
        if (r > run) run = r;
        episodes += s_num(o, "episodes", 0);
        ret += s_num(o, "return_mean_100", 0);
        n++;
        cJSON_Delete(o);
    }
    double dt = dp_now() - t0;
    fprintf(stderr, "%s%s  env steps %.0f/%ld  episodes %.0f  return(100) %.1f  %.0f env steps/s%s",
            live ? "\r\033[K" : "", L->wk.conf.a3c.env, run, L->wk.conf.a3c.env_steps, episodes,
            n ? ret / n : 0.0, run / (dt > 0 ? dt : 1), live ? "" : "\n");
}

/* One progress line: rewritten in place on a terminal (live), else a plain
 * line of its own. */
static void s_show_progress(dp_local_t *L, double t0, long *total, long *spe, long *batch,
                            int live)
{
    if (L->wk.conf.a3c.env) {
        s_show_env_progress(L, t0, live);
        return;
    }
    long steps_min = -1, steps_sum = 0, epoch_min = -1;
    double loss = 0, stale = 0;
    int n = 0;
    for (int i = 0; i < L->crew.n; i++) {
        dp_child_t *c = &L->crew.kids[i];
        if (!c->is_worker) continue;
        if (*total == 0) *total = s_total_steps(c->metrics, spe, batch);
        cJSON *o = dp_metrics_last(c->metrics); /* a step's, not an event's */
        if (!o) continue;
        long step = (long)s_num(o, "step", -1) + 1;
        if (steps_min < 0 || step < steps_min) steps_min = step;
        long e = (long)s_num(o, "epoch", 0) + 1;
        if (epoch_min < 0 || e < epoch_min) epoch_min = e;
        steps_sum += step;
        loss += s_num(o, "loss", 0);
        stale += s_num(o, "staleness", 0);
        n++;
        cJSON_Delete(o);
    }
    if (n == 0) {
        fprintf(stderr, "%sstarting %d ps shard(s) and %d worker(s)...%s", live ? "\r\033[K" : "",
                L->shards, L->workers, live ? "" : "\n");
        return;
    }
    double dt = dp_now() - t0;
    double rate = steps_sum * (double)*batch / (dt > 0 ? dt : 1);
    if (*total < 0) { /* dealt batches: the epochs are shard 0's, the steps each worker's */
        fprintf(stderr, "%sepoch %ld/%ld  %.0f img/s  loss %.4f  staleness %.2f%s",
                live ? "\r\033[K" : "", epoch_min, -*total, rate, loss / n, stale / n,
                live ? "" : "\n");
        return;
    }
    long epoch = *spe > 0 ? steps_min / *spe + 1 : 1;
    long epochs = *spe > 0 && *total > 0 ? (*total + *spe - 1) / *spe : 1;
    if (epoch > epochs) epoch = epochs;
    fprintf(stderr, "%sepoch %ld/%ld  step %ld/%ld  %.0f img/s  loss %.4f  staleness %.2f%s",
            live ? "\r\033[K" : "", epoch, epochs, steps_min, *total,
            rate, loss / n, stale / n, live ? "" : "\n");
}

/* "--straggler I:MS[:exp]": worker I sleeps MS ms before each push (fixed,
 * or exponential with that mean), the others do not — the experiment that
 * shows what one slow worker does to everybody's staleness. MS is checked
 * as the worker's --delay-ms would check it. */
static int s_set_straggler(void *arg, const char *v, char *err)
{
    dp_local_t *L = arg;
    const char *colon = strchr(v, ':');
    const char *ms = colon ? colon + 1 : "";
    const char *tail = strchr(ms, ':');
    size_t ms_len = tail ? (size_t)(tail - ms) : strlen(ms);
    char index[16], delay[sizeof L->delay_ms[0]];
    long i;
    double d;
    if (!colon || colon - v >= (long)sizeof index || ms_len >= sizeof delay ||
        (tail && strcmp(tail, ":exp") != 0))
        goto bad;
    snprintf(index, sizeof index, "%.*s", (int)(colon - v), v);
    snprintf(delay, sizeof delay, "%.*s", (int)ms_len, ms);
    if (dp_opts_parse_long("--straggler", index, 0, DP_LOCAL_MAX - 1, &i, NULL) != 0 ||
        dp_opts_parse_double("--straggler", delay, 0, 1e7, &d, NULL) != 0)
        goto bad;
    snprintf(L->delay_ms[i], sizeof L->delay_ms[i], "%s", delay);
    L->delay_exp[i] = tail != NULL;
    return 0;
bad:
    return dp_err(err, "'%s' is not WORKER:MS[:exp] with WORKER in [0, %d], MS in [0, 1e7], e.g. 1:50",
                  v, DP_LOCAL_MAX - 1);
}

/* --workers N | MIN:MAX. */
static int s_set_workers(void *arg, const char *v, char *err)
{
    dp_local_t *L = arg;
    if (dp_opts_parse_crew("--workers", v, DP_LOCAL_MAX, &L->min_workers, &L->max_workers, err) != 0)
        return -1;
    L->workers = L->min_workers > 0 ? L->min_workers : L->max_workers;
    return 0;
}

/* Is name in table o, marked to be passed on? */
static int s_passes(dp_opts_t *o, const char *name)
{
    const dp_opts_flag_t *e = dp_opts_find(o, name);
    return e && e->pass;
}

/* Append, under a heading, the daemons' passed-on flags that go to the ps
 * (in_ps) and / or the workers (in_worker). */
static void s_add_passed(dp_local_t *L, const char *title, int in_ps, int in_worker)
{
    const dp_opts_flag_t heading = DP_FLAG_TITLE(title);
    dp_opts_add(&L->opts, &heading, 1);
    dp_opts_t *tables[2] = {&L->ps_opts, &L->worker_opts};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < tables[t]->n; i++) {
            const dp_opts_flag_t *e = &tables[t]->opt[i];
            if (!e->pass || dp_opts_find(&L->opts, e->name)) continue;
            if (s_passes(&L->ps_opts, e->name) == in_ps &&
                s_passes(&L->worker_opts, e->name) == in_worker)
                dp_opts_add(&L->opts, e, 1);
        }
}

/* The launcher's table: its own flags, then the daemons' passed-on ones. */
static void s_options(dp_local_t *L)
{
    const dp_opts_flag_t own[] = {
        DP_FLAG_CALL("workers", "N|MIN:MAX", s_set_workers, L, 0,
                     "worker processes (default 2; with --gpus, one per listed GPU);\n"
                     "MIN:MAX: elastic, MIN start, `downpour scale DIR N` sets the\n"
                     "live count (task indexes below MAX)"),
        DP_FLAG_STR("chaos", "kill:SECONDS", &L->chaos, 0,
                    "elastic: SIGKILL a random worker but the chief every SECONDS\n"
                    "and start another under a task index not in use"),
        DP_FLAG_NUM("ps-shards", DP_OPTS_INT, "K", &L->shards, 1, DP_LOCAL_MAX, 0,
                    "parameter-server processes, each owning a slice (default 1)"),
        DP_FLAG_NUM("ps-threads", DP_OPTS_INT, "N", &L->ps_threads, 1, 256, 0,
                    "each shard's optimizer threads (downpour-ps --threads; default:\n"
                    "the host's cores / K, at most 4, and 1 for a shard under 256 K floats);\n"
                    "--threads is the workers' kernel threads"),
        DP_FLAG_STR("gpus", "LIST", &L->gpus, 0, "one worker per listed GPU (cuda:K); default: CPU workers"),
        DP_FLAG_STR("ps-device", "cpu|gpu", &L->ps_device.flag, 0,
                    "where the shards keep weights and optimizer state: cpu (default)\n"
                    "or gpu, shard i on the i-th GPU of --gpus (downpour-ps --device\n"
                    "cuda:G; --ps-shards defaults to one per listed GPU)"),
        DP_FLAG_CALL("straggler", "I:MS", s_set_straggler, L, 0,
                     "worker I sleeps MS ms before each push (I:MS:exp: exponential)"),
        DP_FLAG_STR("out", "DIR", &L->out, 0, "where results land"),
        DP_FLAG_SET("progress", &L->progress, DP_PROGRESS_ON, 0, "the live line even when stderr is no terminal"),
        DP_FLAG_SET("no-progress", &L->progress, DP_PROGRESS_OFF, 0, "no live line"),
        DP_FLAG_STR("record", "FILE", &L->record, 0,
                    "write the run's schedule to FILE for `downpour replay`"),
        DP_FLAG_SET("secure", &L->secure, 1, 0,
                    "CURVE: a key pair per shard and worker in DIR/keys; every\n"
                    "connection encrypted, only these keys admitted"),
    };
    dp_opts_init(&L->opts, "downpour local", s_synopsis, s_epilog);
    dp_opts_add(&L->opts, own, (int)(sizeof own / sizeof own[0]));
    dp_ps_options(&L->ps_opts, &L->ps, &L->ps_cluster);
    dp_worker_options(&L->worker_opts, &L->wk);
    s_add_passed(L, "passed on to downpour-ps and downpour-worker:", 1, 1);
    s_add_passed(L, "passed on to downpour-ps:", 1, 0);
    s_add_passed(L, "passed on to downpour-worker:", 0, 1);
}

/* The flags given that a daemon takes, as given, into its argument list. */
static void s_collect_passed(dp_local_t *L)
{
    for (int i = 0; i < L->opts.n; i++) {
        const dp_opts_flag_t *e = &L->opts.opt[i];
        if (!e->pass || !e->given) continue;
        /* --env: the daemons get the model with the environment's actions (s_check_model) */
        if (L->wk.conf.a3c.env && strcmp(e->name, "model") == 0) continue;
        snprintf(L->flag_names[i], sizeof L->flag_names[i], "--%s", e->name);
        int has_value = e->kind != DP_OPTS_FLAG;
        if (s_passes(&L->ps_opts, e->name)) {
            L->ps_args[L->n_ps_args++] = L->flag_names[i];
            if (has_value) L->ps_args[L->n_ps_args++] = e->given;
        }
        if (s_passes(&L->worker_opts, e->name)) {
            L->worker_args[L->n_worker_args++] = L->flag_names[i];
            if (has_value) L->worker_args[L->n_worker_args++] = e->given;
        }
    }
}

/* Parse the command line. */
static dp_opts_result_t s_parse(dp_local_t *L, int argc, char **argv, char *err)
{
    s_options(L);
    dp_opts_result_t rc = dp_opts_parse(&L->opts, argc, argv, err);
    if (rc != DP_OPTS_PARSED) return rc;
    s_collect_passed(L);
    if (dp_ps_check_delay_flags(&L->opts, L->ps.delay_lr, err) != 0) return DP_OPTS_BAD;
    if (L->chaos && L->min_workers == 0)
        return dp_err(err, "--chaos needs an elastic crew: --workers MIN:MAX");
    if (L->chaos && dp_elastic_parse_chaos(L->chaos, &L->chaos_s, err) != 0) return DP_OPTS_BAD;
    if (L->gpus && L->min_workers > 0)
        return dp_err(err, "--gpus gives one worker per GPU: not with --workers MIN:MAX");
    if (L->gpus) {
        int n = 1;
        for (const char *p = L->gpus; *p; p++) n += *p == ',';
        if (n > DP_LOCAL_MAX)
            return dp_err(err, "--gpus '%s': more than %d GPUs", L->gpus, DP_LOCAL_MAX);
        L->workers = L->max_workers = n;
    }
    if (dp_local_device_init(&L->ps_device, L->gpus, dp_opts_find(&L->opts, "ps-shards")->given != NULL,
                             &L->shards, DP_LOCAL_MAX, err) != 0)
        return DP_OPTS_BAD;
    /* the workers' --precision, refused here before any daemon starts */
    if (dp_precision_check(L->gpus ? "cuda" : L->wk.conf.device, L->wk.conf.precision, err) != 0)
        return DP_OPTS_BAD;
    for (int i = L->max_workers; i < DP_LOCAL_MAX; i++)
        if (L->delay_ms[i][0])
            return dp_err(err, "--straggler %d: there are only %d workers", i, L->max_workers);
    return DP_OPTS_PARSED;
}

/* Steps each worker runs (the worker's own rule: --steps, else epochs over
 * its share of n samples in global batches). */
static long s_run_steps(const dp_local_t *L, int n)
{
    const dp_train_conf_t *c = &L->wk.conf;
    if (c->steps > 0) return c->steps;
    return (long)c->epochs * (n / ((long)c->batch * L->max_workers));
}

/* A sparse run's headline: the test AUC (its accuracy and loss after),
 * the table's rows on each shard, samples (libsvm rows) a second. */
static void s_print_sparse(const cJSON *o, const char *mode)
{
    char auc[32] = "no test file", rows[128] = "";
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "test_auc");
    if (cJSON_IsNumber(a)) snprintf(auc, sizeof auc, "%.4f", a->valuedouble);
    const cJSON *r;
    int len = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(o, "rows"))
        if (len < (int)sizeof rows - 24)
            len += snprintf(rows + len, sizeof rows - (size_t)len, "%s%.0f", len ? ", " : "",
                            cJSON_IsNumber(r) ? r->valuedouble : 0);
    fprintf(stderr,
            "done: %s, %g worker(s), %g shard(s): test AUC %s (accuracy %.4f, loss %.4f), rows [%s], "
            "%.0f samples/s, %.1f s; updates applied %g, dropped %g, rejected %g; staleness mean "
            "%.2f, max %g\n",
            mode, s_num(o, "workers", 0), s_num(o, "ps_shards", 0), auc, s_num(o, "test_accuracy", 0),
            s_num(o, "test_loss", 0), rows, s_num(o, "images_per_s", 0), s_num(o, "wall_s", 0),
            s_num(o, "updates_applied", 0), s_num(o, "updates_dropped", 0),
            s_num(o, "updates_rejected", 0), s_num(o, "staleness_mean", 0),
            s_num(o, "staleness_max", 0));
}

/* An --env run's headline: the return. */
static void s_print_env(const cJSON *o, const char *mode, const char *env)
{
    const cJSON *solved = cJSON_GetObjectItemCaseSensitive(o, "solved_at_env_steps");
    char at[48] = "not solved";
    if (cJSON_IsNumber(solved)) snprintf(at, sizeof at, "solved at env step %.0f", solved->valuedouble);
    fprintf(stderr,
            "done: %s, %s, %g worker(s), %g shard(s): %g env steps, %g episodes, return of "
            "the last 100 %.1f (%s), greedy test return %.1f, %.1f s; staleness mean %.2f, "
            "max %g\n",
            env, mode, s_num(o, "workers", 0), s_num(o, "ps_shards", 0),
            s_num(o, "env_steps", 0), s_num(o, "episodes", 0), s_num(o, "return_mean_100", 0),
            at, s_num(o, "test_return", 0), s_num(o, "wall_s", 0),
            s_num(o, "staleness_mean", 0), s_num(o, "staleness_max", 0));
}

/* The run's last line, from summary.json: each kind's headline (a
 * classifier's test accuracy and images/s, a sparse model's test AUC and
 * rows, an environment's return). */
static void s_print_summary(const char *path)
{
    uint8_t *text = NULL;
    size_t len = 0;
    if (dp_read_file(path, &text, &len, NULL) != 0) return;
    cJSON *o = cJSON_Parse((const char *)text);
    free(text);
    if (!o) return;
    const char *mode = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "mode"));
    const char *env = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "env"));
    if (!mode) mode = "?";
    if (env) s_print_env(o, mode, env);
    else if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "rows"))) s_print_sparse(o, mode);
    else
        fprintf(stderr,
                "done: %s, %g worker(s), %g shard(s): test accuracy %.4f (loss %.4f), %.0f images/s, "
                "%.1f s; updates applied %g, dropped %g, rejected %g; staleness mean %.2f, max %g\n",
                mode, s_num(o, "workers", 0), s_num(o, "ps_shards", 0), s_num(o, "test_accuracy", 0),
                s_num(o, "test_loss", 0), s_num(o, "images_per_s", 0), s_num(o, "wall_s", 0),
                s_num(o, "updates_applied", 0), s_num(o, "updates_dropped", 0),
                s_num(o, "updates_rejected", 0), s_num(o, "staleness_mean", 0),
                s_num(o, "staleness_max", 0));
    cJSON_Delete(o);
}

/* The chief worker's summary leaves the optimizer out in a cluster (it is
 * the servers'); the launcher parsed the servers' flags, so it adds their
 * optimizer and base lr, the fields standalone and sim summaries have (and
 * for a model with an embedding the row table's optimizer, lr, initial
 * bound and rows mode).
 * With --local-steps those are the workers' inner optimizer's, and the
 * outer one's are added beside them. */
static int s_summary_add_optimizer(const dp_local_t *L, char *err)
{
    uint8_t *text = NULL;
    size_t len = 0;
    if (dp_read_file(L->summary, &text, &len, err) != 0) return -1;
    cJSON *o = cJSON_Parse((const char *)text);
    free(text);
    if (!o) return dp_err(err, "%s: not JSON", L->summary);
    int rc = 0;
    if (!cJSON_GetObjectItemCaseSensitive(o, "optimizer")) {
        dp_optim_conf_t op = L->ps.optim; /* as the shards resolved it, told --env or not */
        if (L->wk.conf.a3c.env) dp_optim_actor_critic_default(&op);
        cJSON_AddStringToObject(o, "optimizer", dp_optim_kind_name(op.kind));
        cJSON_AddNumberToObject(o, "lr", dp_metrics_round(dp_optim_base_lr(&op), 7));
        dp_optim_conf_t outer;
        dp_ps_config_t ps = L->ps; /* the shards got --workers from the launcher */
        ps.num_workers = L->max_workers;
        if (L->ps.local_steps > 1 && dp_ps_outer_optim(&ps, &outer, err) == 0)
            dp_summary_outer_json(o, &outer);
        /* the delay rule and compensation as the servers ran them (sync
         * turns them off, dp_policy_for_mode) */
        int sync = L->ps.mode == DP_MODE_SYNC;
        char rule[48], dc[48];
        dp_delay_lr_name(sync ? DP_DELAY_NONE : L->ps.delay_lr, L->ps.delay_k, rule, sizeof rule);
        if (sync) snprintf(dc, sizeof dc, "off");
        else dp_optim_dc_name(&L->ps.optim, dc, sizeof dc);
        cJSON_AddStringToObject(o, "delay_lr", rule);
        cJSON_AddStringToObject(o, "delay_compensation", dc);
        if (L->ps_device.gpu) { /* where each shard's weights and state were */
            char devices[DP_LOCAL_MAX * DP_LOCAL_DEVICE_LEN];
            dp_local_device_list(&L->ps_device, L->gpus, L->shards, devices,
                                 sizeof devices);
            cJSON_AddStringToObject(o, "ps_device", devices);
        }
        if (cJSON_GetObjectItemCaseSensitive(o, "rows")) { /* a model with embed:D: its table's */
            dp_rows_conf_t rows;
            float init;
            dp_ps_rows_conf(&L->ps, &rows, &init);
            cJSON_AddStringToObject(o, "row_optimizer", dp_row_optim_kind_name(rows.optim.kind));
            cJSON_AddNumberToObject(o, "row_lr", dp_metrics_round(rows.optim.lr, 6));
            cJSON_AddNumberToObject(o, "row_init", dp_metrics_round(init, 6));
            cJSON_AddStringToObject(o, "rows_mode", dp_mode_name(L->ps.rows_mode ? L->ps.rows_mode : L->ps.mode));
        }
        rc = dp_summary_write(L->summary, o, err);
    }
    cJSON_Delete(o);
    return rc;
}

/* Defaults, flags, the output directory's name and where the daemons are. */
static dp_opts_result_t s_setup(dp_local_t *L, int argc, char **argv, char *err)
{
    memset(L, 0, sizeof *L);
    L->workers = L->max_workers = 2;
    L->shards = 1;
    L->progress = DP_PROGRESS_AUTO;
    dp_ps_config_default(&L->ps);
    dp_worker_args_default(&L->wk);
    dp_opts_result_t rc = s_parse(L, argc, argv, err);
    if (rc != DP_OPTS_PARSED) return rc;
    if (!L->out) {
        time_t now = time(NULL);
        strftime(L->out_default, sizeof L->out_default, "runs/local-%Y%m%d-%H%M%S", localtime(&now));
        s_mkdir("runs", err);
        L->out = L->out_default;
    }
    dp_spawn_bin_dir(L->bin_dir, sizeof L->bin_dir, argv[0]);
    snprintf(L->summary, sizeof L->summary, "%s/summary.json", L->out);
    return DP_OPTS_PARSED;
}

/* An earlier run's TensorBoard event files (the workers add new ones; old
 * ones would show as the same run). */
static int s_is_events(const char *name) { return strncmp(name, "events.out.tfevents.", 20) == 0; }

/* A file the launcher names after a child: ps-I or worker-I, then .jsonl
 * (metrics), .log, .L.log (a later life) or .endpoint (logs). An earlier run with more shards or
 * workers leaves some this run does not overwrite; other files stay. */
static int s_is_child_file(const char *name)
{
    const char *p = NULL;
    if (strncmp(name, "ps-", 3) == 0) p = name + 3;
    else if (strncmp(name, "worker-", 7) == 0) p = name + 7;
    if (!p || !isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) p++;
    if (*p == '.' && isdigit((unsigned char)p[1])) { /* an elastic crew's later life: .L.log */
        for (p++; isdigit((unsigned char)*p); p++) {}
        return strcmp(p, ".log") == 0;
    }
    return strcmp(p, ".jsonl") == 0 || strcmp(p, ".log") == 0 || strcmp(p, ".endpoint") == 0;
}

/* Remove the files of DIR/sub that ours() claims. */
static void s_clear(const dp_local_t *L, const char *sub, int (*ours)(const char *name))
{
    char dir[PATH_MAX], path[PATH_MAX + 256];
    snprintf(dir, sizeof dir, "%s/%s", L->out, sub);
    DIR *d = opendir(dir);
    if (!d) return;
    const struct dirent *e;
    while ((e = readdir(d)))
        if (ours(e->d_name)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
}

/* A fresh --run-id for the shards unless one was given: each launch is a
 * new run, so a --checkpoint-dir holding another run's files is refused
 * (--resume continues it). */
static void s_add_run_id(dp_local_t *L)
{
    if (dp_opts_find(&L->opts, "run-id")->given) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t h = dp_fnv1a(DP_FNV_SEED, &ts, sizeof ts);
    pid_t pid = getpid();
    h = dp_fnv1a(h, &pid, sizeof pid);
    snprintf(L->run_id, sizeof L->run_id, "local-%016" PRIx64, h);
    L->ps_args[L->n_ps_args++] = "--run-id";
    L->ps_args[L->n_ps_args++] = L->run_id;
}

/* --env: what the servers need from the environment instead of the data:
 * the observation's shape, the model with its actions (L->env_model,
 * which s_check_model writes out: ac:A), the environment and the workers'
 * segment (--env, --envs, --t-max); the lr stays constant. */
static int s_prepare_env(dp_local_t *L, char *err)
{
    const dp_env_kind_t *kind = dp_env_find(L->wk.conf.a3c.env, err);
    if (!kind) return -1;
    snprintf(L->input, sizeof L->input, "%dx1x1", kind->obs_dim);
    L->ps.in_c = kind->obs_dim;
    L->ps.in_h = L->ps.in_w = 1;
    L->ps_args[L->n_ps_args++] = "--model";
    L->ps_args[L->n_ps_args++] = L->env_model;
    L->worker_args[L->n_worker_args++] = "--model";
    L->worker_args[L->n_worker_args++] = L->env_model;
    /* the shards bound each push's account by them (server/core/account.h) */
    snprintf(L->env_envs, sizeof L->env_envs, "%d", L->wk.conf.a3c.envs);
    snprintf(L->env_t_max, sizeof L->env_t_max, "%d", L->wk.conf.a3c.t_max);
    const char *rl[] = {"--env", kind->name, "--envs", L->env_envs, "--t-max", L->env_t_max};
    for (int i = 0; i < 6; i++) L->ps_args[L->n_ps_args++] = rl[i];
    return 0;
}

static void s_default_schedule(dp_local_t *L);
static int s_prepare_sparse(dp_local_t *L, char *err);

/* --model, as given, parsed on the input the data give (L->ps.in_*), so
 * that a malformed spec is a bad command line (status 2) before any daemon
 * starts, not a shard's exit. The text is the flag's: the launcher's
 * --model entry is downpour-ps's (its table comes first), so the value
 * lands in L->ps, never in L->wk. --env: the model with the environment's
 * actions written out (ac:A), which the daemons get instead. */
static int s_check_model(dp_local_t *L, char *err)
{
    const char *spec = dp_opts_find(&L->opts, "model")->given;
    dp_model_t m;
    if (L->wk.conf.a3c.env) {
        const dp_env_kind_t *kind = dp_env_find(L->wk.conf.a3c.env, err);
        if (!kind || dp_a3c_model(&m, spec, kind, L->wk.conf.a3c.obs_norm, err) != 0) return -1;
        snprintf(L->env_model, sizeof L->env_model, "%s", m.spec);
        return 0;
    }
    if (!spec) return 0; /* the default, or --init's (which the shards check) */
    return dp_ps_config_model(&L->ps, &m, NULL, err);
}

/* What the servers need from the data: the input shape, and for the
 * default schedule the run's length. */
static int s_prepare(dp_local_t *L, char *err)
{
    if (L->wk.conf.a3c.env) return s_prepare_env(L, err);
    if (dp_sparse_data_is(L->wk.conf.data)) return s_prepare_sparse(L, err);
    dp_dataset_t probe = {0};
    if (dp_dataset_init(&probe, L->wk.conf.data, DP_SPLIT_TRAIN, err) != 0) return -1;
    dp_dataset_limit(&probe, L->wk.conf.train_samples); /* --epochs count the subset's */
    snprintf(L->input, sizeof L->input, "%dx%dx%d", probe.c, probe.h, probe.w);
    L->ps.in_c = probe.c; /* the shards' threads depend on the model's size */
    L->ps.in_h = probe.h;
    L->ps.in_w = probe.w;
    L->worker_steps = s_run_steps(L, probe.n);
    dp_dataset_fini(&probe);
    s_default_schedule(L);
    return 0;
}

/* --lr-schedule unless given: anneal the lr to zero over the run (cosine),
 * as the standalone trainer does by default: the final weights are then
 * not just one noisy point of a constant-lr walk. The servers count one
 * version per sync step, one per push otherwise. */
static void s_default_schedule(dp_local_t *L)
{
    if (!dp_opts_find(&L->opts, "lr-schedule")->given) {
        long per_worker = L->worker_steps;
        long updates = L->ps.mode == DP_MODE_SYNC ? per_worker : per_worker * L->max_workers;
        if (L->ps.local_steps > 1 && per_worker > 0) {
            /* local steps: the workers' inner optimizer anneals over their
             * data steps; the outer lr stays constant (DiLoCo's) */
            snprintf(L->schedule, sizeof L->schedule, "cosine:%ld", per_worker);
            L->worker_args[L->n_worker_args++] = "--lr-schedule";
            L->worker_args[L->n_worker_args++] = L->schedule;
        } else if (updates > 0) {
            snprintf(L->schedule, sizeof L->schedule, "cosine:%ld", updates);
            L->ps_args[L->n_ps_args++] = "--lr-schedule";
            L->ps_args[L->n_ps_args++] = L->schedule;
        }
    }
}

/* --data libsvm: (a model with embed:D): the files checked and counted as
 * the workers will (worker/exec/sparse_data.h), the shards' input 1x1x1 (the
 * embedding reads no image), each worker's steps its share of the
 * batches (worker/train/embed_train.h: batch g is worker g mod N's; an elastic
 * crew's are dealt by shard 0, this the share of MAX workers). */
static int s_prepare_sparse(dp_local_t *L, char *err)
{
    const dp_train_conf_t *c = &L->wk.conf;
    dp_sparse_data_t d;
    if (dp_sparse_data_open(&d, c->data, c->batch, err) != 0) return -1;
    long all = (long)c->epochs * d.steps_per_epoch;
    dp_sparse_data_close(&d);
    snprintf(L->input, sizeof L->input, "1x1x1");
    L->ps.in_c = L->ps.in_h = L->ps.in_w = 1;
    L->worker_steps = c->steps > 0 ? c->steps : (all + L->max_workers - 1) / L->max_workers;
    s_default_schedule(L);
    return 0;
}

/* DIR and its subdirectories, without the results of an earlier run. */
static int s_prepare_dirs(dp_local_t *L, char *err)
{
    char path[PATH_MAX];
    if (dp_crew_make_out(L->out, err) != 0) return -1;
    unlink(L->summary);
    snprintf(path, sizeof path, "%s/model.safetensors", L->out);
    unlink(path);
    if (L->secure && dp_local_keys_make(&L->keys, L->out, L->shards, L->max_workers, err) != 0) return -1;
    s_clear(L, "tensorboard", s_is_events);
    s_clear(L, "metrics", s_is_child_file);
    s_clear(L, "logs", s_is_child_file);
    s_add_run_id(L);
    return 0;
}

/* DIR/logs/ps-I.record: shard I's --record, merged into --record FILE. */
static void s_record_part(const dp_local_t *L, int i, char *out, size_t n)
{
    snprintf(out, n, "%s/logs/ps-%d.record", L->out, i);
}

/* The workers' kernel threads: one share of the cores each, unless given. */
static long s_worker_threads(const dp_local_t *L)
{
    if (L->wk.conf.threads > 0) return L->wk.conf.threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores / L->workers > 0 ? cores / L->workers : 1;
}

/* --record FILE: the shards' records and the workers' side in one file. */
static int s_record_merge(const dp_local_t *L, char *err)
{
    char paths[DP_LOCAL_MAX][PATH_MAX], seed[24];
    const char *parts[DP_LOCAL_MAX];
    for (int i = 0; i < L->shards; i++) {
        s_record_part(L, i, paths[i], sizeof paths[i]);
        parts[i] = paths[i];
    }
    cJSON *extra = cJSON_CreateObject();
    cJSON_AddStringToObject(extra, "data", L->wk.conf.data);
    cJSON_AddNumberToObject(extra, "batch", L->wk.conf.batch);
    if (L->wk.conf.train_samples > 0) cJSON_AddNumberToObject(extra, "train_samples", L->wk.conf.train_samples);
    if (L->wk.conf.augment) cJSON_AddBoolToObject(extra, "augment", 1);
    if (L->wk.conf.normalize) cJSON_AddStringToObject(extra, "normalize", L->wk.conf.normalize);
    /* --seed goes to both daemons; the launcher's table holds one entry
     * for it, the ps table's, so its value is in L->ps. */
    snprintf(seed, sizeof seed, "%" PRIu64, L->ps.seed);
    cJSON_AddStringToObject(extra, "data_seed", seed);
    cJSON_AddNumberToObject(extra, "threads", (double)s_worker_threads(L));
    cJSON_AddStringToObject(extra, "device", L->gpus ? "cuda" : "cpu");
    /* the workers' arithmetic (absent: fp32, a record from before it) */
    if (L->wk.conf.precision != DP_PRECISION_FP32)
        cJSON_AddStringToObject(extra, "precision", dp_precision_name(L->wk.conf.precision));
    if (L->ps.local_steps > 1) { /* replay repeats each worker's rounds */
        dp_optim_conf_t inner = L->ps.optim; /* --optimizer and friends: the workers' here */
        if (L->schedule[0]) dp_optim_parse_schedule(&inner, L->schedule, err);
        cJSON_AddNumberToObject(extra, "local_steps", (double)L->ps.local_steps);
        if (L->ps.local_auto) cJSON_AddBoolToObject(extra, "local_steps_auto", 1); /* each push's "h" */
        cJSON_AddItemToObject(extra, "inner", dp_record_optim_json(&inner));
        cJSON_AddNumberToObject(extra, "steps", (double)L->worker_steps);
    }
    if (L->wk.conf.a3c.env) dp_lab_rl_header(extra, &L->wk.conf.a3c); /* replay recomputes the rollouts */
    char compress[48]; /* the workers' --compress: replay compresses the same way */
    dp_compress_name(&L->wk.conf.compress, compress, sizeof compress);
    cJSON_AddStringToObject(extra, "compress", compress);
    cJSON_AddStringToObject(extra, "error_feedback", L->wk.conf.compress.error_feedback ? "on" : "off");
    int rc = dp_record_merge(L->record, parts, L->shards, extra, err);
    cJSON_Delete(extra);
    return rc;
}

/* The parameter-server shards, each on a loopback port the kernel picks. */
static int s_start_servers(dp_local_t *L, char *err)
{
    char shard[24], nworkers[16], ps_bin[PATH_MAX + 16], ready[PATH_MAX], threads[24];
    dp_opts_crew_name(L->min_workers, L->max_workers, nworkers, sizeof nworkers);
    /* the shards share the host's cores for their optimizer sweeps: each
     * gets the daemon's own rule on its share of them */
    dp_ps_config_t share = L->ps;
    share.shard_count = L->shards;
    share.threads = L->ps_threads;
    snprintf(threads, sizeof threads, "%d",
             dp_ps_config_threads_on(&share, sysconf(_SC_NPROCESSORS_ONLN) / L->shards));
    snprintf(ps_bin, sizeof ps_bin, "%s/downpour-ps", L->bin_dir);
    for (int i = 0; i < L->shards; i++) {
        snprintf(shard, sizeof shard, "%d/%d", i, L->shards);
        dp_crew_ready_path(L->out, i, ready, sizeof ready);
        unlink(ready);
        dp_child_t *c = dp_crew_add(&L->crew, L->out, "ps", i);
        unlink(c->metrics);
        const char *av[DP_LOCAL_ARGS];
        int n = 0;
        av[n++] = ps_bin;
        av[n++] = "--bind"; av[n++] = "tcp://127.0.0.1:*";
        av[n++] = "--ready-file"; av[n++] = ready;
        av[n++] = "--shard"; av[n++] = shard;
        av[n++] = "--workers"; av[n++] = nworkers;
        av[n++] = "--input"; av[n++] = L->input;
        av[n++] = "--metrics"; av[n++] = c->metrics;
        av[n++] = "--threads"; av[n++] = threads;
        /* The early step moves the shard's optimizer pass under a worker's
         * backward; with every core taken by the workers' threads it only
         * competes with them (2 workers x 1 thread on 2 cores: 7-10 %
         * slower, BENCHMARKS.md), so it is off then (a user's flag wins). */
        if ((long)L->workers * s_worker_threads(L) >= sysconf(_SC_NPROCESSORS_ONLN)) {
            av[n++] = "--early-step"; av[n++] = "off";
        }
        const char *device = dp_local_device_shard(&L->ps_device, L->gpus, i);
        if (device) { av[n++] = "--device"; av[n++] = device; }
        if (L->secure) dp_local_keys_ps_args(&L->keys, i, av, &n);
        char record[PATH_MAX];
        if (L->record) {
            s_record_part(L, i, record, sizeof record);
            av[n++] = "--record"; av[n++] = record;
        }
        for (int k = 0; k < L->n_ps_args; k++) av[n++] = L->ps_args[k];
        av[n] = NULL;
        if (dp_spawn(&c->pid, av, c->log, err) != 0) return -1;
    }
    return 0;
}

/* Worker i (task 0 is the chief and writes the results); its first life
 * starts with a fresh metrics file, a later one (an elastic crew's
 * restart) appends to it. */
static int s_start_worker(dp_local_t *L, int i, char *err)
{
    char task[12], device[24], threads[24], worker_bin[PATH_MAX + 16];
    char save[PATH_MAX], tensorboard[PATH_MAX];
    snprintf(threads, sizeof threads, "%ld", s_worker_threads(L));
    snprintf(worker_bin, sizeof worker_bin, "%s/downpour-worker", L->bin_dir);
    snprintf(save, sizeof save, "%s/model.safetensors", L->out);
    snprintf(tensorboard, sizeof tensorboard, "%s/tensorboard", L->out);
    dp_child_t *c = dp_crew_worker_life(&L->crew, L->out, i);
    if (!c) return dp_err(err, "worker %d: running already, or more than %d children", i, 2 * DP_CREW_MAX);
    if (c->lives == 1) unlink(c->metrics);
    snprintf(task, sizeof task, "%d", i);
    const char *av[DP_LOCAL_ARGS];
    int n = 0;
    av[n++] = worker_bin;
    av[n++] = "--ps"; av[n++] = L->endpoints;
    av[n++] = "--task-index"; av[n++] = task;
    av[n++] = "--metrics"; av[n++] = c->metrics;
    av[n++] = "--tensorboard"; av[n++] = tensorboard;
    av[n++] = "--no-progress";
    if (L->gpus) { /* the i-th listed GPU */
        dp_local_gpu_at(L->gpus, i, device, sizeof device);
        av[n++] = "--device"; av[n++] = device;
    } else {
        av[n++] = "--threads"; av[n++] = threads;
    }
    if (L->delay_ms[i][0]) {
        av[n++] = "--delay-ms"; av[n++] = L->delay_ms[i];
        if (L->delay_exp[i]) { av[n++] = "--delay-dist"; av[n++] = "exp"; }
    }
    if (i == 0) {
        av[n++] = "--save"; av[n++] = save;
        av[n++] = "--summary"; av[n++] = L->summary;
    }
    if (L->secure) dp_local_keys_worker_args(&L->keys, i, av, &n);
    /* User flags last, so an explicit --threads or --device wins. */
    for (int k = 0; k < L->n_worker_args; k++) av[n++] = L->worker_args[k];
    av[n] = NULL;
    if (dp_spawn(&c->pid, av, c->log, err) != 0) return -1;
    return 0;
}

static int s_start_elastic(void *arg, int task, char *err)
{
    return s_start_worker(arg, task, err);
}

/* The workers of the start: N, or an elastic crew's MIN (tasks 0 .. MIN - 1). */
static int s_start_workers(dp_local_t *L, char *err)
{
    /* `downpour scale` tells from this lock that someone listens (held
     * until this process ends: the fd is never closed) */
    if (L->min_workers > 0 && dp_scale_listen(L->out, L->max_workers, err) < 0) return -1;
    for (int i = 0; i < L->workers; i++)
        if (s_start_worker(L, i, err) != 0) return -1;
    if (L->min_workers > 0)
        dp_elastic_init(&L->elastic, L->min_workers, L->max_workers, L->chaos_s, L->ps.seed, L->out,
                        &L->crew, s_start_elastic, L, dp_now());
    return 0;
}

/* Watch until a signal, a failure (returned), or the end: every worker done
 * (the chief stops the servers itself; they get a moment to take its
 * SHUTDOWN). */
static const dp_child_t *s_watch(dp_local_t *L)
{
    int live_tty = L->progress == DP_PROGRESS_ON || (L->progress == DP_PROGRESS_AUTO && isatty(2));
    double t0 = dp_now(), last_progress = 0, workers_done_at = 0;
    long total = 0, spe = 0, batch = 0;
    const dp_child_t *failed = NULL;
    while (!s_signal) {
        int workers_left, alive;
        char err[DP_ERR_LEN];
        failed = dp_crew_reap(&L->crew, &alive, &workers_left);
        if (failed && dp_elastic_survives(&L->elastic, failed)) failed = NULL;
        if (failed || alive == 0) break;
        if (dp_elastic_tick(&L->elastic, dp_now(), err) != 0) {
            fprintf(stderr, "downpour local: %s\n", err);
            break;
        }
        /* the end: every worker done, or the chief (it stopped the servers;
         * an elastic crew's latecomer would wait on them in vain) */
        const dp_child_t *chief = dp_crew_worker(&L->crew, 0);
        if (workers_left == 0 || (chief && chief->pid == 0 && WIFEXITED(chief->status) &&
                                  WEXITSTATUS(chief->status) == 0)) {
            if (workers_done_at == 0) workers_done_at = dp_now();
            if (dp_now() - workers_done_at > 10) break;
        }
        double now = dp_now();
        if (now - last_progress >= (live_tty ? 0.5 : 15.0) && L->progress != DP_PROGRESS_OFF) {
            s_show_progress(L, t0, &total, &spe, &batch, live_tty);
            last_progress = now;
        }
        usleep(100 * 1000);
    }
    /* the line once more at the end: where the run got to (the workers'
     * last steps), not where it was up to half a second before */
    if (!failed && !s_signal && L->progress != DP_PROGRESS_OFF)
        s_show_progress(L, t0, &total, &spe, &batch, live_tty);
    if (live_tty && L->progress != DP_PROGRESS_OFF) fputc('\n', stderr);
    return failed;
}

/* Stop what is left and say how the run ended; the exit status. */
static int s_finish(dp_local_t *L, const dp_child_t *failed)
{
    int interrupted = s_signal != 0;
    dp_crew_stop_all(&L->crew, 10.0);
    if (interrupted) {
        fprintf(stderr, "downpour local: stopped by signal %d; every process ended; logs in %s/logs\n",
                (int)s_signal, L->out);
        return 128 + (int)s_signal;
    }
    if (failed) {
        char how[64], last[512];
        dp_child_describe_exit(failed, how, sizeof how);
        dp_last_line(failed->log, last, sizeof last);
        fprintf(stderr, "downpour local: %s %s; last log line: %s\n(full log: %s)\n", failed->name,
                how, last[0] ? last : "(empty)", failed->log);
        return 1;
    }
    if (access(L->summary, F_OK) != 0) {
        fprintf(stderr, "downpour local: the run ended without %s (see %s/logs)\n", L->summary, L->out);
        return 1;
    }
    char err[DP_ERR_LEN];
    if (s_summary_add_optimizer(L, err) != 0) {
        fprintf(stderr, "downpour local: %s\n", err);
        return 1;
    }
    s_print_summary(L->summary);
    if (L->record && s_record_merge(L, err) != 0) {
        fprintf(stderr, "downpour local: %s\n", err);
        return 1;
    }
    printf("%s\n", L->summary);
    return 0;
}

int dp_local_main(int argc, char **argv)
{
    static dp_local_t L; /* large: keep it off the stack */
    char err[DP_ERR_LEN] = "";
    dp_opts_result_t parsed = s_setup(&L, argc, argv, err);
    if (parsed != DP_OPTS_PARSED) return dp_opts_exit_status("downpour local", parsed, err);
    if (s_prepare(&L, err) != 0 || dp_spawn_guard(err) != 0) {
        fprintf(stderr, "downpour local: %s\n", err);
        return 1;
    }
    if (s_check_model(&L, err) != 0) return dp_opts_exit_status("downpour local", DP_OPTS_BAD, err);
    if (s_prepare_dirs(&L, err) != 0) {
        fprintf(stderr, "downpour local: %s\n", err);
        return 1;
    }
    dp_signals_install(&s_signal, 1);
    if (s_start_servers(&L, err) != 0 ||
        dp_crew_await_shards(&L.crew, L.out, L.shards, L.endpoints, sizeof L.endpoints, &s_signal,
                             err) != 0 ||
        s_start_workers(&L, err) != 0) {
        fprintf(stderr, "downpour local: %s\n", err);
        dp_crew_stop_all(&L.crew, 5.0);
        return 1;
    }
    fprintf(stderr, "downpour local: %d ps shard(s) at %s, %d worker(s), %s mode; results in %s\n",
            L.shards, L.endpoints, L.workers, dp_mode_name(L.ps.mode), L.out);
    return s_finish(&L, s_watch(&L));
}
