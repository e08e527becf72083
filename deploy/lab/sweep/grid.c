/* sweep/grid: the grid of `downpour sweep` (see grid.h). Every value
 * is checked here, before anything runs, with the same number parsers as
 * the daemons' flags; what only a daemon can judge (a straggler's index
 * against --workers, say) is judged by the first run, which stops the sweep
 * with the daemon's own line. */
#include "deploy/lab/sweep/grid.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dylu.h"
#include "common/model.h"
#include "common/opts.h"
#include "common/util.h"
#include "deploy/lab/sim.h"
#include "kernels/backend.h"
#include "kernels/optim.h"
#include "proto/compress.h"
#include "server/core/policy.h"
#include "worker/exec/a3c.h"
#include "worker/exec/env/env.h"

static const char *const s_axis[DP_SWEEP_N_AXES] = {
    "mode", "workers", "staleness", "lr", "lr-policy", "delay-lr", "delay-compensation",
    "local-steps", "outer-optimizer", "momentum", "optimizer", "replicas", "straggler", "compute",
    "compress", "error-feedback", "model", "precision", "churn", "env", "envs", "t-max", "entropy", "gamma",
    "reward-scale", "obs-norm", "clip-norm", "env-steps", "seed",
};

/* The axes a standalone run ignores (it has no server). */
static int s_server_axis(int a)
{
    return a == DP_SWEEP_WORKERS || a == DP_SWEEP_STALENESS || a == DP_SWEEP_LR_POLICY ||
           a == DP_SWEEP_DELAY_LR || a == DP_SWEEP_DELAY_COMPENSATION ||
           a == DP_SWEEP_LOCAL_STEPS || a == DP_SWEEP_OUTER_OPTIMIZER ||
           a == DP_SWEEP_REPLICAS || a == DP_SWEEP_STRAGGLER || a == DP_SWEEP_COMPUTE ||
           a == DP_SWEEP_COMPRESS || a == DP_SWEEP_ERROR_FEEDBACK || a == DP_SWEEP_CHURN;
}

const char *dp_sweep_axis_name(int axis)
{
    return axis >= 0 && axis < DP_SWEEP_N_AXES ? s_axis[axis] : "?";
}

void dp_sweep_grid_init(dp_sweep_grid_t *g)
{
    memset(g, 0, sizeof *g);
    snprintf(g->cluster, sizeof g->cluster, "local");
    char err[DP_ERR_LEN];
    dp_sweep_grid_set(g, "mode", "async", err);
    dp_sweep_grid_set(g, "seed", "1", err);
    g->eval_every = 50;
    g->eval_limit = 2000;
    g->n_target = 3;
    g->target[0] = 0.80;
    g->target[1] = 0.85;
    g->target[2] = 0.88;
}

static void s_clear_axis(dp_sweep_grid_t *g, int a)
{
    for (int i = 0; i < g->n[a]; i++) {
        free(g->value[a][i]);
        g->value[a][i] = NULL;
    }
    g->n[a] = 0;
}

void dp_sweep_grid_fini(dp_sweep_grid_t *g)
{
    for (int a = 0; a < DP_SWEEP_N_AXES; a++) s_clear_axis(g, a);
    free(g->args);
    g->args = NULL;
}

/* "lr_policy" and "--lr-policy" are "lr-policy", "seeds" (the flag) is
 * "seed": one name per key, so a file that sets a key twice under two
 * spellings is caught too. */
static void s_norm_key(const char *key, char *out, size_t n)
{
    while (*key == '-') key++;
    size_t i = 0;
    for (; key[i] && i + 1 < n; i++) out[i] = key[i] == '_' ? '-' : (char)tolower((unsigned char)key[i]);
    out[i] = 0;
    if (strcmp(out, "seeds") == 0) snprintf(out, n, "seed");
}

static int s_is_one_of(const char *v, const char *list)
{
    size_t len = strlen(v);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == len && strncmp(p, v, l) == 0) return 1;
        p += l + (bar != NULL);
    }
    return 0;
}

