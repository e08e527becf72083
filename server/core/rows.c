/* rows: the sparse row table (rows.h has the contract and the memory
 * model). Three structures:
 *   - the arena: chunks of chunk_rows slots, each slot a row's D weights
 *     and S x D state (vals) and its bookkeeping (meta); chunks are never
 *     moved or freed before the table, so a slot index and a row's
 *     pointers stay valid while the row lives; evicted slots go on a free
 *     list (LIFO, threaded through meta.link) and are reused first;
 *   - the key map: open addressing with linear probing from the key
 *     hash's low bits, keys stored exactly, removal by backward shift (no
 *     tombstones, so probe runs stay short after evictions); grown by
 *     doubling past 3/4 load;
 *   - the pending table: the same map with each key's sightings and the
 *     version it was last seen at;
 *   - the key tree: the live slots ordered by key (a treap threaded through
 *     meta.left / right, each key's priority a hash of it), so a scan's
 *     page (dp_rows_keys_page) walks only the keys it lists and the paths
 *     to them, not the table. Its shape is a function of the keys held
 *     alone (priorities are distinct: the hash is a bijection), whatever
 *     the order of inserts and removals: it is not saved, digested or
 *     replayed, only rebuilt. Every walk is a loop, never recursion, so a
 *     deep tree (keys chosen against the hash) costs time, not the stack.
 * Invariants: a slot is live iff its meta.touched != S_FREE, and then
 * the map and the tree hold its key with that slot; map.count == live
 * rows. */
#include "server/core/rows.h"

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define S_EMPTY UINT32_MAX  /* a map entry's val when the entry is free */
#define S_FREE UINT64_MAX   /* meta.touched of a free slot */
#define S_NONE UINT32_MAX   /* the free list's end */

typedef struct {
    uint64_t key;      /* the row's key */
    uint64_t touched;  /* the version of its last push; S_FREE: a free slot */
    uint32_t steps;    /* optimizer steps (adam's bias correction) */
    uint32_t link;     /* free slot: the next free one */
    uint32_t left;     /* live slot: the key tree's children (S_NONE: none); */
    uint32_t right;    /* not saved: the tree is a function of the keys held */
} s_meta_t;

typedef struct {
    float *vals;       /* chunk_rows x stride floats */
    s_meta_t *meta;    /* chunk_rows */
} s_chunk_t;

typedef struct {
    uint64_t *keys;    /* cap */
    uint32_t *vals;    /* cap: slot (rows) or sightings (pending); S_EMPTY: free */
    uint64_t *seen;    /* cap, pending only: the version of the last sighting; else NULL */
    size_t cap;        /* a power of two */
    size_t count;      /* entries in use */
} s_map_t;

struct dp_rows {
    dp_rows_conf_t c;           /* with every default filled in */
    int s;                      /* state floats per element */
    size_t stride;              /* floats per slot: D (1 + s) */
    int chunk_shift;            /* log2(chunk_rows) */
    s_chunk_t *chunks;          /* nchunks in use, chunks_cap allocated */
    size_t nchunks, chunks_cap;
    uint32_t hwm;               /* slots ever handed out: [0, hwm) */
    uint32_t free_head;         /* the free list; S_NONE: empty */
    uint32_t root;              /* the key tree's root slot; S_NONE: no row */
    s_map_t map;                /* key -> slot */
    s_map_t pend;               /* key -> sightings, seen */
    uint32_t row_cursor;        /* the sweep's next slot */
    size_t pend_cursor;         /* the sweep's next pending entry */
    uint64_t *dkeys;            /* the duplicate check: dcap keys */
    uint32_t *dstamp;           /* dcap stamps; == stamp: in this push */
    size_t dcap;
    uint32_t stamp;             /* this push's stamp */
    dp_rows_stats_t st;         /* counters (rows, pending, bytes derived) */
};

/* ---- the map ------------------------------------------------------------ */

static void s_map_alloc(s_map_t *m, size_t cap, int with_seen)
{
    m->cap = cap;
    m->count = 0;
    m->keys = dp_malloc(cap * sizeof *m->keys);
    m->vals = dp_malloc(cap * sizeof *m->vals);
    m->seen = with_seen ? dp_malloc(cap * sizeof *m->seen) : NULL;
    for (size_t i = 0; i < cap; i++) m->vals[i] = S_EMPTY;
}

static void s_map_free(s_map_t *m)
{
    free(m->keys);
    free(m->vals);
    free(m->seen);
    memset(m, 0, sizeof *m);
}

static size_t s_map_bytes(const s_map_t *m)
{
    return m->cap * (sizeof *m->keys + sizeof *m->vals + (m->seen ? sizeof *m->seen : 0));
}

/* key's entry, or SIZE_MAX. */
static size_t s_map_find(const s_map_t *m, uint64_t key)
{
    size_t mask = m->cap - 1;
    for (size_t i = dp_rows_hash(key) & mask;; i = (i + 1) & mask) {
        if (m->vals[i] == S_EMPTY) return SIZE_MAX;
        if (m->keys[i] == key) return i;
    }
}

