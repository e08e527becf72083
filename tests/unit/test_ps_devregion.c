/* test_ps_devregion: the device region (proto/devregion.h) through the real
 * handshake, over real sockets, on the CPU stand-in (the test hook
 * DP_TEST_DEVMEM=standin, set here for the server and the clients alike):
 * a run through the region is bit for bit the run over frames and goes
 * through the region (the ring's versions, the slot's pushes taken); a
 * restarted shard hands out a new generation and the worker re-maps; a
 * worker killed mid-write, or between its count and its PUSH, leaves
 * nothing applied and its successor pushes through the region; a peer that
 * lies over the socket (a push claiming a region none granted, a push with
 * no completed write, a count that jumps, shm and region at once) is refused
 * with one line and the model does not move; a ring on a device shard's
 * device takes its versions from the live device weights. Servers run in a thread of
 * this program (tests/ps_harness.h), except in the kill case, where the
 * server and the killed worker are child processes. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/devregion.h"
#include "kernels/optim_dev.h"
#include "proto/wire.h"
#include "server/loop/ps_devregion.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"
#include "worker/client/ps_exchange.h"

#define TMO 5.0
#define STEPS 6

static dp_model_t s_small;

static void s_hook(int on)
{
    if (on) setenv("DP_TEST_DEVMEM", "standin", 1);
    else unsetenv("DP_TEST_DEVMEM");
}

/* A gradient that depends on the weights it was computed on, so a pull
 * of the wrong version shows in the end weights. */
static void s_grad_of(const float *p, float *g, size_t n, int step)
{
    for (size_t i = 0; i < n; i++) g[i] = 0.5f * p[i] + 0.01f * (float)((i * 7 + (size_t)step) % 13);
}

/* STEPS pulls and pushes by one worker; the last pull into w. */
static void s_run(dp_ps_client_t *c, float *w)
{
    size_t n = s_small.n_floats;
    float *g = dp_malloc(n * 4);
    char err[DP_ERR_LEN] = "";
    for (int t = 1; t <= STEPS; t++) {
        CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
        s_grad_of(w, g, n, t);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP((uint64_t)t, g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
    }
    CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
    free(g);
}

/* One run on a fresh server (seed 7): through the region (hook on) or
 * over frames; how many pushes the region took, and its newest version. */
static void s_one_run(int region, float *w, uint64_t *taken, uint64_t *newest)
{
    s_hook(region);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_opts_t o = {.timeout_s = TMO,
                             .transport = region ? DP_PS_TRANSPORT_AUTO : DP_PS_TRANSPORT_ZMQ};
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &o, NULL, err), 0);
    *taken = *newest = 0;
    if (c) {
        CHECK_EQ(dp_ps_client_devregion_shards(c), region);
        s_run(c, w);
        const dp_devregion_worker_t *dw = &c->sh[0].devr_w;
        if (dw->ctl) {
            *taken = atomic_load(&dw->ctl->taken[0]);
            uint64_t ne = atomic_load(&dw->ctl->newest);
            *newest = ne ? atomic_load(&dw->ctl->entry[ne - 1].version) : 0;
        }
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
    s_hook(0);
}

/* The same run through the region and over frames: the same weights, bit
 * for bit, and the region took every push and published the last
 * version. */
static void test_same_as_frames(void)
{
    srv_small_model(&s_small);
    size_t n = s_small.n_floats;
    float *wr = dp_malloc(n * 4), *wf = dp_malloc(n * 4);
    uint64_t taken, newest, t2, n2;
    s_one_run(1, wr, &taken, &newest);
    s_one_run(0, wf, &t2, &n2);
    CHECK_CLOSE("region vs frames", wr, wf, n, 0, 0);
    CHECK_EQ(taken, STEPS);  /* every push through the slot */
    CHECK_EQ(newest, STEPS); /* every pull through the ring, the last of version STEPS */
    free(wr), free(wf);
}

/* A shard restarted on the same endpoint: a new region of a new
 * generation, which the worker maps at its new HELLO; its next push goes
 * through the new slot and steps the new shard's weights. */
