/* backend: the one interface the network executor computes through. A
 * backend owns device memory and runs layer ops on it; "cpu" wraps the
 * kernels in ops.h, "cuda:K" runs cuDNN / cuBLAS and kernels of our own.
 *
 * Pointers named d_* live on the backend's device (host memory for cpu).
 * Ops are asynchronous on devices that allow it (queued in call order on one
 * compute stream); download() synchronises. Beside the compute stream, two
 * copy paths let transfers overlap compute: stage_upload (the next batch,
 * from the prefetch thread) and download_async / download_wait (gradients
 * to the push buffer while the backward pass goes on); upload_async queues
 * weights in order with the ops (a pull in parts, layer by layer). Layer ops take the layer
 * (its shapes are fixed by the model) and the batch B <= the max_batch given
 * to prepare(), so a backend may plan per layer once (cuDNN descriptors,
 * algorithms, workspace) and allocate nothing in the training loop. */
#ifndef DP_BACKEND_H
#define DP_BACKEND_H

#include <stddef.h>

#include "common/model.h"
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "proto/devmem.h"

typedef struct dp_backend dp_backend_t;

/* What a backend does: one `static const` table per kind of backend
 * (kernels/cpu/backend_cpu.c, kernels/cuda/backend_cuda.c), shared by all
 * its instances; each op gets the instance. */
