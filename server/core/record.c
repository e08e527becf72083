/* record: writing and reading a run's schedule (see record.h). */
#include "server/core/record.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/util.h"

#define S_BUF (64 * 1024) /* lines are written in chunks of this size */

struct dp_record {
    dp_atomic_t file;      /* PATH.tmp.XXXXXX until close renames it to PATH */
    char *buf;             /* lines not yet written (S_BUF bytes) */
    size_t len;
    uint64_t hash;         /* FNV-1a of every byte written */
    uint64_t events;
    char failed[DP_ERR_LEN]; /* the first write that failed ("" none): close reports it */
    char last[4096];       /* the member state last written ("" none); one shard per writer */
    int account;           /* the next push carries this account (dp_record_account): */
    uint64_t env_steps, episodes;
    double returns;
    uint64_t round_h;      /* the next push is a DyLU round of this many data steps (0: none) */
};

static void s_flush(dp_record_t *r)
{
    if (r->len && !r->failed[0]) dp_atomic_write(&r->file, r->buf, r->len, r->failed);
    r->len = 0;
}

static void s_line(dp_record_t *r, cJSON *o)
{
    char *text = cJSON_PrintUnformatted(o);
    size_t len = strlen(text);
    text = dp_realloc(text, len + 2);
    text[len++] = '\n';
    r->hash = dp_fnv1a(r->hash, text, len);
    if (r->len + len > S_BUF) s_flush(r);
    if (len > S_BUF) {
        if (!r->failed[0]) dp_atomic_write(&r->file, text, len, r->failed);
    } else {
        memcpy(r->buf + r->len, text, len);
        r->len += len;
    }
    free(text);
}

int dp_record_new(dp_record_t **out, const char *path, const cJSON *header, char *err)
{
    *out = NULL;
    dp_record_t *r = dp_calloc(1, sizeof *r);
    char e2[DP_ERR_LEN];
    if (dp_atomic_open(&r->file, path, 0644, e2) != 0) {
        dp_err(err, "--record %s", e2);
        free(r);
        return -1;
    }
    r->buf = dp_malloc(S_BUF);
    r->hash = DP_FNV_SEED;
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "downpour_record", DP_RECORD_VERSION);
    const cJSON *it;
    cJSON_ArrayForEach(it, header)
        if (strcmp(it->string, "downpour_record") != 0)
            cJSON_AddItemToObject(h, it->string, cJSON_Duplicate(it, 1));
    s_line(r, h);
    cJSON_Delete(h);
    *out = r;
    return 0;
}

static const char *s_status_name(int st)
{
    return st == DP_PUSH_APPLIED ? "applied" : st == DP_PUSH_DROPPED ? "dropped" : "rejected";
}

/* A double as the 17 significant digits that read back as the same bits
 * (cJSON prints 15 when they compare equal within its epsilon, which would
 * spoil the replay's exact comparison). */
static void s_exact(cJSON *o, const char *key, double v)
{
    if (!isfinite(v)) {
        cJSON_AddNullToObject(o, key);
        return;
    }
    char text[40];
    snprintf(text, sizeof text, "%.17g", v);
    cJSON_AddRawToObject(o, key, text);
}

