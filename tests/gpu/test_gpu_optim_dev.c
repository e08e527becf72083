/* test_gpu_optim_dev: the CUDA shard step device (kernels/optim_dev.h,
 * kernels/cuda/optim_dev*.{c,cu}) against the plain CPU step
 * (kernels/optim.c) on the same weights and gradients, through the same
 * protocol the unit test holds the "cpu" stand-in to (tests/optim_dev_check.h):
 * every optimizer and delayed Nesterov, weight decay, a cosine lr, 5 steps,
 * in place, in two pieces, out of place, out of place in two pieces (a
 * device shard's early step), a snapshot on the side stream ordered before
 * the next step; and delay compensation (const, adaptive), also as a device
 * shard runs it (in place, in pieces, against weights copied device to
 * device).
 *
 * Tolerance: |gpu - cpu| <= 1e-6 + 1e-5 |cpu| per float. The kernels are
 * written to give the CPU's bits (no FMA contraction, IEEE division and
 * square root), but that is not yet seen on a device: the tolerance is
 * what this test holds them to until it is.
 *
 * Without a CUDA device the program checks that opening "cuda:0" fails
 * with one clear line, then skips with the reason. DP_GPU_DEVICE=K tests
 * cuda:K (default 0). This is a file of its own rather than a section of
 * test_gpu_ops.c, which is past 1,000 lines already. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/optim.h"
#include "kernels/optim_dev.h"
#include "tests/test.h"
#include "tests/optim_dev_check.h"

#define S_ATOL 1e-6
#define S_RTOL 1e-5

static dp_optim_dev_t *s_dev;      /* the device under test (NULL: none) */
static char s_why[DP_ERR_LEN + 64]; /* why there is none */

static const size_t s_sizes[] = {1, 7, 1023, 4099, (1u << 20) + 5};

static void test_gpu_optim_dev_open(void)
{
    char err[DP_ERR_LEN] = "";
    dp_optim_dev_t *dev = NULL;
    if (!s_dev) {
        CHECK_EQ(dp_optim_dev_cuda_new(&dev, 0, err), -1);
        CHECK(dev == NULL);
        CHECK(strstr(err, "no CUDA device") != NULL || strstr(err, "no such device") != NULL);
        CHECK(strchr(err, '\n') == NULL);
        SKIP(s_why);
    }
    int count = 0;
    CHECK_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    CHECK_EQ(dp_optim_dev_cuda_new(&dev, count, err), -1); /* one past the last */
    CHECK(dev == NULL && strstr(err, "no such device") != NULL);
    fprintf(stderr, "  (expected) %s\n", err);
}

static void test_gpu_optim_dev_steps(void)
{
    if (!s_dev) SKIP(s_why);
    for (int i = 0; i < T_OD_CONFS; i++) {
        dp_optim_conf_t c;
        t_od_conf(i, &c);
        for (size_t s = 0; s < sizeof s_sizes / sizeof *s_sizes; s++)
            t_optim_dev_compare(s_dev, &c, s_sizes[s], 5, S_ATOL, S_RTOL, 1000u * (unsigned)i + s);
    }
}

static void test_gpu_optim_dev_dc(void)
{
    if (!s_dev) SKIP(s_why);
    for (int kind = DP_DC_CONST; kind <= DP_DC_ADAPTIVE; kind++) {
        dp_optim_conf_t c;
        dp_optim_conf_default(&c);
        c.dc = (dp_dc_kind_t)kind;
        c.dc_lambda = kind == DP_DC_CONST ? 0.04f : 2.0f;
        for (size_t s = 0; s < sizeof s_sizes / sizeof *s_sizes; s++)
            t_optim_dev_dc(s_dev, &c, s_sizes[s], S_ATOL, S_RTOL, 77u + s);
    }
}

int main(int argc, char **argv)
{
    if (t_env() != 0) return 2;
    static const t_test_t all[] = {T(test_gpu_optim_dev_open), T(test_gpu_optim_dev_steps),
                                   T(test_gpu_optim_dev_dc)};
    static const t_test_t none[] = {T(test_gpu_optim_dev_open)};
    char err[DP_ERR_LEN] = "";
    const char *env = getenv("DP_GPU_DEVICE");
    int count = 0, dev = env && *env ? atoi(env) : 0;
    dp_log_init("test_gpu_optim_dev");
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(s_why, sizeof s_why, "no CUDA device (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    } else if (dp_optim_dev_cuda_new(&s_dev, dev, err) != 0) {
        fprintf(stderr, "FAIL: %d CUDA device(s) visible but cuda:%d won't open: %s\n", count,
                dev, err);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    int rc = s_dev ? t_main(argc, argv, all, (int)(sizeof all / sizeof all[0]))
                   : t_main(argc, argv, none, 1);
    dp_optim_dev_destroy(&s_dev);
    return rc;
}