typedef struct {
    /* Plan for model m at batches up to max_batch. Called once, before ops. */
    int (*prepare)(dp_backend_t *be, const dp_model_t *m, int max_batch, char *err);

    void *(*alloc)(dp_backend_t *be, size_t bytes); /* zeroed; aborts on OOM */
    void (*release)(dp_backend_t *be, void *d);
    void (*upload)(dp_backend_t *be, void *d_dst, const void *src, size_t bytes);
    void (*download)(dp_backend_t *be, void *dst, const void *d_src, size_t bytes);
    /* Page-locked host memory where the device benefits (plain malloc on cpu). */
    void *(*host_alloc)(dp_backend_t *be, size_t bytes);
    void (*host_release)(dp_backend_t *be, void *p);
    /* Page-lock host memory mapped elsewhere (a shard's shared-memory
     * segments) so the device copies to and from it by DMA; read_only: a
     * mapping without write access (the sealed parameter segment). 0, or -1
     * with err (the copies then go on unregistered, staged by the runtime).
     * host_unregister waits for every copy queued, then unlocks p (before
     * it is unmapped; p never registered: nothing). cpu: nothing to do;
     * cpu:staged checks the pairing (registered twice fails; left
     * registered at destroy: a warning). */
    int (*host_register)(dp_backend_t *be, void *p, size_t bytes, int read_only, char *err);
    void (*host_unregister)(dp_backend_t *be, void *p);
    void (*synchronize)(dp_backend_t *be);

    /* Copy host src to d_dst on a copy stream of its own and wait for that
     * copy alone: compute queued meanwhile runs on. Callable from a second
     * thread (the batcher's prefetch thread) while ops run. The caller
     * guarantees that no queued op still reads or writes d_dst. */
    void (*stage_upload)(dp_backend_t *be, void *d_dst, const void *src, size_t bytes);
    /* Queue a copy of d_src to host memory dst (from host_alloc) after every
     * op queued so far, on a second copy stream; returns at once, so later
     * ops overlap the copy. dst is complete after download_wait(). */
    void (*download_async)(dp_backend_t *be, void *dst, const void *d_src, size_t bytes);
    void (*download_wait)(dp_backend_t *be);
    /* Wait for the first n copies download_async queued since the last
     * download_wait, and no more: the host hands each layer's gradient on
     * (a push in parts) while the later copies and the backward run on. */
    void (*download_wait_first)(dp_backend_t *be, unsigned n);
    /* Queue a copy of host src (from host_alloc) to d_dst on the compute
     * stream, after every op queued so far and before every op queued
     * after; returns at once. src must keep its bytes until the stream has
     * drained (download, synchronize): the weights of a pull in parts go up
     * layer by layer while the forward runs on those already there. */
    void (*upload_async)(dp_backend_t *be, void *d_dst, const void *src, size_t bytes);
    /* Copy between this device's memory and memory another process or
     * device owns (a shard's device region mapped by CUDA IPC: a ring entry
     * into the network, the gradient into a slot), queued on the compute
     * stream after every op queued so far and before every op queued
     * after; returns at once. Both sides must hold still until the stream
     * has drained (synchronize): the caller unpins the entry, or counts the
     * slot's push, only after that. CUDA: cudaMemcpyAsync with
     * cudaMemcpyDefault (unified addressing names either device; from
     * another GPU a peer copy where peer access is on). cpu: memcpy.
     * cpu:staged notes the copy and makes it at the next synchronize or
     * download, so a caller that lets go of a side before synchronizing
     * copies wrong bits here as it could on a device (stricter than one:
     * ops queued after it see the old bytes until then). */
    void (*copy_peer)(dp_backend_t *be, void *dst, const void *src, size_t bytes);
    /* The same copy (either side this device's memory, a device region's,
     * or host memory) on a copy stream of its own, waited for alone: done
     * when it returns, while the ops queued on the compute stream run on.
     * Callable from a second thread (the overlapped loop's communication
     * thread: the next weights into a buffer the forward does not read,
     * the last gradient out of one the backward no longer writes). The
     * caller guarantees that no queued op reads or writes either side.
     * cpu and cpu:staged: memcpy (the wait is the call). */
    void (*copy_side)(dp_backend_t *be, void *dst, const void *src, size_t bytes);
    /* Put the calling thread on the backend's device (CUDA: cudaSetDevice,
     * which is per thread), for work outside the backend that takes the
     * thread's device: a device region's route, mapping and events on the
     * communication thread. cpu: nothing. */
    void (*enter)(dp_backend_t *be);

    void (*conv_forward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                         const float *d_in, const float *d_w, const float *d_b);
    /* d_din may be NULL (first layer). */
    void (*conv_backward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                          float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                          const float *d_w);
    void (*relu_forward)(dp_backend_t *be, size_t n, float *d_out, const float *d_in);
    void (*relu_backward)(dp_backend_t *be, size_t n, float *d_din, const float *d_dout,
                          const float *d_out);
    void (*tanh_forward)(dp_backend_t *be, size_t n, float *d_out, const float *d_in);
    void (*tanh_backward)(dp_backend_t *be, size_t n, float *d_din, const float *d_dout,
                          const float *d_out);
    void (*maxpool_forward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                            const float *d_in);
    void (*maxpool_backward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                             const float *d_dout, const float *d_in, const float *d_out);
    void (*fc_forward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                       const float *d_in, const float *d_w, const float *d_b);
    void (*fc_backward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                        float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                        const float *d_w);
    /* Softmax probabilities and the mean cross-entropy, into the one device
     * float d_loss (read it with download: no synchronisation mid-step). */
    void (*softmax_xent_forward)(dp_backend_t *be, int B, int classes, float *d_probs,
                                 float *d_loss, const float *d_logits, const int *d_labels);
    void (*softmax_xent_backward)(dp_backend_t *be, int B, int classes, float *d_dlogits,
                                  const float *d_probs, const int *d_labels);
    /* The obsnorm layer (kernels/ops.h): d_out = the normalised d_in; with
     * train, the statistics then merged with the batch's (in place). NULL:
     * the backend has none (dp_net_init refuses such a model). */
    void (*obs_norm_forward)(dp_backend_t *be, const dp_layer_t *l, int B, int train, float *d_out,
                             const float *d_in, float *d_mean, float *d_var, float *d_count);
    /* The binary head (kernels/ops.h, dp_sigmoid_xent_forward): one logit
     * a sample plus the head's bias d_bias (NULL: none), the probabilities
     * of classes 0 and 1 into d_probs[B,2], the mean logistic loss into
     * d_loss; backward: the logits' gradient (d_dlogits NULL: not wanted)
     * and the bias's (d_dbias NULL: none). */
    void (*sigmoid_xent_forward)(dp_backend_t *be, int B, float *d_probs, float *d_loss,
                                 const float *d_logits, const float *d_bias,
                                 const int *d_labels);
    void (*sigmoid_xent_backward)(dp_backend_t *be, int B, float *d_dlogits, float *d_dbias,
                                  const float *d_probs, const int *d_labels);
    /* The actor-critic head (kernels/ops.h, dp_ac_loss_forward): the policy
     * d_probs[B,A] of d_logits and, with d_action, the batch's loss into the
     * device float d_loss given the critic's d_value[B] and the returns
     * d_ret[B]; without (NULL: acting, evaluation) the policy alone. The
     * backward writes d_dlogits[B,A] and d_dvalue[B]. */
    void (*ac_loss_forward)(dp_backend_t *be, int B, int A, float beta, float vcoef,
                            float *d_probs, float *d_loss, const float *d_logits,
                            const float *d_value, const int *d_action, const float *d_ret);
    void (*ac_loss_backward)(dp_backend_t *be, int B, int A, float beta, float vcoef,
                             float *d_dlogits, float *d_dvalue, const float *d_logits,
                             const float *d_value, const int *d_action, const float *d_ret);
    /* The layers of residual networks (kernels/ops.h). A backend without
     * them leaves these NULL and refuses such a model in prepare.
     *
     * Batch norm of layer l: in training, statistics per ghost batch of G
     * samples (G = B: the batch's own; the last ghost batch may be shorter),
     * each group's mean and biased variance saved in d_save (2 C floats a
     * group, mean then var), and the running statistics (d_rm, d_rv, the
     * counter d_nbt) updated as PyTorch does, by l->momentum with the
     * unbiased variance, then averaged over the groups (the mean the sync
     * servers take of R workers' values: dp_bn_running_update). In
     * evaluation (train 0) the running statistics normalise; nothing is
     * saved or updated. */
    void (*bn_forward)(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                       float *d_out, const float *d_in, const float *d_w, const float *d_b,
                       float *d_rm, float *d_rv, float *d_nbt, float *d_save);
    void (*bn_backward)(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                        float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                        const float *d_w, const float *d_save);
    /* Batch norm of layer l and the ReLU after it as one op (kernels/ops.h,
     * dp_bn_relu_forward_train): as bn_forward, but d_out is the ReLU's
     * output, bn's own never stored; the backward takes d_dout wrt that
     * output and the output d_out itself (the ReLU's mask), and gives
     * bn_backward's results for the ReLU's gradient. Bits: those of the
     * two ops in turn on the CPU; the CUDA backend's training step runs
     * cuDNN's batch norm with the ReLU fused where it can
     * (kernels/cuda/bn_cudnn.c: tolerance, not bits, and its backward
     * differentiates the layer's last training forward). Optional: a
     * backend leaves them NULL and the executor runs bn and relu apart. */
    void (*bn_relu_forward)(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                            float *d_out, const float *d_in, const float *d_w, const float *d_b,
                            float *d_rm, float *d_rv, float *d_nbt, float *d_save);
    void (*bn_relu_backward)(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                             float *d_dw, float *d_db, const float *d_dout, const float *d_out,
                             const float *d_in, const float *d_w, const float *d_save);
    /* The end of a residual block with an identity shortcut as one op:
     * batch norm of layer l, plus d_z (the block's input, l's shape), then
     * the ReLU: d_out = relu(bn(d_in) + d_z), bn's output and the sum
     * never stored; d_save, the running statistics as bn_forward. The
     * backward takes d_dout wrt d_out and d_out itself (the ReLU's mask)
     * and gives bn_backward's results and d_dz, the gradient wrt d_z
     * (written, not added; d_din, d_dz NULL: not wanted). Optional, NULL
     * on the CPU: the executor then
     * runs bn, add and relu apart (the CUDA backend: kernels/cuda/bn_cudnn.c). */
    void (*bn_add_relu_forward)(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                                float *d_out, const float *d_in, const float *d_z,
                                const float *d_w, const float *d_b, float *d_rm, float *d_rv,
                                float *d_nbt, float *d_save);
    void (*bn_add_relu_backward)(dp_backend_t *be, const dp_layer_t *l, int B, int G,
                                 float *d_din, float *d_dz, float *d_dw, float *d_db,
                                 const float *d_dout, const float *d_out, const float *d_in,
                                 const float *d_w, const float *d_save);
    /* The end of a residual block: d_out = d_a + shortcut(d_src), d_out may be d_a. */
    void (*shortcut_forward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                             const float *d_a, const float *d_src);
    void (*shortcut_backward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_dsrc,
                              const float *d_dout);
    void (*gap_forward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                        const float *d_in);
    void (*gap_backward)(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                         const float *d_dout);
    /* The mask of (seed, step, sample0 + b, element): kernels/ops.h. */
    void (*dropout_forward)(dp_backend_t *be, const dp_layer_t *l, int B, unsigned long long seed,
                            unsigned long long step, unsigned long long sample0, float *d_out,
                            const float *d_in);
    void (*dropout_backward)(dp_backend_t *be, const dp_layer_t *l, int B,
                             unsigned long long seed, unsigned long long step,
                             unsigned long long sample0, float *d_din, const float *d_dout);
    /* d_dst[0, n) += d_src[0, n); d_dst = d_src (bytes) on the device. */
    void (*vec_add)(dp_backend_t *be, size_t n, float *d_dst, const float *d_src);
    void (*copy)(dp_backend_t *be, void *d_dst, const void *d_src, size_t bytes);

    /* dp_optim_step (optim.h) on device memory: the same rule for every
     * optimizer, state laid out as there (dp_optim_state_per_param(c->kind)
     * floats per parameter, [n] then [n]), zero at start. */
    void (*optim_step)(dp_backend_t *be, const dp_optim_conf_t *c, float lr, float *d_w,
                       const float *d_g, float *d_state, size_t n, long t);

    void (*destroy)(dp_backend_t *be);
} dp_backend_ops_t;

