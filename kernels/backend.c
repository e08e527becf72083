/* backend: picks a backend by device name. CUDA is built only when the
 * build found nvcc and cuDNN (DP_HAVE_CUDA), as a module loaded on the
 * first "cuda:K" (backend.h says where it is looked for and why); without
 * it "cuda:K" fails with a line that says how to get it. */
#include "kernels/backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/util.h"
#include "kernels/cpu/bf16_emulated.h"

#ifdef DP_HAVE_CUDA
typedef int (*s_cuda_new_fn)(dp_backend_t **out, int device, char *err);

/* The module's handle (dlopen hands the same one back to a second call);
 * NULL with err when it is not found or does not load. Never closed: the
 * CUDA libraries are not made to unload. */
static void *s_cuda_module(char *err)
{
    char exe[PATH_MAX], path[PATH_MAX + 64], looked[3 * (PATH_MAX + 64)] = "";
    const char *env = getenv("DOWNPOUR_CUDA_MODULE");
    void *h = NULL;
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) { dp_err(err, "DOWNPOUR_CUDA_MODULE=%s: %s", env, dlerror()); return NULL; }
    } else {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        static const char *const under[] = {"lib", "../lib", "../lib/downpour"};
        for (size_t i = 0; i < sizeof under / sizeof *under && !h; i++) {
            snprintf(path, sizeof path, "%s/%s/" DP_CUDA_MODULE_NAME, exe, under[i]);
            size_t used = strlen(looked);
            snprintf(looked + used, sizeof looked - used, "%s%s", used ? ", " : "", path);
            if (access(path, F_OK) != 0) continue;
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!h) { dp_err(err, "%s: %s", path, dlerror()); return NULL; }
        }
        if (!h) {
            dp_err(err, "this build's CUDA backend (" DP_CUDA_MODULE_NAME ") is not where it "
                   "belongs (%s): reinstall, or set DOWNPOUR_CUDA_MODULE to its path", looked);
            return NULL;
        }
    }
    return h;
}
#endif

void *dp_cuda_module_symbol(const char *name, char *err)
{
#ifdef DP_HAVE_CUDA
    void *h = s_cuda_module(err), *sym = NULL;
    if (!h) return NULL;
    sym = dlsym(h, name);
    if (!sym) dp_err(err, DP_CUDA_MODULE_NAME ": no %s in it (%s)", name, dlerror());
    return sym;
#else
    (void)name;
    dp_err(err, "this build has no CUDA backend (rebuild with nvcc and cuDNN installed, "
           "without CUDA=0)");
    return NULL;
#endif
}

typedef const dp_devmem_ops_t *(*s_devmem_on_fn)(int device, char *err);

const dp_devmem_ops_t *dp_devmem_for_device(const char *device, char *err)
{
    err[0] = 0;
    long k = 0;
    if (strncmp(device, "cuda:", 5) != 0 ||
        dp_opts_parse_long("--device", device + 5, 0, 1024, &k, NULL) != 0)
        return NULL;
    s_devmem_on_fn on = (s_devmem_on_fn)dp_cuda_module_symbol("dp_devmem_cuda_on", err);
    return on ? on((int)k, err) : NULL;
}

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
        char why[DP_ERR_LEN];
        s_cuda_new_fn cuda_new = (s_cuda_new_fn)dp_cuda_module_symbol("dp_backend_cuda_new", why);
        if (!cuda_new) return dp_err(err, "--device %s: %s", device, why);
        return cuda_new(out, (int)k, err);
#else
        (void)k;
        return dp_err(err, "--device %s: this build has no CUDA backend (rebuild with nvcc and cuDNN installed, without CUDA=0)", device);
#endif
    }
    return dp_err(err, "--device %s: unknown device (expected cpu, cpu:staged or cuda:K)", device);
}

int dp_precision_parse(const char *v, dp_precision_t *out, char *err)
{
    if (strcmp(v, "fp32") == 0) *out = DP_PRECISION_FP32;
    else if (strcmp(v, "bf16") == 0) *out = DP_PRECISION_BF16;
    else return dp_err(err, "'%s' is not a precision (fp32 or bf16)", v);
    return 0;
}

const char *dp_precision_name(dp_precision_t p)
{
    return p == DP_PRECISION_BF16 ? "bf16" : "fp32";
}

int dp_precision_check(const char *device, dp_precision_t p, char *err)
{
    if (p == DP_PRECISION_FP32) return 0;
    if (device && strncmp(device, "cuda", 4) == 0)
        return dp_err(err, "--precision bf16: the CUDA backend computes in fp32 only for now "
                      "(--device %s; use --precision fp32, or --device cpu)", device);
    char why[DP_ERR_LEN];
    if (!dp_bf16_ops_select(why)) return dp_err(err, "--precision bf16: %s", why);
    return 0;
}

int dp_backend_new_in(dp_backend_t **out, const char *device, dp_precision_t p, char *err)
{
    *out = NULL;
    if (dp_precision_check(device, p, err) != 0 || dp_backend_new(out, device, err) != 0) return -1;
    if (!(*out)->precision) (*out)->precision = "fp32";
    if (p == DP_PRECISION_FP32) return 0;
    /* the check let bf16 through on a CPU device only */
    if (dp_backend_cpu_set_precision(*out, p, err) == 0) return 0;
    dp_backend_destroy(out);
    return -1;
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