/* Place an absent key; no growth. */
static size_t s_map_place(s_map_t *m, uint64_t key, uint32_t val, uint64_t seen)
{
    size_t mask = m->cap - 1, i = dp_rows_hash(key) & mask;
    while (m->vals[i] != S_EMPTY) i = (i + 1) & mask;
    m->keys[i] = key;
    m->vals[i] = val;
    if (m->seen) m->seen[i] = seen;
    m->count++;
    return i;
}

/* Insert an absent key, doubling the map first past 3/4 load. The old
 * entries are placed again in index order: deterministic. */
static size_t s_map_insert(s_map_t *m, uint64_t key, uint32_t val, uint64_t seen)
{
    if ((m->count + 1) * 4 > m->cap * 3) {
        s_map_t old = *m;
        s_map_alloc(m, old.cap * 2, old.seen != NULL);
        for (size_t i = 0; i < old.cap; i++)
            if (old.vals[i] != S_EMPTY)
                s_map_place(m, old.keys[i], old.vals[i], old.seen ? old.seen[i] : 0);
        s_map_free(&old);
    }
    return s_map_place(m, key, val, seen);
}

/* Remove entry i by backward shift: each later entry of the run moves back
 * into the hole when its home is at or before the hole (cyclically), so
 * every key stays reachable from its home without tombstones. */
static void s_map_remove_at(s_map_t *m, size_t i)
{
    size_t mask = m->cap - 1;
    m->vals[i] = S_EMPTY;
    m->count--;
    for (size_t j = (i + 1) & mask; m->vals[j] != S_EMPTY; j = (j + 1) & mask) {
        size_t home = dp_rows_hash(m->keys[j]) & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            if (m->seen) m->seen[i] = m->seen[j];
            m->vals[j] = S_EMPTY;
            i = j;
        }
    }
}

/* ---- the arena ---------------------------------------------------------- */

static inline s_meta_t *s_meta(const dp_rows_t *t, uint32_t slot)
{
    return &t->chunks[slot >> t->chunk_shift].meta[slot & (t->c.chunk_rows - 1)];
}

static inline float *s_vals(const dp_rows_t *t, uint32_t slot)
{
    return t->chunks[slot >> t->chunk_shift].vals + (size_t)(slot & (t->c.chunk_rows - 1)) * t->stride;
}

/* A slot for a new row: the last freed one, else the next never used
 * (a new chunk when the last is full). */
static uint32_t s_slot_take(dp_rows_t *t)
{
    if (t->free_head != S_NONE) {
        uint32_t s = t->free_head;
        t->free_head = s_meta(t, s)->link;
        return s;
    }
    if (((size_t)t->hwm >> t->chunk_shift) == t->nchunks) {
        if (t->nchunks == t->chunks_cap) {
            t->chunks_cap = t->chunks_cap ? t->chunks_cap * 2 : 16;
            t->chunks = dp_realloc(t->chunks, t->chunks_cap * sizeof *t->chunks);
        }
        s_chunk_t *ch = &t->chunks[t->nchunks++];
        ch->vals = dp_aligned_alloc((size_t)t->c.chunk_rows * t->stride * sizeof(float));
        ch->meta = dp_malloc((size_t)t->c.chunk_rows * sizeof *ch->meta);
    }
    return t->hwm++;
}

/* ---- the key tree --------------------------------------------------------- */

/* A key's place in the heap order (the tree's root has the highest): a
 * bijective mix other than the map's, so the two orders are unrelated. */
static inline uint64_t s_prio(uint64_t key)
{
    return dp_rows_hash(key ^ 0xd6e8feb86659fd93ULL);
}

/* Put the live slot into the tree: down to the first node of lower
 * priority, whose subtree is split around the key into the slot's two
 * children. */
static void s_tree_insert(dp_rows_t *t, uint32_t slot)
{
    s_meta_t *x = s_meta(t, slot);
    uint64_t pri = s_prio(x->key);
    uint32_t *link = &t->root;
    while (*link != S_NONE) {
        s_meta_t *m = s_meta(t, *link);
        if (s_prio(m->key) < pri) break;
        link = x->key < m->key ? &m->left : &m->right;
    }
    uint32_t cur = *link, *l = &x->left, *r = &x->right;
    while (cur != S_NONE) {
        s_meta_t *m = s_meta(t, cur);
        if (m->key < x->key) *l = cur, l = &m->right, cur = m->right;
        else *r = cur, r = &m->left, cur = m->left;
    }
    *l = *r = S_NONE;
    *link = slot;
}

/* Take key out of the tree: its children merged in its place (the one of
 * higher priority on top, all the way down). */