void dp_record_event(dp_record_t *r, const dp_rec_event_t *e)
{
    if (!r) return;
    cJSON *o = cJSON_CreateObject();
    if (e->kind == DP_REC_PUSH) {
        cJSON_AddStringToObject(o, "e", "push");
        cJSON_AddNumberToObject(o, "s", e->shard);
        cJSON_AddNumberToObject(o, "w", e->worker);
        cJSON_AddNumberToObject(o, "step", (double)e->step);
        cJSON_AddNumberToObject(o, "v", (double)e->version);
        cJSON_AddStringToObject(o, "st", s_status_name(e->status));
        cJSON_AddNumberToObject(o, "stale", (double)e->staleness);
        cJSON_AddNumberToObject(o, "after", (double)e->after);
        s_exact(o, "lr", e->lr);
        s_exact(o, "gn", e->grad_norm);
        s_exact(o, "un", e->update_norm);
        if (e->dc >= 0) cJSON_AddNumberToObject(o, "dc", e->dc);
        if (e->dealt) {
            cJSON_AddNumberToObject(o, "be", (double)e->batch.epoch);
            cJSON_AddNumberToObject(o, "bi", (double)e->batch.index);
        }
        if (e->h) cJSON_AddNumberToObject(o, "h", (double)e->h);
        if (e->account) {
            cJSON_AddNumberToObject(o, "es", (double)e->env_steps);
            cJSON_AddNumberToObject(o, "ne", (double)e->episodes);
            s_exact(o, "er", e->returns);
        }
    } else if (e->kind == DP_REC_ROWS_PULL) {
        cJSON_AddStringToObject(o, "e", "rpull");
        cJSON_AddNumberToObject(o, "s", e->shard);
        cJSON_AddNumberToObject(o, "w", e->worker);
        cJSON_AddNumberToObject(o, "v", (double)e->version);
        cJSON_AddNumberToObject(o, "n", (double)e->keys);
    } else if (e->kind == DP_REC_ROWS) {
        cJSON_AddStringToObject(o, "e", "rows");
        cJSON_AddNumberToObject(o, "s", e->shard);
        cJSON_AddNumberToObject(o, "w", e->worker);
        cJSON_AddNumberToObject(o, "step", (double)e->step);
        cJSON_AddNumberToObject(o, "v", (double)e->version);
        cJSON_AddStringToObject(o, "st", s_status_name(e->status));
        cJSON_AddNumberToObject(o, "stale", (double)e->staleness);
        cJSON_AddNumberToObject(o, "n", (double)e->keys);
        if (e->grad_norm >= 0) s_exact(o, "gn", e->grad_norm);
    } else {
        cJSON_AddStringToObject(o, "e", "members");
        cJSON_AddNumberToObject(o, "s", e->shard);
        cJSON_AddStringToObject(o, "m", e->members);
        cJSON_AddNumberToObject(o, "call", e->call);
    }
    s_line(r, o);
    cJSON_Delete(o);
    r->events++;
}

/* Write the member state when it differs from the last one written (or
 * always with call). */
static void s_members(dp_record_t *r, int shard, const dp_members_t *m, int call)
{
    char state[sizeof r->last];
    int n = m->n < (int)sizeof state - 1 ? m->n : (int)sizeof state - 1;
    for (int i = 0; i < n; i++)
        state[i] = m->w[i].finished ? (m->w[i].left ? 'X' : 'F') : m->w[i].gone ? 'G' : 'L';
    state[n] = 0;
    if (!call && strcmp(state, r->last) == 0) return;
    snprintf(r->last, sizeof r->last, "%s", state);
    dp_rec_event_t e = {.kind = DP_REC_MEMBERS, .shard = shard, .members = state, .call = call};
    dp_record_event(r, &e);
}

void dp_record_push(dp_record_t *r, int shard, int worker, uint64_t step, uint64_t version,
                    const dp_push_outcome_t *o, uint64_t after, const dp_members_t *m,
                    const dp_deal_batch_t *batch)
{
    if (!r) return;
    if (m) s_members(r, shard, m, 0);
    dp_rec_event_t e = {
        .kind = DP_REC_PUSH, .shard = shard, .worker = worker, .step = step, .version = version,
        .status = o->status, .staleness = o->staleness, .after = after, .lr = o->lr,
        .grad_norm = o->grad_norm, .update_norm = o->update_norm, .dc = o->compensated,
        .dealt = batch != NULL, .batch = batch ? *batch : (dp_deal_batch_t){0, 0},
        .account = r->account, .env_steps = r->env_steps, .episodes = r->episodes,
        .returns = r->returns, .h = r->round_h,
    };
    r->account = 0;
    r->round_h = 0;
    dp_record_event(r, &e);
}

void dp_record_rows_pull(dp_record_t *r, int shard, int worker, uint64_t version, uint64_t n)
{
    if (!r) return;
    dp_rec_event_t e = {.kind = DP_REC_ROWS_PULL, .shard = shard, .worker = worker,
                        .version = version, .keys = n};
    dp_record_event(r, &e);
}

double dp_record_rows_norm(const void *g, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, (const char *)g + i * sizeof v, sizeof v); /* a wire frame need not be aligned */
        sum += (double)v * (double)v;
    }
    return sqrt(sum);
}

