/* test_shard_device: a shard whose weights and optimizer state live on a
 * shard step device (dp_shard_set_device, kernels/optim_dev.h), here the
 * "cpu" stand-in that a machine without a GPU runs, against the same shard
 * on the host, bit for bit: every optimizer (and delayed Nesterov) through
 * async steps (in place, and out of place while a reply holds the live
 * buffer), sync means, the state tensors (batch norm's running statistics)
 * set to the pushed value, versions; and a checkpoint of the device shard
 * restored into a host shard and into another device shard, each stepping
 * on as the original does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/util.h"
#include "kernels/optim_dev.h"
#include "server/core/shard.h"
#include "server/core/shard_checkpoint.h"
#include "tests/test.h"

/* batch norm's running statistics are state tensors (not stepped) */
#define SPEC "conv3x3:2 bn relu fc:10 softmax"

static int s_shard(dp_shard_t *s, const dp_optim_conf_t *o, int on_device)
{
    char err[DP_ERR_LEN];
    dp_model_t m;
    dp_optim_dev_t *dev = NULL;
    if (dp_model_parse(&m, SPEC, 1, 5, 7, err) != 0 || dp_shard_init(s, &m, 0, 1, 5, o, err) != 0 ||
        (on_device && (dp_optim_dev_new(&dev, "cpu", NULL, err) != 0 ||
                       dp_shard_set_device(s, dev, err) != 0))) {
        fprintf(stderr, "  shard: %s\n", err);
        return -1;
    }
    return 0;
}

static void s_same(const char *what, const float *a, const float *b, size_t n)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && bad++ == 0) first = i;
    if (bad)
        fprintf(stderr, "  %s: %zu of %zu floats differ; first at %zu: %.9g != %.9g\n", what, bad,
                n, first, a[first], b[first]);
    CHECK(bad == 0);
}

/* s_same over w, the state (the device's copied off first) and version. */
static void s_compare(const char *what, dp_shard_t *host, dp_shard_t *dev)
{
    char line[160];
    dp_shard_device_state(dev);
    snprintf(line, sizeof line, "%s: w", what);
    s_same(line, dev->w, host->w, host->n);
    snprintf(line, sizeof line, "%s: state", what);
    s_same(line, dev->state, host->state, host->n * (size_t)host->state_per);
    CHECK_EQ(dev->version, host->version);
}

/* 6 async steps (a reply holding both live buffers on the even ones) and 3
 * sync means of 2 gradients, the same on each of the n shards. */
static void s_drive(dp_shard_t **sh, int n, dp_rng_t *r)
{
    size_t len = sh[0]->n;
    float *g = dp_malloc(len * sizeof *g), *g2 = dp_malloc(len * sizeof *g2);
    for (int step = 1; step <= 9; step++) {
        for (size_t i = 0; i < len; i++) g[i] = (2.0f * dp_rng_uniform(r) - 1.0f) * 0.1f;
        for (size_t i = 0; i < len; i++) g2[i] = (2.0f * dp_rng_uniform(r) - 1.0f) * 0.1f;
        dp_grad_slice_t sl = {g, len * 4, 0}, sl2 = {g2, len * 4, 0};
        for (int k = 0; k < n; k++) {
            dp_snap_t *held = step % 2 == 0 ? dp_shard_snapshot(sh[k]) : NULL;
            if (step <= 6) {
                dp_shard_step(sh[k], &sl, 1, dp_shard_lr(sh[k]));
            } else {
                dp_shard_accumulate(sh[k], &sl, 1);
                dp_shard_accumulate(sh[k], &sl2, 1);
                dp_shard_step_mean(sh[k]);
            }
            if (held) dp_snap_unref(NULL, held);
        }
    }
    free(g);
    free(g2);
}

static void test_steps_bitwise(void)
{
    for (int i = 0; i <= DP_OPT_KINDS; i++) {
        dp_optim_conf_t o;
        dp_optim_conf_default(&o);
        o.kind = i < DP_OPT_KINDS ? (dp_optim_kind_t)i : DP_OPT_NESTEROV;
        o.period = i < DP_OPT_KINDS ? 0 : 3; /* delayed Nesterov */
        o.weight_decay = 0.01f;
        o.schedule = DP_LR_COSINE;
        o.total_steps = 12;
        dp_shard_t host, dev;
        if (s_shard(&host, &o, 0) || s_shard(&dev, &o, 1)) {
            CHECK(0);
            return;
        }
        CHECK(host.n_state_ranges > 0); /* the pushed-value rule is exercised */
        dp_rng_t r;
        dp_rng_seed(&r, 11u + (unsigned)i);
        dp_shard_t *both[2] = {&host, &dev};
        s_drive(both, 2, &r);
        s_compare(i < DP_OPT_KINDS ? dp_optim_kind_name(o.kind) : "delayed nesterov", &host, &dev);
        CHECK_EQ(host.version, 9);
        dp_shard_fini(&host);
        dp_shard_fini(&dev);
    }
}

/* A device shard's checkpoint holds its live state: restored into a host
 * shard and into a device shard, both step on as the original does. */
static void test_checkpoint_round_trip(void)
{
    char err[DP_ERR_LEN], path[] = "/tmp/test_shard_device.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    dp_optim_conf_t o;
    dp_optim_conf_default(&o); /* adam: two state vectors */
    dp_shard_t orig, host, dev;
    if (s_shard(&orig, &o, 1) || s_shard(&host, &o, 0) || s_shard(&dev, &o, 1)) {
        CHECK(0);
        return;
    }
    dp_rng_t r;
    dp_rng_seed(&r, 5);
    dp_shard_t *one[1] = {&orig};
    s_drive(one, 1, &r);
    CHECK_EQ(dp_shard_checkpoint_write(&orig, path, NULL, err), 0);
    CHECK_EQ(dp_shard_checkpoint_restore(&host, path, NULL, err), DP_CKPT_RESTORED);
    CHECK_EQ(dp_shard_checkpoint_restore(&dev, path, NULL, err), DP_CKPT_RESTORED);
    dp_shard_t *all[3] = {&orig, &host, &dev};
    s_drive(all, 3, &r);
    s_compare("restored on the host", &host, &orig);
    s_compare("restored on a device", &host, &dev);
    CHECK_EQ(orig.version, 18);
    unlink(path);
    dp_shard_fini(&orig);
    dp_shard_fini(&host);
    dp_shard_fini(&dev);
}

DP_TESTS(T(test_steps_bitwise), T(test_checkpoint_round_trip))
