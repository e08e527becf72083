/* env: the kernels' environment variables (see env.h). */
#include "kernels/env.h"

#include "common/opts.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/isa.h"

int dp_cuda_knobs(dp_cuda_knobs_t *k, char *err)
{
    long tf32 = 0, find = 0;
    *k = (dp_cuda_knobs_t){.workspace_mb = DP_CUDA_WORKSPACE_MB_DEFAULT};
    if (dp_opts_env_long("DP_CUDA_TF32", 0, 1, &tf32, err) != 0) return -1;
    if (dp_opts_env_long("DP_CUDA_FIND", 0, 1, &find, err) != 0) return -1;
    if (dp_opts_env_choice("DP_CUDA_ALGOS", "exact|fastest", &k->fastest, err) != 0) return -1;
    if (dp_opts_env_long("DP_CUDA_WORKSPACE_MB", 0, 1L << 20, &k->workspace_mb, err) != 0) return -1;
    if (dp_opts_env_choice("DP_CUDA_BN", "cudnn|own", &k->bn_own, err) != 0) return -1;
    k->tf32 = (int)tf32;
    k->find = (int)find;
    return 0;
}

static long s_fuse = 1;

int dp_fuse_env(char *err)
{
    return dp_opts_env_long("DP_FUSE", 0, 1, &s_fuse, err);
}

int dp_fuse_on(void)
{
    return (int)s_fuse;
}

int dp_kernels_env(char *err)
{
    dp_cuda_knobs_t cuda;
    if (dp_cpu_isa_init(err) != 0 || dp_conv_env(err) != 0 || dp_fuse_env(err) != 0 ||
        dp_cuda_knobs(&cuda, err) != 0)
        return -1;
    /* after the path is chosen: it decides OpenBLAS's core (kernels/cpu/blas.h) */
    if (dp_cpu_blas_init(dp_cpu_isa(), err) != 0) return -1;
    return 0;
}