static void s_tree_remove(dp_rows_t *t, uint64_t key)
{
    uint32_t *link = &t->root;
    while (*link != S_NONE && s_meta(t, *link)->key != key) {
        s_meta_t *m = s_meta(t, *link);
        link = key < m->key ? &m->left : &m->right;
    }
    if (*link == S_NONE) return;
    s_meta_t *x = s_meta(t, *link);
    uint32_t a = x->left, b = x->right; /* every key of a < every key of b */
    while (a != S_NONE && b != S_NONE) {
        s_meta_t *ma = s_meta(t, a), *mb = s_meta(t, b);
        if (s_prio(ma->key) > s_prio(mb->key)) *link = a, link = &ma->right, a = ma->right;
        else *link = b, link = &mb->left, b = mb->left;
    }
    *link = a != S_NONE ? a : b;
}

/* The initial value of key's row: zeros, or uniform in [-scale, scale)
 * from splitmix64 over (seed, key, element): the top 24 bits of each hash
 * as a float in [0, 1), exact, so the value is the same on every machine. */
static void s_init_row(const dp_rows_conf_t *c, uint64_t key, float *w)
{
    if (c->init == DP_ROWS_INIT_ZERO) {
        memset(w, 0, (size_t)c->width * sizeof *w);
        return;
    }
    uint64_t base = dp_rows_hash(c->seed ^ dp_rows_hash(key));
    for (int j = 0; j < c->width; j++) {
        uint64_t h = dp_rows_hash(base + (uint64_t)j);
        float u = (float)(h >> 40) * (1.0f / 16777216.0f);
        w[j] = (2.0f * u - 1.0f) * c->init_scale;
    }
}

/* A new row for key at version: its slot, initial weights, zero state. */
static uint32_t s_row_new(dp_rows_t *t, uint64_t key, uint64_t version)
{
    uint32_t slot = s_slot_take(t);
    s_meta_t *m = s_meta(t, slot);
    m->key = key;
    m->touched = version;
    m->steps = 0;
    m->link = S_NONE;
    float *v = s_vals(t, slot);
    s_init_row(&t->c, key, v);
    memset(v + t->c.width, 0, (t->stride - (size_t)t->c.width) * sizeof *v);
    s_map_insert(&t->map, key, slot, 0);
    s_tree_insert(t, slot);
    t->st.created++;
    return slot;
}

static void s_row_evict(dp_rows_t *t, uint32_t slot)
{
    s_meta_t *m = s_meta(t, slot);
    size_t i = s_map_find(&t->map, m->key);
    if (i != SIZE_MAX) s_map_remove_at(&t->map, i);
    s_tree_remove(t, m->key);
    m->touched = S_FREE;
    m->link = t->free_head;
    t->free_head = slot;
    t->st.evicted++;
}

/* ---- the table ------------------------------------------------------------ */

void dp_rows_conf_default(dp_rows_conf_t *c, int d, dp_row_optim_kind_t kind)
{
    memset(c, 0, sizeof *c);
    c->width = d;
    dp_row_optim_conf_default(&c->optim, kind);
    c->init = DP_ROWS_INIT_ZERO;
    c->init_scale = 0.01f;
}

static int s_conf_check(dp_rows_conf_t *c, char *err)
{
    if (c->width < 1 || c->width > DP_ROWS_MAX_WIDTH)
        return dp_err(err, "row table width %d: 1 .. %d", c->width, DP_ROWS_MAX_WIDTH);
    if (dp_row_optim_check(&c->optim, err) != 0) return -1;
    if (c->init != DP_ROWS_INIT_ZERO && c->init != DP_ROWS_INIT_UNIFORM)
        return dp_err(err, "row table init %d: zero or uniform", (int)c->init);
    if (c->init == DP_ROWS_INIT_UNIFORM && !(isfinite(c->init_scale) && c->init_scale > 0))
        return dp_err(err, "row table init scale %g: a finite number > 0", (double)c->init_scale);
    if (c->init == DP_ROWS_INIT_UNIFORM && c->optim.kind == DP_ROW_FTRL)
        return dp_err(err, "row table: ftrl rows start at zero (their weights are a "
                           "function of z and n); use the zero init");
    if (c->max_keys == 0) c->max_keys = DP_ROWS_DEFAULT_KEYS;
    if (c->max_keys > DP_ROWS_MAX_KEYS)
        return dp_err(err, "row table max keys %u: at most %u", c->max_keys, DP_ROWS_MAX_KEYS);
    if (c->max_rows == 0) c->max_rows = DP_ROWS_MAX_ROWS;
    if (c->max_rows > DP_ROWS_MAX_ROWS)
        return dp_err(err, "row table max rows %llu: at most %llu",
                      (unsigned long long)c->max_rows, (unsigned long long)DP_ROWS_MAX_ROWS);
    if (c->admit_after > DP_ROWS_MAX_ADMIT)
        return dp_err(err, "row table admission after %u sightings: at most %u", c->admit_after,
                      DP_ROWS_MAX_ADMIT);
    if (c->admit_max == 0) c->admit_max = DP_ROWS_DEFAULT_PENDING;
    if (c->admit_max > DP_ROWS_MAX_PENDING)
        return dp_err(err, "row table admission table of %u keys: at most %u", c->admit_max,
                      DP_ROWS_MAX_PENDING);
    if (c->sweep_per_push == 0) c->sweep_per_push = DP_ROWS_DEFAULT_SWEEP;
    if (c->chunk_rows == 0) c->chunk_rows = DP_ROWS_DEFAULT_CHUNK;
    if (c->chunk_rows & (c->chunk_rows - 1) || c->chunk_rows > (1u << 24))
        return dp_err(err, "row table chunk of %u rows: a power of two, at most 2^24",
                      c->chunk_rows);
    return 0;
}