/* I:MS or I:MS:exp (or I:FACTOR for the simulator): numbers with colons. */
static int s_check_straggler(const char *flag, const char *v, char *err)
{
    if (strcmp(v, "none") == 0) return 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    char *colon = strchr(buf, ':');
    long idx;
    double ms;
    if (!colon) return dp_err(err, "%s '%s': expected none or I:MS[:exp]", flag, v);
    *colon = 0;
    char *kind = strchr(colon + 1, ':');
    if (kind) *kind++ = 0;
    if (dp_opts_parse_long(flag, buf, 0, 63, &idx, err) != 0 ||
        dp_opts_parse_double(flag, colon + 1, 0, 1e7, &ms, err) != 0)
        return -1;
    if (kind && strcmp(kind, "exp") != 0)
        return dp_err(err, "%s '%s': expected none or I:MS[:exp]", flag, v);
    return 0;
}

static int s_check_compute(const char *flag, const char *v, char *err)
{
    const char *colon = strchr(v, ':');
    size_t k = colon ? (size_t)(colon - v) : 0;
    double x;
    if (colon && ((k == 5 && strncmp(v, "const", 5) == 0) || (k == 3 && strncmp(v, "exp", 3) == 0)) &&
        dp_opts_parse_double(flag, colon + 1, 0, 1e7, &x, err) == 0)
        return 0;
    if (colon && k == 9 && strncmp(v, "lognormal", 9) == 0 && strchr(colon + 1, ':')) return 0;
    return dp_err(err, "%s '%s': expected const:MS, exp:MEAN_MS or lognormal:MU:SIGMA", flag, v);
}

/* none, or what downpour sim --churn takes (its own parser). */
static int s_check_churn(const char *flag, const char *v, char *err)
{
    dp_churn_t c;
    if (strcmp(v, "none") == 0 || dp_churn_parse(&c, v, NULL) == 0) return 0;
    return dp_err(err, "%s '%s': expected none, leave:SECONDS or kill:SECONDS", flag, v);
}

