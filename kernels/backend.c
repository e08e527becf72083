/* backend: picks a backend by device name. CUDA is linked in only when the
 * build found nvcc and cuDNN (DP_HAVE_CUDA); without it "cuda:K" fails with
 * a line that says how to get it. */
#include "kernels/backend.h"

#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"

int dp_backend_new(dp_backend_t **out, const char *device, char *err)
{
    *out = NULL;
    if (strcmp(device, "cpu") == 0) return dp_backend_cpu_new(out, err);
    if (strcmp(device, "cpu:staged") == 0) return dp_backend_cpu_staged_new(out, err);
    if (strncmp(device, "cuda", 4) == 0) {
        long k = 0;
        if (device[4] == ':') {
            if (dp_opts_parse_long("--device", device + 5, 0, 1024, &k, NULL) != 0)
                return dp_err(err, "--device %s: expected cuda:K with K a device number", device);
        } else if (device[4]) {
            return dp_err(err, "--device %s: expected cpu, cpu:staged or cuda:K", device);
        }
#ifdef DP_HAVE_CUDA
        return dp_backend_cuda_new(out, (int)k, err);
#else
        (void)k;
        return dp_err(err, "--device %s: this build has no CUDA backend (rebuild with nvcc and cuDNN installed, without CUDA=0)", device);
#endif
    }
    return dp_err(err, "--device %s: unknown device (expected cpu, cpu:staged or cuda:K)", device);
}

void dp_conv_dims_of(dp_conv_dims_t *d, const dp_layer_t *l, int B)
{
    d->B = B;
    d->C = l->in_c;
    d->H = l->in_h;
    d->W = l->in_w;
    d->OC = l->out_c;
    d->K = l->k;
    d->pad = l->pad;
    d->stride = l->stride;
    dp_conv_dims_finish(d);
}

void dp_pool_dims_of(dp_pool_dims_t *d, const dp_layer_t *l, int B)
{
    d->B = B;
    d->C = l->in_c;
    d->H = l->in_h;
    d->W = l->in_w;
    d->K = l->k;
    d->stride = l->stride;
    dp_pool_dims_finish(d);
}

void dp_shortcut_dims_of(dp_shortcut_dims_t *d, const dp_layer_t *l, int B)
{
    d->B = B;
    d->C = l->src_c;
    d->H = l->src_h;
    d->W = l->src_w;
    d->OC = l->out_c;
    d->stride = l->stride;
    dp_shortcut_dims_finish(d);
}

int dp_layer_is_resnet_kind(const dp_layer_t *l)
{
    return l->kind == DP_LAYER_BN || l->kind == DP_LAYER_GAP || l->kind == DP_LAYER_DROPOUT ||
           l->kind == DP_LAYER_ADD;
}

void dp_backend_destroy(dp_backend_t **be_p)
{
    if (!be_p || !*be_p) return;
    (*be_p)->ops->destroy(*be_p);
    *be_p = NULL;
}