void dp_record_rows_push(dp_record_t *r, int shard, int worker, uint64_t step, uint64_t version,
                         const dp_push_outcome_t *o, uint64_t n, const void *g, int width)
{
    if (!r) return;
    dp_rec_event_t e = {.kind = DP_REC_ROWS, .shard = shard, .worker = worker, .step = step,
                        .version = version, .status = o->status, .staleness = o->staleness,
                        .keys = n, .grad_norm = g ? dp_record_rows_norm(g, n * (size_t)width) : -1};
    dp_record_event(r, &e);
}

void dp_record_round(dp_record_t *r, uint64_t h)
{
    if (r) r->round_h = h;
}

void dp_record_account(dp_record_t *r, uint64_t env_steps, uint64_t episodes, double returns)
{
    if (!r) return;
    r->account = 1;
    r->env_steps = env_steps;
    r->episodes = episodes;
    r->returns = returns;
}

void dp_record_members(dp_record_t *r, int shard, const dp_members_t *m)
{
    if (r) s_members(r, shard, m, 1);
}

static void s_free(dp_record_t *r)
{
    free(r->buf);
    free(r);
}

int dp_record_close(dp_record_t **r_p, char *err)
{
    if (!r_p || !*r_p) return 0;
    dp_record_t *r = *r_p;
    *r_p = NULL;
    cJSON *o = cJSON_CreateObject();
    char hex[24];
    snprintf(hex, sizeof hex, "%016" PRIx64, r->hash);
    cJSON_AddStringToObject(o, "end", "downpour_record");
    cJSON_AddNumberToObject(o, "events", (double)r->events);
    cJSON_AddStringToObject(o, "fnv1a", hex);
    s_line(r, o);
    cJSON_Delete(o);
    s_flush(r);
    int rc = 0;
    char e2[DP_ERR_LEN];
    if (r->failed[0]) {
        dp_atomic_abort(&r->file);
        rc = dp_err(err, "--record %s", r->failed);
    } else if (dp_atomic_commit(&r->file, e2) != 0) {
        rc = dp_err(err, "--record %s", e2);
    }
    s_free(r);
    return rc;
}

void dp_record_abandon(dp_record_t **r_p)
{
    if (!r_p || !*r_p) return;
    dp_atomic_abort(&(*r_p)->file);
    s_free(*r_p);
    *r_p = NULL;
}

int dp_record_ps_open(dp_record_t **out, const dp_ps_config_t *cfg, dp_policy_t *policy,
                      const dp_rows_conf_t *rows, char *err)
{
    cJSON *h = cJSON_CreateObject();
    char seed[24], input[48];
    /* a table's record keeps the schedule (staleness, order) but cannot be
     * replayed: replay recomputes gradients with the spec's network */
    cJSON_AddStringToObject(h, "model", cfg->init_path[0] ? DP_MODEL_TABLE_SPEC : cfg->model_spec);
    if (cfg->init_path[0]) cJSON_AddStringToObject(h, "init", cfg->init_path);
    snprintf(input, sizeof input, "%dx%dx%d", cfg->in_c, cfg->in_h, cfg->in_w);
    cJSON_AddStringToObject(h, "input", input);
    snprintf(seed, sizeof seed, "%" PRIu64, cfg->seed);
    cJSON_AddStringToObject(h, "seed", seed);
    cJSON_AddNumberToObject(h, "workers", cfg->num_workers);
    cJSON_AddNumberToObject(h, "shards", cfg->shard_count);
    cJSON_AddNumberToObject(h, "shard", cfg->shard_index);
    cJSON_AddStringToObject(h, "mode", dp_mode_name(cfg->mode));
    cJSON_AddNumberToObject(h, "replicas", policy->conf.replicas);
    dp_record_crew_json(h, cfg->min_workers, policy->conf.replicas_frac);
    cJSON_AddNumberToObject(h, "staleness", cfg->staleness);
    dp_record_delay_json(h, policy->conf.delay_lr, policy->conf.delay_k);
    cJSON_AddItemToObject(h, "optim", dp_record_optim_json(&policy->shard->optim));
    cJSON_AddNumberToObject(h, "start_version", (double)policy->shard->version);
    if (rows) /* the table as the shard runs it: --row-lr and --row-init resolved */
        cJSON_AddItemToObject(h, "rows", dp_record_rows_json(rows, cfg->rows_mode ? cfg->rows_mode : cfg->mode));
    if (policy->shard->version != 0)
        dp_log_warn("shard %d: --record: restored at version %" PRIu64 "; a replay needs a run "
                    "from version 0 and will refuse this record", cfg->shard_index, policy->shard->version);
    int rc = dp_record_new(out, cfg->record, h, err);
    cJSON_Delete(h);
    if (rc == 0) dp_policy_measure(policy);
    return rc;
}

