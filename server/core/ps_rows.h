/* ps_rows: a shard's row table (issue 35) — the rules of ROWS_PULL and
 * ROWS_PUSH (proto/downpour.proto) over server/core/rows.h's table, for a
 * model whose first layer is embed:D, without the wire (their handlers:
 * server/loop/ps_rows_wire.c).
 *
 * Which shard: a key is held by dp_rows_shard_of(key, K) alone; a request
 * naming a key of another shard is refused whole.
 *
 * Pull: the rows of the keys asked (no key twice), at the shard's version
 * now (Rows.version), without waiting: in sync the worker asks after its
 * dense pull answered, and the rows of that step were applied with it.
 * The shard keeps each worker's last pulled key set (sorted; at most
 * max_keys keys, 8 bytes each: the memory bound per worker); a push may
 * name only keys of that set ("a push for rows the worker did not pull").
 *
 * Scan (RowsPull.scan): a page of the rows the shard holds, the keys
 * >= from ascending (dp_rows_keys_from), with the keys themselves, whether
 * more follow and what a key without a row reads as (init, seed): how the
 * chief reads every shard's table into its --save. A page holds at most
 * dp_ps_rows_page(r) keys, so its keys and rows are no larger than the
 * ROWS reply of a pull of max_keys keys; it reads, changing nothing (the
 * worker's pulled key set included). A page costs what it lists: a walk
 * of the table's key tree from the cursor (rows.h), the page's keys and
 * the path to them, not the table's slots, so a scan of one key costs a
 * path of the tree (2 log2 rows entries on the average), whatever the
 * table's size.
 *
 * Every count is checked against max_keys before anything is sized by it.
 *
 * Push: its step plausible by the dense push's rule (dp_shard_step_check,
 * in the loop's handler: at most one past the worker's highest step the
 * shard handled, dense or rows; else an ERROR), then (worker, step)
 * applied once (a repeat is acknowledged, not applied
 * again); checked whole (width, keys pulled, finite, no key twice) before
 * anything moves, so a bad push is one REJECTED ACK and changes nothing.
 * When it applies (--rows-mode, default --mode):
 *   async, ssp  at once, stamped with the shard's version; its staleness is
 *               the version now minus the one it was pulled at (ssp's bound
 *               is the dense pulls', which every step makes)
 *   sync        (only with --mode sync) with the dense step: the push waits
 *               in the step's buffer, and when the dense step fires the rows
 *               of exactly the workers whose dense gradient it aggregated
 *               are summed per key and applied once, divided by their count
 *               (the dense mean's divisor); the others' are dropped, as
 *               their dense gradients are. The buffer holds at most one
 *               push per worker (max_keys rows of D floats each).
 * The table's version is the shard's dense version, so eviction's T counts
 * the shard's steps. */
#ifndef DP_PS_ROWS_H
#define DP_PS_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/wire.h"
#include "server/core/policy.h"
#include "server/core/rows.h"

/* One worker's row push waiting for the dense step (sync). */
typedef struct {
    uint64_t version;      /* the step it was computed at; UINT64_MAX: none waiting */
    uint64_t *keys;        /* n keys, grads n x D (owned, max_keys capacity) */
    float *grads;
    size_t n;
    bool taken;            /* the dense step took this worker's gradient */
} dp_ps_rows_wait_t;

typedef struct {
    dp_rows_t *table;      /* NULL: the model has no row table */
    int width;             /* D */
    dp_mode_t mode;        /* when pushes apply (above) */
    uint32_t shard, shards;
    int workers;
    uint32_t max_keys;
    float init;            /* a key without a row reads uniform in [-init, init) by (seed, key); */
    uint64_t seed;         /* init 0: zeros (a scan's reply says so) */
    uint64_t *last_step;   /* per worker: the last push step applied (0: none) */
    uint64_t **pulled;     /* per worker: its last pull's keys, sorted (owned, max_keys) */
    size_t *n_pulled;
    dp_ps_rows_wait_t *waiting; /* sync: per worker */
    uint64_t *sum_keys;    /* sync: the step's keys and summed rows (owned) */
    float *sum_grads;
    size_t *order;         /* sync: the merge's scratch */
    uint64_t pushes, rejected, repeats, dropped;
    uint64_t staleness_sum, staleness_max;
} dp_ps_rows_t;

