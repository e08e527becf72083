/* sweep/run: one run of a sweep (see run.h). The run's own binary
 * checks its flags; this module only assembles them, so a flag of `args`
 * means exactly what it means on the command line. */
#include "deploy/lab/sweep/run.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "deploy/launcher/spawn.h"

static int s_push(dp_sweep_cmd_t *c, const char *s, char *err)
{
    size_t len = strlen(s) + 1;
    if (c->argc >= DP_SWEEP_ARGS || c->used + len > sizeof c->buf)
        return dp_err(err, "the run's command line is too long (at most %d arguments)", DP_SWEEP_ARGS);
    memcpy(c->buf + c->used, s, len);
    c->argv[c->argc++] = c->buf + c->used;
    c->argv[c->argc] = NULL;
    c->used += len;
    return 0;
}

/* flag and value, when value is set (and is not "none"). */
static int s_push_opt(dp_sweep_cmd_t *c, const char *flag, const char *value, char *err)
{
    if (!value || strcmp(value, "none") == 0) return 0;
    return s_push(c, flag, err) || s_push(c, value, err) ? -1 : 0;
}

/* The grid's args, split at blanks; '...' or "..." keeps blanks in one
 * argument (--model 'fc:128 relu fc:10 softmax'). */
static int s_push_args(dp_sweep_cmd_t *c, const char *args, char *err)
{
    if (!args) return 0;
    char *copy = dp_strdup(args), *p = copy;
    int rc = 0;
    while (rc == 0) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        char *start = p, quote = 0;
        if (*p == '\'' || *p == '"') {
            quote = *p++;
            start = p;
            while (*p && *p != quote) p++;
            if (!*p) {
                rc = dp_err(err, "args: an unclosed %c in '%s'", quote, args);
                break;
            }
        } else {
            while (*p && *p != ' ' && *p != '\t') p++;
        }
        char end = *p;
        *p = 0;
        rc = s_push(c, start, err);
        p += end != 0;
    }
    free(copy);
    return rc;
}

/* An actor-critic run's environment and RL flags (the standalone worker,
 * downpour local and the simulator take them alike). */
static int s_push_rl(dp_sweep_cmd_t *c, const dp_sweep_grid_t *g, const int *pick, char *err)
{
    static const struct {
        int axis;
        const char *flag;
    } rl[] = {{DP_SWEEP_ENV, "--env"},         {DP_SWEEP_ENVS, "--envs"},
              {DP_SWEEP_T_MAX, "--t-max"},     {DP_SWEEP_ENTROPY, "--entropy"},
              {DP_SWEEP_GAMMA, "--gamma"},     {DP_SWEEP_REWARD_SCALE, "--reward-scale"},
              {DP_SWEEP_OBS_NORM, "--obs-norm"},
              {DP_SWEEP_CLIP_NORM, "--clip-norm"},
              {DP_SWEEP_ENV_STEPS, "--env-steps"}};
    for (size_t i = 0; i < sizeof rl / sizeof rl[0]; i++)
        if (s_push_opt(c, rl[i].flag, dp_sweep_grid_value(g, pick, rl[i].axis), err) != 0) return -1;
    return 0;
}

/* The flags every kind of run shares: lr, momentum, optimizer, model,
 * precision, seed, the RL flags, the curve (the standalone trainer, the servers and the
 * simulator all take --optimizer); an actor-critic run has no test set to
 * evaluate, so no curve flags. */
