/* record: a run's schedule, written as it happens and read back for replay
 * (`downpour replay`) — which worker's gradient, computed on which version
 * from which data step, each shard applied, in the order it did, and what
 * the policy decided. Together with the header (everything that fixes the
 * arithmetic: model, seeds, optimizer and schedule, mode, workers, batch,
 * data, CPU threads) that is enough to recompute every gradient and every
 * step exactly.
 *
 * The file is JSON lines (ARCHITECTURE.md, "Record files"):
 *   line 1   {"downpour_record":1, ...header...}
 *   events   {"e":"push","s":SHARD,"w":WORKER,"step":STEP,"v":VERSION,
 *             "st":"applied"|"dropped"|"rejected","stale":N,"after":V,
 *             "lr":X,"gn":X,"un":X[,"dc":0|1][,"be":E,"bi":I]
 *             [,"es":N,"ne":N,"er":X]}
 *            {"e":"members","s":SHARD,"m":"LLFG","call":0|1}
 *            {"e":"rpull","s":SHARD,"w":WORKER,"v":VERSION,"n":KEYS}
 *            {"e":"rows","s":SHARD,"w":WORKER,"step":STEP,"v":VERSION,
 *             "st":"applied"|"dropped"|"rejected","stale":N,"n":KEYS[,"gn":X]}
 *   last     {"end":"downpour_record","events":N,"fnv1a":"16 hex digits"}
 * STEP is the push's 1-based step (Push.step): the worker's data step + 1.
 * "members" gives every worker's state (L live, F finished, X left before
 * its last step, G gone or, elastic, absent) when it
 * changed; "call":1 when the loop then asked the policy
 * (dp_policy_members_changed), so a replay repeats that call.
 * "dc" (only with --delay-compensation): 1 when the push was compensated,
 * 0 when it fell back (the shard held no weights of its version), which a
 * replay repeats rather than re-derives.
 * "be"/"bi" (shard 0 of an elastic crew, server/crew/deal.h): the batch the push
 * carried, batch "bi" of epoch "be", which a replay trains instead of the
 * batch of (worker, step).
 * "es"/"ne"/"er" (an actor-critic push, --env): the segment's account the
 * shard counted — its env steps, the episodes that ended in it and the sum
 * of their returns (17 digits) — which a replay, recomputing the segment,
 * checks.
 * "rpull" / "rows" (a model with embed:D, server/core/ps_rows.h): the shard
 * answered worker's ROWS_PULL of KEYS keys at its version V, or handled its
 * ROWS_PUSH of KEYS rows pulled at version V as "st" says (sync rows:
 * "applied" when taken into the step's buffer, as the ACK says; the dense
 * step then applies or drops it, which a replay running the same code
 * repeats). A row push applies between dense versions in async, so the
 * rows a worker read are not a function of the dense version: they are
 * the table as it stood at the worker's "rpull", which is why pulls are
 * events, in the same stream and order as the pushes. "gn" is the L2 norm
 * of the rows pushed (in the order the worker sent them; absent when
 * rejected), which a replay recomputing them checks. A repeated ROWS_PUSH
 * (already applied) and a refused ROWS_PULL change nothing and are not
 * written. The header's "rows" object (dp_record_rows_json) holds the
 * table's conf as the shards ran it.
 * The footer's hash is FNV-1a over every byte before the footer line.
 *
 * Safety: the lines go to a fresh temporary file beside PATH
 * (dp_atomic_open in common/util.h: PATH.tmp.XXXXXX made with O_EXCL, so a
 * symlink planted there is never followed); dp_record_close writes the
 * footer, checks every write, fsync and close, and renames it to PATH, so
 * PATH is either absent or whole. A reader refuses a file without a
 * matching footer (truncated, edited). */
#ifndef DP_RECORD_H
#define DP_RECORD_H

#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "kernels/optim.h"
#include "server/args.h"
#include "server/core/policy.h"
#include "server/crew/deal.h"
#include "server/crew/members.h"

#define DP_RECORD_VERSION 1

typedef enum {
    DP_REC_PUSH = 1,
    DP_REC_MEMBERS = 2,
    DP_REC_ROWS_PULL = 3, /* "rpull": worker, version, keys */
    DP_REC_ROWS = 4,      /* "rows": worker, step, version, status, staleness, keys, grad_norm */
} dp_rec_kind_t;

typedef struct {
    dp_rec_kind_t kind;
    int shard;
    /* push */
    int worker;
    uint64_t step;         /* Push.step: data step + 1 (0: none given) */
    uint64_t version;      /* the version the gradient was computed on */
    int status;            /* dp_push_status_t */
    uint64_t staleness;
    uint64_t after;        /* the shard's version after the push */
    double lr, grad_norm, update_norm;
    int dc;                /* delay compensation: 1 done, 0 fell back, -1 off (absent) */
    int dealt;             /* shard 0 dealt the batch it carried: */
    dp_deal_batch_t batch; /* ... this one */
    int account;           /* an actor-critic push's account (es, ne, er) is there: */
    uint64_t env_steps, episodes; /* ... its segment's env steps and episodes ended */
    double returns;        /* ... and the sum of their returns */
    uint64_t keys;         /* rows, rpull: the keys of this shard */
    uint64_t h;            /* push: a DyLU round's data steps ("h"; 0: absent, the header's H) */
    /* members */
    char *members;         /* one of L / F / G per worker (owned) */
    int call;              /* dp_policy_members_changed followed */
} dp_rec_event_t;

