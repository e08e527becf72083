/* test_devregion: the device region protocol (proto/devregion.h) on the CPU
 * stand-in (proto/devmem_standin.c), shard and worker in two real
 * processes: the worker is forked before the region exists and maps only
 * what the offer it is sent names. From the worker's side: a version read in
 * place and a gradient pushed through its slot; a worker that lies (its
 * count jumps, the wrong size, NaN) has nothing applied; one that writes the
 * weights or the control page faults (sealed, mapped read-only); one killed
 * mid-write leaves nothing taken; a restarted shard's new generation is
 * re-mapped and the old region never read again; a pinned entry is never
 * overwritten; nothing is freed while a live worker maps it. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/devregion.h"
#include "tests/test.h"

#define NF 1000
#define S_FAULTED 77 /* a worker's exit status: its write faulted */

/* ---- a worker process, driven through two pipes ---- */

typedef struct {
    pid_t pid;
    int to, from; /* our ends: commands to it, answers from it */
} s_kid_t;

typedef int (*s_kid_fn)(int rd, int wr);

static void s_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        c += k;
        n -= (size_t)k;
    }
}

static int s_recv(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static s_kid_t s_spawn(s_kid_fn fn)
{
    int down[2], up[2];
    s_kid_t k = {-1, -1, -1};
    if (pipe(down) != 0 || pipe(up) != 0) return k;
    signal(SIGPIPE, SIG_IGN); /* a worker that died early is a failed check, not our end */
    fflush(NULL);
    k.pid = fork();
    if (k.pid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(fn(down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    k.to = down[1];
    k.from = up[0];
    return k;
}

/* Wait for the worker; its exit status, or 128 + the signal that ended it. */
static int s_reap(s_kid_t *k)
{
    int st = 0;
    close(k->to);
    close(k->from);
    if (waitpid(k->pid, &st, 0) != k->pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The worker's side: an offer, then attach. */
static int s_kid_attach(int rd, dp_devregion_worker_t *w)
{
    dp_devregion_offer_t o;
    char err[DP_ERR_LEN] = "";
    if (s_recv(rd, &o, sizeof o) != 0) return -1;
    if (dp_devregion_attach(w, &dp_devmem_standin, &o, err) != 0) {
        fprintf(stderr, "  worker: %s\n", err);
        return -1;
    }
    return 0;
}

static char s_cmd(int rd)
{
    char c = 0;
    return s_recv(rd, &c, 1) == 0 ? c : 0;
}

/* ---- the shard's side ---- */

typedef struct {
    int calls;
    float got[NF];
} s_model_t;

static int s_apply(void *ctx, const float *g, size_t n, char *err)
{
    (void)err;
    s_model_t *m = ctx;
    m->calls++;
    memcpy(m->got, g, n * sizeof *g);
    return 0;
}

static int s_publish(dp_devregion_shard_t *r, uint64_t v, float value)
{
    float *e = dp_devregion_publish_begin(r, v);
    if (!e) return -1;
    for (int i = 0; i < NF; i++) e[i] = value + (float)i;
    dp_devregion_publish_end(r);
    return 0;
}

static int s_offer(dp_devregion_shard_t *r, int k, s_kid_t *kid)
{
    dp_devregion_offer_t o;
    char err[DP_ERR_LEN] = "";
    if (dp_devregion_offer(r, k, &o, err) != 0) return -1;
    s_send(kid->to, &o, sizeof o);
    return 0;
}

static int s_all(const float *p, float value)
{
    for (int i = 0; i < NF; i++)
        if (p[i] != value) return 0;
    return 1;
}

/* ---- a version read in place, a gradient pushed through the slot ---- */

static int s_kid_roundtrip(int rd, int wr)
{
    dp_devregion_worker_t w;
    char err[DP_ERR_LEN] = "";
    if (s_kid_attach(rd, &w) != 0) return 1;
    uint64_t v = 0;
    const float *x = dp_devregion_pin(&w, &v, err);
    float *g = dp_devregion_slot(&w);
    if (!x || !g) return 2;
    for (int i = 0; i < NF; i++) g[i] = 2 * x[i]; /* a backward reading the weights in place */
    dp_devregion_unpin(&w);
    if (dp_devregion_push(&w, NULL, err) != 0) return 3;
    if (dp_devregion_push(&w, NULL, err) == 0 || dp_devregion_slot(&w)) return 4; /* not taken yet */
    s_send(wr, &v, sizeof v);
    if (s_cmd(rd) != 'q' || !dp_devregion_slot_free(&w)) return 5;
    dp_devregion_detach(&w);
    return 0;
}

static void test_roundtrip(void)
{
    s_kid_t kid = s_spawn(s_kid_roundtrip);
    dp_devregion_shard_t r;
    char err[DP_ERR_LEN] = "";
    static s_model_t m;
    memset(&m, 0, sizeof m);
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 3, 2, err), 0);
    CHECK_EQ(s_publish(&r, 7, 0.5f), 0);
    CHECK_EQ(s_offer(&r, 1, &kid), 0);
    uint64_t v = 0;
    CHECK_EQ(s_recv(kid.from, &v, sizeof v), 0);
    CHECK_EQ(v, 7);
    static float scratch[NF];
    CHECK_EQ(dp_devregion_take(&r, 0, scratch, s_apply, &m, err), 0); /* slot 0: nobody */
    CHECK_EQ(dp_devregion_take(&r, 1, scratch, s_apply, &m, err), 1);
    CHECK_EQ(dp_devregion_take(&r, 1, scratch, s_apply, &m, err), 0); /* taken once */
    CHECK_EQ(m.calls, 1);
    int ok = 1;
    for (int i = 0; i < NF; i++) ok &= m.got[i] == 2 * (0.5f + (float)i);
    CHECK(ok);
    s_send(kid.to, "q", 1);
    CHECK_EQ(s_reap(&kid), 0);
    CHECK_EQ(dp_devregion_release(&r), 0);
}

/* ---- a worker that lies through its slot and its control page ---- */

static int s_kid_liar(int rd, int wr)
{
    dp_devregion_worker_t w;
    char err[DP_ERR_LEN] = "";
    if (s_kid_attach(rd, &w) != 0) return 1;
    dp_devregion_wctl_t *c = w.wctl;
    char cmd;
    while ((cmd = s_cmd(rd)) != 0 && cmd != 'q') {
        float *g = w.grad.ptr; /* whether or not the shard took the last */
        for (int i = 0; i < NF; i++) g[i] = 1.0f;
        if (cmd == 'j') { /* the count jumps by 5, all else as a push */
            atomic_store(&c->floats, NF);
            atomic_fetch_add(&c->events, 5);
            atomic_fetch_add(&c->pushed, 5);
        } else if (cmd == 'n') { /* half the floats */
            atomic_store(&c->floats, NF / 2);
            atomic_fetch_add(&c->events, 1);
            atomic_fetch_add(&c->pushed, 1);
        } else if (cmd == 'N') {
            g[NF - 1] = NAN;
            if (dp_devregion_push(&w, NULL, err) != 0) return 2;
        } else if (cmd == 'e') { /* a count its event never reached */
            atomic_fetch_add(&c->pushed, 1);
        } else if (dp_devregion_push(&w, NULL, err) != 0) {
            return 3;
        }
        s_send(wr, &cmd, 1);
    }
    dp_devregion_detach(&w);
    return 0;
}

static void test_lying_worker(void)
{
    s_kid_t kid = s_spawn(s_kid_liar);
    dp_devregion_shard_t r;
    char err[DP_ERR_LEN] = "", ack = 0;
    static s_model_t m;
    static float scratch[NF];
    memset(&m, 0, sizeof m);
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 2, 1, err), 0);
    CHECK_EQ(s_publish(&r, 1, 0), 0);
    CHECK_EQ(s_offer(&r, 0, &kid), 0);
    const char *lies = "jnN", *why[] = {"jumped", "floats", "not finite"};
    for (int i = 0; i < 3; i++) {
        s_send(kid.to, &lies[i], 1);
        CHECK_EQ(s_recv(kid.from, &ack, 1), 0);
        err[0] = 0;
        CHECK_EQ(dp_devregion_take(&r, 0, scratch, s_apply, &m, err), -1);
        CHECK(strstr(err, why[i]) != NULL);
        fprintf(stderr, "  refused as it should: %s\n", err);
    }
    CHECK_EQ(m.calls, 0); /* nothing applied */
    CHECK_EQ(r.refused, 3);
    s_send(kid.to, "h", 1); /* then an honest push is taken whole */
    CHECK_EQ(s_recv(kid.from, &ack, 1), 0);
    CHECK_EQ(dp_devregion_take(&r, 0, scratch, s_apply, &m, err), 1);
    CHECK_EQ(m.calls, 1);
    CHECK(s_all(m.got, 1.0f));
    s_send(kid.to, "e", 1); /* counted, its writes not done: waited for */
    CHECK_EQ(s_recv(kid.from, &ack, 1), 0);
    CHECK_EQ(dp_devregion_take(&r, 0, scratch, s_apply, &m, err), 0);
    CHECK_EQ(m.calls, 1);
    s_send(kid.to, "q", 1);
    CHECK_EQ(s_reap(&kid), 0);
    CHECK_EQ(dp_devregion_release(&r), 0);
}

/* ---- a worker that writes the weights or the control page ---- */

static void s_faulted(int sig)
{
    (void)sig;
    _exit(S_FAULTED);
}

/* Tries to make the target writable (mprotect; a second mapping through
 * its name, opened O_RDWR), then writes through its mapping: the write
 * must fault. Exit 10 + bits: a way to write went through. */
static int s_kid_scribbler(int rd, int wr)
{
    /* our handler, not a sanitizer's report: the fault is the verdict */
    struct sigaction sa = {.sa_handler = s_faulted};
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    dp_devregion_worker_t w;
    if (s_kid_attach(rd, &w) != 0) return 1;
    char target = s_cmd(rd);
    volatile float *p = target == 'w' ? (float *)w.weights.ptr : (float *)(uintptr_t)w.ctl;
    const char *name = target == 'w' ? ((dp_shm_t *)w.weights.impl)->name : w.page.name;
    int bits = 0;
    void *page = (void *)((uintptr_t)p & ~(uintptr_t)4095);
    if (mprotect(page, 4096, PROT_READ | PROT_WRITE) == 0) bits |= 1;
    int fd = open(name, O_RDWR);
    if (fd >= 0) {
        void *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) bits |= 2;
        close(fd);
    }
    if (bits) return 10 + bits;
    s_send(wr, "r", 1);
    p[0] = NAN; /* the newest version's first weight; the control page's magic */
    p[1] = NAN;
    return 0; /* the write went through */
}

static void test_weights_read_only(void)
{
    const char targets[] = {'w', 'c'};
    for (int t = 0; t < 2; t++) {
        s_kid_t kid = s_spawn(s_kid_scribbler);
        dp_devregion_shard_t r;
        char err[DP_ERR_LEN] = "", ready = 0;
        CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 2, 1, err), 0);
        CHECK_EQ(s_publish(&r, 1, 0), 0);
        CHECK_EQ(s_offer(&r, 0, &kid), 0);
        s_send(kid.to, &targets[t], 1);
        CHECK_EQ(s_recv(kid.from, &ready, 1), 0);
        int st = s_reap(&kid);
        CHECK_EQ(st, S_FAULTED);
        if (st != S_FAULTED) fprintf(stderr, "  target '%c'\n", targets[t]);
        const float *e = r.weights.ptr;
        CHECK(e[0] == 0.0f && e[1] == 1.0f);
        CHECK_EQ(r.ctl->magic, DP_DEVREGION_MAGIC);
        CHECK_EQ(r.ctl->n, NF);
        CHECK_EQ(dp_devregion_release(&r), 0);
    }
}