static int s_push_common(dp_sweep_cmd_t *c, const dp_sweep_grid_t *g, const int *pick,
                         const char *seed, char *err)
{
    char every[24], limit[24];
    snprintf(every, sizeof every, "%ld", g->eval_every);
    snprintf(limit, sizeof limit, "%d", g->eval_limit);
    if (s_push_opt(c, "--lr", dp_sweep_grid_value(g, pick, DP_SWEEP_LR), err) ||
        s_push_opt(c, "--momentum", dp_sweep_grid_value(g, pick, DP_SWEEP_MOMENTUM), err) ||
        s_push_opt(c, "--optimizer", dp_sweep_grid_value(g, pick, DP_SWEEP_OPTIMIZER), err) ||
        s_push_opt(c, "--model", dp_sweep_grid_value(g, pick, DP_SWEEP_MODEL), err) ||
        s_push_opt(c, "--precision", dp_sweep_grid_value(g, pick, DP_SWEEP_PRECISION), err) ||
        s_push_opt(c, "--seed", seed, err) || s_push_rl(c, g, pick, err))
        return -1;
    /* No curve for an actor-critic run (no test set), nor for a sparse
     * model in the simulator (its evaluation is the chief's at the end). */
    const char *model = dp_sweep_grid_value(g, pick, DP_SWEEP_MODEL);
    int sparse_sim = model && strncmp(model, "embed:", 6) == 0 && strcmp(g->cluster, "sim") == 0;
    if (g->eval_every > 0 && !dp_sweep_grid_value(g, pick, DP_SWEEP_ENV) && !sparse_sim &&
        (s_push_opt(c, "--eval-every", every, err) || s_push_opt(c, "--eval-limit", limit, err)))
        return -1;
    return 0;
}

/* The cluster's flags: mode, bound, lr policy, delay rule and compensation,
 * replicas, and the workers' compression (both local and sim take them). */
static int s_push_server(dp_sweep_cmd_t *c, const dp_sweep_grid_t *g, const int *pick, char *err)
{
    const char *policy = dp_sweep_grid_value(g, pick, DP_SWEEP_LR_POLICY);
    if (s_push_opt(c, "--mode", dp_sweep_grid_value(g, pick, DP_SWEEP_MODE), err) ||
        s_push_opt(c, "--workers", dp_sweep_grid_value(g, pick, DP_SWEEP_WORKERS), err) ||
        s_push_opt(c, "--staleness", dp_sweep_grid_value(g, pick, DP_SWEEP_STALENESS), err) ||
        s_push_opt(c, "--replicas-to-aggregate", dp_sweep_grid_value(g, pick, DP_SWEEP_REPLICAS), err) ||
        s_push_opt(c, "--delay-lr", dp_sweep_grid_value(g, pick, DP_SWEEP_DELAY_LR), err) ||
        s_push_opt(c, "--delay-compensation", dp_sweep_grid_value(g, pick, DP_SWEEP_DELAY_COMPENSATION), err) ||
        s_push_opt(c, "--local-steps", dp_sweep_grid_value(g, pick, DP_SWEEP_LOCAL_STEPS), err) ||
        s_push_opt(c, "--outer-optimizer", dp_sweep_grid_value(g, pick, DP_SWEEP_OUTER_OPTIMIZER), err) ||
        s_push_opt(c, "--compress", dp_sweep_grid_value(g, pick, DP_SWEEP_COMPRESS), err) ||
        s_push_opt(c, "--error-feedback", dp_sweep_grid_value(g, pick, DP_SWEEP_ERROR_FEEDBACK), err))
        return -1;
    if (policy && strcmp(policy, "staleness") == 0 && s_push(c, "--lr-staleness", err) != 0) return -1;
    return 0;
}

static int s_build_standalone(dp_sweep_cmd_t *c, const dp_sweep_grid_t *g, const int *pick,
                              const char *seed, const char *bin_dir, const char *dir, char *err)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/downpour-worker", bin_dir);
    if (s_push(c, path, err) || s_push(c, "--standalone", err) || s_push(c, "--no-progress", err))
        return -1;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (s_push_opt(c, "--save", path, err)) return -1;
    snprintf(path, sizeof path, "%s/summary.json", dir);
    if (s_push_opt(c, "--summary", path, err)) return -1;
    snprintf(path, sizeof path, "%s/metrics/worker-0.jsonl", dir);
    if (s_push_opt(c, "--metrics", path, err)) return -1;
    return s_push_common(c, g, pick, seed, err) || s_push_args(c, g->args, err) ? -1 : 0;
}

