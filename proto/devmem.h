/* devmem: the few things the device region protocol (proto/devregion.h)
 * needs from the memory a shard's weights live in, as an ops table. Two
 * implementations fill it: the CPU stand-in (proto/devmem_standin.c: memory
 * from a sealed memfd that both processes map, events as counters in a
 * control page), which lets `make test` run the whole protocol, faults
 * included, on a machine without a GPU; and CUDA (kernels/cuda/devmem_cuda.c:
 * cudaMalloc + cudaIpcGetMemHandle / cudaIpcOpenMemHandle, interprocess
 * events), built only with CUDA. The protocol knows nothing of either.
 *
 * A dp_devmem_t is one allocation as this process sees it: the owner made it
 * (alloc) and may free it; others map it from its handle (map) and unmap it.
 * A handle is opaque bytes the handshake carries (a memfd's /proc/PID/fd/N
 * name; a cudaIpcMemHandle_t). `ptr` is where this process addresses the
 * memory: a host pointer for the stand-in, a device pointer for CUDA, so
 * only `copy` and `all_finite` may touch it from the host. */
#ifndef DP_DEVMEM_H
#define DP_DEVMEM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define DP_DEVMEM_HANDLE 128      /* bytes of a handle (a CUDA IPC handle is 64) */
#define DP_DEVMEM_DEVICE 64       /* bytes of a device's name, NUL included (a PCI bus id is 13) */

/* Who besides the owner may write an allocation (as DP_SHM_*). */
#define DP_DEVMEM_READ_ONLY 0
#define DP_DEVMEM_WRITABLE 1

typedef struct {
    unsigned char b[DP_DEVMEM_HANDLE]; /* the implementation's bytes, zero padded */
} dp_devmem_handle_t;

typedef struct {
    void *ptr;        /* this process's address of the memory (device pointer on CUDA) */
    size_t bytes;     /* usable bytes from ptr */
    int owner;        /* allocated here: free, not unmap */
    int writable;     /* this process's mapping can be written (measured where it can be) */
    void *impl;       /* the implementation's own state */
} dp_devmem_t;

typedef struct {
    _Atomic uint64_t *ctr; /* the control page's counter this event shows (the stand-in's event) */
    void *impl;            /* CUDA: the cudaEvent_t */
    int owner;             /* created here: destroy it */
} dp_devmem_event_t;

typedef struct {
    const char *name; /* "standin", "cuda" */
    /* 1: memory freed here stays whole for the processes that map it (a
     * memfd lives while mapped), so a shard that leaves for good may free
     * its side at once; 0 (CUDA IPC, whose freed memory may be reused
     * under an importer): it must wait until no worker maps it. */
    int survives_free;
    /* Allocate bytes that others map with the given access (DP_DEVMEM_*);
     * what names it for diagnostics. */
    int (*alloc)(dp_devmem_t *m, size_t bytes, int others, const char *what, char *err);
    /* The handle another process on this host maps m by. */
    int (*export_handle)(const dp_devmem_t *m, dp_devmem_handle_t *h, char *err);
    /* Map an allocation of exactly bytes from its handle; DP_DEVMEM_READ_ONLY
     * asks for a mapping that cannot write, and m->writable says what was
     * got (CUDA IPC cannot give read-only: it says 1). */
    int (*map)(dp_devmem_t *m, const dp_devmem_handle_t *h, size_t bytes, int access, char *err);
    void (*unmap)(dp_devmem_t *m); /* a mapping: safe on a zeroed one */
    void (*free)(dp_devmem_t *m);  /* an allocation of ours: safe on a zeroed one */
    /* Copy bytes between any two addresses of this process (host or
     * device); the copy is done when it returns (an entry is published, or
     * unpinned, right after). */
    int (*copy)(void *dst, const void *src, size_t bytes, char *err);
    /* Are n floats at p (a copy of ours) all finite: 1 yes, 0 no, -1 error. */
    int (*all_finite)(const float *p, size_t n, char *err);
    /* Events: the shard creates one per gradient slot and exports it; the
     * worker opens it and records it after its writes to the slot are
     * issued; the shard asks whether the writes a record covers are done.
     * ctr is the control page's counter of records (the stand-in's whole
     * event; CUDA leaves it to the protocol). */
    int (*event_create)(dp_devmem_event_t *e, _Atomic uint64_t *ctr, dp_devmem_handle_t *h,
                        char *err);
    int (*event_open)(dp_devmem_event_t *e, _Atomic uint64_t *ctr, const dp_devmem_handle_t *h,
                      char *err);
    /* Record on stream (NULL: the default one); the stand-in's writes are
     * done when it returns, so the record is the counter's increment. */
    int (*event_record)(dp_devmem_event_t *e, void *stream, char *err);
    /* Block until the work before the last record is done (the stand-in's
     * is done at the record). */
    int (*event_wait)(dp_devmem_event_t *e, char *err);
    /* Is the work before record number `want` done: 1 yes, 0 not yet, -1 error. */
    int (*event_query)(dp_devmem_event_t *e, uint64_t want, char *err);
    void (*event_destroy)(dp_devmem_event_t *e); /* safe on a zeroed one */
    /* Where a worker can read the region from (proto/devregion.h's
     * dp_devregion_reach decides; these are the facts). device_of: the
     * device m lies on, as every process on this host names it (CUDA: its
     * PCI bus id, since device numbers depend on CUDA_VISIBLE_DEVICES;
     * the stand-in: "standin"), into id (DP_DEVMEM_DEVICE bytes). reach:
     * from this thread's device, is device id this one (*same), else can
     * it map id's memory by peer access (*peer); a device this process
     * cannot see is neither. peer_enable: turn that access on for this
     * thread's device (once per pair; on already is fine). */
    int (*device_of)(const dp_devmem_t *m, char *id, char *err);
    int (*reach)(const char *id, int *same, int *peer, char *err);
    int (*peer_enable)(const char *id, char *err);
} dp_devmem_ops_t;

/* The CPU stand-in (proto/devmem_standin.c). */
extern const dp_devmem_ops_t dp_devmem_standin;
/* The provider the test hook DP_TEST_DEVMEM=standin names (the stand-in;
 * also standin:peer and standin:nopeer, where the stand-in's reach says
 * the region is on another device, with and without peer access), else
 * NULL: the one place that reads it (proto/devmem_standin.c). The
 * CUDA provider comes with a device: a shard's --device cuda:N and a GPU
 * worker's backend find it through kernels/backend.h's
 * dp_devmem_for_device; the hook, when set, wins on both sides. */
const dp_devmem_ops_t *dp_devmem_test_provider(void);
/* DP_TEST_DEVMEM=off: no device region at all, the device's neither. */
int dp_devmem_test_off(void);
/* CUDA (kernels/cuda/devmem_cuda.c), in the CUDA module and the GPU tests
 * only; dp_devmem_cuda_on puts the calling thread on device first (NULL
 * with err when it cannot). */
extern const dp_devmem_ops_t dp_devmem_cuda;
const dp_devmem_ops_t *dp_devmem_cuda_on(int device, char *err);

#endif