struct dp_backend {
    const dp_backend_ops_t *ops; /* the kind's table */
    const char *name;  /* "cpu", "cuda:0" */
    void *impl;        /* backend private state */
    int host_memory;   /* d_* pointers are host memory the caller may read and write */
    const char *precision; /* what its conv and fc compute in, for the start line: "fp32",
                            * "bf16 (emulated)" (dp_backend_new_in) */
};

/* --precision: the arithmetic of the conv and fc layers. fp32 everywhere,
 * or bf16 operands with fp32 sums (kernels/cpu/bf16_ops.h) on the CPU; batch
 * norm, the activations, pooling, the loss and the optimizer stay fp32,
 * and the servers' weights too (they are never told). */
typedef enum { DP_PRECISION_FP32 = 0, DP_PRECISION_BF16 = 1 } dp_precision_t;
/* "fp32" | "bf16"; -1 with one line otherwise (a flag's parser: the
 * caller names the flag). */
int dp_precision_parse(const char *v, dp_precision_t *out, char *err);
const char *dp_precision_name(dp_precision_t p);
/* Can a backend on device (as --device names it; NULL: cpu) compute in p?
 * 0, or -1 with one line: bf16 needs a CPU with a bf16 path
 * (dp_bf16_ops_select: AMX or AVX512_BF16, or the test hook DP_TEST_BF16);
 * the CUDA backend runs fp32 only. For the tools to refuse before they
 * start anything (exit 2). */