static void test_restart_remaps(void)
{
    srv_small_model(&s_small);
    s_hook(1);
    size_t n = s_small.n_floats;
    float *p0 = dp_malloc(n * 4), *g = dp_malloc(n * 4), *p = dp_malloc(n * 4);
    float *want = dp_malloc(n * 4);
    char err[DP_ERR_LEN] = "";
    srv_t s, s2;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    int up = 0;
    if (c) {
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_pull(c, p0, err), 0);
        srv_fill(g, n, 3);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(1, g, 1, 8), &r, err), 0);
        uint64_t gen = c->sh[0].devr_w.generation;
        CHECK(gen != 0);
        CHECK_EQ(srv_stop(&s), 0);
        srv_init(&s2, DP_MODE_ASYNC, 1); /* seed 7: p0 again */
        snprintf(s2.cfg.bind, sizeof s2.cfg.bind, "%s", s.endpoint);
        up = srv_start(&s2) == 0;
        CHECK(up);
        srv_fill(g, n, 4);
        for (size_t i = 0; i < n; i++) want[i] = p0[i] - 0.1f * g[i];
        if (up) CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(1, g, 1, 8), &r, err), 0);
        CHECK_EQ(dp_ps_client_devregion_shards(c), 1);
        CHECK(c->sh[0].devr_w.generation != 0 && c->sh[0].devr_w.generation != gen);
        CHECK(c->sh[0].devr_w.ctl && atomic_load(&c->sh[0].devr_w.ctl->taken[0]) == 1);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_CLOSE("the restarted shard stepped through its new region", p, want, n, 0, 0);
    }
    dp_ps_client_destroy(&c);
    if (up) CHECK_EQ(srv_stop(&s2), 0);
    else srv_stop(&s);
    free(p0), free(g), free(p), free(want);
    s_hook(0);
}

/* ---- a worker killed mid-step ------------------------------------------ */

static void s_ready_to_pipe(const char *ep, void *arg)
{
    int fd = *(int *)arg;
    if (write(fd, ep, strlen(ep) + 1) < 0) _exit(3);
}

/* A server process (a child) of one worker with the hook on; its endpoint
 * into ep. */
static pid_t s_server_child(char *ep, size_t ep_n)
{
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    fflush(NULL);
    pid_t kid = fork();
    if (kid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        close(pfd[0]);
        srv_t s;
        srv_init(&s, DP_MODE_ASYNC, 1);
        s.cfg.on_ready = s_ready_to_pipe;
        s.cfg.on_ready_arg = &pfd[1];
        char err[DP_ERR_LEN];
        _exit(dp_ps_run(&s.cfg, &s.stop, err) == 0 ? 0 : 1);
    }
    close(pfd[1]);
    struct pollfd pw = {pfd[0], POLLIN, 0};
    int ready = poll(&pw, 1, 10000) == 1 && read(pfd[0], ep, ep_n - 1) > 0;
    close(pfd[0]);
    return ready ? kid : -1;
}

/* Worker 0 in a child: pulls through the region, then writes garbage into
 * its slot (half of it, or all of it and its count: a push never sent as
 * a PUSH) and dies by SIGKILL. 1 when it died so, having mapped the
 * region. */
static int s_killed_worker(const char *ep, int counted)
{
    fflush(NULL);
    pid_t kid = fork();
    if (kid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char err[DP_ERR_LEN];
        dp_ps_client_t *c = NULL;
        float *p = dp_malloc(s_small.n_floats * 4);
        if (dp_ps_client_new(&c, ep, &s_small, 0, PS_OPTS(TMO), NULL, err) != 0 ||
            dp_ps_client_devregion_shards(c) != 1 || dp_ps_client_pull(c, p, err) != 0)
            _exit(1);
        dp_devregion_worker_t *w = &c->sh[0].devr_w;
        float *slot = dp_devregion_slot(w);
        if (!slot) _exit(2);
        size_t n = counted ? w->n : w->n / 2;
        for (size_t i = 0; i < n; i++) slot[i] = 1000.0f + (float)i;
        if (counted && dp_devregion_push(w, NULL, err) != 0) _exit(3);
        raise(SIGKILL);
        _exit(4);
    }
    int st = 0;
    if (waitpid(kid, &st, 0) != kid) return 0;
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
}

/* Killed mid-write, and killed between its count and its PUSH: the model
 * does not move; the worker that takes its place (the same id, a new
 * HELLO) pushes through the region and its push alone is applied. */
