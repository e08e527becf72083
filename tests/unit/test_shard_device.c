/* test_shard_device: a shard whose weights and optimizer state live on a
 * shard step device (dp_shard_set_device, kernels/optim_dev.h), here the
 * "cpu" stand-in that a machine without a GPU runs, against the same shard
 * on the host, bit for bit: every optimizer (and delayed Nesterov) through
 * async steps (in place, and out of place while a reply holds the live
 * buffer), sync means, the state tensors (batch norm's running statistics)
 * set to the pushed value, versions; the outer optimizers of --local-steps
 * (nesterov, delayed-nesterov) as dp_optim_outer makes them; delay
 * compensation (slots and MS on the device, the transform there) through
 * async's policy, compensated, fallen back and measured pushes; the early
 * step's part-wise step and its commit (dp_shard_step_ahead, dp_shard_adopt)
 * and a dropped one; and a checkpoint of the device shard restored into a
 * host shard and into another device shard, each stepping on as the
 * original does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/util.h"
#include "kernels/optim_dev.h"
#include "server/core/policy.h"
#include "server/core/shard.h"
#include "server/core/shard_checkpoint.h"
#include "server/core/shard_dc.h"
#include "server/crew/members.h"
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

/* Every optimizer, delayed Nesterov, and --local-steps' outer optimizers
 * (nesterov, delayed-nesterov every 3: the shard's own optimizer then, its
 * state the device's as any other's). */
