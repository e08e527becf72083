/* test_optim_dev: the "cpu" shard step device (kernels/optim_dev.h), the
 * stand-in a machine without a GPU runs, against the plain kernels/optim.c
 * step bit for bit: every optimizer (and delayed Nesterov), awkward sizes,
 * several steps at a scheduled lr, in place, in pieces and out of place,
 * the snapshot's ordering, delay compensation; and the device names'
 * refusals, each one line. */
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "kernels/optim.h"
#include "kernels/optim_dev.h"
#include "tests/test.h"
#include "tests/optim_dev_check.h"

static const size_t s_sizes[] = {1, 7, 1023, 4099};

static void test_every_optimizer_bitwise(void)
{
    char err[DP_ERR_LEN];
    dp_optim_dev_t *dev = NULL;
    CHECK_EQ(dp_optim_dev_new(&dev, "cpu", NULL, err), 0);
    if (!dev) return;
    CHECK_STR(dev->name, "cpu");
    for (int i = 0; i < T_OD_CONFS; i++) {
        dp_optim_conf_t c;
        t_od_conf(i, &c);
        for (size_t s = 0; s < sizeof s_sizes / sizeof *s_sizes; s++)
            t_optim_dev_compare(dev, &c, s_sizes[s], 5, 0, 0, 1000u * (unsigned)i + s);
    }
    dp_optim_dev_destroy(&dev);
    dp_optim_dev_destroy(&dev); /* safe twice */
    CHECK(dev == NULL);
}

static void test_delay_compensation_bitwise(void)
{
    char err[DP_ERR_LEN];
    dp_optim_dev_t *dev = NULL;
    CHECK_EQ(dp_optim_dev_new(&dev, "cpu", NULL, err), 0);
    if (!dev) return;
    for (int kind = DP_DC_CONST; kind <= DP_DC_ADAPTIVE; kind++) {
        dp_optim_conf_t c;
        dp_optim_conf_default(&c);
        c.dc = (dp_dc_kind_t)kind;
        c.dc_lambda = kind == DP_DC_CONST ? 0.04f : 2.0f;
        for (size_t s = 0; s < sizeof s_sizes / sizeof *s_sizes; s++)
            t_optim_dev_dc(dev, &c, s_sizes[s], 0, 0, 77u + s);
    }
    dp_optim_dev_destroy(&dev);
}

/* A snapshot's host buffer is written at snapshot_wait, not before: the
 * stand-in holds callers to the wait a GPU's side stream needs. */
static void test_snapshot_lands_at_wait(void)
{
    char err[DP_ERR_LEN];
    dp_optim_dev_t *dev = NULL;
    CHECK_EQ(dp_optim_dev_new(&dev, "cpu", NULL, err), 0);
    if (!dev) return;
    float h[3] = {1, 2, 3}, snap[3] = {0, 0, 0}, zero[3] = {0, 0, 0};
    float *d = dev->ops->alloc(dev, sizeof h);
    dev->ops->upload(dev, d, h, sizeof h);
    dev->ops->snapshot(dev, snap, d, sizeof h);
    CHECK(memcmp(snap, zero, sizeof snap) == 0);
    dev->ops->snapshot_wait(dev);
    CHECK(memcmp(snap, h, sizeof snap) == 0);
    dev->ops->release(dev, d);
    dp_optim_dev_destroy(&dev);
}

/* Each refusal one line naming the device; a bad name is the user's
 * (usage 1), a device this machine lacks (a CUDA build: the module or the
 * device; no build has 1001 GPUs) the machine's (usage 0). */
static void test_refusals(void)
{
    static const char *const bad[] = {"gpu", "cuda", "cuda:", "cuda:x", "cuda:-1", "cpu:x"};
    char err[DP_ERR_LEN];
    dp_optim_dev_t *dev = NULL;
    int usage = -1;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        CHECK_EQ(dp_optim_dev_new(&dev, bad[i], &usage, err), -1);
        CHECK(dev == NULL);
        CHECK_EQ(usage, 1);
        CHECK(strstr(err, bad[i]) != NULL && strchr(err, '\n') == NULL);
    }
    CHECK_EQ(dp_optim_dev_new(&dev, "cpu:staged", &usage, err), 0); /* the stand-in too */
    CHECK(dev != NULL);
    dp_optim_dev_destroy(&dev);
    err[0] = 0;
    CHECK_EQ(dp_optim_dev_new(&dev, "cuda:1000", &usage, err), -1);
    CHECK(dev == NULL && strstr(err, "cuda:1000") != NULL && strchr(err, '\n') == NULL);
#ifdef DP_HAVE_CUDA
    CHECK_EQ(usage, 0);
#else
    CHECK_EQ(usage, 1);
    CHECK(strstr(err, "no CUDA backend") != NULL);
#endif
    fprintf(stderr, "  cuda:1000: %s\n", err);
}

DP_TESTS(T(test_every_optimizer_bitwise), T(test_delay_compensation_bitwise),
         T(test_snapshot_lands_at_wait), T(test_refusals))