dp_rows_t *dp_rows_new(const dp_rows_conf_t *conf, char *err)
{
    dp_rows_conf_t c = *conf;
    if (s_conf_check(&c, err) != 0) return NULL;
    dp_rows_t *t = dp_calloc(1, sizeof *t);
    t->c = c;
    t->s = dp_row_optim_state_per_elem(c.optim.kind);
    t->stride = (size_t)c.width * (size_t)(1 + t->s);
    while ((1u << t->chunk_shift) < c.chunk_rows) t->chunk_shift++;
    t->free_head = S_NONE;
    t->root = S_NONE;
    s_map_alloc(&t->map, 16, 0);
    s_map_alloc(&t->pend, 16, 1);
    t->dcap = 16;
    while (t->dcap < 2 * (size_t)c.max_keys) t->dcap *= 2;
    t->dkeys = dp_malloc(t->dcap * sizeof *t->dkeys);
    t->dstamp = dp_calloc(t->dcap, sizeof *t->dstamp);
    return t;
}

void dp_rows_destroy(dp_rows_t **tp)
{
    dp_rows_t *t = tp ? *tp : NULL;
    if (!t) return;
    for (size_t i = 0; i < t->nchunks; i++) {
        free(t->chunks[i].vals);
        free(t->chunks[i].meta);
    }
    free(t->chunks);
    s_map_free(&t->map);
    s_map_free(&t->pend);
    free(t->dkeys);
    free(t->dstamp);
    free(t);
    *tp = NULL;
}

int dp_rows_width(const dp_rows_t *t)
{
    return t->c.width;
}

size_t dp_rows_bytes_per_row(int d, dp_row_optim_kind_t kind)
{
    /* weights and state; meta; a 12-byte map entry at 3/8 load at worst */
    return (size_t)d * 4 * (size_t)(1 + dp_row_optim_state_per_elem(kind)) + sizeof(s_meta_t) +
           32;
}

long dp_rows_pull(const dp_rows_t *t, const uint64_t *keys, size_t n, int d, float *out,
                  char *err)
{
    if (d != t->c.width)
        return dp_err(err, "pull of rows of width %d: this table's rows have %d floats", d,
                      t->c.width);
    if (n > t->c.max_keys)
        return dp_err(err, "pull of %zu keys: at most %u a request", n, t->c.max_keys);
    long present = 0;
    for (size_t i = 0; i < n; i++) {
        float *o = out + i * (size_t)d;
        size_t e = s_map_find(&t->map, keys[i]);
        if (e == SIZE_MAX) {
            s_init_row(&t->c, keys[i], o);
            continue;
        }
        memcpy(o, s_vals(t, t->map.vals[e]), (size_t)d * sizeof *o);
        present++;
    }
    return present;
}

/* 0 if no key of keys[0..n) appears twice, else -1 with *dup the key.
 * An open-addressing set over the preallocated scratch, emptied in O(1)
 * by moving to a new stamp (cleared only when the stamp wraps). */
static int s_unique(dp_rows_t *t, const uint64_t *keys, size_t n, uint64_t *dup)
{
    if (++t->stamp == 0) {
        memset(t->dstamp, 0, t->dcap * sizeof *t->dstamp);
        t->stamp = 1;
    }
    size_t mask = t->dcap - 1;
    for (size_t k = 0; k < n; k++) {
        size_t i = dp_rows_hash(keys[k]) & mask;
        for (; t->dstamp[i] == t->stamp; i = (i + 1) & mask)
            if (t->dkeys[i] == keys[k]) {
                *dup = keys[k];
                return -1;
            }
        t->dstamp[i] = t->stamp;
        t->dkeys[i] = keys[k];
    }
    return 0;
}