/* One value of axis a. */
static int s_check_value(int a, const char *v, char *err)
{
    char flag[32];
    snprintf(flag, sizeof flag, "%s", s_axis[a]);
    long l;
    double d;
    uint64_t u;
    switch (a) {
    case DP_SWEEP_MODE:
        return s_is_one_of(v, "sync|async|ssp|standalone")
                   ? 0 : dp_err(err, "mode '%s': expected sync, async, ssp or standalone", v);
    case DP_SWEEP_WORKERS: { /* N, or MIN:MAX an elastic crew */
        int lo, hi;
        return dp_opts_parse_crew(flag, v, 64, &lo, &hi, err);
    }
    case DP_SWEEP_STALENESS: return dp_opts_parse_long(flag, v, 0, 1000000, &l, err);
    case DP_SWEEP_REPLICAS: return dp_opts_parse_long(flag, v, 1, 64, &l, err);
    case DP_SWEEP_LR:
        if (dp_opts_parse_double(flag, v, 0, 100, &d, err) != 0) return -1;
        return d > 0 ? 0 : dp_err(err, "lr '%s': expected a number above 0", v);
    case DP_SWEEP_MOMENTUM: return dp_opts_parse_double(flag, v, 0, 1, &d, err);
    case DP_SWEEP_OPTIMIZER: {
        dp_optim_conf_t o;
        dp_optim_conf_default(&o);
        return dp_optim_parse_kind(&o, v, err);
    }
    case DP_SWEEP_DELAY_LR: {
        int kind;
        float k;
        return dp_delay_lr_parse(v, &kind, &k, err);
    }
    case DP_SWEEP_DELAY_COMPENSATION: {
        dp_optim_conf_t o;
        dp_optim_conf_default(&o);
        return dp_optim_parse_dc(&o, v, err);
    }
    case DP_SWEEP_LOCAL_STEPS: {
        int dylu;
        return dp_dylu_parse(v, &l, &dylu, err);
    }
    case DP_SWEEP_OUTER_OPTIMIZER: {
        dp_optim_conf_t o;
        return dp_optim_outer(v, 0, 0.9f, 2, &o, err);
    }
    case DP_SWEEP_LR_POLICY:
        return s_is_one_of(v, "fixed|staleness")
                   ? 0 : dp_err(err, "lr-policy '%s': expected fixed or staleness", v);
    case DP_SWEEP_STRAGGLER: return s_check_straggler(flag, v, err);
    case DP_SWEEP_COMPUTE: return s_check_compute(flag, v, err);
    case DP_SWEEP_CHURN: return s_check_churn(flag, v, err);
    case DP_SWEEP_COMPRESS: {
        dp_compress_conf_t z = {0};
        return dp_compress_parse(v, &z, err);
    }
    case DP_SWEEP_ERROR_FEEDBACK: {
        int on;
        return dp_compress_ef_parse(v, &on, err);
    }
    case DP_SWEEP_MODEL: {
        /* The grammar, at an input large enough for any spec that fits a
         * smaller one (the runs' data may be 1x28x28 or 3x32x32): a typo
         * is refused here, a spec too deep for the data by the run. */
        dp_model_t *m = dp_malloc(sizeof *m);
        char e[DP_ERR_LEN], spec[DP_MODEL_SPEC_LEN];
        /* A bare "ac" takes its actions from the run's env (the run
         * refuses a model its env does not fit): any count checks the grammar. */
        size_t len = strlen(v);
        int bare_ac = len >= 2 && strcmp(v + len - 2, "ac") == 0 && (len == 2 || v[len - 3] == ' ');
        snprintf(spec, sizeof spec, "%s%s", v, bare_ac ? ":2" : "");
        int rc = dp_model_parse(m, spec, 3, 224, 224, e);
        free(m);
        return rc == 0 ? 0 : dp_err(err, "model '%s': %s", v, e);
    }
    case DP_SWEEP_PRECISION: { /* one this host's CPU runs: else every such run would fail */
        dp_precision_t p;
        char e[DP_ERR_LEN];
        if (dp_precision_parse(v, &p, e) != 0) return dp_err(err, "%s: %s", flag, e);
        return dp_precision_check("cpu", p, err);
    }
    case DP_SWEEP_ENV: { /* the environments downpour-worker --env knows */
        char e[DP_ERR_LEN];
        return dp_env_find(v, e) ? 0 : dp_err(err, "env '%s': %s", v, e);
    }
    case DP_SWEEP_ENVS: return dp_opts_parse_long(flag, v, 1, DP_A3C_MAX_ENVS, &l, err);
    case DP_SWEEP_T_MAX: return dp_opts_parse_long(flag, v, 1, DP_A3C_MAX_T, &l, err);
    case DP_SWEEP_ENTROPY: return dp_opts_parse_double(flag, v, 0, 100, &d, err);
    case DP_SWEEP_GAMMA: return dp_opts_parse_double(flag, v, 0, 1, &d, err);
    case DP_SWEEP_REWARD_SCALE: return dp_opts_parse_double(flag, v, 1e-6, 1e6, &d, err);
    case DP_SWEEP_OBS_NORM:
        return strcmp(v, "on") == 0 || strcmp(v, "off") == 0 ? 0 : dp_err(err, "%s: '%s' is not on or off", flag, v);
    case DP_SWEEP_CLIP_NORM: return dp_opts_parse_double(flag, v, 0, 1e9, &d, err);
    case DP_SWEEP_ENV_STEPS: return dp_opts_parse_long(flag, v, 1, 1000000000000L, &l, err);
    case DP_SWEEP_SEED: return dp_opts_parse_u64(flag, v, &u, err);
    }
    return dp_err(err, "no axis %d", a);
}

/* Split "a, b ,c" on commas into trimmed pieces; calls fn on each. */
static int s_each_item(const char *key, const char *list, int (*fn)(void *, const char *, char *),
                       void *arg, char *err)
{
    char *copy = dp_strdup(list), *p = copy;
    int rc = 0, count = 0;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        while (isspace((unsigned char)*p)) p++;
        char *end = p + strlen(p);
        while (end > p && isspace((unsigned char)end[-1])) *--end = 0;
        if (!*p) {
            rc = dp_err(err, "%s: an empty value in '%s'", key, list);
            break;
        }
        if ((rc = fn(arg, p, err)) != 0) break;
        count++;
        if (!comma) break;
        p = comma + 1;
    }
    free(copy);
    return rc;
}

typedef struct {
    dp_sweep_grid_t *g;
    int axis;
} s_axis_arg_t;

