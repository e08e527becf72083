/* test_ps_devread: a device worker and a shard's device region
 * (proto/devregion.h) without the host between them, on the CPU stand-in
 * (the test hook DP_TEST_DEVMEM=standin) and cpu:staged (the CPU backend
 * behind a device's memory model, whose copy_peer copies wait for the next
 * synchronize as a device's stream would):
 *  - the route to a region: its own device, another one by peer access,
 *    or none (the host path) when peer access is not there; a WELCOME's
 *    offer mapped or declined so;
 *  - a pull through the ring copies the pinned entry into the network with
 *    the backend's copy_peer and unpins it only once the copy is done: a
 *    shard that publishes into every entry it may while the copy waits
 *    never touches the one being copied;
 *  - pulls and pushes through the device's copies (dp_ps_client_set_device:
 *    the entry into the network, the gradient from the "device" into the
 *    slot, no host gradient at all) end bit for bit where frames end, every
 *    one of them device to device; a push without a host gradient where
 *    the client cannot take one from the device is refused in one line.
 *  - the overlapped loop's double buffers (worker/train/devside.h), driven
 *    in its order through a real communication thread (pipeline.h): the
 *    thread never writes the weights the "forward" reads, the boundary's
 *    take has landed when it returns (cpu:staged makes it only at the
 *    synchronize), the end is bit for bit frames' in the same order, and
 *    every pull and push went device to device; after a shard restart the
 *    thread's re-HELLO maps the new region and its pulls stay device to
 *    device, each device copy on the thread preceded by the device's enter;
 *  - the route of a WELCOME on a thread that never selected the worker's
 *    device (a provider whose reach, as CUDA's, asks the thread's device):
 *    decided after the client's enter, so the region is the worker's own.
 * Servers run in a thread of this program (tests/ps_harness.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "proto/devregion.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/pipeline.h"
#include "worker/client/ps_client.h"
#include "worker/client/ps_exchange.h"
#include "worker/train/devside.h"

#define TMO 5.0
#define STEPS 6
#define NF 1000

static dp_model_t s_small;

/* ---- the route ---------------------------------------------------------- */

/* The decision, and the stand-in's facts under each hook: one device; the
 * region on another the worker reaches by peer access; on one it cannot. */
static void test_route(void)
{
    char why[DP_ERR_LEN] = "";
    CHECK_EQ(dp_devregion_route(1, 0), DP_DEVREGION_LOCAL);
    CHECK_EQ(dp_devregion_route(1, 1), DP_DEVREGION_LOCAL);
    CHECK_EQ(dp_devregion_route(0, 1), DP_DEVREGION_PEER);
    CHECK_EQ(dp_devregion_route(0, 0), DP_DEVREGION_HOST);
    const dp_devmem_ops_t *ops = &dp_devmem_standin;
    setenv("DP_TEST_DEVMEM", "standin", 1);
    CHECK_EQ(dp_devregion_reach(ops, "standin", why), DP_DEVREGION_LOCAL);
    CHECK_EQ(dp_devregion_reach(ops, "", why), DP_DEVREGION_LOCAL); /* an offer that does not say */
    setenv("DP_TEST_DEVMEM", "standin:peer", 1);
    CHECK(dp_devmem_test_provider() == ops);
    CHECK_EQ(dp_devregion_reach(ops, "standin", why), DP_DEVREGION_PEER);
    setenv("DP_TEST_DEVMEM", "standin:nopeer", 1);
    CHECK(dp_devmem_test_provider() == ops);
    CHECK_EQ(dp_devregion_reach(ops, "standin", why), DP_DEVREGION_HOST);
    CHECK(strstr(why, "cannot reach (no peer access)") != NULL);
    unsetenv("DP_TEST_DEVMEM");
    /* the shard says where its ring lies */
    dp_devregion_shard_t r;
    dp_devregion_offer_t o;
    CHECK_EQ(dp_devregion_create(&r, ops, 16, 2, 1, why), 0);
    CHECK_EQ(dp_devregion_offer(&r, 0, &o, why), 0);
    CHECK_STR(o.device, "standin");
    dp_devregion_release_last(&r);
}