/* The whole push checked before anything changes (rows.h). */
static int s_push_check(dp_rows_t *t, uint64_t version, const uint64_t *keys, size_t n, int d,
                        const float *grads, char *err)
{
    if (d != t->c.width)
        return dp_err(err, "push of rows of width %d: this table's rows have %d floats", d,
                      t->c.width);
    if (n > t->c.max_keys)
        return dp_err(err, "push of %zu keys: at most %u a request", n, t->c.max_keys);
    if (version == S_FREE || version < t->st.version)
        return dp_err(err, "push at version %llu: the row table is at version %llu",
                      (unsigned long long)version, (unsigned long long)t->st.version);
    for (size_t i = 0; i < n * (size_t)d; i++)
        if (!isfinite(grads[i]))
            return dp_err(err, "push: the gradient of key %llu (row %zu) holds %g at %zu: "
                               "nothing applied", (unsigned long long)keys[i / (size_t)d],
                          i / (size_t)d, (double)grads[i], i % (size_t)d);
    uint64_t dup;
    if (s_unique(t, keys, n, &dup) != 0)
        return dp_err(err, "push: key %llu appears twice: nothing applied",
                      (unsigned long long)dup);
    return 0;
}

/* A push of a key with no row: count its sighting; 1 when it is now
 * admitted (its row is to be made), 0 when it stays pending. */
static int s_sighting(dp_rows_t *t, uint64_t key, uint64_t version)
{
    if (t->c.admit_after <= 1) return 1;
    size_t e = s_map_find(&t->pend, key);
    if (e == SIZE_MAX) {
        if (t->pend.count >= t->c.admit_max) {
            t->st.dropped_pending_full++;
            return 0;
        }
        s_map_insert(&t->pend, key, 1, version);
        return 0;
    }
    t->pend.seen[e] = version;
    if (t->pend.vals[e] + 1 < t->c.admit_after) {
        t->pend.vals[e]++;
        return 0;
    }
    /* the K-th sighting; it stays pending at K - 1 if no row can be made */
    if (t->map.count >= t->c.max_rows) return 1;
    s_map_remove_at(&t->pend, e);
    t->st.admitted++;
    return 1;
}

long dp_rows_push(dp_rows_t *t, uint64_t version, const uint64_t *keys, size_t n, int d,
                  const float *grads, char *err)
{
    if (s_push_check(t, version, keys, n, d, grads, err) != 0) {
        t->st.rejected++;
        return -1;
    }
    t->st.version = version;
    long stepped = 0;
    /* sparse_adam's count: this push's place among the table's pushes */
    const int table_steps = dp_row_optim_table_steps(t->c.optim.kind);
    const uint32_t table_t = t->st.pushes < UINT32_MAX ? (uint32_t)t->st.pushes + 1 : UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t e = s_map_find(&t->map, keys[i]);
        uint32_t slot;
        if (e != SIZE_MAX) {
            slot = t->map.vals[e];
        } else {
            if (!s_sighting(t, keys[i], version)) continue;
            if (t->map.count >= t->c.max_rows) {
                t->st.dropped_full++;
                continue;
            }
            slot = s_row_new(t, keys[i], version);
        }
        s_meta_t *m = s_meta(t, slot);
        if (m->steps < UINT32_MAX) m->steps++;
        m->touched = version;
        float *v = s_vals(t, slot);
        dp_row_optim_step(&t->c.optim, v, v + d, grads + i * (size_t)d, d, table_steps ? table_t : m->steps);
        stepped++;
    }
    t->st.pushes++;
    t->st.row_steps += (uint64_t)stepped;
    dp_rows_sweep(t, version, t->c.sweep_per_push);
    return stepped;
}

/* Idle: last touched more than T versions before v. */
static inline int s_idle(const dp_rows_t *t, uint64_t touched, uint64_t v)
{
    return t->c.evict_after > 0 && v > touched && v - touched > t->c.evict_after;
}

uint64_t dp_rows_sweep(dp_rows_t *t, uint64_t version, size_t budget)
{
    if (version > t->st.version && version != S_FREE) t->st.version = version;
    uint64_t v = t->st.version, before = t->st.evicted;
    if (t->c.evict_after == 0) return 0;
    for (size_t k = 0; k < budget && t->hwm > 0; k++) {
        if (t->row_cursor >= t->hwm) t->row_cursor = 0;
        uint32_t slot = t->row_cursor++;
        s_meta_t *m = s_meta(t, slot);
        if (m->touched != S_FREE && s_idle(t, m->touched, v)) s_row_evict(t, slot);
    }
    /* pending entries: a removal shifts a later entry into this index, so
     * the cursor stays to look at it again */
    for (size_t k = 0; k < budget && t->pend.count > 0; k++) {
        if (t->pend_cursor >= t->pend.cap) t->pend_cursor = 0;
        size_t i = t->pend_cursor;
        if (t->pend.vals[i] != S_EMPTY && s_idle(t, t->pend.seen[i], v)) {
            s_map_remove_at(&t->pend, i);
            t->st.pending_expired++;
        } else {
            t->pend_cursor++;
        }
    }
    return t->st.evicted - before;
}

int dp_rows_row(const dp_rows_t *t, uint64_t key, dp_rows_view_t *v)
{
    size_t e = s_map_find(&t->map, key);
    if (e == SIZE_MAX) return -1;
    uint32_t slot = t->map.vals[e];
    const s_meta_t *m = s_meta(t, slot);
    const float *vals = s_vals(t, slot);
    v->w = vals;
    v->state = t->s ? vals + t->c.width : NULL;
    v->steps = m->steps;
    v->touched = m->touched;
    v->slot = slot;
    return 0;
}