int dp_precision_check(const char *device, dp_precision_t p, char *err);

/* The kernel dimensions of layer l (conv / maxpool) at batch B, for
 * backends that call the kernels of ops.h or their CUDA twins. */
void dp_conv_dims_of(dp_conv_dims_t *d, const dp_layer_t *l, int B);
void dp_pool_dims_of(dp_pool_dims_t *d, const dp_layer_t *l, int B);
void dp_shortcut_dims_of(dp_shortcut_dims_t *d, const dp_layer_t *l, int B);

/* 1 when l is a layer of residual networks (bn, gap, dropout, add), which
 * a backend supports only when it fills the ops above. */
int dp_layer_is_resnet_kind(const dp_layer_t *l);

/* "cpu", "cpu:staged" or "cuda:K" (K counts the devices
 * CUDA_VISIBLE_DEVICES leaves). "cpu:staged" is the CPU's kernels behind a
 * device's memory model (host_memory 0: every transfer goes through the
 * copy ops, download_async's copies deferred to their wait), so the
 * device paths of the executor and the worker run, and are tested, on a
 * machine without one; its results are the plain cpu's, bit for bit.
 * Fails with one line when CUDA was not built in or the device is absent. */
int dp_backend_new(dp_backend_t **out, const char *device, char *err);
/* The same in precision p: dp_precision_check's refusals, else a backend
 * whose conv and fc ops compute in p. dp_backend_new is p = fp32. */