/* The same value: the same text, or the same number ("0.1" and "0.10"). */
static int s_same_value(const char *a, const char *b)
{
    if (strcmp(a, b) == 0) return 1;
    char *ea, *eb;
    double da = strtod(a, &ea), db = strtod(b, &eb);
    return ea != a && !*ea && eb != b && !*eb && da == db;
}

static int s_add_axis_value(void *arg, const char *v, char *err)
{
    s_axis_arg_t *x = arg;
    if (x->g->n[x->axis] >= DP_SWEEP_VALUES)
        return dp_err(err, "%s: more than %d values", s_axis[x->axis], DP_SWEEP_VALUES);
    if (s_check_value(x->axis, v, err) != 0) return -1;
    /* A value listed twice would run one configuration twice, reported as
     * two rows: most likely a slip, as a key given twice is. */
    for (int i = 0; i < x->g->n[x->axis]; i++)
        if (s_same_value(x->g->value[x->axis][i], v))
            return dp_err(err, "%s: '%s' is listed twice", s_axis[x->axis], v);
    x->g->value[x->axis][x->g->n[x->axis]++] = dp_strdup(v);
    return 0;
}

static int s_add_target(void *arg, const char *v, char *err)
{
    dp_sweep_grid_t *g = arg;
    double d;
    if (g->n_target >= DP_SWEEP_TARGETS)
        return dp_err(err, "targets: more than %d values", DP_SWEEP_TARGETS);
    if (dp_opts_parse_double("targets", v, 0, 1, &d, err) != 0) return -1;
    g->target[g->n_target++] = d;
    return 0;
}

/* The settings that are not axes; 1 when key is none of them. */
static int s_set_setting(dp_sweep_grid_t *g, const char *key, const char *list, char *err)
{
    if (strcmp(key, "cluster") == 0) {
        if (!s_is_one_of(list, "local|sim"))
            return dp_err(err, "cluster '%s': expected local or sim", list);
        snprintf(g->cluster, sizeof g->cluster, "%s", list);
        return 0;
    }
    if (strcmp(key, "args") == 0) {
        free(g->args);
        g->args = dp_strdup(list);
        return 0;
    }
    if (strcmp(key, "eval-every") == 0)
        return dp_opts_parse_long("eval-every", list, 0, 1000000000L, &g->eval_every, err);
    if (strcmp(key, "eval-limit") == 0) {
        long l;
        if (dp_opts_parse_long("eval-limit", list, 0, 1000000000L, &l, err) != 0) return -1;
        g->eval_limit = (int)l;
        return 0;
    }
    if (strcmp(key, "targets") == 0) {
        g->n_target = 0;
        return s_each_item("targets", list, s_add_target, g, err);
    }
    return 1;
}

int dp_sweep_grid_set(dp_sweep_grid_t *g, const char *key_in, const char *list, char *err)
{
    char key[32];
    s_norm_key(key_in, key, sizeof key);
    for (int a = 0; a < DP_SWEEP_N_AXES; a++) {
        if (strcmp(key, s_axis[a]) != 0) continue;
        s_clear_axis(g, a);
        s_axis_arg_t x = {g, a};
        if (s_each_item(key, list, s_add_axis_value, &x, err) == 0) return 0;
        s_clear_axis(g, a);
        return -1;
    }
    int rc = s_set_setting(g, key, list, err);
    if (rc <= 0) return rc;
    char keys[600] = ""; /* the axes, from their one table, then the settings */
    size_t at = 0;
    for (int a = 0; a < DP_SWEEP_N_AXES && at < sizeof keys; a++)
        at += (size_t)snprintf(keys + at, sizeof keys - at, "%s, ", s_axis[a]);
    return dp_err(err, "unknown key '%s' (%scluster, args, eval-every, eval-limit, targets)", key_in,
                  keys);
}

typedef struct {
    char key[DP_SWEEP_N_AXES + 8][32]; /* the keys a file has set so far (axes and settings) */
    int n;
} s_seen_t;

