/* test_shard_early: the early step (server/core/shard_early.h) driven as the
 * event loop drives it — assemblies (server/core/shard_parts.h), a policy
 * (server/core/policy.h) and a shard with Adam's state, no sockets — event by
 * event: what each returns, that the policy commits only the push it is
 * told is the early step's and only the step made early, and that a
 * committed step has the bits of the same push stepped whole. The loop's
 * side (hostile parts, a push between two parts, sync's completing push)
 * is test_ps_parts'. Each case runs twice: on the host, and with the shard
 * that steps early on the "cpu" device stand-in (kernels/optim_dev.h: the
 * next version and its state stepped in the device's memory, swapped in at
 * the commit), against reference shards on the host, bit for bit. */
#include <math.h>
#include <string.h>

#include "common/model.h"
#include "common/util.h"
#include "kernels/optim_dev.h"
#include "server/core/shard_early.h"
#include "server/core/shard_parts.h"
#include "tests/policy_fixture.h"
#include "tests/ps_harness.h"
#include "tests/test.h"

typedef struct {
    policy_fx_t p; /* the shard, its 2 workers and the policy */
    dp_shard_parts_t parts;
    dp_shard_early_t early;
} fx_t;

/* The cases' shards with early steps on are on the device stand-in. */
static bool s_on_device;

/* An Adam shard (lr 0.01) of 2 joined workers under ops with R = 2;
 * early steps as enabled says (the policy committing them), such a shard
 * on the stand-in under s_on_device. */
static int fx_init(fx_t *f, const dp_policy_ops_t *ops, bool enabled)
{
    memset(f, 0, sizeof *f);
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    o.kind = DP_OPT_ADAM;
    o.lr = 0.01f;
    dp_policy_conf_t pc = {.replicas = 2, .staleness = 0, .delay_lr = 0, .delay_k = 0};
    if (policy_fx_init(&f->p, ops, &o, 2, &pc) != 0) return -1;
    char err[DP_ERR_LEN];
    dp_optim_dev_t *dev = NULL;
    if (s_on_device && enabled && (dp_optim_dev_new(&dev, "cpu", NULL, err) != 0 ||
                                   dp_shard_set_device(&f->p.shard, dev, err) != 0)) {
        fprintf(stderr, "  device: %s\n", err);
        return -1;
    }
    dp_shard_parts_init(&f->parts, f->p.shard.lo, f->p.shard.hi, 2);
    dp_shard_early_init(&f->early, &f->p.shard, &f->parts, f->p.policy, enabled);
    dp_policy_early_steps(f->p.policy, &f->early);
    return 0;
}

static void fx_fini(fx_t *f)
{
    dp_shard_early_fini(&f->early);
    dp_shard_early_fini(&f->early); /* safe twice */
    dp_shard_parts_fini(&f->parts);
    policy_fx_fini(&f->p);
}

/* Worker wid's part k of K of step st on version v: floats [off, off +
 * cnt) of the range from its gradient, taken by the assembly (out: the
 * whole push once COMPLETE). */
static dp_parts_result_t fx_add(fx_t *f, int wid, uint64_t st, uint64_t v, uint32_t k, uint32_t K,
                                size_t off, size_t cnt, dp_grad_slice_t *out)
{
    const float *g = f->p.g[wid] + off;
    raw_push_t rp;
    raw_push_init(&rp, &f->p.model, wid, 1, st, v, k, K, g, cnt, f->p.shard.lo + off);
    dp_wire_frame_t fr = {g, cnt * sizeof(float)};
    char why[DP_ERR_LEN];
    return dp_shard_parts_add(&f->parts, wid, &rp.env, &fr, 1, NULL, out, why);
}

/* The part's event after the assembly took it. */
static dp_early_result_t fx_part(fx_t *f, int wid, uint64_t st, uint64_t v, uint32_t k, uint32_t K,
                                 size_t off, size_t cnt, dp_grad_slice_t *out)
{
    return dp_shard_early_part(&f->early, wid, st, fx_add(f, wid, st, v, k, K, off, cnt, out));
}