int dp_backend_new_in(dp_backend_t **out, const char *device, dp_precision_t p, char *err);
/* Frees everything the backend holds; sets *be_p to NULL; safe twice. */
void dp_backend_destroy(dp_backend_t **be_p);

/* The factories behind dp_backend_new, same shape: 0, or -1 with err. */
int dp_backend_cpu_new(dp_backend_t **out, char *err);
int dp_backend_cpu_staged_new(dp_backend_t **out, char *err); /* "cpu:staged" */
/* Put a new cpu (or cpu:staged) backend's conv and fc ops in precision p
 * (bf16: through dp_bf16_ops_select's table), before prepare; -1 with
 * one line where this CPU has no such path. */
int dp_backend_cpu_set_precision(dp_backend_t *be, dp_precision_t p, char *err);
/* Test hook of cpu:staged: fn(arg) runs at the synchronize or download that
 * makes the copy_peer copies noted, just before it makes them (a test
 * writes a side there to see whether it was still held); NULL: none. */
void dp_backend_staged_before_copies(dp_backend_t *be, void (*fn)(void *), void *arg);
/* Defined in kernels/cuda when built with CUDA, which the build links into
 * a module of its own, downpour-cuda.so, with cuDNN, cuBLAS and the CUDA
 * runtime: dp_backend_new loads it on the first "cuda:K" (dlopen), so a
 * process on the CPU never maps those libraries (linked in, they cost
 * every CPU worker and every `downpour` command 0.35 s and 220 MB before
 * main). Where it looks, in order: $DOWNPOUR_CUDA_MODULE (only there when
 * set); then, from the program's own directory, lib/ (the build tree's
 * daemons), ../lib/ (the build tree's tests) and ../lib/downpour/ (make
 * install's LIBDIR/downpour beside BINDIR). The module resolves the few
 * dp_ helpers it calls (dp_err, dp_calloc, ...) from the program, which
 * exports them (-rdynamic). */
#define DP_CUDA_MODULE_NAME "downpour-cuda.so"
int dp_backend_cuda_new(dp_backend_t **out, int device, char *err);
/* The symbol `name` of that module (loaded on the first call, looked for as
 * above), for the other device code it holds (kernels/optim_dev.h); NULL
 * with err when the build has no CUDA, or the module or the symbol is
 * missing. */
void *dp_cuda_module_symbol(const char *name, char *err);
/* The device region's provider (proto/devmem.h) for memory on device, as
 * --device names it: "cuda:K" gives the module's CUDA IPC ops with the
 * calling thread put on K (a shard's ring is allocated, a worker's mapping
 * opened, on the thread's device); anything else (a CPU) has none: NULL,
 * err empty. NULL with err when cuda:K has no module or no such device. */
const dp_devmem_ops_t *dp_devmem_for_device(const char *device, char *err);

#endif
