/* devregion: the device region protocol — how a shard whose weights live on
 * a device shares them with the workers beside it, and takes their
 * gradients, without a copy through the host. Written against the ops of
 * proto/devmem.h, so the same code runs on the CPU stand-in (every test) and
 * on CUDA; it knows nothing of either.
 *
 * The region, made once by the shard (dp_devregion_create):
 *   - the control page: a sealed memfd (proto/shm.h, read-only to every
 *     other process) with the header (magic, layout, n floats, ring length,
 *     worker slots, generation), per ring entry a seq + version, per worker
 *     slot the pushes taken; only the shard writes it;
 *   - the ring: ring entries of n floats each (stride-aligned), in one
 *     device allocation the workers map read-only where the ops can;
 *   - per worker slot: a gradient of n floats in a device allocation of its
 *     own (one allocation per slot: a CUDA IPC handle maps its whole
 *     allocation read-write, so slots in one allocation would let each worker
 *     write every other's), an event, and a worker control page (a writable
 *     memfd: the worker's pin, pushes done, floats pushed, its pid while
 *     mapped). A worker's page is its own to scribble on, so the shard
 *     reads it as a peer's message: bounds checked, no pointer from it.
 * The handshake hands a worker a dp_devregion_offer_t (names, handles,
 * generation); the worker maps what it names (dp_devregion_attach).
 *
 * Versions: the shard publishes version v into a ring entry
 * (publish_begin / publish_end); a worker pins the newest entry and reads it
 * in place until it unpins. Pins, not the seqlock retry of proto/shm.h:
 * a GPU reads in place, asynchronously, for a whole forward and backward,
 * so a read can't be checked after the fact and retried; instead the shard
 * never begins writing an entry any worker pins. The race between a pin and
 * a write is closed as Dekker's: the shard makes the entry's seq odd, then
 * (seq_cst) looks at the pins; the worker stores its pin, then (seq_cst)
 * looks at the seq again: either the shard sees the pin (and backs off, seq
 * restored) or the worker sees the seq change (and tries again). The entry
 * a worker pins is never the one being written; the newest is never
 * overwritten either, so a publish needs one entry neither newest nor
 * pinned, and when there is none it says busy (workers keep the version they
 * have; a worker that pins forever costs the others fresh weights, never
 * wrong ones).
 *
 * Pushes: a worker writes its slot, records the event and waits for it,
 * then bumps its pushes counter (release); the counter is bumped only after
 * the write is done, so a worker killed mid-write leaves
 * a slot that is never taken. The worker writes again only when the shard
 * has taken its last push (taken == pushed). The shard takes push p only
 * when p == taken + 1 (a jump is refused and resynchronised), the event has
 * completed, the floats pushed are n; it copies the slot out before looking
 * at it (the worker could write it meanwhile), checks it finite and only
 * then applies it through the caller's callback.
 *
 * Restarts: each region has a random generation. A shard that goes away
 * retires its control page (and a killed one leaves its workers on a
 * transport error); a new one makes a new region with a new generation and
 * new handles; a worker re-maps from the new offer (dp_devregion_remap) and
 * never reads through the old mapping again: pin refuses a retired region.
 * Nothing is freed while mapped: the shard frees a slot's allocations only
 * when its worker no longer says it maps them (or its pid is gone). */
#ifndef DP_DEVREGION_H
#define DP_DEVREGION_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/devmem.h"
#include "proto/shm.h"

#define DP_DEVREGION_MAGIC 0x47524450u /* "PDRG" */
#define DP_DEVREGION_LAYOUT 1
#define DP_DEVREGION_MAX_RING 8
#define DP_DEVREGION_MAX_WORKERS 64
#define DP_DEVREGION_PIN_TRIES 64     /* a pin that loses this many races to publishes gives up */