/* Worker wid's push g (n slices) of step st on version v through the
 * policy (early: the loop's dp_shard_early_of), then the event after it. */
static dp_push_status_t fx_push(fx_t *f, int wid, uint64_t st, uint64_t v, const dp_grad_slice_t *g,
                                bool early)
{
    dp_push_outcome_t o;
    dp_policy_push(f->p.policy, wid, v, g, 1, early, &o);
    dp_shard_early_pushed(&f->early, wid, st);
    return o.status;
}

/* Worker wid's gradient whole. */
static dp_grad_slice_t fx_whole(const fx_t *f, int wid)
{
    return (dp_grad_slice_t){f->p.g[wid], f->p.shard.n * sizeof(float), f->p.shard.lo};
}

/* Weights, Adam's state and version the same bits in a and b (a device's
 * state copied off first). */
static int fx_same(const fx_t *a, const fx_t *b)
{
    size_t n = a->p.shard.n, ns = n * (size_t)a->p.shard.state_per;
    dp_shard_device_state(&a->p.shard);
    dp_shard_device_state(&b->p.shard);
    return a->p.shard.version == b->p.shard.version &&
           memcmp(a->p.shard.w, b->p.shard.w, n * sizeof(float)) == 0 &&
           memcmp(a->p.shard.state, b->p.shard.state, ns * sizeof(float)) == 0;
}

/* Async: worker 1's push in two parts is begun at its first part, its
 * second stepped in, and committed by the policy: the bits of the same
 * push stepped whole (twice, Adam's moments swapped back and forth); the
 * push's event then has nothing left to drop. */
static void test_async_commit(void)
{
    fx_t f, r;
    if (fx_init(&f, &dp_policy_async, true) != 0 || fx_init(&r, &dp_policy_async, false) != 0) {
        CHECK(0);
        return;
    }
    size_t n = f.p.shard.n, h = n / 2;
    for (uint64_t st = 1; st <= 2; st++) {
        dp_grad_slice_t g;
        CHECK_EQ(fx_part(&f, 1, st, st - 1, 1, 2, h, n - h, &g), DP_EARLY_BEGUN);
        CHECK(dp_shard_early_of(&f.early, 1, st));
        CHECK(!dp_shard_early_of(&f.early, 0, st) && !dp_shard_early_of(&f.early, 1, st + 1));
        CHECK_EQ(fx_part(&f, 1, st, st - 1, 0, 2, 0, h, &g), DP_EARLY_STEPPED);
        CHECK_EQ(f.p.shard.version, st - 1); /* nothing of it is live before the commit */
        dp_push_outcome_t o;
        dp_policy_push(f.p.policy, 1, st - 1, &g, 1, dp_shard_early_of(&f.early, 1, st), &o);
        CHECK_EQ(o.status, DP_PUSH_APPLIED);
        CHECK_EQ(dp_shard_early_pushed(&f.early, 1, st), DP_EARLY_NONE); /* committed */
        dp_grad_slice_t w = fx_whole(&r, 1);
        CHECK_EQ(fx_push(&r, 1, st, st - 1, &w, false), DP_PUSH_APPLIED);
        CHECK(fx_same(&f, &r));
    }
    CHECK_EQ(f.p.shard.counts.steps_early, 2);
    CHECK_EQ(f.p.shard.counts.early_dropped, 0);
    fx_fini(&f);
    fx_fini(&r);
}

/* The policy commits only when told the push is the early step's: worker
 * 1's early step complete (all its floats in one of its two parts), worker
 * 0's push (not it) overtakes and drops it, and it begins again from the
 * new version. And a commit asked for a step other than the one made
 * early (another lr, another count, the version moved under it) is
 * refused. */