static void test_steps_bitwise(void)
{
    static const char *outer[2] = {"nesterov", "delayed-nesterov"};
    for (int i = 0; i <= DP_OPT_KINDS + 2; i++) {
        dp_optim_conf_t o;
        char err[DP_ERR_LEN];
        dp_optim_conf_default(&o);
        o.kind = i < DP_OPT_KINDS ? (dp_optim_kind_t)i : DP_OPT_NESTEROV;
        o.period = i < DP_OPT_KINDS ? 0 : 3; /* delayed Nesterov */
        o.weight_decay = 0.01f;
        o.schedule = DP_LR_COSINE;
        o.total_steps = 12;
        if (i > DP_OPT_KINDS) {
            CHECK_EQ(dp_optim_outer(outer[i - DP_OPT_KINDS - 1], 0, 0.9f, 3, &o, err), 0);
            CHECK(o.kind == DP_OPT_NESTEROV && o.period == (i == DP_OPT_KINDS + 2 ? 3 : 0));
        }
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
        s_compare(i < DP_OPT_KINDS    ? dp_optim_kind_name(o.kind)
                  : i == DP_OPT_KINDS ? "delayed nesterov"
                                      : outer[i - DP_OPT_KINDS - 1],
                  &host, &dev);
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

/* A shard of 2 joined workers under async's policy, measuring (a record's
 * norms) when asked, with delay compensation's slots; worker 0 has pulled
 * version 0.
 * where: 0 the host; 1 the stand-in from the start (the slots and MS made
 * on it); 2 the stand-in after the pull (the slot and MS moved up). */
typedef struct {
    dp_shard_t s;
    dp_members_t m;
    dp_policy_t *p;
} s_dc_fx_t;

static int s_dc_fx(s_dc_fx_t *f, const dp_optim_conf_t *o, int where, int measure)
{
    char err[DP_ERR_LEN];
    dp_optim_dev_t *dev = NULL;
    dp_policy_conf_t pc = {.replicas = 2};
    memset(f, 0, sizeof *f);
    if (s_shard(&f->s, o, where == 1) != 0) return -1;
    dp_shard_dc_init(&f->s, 2);
    dp_shard_dc_pulled(&f->s, 0);
    if (where == 2 && (dp_optim_dev_new(&dev, "cpu", NULL, err) != 0 ||
                       dp_shard_set_device(&f->s, dev, err) != 0))
        goto fail;
    dp_members_init(&f->m, 2, 0, 0, 0.0);
    dp_members_join(&f->m, 0);
    dp_members_join(&f->m, 1);
    if (dp_policy_new(&f->p, &dp_policy_async, &pc, &f->s, &f->m, err) != 0) goto fail;
    if (measure) dp_policy_measure(f->p);
    return 0;
fail:
    fprintf(stderr, "  dc fixture: %s\n", err);
    return -1;
}

static void s_dc_fx_fini(s_dc_fx_t *f)
{
    dp_policy_destroy(&f->p);
    dp_members_fini(&f->m);
    dp_shard_fini(&f->s);
}

/* 12 pushes alternating between the workers, each stamped with the
 * version its worker pulled last (1 to 2 behind: compensated), one whose
 * slots were forgotten (fallen back), some in two slices (gathered);
 * each push's measured gradient norm and compensation into out. */
static void s_dc_drive(s_dc_fx_t *f, dp_rng_t *r, double *out)
{
    dp_shard_t *s = &f->s;
    size_t n = s->n, h = n / 2 + 3;
    float *g = dp_malloc(n * sizeof *g);
    uint64_t pulled[2] = {0, 0};
    dp_shard_dc_pulled(s, 1);
    for (int k = 0; k < 12; k++) {
        int w = k % 2;
        for (size_t i = 0; i < n; i++) g[i] = (2.0f * dp_rng_uniform(r) - 1.0f) * 0.5f;
        dp_grad_slice_t two[2] = {{g, h * 4, s->lo}, {g + h, (n - h) * 4, s->lo + h}};
        if (k == 7) dp_shard_dc_forget(s, w); /* its slots gone: applied as it is */
        dp_push_outcome_t o;
        dp_policy_push(f->p, w, pulled[w], two, k % 3 == 1 ? 2 : 1, false, &o);
        if (o.status != DP_PUSH_APPLIED) fprintf(stderr, "  push %d: %s\n", k, o.reason);
        CHECK_EQ(o.status, DP_PUSH_APPLIED);
        out[2 * k] = o.grad_norm;
        out[2 * k + 1] = o.compensated;
        if (k % 4 != 2) { /* now and then a worker pushes again on its old pull */
            dp_shard_dc_pulled(s, w);
            pulled[w] = s->version;
        }
    }
    free(g);
}

/* DC-ASGD (const and adaptive) on the stand-in, its slots and MS made
 * there or moved up, against the host, measured (a record's norms) and
 * not: the same weights, state, MS, counts and norms, bit for bit; the
 * adaptive device shard's checkpoint holds its MS (a host shard restores
 * it). */
static void test_dc_bitwise(void)
{
    char err[DP_ERR_LEN], path[] = "/tmp/test_shard_device_dc.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    for (int run = 0; run < 4; run++) {
        int kind = run % 2 ? DP_DC_ADAPTIVE : DP_DC_CONST, measure = run / 2;
        dp_optim_conf_t o;
        dp_optim_conf_default(&o); /* adam */
        o.dc = (dp_dc_kind_t)kind;
        o.dc_lambda = kind == DP_DC_CONST ? 0.5f : 2.0f;
        s_dc_fx_t f[3];
        double norms[3][24];
        for (int w = 0; w < 3; w++) {
            if (s_dc_fx(&f[w], &o, w, measure) != 0) {
                CHECK(0);
                return;
            }
            dp_rng_t r;
            dp_rng_seed(&r, 21u + (unsigned)kind);
            s_dc_drive(&f[w], &r, norms[w]);
        }
        CHECK(f[0].s.n_state_ranges > 0);
        CHECK_EQ(f[0].s.dc->compensated, 11);
        CHECK_EQ(f[0].s.dc->fallback, 1);
        for (int w = 1; w < 3; w++) {
            const char *what = w == 1 ? "dc on the device from the start" : "dc moved up";
            s_compare(what, &f[0].s, &f[w].s);
            CHECK_EQ(f[w].s.dc->compensated, f[0].s.dc->compensated);
            CHECK_EQ(f[w].s.dc->fallback, f[0].s.dc->fallback);
            CHECK(memcmp(norms[w], norms[0], sizeof norms[0]) == 0);
            if (kind == DP_DC_ADAPTIVE) s_same("ms", f[w].s.dc->ms, f[0].s.dc->ms, f[0].s.n);
        }
        if (kind == DP_DC_ADAPTIVE) {
            s_dc_fx_t back;
            CHECK_EQ(dp_shard_checkpoint_write(&f[1].s, path, NULL, err), 0);
            CHECK_EQ(s_dc_fx(&back, &o, 0, 0), 0);
            CHECK_EQ(dp_shard_checkpoint_restore(&back.s, path, NULL, err), DP_CKPT_RESTORED);
            s_same("ms restored", back.s.dc->ms, f[0].s.dc->ms, f[0].s.n);
            s_dc_fx_fini(&back);
        }
        for (int w = 0; w < 3; w++) s_dc_fx_fini(&f[w]);
    }
    unlink(path);
}

/* The early step's parts on the device (dp_shard_step_ahead into the
 * device's next weights and state, in two parts) committed by
 * dp_shard_adopt: async's step by g, and sync's by the mean of acc and g;
 * then one dropped (its buffer the spare) and the push stepped whole. The
 * host shard steps each whole: the same bits, batch norm's statistics
 * (state tensors) included. */
static void test_early_bitwise(void)
{
    for (int count = 0; count <= 2; count += 2) {
        dp_optim_conf_t o;
        dp_optim_conf_default(&o);
        dp_shard_t host, dev;
        if (s_shard(&host, &o, 0) || s_shard(&dev, &o, 1)) {
            CHECK(0);
            return;
        }
        const dp_optim_dev_ops_t *ops = dev.dev->ops;
        size_t n = dev.n, h = n / 3;
        float *d_next = ops->alloc(dev.dev, n * sizeof(float));
        float *d_state = ops->alloc(dev.dev, n * (size_t)dev.state_per * sizeof(float));
        float *g = dp_malloc(n * sizeof *g), *g0 = dp_malloc(n * sizeof *g0);
        dp_rng_t r;
        dp_rng_seed(&r, 31u + (unsigned)count);
        for (int step = 0; step < 4; step++) {
            for (size_t i = 0; i < n; i++) g[i] = (2.0f * dp_rng_uniform(&r) - 1.0f) * 0.1f;
            for (size_t i = 0; i < n; i++) g0[i] = (2.0f * dp_rng_uniform(&r) - 1.0f) * 0.1f;
            dp_grad_slice_t sl = {g, n * 4, 0}, sl0 = {g0, n * 4, 0};
            if (count) {
                dp_shard_accumulate(&host, &sl0, 1);
                dp_shard_accumulate(&dev, &sl0, 1);
            }
            float lr = dp_shard_lr(&dev);
            dp_snap_t *next = dp_shard_take_buffer(&dev);
            dp_shard_step_ahead(&dev, d_next, d_state, g, count, lr, dev.version, h, n);
            dp_shard_step_ahead(&dev, d_next, d_state, g, count, lr, dev.version, 0, h);
            if (step == 2) { /* dropped: the push stepped whole instead */
                dp_shard_keep_spare(&dev, next);
                if (count) {
                    dp_shard_accumulate(&dev, &sl, 1);
                    dp_shard_step_mean(&dev);
                } else {
                    dp_shard_step(&dev, &sl, 1, lr);
                }
            } else {
                dp_shard_adopt(&dev, next, &d_state, &d_next, count > 0);
            }
            if (count) {
                dp_shard_accumulate(&host, &sl, 1);
                dp_shard_step_mean(&host);
            } else {
                dp_shard_step(&host, &sl, 1, lr);
            }
            CHECK_EQ(dev.acc_count, 0);
            s_same("acc", dev.acc, host.acc, n);
        }
        s_compare(count ? "early sync steps" : "early async steps", &host, &dev);
        ops->release(dev.dev, d_next);
        ops->release(dev.dev, d_state);
        free(g);
        free(g0);
        dp_shard_fini(&host);
        dp_shard_fini(&dev);
    }
}

DP_TESTS(T(test_steps_bitwise), T(test_dc_bitwise), T(test_early_bitwise),
         T(test_checkpoint_round_trip))