/* One line of a grid file: blank, a comment or "key = list". */
static int s_load_line(dp_sweep_grid_t *g, char *line, s_seen_t *seen, char *err)
{
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *p = line;
    while (isspace((unsigned char)*p)) p++;
    char *end = p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1])) *--end = 0;
    if (!*p) return 0;
    char *eq = strchr(p, '=');
    if (!eq) return dp_err(err, "expected 'key = value, value, ...', got '%s'", p);
    char *k_end = eq;
    while (k_end > p && isspace((unsigned char)k_end[-1])) k_end--;
    *k_end = 0;
    char *v = eq + 1;
    while (isspace((unsigned char)*v)) v++;
    if (!*p) return dp_err(err, "a value without a key");
    if (!*v) return dp_err(err, "'%s' has no value", p);
    /* A key given twice is most likely a slip in an edited file. */
    char key[32];
    s_norm_key(p, key, sizeof key);
    for (int i = 0; i < seen->n; i++)
        if (strcmp(seen->key[i], key) == 0) return dp_err(err, "'%s' is given twice", p);
    if (dp_sweep_grid_set(g, p, v, err) != 0) return -1;
    if (seen->n < (int)(sizeof seen->key / sizeof seen->key[0])) snprintf(seen->key[seen->n++], sizeof seen->key[0], "%s", key);
    return 0;
}

int dp_sweep_grid_load(dp_sweep_grid_t *g, const char *path, char *err)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    char e[DP_ERR_LEN] = "";
    if (dp_read_file(path, &buf, &len, e) != 0) return dp_err(err, "grid file %s", e);
    if (memchr(buf, 0, len)) {
        free(buf);
        return dp_err(err, "%s: not a text file", path);
    }
    char *text = dp_malloc(len + 1);
    memcpy(text, buf, len);
    text[len] = 0;
    free(buf);
    s_seen_t seen = {.n = 0};
    int rc = 0, lineno = 0;
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        if (s_load_line(g, line, &seen, e) != 0) {
            rc = dp_err(err, "%s:%d: %s", path, lineno, e);
            break;
        }
    }
    free(text);
    return rc;
}

const char *dp_sweep_grid_value(const dp_sweep_grid_t *g, const int *pick, int axis)
{
    return g->n[axis] ? g->value[axis][pick[axis]] : NULL;
}

long dp_sweep_grid_configs(const dp_sweep_grid_t *g)
{
    long n = 1;
    for (int a = 0; a < DP_SWEEP_N_AXES; a++)
        if (a != DP_SWEEP_SEED && g->n[a] > 1) n *= g->n[a];
    return n;
}

int dp_sweep_grid_pick(const dp_sweep_grid_t *g, long config, int *pick)
{
    memset(pick, 0, sizeof(int) * DP_SWEEP_N_AXES);
    for (int a = DP_SWEEP_N_AXES - 1; a >= 0; a--) {
        if (a == DP_SWEEP_SEED || g->n[a] <= 1) continue;
        pick[a] = (int)(config % g->n[a]);
        config /= g->n[a];
    }
    const char *mode = dp_sweep_grid_value(g, pick, DP_SWEEP_MODE);
    if (mode && strcmp(mode, "standalone") == 0)
        for (int a = 0; a < DP_SWEEP_N_AXES; a++)
            if (s_server_axis(a) && pick[a] != 0) return 0;
    return 1;
}

int dp_sweep_grid_seeds(const dp_sweep_grid_t *g)
{
    return g->n[DP_SWEEP_SEED] ? g->n[DP_SWEEP_SEED] : 1;
}

void dp_sweep_grid_label(const dp_sweep_grid_t *g, const int *pick, char *out, size_t n)
{
    int varies = 0;
    for (int a = 0; a < DP_SWEEP_SEED; a++) varies |= g->n[a] > 1;
    const char *mode = dp_sweep_grid_value(g, pick, DP_SWEEP_MODE);
    int standalone = mode && strcmp(mode, "standalone") == 0;
    size_t used = 0;
    out[0] = 0;
    for (int a = 0; a < DP_SWEEP_SEED && used < n; a++) {
        if (!g->n[a] || (varies && g->n[a] < 2) || (standalone && s_server_axis(a))) continue;
        used += (size_t)snprintf(out + used, n - used, "%s%s=%s", used ? " " : "", s_axis[a],
                                 g->value[a][pick[a]]);
    }
}