/* ---- a worker killed mid-write ---- */

static int s_kid_half(int rd, int wr)
{
    dp_devregion_worker_t w;
    if (s_kid_attach(rd, &w) != 0) return 1;
    float *g = dp_devregion_slot(&w);
    if (!g) return 2;
    for (int i = 0; i < NF / 2; i++) g[i] = 7.0f;
    s_send(wr, "h", 1);
    for (;;) pause(); /* killed here, half its gradient written */
}

static int s_kid_whole(int rd, int wr)
{
    dp_devregion_worker_t w;
    char err[DP_ERR_LEN] = "";
    if (s_kid_attach(rd, &w) != 0) return 1;
    float *g = dp_devregion_slot(&w);
    if (!g) return 2;
    for (int i = 0; i < NF; i++) g[i] = 2.0f;
    if (dp_devregion_push(&w, NULL, err) != 0) return 3;
    s_send(wr, "p", 1);
    if (s_cmd(rd) != 'q') return 4;
    dp_devregion_detach(&w);
    return 0;
}

static void test_killed_mid_write(void)
{
    s_kid_t half = s_spawn(s_kid_half), whole = s_spawn(s_kid_whole);
    dp_devregion_shard_t r;
    char err[DP_ERR_LEN] = "", ack = 0;
    static s_model_t m;
    static float scratch[NF];
    memset(&m, 0, sizeof m);
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 2, 1, err), 0);
    CHECK_EQ(s_publish(&r, 1, 0), 0);
    CHECK_EQ(s_offer(&r, 0, &half), 0);
    CHECK_EQ(s_recv(half.from, &ack, 1), 0);
    kill(half.pid, SIGKILL);
    CHECK_EQ(s_reap(&half), 128 + SIGKILL);
    CHECK_EQ(dp_devregion_take(&r, 0, scratch, s_apply, &m, err), 0); /* nothing to take */
    CHECK_EQ(m.calls, 0);
    /* its successor in the slot pushes a whole gradient: that one is taken */
    CHECK_EQ(s_offer(&r, 0, &whole), 0);
    CHECK_EQ(s_recv(whole.from, &ack, 1), 0);
    CHECK_EQ(dp_devregion_take(&r, 0, scratch, s_apply, &m, err), 1);
    CHECK_EQ(m.calls, 1);
    CHECK(s_all(m.got, 2.0f));
    s_send(whole.to, "q", 1);
    CHECK_EQ(s_reap(&whole), 0);
    CHECK_EQ(dp_devregion_release(&r), 0);
}