/* A WELCOME's offer at the worker (dp_ps_devr_welcome): the region mapped
 * on its own device and by peer access, declined in one line where the
 * device cannot be reached (shared memory then). */
static void s_welcome(const dp_devregion_offer_t *f, const char *device, int *mapped)
{
    dp_ps_shard_t sh;
    memset(&sh, 0, sizeof sh);
    sh.hi = f->n;
    snprintf(sh.endpoint, sizeof sh.endpoint, "test");
    dp_ps_client_t c;
    memset(&c, 0, sizeof c);
    c.sh = &sh;
    c.n = 1;
    Downpour__DevRegionOffer m = DOWNPOUR__DEV_REGION_OFFER__INIT;
    m.generation = f->generation;
    m.n = f->n;
    m.ring = (uint32_t)f->ring;
    m.workers = (uint32_t)f->workers;
    m.slot = f->slot;
    m.ctl = (char *)f->ctl;
    m.wctl = (char *)f->wctl;
    m.weights = (ProtobufCBinaryData){sizeof f->weights.b, (uint8_t *)f->weights.b};
    m.grad = (ProtobufCBinaryData){sizeof f->grad.b, (uint8_t *)f->grad.b};
    m.event = (ProtobufCBinaryData){sizeof f->event.b, (uint8_t *)f->event.b};
    m.device = (char *)device;
    Downpour__Welcome w = DOWNPOUR__WELCOME__INIT;
    w.devregion = &m;
    dp_ps_devr_welcome(&c, 0, &w);
    *mapped = sh.devr && sh.devr_w.ctl != NULL;
    dp_ps_devr_close(&sh);
}

static void test_welcome_routes(void)
{
    char err[DP_ERR_LEN] = "";
    dp_devregion_shard_t r;
    dp_devregion_offer_t f;
    int mapped = -1;
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 2, 1, err), 0);
    CHECK_EQ(dp_devregion_offer(&r, 0, &f, err), 0);
    setenv("DP_TEST_DEVMEM", "standin", 1);
    s_welcome(&f, f.device, &mapped);
    CHECK_EQ(mapped, 1);
    setenv("DP_TEST_DEVMEM", "standin:peer", 1);
    s_welcome(&f, f.device, &mapped);
    CHECK_EQ(mapped, 1);
    setenv("DP_TEST_DEVMEM", "standin:nopeer", 1);
    s_welcome(&f, f.device, &mapped);
    CHECK_EQ(mapped, 0); /* declined: the host path */
    unsetenv("DP_TEST_DEVMEM");
    dp_devregion_release_last(&r);
}

/* ---- the unpin after the copy --------------------------------------- */

typedef struct {
    dp_devregion_shard_t *r;
    dp_backend_t *be;
    float *d_params;            /* the "network's", on cpu:staged */
    int publishes;              /* the shard's, while the copy waited */
    int copies;                 /* weights_in's */
} s_read_t;

static void s_publish(dp_devregion_shard_t *r, uint64_t v)
{
    float *e = dp_devregion_publish_begin(r, v);
    if (!e) return;
    for (int i = 0; i < NF; i++) e[i] = (float)v * 1000.0f + (float)i;
    dp_devregion_publish_end(r);
}

/* cpu:staged's moment before the noted copies are made: the shard
 * publishes into every entry it may, twice round the ring. */
static void s_before_copies(void *arg)
{
    s_read_t *t = arg;
    for (int k = 0; k < 2 * t->r->ring; k++) s_publish(t->r, 100 + (uint64_t)t->publishes++);
}

/* The network's weights_in: queued, then waited for (distributed.c's). */
static int s_weights_in(void *arg, size_t off, const float *src, size_t n, char *err)
{
    (void)err;
    s_read_t *t = arg;
    t->be->ops->copy_peer(t->be, t->d_params + off, src, n * sizeof(float));
    t->be->ops->synchronize(t->be);
    t->copies++;
    return 0;
}