uint32_t dp_rows_pending(const dp_rows_t *t, uint64_t key)
{
    size_t e = s_map_find(&t->pend, key);
    return e == SIZE_MAX ? 0 : t->pend.vals[e];
}

void dp_rows_stats(const dp_rows_t *t, dp_rows_stats_t *out)
{
    *out = t->st;
    out->rows = t->map.count;
    out->pending = t->pend.count;
    size_t chunk = (size_t)t->c.chunk_rows * (t->stride * sizeof(float) + sizeof(s_meta_t));
    out->bytes = sizeof *t + t->chunks_cap * sizeof *t->chunks + t->nchunks * chunk +
                 s_map_bytes(&t->map) + s_map_bytes(&t->pend) +
                 t->dcap * (sizeof *t->dkeys + sizeof *t->dstamp);
}

uint64_t dp_rows_digest(const dp_rows_t *t)
{
    uint64_t h = dp_fnv1a(DP_FNV_SEED, &t->st.version, sizeof t->st.version);
    h = dp_fnv1a(h, &t->hwm, sizeof t->hwm);
    h = dp_fnv1a(h, &t->free_head, sizeof t->free_head);
    h = dp_fnv1a(h, &t->row_cursor, sizeof t->row_cursor);
    h = dp_fnv1a(h, &t->pend_cursor, sizeof t->pend_cursor);
    for (uint32_t s = 0; s < t->hwm; s++) {
        const s_meta_t *m = s_meta(t, s);
        if (m->touched == S_FREE) {
            h = dp_fnv1a(h, &m->link, sizeof m->link);
            continue;
        }
        h = dp_fnv1a(h, m, offsetof(s_meta_t, left)); /* the tree follows the keys */
        h = dp_fnv1a(h, s_vals(t, s), t->stride * sizeof(float));
    }
    for (size_t i = 0; i < t->pend.cap; i++)
        if (t->pend.vals[i] != S_EMPTY) {
            h = dp_fnv1a(h, &t->pend.keys[i], sizeof t->pend.keys[i]);
            h = dp_fnv1a(h, &t->pend.vals[i], sizeof t->pend.vals[i]);
            h = dp_fnv1a(h, &t->pend.seen[i], sizeof t->pend.seen[i]);
        }
    return h;
}

/* ---- save and load: the whole state as bytes ----------------------------- */

#define S_MAGIC "DPROWS01"

/* The fixed part of the bytes, before the slots. */
typedef struct {
    char magic[8];
    uint32_t width, kind, chunk_rows, hwm, free_head, row_cursor;
    uint64_t pend_cursor, map_cap, pend_cap;
    dp_rows_stats_t st;
} s_saved_t;

/* A slot's bookkeeping as saved (s_meta_t without its padding). */
#define S_SLOT_META 24

static size_t s_saved_len(size_t stride, uint64_t hwm, uint64_t pend_cap)
{
    return sizeof(s_saved_t) + hwm * (S_SLOT_META + stride * sizeof(float)) +
           pend_cap * (sizeof(uint64_t) + sizeof(uint32_t) + sizeof(uint64_t));
}

uint8_t *dp_rows_save(const dp_rows_t *t, size_t *len)
{
    *len = s_saved_len(t->stride, t->hwm, t->pend.cap);
    uint8_t *buf = dp_calloc(1, *len), *p = buf;
    s_saved_t h = {.width = (uint32_t)t->c.width, .kind = (uint32_t)t->c.optim.kind,
                   .chunk_rows = t->c.chunk_rows, .hwm = t->hwm, .free_head = t->free_head,
                   .row_cursor = t->row_cursor, .pend_cursor = t->pend_cursor,
                   .map_cap = t->map.cap, .pend_cap = t->pend.cap, .st = t->st};
    memcpy(h.magic, S_MAGIC, sizeof h.magic);
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    for (uint32_t s = 0; s < t->hwm; s++) {
        const s_meta_t *m = s_meta(t, s);
        memcpy(p, &m->key, 8), memcpy(p + 8, &m->touched, 8);
        memcpy(p + 16, &m->steps, 4), memcpy(p + 20, &m->link, 4);
        p += S_SLOT_META;
        if (m->touched != S_FREE) memcpy(p, s_vals(t, s), t->stride * sizeof(float));
        p += t->stride * sizeof(float);
    }
    memcpy(p, t->pend.keys, t->pend.cap * sizeof *t->pend.keys);
    p += t->pend.cap * sizeof *t->pend.keys;
    memcpy(p, t->pend.vals, t->pend.cap * sizeof *t->pend.vals);
    p += t->pend.cap * sizeof *t->pend.vals;
    memcpy(p, t->pend.seen, t->pend.cap * sizeof *t->pend.seen);
    return buf;
}