void dp_record_crew_json(cJSON *h, int min_workers, float replicas_frac)
{
    if (min_workers > 0) cJSON_AddNumberToObject(h, "min_workers", min_workers);
    if (replicas_frac > 0) cJSON_AddNumberToObject(h, "replicas_frac", replicas_frac);
}

/* ---- reading ---- */

const char *dp_record_str(const cJSON *h, const char *key)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, key));
}

double dp_record_num(const cJSON *h, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* A whole non-negative number below 2^53 at key, or -1. */
static int s_count(const cJSON *o, const char *key, uint64_t *out)
{
    double v = dp_record_num(o, key, -1);
    if (!(v >= 0) || v != floor(v) || v > 9007199254740992.0) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int s_parse_push(const cJSON *o, dp_rec_event_t *e)
{
    uint64_t shard, worker;
    const char *st = dp_record_str(o, "st");
    if (s_count(o, "s", &shard) || s_count(o, "w", &worker) || s_count(o, "step", &e->step) ||
        s_count(o, "v", &e->version) || s_count(o, "stale", &e->staleness) ||
        s_count(o, "after", &e->after) || !st || shard > 1 << 20 || worker > 1 << 20)
        return -1;
    e->kind = DP_REC_PUSH;
    e->shard = (int)shard;
    e->worker = (int)worker;
    e->status = strcmp(st, "applied") == 0   ? DP_PUSH_APPLIED
                : strcmp(st, "dropped") == 0 ? DP_PUSH_DROPPED
                : strcmp(st, "rejected") == 0 ? DP_PUSH_REJECTED : 0;
    e->lr = dp_record_num(o, "lr", 0);
    e->grad_norm = dp_record_num(o, "gn", -1);
    e->update_norm = dp_record_num(o, "un", -1);
    double dc = dp_record_num(o, "dc", -1);
    if (dc != -1 && dc != 0 && dc != 1) return -1;
    e->dc = (int)dc;
    if (cJSON_GetObjectItemCaseSensitive(o, "be")) {
        if (s_count(o, "be", &e->batch.epoch) || s_count(o, "bi", &e->batch.index)) return -1;
        e->dealt = 1;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, "h") && (s_count(o, "h", &e->h) || e->h < 1 || e->h > 1000000))
        return -1;
    if (cJSON_GetObjectItemCaseSensitive(o, "es")) {
        const cJSON *er = cJSON_GetObjectItemCaseSensitive(o, "er");
        if (s_count(o, "es", &e->env_steps) || s_count(o, "ne", &e->episodes) || !cJSON_IsNumber(er))
            return -1;
        e->returns = er->valuedouble;
        e->account = 1;
    }
    return e->status ? 0 : -1;
}

/* "gn" absent (-1), or a finite number >= 0. */
static int s_norm(const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = -1;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !isfinite(v->valuedouble)) return -1;
    *out = v->valuedouble;
    return 0;
}

/* "rpull" (rows 0) or "rows" (rows 1): every field there, in range. */
static int s_parse_rows(const cJSON *o, dp_rec_event_t *e, int rows)
{
    uint64_t shard, worker;
    if (s_count(o, "s", &shard) || s_count(o, "w", &worker) || s_count(o, "v", &e->version) ||
        s_count(o, "n", &e->keys) || shard > 1 << 20 || worker > 1 << 20)
        return -1;
    e->shard = (int)shard;
    e->worker = (int)worker;
    e->grad_norm = -1;
    if (!rows) {
        e->kind = DP_REC_ROWS_PULL;
        return 0;
    }
    e->kind = DP_REC_ROWS;
    const char *st = dp_record_str(o, "st");
    if (!st || s_count(o, "step", &e->step) || s_count(o, "stale", &e->staleness) ||
        s_norm(o, "gn", &e->grad_norm))
        return -1;
    e->status = strcmp(st, "applied") == 0   ? DP_PUSH_APPLIED
                : strcmp(st, "dropped") == 0 ? DP_PUSH_DROPPED
                : strcmp(st, "rejected") == 0 ? DP_PUSH_REJECTED : 0;
    return e->status ? 0 : -1;
}

