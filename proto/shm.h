/* shm: the shared-memory segments of co-located workers — tensor bytes
 * move through memory while ZeroMQ carries the control messages.
 *
 * A shard that grants a worker's Hello.shm creates (once) a parameter
 * segment of DP_SHM_PARAM_SLOTS slots, each the shard's n floats, and per
 * such worker a gradient segment of one slot. Each is an anonymous memfd
 * (memfd_create), mode 0600, that never has a name in /dev/shm: a worker
 * on this host opens it as /proc/SERVER_PID/fd/FD, which the kernel allows
 * only to processes of the server's user (and root) in its PID namespace.
 * The memory goes when its last mapping does, so a server killed with
 * kill -9 leaves nothing behind (its workers' mappings hold it until they
 * say HELLO again or exit).
 *
 * Seals (F_ADD_SEALS) make what each side may do a property of the memory,
 * not of who opens it: every segment's size is fixed (F_SEAL_SHRINK |
 * F_SEAL_GROW: no SIGBUS from a truncated segment under the other side's
 * mapping), and the parameter segment is sealed against writes
 * (F_SEAL_FUTURE_WRITE): the server's own mapping, made before the seal,
 * is the only writable one there will ever be. A worker, or any process of
 * the user, root included, that opens it O_RDWR still cannot write(),
 * mmap it writable, mprotect a mapping writable, punch a hole or resize
 * it; the slots can be the shard's live weights. A worker maps it
 * PROT_READ and checks the seals are there before using it.
 *
 * Layout: a header page (below), then the slots, each 64-byte aligned.
 * Consistency is a seqlock per slot: the server makes a slot's seq odd
 * before it writes the slot and even (one more) after; a PARAMS reply names
 * the slot and its even seq, and the reader's copy is good only if seq still
 * has that value after the copy (dp_shm_read). Nothing in a segment is
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

/* Who may write a segment besides its creator. */
#define DP_SHM_READ_ONLY 0  /* nobody: sealed (the parameter segment) */
#define DP_SHM_WRITABLE 1   /* whoever opens it (a worker's gradient segment) */

typedef struct {
    char name[96];          /* "/proc/PID/fd/FD", how others open it ("" when closed) */
    void *base;             /* the mapping (read-only unless created here or opened writable) */
    size_t bytes;
    int owner;              /* created here: fd is ours to close */
    int fd;                 /* owner: the memfd, open while others may open it */
    dp_shm_header_t *hdr;   /* base */
    /* the layout as this process knows it: the header is the other side's
     * to scribble on, so no pointer is ever computed from it */
    size_t n, stride;
    int slots;
} dp_shm_t;

/* The bytes of a segment of slots x n floats. */
size_t dp_shm_bytes(size_t n, int slots);

/* Create and map (read-write, for us) a fresh segment for slots x n
 * floats, header filled, every seq 0, sealed to its size and, with
 * DP_SHM_READ_ONLY, against every write but ours; what ("params",
 * "grad-3") names the memfd (as /proc/PID/fd shows it). Fails on a kernel
 * without F_SEAL_FUTURE_WRITE (Linux 5.1) rather than share memory others
 * could write. */
int dp_shm_create(dp_shm_t *s, int shard, const char *what, size_t n, int slots, int others,
                  char *err);

/* Open and map the segment name ("/proc/PID/fd/FD" and nothing else),
 * which must hold exactly slots x n floats: a regular file of our user,
 * mode 0600, sealed to its size, the header describing that layout.
 * DP_SHM_READ_ONLY maps it PROT_READ and requires the write seal;
 * DP_SHM_WRITABLE maps it read-write. */
int dp_shm_open(dp_shm_t *s, const char *name, size_t n, int slots, int access, char *err);

/* Unmap (and close the memfd, if we made it); safe on a zeroed or closed
 * segment. */
void dp_shm_close(dp_shm_t *s);

/* Should a peer at this ZeroMQ Peer-Address (zmq_msg_gets) be offered
 * shared memory? Only when it is on this host: a unix socket (ipc, which
 * ZeroMQ reports as "localhost" and the peer's credentials) or a loopback
 * address (127.0.0.0/8, ::1, ::ffff:127.x.y.z). NULL or anything else: 0.
 * A worker that reaches its server on this host by a routable address gets
 * frames. */
int dp_shm_peer_local(const char *peer_address);

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