static void test_unpin_after_copy(void)
{
    char err[DP_ERR_LEN] = "";
    dp_devregion_shard_t r;
    dp_devregion_offer_t o;
    dp_ps_shard_t sh;
    memset(&sh, 0, sizeof sh);
    sh.lo = 0;
    sh.hi = NF;
    snprintf(sh.endpoint, sizeof sh.endpoint, "test");
    s_read_t t = {.r = &r};
    CHECK_EQ(dp_backend_cpu_staged_new(&t.be, err), 0);
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 4, 1, err), 0);
    CHECK_EQ(dp_devregion_offer(&r, 0, &o, err), 0);
    CHECK_EQ(dp_devregion_attach(&sh.devr_w, &dp_devmem_standin, &o, err), 0);
    t.d_params = t.be->ops->alloc(t.be, NF * sizeof(float));
    dp_backend_staged_before_copies(t.be, s_before_copies, &t);
    dp_ps_device_t dev = {.weights_in = s_weights_in, .arg = &t};
    s_publish(&r, 1);
    CHECK_EQ(dp_ps_devr_read_device(&sh, 1, &dev), 0);
    float got[NF];
    t.be->ops->download(t.be, got, t.d_params, sizeof got);
    CHECK_EQ(t.copies, 1);
    CHECK(t.publishes > 0); /* the shard did write the ring while the copy waited */
    int same = 1;
    for (int i = 0; i < NF; i++) same &= got[i] == 1000.0f + (float)i;
    /* version 1's bits; a later version's mean the entry was unpinned
     * before its copy was made */
    if (!same) fprintf(stderr, "  the network got got[0] = %g, version 1 has 1000\n", (double)got[0]);
    CHECK(same);
    CHECK_EQ(sh.devr_w.pinned, -1); /* unpinned after */
    CHECK_EQ(atomic_load(&sh.devr_w.wctl->pin), 0);
    /* a version other than the reply's: nothing copied, the pull goes again */
    CHECK_EQ(dp_ps_devr_read_device(&sh, 1, &dev), -1);
    CHECK_EQ(t.copies, 1);
    dp_devregion_detach(&sh.devr_w);
    dp_devregion_release_last(&r);
    t.be->ops->release(t.be, t.d_params);
    dp_backend_destroy(&t.be);
}

/* ---- a client's pulls and pushes device to device ---------------------- */

/* The "device": the network's weights and gradient in buffers of the test. */
typedef struct {
    float *d_params, *d_grads;
    int in, out_dev, out_host;
} s_dev_t;

static int s_dev_in(void *arg, size_t off, const float *src, size_t n, char *err)
{
    (void)err;
    s_dev_t *d = arg;
    memcpy(d->d_params + off, src, n * sizeof(float));
    d->in++;
    return 0;
}

static int s_dev_out(void *arg, float *dst, const float *from, size_t off, size_t n, int device,
                     char *err)
{
    (void)err, (void)from;
    s_dev_t *d = arg;
    memcpy(dst, d->d_grads + off, n * sizeof(float));
    if (device) d->out_dev++;
    else d->out_host++;
    return 0;
}

static void s_grad_of(const float *p, float *g, size_t n, int step)
{
    for (size_t i = 0; i < n; i++) g[i] = 0.5f * p[i] + 0.01f * (float)((i * 7 + (size_t)step) % 13);
}

/* STEPS pulls and pushes, through the device's copies (device) or over
 * frames; the last pull's weights into w. */