static int s_parse_event(const cJSON *o, dp_rec_event_t *e)
{
    memset(e, 0, sizeof *e);
    const char *kind = dp_record_str(o, "e");
    if (!kind) return -1;
    if (strcmp(kind, "push") == 0) return s_parse_push(o, e);
    if (strcmp(kind, "rpull") == 0) return s_parse_rows(o, e, 0);
    if (strcmp(kind, "rows") == 0) return s_parse_rows(o, e, 1);
    if (strcmp(kind, "members") != 0) return -1;
    uint64_t shard, call;
    const char *m = dp_record_str(o, "m");
    if (s_count(o, "s", &shard) || s_count(o, "call", &call) || !m || shard > 1 << 20) return -1;
    for (const char *c = m; *c; c++)
        if (*c != 'L' && *c != 'F' && *c != 'G' && *c != 'X') return -1;
    e->kind = DP_REC_MEMBERS;
    e->shard = (int)shard;
    e->call = call != 0;
    e->members = dp_strdup(m);
    return 0;
}

/* The footer line (text, NUL-terminated) against what came before it. */
static int s_check_footer(const char *text, uint64_t hash, size_t events)
{
    cJSON *o = cJSON_Parse(text);
    uint64_t n = 0;
    const char *end = dp_record_str(o, "end"), *h = dp_record_str(o, "fnv1a");
    char hex[24];
    snprintf(hex, sizeof hex, "%016" PRIx64, hash);
    int ok = o && end && strcmp(end, "downpour_record") == 0 && s_count(o, "events", &n) == 0 &&
             n == events && h && strcmp(h, hex) == 0;
    cJSON_Delete(o);
    return ok ? 0 : -1;
}

/* Parse the lines of buf (len bytes, the last one the footer). */
static int s_parse_lines(dp_rec_t *rec, char *buf, size_t len, const char *path, char *err)
{
    uint64_t hash = DP_FNV_SEED;
    size_t cap = 0, lineno = 0;
    char *p = buf, *end = buf + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) return dp_err(err, "%s: truncated record (no footer; the run did not finish writing it)", path);
        *nl = 0;
        lineno++;
        if (nl + 1 == end) {
            if (lineno < 2 || s_check_footer(p, hash, rec->n) != 0)
                return dp_err(err, "%s: truncated or corrupt record (its footer does not match the %zu lines before it)",
                              path, lineno - 1);
            return 0;
        }
        hash = dp_fnv1a(hash, p, (size_t)(nl - p));
        hash = dp_fnv1a(hash, "\n", 1);
        cJSON *o = cJSON_Parse(p);
        if (lineno == 1) {
            if (!o || dp_record_num(o, "downpour_record", 0) != DP_RECORD_VERSION) {
                cJSON_Delete(o);
                return dp_err(err, "%s: not a Downpour record (version %d) file", path, DP_RECORD_VERSION);
            }
            rec->header = o;
        } else {
            if (rec->n == cap) {
                cap = cap ? 2 * cap : 1024;
                rec->ev = dp_realloc(rec->ev, cap * sizeof *rec->ev);
            }
            int bad = !o || s_parse_event(o, &rec->ev[rec->n]) != 0;
            cJSON_Delete(o);
            if (bad) return dp_err(err, "%s: line %zu is not a record event", path, lineno);
            rec->n++;
        }
        p = nl + 1;
    }
    return dp_err(err, "%s: truncated record (no footer)", path);
}

int dp_rec_load(dp_rec_t *rec, const char *path, char *err)
{
    memset(rec, 0, sizeof *rec);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dp_read_file(path, &buf, &len, err) != 0) return -1;
    int rc = s_parse_lines(rec, (char *)buf, len, path, err);
    free(buf);
    if (rc != 0) dp_rec_fini(rec);
    return rc;
}

void dp_rec_fini(dp_rec_t *rec)
{
    cJSON_Delete(rec->header);
    for (size_t i = 0; i < rec->n; i++) free(rec->ev[i].members);
    free(rec->ev);
    memset(rec, 0, sizeof *rec);
}

