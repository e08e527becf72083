/* rows: a sparse row table, the server's half of a tensor whose rows are
 * addressed by 64-bit keys (issue 35). No fixed row count: the key space
 * is the caller's (a feature id, a token, a user), exact (keys are stored,
 * so two keys never share a row) and a row is created on the first push
 * that touches it. Every row has the table's width D and its own optimizer
 * state and step count (kernels/row_optim.h: sgd, adagrad, adam, ftrl),
 * stepped lazily: only the rows a push carries move.
 *
 * The calls the protocol will make (pull and push by key):
 *   pull  the rows of N keys (deduplicated by the caller) copied out as
 *         N x D floats; a key with no row reads as its initial value
 *         (zeros, or under DP_ROWS_INIT_UNIFORM the seeded values the row
 *         will start from); the call returns how many keys had a row. A
 *         pull changes nothing.
 *   push  N row gradients (N x D) at a version: checked whole first (at
 *         most max_keys keys, width D, every value finite, no key twice,
 *         the version not behind the table's), so a bad push is one error
 *         line and changes nothing (nor does it touch the counters but
 *         `rejected`); then each key's row is created, admitted or stepped.
 * Both are deterministic: the table's state is a function of the sequence
 * of calls alone (no clock, no address, no thread), so a replay of the
 * same calls gives the same bits (dp_rows_digest).
 *
 * Admission (admit_after = K > 1): a push of a key without a row counts a
 * sighting in the pending table and drops the gradient; the K-th sighting
 * creates the row and applies that push's gradient to it (its step 1).
 * Until then the key reads as its initial value. The pending table holds
 * at most admit_max keys: a new key's sighting while it is full is not
 * recorded (counted in dropped_pending_full) and the key keeps reading as
 * its initial value; pending keys not seen for T = evict_after versions
 * are swept out (counted in pending_expired), which is what makes room
 * again, so admission wants eviction on.
 *
 * Eviction (evict_after = T > 0): a row last pushed at version u is kept
 * while the table's version V has V - u <= T and dropped by the first
 * sweep that finds V - u > T (counted in evicted); its slot is reused by
 * the next row created. Each push sweeps sweep_per_push slots and as many
 * pending entries from where the last sweep stopped (dp_rows_sweep does it
 * on demand), so the cost per call is bounded; a row that has become
 * idle is gone within ceil(slots / sweep_per_push) pushes after that
 * (slots: the arena's slots in use or free).
 *
 * Memory (SECURITY.md, "Limits"). A row is one slot of a slab arena
 * (chunks of chunk_rows rows, never moved: a slot index is stable, and no
 * row is ever malloc'd on its own) holding 4 D (1 + S) bytes of weights
 * and state (S = 0 sgd, 1 adagrad, 2 adam and ftrl) and 32 bytes of
 * bookkeeping (key, last version, step count, free-list link, the key
 * tree's two children: what makes a scan's page cost its keys), plus its
 * entry in the key map: 12 bytes at a load between 3/8 and 3/4 of the
 * map's size, which follows the peak row count (it doubles, never
 * shrinks), so 16 to 32 bytes per row at the peak. Per row at the peak,
 * at worst (dp_rows_bytes_per_row):
 *   sgd 4 D + 64, adagrad 8 D + 64, adam and ftrl 12 D + 64 bytes,
 * and one chunk's slots (arena and map both keep their peak: evicted slots
 * are reused, not returned). The table holds at most max_rows rows (a
 * push for a new key beyond them drops that row's gradient, counted in
 * dropped_full). The pending table costs at most 20 bytes / (3/8) = 54
 * bytes per key, admit_max keys (54 MiB at the default 2^20); the
 * duplicate check of a push 12 bytes x 4 max_keys at most (3 MiB at the
 * default 2^16), allocated once. dp_rows_stats' bytes is what the table
 * holds now. Memory is taken only when the table grows (a new chunk, a
 * map doubling): a push that creates no row past the peak allocates
 * nothing.
 *
 * Sharding: dp_rows_shard_of(key, K) puts a key on one of K servers by its
 * mixed hash (splitmix64's finaliser, never key % K), so sequential,
 * strided or skewed key sets spread evenly in rows. It uses the hash's
 * high 32 bits and the key map its low bits, so the keys of one shard
 * still fill their shard's map evenly. (Rows balance; one hot key's
 * traffic stays on its one shard.) */
#ifndef DP_ROWS_H
#define DP_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/row_optim.h"
#include "proto/wire.h" /* DP_WIRE_MAX_ROW_WIDTH */