/* The control page: written by the shard alone (sealed against others). */
typedef struct {
    uint32_t magic;                 /* DP_DEVREGION_MAGIC */
    uint32_t layout;                /* DP_DEVREGION_LAYOUT */
    uint64_t n;                     /* floats per ring entry and per gradient slot */
    uint64_t ring;                  /* ring entries */
    uint64_t workers;               /* gradient slots */
    uint64_t stride;                /* floats from one ring entry to the next (64-byte aligned) */
    uint64_t generation;            /* this region's, random, never 0 */
    _Atomic uint64_t retired;       /* 1: the shard left; re-map from a new offer */
    _Atomic uint64_t newest;        /* ring entry + 1 of the newest version (0: none yet) */
    struct {
        _Atomic uint64_t seq;       /* odd while the shard writes the entry */
        _Atomic uint64_t version;   /* the version the entry holds */
    } entry[DP_DEVREGION_MAX_RING];
    _Atomic uint64_t taken[DP_DEVREGION_MAX_WORKERS]; /* per slot: pushes taken (or refused) */
} dp_devregion_ctl_t;

/* A worker's control page: its own to write, a message to the shard. */
typedef struct {
    _Atomic uint64_t pin;           /* ring entry + 1 the worker reads (0: none) */
    _Atomic uint64_t pushed;        /* pushes completed */
    _Atomic uint64_t floats;        /* floats in the last push (must be n) */
    _Atomic uint64_t events;        /* event records (the stand-in's event) */
    _Atomic uint64_t mapped;        /* the worker's pid while it maps the region, else 0 */
} dp_devregion_wctl_t;

/* What the handshake carries from the shard to the worker of one slot. */
typedef struct {
    uint64_t generation;
    uint64_t n, ring, workers;
    uint32_t slot;
    char ctl[96], wctl[96];         /* the control pages' /proc/PID/fd/N */
    dp_devmem_handle_t weights;     /* the ring */
    dp_devmem_handle_t grad;        /* this slot's gradient */
    dp_devmem_handle_t event;       /* this slot's event */
    char device[DP_DEVMEM_DEVICE];  /* the ring's device (ops->device_of); "": not said */
} dp_devregion_offer_t;

typedef struct {
    dp_shm_t page;                  /* the worker's control page */
    dp_devregion_wctl_t *wctl;
    dp_devmem_t grad;               /* n floats */
    dp_devmem_event_t ev;
    dp_devmem_handle_t evh;         /* the event's handle, as made */
    int live;                       /* allocated and not freed yet */
} dp_devregion_slot_t;

typedef struct {
    const dp_devmem_ops_t *ops;
    dp_shm_t page;                  /* the control page */
    dp_devregion_ctl_t *ctl;
    dp_devmem_t weights;            /* ring x stride floats */
    size_t n, stride;               /* as made here: nothing computed from a page */
    int ring, workers;
    uint64_t generation;
    int writing;                    /* the entry publish_begin gave out, -1 none */
    uint64_t writing_version, writing_seq;
    uint64_t busy;                  /* publishes refused: every other entry pinned */
    uint64_t refused;               /* pushes refused */
    dp_devregion_slot_t slot[DP_DEVREGION_MAX_WORKERS];
} dp_devregion_shard_t;

typedef struct {
    const dp_devmem_ops_t *ops;
    dp_shm_t page, wpage;           /* the control page (read-only), ours */
    const dp_devregion_ctl_t *ctl;
    dp_devregion_wctl_t *wctl;
    dp_devmem_t weights, grad;
    dp_devmem_event_t ev;
    size_t n, stride;
    int ring, slot;
    uint64_t generation;
    int pinned;                     /* the entry we pin, -1 none */
} dp_devregion_worker_t;

/* Applies a gradient the shard took (a copy of ours, checked). */
typedef int (*dp_devregion_apply_fn)(void *ctx, const float *grad, size_t n, char *err);

/* ---- the shard ---- */

/* Make a region of ring entries and workers slots of n floats each. */
int dp_devregion_create(dp_devregion_shard_t *r, const dp_devmem_ops_t *ops, size_t n, int ring,
                        int workers, char *err);