static void test_killed_worker_applies_nothing(void)
{
    srv_small_model(&s_small);
    s_hook(1);
    char ep[256] = "";
    pid_t srv = s_server_child(ep, sizeof ep);
    CHECK(srv > 0);
    size_t n = s_small.n_floats;
    float *p0 = dp_malloc(n * 4), *p = dp_malloc(n * 4), *g = dp_malloc(n * 4);
    float *want = dp_malloc(n * 4);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL, *cf = NULL;
    dp_ps_client_opts_t frames = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    for (int counted = 0; srv > 0 && counted <= 1; counted++) {
        CHECK(s_killed_worker(ep, counted));
        /* a reader over frames as worker 0 (the dead one's id is free) */
        int rc;
        SRV_REJOIN(rc, err, dp_ps_client_new(&cf, ep, &s_small, 0, &frames, NULL, err));
        CHECK_EQ(rc, 0);
        if (cf) {
            CHECK_EQ(srv_weights(cf, p0), (uint64_t)counted);
            dp_ps_client_destroy(&cf);
        }
        SRV_REJOIN(rc, err, dp_ps_client_new(&c, ep, &s_small, 0, PS_OPTS(TMO), NULL, err));
        CHECK_EQ(rc, 0);
        if (!c) break;
        CHECK_EQ(dp_ps_client_devregion_shards(c), 1);
        srv_fill(g, n, 10 + (uint64_t)counted);
        for (size_t i = 0; i < n; i++) want[i] = p0[i] - 0.1f * g[i];
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0); /* through the ring */
        CHECK_CLOSE("the pull through the ring", p, p0, n, 0, 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        const dp_devregion_worker_t *w = &c->sh[0].devr_w;
        /* through the slot: taken, and the count one past what the dead left */
        CHECK(w->ctl && atomic_load(&w->ctl->taken[0]) == atomic_load(&w->wctl->pushed));
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_CLOSE(counted ? "a counted push never sent is not applied"
                            : "a half-written slot is not applied", p, want, n, 0, 0);
        CHECK_EQ(dp_ps_client_version(c), (uint64_t)counted + 1);
        dp_ps_client_destroy(&c);
    }
    if (srv > 0) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
    }
    free(p0), free(p), free(g), free(want);
    s_hook(0);
}

/* ---- whose client asks for the region ------------------------------------ */

/* The client's provider is opts.devmem (a GPU worker's CUDA IPC; the
 * stand-in here), the server (a child) offering the stand-in under the
 * hook while this process has none: a client given one asks, maps and
 * pushes through the slot; one without (a CPU worker) never asks and goes
 * through shared memory; DP_TEST_DEVMEM=off keeps even a given one from
 * asking. */
static void test_client_provider(void)
{
    srv_small_model(&s_small);
    s_hook(1);
    char ep[256] = "";
    pid_t srv = s_server_child(ep, sizeof ep);
    s_hook(0);
    CHECK(srv > 0);
    size_t n = s_small.n_floats;
    float *p = dp_malloc(n * 4), *g = dp_malloc(n * 4);
    char err[DP_ERR_LEN] = "";
    for (int k = 0; srv > 0 && k < 3; k++) { /* given one, none, given one but off */
        if (k == 2) setenv("DP_TEST_DEVMEM", "off", 1);
        dp_ps_client_opts_t o = {.timeout_s = TMO, .devmem = k == 1 ? NULL : &dp_devmem_standin};
        dp_ps_client_t *c = NULL;
        int rc;
        SRV_REJOIN(rc, err, dp_ps_client_new(&c, ep, &s_small, 0, &o, NULL, err));
        CHECK_EQ(rc, 0);
        if (!c) break;
        CHECK_EQ(dp_ps_client_devregion_shards(c), k == 0 ? 1 : 0);
        CHECK_EQ(dp_ps_client_shm_shards(c), 1);
        srv_fill(g, n, 3);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        const dp_devregion_worker_t *w = &c->sh[0].devr_w;
        if (k == 0) /* through the slot: counted and taken */
            CHECK(w->ctl && atomic_load(&w->wctl->pushed) == 1 &&
                  atomic_load(&w->ctl->taken[0]) == 1);
        else
            CHECK(w->ctl == NULL);
        dp_ps_client_destroy(&c);
    }
    unsetenv("DP_TEST_DEVMEM");
    if (srv > 0) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
    }
    free(p), free(g);
}

/* ---- a peer that lies over the socket ---------------------------------- */

/* HELLO as worker wid, with the region asked or not; the reply (the
 * caller's), or NULL. */
static Downpour__Envelope *s_hello(void *sock, int wid, int region)
{
    Downpour__Envelope env, *rep = NULL;
    Downpour__Hello h;
    raw_hello_init(&env, &h, &s_small, wid, 1);
    h.shm = region;
    h.devregion = region;
    if (raw_request(sock, &env, &rep) != DOWNPOUR__MSG_TYPE__WELCOME) dp_wire_destroy(&rep);
    return rep;
}

/* A whole PUSH of step st saying its gradient is in the region (and in
 * shared memory too, with shm); the reply's type, its text in why. */
