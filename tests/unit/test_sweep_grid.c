/* test_sweep_grid: `downpour sweep`'s grid (deploy/lab/sweep/grid.h), read
 * from flags and files with awkward input — empty values and lines, keys
 * given twice under two spellings, values listed twice, bad keys and
 * values, CRLF files, a NUL byte, and the largest grid the limits allow
 * (counted without overflow, every configuration picked back). Each refusal
 * is one line naming the key (and FILE:LINE for a file). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "deploy/lab/sweep/grid.h"
#include "deploy/lab/sweep/run.h"
#include "kernels/cpu/bf16_ops.h"
#include "tests/test.h"

/* A scratch grid file with text; the path is static. */
static const char *s_file(const char *text, size_t len)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/test_sweep_grid.%d.txt", (int)getpid());
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, len, f);
    fclose(f);
    return path;
}

/* Load text into a fresh grid: its return code, err filled. */
static int s_load(dp_sweep_grid_t *g, const char *text, char *err)
{
    dp_sweep_grid_init(g);
    err[0] = 0;
    const char *path = s_file(text, strlen(text));
    int rc = dp_sweep_grid_load(g, path, err);
    unlink(path);
    return rc;
}

/* Does loading text fail with an error containing want (and FILE:LINE)? */
static void s_refused(const char *text, const char *want, int line)
{
    dp_sweep_grid_t g;
    char err[DP_ERR_LEN], at[32];
    int rc = s_load(&g, text, err);
    snprintf(at, sizeof at, ".txt:%d: ", line);
    CHECK_EQ(rc, -1);
    CHECK(strstr(err, want) != NULL);
    CHECK(strstr(err, at) != NULL);
    CHECK(strchr(err, '\n') == NULL);
    if (rc != -1 || !strstr(err, want) || !strstr(err, at))
        fprintf(stderr, "    text '%s': got '%s', wanted '%s' at line %d\n", text, err, want, line);
    dp_sweep_grid_fini(&g);
}

/* Does dp_sweep_grid_set(key, list) fail naming want, leaving the axis unset? */
static void s_set_refused(const char *key, const char *list, const char *want)
{
    dp_sweep_grid_t g;
    dp_sweep_grid_init(&g);
    char err[DP_ERR_LEN] = "";
    int rc = dp_sweep_grid_set(&g, key, list, err);
    CHECK_EQ(rc, -1);
    CHECK(strstr(err, want) != NULL);
    if (rc != -1 || !strstr(err, want))
        fprintf(stderr, "    set %s '%s': got '%s', wanted '%s'\n", key, list, err, want);
    dp_sweep_grid_fini(&g);
}

static void test_defaults(void)
{
    dp_sweep_grid_t g;
    dp_sweep_grid_init(&g);
    CHECK_STR(g.cluster, "local");
    CHECK_EQ(g.n[DP_SWEEP_MODE], 1);
    CHECK_STR(g.value[DP_SWEEP_MODE][0], "async");
    CHECK_EQ(dp_sweep_grid_seeds(&g), 1);
    CHECK_EQ(dp_sweep_grid_configs(&g), 1);
    CHECK_EQ(g.eval_every, 50);
    CHECK_EQ(g.eval_limit, 2000);
    CHECK_EQ(g.n_target, 3);
    int pick[DP_SWEEP_N_AXES];
    CHECK_EQ(dp_sweep_grid_pick(&g, 0, pick), 1);
    char label[256];
    dp_sweep_grid_label(&g, pick, label, sizeof label);
    CHECK_STR(label, "mode=async");
    CHECK(dp_sweep_grid_value(&g, pick, DP_SWEEP_LR) == NULL);
    dp_sweep_grid_fini(&g);
    dp_sweep_grid_fini(&g); /* safe twice */
}

