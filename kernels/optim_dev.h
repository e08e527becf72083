/* optim_dev: a parameter-server shard's optimizer step on a device — the
 * shard's weights and optimizer state kept in the device's memory and
 * stepped there, one fused kernel per step (issue 54, "a shard on the GPU").
 *
 * An ops table, as the backends' (kernels/backend.h): "cpu" is the
 * reference and the stand-in that lets a machine without a GPU run every
 * path (its memory is host memory apart from the caller's, so a missing
 * upload, download or snapshot wait shows as wrong bits, not as luck);
 * "cuda:K" is the CUDA module's (kernels/cuda/optim_dev_cuda.c and
 * optim_dev.cu), loaded from downpour-cuda.so only when asked for, so the
 * server binary links none of CUDA's libraries.
 *
 * Pointers named d_* live on the device. Steps and dc are queued in call
 * order on one compute stream; download waits for them. A snapshot is a
 * copy off the device on a side stream of its own, ordered after every
 * step queued before it; a step queued after it waits for the copy (so the
 * copy never reads a half-stepped vector), and the host buffer is whole
 * after snapshot_wait: the shard copies its live version out for PARAMS
 * replies and checkpoints while the next push's step is already queued.
 *
 * Rules are kernels/optim.h's, on the same layout (state_floats vectors of
 * n_all, [n_all] then [n_all]); the learning rate (schedule, staleness
 * scaling) and t come from the host as for dp_optim_step_from. The "cpu"
 * table calls kernels/optim.c itself: the same bits by construction. The
 * CUDA kernels are compiled without FMA contraction (-fmad=false) and
 * write each rule's float operations in the CPU's order with IEEE
 * division and square root, so they are meant to give the CPU's bits;
 * tests/gpu/test_gpu_optim_dev.c holds them to a stated tolerance. */
#ifndef DP_OPTIM_DEV_H
#define DP_OPTIM_DEV_H

#include <stddef.h>

#include "kernels/optim.h"

typedef struct dp_optim_dev dp_optim_dev_t;

typedef struct {
    void *(*alloc)(dp_optim_dev_t *dev, size_t bytes); /* zeroed; aborts on OOM */
    void (*release)(dp_optim_dev_t *dev, void *d);    /* NULL: nothing */
    /* Host src to d_dst, after every op queued so far; src reusable on return. */
    void (*upload)(dp_optim_dev_t *dev, void *d_dst, const void *src, size_t bytes);
    /* d_src to host dst after every op queued so far; returns when dst is whole. */
    void (*download)(dp_optim_dev_t *dev, void *dst, const void *d_src, size_t bytes);
    /* d_src to dst, which may be memory of the device itself or of another
     * (a device region's ring entry: unified addressing tells), after
     * every op queued so far; returns when dst is whole. */
    void (*copy_out)(dp_optim_dev_t *dev, void *dst, const void *d_src, size_t bytes);
    /* dp_optim_step_from (optim.h) on elements [lo, hi): d_w and d_state
     * made from d_w_from and d_state_from (the same vectors: in place). */
    void (*step)(dp_optim_dev_t *dev, const dp_optim_conf_t *c, float lr, float *d_w,
                 const float *d_w_from, const float *d_g, float *d_state,
                 const float *d_state_from, size_t n_all, size_t lo, size_t hi, long t);
    /* dp_optim_dc_range (optim.h) on device vectors indexed from 0. */
    void (*dc)(dp_optim_dev_t *dev, const dp_optim_conf_t *c, float *d_out, const float *d_g,
               const float *d_w, const float *d_w_bak, float *d_ms, size_t lo, size_t hi);
    /* Queue a copy of d_src into host dst on the side stream (above);
     * returns at once. dst must not be read before snapshot_wait. */
    void (*snapshot)(dp_optim_dev_t *dev, void *dst, const void *d_src, size_t bytes);
    /* Every snapshot queued so far is whole in its host buffer. */
    void (*snapshot_wait)(dp_optim_dev_t *dev);
    void (*destroy)(dp_optim_dev_t *dev);
} dp_optim_dev_ops_t;

struct dp_optim_dev {
    const dp_optim_dev_ops_t *ops; /* the kind's table */
    char name[32];                 /* "cpu", "cuda:0" */
    void *impl;                    /* the kind's private state */
};

/* "cpu" (also "cpu:staged", the name downpour-ps --device gives it) or
 * "cuda:K". -1 with one line in err: a bad name (*usage 1), or a
 * build without CUDA (*usage 1), or the module or the device missing
 * (*usage 0: a fact of this machine at run time). usage may be NULL. */
int dp_optim_dev_new(dp_optim_dev_t **out, const char *device, int *usage, char *err);
/* Frees everything; sets *dev_p to NULL; safe twice. */
void dp_optim_dev_destroy(dp_optim_dev_t **dev_p);

/* The factories behind dp_optim_dev_new: 0, or -1 with err. */
int dp_optim_dev_cpu_new(dp_optim_dev_t **out, char *err);
/* In the CUDA module (downpour-cuda.so), found by dlsym. */
int dp_optim_dev_cuda_new(dp_optim_dev_t **out, int device, char *err);

#endif