static int s_push_region(void *sock, int wid, uint64_t st, int shm, char *why, size_t why_n)
{
    Downpour__Envelope env, *rep;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, 10 + st, wid, s_small.fingerprint);
    Downpour__Push pu = DOWNPOUR__PUSH__INIT;
    pu.step = st;
    pu.batch = 1;
    env.push = &pu;
    env.devregion = 1;
    env.shm = shm;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    dp_wire_desc_fill(&d, shape, "params", NULL, s_small.n_floats, 0, 1, 0);
    dp_wire_desc_no_checksum(&d);
    env.n_tensors = 1;
    env.tensors = dv;
    int type = raw_request(sock, &env, &rep);
    snprintf(why, why_n, "%s", rep && rep->error && rep->error->message ? rep->error->message : "");
    if (rep && rep->ack) snprintf(why, why_n, "ack %d", (int)rep->ack->status);
    dp_wire_destroy(&rep);
    return type;
}

/* The WELCOME's offer mapped as the peer's own (what a hostile worker of
 * this host could do with it). */
static int s_map(dp_devregion_worker_t *w, const Downpour__DevRegionOffer *m, char *err)
{
    dp_devregion_offer_t o;
    memset(&o, 0, sizeof o);
    o.generation = m->generation;
    o.n = m->n;
    o.ring = m->ring;
    o.workers = m->workers;
    o.slot = m->slot;
    snprintf(o.ctl, sizeof o.ctl, "%s", m->ctl);
    snprintf(o.wctl, sizeof o.wctl, "%s", m->wctl);
    memcpy(o.weights.b, m->weights.data, m->weights.len);
    memcpy(o.grad.b, m->grad.data, m->grad.len);
    memcpy(o.event.b, m->event.data, m->event.len);
    return dp_devregion_attach(w, &dp_devmem_standin, &o, err);
}

static void test_lying_peer(void)
{
    srv_small_model(&s_small);
    s_hook(1);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 3);
    CHECK_EQ(srv_start(&s), 0);
    size_t n = s_small.n_floats;
    float *p0 = dp_malloc(n * 4), *p = dp_malloc(n * 4);
    char err[DP_ERR_LEN] = "", why[DP_ERR_LEN + 200];
    dp_ps_client_opts_t frames = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    dp_ps_client_t *cf = NULL;
    CHECK_EQ(dp_ps_client_new(&cf, s.endpoint, &s_small, 1, &frames, NULL, err), 0);
    void *ctx = zmq_ctx_new();
    void *sock = raw_dealer(ctx, s.endpoint, 5000), *sock2 = raw_dealer(ctx, s.endpoint, 5000);
    dp_devregion_worker_t w;
    memset(&w, 0, sizeof w);
    if (cf) {
        CHECK_EQ(srv_weights(cf, p0), 0);
        /* worker 0 granted the region (made then), worker 2 not: its push
         * through the region is refused */
        Downpour__Envelope *wl = s_hello(sock, 0, 1);
        CHECK(wl && wl->welcome->devregion);
        if (wl && wl->welcome->devregion) CHECK_EQ(s_map(&w, wl->welcome->devregion, err), 0);
        dp_wire_destroy(&wl);
        wl = s_hello(sock2, 2, 0);
        CHECK(wl && !wl->welcome->devregion);
        dp_wire_destroy(&wl);
        CHECK_EQ(s_push_region(sock2, 2, 1, 0, why, sizeof why), DOWNPOUR__MSG_TYPE__ERROR);
        CHECK(strstr(why, "has no region here") != NULL);
        /* granted, but nothing counted in the slot */
        CHECK_EQ(s_push_region(sock, 0, 2, 0, why, sizeof why), DOWNPOUR__MSG_TYPE__ERROR);
        CHECK(strstr(why, "holds no completed push") != NULL);
        /* written, then the count bumped by two */
        float *slot = dp_devregion_slot(&w);
        CHECK(slot != NULL);
        if (slot) {
            for (size_t i = 0; i < n; i++) slot[i] = 1.0f;
            CHECK_EQ(dp_devregion_push(&w, NULL, err), 0);
            atomic_fetch_add(&w.wctl->pushed, 1);
            CHECK_EQ(s_push_region(sock, 0, 3, 0, why, sizeof why), DOWNPOUR__MSG_TYPE__ERROR);
            CHECK(strstr(why, "the count jumped") != NULL);
        }
        /* shared memory and the region at once */
        CHECK_EQ(s_push_region(sock, 0, 4, 1, why, sizeof why), DOWNPOUR__MSG_TYPE__ERROR);
        CHECK(strstr(why, "both shared memory and the device region") != NULL);
        /* a grant holds for the HELLO that got it: one without takes it away */
        wl = s_hello(sock, 0, 0);
        CHECK(wl && !wl->welcome->devregion);
        dp_wire_destroy(&wl);
        slot = dp_devregion_slot(&w);
        if (slot) {
            for (size_t i = 0; i < n; i++) slot[i] = 1.0f;
            CHECK_EQ(dp_devregion_push(&w, NULL, err), 0);
        }
        CHECK_EQ(s_push_region(sock, 0, 5, 0, why, sizeof why), DOWNPOUR__MSG_TYPE__ERROR);
        CHECK(strstr(why, "has no region here") != NULL);
        CHECK_EQ(srv_weights(cf, p), 0); /* nothing moved */
        CHECK_CLOSE("the weights after the lies", p, p0, n, 0, 0);
    }
    dp_devregion_detach(&w);
    zmq_close(sock);
    zmq_close(sock2);
    zmq_ctx_term(ctx);
    dp_ps_client_destroy(&cf);
    CHECK_EQ(srv_stop(&s), 0);
    free(p0), free(p);
    s_hook(0);
}