/* What the worker of slot k is handed. */
int dp_devregion_offer(const dp_devregion_shard_t *r, int k, dp_devregion_offer_t *o, char *err);
/* Begin publishing version: the entry to write (n floats; a device pointer
 * on CUDA, whose writes must be done before publish_end), or NULL when
 * every entry but the newest is pinned (counted in busy). */
float *dp_devregion_publish_begin(dp_devregion_shard_t *r, uint64_t version);
void dp_devregion_publish_end(dp_devregion_shard_t *r);
/* Take slot k's push into scratch (n floats the ops can address) and apply
 * it: 1 applied, 0 nothing (complete) to take, -1 refused (err says why;
 * nothing applied, the slot resynchronised). */
int dp_devregion_take(dp_devregion_shard_t *r, int k, float *scratch, dp_devregion_apply_fn apply,
                      void *ctx, char *err);
/* Slot k's worker says HELLO again (a restart): whatever its slot holds
 * counted but never sent as a PUSH (its last process killed between the
 * count and the envelope) is dropped, never taken; the slot is free. */
void dp_devregion_drop(dp_devregion_shard_t *r, int k);
/* The shard leaves: its workers' pins fail from now on. */
void dp_devregion_retire(dp_devregion_shard_t *r);
/* Retire, then free what no live worker maps: returns the slots still
 * mapped (call again later; 0: everything freed). */
int dp_devregion_release(dp_devregion_shard_t *r);
/* The shard leaves for good (its loop's end): release, and where the ops'
 * memory survives a free in its mappers (survives_free) free the rest too,
 * nothing of this process's left behind; else what is still mapped stays
 * until the process exits. Returns the slots that were still mapped. */
int dp_devregion_release_last(dp_devregion_shard_t *r);

/* ---- the worker ---- */

/* Map the region an offer names, checking its header against the offer. */
int dp_devregion_attach(dp_devregion_worker_t *w, const dp_devmem_ops_t *ops,
                        const dp_devregion_offer_t *o, char *err);
/* After a new handshake: re-map when the offer's generation is not ours
 * (1), nothing when it is (0), -1 on error (detached). */
int dp_devregion_remap(dp_devregion_worker_t *w, const dp_devregion_offer_t *o, char *err);
/* Pin the newest version and give its n floats (read-only where the ops
 * can), its version in *version; NULL with err when the region is retired or
 * has no version yet. A pinned entry is never written until unpin (which a
 * GPU worker calls only once its reads are done). */
const float *dp_devregion_pin(dp_devregion_worker_t *w, uint64_t *version, char *err);
void dp_devregion_unpin(dp_devregion_worker_t *w);
/* Our gradient slot (n floats), writable when the shard has taken our last
 * push (dp_devregion_slot_free), else NULL. */
float *dp_devregion_slot(dp_devregion_worker_t *w);
int dp_devregion_slot_free(const dp_devregion_worker_t *w);
/* The slot's n floats are written (issued on stream): record, then count. */
int dp_devregion_push(dp_devregion_worker_t *w, void *stream, char *err);
/* How a worker reads a region (item 4 of two GPUs on one host): on its
 * own device (LOCAL); on another its device reaches by peer access
 * (PEER: the same copies, device to device, once access is on); or not
 * at all (HOST: it declines the offer and its tensors go through the
 * shard's shared memory, page-locked, as a worker's on another host). */
typedef enum { DP_DEVREGION_LOCAL, DP_DEVREGION_PEER, DP_DEVREGION_HOST } dp_devregion_route_t;
/* The decision alone: same device, else peer access where it can. */
dp_devregion_route_t dp_devregion_route(int same, int peer);
/* The route to a region on device (an offer's; "" or no ops to ask: LOCAL,
 * as before the offer said), peer access turned on when PEER; HOST with
 * why (one line) when the device cannot be reached or its access fails. */
dp_devregion_route_t dp_devregion_reach(const dp_devmem_ops_t *ops, const char *device, char *why);
/* Unpin, say we no longer map it, unmap; safe on a zeroed worker. */
void dp_devregion_detach(dp_devregion_worker_t *w);

#endif