/* Blanks around values and keys, '_' for '-', any case, flags' dashes. */
static void test_spellings(void)
{
    dp_sweep_grid_t g;
    dp_sweep_grid_init(&g);
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_sweep_grid_set(&g, "workers", " 2 ,4,\t8 ", err), 0);
    CHECK_EQ(g.n[DP_SWEEP_WORKERS], 3);
    CHECK_STR(g.value[DP_SWEEP_WORKERS][0], "2");
    CHECK_STR(g.value[DP_SWEEP_WORKERS][2], "8");
    CHECK_EQ(dp_sweep_grid_set(&g, "--LR_Policy", "fixed,staleness", err), 0);
    CHECK_EQ(g.n[DP_SWEEP_LR_POLICY], 2);
    CHECK_EQ(dp_sweep_grid_set(&g, "seeds", "5,6", err), 0);
    CHECK_EQ(dp_sweep_grid_seeds(&g), 2);
    /* A setting replaces what the key held. */
    CHECK_EQ(dp_sweep_grid_set(&g, "workers", "3", err), 0);
    CHECK_EQ(g.n[DP_SWEEP_WORKERS], 1);
    CHECK_EQ(dp_sweep_grid_configs(&g), 2);
    dp_sweep_grid_fini(&g);

    /* A file: comments, blank lines, CRLF endings, '=' inside args. */
    CHECK_EQ(s_load(&g, "# a sweep\r\n\r\n  mode = sync, ssp  # two\r\nargs = --lr=0.1 --steps 5\r\n"
                        "targets = 0.5\r\n   \r\n", err), 0);
    CHECK_EQ(g.n[DP_SWEEP_MODE], 2);
    CHECK_STR(g.value[DP_SWEEP_MODE][1], "ssp");
    CHECK_STR(g.args, "--lr=0.1 --steps 5");
    CHECK_EQ(g.n_target, 1);
    CHECK_NEAR(g.target[0], 0.5, 0);
    dp_sweep_grid_fini(&g);
    CHECK_EQ(s_load(&g, "", err), 0); /* an empty file: the defaults */
    CHECK_EQ(dp_sweep_grid_configs(&g), 1);
    dp_sweep_grid_fini(&g);
}

static void test_empty_values(void)
{
    s_set_refused("mode", "", "mode: an empty value");
    s_set_refused("mode", ",", "mode: an empty value");
    s_set_refused("workers", "2,", "workers: an empty value in '2,'");
    s_set_refused("workers", ",2", "workers: an empty value");
    s_set_refused("lr", "0.1, ,0.2", "lr: an empty value");
    s_set_refused("targets", "0.5,,0.6", "targets: an empty value");
    s_refused("lr =\n", "'lr' has no value", 1);
    s_refused("mode = sync\nlr =   # later\n", "'lr' has no value", 2);
    s_refused("= 0.1\n", "a value without a key", 1);
    s_refused("mode = sync\n\n\nworkers = 2,,4\n", "workers: an empty value", 4);

    /* A refused list leaves nothing of itself behind. */
    dp_sweep_grid_t g;
    dp_sweep_grid_init(&g);
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_sweep_grid_set(&g, "lr", "0.1,0.2,", err), -1);
    CHECK_EQ(g.n[DP_SWEEP_LR], 0);
    CHECK(g.value[DP_SWEEP_LR][0] == NULL);
    dp_sweep_grid_fini(&g);
}

/* A key twice, under any of its spellings, and a value twice in a list
 * (two runs of one configuration, one table row under two names): slips. */
static void test_duplicates(void)
{
    s_refused("lr = 0.1\nlr = 0.2\n", "'lr' is given twice", 2);
    s_refused("lr_policy = fixed\nlr-policy = staleness\n", "is given twice", 2);
    s_refused("Mode = sync\nmode = async\n", "is given twice", 2);
    s_refused("seed = 1\nseeds = 2\n", "is given twice", 2);
    s_refused("targets = 0.5\ntargets = 0.6\n", "'targets' is given twice", 2);
    s_set_refused("workers", "2, 4, 2", "workers: '2' is listed twice");
    s_set_refused("lr", "0.1, 0.10", "lr: '0.10' is listed twice");
    s_set_refused("mode", "sync,sync", "mode: 'sync' is listed twice");
    s_set_refused("seed", "7,7", "seed: '7' is listed twice");
    s_refused("mode = sync\nstraggler = none, 3:50, 3:50\n", "straggler: '3:50' is listed twice", 2);
}