static int s_pow2_cap(uint64_t cap)
{
    return cap >= 16 && cap <= ((uint64_t)1 << 40) && !(cap & (cap - 1));
}

/* The saved header against t's conf and the bytes' length. */
static int s_load_check(const dp_rows_t *t, const s_saved_t *h, size_t len, char *err)
{
    if (memcmp(h->magic, S_MAGIC, sizeof h->magic) != 0) return dp_err(err, "not a saved row table");
    if (h->width != (uint32_t)t->c.width || h->kind != (uint32_t)t->c.optim.kind ||
        h->chunk_rows != t->c.chunk_rows)
        return dp_err(err, "a row table of width %u, %s rows, chunks of %u; this one: %d, %s, %u",
                      h->width, dp_row_optim_kind_name((dp_row_optim_kind_t)h->kind),
                      h->chunk_rows, t->c.width, dp_row_optim_kind_name(t->c.optim.kind),
                      t->c.chunk_rows);
    /* the key map is rebuilt, not read: its size at most the growth rule's
     * for hwm rows (doubled past 3/4 load) */
    uint64_t map_most = 4 * ((uint64_t)h->hwm > 16 ? (uint64_t)h->hwm : 16);
    if ((uint64_t)h->hwm > t->c.max_rows + (uint64_t)t->c.chunk_rows || !s_pow2_cap(h->map_cap) ||
        h->map_cap > map_most ||
        !s_pow2_cap(h->pend_cap) || h->pend_cursor > h->pend_cap || h->row_cursor > h->hwm ||
        (h->free_head != S_NONE && h->free_head >= h->hwm))
        return dp_err(err, "a saved row table's counts out of range (%u slots)", h->hwm);
    if (len != s_saved_len(t->stride, h->hwm, h->pend_cap))
        return dp_err(err, "a saved row table of %zu bytes; its counts say %zu", len,
                      s_saved_len(t->stride, h->hwm, h->pend_cap));
    return 0;
}

/* The saved slots into a new arena of t's shape, the key map rebuilt at
 * its saved size: n (the live rows) checked against the map's load, keys
 * unique, values finite, the free list a chain of free slots. */
static int s_load_slots(dp_rows_t *n, const s_saved_t *h, const uint8_t *p, char *err)
{
    size_t live = 0, fbytes = n->stride * sizeof(float);
    s_map_free(&n->map);
    s_map_alloc(&n->map, (size_t)h->map_cap, 0);
    for (uint32_t s = 0; s < h->hwm; s++, p += S_SLOT_META + fbytes) {
        uint32_t got = s_slot_take(n);
        s_meta_t *m = s_meta(n, got);
        memcpy(&m->key, p, 8), memcpy(&m->touched, p + 8, 8);
        memcpy(&m->steps, p + 16, 4), memcpy(&m->link, p + 20, 4);
        float *v = s_vals(n, got);
        memcpy(v, p + S_SLOT_META, fbytes);
        if (m->touched == S_FREE) {
            if (m->link != S_NONE && m->link >= h->hwm)
                return dp_err(err, "a saved row table's free slot %u links to %u", s, m->link);
            continue;
        }
        for (size_t j = 0; j < n->stride; j++)
            if (!isfinite(v[j])) return dp_err(err, "a saved row of key %llu is not finite",
                                               (unsigned long long)m->key);
        if ((++live + 1) * 4 > n->map.cap * 3)
            return dp_err(err, "a saved row table of more rows than its map holds");
        if (s_map_find(&n->map, m->key) != SIZE_MAX)
            return dp_err(err, "a saved row table holds key %llu twice", (unsigned long long)m->key);
        s_map_place(&n->map, m->key, got, 0);
        s_tree_insert(n, got);
    }
    /* the free list: free slots only, no cycle (at most hwm links) */
    uint32_t f = h->free_head;
    for (uint32_t k = 0; f != S_NONE; k++, f = s_meta(n, f)->link)
        if (k > h->hwm || s_meta(n, f)->touched != S_FREE)
            return dp_err(err, "a saved row table's free list is broken at slot %u", f);
    return 0;
}