static void test_commit_only_its_step(void)
{
    fx_t f, r;
    if (fx_init(&f, &dp_policy_async, true) != 0 || fx_init(&r, &dp_policy_async, false) != 0) {
        CHECK(0);
        return;
    }
    size_t n = f.p.shard.n;
    dp_grad_slice_t g, g0 = fx_whole(&f, 0), r0 = fx_whole(&r, 0);
    CHECK_EQ(fx_part(&f, 1, 1, 0, 0, 2, 0, n, &g), DP_EARLY_BEGUN);
    CHECK_EQ(fx_push(&f, 0, 1, 0, &g0, false), DP_PUSH_APPLIED);
    CHECK_EQ(f.p.shard.counts.steps_early, 0);
    CHECK_EQ(f.p.shard.counts.early_dropped, 1);
    CHECK(dp_shard_early_of(&f.early, 1, 1)); /* again, from version 1 */
    CHECK_EQ(f.early.version, 1);
    CHECK_EQ(fx_push(&r, 0, 1, 0, &r0, false), DP_PUSH_APPLIED);
    CHECK(fx_same(&f, &r));
    float lr = dp_shard_lr(&f.p.shard);
    CHECK_EQ(dp_shard_early_commit(&f.early, lr * 0.5f, 0), DP_EARLY_NONE);
    CHECK_EQ(dp_shard_early_commit(&f.early, lr, 2), DP_EARLY_NONE);
    CHECK_EQ(dp_shard_early_commit(NULL, lr, 0), DP_EARLY_NONE);
    dp_shard_step(&f.p.shard, &g0, 1, lr); /* not through the policy: nothing overtaken */
    CHECK_EQ(dp_shard_early_commit(&f.early, dp_shard_lr(&f.p.shard), 0), DP_EARLY_NONE);
    CHECK(dp_shard_early_of(&f.early, 1, 1)); /* refused, not dropped */
    CHECK_EQ(dp_shard_early_overtaken(&f.early), DP_EARLY_DROPPED);
    CHECK_EQ(dp_shard_early_overtaken(&f.early), DP_EARLY_NONE);
    CHECK_EQ(dp_shard_early_overtaken(NULL), DP_EARLY_NONE);
    CHECK_EQ(f.p.shard.counts.steps_early, 0);
    dp_shard_step(&r.p.shard, &r0, 1, lr);
    CHECK(fx_same(&f, &r));
    fx_fini(&f);
    fx_fini(&r);
}

/* Sync, R = 2: worker 1's push is the completing one after worker 0's, so
 * it goes early from its first part and the policy commits it with acc's
 * mean; told it is not the early step's push, the policy steps the mean
 * whole (the same bits) and drops it. */
static void test_sync_commit(void)
{
    for (int told = 0; told < 2; told++) {
        fx_t f, r;
        if (fx_init(&f, &dp_policy_sync, true) != 0 || fx_init(&r, &dp_policy_sync, false) != 0) {
            CHECK(0);
            return;
        }
        size_t n = f.p.shard.n, h = n / 2;
        dp_grad_slice_t g, g0 = fx_whole(&f, 0), r0 = fx_whole(&r, 0), r1 = fx_whole(&r, 1);
        CHECK_EQ(fx_push(&f, 0, 1, 0, &g0, false), DP_PUSH_APPLIED);
        CHECK_EQ(fx_part(&f, 1, 1, 0, 0, 2, 0, h, &g), DP_EARLY_BEGUN);
        CHECK_EQ(fx_part(&f, 1, 1, 0, 1, 2, h, n - h, &g), DP_EARLY_STEPPED);
        CHECK_EQ(f.p.shard.acc_count, 1); /* acc untouched so far */
        CHECK_EQ(fx_push(&f, 1, 1, 0, &g, told && dp_shard_early_of(&f.early, 1, 1)),
                 DP_PUSH_APPLIED);
        CHECK_EQ(f.p.shard.acc_count, 0);
        CHECK_EQ(f.p.shard.counts.steps_early, (uint64_t)told);
        CHECK_EQ(f.p.shard.counts.early_dropped, (uint64_t)!told);
        CHECK_EQ(fx_push(&r, 0, 1, 0, &r0, false), DP_PUSH_APPLIED);
        CHECK_EQ(fx_push(&r, 1, 1, 0, &r1, false), DP_PUSH_APPLIED);
        CHECK(fx_same(&f, &r));
        fx_fini(&f);
        fx_fini(&r);
    }
}