static int s_build_local(dp_sweep_cmd_t *c, const dp_sweep_grid_t *g, const int *pick,
                         const char *seed, const char *bin_dir, const char *dir, char *err)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/downpour", bin_dir);
    if (s_push(c, path, err) || s_push(c, "local", err) || s_push(c, "--no-progress", err) ||
        s_push_opt(c, "--out", dir, err) || s_push_server(c, g, pick, err) ||
        s_push_opt(c, "--straggler", dp_sweep_grid_value(g, pick, DP_SWEEP_STRAGGLER), err))
        return -1;
    if (dp_sweep_grid_value(g, pick, DP_SWEEP_COMPUTE))
        return dp_err(err, "compute: simulated compute times need cluster = sim");
    const char *churn = dp_sweep_grid_value(g, pick, DP_SWEEP_CHURN);
    if (churn && strcmp(churn, "none") != 0)
        return dp_err(err, "churn: a simulated crew's changes need cluster = sim (downpour local "
                           "has --chaos kill:SECONDS: give it in args)");
    return s_push_common(c, g, pick, seed, err) || s_push_args(c, g->args, err) ? -1 : 0;
}

static int s_build_sim(dp_sweep_cmd_t *c, const dp_sweep_grid_t *g, const int *pick,
                       const char *seed, const char *bin_dir, const char *dir, char *err)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/downpour", bin_dir);
    /* --json: the result is run.log's last line (its simulated seconds). */
    if (s_push(c, path, err) || s_push(c, "sim", err) || s_push(c, "--json", err) || s_push(c, "--no-progress", err) ||
        s_push_opt(c, "--out", dir, err))
        return -1;
    snprintf(path, sizeof path, "%s/metrics/sim.jsonl", dir);
    if (s_push_opt(c, "--metrics", path, err) || s_push_server(c, g, pick, err) ||
        s_push_opt(c, "--straggler", dp_sweep_grid_value(g, pick, DP_SWEEP_STRAGGLER), err) ||
        s_push_opt(c, "--compute", dp_sweep_grid_value(g, pick, DP_SWEEP_COMPUTE), err) ||
        s_push_opt(c, "--churn", dp_sweep_grid_value(g, pick, DP_SWEEP_CHURN), err))
        return -1;
    return s_push_common(c, g, pick, seed, err) || s_push_args(c, g->args, err) ? -1 : 0;
}

int dp_sweep_cmd_build(dp_sweep_cmd_t *cmd, const dp_sweep_grid_t *g, const int *pick,
                       const char *seed, const char *bin_dir, const char *dir, char *err)
{
    memset(cmd, 0, sizeof *cmd);
    const char *mode = dp_sweep_grid_value(g, pick, DP_SWEEP_MODE);
    if (mode && strcmp(mode, "standalone") == 0)
        return s_build_standalone(cmd, g, pick, seed, bin_dir, dir, err);
    if (strcmp(g->cluster, "sim") == 0) return s_build_sim(cmd, g, pick, seed, bin_dir, dir, err);
    return s_build_local(cmd, g, pick, seed, bin_dir, dir, err);
}

void dp_sweep_cmd_line(const dp_sweep_cmd_t *cmd, char *out, size_t n)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < cmd->argc && used < n; i++) {
        const char *a = cmd->argv[i];
        int quote = a[0] == 0 || strpbrk(a, " \t'\"") != NULL;
        used += (size_t)snprintf(out + used, n - used, "%s%s%s%s", i ? " " : "", quote ? "'" : "", a,
                                 quote ? "'" : "");
    }
}

int dp_sweep_run_complete(const dp_sweep_cmd_t *cmd, const char *dir)
{
    char path[PATH_MAX + 32], line[16384];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    if (access(path, R_OK) != 0) return 0;
    snprintf(path, sizeof path, "%s/complete", dir);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dp_read_file(path, &buf, &len, NULL) != 0) return 0;
    dp_sweep_cmd_line(cmd, line, sizeof line);
    while (len > 0 && buf[len - 1] == '\n') buf[--len] = 0;
    int same = strcmp((const char *)buf, line) == 0;
    free(buf);
    return same;
}