/* ---- a shard restart: a new generation, re-mapped ---- */

static int s_kid_restart(int rd, int wr)
{
    dp_devregion_worker_t w;
    char err[DP_ERR_LEN] = "";
    if (s_kid_attach(rd, &w) != 0) return 1;
    uint64_t v = 0;
    const float *x = dp_devregion_pin(&w, &v, err);
    float first = x ? x[1] : -1;
    dp_devregion_unpin(&w);
    s_send(wr, &first, sizeof first);
    if (s_cmd(rd) != 'p') return 2;
    /* the shard has restarted: the old region must not be read */
    x = dp_devregion_pin(&w, &v, err);
    char refused = !x && strstr(err, "retired") != NULL;
    if (x) fprintf(stderr, "  worker: read the old region (%g)\n", x[1]);
    s_send(wr, &refused, 1);
    dp_devregion_offer_t o;
    for (int i = 0; i < 2; i++) { /* a stale generation, then the new offer */
        if (s_recv(rd, &o, sizeof o) != 0) return 3;
        int rc = dp_devregion_remap(&w, &o, err);
        if (rc < 0) fprintf(stderr, "  worker: %s\n", err);
        x = rc == 1 ? dp_devregion_pin(&w, &v, err) : NULL;
        first = x ? x[1] : -1;
        s_send(wr, &first, sizeof first);
    }
    if (s_cmd(rd) != 'q') return 4;
    dp_devregion_detach(&w);
    return 0;
}