static void test_bad_keys_and_values(void)
{
    s_refused("speed = 3\n", "unknown key 'speed'", 1);
    s_refused("mode = sync\nmode async\n", "expected 'key = value, value, ...', got 'mode async'", 2);
    s_set_refused("", "1", "unknown key ''");
    s_set_refused("--", "1", "unknown key '--'");
    s_set_refused("mode-", "sync", "unknown key 'mode-'");
    char key[200];
    memset(key, 'm', sizeof key - 1);
    key[sizeof key - 1] = 0;
    s_set_refused(key, "1", "unknown key 'mmmm");

    s_set_refused("mode", "Sync", "mode 'Sync': expected sync, async, ssp or standalone");
    s_set_refused("workers", "0", "workers '0'");
    s_set_refused("workers", "65", "workers '65'");
    s_set_refused("workers", "2abc", "workers '2abc'");
    s_set_refused("staleness", "-1", "staleness '-1'");
    s_set_refused("lr", "0", "lr '0': expected a number above 0");
    s_set_refused("lr", "nan", "lr 'nan'");
    s_set_refused("lr", "inf", "lr 'inf'");
    s_set_refused("momentum", "1.5", "momentum '1.5'");
    s_set_refused("lr-policy", "adaptive", "lr-policy 'adaptive'");
    s_set_refused("straggler", "3", "straggler '3': expected none or I:MS[:exp]");
    s_set_refused("straggler", "3:", "straggler");
    s_set_refused("straggler", "64:10", "straggler '64'");
    s_set_refused("straggler", "3:50:lin", "straggler '3:50:lin'");
    s_set_refused("compute", "exp", "compute 'exp': expected const:MS");
    s_set_refused("compute", "exp:", "compute");
    s_set_refused("compute", "lognormal:1", "compute 'lognormal:1'");
    s_set_refused("seed", "18446744073709551616", "seed '18446744073709551616'");
    s_set_refused("seed", "-1", "seed '-1'");
    s_set_refused("cluster", "sims", "cluster 'sims': expected local or sim");
    s_set_refused("targets", "1.5", "targets '1.5'");
    s_set_refused("eval-every", "-1", "eval-every '-1'");
    s_set_refused("eval-limit", "ten", "eval-limit 'ten'");

    /* Not a grid file at all. */
    dp_sweep_grid_t g;
    dp_sweep_grid_init(&g);
    char err[DP_ERR_LEN] = "";
    const char *path = s_file("mode = sync\0\n", 13);
    CHECK_EQ(dp_sweep_grid_load(&g, path, err), -1);
    CHECK(strstr(err, "not a text file") != NULL);
    unlink(path);
    CHECK_EQ(dp_sweep_grid_load(&g, "/nonexistent/grid.txt", err), -1);
    CHECK(strstr(err, "grid file /nonexistent/grid.txt") != NULL);
    dp_sweep_grid_fini(&g);
}

/* DP_SWEEP_VALUES per axis; the most configurations they allow are counted
 * exactly (no overflow) and every index maps back to its own pick. */