static void s_one_run(int device, float *w, s_dev_t *d)
{
    if (device) setenv("DP_TEST_DEVMEM", "standin", 1);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_opts_t o = {.timeout_s = TMO,
                             .transport = device ? DP_PS_TRANSPORT_AUTO : DP_PS_TRANSPORT_ZMQ};
    dp_ps_client_t *c = NULL;
    size_t n = s_small.n_floats;
    dp_ps_device_t dev = {.weights_in = s_dev_in, .grads_out = s_dev_out, .arg = d};
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &o, NULL, err), 0);
    if (c && device) dp_ps_client_set_device(c, &dev);
    for (int t = 1; c && t <= STEPS + 1; t++) {
        if (device) CHECK_EQ(dp_ps_client_pull_device(c, NULL, NULL, err), 0);
        else CHECK_EQ(dp_ps_client_pull(c, d->d_params, err), 0);
        if (t > STEPS) break;
        s_grad_of(d->d_params, d->d_grads, n, t);
        dp_push_result_t r;
        if (device) CHECK_EQ(dp_ps_client_push_on_device(c), 1);
        const float *g = device ? NULL : d->d_grads; /* device: the client's grads_out */
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP((uint64_t)t, g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
    }
    memcpy(w, d->d_params, n * sizeof(float));
    if (c && device) {
        uint64_t pulls, pushes;
        dp_ps_client_device_counts(c, &pulls, &pushes);
        CHECK_EQ(pulls, STEPS + 1);
        CHECK_EQ(pushes, STEPS);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
    unsetenv("DP_TEST_DEVMEM");
}

static void test_device_same_as_frames(void)
{
    srv_small_model(&s_small);
    size_t n = s_small.n_floats;
    float *wd = dp_malloc(n * 4), *wf = dp_malloc(n * 4);
    s_dev_t d = {.d_params = dp_calloc(n, 4), .d_grads = dp_calloc(n, 4)};
    s_one_run(1, wd, &d);
    CHECK_EQ(d.in, STEPS + 1);  /* every pull: the ring entry into the network */
    CHECK_EQ(d.out_dev, STEPS); /* every push: from the "device" into the slot */
    CHECK_EQ(d.out_host, 0);    /* none through the host */
    memset(d.d_params, 0, n * 4);
    s_one_run(0, wf, &d);
    CHECK_CLOSE("device to device vs frames", wd, wf, n, 0, 0);
    free(d.d_params), free(d.d_grads), free(wd), free(wf);
}

/* A push with no host gradient on a client that cannot take it from the
 * device (no device copies set, over frames): refused in one line. */
static void test_device_push_refused(void)
{
    srv_small_model(&s_small);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_opts_t o = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    dp_ps_client_t *c = NULL;
    float *w = dp_malloc(s_small.n_floats * 4);
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &o, NULL, err), 0);
    if (c) {
        CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
        CHECK_EQ(dp_ps_client_push_on_device(c), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(1, NULL, 1, 8), NULL, err), -1);
        CHECK(strstr(err, "a push from the device") != NULL);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
    free(w);
}

/* ---- the overlapped loop's double buffers ------------------------------ */

/* The device's copies as the thread calls them, wrapped: each must follow
 * an enter on the calling thread since its last copy (CUDA takes the
 * thread's device, which only enter sets on the thread). */
static _Thread_local int s_entered;

typedef struct {
    dp_devside_t *x;
    int not_entered;            /* copies on a thread not put on the device */
    int in;                     /* weights_in's */
} s_wrap_t;

static int s_wrap_in(void *arg, size_t off, const float *src, size_t n, char *err)
{
    s_wrap_t *w = arg;
    w->not_entered += !s_entered;
    s_entered = 0; /* the next copy needs its own enter */
    w->in++;
    return w->x->dev.weights_in(w->x->dev.arg, off, src, n, err);
}

static int s_wrap_out(void *arg, float *dst, const float *from, size_t off, size_t n, int device,
                      char *err)
{
    s_wrap_t *w = arg;
    w->not_entered += !s_entered;
    s_entered = 0;
    return w->x->dev.grads_out(w->x->dev.arg, dst, from, off, n, device, err);
}

static void s_wrap_enter(void *arg)
{
    s_wrap_t *w = arg;
    s_entered = 1;
    w->x->dev.enter(w->x->dev.arg);
}