static void test_restart_generation(void)
{
    s_kid_t kid = s_spawn(s_kid_restart);
    dp_devregion_shard_t a, b;
    char err[DP_ERR_LEN] = "", refused = 0;
    float first = 0;
    CHECK_EQ(dp_devregion_create(&a, &dp_devmem_standin, NF, 2, 1, err), 0);
    CHECK_EQ(s_publish(&a, 1, 10.0f), 0);
    CHECK_EQ(s_offer(&a, 0, &kid), 0);
    CHECK_EQ(s_recv(kid.from, &first, sizeof first), 0);
    CHECK_EQ(first, 11);
    /* the shard goes: what its worker maps stays until it unmaps */
    CHECK_EQ(dp_devregion_release(&a), 1);
    CHECK(a.weights.ptr != NULL && a.ctl != NULL);
    CHECK_EQ(dp_devregion_create(&b, &dp_devmem_standin, NF, 2, 1, err), 0);
    CHECK(b.generation != a.generation);
    CHECK_EQ(s_publish(&b, 1, 20.0f), 0);
    s_send(kid.to, "p", 1);
    CHECK_EQ(s_recv(kid.from, &refused, 1), 0);
    CHECK_EQ(refused, 1);
    dp_devregion_offer_t o;
    CHECK_EQ(dp_devregion_offer(&b, 0, &o, err), 0);
    o.generation ^= 1; /* an offer that is not the region's */
    s_send(kid.to, &o, sizeof o);
    CHECK_EQ(s_recv(kid.from, &first, sizeof first), 0);
    CHECK_EQ(first, -1);
    o.generation ^= 1;
    s_send(kid.to, &o, sizeof o);
    CHECK_EQ(s_recv(kid.from, &first, sizeof first), 0);
    CHECK_EQ(first, 21);
    CHECK_EQ(dp_devregion_release(&a), 0); /* re-mapped: the old one is free */
    s_send(kid.to, "q", 1);
    CHECK_EQ(s_reap(&kid), 0);
    CHECK_EQ(dp_devregion_release(&b), 0);
}

/* ---- the ring under a reader that holds a version ---- */