static void test_huge(void)
{
    char list[DP_SWEEP_VALUES + 1][16 * (DP_SWEEP_VALUES + 1)];
    dp_sweep_grid_t g;
    dp_sweep_grid_init(&g);
    char err[DP_ERR_LEN] = "";
    const char *fmt[DP_SWEEP_N_AXES] = {
        [DP_SWEEP_WORKERS] = "%d", [DP_SWEEP_STALENESS] = "%d", [DP_SWEEP_LR] = "0.%03d",
        [DP_SWEEP_MOMENTUM] = "0.%02d", [DP_SWEEP_REPLICAS] = "%d", [DP_SWEEP_STRAGGLER] = "%d:5",
        [DP_SWEEP_COMPUTE] = "const:%d", [DP_SWEEP_SEED] = "%d",
    };
    for (int a = 0; a < DP_SWEEP_N_AXES; a++) {
        if (!fmt[a]) continue;
        char *l = list[a];
        size_t used = 0;
        l[0] = 0;
        for (int v = 1; v <= DP_SWEEP_VALUES; v++) {
            used += (size_t)snprintf(l + used, sizeof list[a] - used, "%s", v > 1 ? "," : "");
            used += (size_t)snprintf(l + used, sizeof list[a] - used, fmt[a],
                                     a == DP_SWEEP_STALENESS || a == DP_SWEEP_STRAGGLER ? v - 1 : v);
        }
        CHECK_EQ(dp_sweep_grid_set(&g, dp_sweep_axis_name(a), l, err), 0);
        CHECK_EQ(g.n[a], DP_SWEEP_VALUES);
        if (err[0]) fprintf(stderr, "    %s: %s\n", dp_sweep_axis_name(a), err);
    }
    CHECK_EQ(dp_sweep_grid_set(&g, "mode", "sync,async,ssp,standalone", err), 0);
    CHECK_EQ(dp_sweep_grid_set(&g, "lr-policy", "fixed,staleness", err), 0);
    long want = 4 * 2;
    for (int i = 0; i < 7; i++) want *= DP_SWEEP_VALUES;
    CHECK_EQ(dp_sweep_grid_configs(&g), want);
    CHECK_EQ(dp_sweep_grid_seeds(&g), DP_SWEEP_VALUES);
    int pick[DP_SWEEP_N_AXES];
    /* The last configuration: every axis at its last value (a standalone
     * one, so a duplicate of the standalone first: skipped). */
    CHECK_EQ(dp_sweep_grid_pick(&g, want - 1, pick), 0);
    CHECK_EQ(pick[DP_SWEEP_MODE], 3);
    CHECK_EQ(pick[DP_SWEEP_LR_POLICY], 1);
    CHECK_EQ(pick[DP_SWEEP_COMPUTE], DP_SWEEP_VALUES - 1);
    CHECK_EQ(pick[DP_SWEEP_SEED], 0);
    /* The last one of ssp: taken, the mode varying slowest. */
    CHECK_EQ(dp_sweep_grid_pick(&g, want / 4 * 3 - 1, pick), 1);
    CHECK_EQ(pick[DP_SWEEP_MODE], 2);
    CHECK_STR(dp_sweep_grid_value(&g, pick, DP_SWEEP_STRAGGLER), "31:5");
    CHECK_EQ(dp_sweep_grid_pick(&g, want / 4 * 3, pick), 1); /* standalone's first */
    CHECK_EQ(pick[DP_SWEEP_MODE], 3);
    char label[1024];
    dp_sweep_grid_label(&g, pick, label, sizeof label);
    CHECK_STR(label, "mode=standalone lr=0.001 momentum=0.01");

    /* One value past the limit: refused, naming the axis. */
    char *l = list[DP_SWEEP_VALUES];
    size_t used = 0;
    for (int v = 1; v <= DP_SWEEP_VALUES + 1; v++)
        used += (size_t)snprintf(l + used, sizeof list[0] - used, "%s%d", v > 1 ? "," : "", v);
    CHECK_EQ(dp_sweep_grid_set(&g, "seed", l, err), -1);
    CHECK(strstr(err, "seed: more than 32 values") != NULL);
    CHECK_EQ(g.n[DP_SWEEP_SEED], 0);
    dp_sweep_grid_fini(&g);

    /* A file of a million comment lines, then a line 64 KiB long. */
    size_t n = 1000000 * 2 + 80000;
    char *text = dp_malloc(n + 1);
    size_t at = 0;
    for (int i = 0; i < 1000000; i++) text[at++] = '#', text[at++] = '\n';
    at += (size_t)snprintf(text + at, n + 1 - at, "args = ");
    while (at < n - 1) text[at++] = 'x';
    text[at++] = '\n';
    text[at] = 0;
    CHECK_EQ(s_load(&g, text, err), 0);
    CHECK(g.args && strlen(g.args) > 60000);
    dp_sweep_grid_fini(&g);
    text[0] = 'Z'; /* line 1 is now "Z": refused with its number */
    CHECK_EQ(s_load(&g, text, err), -1);
    CHECK(strstr(err, ".txt:1: expected 'key = value") != NULL);
    dp_sweep_grid_fini(&g);
    free(text);
}

/* The model is an axis: presets and specs (no commas in either), each
 * run's command carrying it as one --model argument; a spec the grammar
 * refuses is refused at load, naming the token. */
static int s_has(const dp_sweep_cmd_t *c, const char *flag, const char *value)
{
    for (int i = 0; i + 1 < c->argc; i++)
        if (strcmp(c->argv[i], flag) == 0 && strcmp(c->argv[i + 1], value) == 0) return 1;
    return 0;
}