#define DP_ROWS_MAX_WIDTH DP_WIRE_MAX_ROW_WIDTH /* D at most (the wire's bound) */
#define DP_ROWS_MAX_KEYS DP_WIRE_MAX_ROW_KEYS /* keys per request at most (max_keys' ceiling) */
#define DP_ROWS_DEFAULT_KEYS (1u << 16)   /* max_keys when 0 */
#define DP_ROWS_MAX_ROWS (1ull << 31)     /* max_rows' ceiling: slots are 32-bit */
#define DP_ROWS_MAX_ADMIT 1000000u        /* admit_after at most */
#define DP_ROWS_MAX_PENDING (1u << 26)    /* admit_max's ceiling */
#define DP_ROWS_DEFAULT_PENDING (1u << 20)
#define DP_ROWS_DEFAULT_CHUNK 4096        /* chunk_rows when 0 */
#define DP_ROWS_DEFAULT_SWEEP 1024        /* sweep_per_push when 0 */

typedef enum {
    DP_ROWS_INIT_ZERO,     /* every row starts at zeros */
    DP_ROWS_INIT_UNIFORM,  /* uniform in [-init_scale, init_scale), a function of (seed, key) */
} dp_rows_init_t;

typedef struct {
    int width;                  /* D: floats per row, 1 .. DP_ROWS_MAX_WIDTH */
    dp_row_optim_conf_t optim;  /* the rows' optimizer */
    dp_rows_init_t init;        /* a new row's weights (ftrl: zero only) */
    float init_scale;           /* DP_ROWS_INIT_UNIFORM: the bound, finite, > 0 */
    uint64_t seed;              /* DP_ROWS_INIT_UNIFORM: the seed */
    uint32_t max_keys;          /* keys per pull or push at most; 0: DP_ROWS_DEFAULT_KEYS */
    uint64_t max_rows;          /* rows at most; 0: DP_ROWS_MAX_ROWS */
    uint32_t admit_after;       /* K: a key's row is made at its K-th push; 0 or 1: the first */
    uint32_t admit_max;         /* pending keys at most; 0: DP_ROWS_DEFAULT_PENDING */
    uint64_t evict_after;       /* T: rows (and pending keys) idle more than T versions go; 0: never */
    uint32_t sweep_per_push;    /* slots and pending entries a push sweeps; 0: DP_ROWS_DEFAULT_SWEEP */
    uint32_t chunk_rows;        /* rows per arena chunk, a power of two; 0: DP_ROWS_DEFAULT_CHUNK */
} dp_rows_conf_t;

typedef struct {
    uint64_t version;              /* the latest version pushed or swept at */
    uint64_t rows;                 /* rows now */
    uint64_t pending;              /* keys seen fewer than K times now */
    uint64_t created;              /* rows made (admitted ones included) */
    uint64_t admitted;             /* of them, made at their K-th sighting (K > 1) */
    uint64_t evicted;              /* rows dropped idle */
    uint64_t pending_expired;      /* pending keys dropped idle */
    uint64_t pushes;               /* pushes applied */
    uint64_t rejected;             /* pushes refused whole (bad input) */
    uint64_t row_steps;            /* optimizer steps of a row */
    uint64_t dropped_full;         /* row gradients dropped: max_rows rows held */
    uint64_t dropped_pending_full; /* sightings not recorded: admit_max keys pending */
    uint64_t bytes;                /* memory the table holds */
} dp_rows_stats_t;

/* One row, as dp_rows_row reads it. */
typedef struct {
    const float *w;      /* D weights */
    const float *state;  /* S x D optimizer state ([D] then [D]); NULL for sgd */
    uint32_t steps;      /* the row's optimizer steps */
    uint64_t touched;    /* the version of its last push */
    uint32_t slot;       /* its arena slot (stable while the row lives) */
} dp_rows_view_t;

typedef struct dp_rows dp_rows_t;

/* A new row's start unless told (--row-init): uniform in [-0.01, 0.01) by
 * (seed, key), for ftrl zeros (the only start its closed form allows). Not
 * zeros for all: an embedding followed by relu would never move from zero
 * rows. The worker's own table and the servers' resolve it alike. */
#define DP_ROWS_DEFAULT_INIT 0.01f
static inline float dp_rows_init_default(dp_row_optim_kind_t k)
{
    return k == DP_ROW_FTRL ? 0.0f : DP_ROWS_DEFAULT_INIT;
}

/* The conf's defaults: width d, optimizer kind's defaults, zero init, no
 * admission, no eviction, the DEFAULT bounds above. */
void dp_rows_conf_default(dp_rows_conf_t *c, int d, dp_row_optim_kind_t kind);
/* A new empty table; NULL with err naming the field for a bad conf. */
dp_rows_t *dp_rows_new(const dp_rows_conf_t *c, char *err);
void dp_rows_destroy(dp_rows_t **t);