int dp_record_merge(const char *path, const char *const *parts, int n, const cJSON *extra, char *err)
{
    dp_rec_t *rec = dp_calloc((size_t)n, sizeof *rec);
    dp_record_t *out = NULL;
    int rc = -1;
    for (int i = 0; i < n; i++)
        if (dp_rec_load(&rec[i], parts[i], err) != 0) goto done;
    cJSON *h = cJSON_Duplicate(rec[0].header, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(h, "shard");
    const cJSON *it;
    cJSON_ArrayForEach(it, extra) {
        cJSON_DeleteItemFromObjectCaseSensitive(h, it->string);
        cJSON_AddItemToObject(h, it->string, cJSON_Duplicate(it, 1));
    }
    for (int i = 0; i < n; i++)
        if (dp_record_num(rec[i].header, "start_version", 0) != 0)
            cJSON_ReplaceItemInObjectCaseSensitive(h, "start_version",
                                                   cJSON_CreateNumber(dp_record_num(rec[i].header, "start_version", 0)));
    rc = dp_record_new(&out, path, h, err);
    cJSON_Delete(h);
    if (rc != 0) goto done;
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < rec[i].n; j++) dp_record_event(out, &rec[i].ev[j]);
    rc = dp_record_close(&out, err);
done:
    for (int i = 0; i < n; i++) dp_rec_fini(&rec[i]);
    free(rec);
    return rc;
}

/* ---- the optimizer in the header ---- */

cJSON *dp_record_optim_json(const dp_optim_conf_t *o)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kind", dp_optim_kind_name(o->kind));
    cJSON_AddNumberToObject(j, "lr", o->lr);
    cJSON_AddNumberToObject(j, "momentum", o->momentum);
    cJSON_AddNumberToObject(j, "beta1", o->beta1);
    cJSON_AddNumberToObject(j, "beta2", o->beta2);
    cJSON_AddNumberToObject(j, "eps", o->eps);
    cJSON_AddNumberToObject(j, "alpha", o->alpha);
    cJSON_AddNumberToObject(j, "weight_decay", o->weight_decay);
    cJSON_AddNumberToObject(j, "schedule", o->schedule);
    cJSON_AddNumberToObject(j, "step_size", (double)o->step_size);
    cJSON_AddNumberToObject(j, "gamma", o->gamma);
    cJSON_AddNumberToObject(j, "total_steps", (double)o->total_steps);
    if (o->period > 1) cJSON_AddNumberToObject(j, "period", (double)o->period);
    char dc[48];
    dp_optim_dc_name(o, dc, sizeof dc);
    cJSON_AddStringToObject(j, "dc", dc);
    return j;
}

/* OBJ.KEY (optim, rows) into *v when present (absent: *v is left): a number in
 * [lo, hi], whole when whole is set. A value its field cannot hold (1e300
 * for a long, more than FLT_MAX for a float) is refused rather than cast,
 * which would be undefined behaviour and, in practice, train with garbage. */
static int s_num(const cJSON *j, const char *obj, const char *key, double lo, double hi, int whole, double *v, char *err)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x) return 0;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi) ||
        (whole && x->valuedouble != floor(x->valuedouble)))
        return dp_err(err, "record header: %s.%s is not %s in [%g, %g]", obj, key, whole ? "a whole number" : "a number",
                      lo, hi);
    *v = x->valuedouble;
    return 0;
}