/* The loop's s_take: results in order up to and including the next pull. */
static int s_take_pull(dp_pipeline_t *pl, dp_ps_stamp_t *stamp)
{
    dp_pipe_job_t j;
    while (dp_pipeline_wait(pl, &j) == 0) {
        if (j.rc != 0) {
            fprintf(stderr, "  job: %s\n", j.err);
            return -1;
        }
        if (j.op == DP_PIPE_PULL) {
            *stamp = j.stamp;
            return 0;
        }
        if (j.res.applied != 1) fprintf(stderr, "  push %llu: %s\n", (unsigned long long)j.step, j.res.reason);
        CHECK_EQ(j.res.applied, 1);
    }
    return -1;
}

typedef struct {
    int device;                 /* through devside, else h_params and host pushes over frames */
    int restart_at;             /* > 0: the shard restarted before that step's pull is posted */
    int thread_wrote;           /* boundaries where the weights had changed under the forward */
    int take_missed;            /* takes that had not landed when they returned */
    uint64_t pulls, pushes;     /* device to device, the client's count */
    uint64_t pulls_after;       /* ... of them after the restart */
    uint64_t gen0, gen1;        /* the region's generation before and after it */
    s_wrap_t wrap;
} s_ov_t;

/* Restart the shard in place: a new one on the same endpoint. */
static int s_restart(srv_t *s, srv_t *s2)
{
    CHECK_EQ(srv_stop(s), 0);
    srv_init(s2, DP_MODE_ASYNC, 1);
    snprintf(s2->cfg.bind, sizeof s2->cfg.bind, "%s", s->endpoint);
    int up = srv_start(s2) == 0;
    CHECK(up);
    return up ? 0 : -1;
}

/* The steps of the overlapped loop (distributed.c's s_loop_overlap) with
 * the "forward" reading d_params and the "backward" writing d_grads of a
 * cpu:staged backend; the last weights taken into w. */
static void s_overlap_steps(dp_ps_client_t *c, dp_devside_t *x, s_ov_t *o,
                            srv_t *s, srv_t *s2, float *w)
{
    size_t n = s_small.n_floats;
    float *prev = dp_calloc(n, 4), *hp = dp_calloc(n, 4), *hg[2] = {dp_calloc(n, 4), dp_calloc(n, 4)};
    char err[DP_ERR_LEN] = "";
    dp_pipeline_t *pl = NULL;
    CHECK_EQ(dp_pipeline_new(&pl, c, err), 0);
    dp_ps_stamp_t stamp;
    dp_pipe_job_t pull = o->device ? (dp_pipe_job_t){.op = DP_PIPE_PULL, .sink = dp_devside_sink,
                                                     .sink_arg = x}
                                   : (dp_pipe_job_t){.op = DP_PIPE_PULL, .params = hp};
    dp_pipeline_post(pl, &pull);
    int ok = s_take_pull(pl, &stamp) == 0;
    for (int t = 1; ok && t <= STEPS; t++) {
        if (o->device) {
            o->thread_wrote += memcmp(x->d_params, prev, n * 4) != 0; /* the forward's, still */
            dp_devside_take(x);
            o->take_missed += memcmp(x->d_params, x->d_next, n * 4) != 0; /* read as the forward would */
            memcpy(prev, x->d_params, n * 4);
        } else {
            memcpy(x->d_params, hp, n * 4);
        }
        if (t == o->restart_at) { /* the pipeline idle: its pushes taken, no pull posted */
            dp_pipeline_destroy(&pl);
            o->gen0 = c->sh[0].devr_w.generation;
            dp_ps_client_device_counts(c, &o->pulls_after, &o->pushes);
            ok = s_restart(s, s2) == 0 && dp_pipeline_new(&pl, c, err) == 0;
            if (!ok) break;
        }
        dp_pipeline_post(pl, &pull);
        s_grad_of(x->d_params, (float *)x->d_grads, n, t); /* the backward */
        const float *dg = o->device ? dp_devside_grads(x, t) : NULL;
        if (!o->device) memcpy(hg[t & 1], x->d_grads, n * 4);
        /* a restarted shard without a checkpoint counts the worker's steps anew */
        int st = o->restart_at && t >= o->restart_at ? t - o->restart_at + 1 : t;
        dp_pipe_job_t push = {.op = DP_PIPE_PUSH, .grads = o->device ? NULL : hg[t & 1],
                              .d_grads = dg, .step = (uint64_t)st, .loss = 1, .batch = 8,
                              .stamp = stamp};
        dp_pipeline_post(pl, &push);
        ok = s_take_pull(pl, &stamp) == 0;
    }
    CHECK(ok);
    dp_pipeline_destroy(&pl);
    if (o->device) dp_devside_take(x);
    else memcpy(x->d_params, hp, n * 4);
    memcpy(w, x->d_params, n * 4);
    free(prev), free(hp), free(hg[0]), free(hg[1]);
}