/* out[i*D .. (i+1)*D) = key i's row, or its initial value when it has
 * none. d must be the table's width, n <= max_keys. The number of keys
 * with a row, or -1 with err (nothing written). */
long dp_rows_pull(const dp_rows_t *t, const uint64_t *keys, size_t n, int d, float *out,
                  char *err);
/* Apply grads[i*D .. (i+1)*D) to key i's row at version (>= the table's
 * version): creates rows, counts sightings, steps rows, then sweeps. The
 * number of rows stepped, or -1 with err and nothing changed but the
 * rejected count (bad input, above). */
long dp_rows_push(dp_rows_t *t, uint64_t version, const uint64_t *keys, size_t n, int d,
                  const float *grads, char *err);
/* Advance the version to max(version, the table's) and sweep up to budget
 * slots and budget pending entries; the rows evicted. */
uint64_t dp_rows_sweep(dp_rows_t *t, uint64_t version, size_t budget);

/* key's row: 0 and *v filled, or -1 when it has none. */
int dp_rows_row(const dp_rows_t *t, uint64_t key, dp_rows_view_t *v);
/* key's sightings in the pending table (0: not pending). */
uint32_t dp_rows_pending(const dp_rows_t *t, uint64_t key);
void dp_rows_stats(const dp_rows_t *t, dp_rows_stats_t *out);
int dp_rows_width(const dp_rows_t *t);
/* FNV-1a of everything that decides the table's future: version, every
 * slot (key, version, steps, weights and state, or free), the free list,
 * the pending keys and the sweep cursors. Equal digests: the same table. */
uint64_t dp_rows_digest(const dp_rows_t *t);

/* The table's whole state as bytes (a shard's checkpoint, ps_rows.h):
 * the conf's shape (width, optimizer, chunk), the counters, every slot
 * [0, hwm) (key, version, steps, link and weights and state; a free slot's
 * floats as zeros), the free list, the key map's size, the pending table
 * as laid out and the sweep cursors: what dp_rows_digest covers, so a
 * table loaded from them has the digest of the one saved. Host byte
 * order (a checkpoint is read back by the same build). *len its bytes;
 * the caller frees. O(rows): 24 + 4 D (1 + S) bytes a slot. */
uint8_t *dp_rows_save(const dp_rows_t *t, size_t *len);
/* Replace t's state (t from dp_rows_new with the conf of the saved table)
 * with the saved one. -1 with err (one line: not such bytes, another
 * width, optimizer or chunk, a count or link out of range, a key twice, a
 * value not finite) and t unchanged. */
int dp_rows_load(dp_rows_t *t, const uint8_t *buf, size_t len, char *err);

/* The keys of the rows held that are >= from, ascending, at most max of
 * them into keys[0..max); their count (fewer than max: no more). A model
 * file's rows page by page (from = the last key + 1): a walk of the key
 * tree from the first key >= from, O(max + its depth) entries looked at
 * whatever the table's size (the depth is 2 log2 rows on the average;
 * keys chosen against the public hash can make it deeper, which costs
 * time, not stack), no allocation. Rows made or dropped between pages:
 * a page lists the keys >= from held when it is read. Pending keys have
 * no row and are not listed. */
size_t dp_rows_keys_from(const dp_rows_t *t, uint64_t from, size_t max, uint64_t *keys);
/* The same, with *visited (unless NULL) the entries of the table the page
 * looked at: its cost, which a test holds to the page, not the table. */
size_t dp_rows_keys_page(const dp_rows_t *t, uint64_t from, size_t max, uint64_t *keys,
                         uint64_t *visited);

/* Rows given, not learned (a model file read back: downpour eval, --init):
 * key i's weights become w[i*D .. (i+1)*D), a row made for a key without
 * one (zero optimizer state, no steps, at the table's version), an
 * existing row's state kept. d must be the width; every value finite;
 * the new rows within max_rows. -1 with err and nothing changed. */
int dp_rows_put(dp_rows_t *t, const uint64_t *keys, size_t n, int d, const float *w, char *err);

/* Worst-case bytes per row (weights, state, bookkeeping, map entry). */
size_t dp_rows_bytes_per_row(int d, dp_row_optim_kind_t kind);

/* splitmix64 of the key: the table's and the sharding's hash. */
static inline uint64_t dp_rows_hash(uint64_t key)
{
    uint64_t z = key + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
/* The shard of K (1 .. 2^32 - 1) that holds key: the hash's high 32 bits
 * scaled to [0, K) (a multiply, no modulo bias worth the name). */
static inline uint32_t dp_rows_shard_of(uint64_t key, uint32_t k)
{
    return (uint32_t)(((dp_rows_hash(key) >> 32) * (uint64_t)k) >> 32);
}

#endif
