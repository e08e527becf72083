/* shm: the shared-memory segments of co-located workers — tensor bytes
 * move through memory while ZeroMQ carries the control messages.
 *
 * A shard that grants a worker's Hello.shm creates (once) a parameter
 * segment of DP_SHM_PARAM_SLOTS slots, each the shard's n floats, and per
 * such worker a gradient segment of one slot. Both are POSIX shm objects
 * made O_CREAT | O_EXCL with mode 0600 (only the server's user can open
 * them), named "/downpour-PID-SHARD-WHAT-RANDOM", and unlinked when the
 * shard stops.
 *
 * Layout: a header page (below), then the slots, each 64-byte aligned.
 * Consistency is a seqlock per slot: the server makes a slot's seq odd
 * before it writes the slot and even (one more) after; a PARAMS reply names
 * the slot and its even seq, and the reader's copy is good only if seq still
 * has that value after the copy (dp_shm_read_ok). Nothing in a segment is
 * trusted by its reader: the client checks the header against what the
 * WELCOME said, the server copies a gradient out of its segment before it
 * checks and applies it (the worker could write it meanwhile). */
#ifndef DP_SHM_H
#define DP_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define DP_SHM_MAGIC 0x48535044u  /* "DPSH" */
#define DP_SHM_LAYOUT 1
#define DP_SHM_PARAM_SLOTS 3      /* a reader is torn only if two versions land during its copy */
#define DP_SHM_MAX_SLOTS 4
#define DP_SHM_HEADER 4096        /* bytes before slot 0 */

typedef struct {
    uint32_t magic;                        /* DP_SHM_MAGIC */
    uint32_t layout;                       /* DP_SHM_LAYOUT */
    uint64_t n;                            /* floats per slot */
    uint64_t slots;                        /* slots in the segment */
    uint64_t stride;                       /* bytes from one slot to the next (64-aligned) */
    _Atomic uint64_t seq[DP_SHM_MAX_SLOTS]; /* per slot: odd while the server writes it */
} dp_shm_header_t;

typedef struct {
    char name[96];          /* the shm object's name ("" when closed) */
    void *base;             /* the mapping */
    size_t bytes;
    int owner;              /* created here: unlinked at close */
    dp_shm_header_t *hdr;   /* base */
    /* the layout as this process knows it: the header is the other side's
     * to scribble on, so no pointer is ever computed from it */
    size_t n, stride;
    int slots;
} dp_shm_t;

/* The bytes of a segment of slots x n floats. */
size_t dp_shm_bytes(size_t n, int slots);

/* Create and map a fresh segment (mode 0600) for slots x n floats, header
 * filled, every seq 0; what ("params", "grad-3") goes into its name. */
int dp_shm_create(dp_shm_t *s, int shard, const char *what, size_t n, int slots, char *err);

/* Open and map the segment name, which must hold slots x n floats (header,
 * size, owner and mode checked: ours, 0600). */
int dp_shm_open(dp_shm_t *s, const char *name, size_t n, int slots, char *err);

/* Unmap (and unlink, if we made it); safe on a zeroed or closed segment. */
void dp_shm_close(dp_shm_t *s);

/* Unlink the segments of servers that died without doing it (kill -9): our
 * user's /dev/shm/downpour-PID-* whose PID no longer runs. Returns how many
 * went. (A server in another PID namespace sharing this /dev/shm looks dead
 * too; unlinking its segment only stops new opens — mappings stay — and its
 * workers that say HELLO again fall back to frames, or fail with --transport
 * shm.) */
int dp_shm_sweep_stale(void);

/* Slot k's floats. */
float *dp_shm_slot(const dp_shm_t *s, int k);

/* Writer: slot k is about to change (seq odd) / holds a new version (seq
 * even); the latter returns the new seq. */
void dp_shm_write_begin(dp_shm_t *s, int k);
uint64_t dp_shm_write_end(dp_shm_t *s, int k);
/* The seq of slot k now. */
uint64_t dp_shm_seq(const dp_shm_t *s, int k);

/* Reader: copy n floats of slot k from float off into dst, then say
 * whether the copy is of seq (even, unchanged throughout): 1 good, 0 torn. */
int dp_shm_read(const dp_shm_t *s, int k, uint64_t seq, size_t off, float *dst, size_t n);

#endif