/* The table for a model of row width d (0: none, r stays empty), its rows
 * conf c (c->width is set to d here), applied as mode says; workers: the
 * crew's most. -1 with err for a bad conf or a sync rows mode under another
 * --mode. */
int dp_ps_rows_init(dp_ps_rows_t *r, int d, const dp_rows_conf_t *c, dp_mode_t mode,
                    dp_mode_t dense_mode, uint32_t shard, uint32_t shards, int workers, char *err);
void dp_ps_rows_fini(dp_ps_rows_t *r);

/* The rules above without the wire, as the loop (server/loop/ps_rows_wire.c's
 * handlers) and a replay call them.
 * dp_ps_rows_pull: worker w reads the n keys (aligned; each of this shard,
 * none twice, at most max_keys) as the table holds them now into rows
 * (n x D, in the order asked); its key set is kept for its push. The keys
 * that had a row, or -1 with err (then nothing counts as pulled).
 * dp_ps_rows_push: worker w's step (0: none given) of n rows of width
 * `width` (grads, n x width floats at any alignment) pulled at version
 * pulled_at, handled at the shard's version: o says applied (async: done;
 * sync: waiting for the dense step), dropped or rejected (o->reason) and
 * the staleness. Returns 1 for a repeat (acknowledged, nothing changed),
 * else 0. */
long dp_ps_rows_pull(dp_ps_rows_t *r, int w, const uint64_t *keys, size_t n, float *rows, char *err);
/* A request of n keys: at most max_keys, else -1 with err. Checked before
 * anything is sized by n.
 * dp_ps_rows_refuse: a row push refused before dp_ps_rows_push (its keys
 * too many): counted with the table's rejected, o says why. */
int dp_ps_rows_count_ok(const dp_ps_rows_t *r, size_t n, char *err);
void dp_ps_rows_refuse(dp_ps_rows_t *r, const char *why, dp_push_outcome_t *o);
int dp_ps_rows_push(dp_ps_rows_t *r, int w, uint64_t step, uint64_t pulled_at, uint64_t version,
                    int width, const uint64_t *keys, size_t n, const void *grads, dp_push_outcome_t *o);

/* The hooks of the dense step (server/loop/ps.c calls them after each dense
 * push the policy handled; a replay does the same):
 * dp_ps_rows_dense_taken: sync rows: the dense step at version took this
 * worker's gradient.
 * dp_ps_rows_stepped: sync rows: the dense step fired, the shard is at
 * version now: the rows of the workers it took applied once, the others'
 * dropped. Both do nothing in async and ssp. */
void dp_ps_rows_dense_taken(dp_ps_rows_t *r, int worker, uint64_t version);
void dp_ps_rows_stepped(dp_ps_rows_t *r, uint64_t version);

/* A shard's checkpoint of its rows (server/core/shard_checkpoint.h): the
 * per-worker last row step (a restarted shard still applies a (worker,
 * step) once), the counters, and the table (dp_rows_save), closed by a
 * CRC-32 of the whole. Not saved: the keys each worker last pulled (a push
 * after the restart names keys pulled before it and is refused, as a push
 * for keys not pulled; the worker's next step pulls again) and sync's
 * waiting pushes (lost with the dense step's gradients in flight).
 * dp_ps_rows_save: the bytes (the caller frees), NULL when r has no table.
 * dp_ps_rows_load: r's rows from them; -1 with err (one line) and r
 * unchanged. */
uint8_t *dp_ps_rows_save(const dp_ps_rows_t *r, size_t *len);
int dp_ps_rows_load(dp_ps_rows_t *r, const uint8_t *buf, size_t len, char *err);

/* The most keys a scan's page lists: max_keys D / (D + 2), at least 1
 * (a page's 8 + 4 D bytes a key within a pull's 4 D a key of max_keys). */
uint32_t dp_ps_rows_page(const dp_ps_rows_t *r);

/* The counters a STATS reply and the metrics carry. */
typedef struct {
    uint64_t rows, created, evicted, pushes, rejected, staleness_sum, staleness_max, bytes;
} dp_ps_rows_stats_t;
void dp_ps_rows_stats(const dp_ps_rows_t *r, dp_ps_rows_stats_t *out);

#endif
