/* env: the kernels' environment variables (see env.h). */
#include "kernels/env.h"

#include "kernels/cpu/isa.h"

int dp_kernels_env(char *err)
{
    if (dp_cpu_isa_init(err) != 0 || dp_conv_env(err) != 0) return -1;
#ifdef DP_HAVE_CUDA
    if (dp_cuda_env(err) != 0) return -1;
#endif
    return 0;
}