int dp_record_optim_parse(const cJSON *j, dp_optim_conf_t *o, char *err)
{
    dp_optim_conf_default(o);
    const char *kind = dp_record_str(j, "kind");
    if (!kind || dp_optim_parse_kind(o, kind, err) != 0)
        return dp_err(err, "record header: no valid optimizer");
    /* Floats went out as doubles of the same value: they come back exact.
     * Absent, lr, weight_decay, gamma, step_size and total_steps are 0. */
    const double F = FLT_MAX, L = 9007199254740992.0; /* 2^53: whole doubles are exact below */
    double lr = 0, mom = o->momentum, b1 = o->beta1, b2 = o->beta2, eps = o->eps, wd = 0;
    double alpha = o->alpha; /* absent (a record older than rmsprop): the default */
    double sched = DP_LR_CONSTANT, step_size = 0, gamma = 0, total = 0, period = 0;
    if (s_num(j, "optim", "lr", -F, F, 0, &lr, err) || s_num(j, "optim", "momentum", -F, F, 0, &mom, err) ||
        s_num(j, "optim", "beta1", -F, F, 0, &b1, err) || s_num(j, "optim", "beta2", -F, F, 0, &b2, err) ||
        s_num(j, "optim", "eps", -F, F, 0, &eps, err) || s_num(j, "optim", "alpha", -F, F, 0, &alpha, err) ||
        s_num(j, "optim", "weight_decay", -F, F, 0, &wd, err) ||
        s_num(j, "optim", "schedule", 0, 2, 1, &sched, err) || s_num(j, "optim", "step_size", 0, L, 1, &step_size, err) ||
        s_num(j, "optim", "gamma", -F, F, 0, &gamma, err) || s_num(j, "optim", "total_steps", 0, L, 1, &total, err) ||
        s_num(j, "optim", "period", 0, 100000, 1, &period, err))
        return -1;
    if (sched != DP_LR_CONSTANT && sched != DP_LR_STEP && sched != DP_LR_COSINE)
        return dp_err(err, "record header: bad lr schedule");
    o->lr = (float)lr;
    o->momentum = (float)mom;
    o->beta1 = (float)b1;
    o->beta2 = (float)b2;
    o->eps = (float)eps;
    o->alpha = (float)alpha;
    o->weight_decay = (float)wd;
    o->schedule = (dp_lr_kind_t)sched;
    o->step_size = (long)step_size;
    o->gamma = (float)gamma;
    o->total_steps = (long)total;
    o->period = (long)period;
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(j, "dc"); /* absent: off (older records) */
    if (dc && (!cJSON_IsString(dc) || dp_optim_parse_dc(o, dc->valuestring, err) != 0))
        return dp_err(err, "record header: optim.dc is not off, const:LAMBDA or adaptive:LAMBDA0");
    return 0;
}

void dp_record_delay_json(cJSON *h, int delay_lr, float delay_k)
{
    char rule[48];
    dp_delay_lr_name(delay_lr, delay_k, rule, sizeof rule);
    cJSON_AddNumberToObject(h, "lr_staleness", delay_lr == DP_DELAY_INVERSE); /* older readers */
    cJSON_AddStringToObject(h, "delay_lr", rule);
}

int dp_record_delay_parse(const cJSON *h, int *delay_lr, float *delay_k, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, "delay_lr");
    if (!v) { /* a record older than --delay-lr: its lr_staleness 0 or 1 */
        double ls = dp_record_num(h, "lr_staleness", 0);
        if (ls != 0 && ls != 1) return dp_err(err, "record header: 'lr_staleness' is not 0 or 1");
        *delay_lr = ls == 1 ? DP_DELAY_INVERSE : DP_DELAY_NONE;
        *delay_k = 0;
        return 0;
    }
    if (!cJSON_IsString(v) || dp_delay_lr_parse(v->valuestring, delay_lr, delay_k, err) != 0)
        return dp_err(err, "record header: 'delay_lr' is not none, inverse, adaptive or threshold[:K]");
    return 0;
}

/* ---- the row table in the header ---- */

cJSON *dp_record_rows_json(const dp_rows_conf_t *c, dp_mode_t mode)
{
    cJSON *j = cJSON_CreateObject();
    char seed[24];
    cJSON_AddStringToObject(j, "mode", dp_mode_name(mode));
    cJSON_AddNumberToObject(j, "width", c->width);
    cJSON_AddStringToObject(j, "optim", dp_row_optim_kind_name(c->optim.kind));
    cJSON_AddNumberToObject(j, "lr", c->optim.lr);
    cJSON_AddNumberToObject(j, "eps", c->optim.eps);
    cJSON_AddNumberToObject(j, "beta1", c->optim.beta1);
    cJSON_AddNumberToObject(j, "beta2", c->optim.beta2);
    cJSON_AddNumberToObject(j, "ftrl_beta", c->optim.ftrl_beta);
    cJSON_AddNumberToObject(j, "l1", c->optim.l1);
    cJSON_AddNumberToObject(j, "l2", c->optim.l2);
    cJSON_AddNumberToObject(j, "init_scale", c->init == DP_ROWS_INIT_UNIFORM ? c->init_scale : 0);
    snprintf(seed, sizeof seed, "%" PRIu64, c->seed); /* a string: 64 bits do not fit a double */
    cJSON_AddStringToObject(j, "seed", seed);
    cJSON_AddNumberToObject(j, "max_keys", c->max_keys);
    cJSON_AddNumberToObject(j, "max_rows", (double)c->max_rows);
    cJSON_AddNumberToObject(j, "admit_after", c->admit_after);
    cJSON_AddNumberToObject(j, "admit_max", c->admit_max);
    cJSON_AddNumberToObject(j, "evict_after", (double)c->evict_after);
    cJSON_AddNumberToObject(j, "sweep_per_push", c->sweep_per_push);
    cJSON_AddNumberToObject(j, "chunk_rows", c->chunk_rows);
    return j;
}