/* What drops an early step, and what keeps one from beginning: a bad part
 * (its push rejected), a newer step of the same worker (part or whole), a
 * HELLO of its worker (not another's); off, in sync a push that does not
 * complete the step, in async another worker streaming too. */
static void test_drops(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_async, true) != 0) {
        CHECK(0);
        return;
    }
    size_t n = f.p.shard.n, h = n / 2;
    dp_grad_slice_t g;
    CHECK_EQ(fx_part(&f, 1, 1, 0, 0, 2, 0, h, &g), DP_EARLY_BEGUN);
    f.p.g[1][h + 1] = NAN;
    CHECK_EQ(fx_part(&f, 1, 1, 0, 1, 2, h, n - h, &g), DP_EARLY_DROPPED);
    CHECK(!dp_shard_early_of(&f.early, 1, 1));
    f.p.g[1][h + 1] = 1.0f;
    CHECK_EQ(fx_part(&f, 1, 2, 0, 0, 2, 0, h, &g), DP_EARLY_BEGUN);
    CHECK_EQ(fx_part(&f, 1, 3, 0, 0, 2, 0, h, &g), DP_EARLY_BEGUN); /* step 2's dropped first */
    CHECK(!dp_shard_early_of(&f.early, 1, 2) && dp_shard_early_of(&f.early, 1, 3));
    CHECK_EQ(dp_shard_early_whole(&f.early, 1, 3), DP_EARLY_NONE); /* not newer */
    CHECK_EQ(dp_shard_early_whole(&f.early, 0, 4), DP_EARLY_NONE); /* another worker */
    CHECK_EQ(dp_shard_early_whole(&f.early, 1, 4), DP_EARLY_DROPPED);
    dp_shard_parts_drop(&f.parts, 1);
    CHECK_EQ(fx_part(&f, 1, 5, 0, 0, 2, 0, h, &g), DP_EARLY_BEGUN);
    CHECK_EQ(dp_shard_early_hello(&f.early, 0), DP_EARLY_NONE);
    CHECK_EQ(dp_shard_early_hello(&f.early, 1), DP_EARLY_DROPPED);
    CHECK_EQ(dp_shard_early_hello(&f.early, 1), DP_EARLY_NONE);
    CHECK_EQ(f.p.shard.counts.early_dropped, 4);
    /* async: worker 0 streams (assembling) while worker 1's part comes */
    dp_shard_parts_drop(&f.parts, 1);
    CHECK_EQ(fx_part(&f, 0, 1, 0, 0, 2, 0, h, &g), DP_EARLY_BEGUN);
    CHECK_EQ(dp_shard_early_hello(&f.early, 0), DP_EARLY_DROPPED);
    CHECK_EQ(fx_part(&f, 1, 6, 0, 0, 2, 0, h, &g), DP_EARLY_NONE);
    fx_fini(&f);
    /* off: nothing begins */
    if (fx_init(&f, &dp_policy_async, false) != 0) {
        CHECK(0);
        return;
    }
    CHECK_EQ(fx_part(&f, 1, 1, 0, 0, 2, 0, h, &g), DP_EARLY_NONE);
    fx_fini(&f);
    /* sync: the first push of two does not complete the step */
    if (fx_init(&f, &dp_policy_sync, true) != 0) {
        CHECK(0);
        return;
    }
    CHECK_EQ(fx_part(&f, 1, 1, 0, 0, 2, 0, h, &g), DP_EARLY_NONE);
    fx_fini(&f);
}

/* The cases above with the early-stepping shard on the device stand-in. */
static void test_on_device(void)
{
    s_on_device = true;
    test_async_commit();
    test_commit_only_its_step();
    test_sync_commit();
    test_drops();
    s_on_device = false;
}

DP_TESTS(T(test_async_commit), T(test_commit_only_its_step), T(test_sync_commit), T(test_drops),
         T(test_on_device))