/* A grid of two configurations from text; config 1 picked, its label
 * checked. */
static void s_two_configs(dp_sweep_grid_t *g, const char *text, const char *label1, int *pick)
{
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(s_load(g, text, err), 0);
    if (err[0]) fprintf(stderr, "    %s\n", err);
    CHECK_EQ(dp_sweep_grid_configs(g), 2);
    CHECK_EQ(dp_sweep_grid_pick(g, 1, pick), 1);
    char label[256];
    dp_sweep_grid_label(g, pick, label, sizeof label);
    CHECK_STR(label, label1);
}

static void test_model_axis(void)
{
    dp_sweep_grid_t g;
    char err[DP_ERR_LEN] = "";
    int pick[DP_SWEEP_N_AXES];
    s_two_configs(&g, "cluster = sim\nmodel = resnet20, fc:128 relu fc:10 softmax\n",
                  "model=fc:128 relu fc:10 softmax", pick);
    CHECK_EQ(g.n[DP_SWEEP_MODEL], 2);
    CHECK_EQ(dp_sweep_grid_pick(&g, 0, pick), 1);
    dp_sweep_cmd_t cmd;
    CHECK_EQ(dp_sweep_cmd_build(&cmd, &g, pick, "1", "/bin", "/tmp/run", err), 0);
    CHECK(s_has(&cmd, "--model", "resnet20"));
    dp_sweep_grid_fini(&g);
    s_refused("model = resnet20, resnet21\n", "model 'resnet21'", 1);
    s_refused("mode = sync\nmodel = conv3x3:8 frob fc:10 softmax\n", "frob", 2);
}

/* The workers' --precision is an axis (every kind of run: local, sim,
 * standalone carry it); a bad name, and bf16 where this CPU runs no bf16
 * path (without the test hook DP_TEST_BF16=emulated), are refused when
 * the grid is read, not by every run. */
static void test_precision_axis(void)
{
    dp_sweep_grid_t g;
    char err[DP_ERR_LEN] = "", why[DP_ERR_LEN];
    int pick[DP_SWEEP_N_AXES];
    setenv("DP_TEST_BF16", "emulated", 1);
    s_two_configs(&g, "cluster = sim\nprecision = fp32, bf16\n", "precision=bf16", pick);
    dp_sweep_cmd_t cmd;
    for (int k = 0; k < 3; k++) { /* sim, local, standalone */
        if (k) snprintf(g.cluster, sizeof g.cluster, "local");
        if (k == 2) dp_sweep_grid_set(&g, "mode", "standalone", err);
        CHECK_EQ(dp_sweep_grid_pick(&g, 1, pick), 1);
        CHECK_EQ(dp_sweep_cmd_build(&cmd, &g, pick, "1", "/bin", "/tmp/run", err), 0);
        CHECK(s_has(&cmd, "--precision", "bf16"));
    }
    dp_sweep_grid_fini(&g);
    s_set_refused("precision", "fp32, fp16", "'fp16' is not a precision");
    unsetenv("DP_TEST_BF16");
    if (!dp_bf16_ops_native(why)) s_set_refused("precision", "bf16", why);
}

/* Churn is an axis of the simulator's: an elastic crew (workers MIN:MAX)
 * changing by leave:S or kill:S, each run's command carrying --churn;
 * cluster = local refuses it with a line naming --chaos; bad values are
 * refused at load. */