void dp_sweep_run_last_line(const char *dir, char *out, size_t n)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run.log", dir);
    out[0] = 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dp_read_file(path, &buf, &len, NULL) != 0) return;
    char *s = (char *)buf;
    while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ')) s[--len] = 0;
    char *nl = strrchr(s, '\n'), *cr = strrchr(s, '\r');
    char *start = nl > cr ? nl : cr;
    snprintf(out, n, "%s", start ? start + 1 : s);
    free(buf);
}

/* Where the run is, for the progress line: the chief's step of its total
 * (the first and last lines of its metrics), or a simulated run's last
 * evaluation; "" before either exists. */
static void s_run_where(const char *dir, char *out, size_t n)
{
    char path[PATH_MAX + 32], line[4096];
    long step = -1, total = 0, updates = -1;
    out[0] = 0;
    snprintf(path, sizeof path, "%s/metrics/worker-0.jsonl", dir);
    FILE *f = fopen(path, "rb");
    int sim = !f;
    if (sim) {
        snprintf(path, sizeof path, "%s/metrics/sim.jsonl", dir);
        if (!(f = fopen(path, "rb"))) return;
    }
    if (!sim && fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "total_steps");
        if (cJSON_IsNumber(t)) total = (long)t->valuedouble;
        cJSON_Delete(o);
    }
    if (fseek(f, -2048, SEEK_END) != 0) rewind(f);
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step"), *u = cJSON_GetObjectItemCaseSensitive(o, "updates");
        if (!sim && cJSON_IsNumber(s) && !cJSON_GetObjectItemCaseSensitive(o, "event"))
            step = (long)s->valuedouble + 1;
        if (sim && cJSON_IsNumber(u)) updates = (long)u->valuedouble;
        cJSON_Delete(o);
    }
    fclose(f);
    if (step >= 0) snprintf(out, n, "  step %ld/%ld", step, total);
    if (updates >= 0) snprintf(out, n, "  update %ld", updates);
}

/* Earlier outputs of the run go first: a standalone run appends to its
 * metrics file, and a stale summary would pass for this run's. */
static int s_prepare_dir(const char *dir, const dp_sweep_cmd_t *cmd, char *err)
{
    char path[PATH_MAX + 32], line[16384];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return dp_err(err, "%s: cannot create: %s", dir, strerror(errno));
    const char *old[] = {"complete", "summary.json", "metrics/worker-0.jsonl", "metrics/sim.jsonl"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, old[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/metrics", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return dp_err(err, "%s: cannot create: %s", path, strerror(errno));
    dp_sweep_cmd_line(cmd, line, sizeof line);
    size_t len = strlen(line);
    line[len++] = '\n';
    snprintf(path, sizeof path, "%s/command.txt", dir);
    return dp_write_file_atomic(path, line, len, err);
}

/* SIGTERM to the run's process group (the launcher stops its children in
 * order), SIGKILL after 15 s. */
static void s_stop_child(pid_t pid, int *status)
{
    kill(-pid, SIGTERM);
    for (int i = 0; i < 150; i++) {
        if (waitpid(pid, status, WNOHANG) == pid) return;
        usleep(100 * 1000);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, status, 0);
}

int dp_sweep_run_exec(const dp_sweep_cmd_t *cmd, const char *dir, dp_progress_t *progress,
                      const char *prefix, volatile sig_atomic_t *stop, int *status, char *err)
{
    char path[PATH_MAX + 32], line[16384];
    if (s_prepare_dir(dir, cmd, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/run.log", dir);
    pid_t pid;
    if (dp_spawn(&pid, cmd->argv, path, err) != 0) return -1;
    double t0 = dp_now();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (stop && *stop) {
            s_stop_child(pid, &st);
            return dp_err(err, "interrupted by signal %d", (int)*stop);
        }
        char where[64];
        s_run_where(dir, where, sizeof where);
        dp_progress_update(progress, 0, "%s%s  %.0f s", prefix, where, dp_now() - t0);
        usleep(200 * 1000);
    }
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (*status == 0) {
        dp_sweep_cmd_line(cmd, line, sizeof line);
        size_t len = strlen(line);
        line[len++] = '\n';
        snprintf(path, sizeof path, "%s/complete", dir);
        if (dp_write_file_atomic(path, line, len, err) != 0) return -1;
    }
    return 0;
}