static void s_overlap_run(s_ov_t *o, float *w)
{
    if (o->device) setenv("DP_TEST_DEVMEM", "standin", 1);
    srv_t s, s2;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_cpu_staged_new(&be, err), 0);
    size_t n = s_small.n_floats;
    float *d_params = be->ops->alloc(be, n * 4), *d_grads = be->ops->alloc(be, n * 4);
    dp_devside_t x;
    dp_devside_init(&x, be, d_params, d_grads, n);
    o->wrap = (s_wrap_t){.x = &x};
    dp_ps_device_t dev = {.weights_in = s_wrap_in, .grads_out = s_wrap_out,
                          .enter = s_wrap_enter, .arg = &o->wrap};
    dp_ps_client_opts_t opts = {.timeout_s = TMO,
                                .transport = o->device ? DP_PS_TRANSPORT_AUTO : DP_PS_TRANSPORT_ZMQ};
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &opts, NULL, err), 0);
    if (c && o->device) {
        CHECK_EQ(dp_ps_client_devregion_shards(c), 1);
        dp_ps_client_set_device(c, &dev);
    }
    if (c) s_overlap_steps(c, &x, o, &s, &s2, w);
    if (c && o->device) {
        uint64_t before = o->pulls_after;
        dp_ps_client_device_counts(c, &o->pulls, &o->pushes);
        o->pulls_after = o->restart_at ? o->pulls - before : 0;
        o->gen1 = c->sh[0].devr_w.generation;
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(o->restart_at ? &s2 : &s), 0);
    dp_devside_fini(&x);
    be->ops->release(be, d_params), be->ops->release(be, d_grads);
    dp_backend_destroy(&be);
    unsetenv("DP_TEST_DEVMEM");
}

static void test_overlap_device(void)
{
    srv_small_model(&s_small);
    size_t n = s_small.n_floats;
    float *wd = dp_malloc(n * 4), *wf = dp_malloc(n * 4);
    s_ov_t d = {.device = 1}, f = {.device = 0};
    s_overlap_run(&d, wd);
    CHECK_EQ(d.thread_wrote, 0); /* the thread never wrote the forward's weights */
    CHECK_EQ(d.take_missed, 0);  /* each take had landed when it returned */
    CHECK_EQ(d.pulls, STEPS + 1);
    CHECK_EQ(d.pushes, STEPS);
    CHECK_EQ(d.wrap.not_entered, 0);
    s_overlap_run(&f, wf);
    CHECK_CLOSE("overlapped, device to device vs frames", wd, wf, n, 0, 0);
    free(wd), free(wf);
}

/* A shard restarted mid-run: the thread's re-HELLO maps the new region
 * (on the device it entered) and the pulls after it go device to device. */
static void test_overlap_restart(void)
{
    srv_small_model(&s_small);
    float *w = dp_malloc(s_small.n_floats * 4);
    s_ov_t d = {.device = 1, .restart_at = 3};
    s_overlap_run(&d, w);
    CHECK(d.gen0 != 0 && d.gen1 != 0 && d.gen1 != d.gen0); /* re-mapped */
    CHECK_EQ(d.pulls_after, STEPS + 1 - 3); /* the pulls posted from step 3 on */
    CHECK_EQ(d.wrap.not_entered, 0);
    CHECK_EQ(d.thread_wrote, 0);
    CHECK_EQ(d.take_missed, 0);
    free(w);
}