/* ---- writing ---- */
typedef struct dp_record dp_record_t;

/* Start PATH's temporary file with header (a JSON object; "downpour_record" is added;
 * not taken). */
int dp_record_new(dp_record_t **out, const char *path, const cJSON *header, char *err);
void dp_record_event(dp_record_t *r, const dp_rec_event_t *e);
/* A push the policy decided (o), from worker's step computed on version,
 * after the member state m (written first when it changed), carrying the
 * dealt batch (NULL: the batch of its (worker, step)). */
void dp_record_push(dp_record_t *r, int shard, int worker, uint64_t step, uint64_t version,
                    const dp_push_outcome_t *o, uint64_t after, const dp_members_t *m,
                    const dp_deal_batch_t *batch);
/* The next push written carries an actor-critic segment's account: its
 * env steps, episodes ended and the sum of their returns (what the shard
 * counted of Push.env_steps and episode_returns). */
void dp_record_account(dp_record_t *r, uint64_t env_steps, uint64_t episodes, double returns);
/* The next push written is a DyLU round of h data steps (--local-steps
 * auto: the record's "h", which a replay trains that round by). */
void dp_record_round(dp_record_t *r, uint64_t h);
/* The member table changed and the policy is about to be asked. */
void dp_record_members(dp_record_t *r, int shard, const dp_members_t *m);
/* A ROWS_PULL of n keys answered at version (server/core/ps_rows.c). */
void dp_record_rows_pull(dp_record_t *r, int shard, int worker, uint64_t version, uint64_t n);
/* A ROWS_PUSH handled: step, the version it was pulled at, n keys and their
 * rows g (n x width; NULL when rejected: no norm), the outcome o (status,
 * staleness). */
void dp_record_rows_push(dp_record_t *r, int shard, int worker, uint64_t step, uint64_t version,
                         const dp_push_outcome_t *o, uint64_t n, const void *g, int width);
/* The L2 norm of the n floats at g (any alignment) summed in order in
 * double: what "gn" holds for a row push, so a replay computes it alike. */
double dp_record_rows_norm(const void *g, size_t n);
/* Footer, fsync, rename; frees r. -1 with err when any write failed (the
 * temporary file is removed). Safe on NULL. */
int dp_record_close(dp_record_t **r_p, char *err);
/* Stop without a record: the temporary file is removed. */
void dp_record_abandon(dp_record_t **r_p);

/* downpour-ps --record: the record with this shard's header (model, input,
 * seed, optimizer, mode, workers, R, S, shard I/K, the version it starts
 * at; with rows, a model with embed:D, the row table's conf as the shard
 * runs it, as "rows") and a measuring policy. */
int dp_record_ps_open(dp_record_t **out, const dp_ps_config_t *cfg, dp_policy_t *policy,
                      const dp_rows_conf_t *rows, char *err);

/* ---- reading ---- */
typedef struct {
    cJSON *header;
    dp_rec_event_t *ev;
    size_t n;
} dp_rec_t;

/* Load and check PATH: header version, every line, the footer's count and
 * hash. -1 with one line in err naming PATH otherwise. */
int dp_rec_load(dp_rec_t *rec, const char *path, char *err);
void dp_rec_fini(dp_rec_t *rec);

/* One record of a whole cluster from its shards' records (parts, in shard
 * order): the first part's header with extra's fields added (the workers'
 * side: data, batch, data_seed, threads), then every part's events. */
int dp_record_merge(const char *path, const char *const *parts, int n, const cJSON *extra, char *err);

/* The row table's conf (server/core/rows.h) and when its pushes apply, as the
 * header's "rows" object, and back (-1 with err naming the field). */
cJSON *dp_record_rows_json(const dp_rows_conf_t *c, dp_mode_t mode);
int dp_record_rows_parse(const cJSON *j, dp_rows_conf_t *c, dp_mode_t *mode, char *err);

/* Header helpers: the optimizer as a JSON object and back. */
cJSON *dp_record_optim_json(const dp_optim_conf_t *o);
int dp_record_optim_parse(const cJSON *j, dp_optim_conf_t *o, char *err);
/* The delay rule in a header: "delay_lr" (dp_delay_lr_name's text) and,
 * for older readers, "lr_staleness" 0 / 1; back from either (a record
 * without "delay_lr" is older: its lr_staleness). */
void dp_record_delay_json(cJSON *h, int delay_lr, float delay_k);
/* An elastic crew's MIN ("min_workers") and a fraction of live workers as
 * R ("replicas_frac"), each only when set; absent: a fixed crew, R a count. */
void dp_record_crew_json(cJSON *h, int min_workers, float replicas_frac);
int dp_record_delay_parse(const cJSON *h, int *delay_lr, float *delay_k, char *err);
/* A header string / number field; NULL / dflt when absent. */
const char *dp_record_str(const cJSON *h, const char *key);
double dp_record_num(const cJSON *h, const char *key, double dflt);

#endif