static void test_churn_axis(void)
{
    dp_sweep_grid_t g;
    char err[DP_ERR_LEN] = "";
    int pick[DP_SWEEP_N_AXES];
    s_two_configs(&g, "cluster = sim\nworkers = 2:8\nchurn = none, kill:2\n", "churn=kill:2", pick);
    dp_sweep_cmd_t cmd;
    CHECK_EQ(dp_sweep_cmd_build(&cmd, &g, pick, "1", "/bin", "/tmp/run", err), 0);
    CHECK(s_has(&cmd, "--churn", "kill:2") && s_has(&cmd, "--workers", "2:8"));
    CHECK_EQ(dp_sweep_grid_pick(&g, 0, pick), 1);
    CHECK_EQ(dp_sweep_cmd_build(&cmd, &g, pick, "1", "/bin", "/tmp/run", err), 0);
    int any = 0;
    for (int i = 0; i < cmd.argc; i++) any |= strcmp(cmd.argv[i], "--churn") == 0;
    CHECK(!any); /* none: no flag */
    snprintf(g.cluster, sizeof g.cluster, "local");
    CHECK_EQ(dp_sweep_grid_pick(&g, 1, pick), 1);
    CHECK_EQ(dp_sweep_cmd_build(&cmd, &g, pick, "1", "/bin", "/tmp/run", err), -1);
    CHECK(strstr(err, "churn: a simulated crew's changes need cluster = sim") != NULL);
    dp_sweep_grid_fini(&g);
    s_set_refused("churn", "kill", "churn 'kill': expected none, leave:SECONDS or kill:SECONDS");
    s_set_refused("churn", "leave:0", "churn 'leave:0'");
    s_set_refused("churn", "stay:1", "churn 'stay:1'");
    s_set_refused("workers", "3:2", "workers");
}

/* An actor-critic run's environment and RL flags are axes (env, envs,
 * t-max, entropy, gamma, clip-norm, env-steps; grid keys with '_' too):
 * each run's command carries them, on every kind of cluster and
 * standalone, and no curve flags (an RL run has no test set: the
 * simulator refuses --eval-every with --env); bad values are refused with
 * the key's name. */
static void test_rl_axes(void)
{
    dp_sweep_grid_t g;
    char err[DP_ERR_LEN] = "";
    int pick[DP_SWEEP_N_AXES];
    s_two_configs(&g,
                  "cluster = sim\nenv = cartpole-v1, acrobot-v1\nenvs = 4\nt_max = 20\nentropy = 0.001\n"
                  "gamma = 0.95\nclip-norm = 0\nenv-steps = 3000\n",
                  "env=acrobot-v1", pick);
    dp_sweep_cmd_t cmd;
    CHECK_EQ(dp_sweep_cmd_build(&cmd, &g, pick, "1", "/bin", "/tmp/run", err), 0);
    CHECK(s_has(&cmd, "--env", "acrobot-v1") && s_has(&cmd, "--envs", "4") && s_has(&cmd, "--t-max", "20"));
    CHECK(s_has(&cmd, "--entropy", "0.001") && s_has(&cmd, "--gamma", "0.95") &&
          s_has(&cmd, "--clip-norm", "0") && s_has(&cmd, "--env-steps", "3000"));
    int eval = 0;
    for (int i = 0; i < cmd.argc; i++) eval |= strncmp(cmd.argv[i], "--eval", 6) == 0;
    CHECK(!eval);
    for (int k = 0; k < 2; k++) { /* local, then standalone: the same flags */
        snprintf(g.cluster, sizeof g.cluster, "local");
        if (k) dp_sweep_grid_set(&g, "mode", "standalone", err);
        CHECK_EQ(dp_sweep_grid_pick(&g, 0, pick), 1);
        CHECK_EQ(dp_sweep_cmd_build(&cmd, &g, pick, "1", "/bin", "/tmp/run", err), 0);
        CHECK(s_has(&cmd, "--env", "cartpole-v1") && s_has(&cmd, "--t-max", "20"));
        CHECK(k == 0 || s_has(&cmd, "--standalone", "--no-progress"));
    }
    dp_sweep_grid_fini(&g);
    s_set_refused("env", "cartpole-v1, pong", "env 'pong': no such environment");
    s_set_refused("envs", "0", "envs");
    s_set_refused("t-max", "10001", "t-max");
    s_set_refused("gamma", "1.5", "gamma");
    s_set_refused("entropy", "-1", "entropy");
    s_set_refused("clip_norm", "x", "clip-norm");
    s_set_refused("env-steps", "0", "env-steps");
    s_refused("env = cartpole-v1\nenv_steps = 10\nenv-steps = 20\n", "'env-steps' is given twice", 3);
}

DP_TESTS(T(test_defaults), T(test_model_axis), T(test_precision_axis), T(test_churn_axis), T(test_rl_axes), T(test_spellings), T(test_empty_values), T(test_duplicates),
         T(test_bad_keys_and_values), T(test_huge))
