/* optim_dev: the "cpu" shard step device (the reference and the stand-in
 * of kernels/optim_dev.h) and the choice of a device by name.
 *
 * The stand-in keeps the device's memory model: its "device" arrays are
 * heap blocks apart from the caller's, reached only through upload and
 * download, and a snapshot's bytes are taken when it is queued (the
 * ordering a GPU's side stream gives) but reach the host buffer only at
 * snapshot_wait, so a caller that reads a snapshot before waiting reads
 * stale bytes here as it would on a GPU. Its steps are kernels/optim.c's
 * own calls. */
#include "kernels/optim_dev.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/env.h"

/* A snapshot queued and not yet waited for: its bytes as they were. */
typedef struct {
    void *dst;    /* the caller's host buffer */
    void *copy; /* the copy taken at snapshot time */
    size_t n;     /* bytes */
} s_pending_t;

typedef struct {
    s_pending_t *pending; /* snapshots queued since the last wait */
    int n_pending, cap;
} s_cpu_t;

static void *s_alloc(dp_optim_dev_t *dev, size_t bytes)
{
    (void)dev;
    return dp_calloc(1, bytes ? bytes : 1);
}

static void s_release(dp_optim_dev_t *dev, void *d)
{
    (void)dev;
    free(d);
}

static void s_copy(dp_optim_dev_t *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    if (bytes) memcpy(dst, src, bytes);
}

static void s_step(dp_optim_dev_t *dev, const dp_optim_conf_t *c, float lr, float *d_w,
                   const float *d_w_from, const float *d_g, float *d_state,
                   const float *d_state_from, size_t n_all, size_t lo, size_t hi, long t)
{
    (void)dev;
    if (hi > lo)
        dp_optim_step_from(c, lr, d_w, d_w_from, d_g, d_state, d_state_from, n_all, lo, hi, t);
}

static void s_dc(dp_optim_dev_t *dev, const dp_optim_conf_t *c, float *d_out, const float *d_g,
                 const float *d_w, const float *d_w_bak, float *d_ms, size_t lo, size_t hi)
{
    (void)dev;
    dp_optim_dc_range(c, d_out, d_g, d_w, d_w_bak, d_ms, lo, hi);
}

static void s_snapshot(dp_optim_dev_t *dev, void *dst, const void *d_src, size_t bytes)
{
    s_cpu_t *cpu = dev->impl;
    if (cpu->n_pending == cpu->cap) {
        cpu->cap = cpu->cap ? 2 * cpu->cap : 4;
        cpu->pending = realloc(cpu->pending, (size_t)cpu->cap * sizeof *cpu->pending);
        if (!cpu->pending) {
            fprintf(stderr, "optim_dev: out of memory (%d snapshots)\n", cpu->cap);
            abort();
        }
    }
    s_pending_t *p = &cpu->pending[cpu->n_pending++];
    p->dst = dst;
    p->n = bytes;
    p->copy = dp_malloc(bytes ? bytes : 1);
    if (bytes) memcpy(p->copy, d_src, bytes);
}

static void s_snapshot_wait(dp_optim_dev_t *dev)
{
    s_cpu_t *cpu = dev->impl;
    for (int i = 0; i < cpu->n_pending; i++) {
        s_pending_t *p = &cpu->pending[i];
        if (p->n) memcpy(p->dst, p->copy, p->n);
        free(p->copy);
    }
    cpu->n_pending = 0;
}

static void s_destroy(dp_optim_dev_t *dev)
{
    s_cpu_t *cpu = dev->impl;
    s_snapshot_wait(dev); /* a queued copy lands, as a stream's would */
    free(cpu->pending);
    free(cpu);
    free(dev);
}

static const dp_optim_dev_ops_t s_cpu_ops = {
    .alloc = s_alloc,
    .release = s_release,
    .upload = s_copy,
    .download = s_copy,
    .copy_out = s_copy,
    .step = s_step,
    .dc = s_dc,
    .snapshot = s_snapshot,
    .snapshot_wait = s_snapshot_wait,
    .destroy = s_destroy,
};

int dp_optim_dev_cpu_new(dp_optim_dev_t **out, char *err)
{
    (void)err;
    dp_optim_dev_t *dev = dp_calloc(1, sizeof *dev);
    dev->ops = &s_cpu_ops;
    snprintf(dev->name, sizeof dev->name, "cpu");
    dev->impl = dp_calloc(1, sizeof(s_cpu_t));
    *out = dev;
    return 0;
}

typedef int (*s_cuda_new_fn)(dp_optim_dev_t **out, int device, char *err);

int dp_optim_dev_new(dp_optim_dev_t **out, const char *device, int *usage, char *err)
{
    int usage_ = 1;
    long k = 0;
    char why[DP_ERR_LEN];
    *out = NULL;
    if (!usage) usage = &usage_;
    *usage = 1;
    if (strcmp(device, "cpu") == 0 || strcmp(device, "cpu:staged") == 0)
        return dp_optim_dev_cpu_new(out, err);
    if (strncmp(device, "cuda:", 5) != 0 ||
        dp_opts_parse_long("--device", device + 5, 0, 1024, &k, NULL) != 0)
        return dp_err(err, "--device %s: expected cpu, cpu:staged or cuda:K with K a device "
                      "number", device);
    /* The CUDA knobs (kernels/env.h) as every program that opens CUDA
     * checks them; it also links them into a program (the server) that
     * otherwise would not have them, and the module resolves them from it. */
    dp_cuda_knobs_t knobs;
    if (dp_cuda_knobs(&knobs, why) != 0) return dp_err(err, "--device %s: %s", device, why);
    s_cuda_new_fn cuda_new = (s_cuda_new_fn)dp_cuda_module_symbol("dp_optim_dev_cuda_new", why);
#ifdef DP_HAVE_CUDA
    *usage = 0; /* the build has CUDA: what is missing is this machine's */
#endif
    if (!cuda_new) return dp_err(err, "--device %s: %s", device, why);
    return cuda_new(out, (int)k, err);
}

void dp_optim_dev_destroy(dp_optim_dev_t **dev_p)
{
    if (!dev_p || !*dev_p) return;
    (*dev_p)->ops->destroy(*dev_p);
    *dev_p = NULL;
}