int dp_rows_load(dp_rows_t *t, const uint8_t *buf, size_t len, char *err)
{
    s_saved_t h;
    if (len < sizeof h) return dp_err(err, "a saved row table of %zu bytes: too short", len);
    memcpy(&h, buf, sizeof h);
    if (s_load_check(t, &h, len, err) != 0) return -1;
    /* into a new table, swapped in whole once every check passed */
    char why[DP_ERR_LEN];
    dp_rows_t *n = dp_rows_new(&t->c, why);
    if (!n) return dp_err(err, "%s", why);
    const uint8_t *p = buf + sizeof h;
    if (s_load_slots(n, &h, p, err) != 0) {
        dp_rows_destroy(&n);
        return -1;
    }
    p += (size_t)h.hwm * (S_SLOT_META + n->stride * sizeof(float));
    s_map_free(&n->pend);
    s_map_alloc(&n->pend, (size_t)h.pend_cap, 1);
    memcpy(n->pend.keys, p, n->pend.cap * sizeof *n->pend.keys);
    p += n->pend.cap * sizeof *n->pend.keys;
    memcpy(n->pend.vals, p, n->pend.cap * sizeof *n->pend.vals);
    p += n->pend.cap * sizeof *n->pend.vals;
    memcpy(n->pend.seen, p, n->pend.cap * sizeof *n->pend.seen);
    for (size_t i = 0; i < n->pend.cap; i++) n->pend.count += n->pend.vals[i] != S_EMPTY;
    if (n->pend.count * 4 > n->pend.cap * 3) {
        dp_rows_destroy(&n);
        return dp_err(err, "a saved row table's pending keys overfill their map");
    }
    n->hwm = h.hwm, n->free_head = h.free_head, n->row_cursor = h.row_cursor;
    n->pend_cursor = (size_t)h.pend_cursor;
    n->st = h.st;
    dp_rows_t tmp = *t;
    *t = *n;
    *n = tmp;
    dp_rows_destroy(&n);
    return 0;
}

/* ---- the whole table, in key order (a model file's rows) ----------------- */

/* The walk's stack: the tree's nodes whose keys come next, the smallest on
 * top. At most S_WALK of them, the deepest kept: when one falls off the
 * bottom (a tree deeper than that), the walk descends again from the
 * root past the last key listed once the stack is empty. */
#define S_WALK 64

typedef struct {
    uint32_t s[S_WALK];  /* a ring: the bottom at lo, n entries */
    unsigned lo, n;
    int dropped;         /* an entry fell off the bottom */
} s_walk_t;

static void s_walk_push(s_walk_t *w, uint32_t slot)
{
    if (w->n == S_WALK) w->lo = (w->lo + 1) % S_WALK, w->n--, w->dropped = 1;
    w->s[(w->lo + w->n++) % S_WALK] = slot;
}

/* Down from cur: the nodes of keys >= from on its way (each the next
 * after those below it) pushed; *visits counts the nodes looked at. */
static void s_walk_down(const dp_rows_t *t, s_walk_t *w, uint32_t cur, uint64_t from,
                        uint64_t *visits)
{
    while (cur != S_NONE) {
        const s_meta_t *m = s_meta(t, cur);
        ++*visits;
        if (m->key >= from) s_walk_push(w, cur), cur = m->left;
        else cur = m->right;
    }
}

size_t dp_rows_keys_from(const dp_rows_t *t, uint64_t from, size_t max, uint64_t *keys)
{
    return dp_rows_keys_page(t, from, max, keys, NULL);
}

size_t dp_rows_keys_page(const dp_rows_t *t, uint64_t from, size_t max, uint64_t *keys,
                         uint64_t *visited)
{
    /* in order from the first key >= from: a node listed, then the left
     * spine of its right subtree (the keys between it and the next node
     * on the stack) */
    uint64_t visits = 0;
    size_t n = 0;
    s_walk_t w = {.n = 0};
    if (max > 0) s_walk_down(t, &w, t->root, from, &visits);
    while (n < max && w.n > 0) {
        const s_meta_t *m = s_meta(t, w.s[(w.lo + --w.n) % S_WALK]);
        keys[n++] = m->key;
        s_walk_down(t, &w, m->right, 0, &visits);
        if (w.n == 0 && w.dropped && m->key < UINT64_MAX) {
            w.dropped = 0;
            s_walk_down(t, &w, t->root, m->key + 1, &visits);
        }
    }
    if (visited) *visited = visits;
    return n;
}

int dp_rows_put(dp_rows_t *t, const uint64_t *keys, size_t n, int d, const float *w, char *err)
{
    if (d != t->c.width)
        return dp_err(err, "rows of width %d: this table's rows have %d floats", d, t->c.width);
    size_t fresh = 0;
    for (size_t i = 0; i < n; i++) {
        for (int j = 0; j < d; j++)
            if (!isfinite(w[i * (size_t)d + (size_t)j]))
                return dp_err(err, "key %" PRIu64 "'s row: element %d is not finite", keys[i], j);
        fresh += s_map_find(&t->map, keys[i]) == SIZE_MAX;
    }
    if (t->map.count + fresh > t->c.max_rows)
        return dp_err(err, "%zu new rows: the table holds at most %" PRIu64 " (%" PRIu64 " now)",
                      fresh, t->c.max_rows, (uint64_t)t->map.count);
    for (size_t i = 0; i < n; i++) {
        size_t e = s_map_find(&t->map, keys[i]);
        uint32_t slot = e == SIZE_MAX ? s_row_new(t, keys[i], t->st.version) : t->map.vals[e];
        memcpy(s_vals(t, slot), w + i * (size_t)d, (size_t)d * sizeof *w);
    }
    return 0;
}