/* ---- the route decided on the worker's device --------------------------- */

/* A provider as CUDA's is: its reach asks the calling thread's device
 * (cudaGetDevice), here "selected" only once the device's enter ran on
 * this thread; a thread that never entered is on another device, which
 * has no peer access to the region's. */
static dp_devmem_ops_t s_thread_ops;

static int s_thread_reach(const char *id, int *same, int *peer, char *err)
{
    (void)id, (void)err;
    *same = s_entered;
    *peer = 0;
    return 0;
}

static void s_mark_entered(void *arg)
{
    (void)arg;
    s_entered = 1;
}

typedef struct {
    const dp_devregion_offer_t *f;
    int with_dev;               /* the client's device copies set (enter among them) */
    int mapped;
} s_route_arg_t;

/* dp_ps_devr_welcome on a thread of its own, as the overlapped loop's
 * communication thread re-HELLOs a restarted shard. */
static void *s_welcome_thread(void *arg)
{
    s_route_arg_t *a = arg;
    dp_ps_shard_t sh;
    memset(&sh, 0, sizeof sh);
    sh.hi = a->f->n;
    snprintf(sh.endpoint, sizeof sh.endpoint, "test");
    dp_ps_device_t dev = {.enter = s_mark_entered};
    dp_ps_client_t c;
    memset(&c, 0, sizeof c);
    c.sh = &sh;
    c.n = 1;
    c.devmem = &s_thread_ops;
    c.dev = a->with_dev ? &dev : NULL;
    Downpour__DevRegionOffer m = DOWNPOUR__DEV_REGION_OFFER__INIT;
    m.generation = a->f->generation;
    m.n = a->f->n;
    m.ring = (uint32_t)a->f->ring;
    m.workers = (uint32_t)a->f->workers;
    m.slot = a->f->slot;
    m.ctl = (char *)a->f->ctl;
    m.wctl = (char *)a->f->wctl;
    m.weights = (ProtobufCBinaryData){sizeof a->f->weights.b, (uint8_t *)a->f->weights.b};
    m.grad = (ProtobufCBinaryData){sizeof a->f->grad.b, (uint8_t *)a->f->grad.b};
    m.event = (ProtobufCBinaryData){sizeof a->f->event.b, (uint8_t *)a->f->event.b};
    m.device = (char *)a->f->device;
    Downpour__Welcome w = DOWNPOUR__WELCOME__INIT;
    w.devregion = &m;
    dp_ps_devr_welcome(&c, 0, &w);
    a->mapped = sh.devr && sh.devr_w.ctl != NULL;
    dp_ps_devr_close(&sh);
    return NULL;
}

static void test_route_on_thread(void)
{
    char err[DP_ERR_LEN] = "";
    dp_devregion_shard_t r;
    dp_devregion_offer_t f;
    s_thread_ops = dp_devmem_standin;
    s_thread_ops.reach = s_thread_reach;
    unsetenv("DP_TEST_DEVMEM"); /* the client's own provider: s_thread_ops */
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 2, 1, err), 0);
    CHECK_EQ(dp_devregion_offer(&r, 0, &f, err), 0);
    for (int with_dev = 1; with_dev >= 0; with_dev--) {
        s_route_arg_t a = {.f = &f, .with_dev = with_dev, .mapped = -1};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, s_welcome_thread, &a), 0);
        pthread_join(th, NULL);
        /* entered: its own device, mapped; never entered (no device copies
         * to enter by): "another device", declined for shared memory */
        CHECK_EQ(a.mapped, with_dev);
    }
    dp_devregion_release_last(&r);
}

DP_TESTS(T(test_route), T(test_welcome_routes), T(test_unpin_after_copy), T(test_device_same_as_frames),
         T(test_device_push_refused), T(test_overlap_device), T(test_overlap_restart),
         T(test_route_on_thread))