int dp_record_rows_parse(const cJSON *j, dp_rows_conf_t *c, dp_mode_t *mode, char *err)
{
    const char *m = dp_record_str(j, "mode"), *kind = dp_record_str(j, "optim"), *seed = dp_record_str(j, "seed");
    dp_row_optim_kind_t k;
    char why[DP_ERR_LEN];
    double width = dp_record_num(j, "width", 0);
    if (!m || dp_mode_parse(m, mode, why) != 0) return dp_err(err, "record header: rows.mode is not sync, async or ssp");
    if (!kind || dp_row_optim_parse_kind(kind, &k, why) != 0)
        return dp_err(err, "record header: rows.optim is not sgd, adagrad, adam or ftrl");
    if (!(width >= 1 && width <= DP_ROWS_MAX_WIDTH) || width != floor(width))
        return dp_err(err, "record header: rows.width is not in [1, %d]", DP_ROWS_MAX_WIDTH);
    dp_rows_conf_default(c, (int)width, k);
    const double F = FLT_MAX, L = 9007199254740992.0;
    double lr = 0, eps = c->optim.eps, b1 = c->optim.beta1, b2 = c->optim.beta2, fb = c->optim.ftrl_beta;
    double l1 = 0, l2 = 0, scale = 0, max_keys = 0, max_rows = 0, admit = 0, admit_max = 0, evict = 0;
    double sweep = 0, chunk = 0;
    if (s_num(j, "rows", "lr", -F, F, 0, &lr, err) || s_num(j, "rows", "eps", -F, F, 0, &eps, err) ||
        s_num(j, "rows", "beta1", -F, F, 0, &b1, err) || s_num(j, "rows", "beta2", -F, F, 0, &b2, err) ||
        s_num(j, "rows", "ftrl_beta", -F, F, 0, &fb, err) || s_num(j, "rows", "l1", -F, F, 0, &l1, err) ||
        s_num(j, "rows", "l2", -F, F, 0, &l2, err) || s_num(j, "rows", "init_scale", 0, F, 0, &scale, err) ||
        s_num(j, "rows", "max_keys", 0, UINT32_MAX, 1, &max_keys, err) ||
        s_num(j, "rows", "max_rows", 0, L, 1, &max_rows, err) ||
        s_num(j, "rows", "admit_after", 0, UINT32_MAX, 1, &admit, err) ||
        s_num(j, "rows", "admit_max", 0, UINT32_MAX, 1, &admit_max, err) ||
        s_num(j, "rows", "evict_after", 0, L, 1, &evict, err) ||
        s_num(j, "rows", "sweep_per_push", 0, UINT32_MAX, 1, &sweep, err) ||
        s_num(j, "rows", "chunk_rows", 0, UINT32_MAX, 1, &chunk, err))
        return -1;
    c->optim.lr = (float)lr, c->optim.eps = (float)eps, c->optim.beta1 = (float)b1;
    c->optim.beta2 = (float)b2, c->optim.ftrl_beta = (float)fb, c->optim.l1 = (float)l1;
    c->optim.l2 = (float)l2;
    if (scale > 0) {
        c->init = DP_ROWS_INIT_UNIFORM;
        c->init_scale = (float)scale;
        if (!seed || dp_opts_parse_u64("rows.seed", seed, &c->seed, why) != 0)
            return dp_err(err, "record header: rows.seed is not a 64-bit number in a string");
    }
    c->max_keys = (uint32_t)max_keys, c->max_rows = (uint64_t)max_rows;
    c->admit_after = (uint32_t)admit, c->admit_max = (uint32_t)admit_max;
    c->evict_after = (uint64_t)evict, c->sweep_per_push = (uint32_t)sweep, c->chunk_rows = (uint32_t)chunk;
    return 0;
}