/* The version in the ring entry a worker pins (its whole range into out). */
static uint64_t s_pinned(dp_ps_devr_t *x, float *out, size_t n)
{
    char err[DP_ERR_LEN] = "";
    Downpour__DevRegionOffer m;
    dp_devregion_worker_t w;
    memset(&w, 0, sizeof w);
    uint64_t v = 0;
    CHECK_EQ(dp_ps_devr_grant(x, 0, &m, err), 0);
    CHECK_EQ(s_map(&w, &m, err), 0);
    const float *e = dp_devregion_pin(&w, &v, err);
    CHECK(e != NULL);
    if (e) memcpy(out, e, n * sizeof(float));
    dp_devregion_unpin(&w);
    dp_devregion_detach(&w);
    return v;
}

/* A ring on the shard's device (on_device: the provider's memory is the
 * device's, as CUDA's is with --device cuda:N): a version goes in from the
 * live device weights (d_w, the "cpu" device's own memory here, marked so
 * that the source shows), not from the host snapshot; a snapshot that is
 * no longer the live version goes in from the host; a ring not on the
 * device always from the host (the stand-in's path). */
static void test_publish_from_device(void)
{
    char err[DP_ERR_LEN] = "";
    dp_optim_conf_t oc;
    dp_optim_conf_default(&oc);
    srv_small_model(&s_small);
    dp_shard_t sh;
    dp_optim_dev_t *dev = NULL;
    CHECK_EQ(dp_shard_init(&sh, &s_small, 0, 1, 7, &oc, err), 0);
    CHECK_EQ(dp_optim_dev_new(&dev, "cpu", NULL, err), 0);
    CHECK_EQ(dp_shard_set_device(&sh, dev, err), 0);
    size_t n = sh.n;
    float *got = dp_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) sh.d_w[i] = 1000.0f + (float)i; /* only on the device */
    for (int on_device = 1; on_device >= 0; on_device--) {
        dp_ps_devr_t *x = NULL;
        CHECK_EQ(dp_ps_devr_new(&x, &sh, 1, &dp_devmem_standin, on_device, err), 0);
        if (!x) break;
        dp_snap_t *snap = dp_shard_snapshot(&sh);
        CHECK_EQ(dp_ps_devr_publish(x, snap), 1);
        CHECK_EQ(s_pinned(x, got, n), sh.version);
        const float *want = on_device ? sh.d_w : snap->data;
        CHECK_EQ(memcmp(got, want, n * sizeof(float)), 0);
        CHECK(memcmp(got, on_device ? snap->data : sh.d_w, n * sizeof(float)) != 0);
        dp_snap_unref(NULL, snap);
        if (on_device) { /* the live version moved on: the older snapshot from the host */
            dp_snap_t old;
            memset(&old, 0, sizeof old);
            old.data = sh.snap->data;
            old.n = sh.snap->n;
            old.version = sh.version + 1;
            CHECK_EQ(dp_ps_devr_publish(x, &old), 1);
            CHECK_EQ(s_pinned(x, got, n), sh.version + 1);
            CHECK_EQ(memcmp(got, old.data, n * sizeof(float)), 0);
        }
        dp_ps_devr_destroy(&x);
    }
    free(got);
    dp_shard_fini(&sh);
}

DP_TESTS(T(test_same_as_frames), T(test_restart_remaps), T(test_killed_worker_applies_nothing),
         T(test_client_provider), T(test_lying_peer), T(test_publish_from_device))