static int s_kid_holder(int rd, int wr)
{
    dp_devregion_worker_t w;
    char err[DP_ERR_LEN] = "";
    if (s_kid_attach(rd, &w) != 0) return 1;
    uint64_t v = 0;
    const float *x = dp_devregion_pin(&w, &v, err);
    if (!x) return 2;
    s_send(wr, &v, sizeof v);
    if (s_cmd(rd) != 'c') return 3;
    char same = 1; /* still version 1 throughout, read in place */
    for (int i = 0; i < NF; i++) same &= x[i] == 1.0f + (float)i;
    s_send(wr, &same, 1);
    if (s_cmd(rd) != 'u') return 4;
    dp_devregion_unpin(&w);
    s_send(wr, "u", 1);
    if (s_cmd(rd) != 'q') return 5;
    dp_devregion_detach(&w);
    return 0;
}

static void test_ring_pinned(void)
{
    s_kid_t kid = s_spawn(s_kid_holder);
    dp_devregion_shard_t r;
    char err[DP_ERR_LEN] = "", same = 0, ack = 0;
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 2, 1, err), 0);
    CHECK_EQ(s_publish(&r, 1, 1.0f), 0);
    CHECK_EQ(s_offer(&r, 0, &kid), 0);
    uint64_t v = 0;
    CHECK_EQ(s_recv(kid.from, &v, sizeof v), 0);
    CHECK_EQ(v, 1);
    CHECK_EQ(s_publish(&r, 2, 2.0f), 0);  /* the other entry */
    CHECK_EQ(s_publish(&r, 3, 3.0f), -1); /* one pinned, one newest: busy */
    CHECK_EQ(r.busy, 1);
    s_send(kid.to, "c", 1);
    CHECK_EQ(s_recv(kid.from, &same, 1), 0);
    CHECK_EQ(same, 1);
    s_send(kid.to, "u", 1);
    CHECK_EQ(s_recv(kid.from, &ack, 1), 0);
    CHECK_EQ(s_publish(&r, 3, 3.0f), 0); /* unpinned: written */
    CHECK_EQ(atomic_load(&r.ctl->newest), 1);
    CHECK_EQ(atomic_load(&r.ctl->entry[0].version), 3);
    s_send(kid.to, "q", 1);
    CHECK_EQ(s_reap(&kid), 0);
    CHECK_EQ(dp_devregion_release(&r), 0);
}

/* ---- offers and layouts that do not hold ---- */

static void test_bad_offers(void)
{
    dp_devregion_shard_t r;
    dp_devregion_worker_t w;
    dp_devregion_offer_t o, bad;
    char err[DP_ERR_LEN] = "";
    uint64_t v = 0;
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 1, 1, err), -1); /* ring of 1 */
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 3, 0, err), -1);
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_standin, NF, 3, 2, err), 0);
    CHECK_EQ(dp_devregion_offer(&r, 2, &o, err), -1);
    CHECK_EQ(dp_devregion_offer(&r, 1, &o, err), 0);
    CHECK_EQ(dp_devregion_attach(&w, &dp_devmem_standin, &o, err), 0);
    CHECK(dp_devregion_pin(&w, &v, err) == NULL); /* nothing published yet */
    CHECK(strstr(err, "no version") != NULL);
    dp_devregion_detach(&w);
    bad = o, bad.n = NF + 1;
    CHECK_EQ(dp_devregion_attach(&w, &dp_devmem_standin, &bad, err), -1);
    bad = o, bad.slot = 2;
    CHECK_EQ(dp_devregion_attach(&w, &dp_devmem_standin, &bad, err), -1);
    CHECK(strstr(err, "bad offer") != NULL);
    bad = o, bad.ring = 9;
    CHECK_EQ(dp_devregion_attach(&w, &dp_devmem_standin, &bad, err), -1);
    bad = o, snprintf(bad.ctl, sizeof bad.ctl, "/tmp/../proc/self/fd/0");
    CHECK_EQ(dp_devregion_attach(&w, &dp_devmem_standin, &bad, err), -1);
    bad = o, memcpy(bad.weights.b, o.grad.b, sizeof bad.weights.b); /* a writable one as weights */
    CHECK_EQ(dp_devregion_attach(&w, &dp_devmem_standin, &bad, err), -1);
    CHECK(strstr(err, "sealed") != NULL || strstr(err, "bytes") != NULL);
    CHECK(w.ctl == NULL && w.weights.ptr == NULL);
    CHECK_EQ(dp_devregion_release(&r), 0);
}

DP_TESTS(T(test_roundtrip), T(test_lying_worker), T(test_weights_read_only),
         T(test_killed_mid_write), T(test_restart_generation), T(test_ring_pinned),
         T(test_bad_offers))
