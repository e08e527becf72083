/* test_ps_parts: pushes in parts (Push.part / Push.parts, server/core/shard_parts.h)
 * against a real server (tests/ps_harness.h) over loopback:
 *  - from the hostile side, a raw DEALER speaking the wire with the
 *    project's codec (worker 1): overlapping parts, a part outside the
 *    shard's range, parts 0 with a part index, parts above the bound, parts
 *    that change within a step, more parts than it said, parts leaving a
 *    gap, a NaN in the last part, a part said to be in shared memory the
 *    shard never granted — each refused with one line naming it, the
 *    version and every weight unchanged, and the worker's next step still
 *    applies; a repeated part of an applied step is acknowledged as a
 *    repeat and applied once; parts of two steps interleaved apply the
 *    newer one only;
 *  - parts in any order give the weights a whole push of the same gradient
 *    gives, bit for bit;
 *  - the worker's client (dp_ps_client_push_begin / push_part / push_end)
 *    on two shards, in frames and in bfloat16: the servers hold exactly
 *    what whole pushes of the same gradients give, the parts that leave
 *    before push_end are those whose floats were final (all, some, none
 *    when out of order), and a shard restarted mid-push gets every part
 *    again. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/model.h"
#include "common/util.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0

static dp_model_t s_m;

static void s_setup(void)
{
    if (!s_m.n_floats) srv_small_model(&s_m);
}

typedef raw_reply_t s_reply_t;

/* One part from worker 1: floats [off, off + cnt) of g, step st on version
 * v, part k of K (K 0: a whole push); shm: said to be in shared memory (no
 * frame). */
static s_reply_t s_part(void *sock, uint64_t st, uint64_t v, uint32_t k, uint32_t K, const float *g,
                        size_t off, size_t cnt, int shm)
{
    static uint64_t req = 100;
    s_reply_t r = {-1, 0, 0, ""};
    raw_push_t rp;
    raw_push_init(&rp, &s_m, 1, ++req, st, v, k, K, g + off, cnt, off);
    rp.env.shm = shm;
    dp_wire_payload_t pl = {g + off, cnt * sizeof(float), NULL, NULL};
    char err[DP_ERR_LEN];
    if (dp_wire_send(sock, NULL, &rp.env, shm ? NULL : &pl, shm ? 0 : 1, err) != 0) return r;
    return raw_reply(sock);
}


/* Functions, not macros: an argument that sends a part is evaluated once. */
static int s_acked(s_reply_t r, int status)
{
    return r.type == DOWNPOUR__MSG_TYPE__ACK && r.status == status;
}
#define RECEIVED(r) s_acked((r), DOWNPOUR__ACK_STATUS__RECEIVED)
#define APPLIED(r) s_acked((r), DOWNPOUR__ACK_STATUS__APPLIED)

/* A refusal: one line with want in it, the version and weights as before. */
#define CHECK_REFUSED(r, want, c, ver, w0, w)                                    \
    do {                                                                         \
        CHECK((r).type == DOWNPOUR__MSG_TYPE__ERROR ||                           \
              ((r).type == DOWNPOUR__MSG_TYPE__ACK && (r).status == DOWNPOUR__ACK_STATUS__REJECTED)); \
        CHECK(strstr((r).text, want) != NULL);                                   \
        CHECK(strchr((r).text, '\n') == NULL);                                   \
        if (!strstr((r).text, want)) fprintf(stderr, "  got: %s\n", (r).text);   \
        CHECK_EQ(srv_weights(c, w), (ver));                                        \
        CHECK(memcmp(w, w0, s_m.n_floats * sizeof(float)) == 0);                 \
    } while (0)

/* The next step of worker 1 goes in two good parts and applies: ver + 1,
 * and w0 becomes the new weights. */
static void s_next_applies(void *sock, dp_ps_client_t *c, uint64_t *step, uint64_t *ver, float *g,
                           float *w0)
{
    size_t n = s_m.n_floats, h = n / 2;
    ++*step;
    s_reply_t r = s_part(sock, *step, *ver, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, *step, *ver, 1, 2, g, 0, h, 0);
    CHECK(APPLIED(r));
    if (!APPLIED(r)) fprintf(stderr, "  next step: %s\n", r.text);
    ++*ver;
    CHECK_EQ(srv_weights(c, w0), *ver);
}

static void test_hostile_parts(void)
{
    s_setup();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN];
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_m, 0, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_m.n_floats, h = n / 2;
    float *w0 = malloc(n * sizeof *w0), *w = malloc(n * sizeof *w), *g = malloc(n * sizeof *g);
    srv_fill(g, n, 3);
    uint64_t ver = 0, step = 0;
    CHECK_EQ(srv_weights(c, w0), ver);
    void *ctx = zmq_ctx_new();
    void *sock = raw_dealer(ctx, s.endpoint, (int)(TMO * 1000));
    Downpour__Envelope he;
    Downpour__Hello hl;
    raw_hello_init(&he, &hl, &s_m, 1, 1);
    CHECK_EQ(raw_request(sock, &he, NULL), DOWNPOUR__MSG_TYPE__WELCOME);
    s_reply_t r;

    /* overlapping parts */
    r = s_part(sock, ++step, ver, 0, 2, g, 0, h + 4, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, step, ver, 1, 2, g, h, n - h, 0);
    CHECK_REFUSED(r, "overlaps a part already in", c, ver, w0, w);
    s_next_applies(sock, c, &step, &ver, g, w0);

    /* a part outside the shard's range */
    r = s_part(sock, ++step, ver, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    float *big = calloc(n + 8, sizeof *big);
    r = s_part(sock, step, ver, 1, 2, big, n - 4, 8, 0);
    CHECK_REFUSED(r, "not inside this shard's", c, ver, w0, w);
    s_next_applies(sock, c, &step, &ver, g, w0);

    /* parts 0 with a part index; parts above the bound (malformed: ERROR) */
    r = s_part(sock, step + 1, ver, 1, 0, g, 0, h, 0);
    CHECK_REFUSED(r, "PUSH part 1 of 1 (parts 0: a whole push)", c, ver, w0, w);
    r = s_part(sock, step + 1, ver, 0, DP_WIRE_MAX_PUSH_PARTS + 1, g, 0, h, 0);
    CHECK_REFUSED(r, "PUSH in 65 parts (limit 64)", c, ver, w0, w);
    s_next_applies(sock, c, &step, &ver, g, w0);

    /* the parts change within a step */
    r = s_part(sock, ++step, ver, 0, 3, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, step, ver, 1, 2, g, 0, h, 0);
    CHECK_REFUSED(r, "says 2 parts, its first part said 3", c, ver, w0, w);
    /* and the step's later parts are refused too, naming the first reason */
    r = s_part(sock, step, ver, 2, 3, g, 0, h, 0);
    CHECK_REFUSED(r, "rejected at an earlier part", c, ver, w0, w);
    CHECK(strstr(r.text, "says 2 parts") != NULL);
    s_next_applies(sock, c, &step, &ver, g, w0);

    /* more parts than it said (a part index twice) */
    r = s_part(sock, ++step, ver, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, step, ver, 0, 2, g, 0, h, 0);
    CHECK_REFUSED(r, "came twice (more parts than 2)", c, ver, w0, w);
    s_next_applies(sock, c, &step, &ver, g, w0);

    /* parts that leave a gap */
    r = s_part(sock, ++step, ver, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, step, ver, 1, 2, g, 0, h - 4, 0);
    CHECK_REFUSED(r, "cover", c, ver, w0, w);
    s_next_applies(sock, c, &step, &ver, g, w0);

    /* a NaN in the last part of a step */
    float *bad = malloc(n * sizeof *bad);
    memcpy(bad, g, n * sizeof *bad);
    bad[3] = NAN;
    r = s_part(sock, ++step, ver, 0, 2, bad, h, n - h, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, step, ver, 1, 2, bad, 0, h, 0);
    CHECK_REFUSED(r, "non-finite gradient", c, ver, w0, w);
    CHECK(strstr(r.text, "part 1 of 2") != NULL);
    s_next_applies(sock, c, &step, &ver, g, w0);

    /* shared memory this shard never granted */
    r = s_part(sock, ++step, ver, 0, 2, g, h, n - h, 1);
    CHECK_REFUSED(r, "has not granted", c, ver, w0, w);
    s_next_applies(sock, c, &step, &ver, g, w0);

    /* a repeated part of an applied step: a repeat, applied once */
    r = s_part(sock, step, ver - 1, 0, 2, g, h, n - h, 0);
    CHECK(APPLIED(r));
    CHECK(strstr(r.text, "repeat:") != NULL);
    r = s_part(sock, step, ver - 1, 1, 2, g, 0, h, 0);
    CHECK(APPLIED(r));
    CHECK_EQ(srv_weights(c, w), ver);
    CHECK(memcmp(w, w0, n * sizeof(float)) == 0);

    /* two steps interleaved: the newer one gives the older up */
    float *g2 = malloc(n * sizeof *g2);
    srv_fill(g2, n, 11);
    r = s_part(sock, step + 1, ver, 0, 2, g2, h, n - h, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, step + 2, ver, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, step + 1, ver, 1, 2, g2, 0, h, 0);
    CHECK_REFUSED(r, "comes too late", c, ver, w0, w);
    r = s_part(sock, step + 2, ver, 1, 2, g, 0, h, 0);
    CHECK(APPLIED(r));
    step += 2;
    CHECK_EQ(srv_weights(c, w), ver + 1);
    ver++;
    { /* one SGD step (lr 0.1) by g, not by g2 (which differs by about 0.1) */
        float *w1 = malloc(n * sizeof *w1);
        for (size_t i = 0; i < n; i++) w1[i] = w0[i] - 0.1f * g[i];
        CHECK_CLOSE("the newer step, once", w, w1, n, 1e-6, 1e-5);
        free(w1);
    }

    free(g2);
    free(bad);
    free(big);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    dp_ps_client_destroy(&c);
    free(w0);
    free(w);
    free(g);
    CHECK_EQ(srv_stop(&s), 0);
}

/* Two shards of the small model (the mode, 2 workers, Adam lr 0.01, whose
 * moments would show any optimizer state a wrong step leaked): a, which
 * gets pushes in parts, and b, the reference that gets the same gradients
 * whole; on each, worker 0's client and worker 1's raw socket (HELLO
 * said); g, wa, wb: a gradient and the two shards' weights. */
typedef struct {
    srv_t a, b;
    dp_ps_client_t *ca, *cb;
    void *ctx, *sa, *sb;
    float *g, *wa, *wb;
} s_pair_t;

static void s_pair_open(s_pair_t *p, dp_mode_t mode)
{
    s_setup();
    memset(p, 0, sizeof *p);
    srv_init(&p->a, mode, 2);
    srv_init(&p->b, mode, 2);
    p->a.cfg.optim.kind = p->b.cfg.optim.kind = DP_OPT_ADAM;
    p->a.cfg.optim.lr = p->b.cfg.optim.lr = 0.01f;
    CHECK_EQ(srv_start(&p->a), 0);
    CHECK_EQ(srv_start(&p->b), 0);
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_ps_client_new(&p->ca, p->a.endpoint, &s_m, 0, PS_OPTS(TMO), NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&p->cb, p->b.endpoint, &s_m, 0, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_m.n_floats;
    p->g = malloc(n * sizeof *p->g);
    p->wa = malloc(n * sizeof *p->wa);
    p->wb = malloc(n * sizeof *p->wb);
    p->ctx = zmq_ctx_new();
    p->sa = raw_dealer(p->ctx, p->a.endpoint, (int)(TMO * 1000));
    p->sb = raw_dealer(p->ctx, p->b.endpoint, (int)(TMO * 1000));
    Downpour__Envelope he;
    Downpour__Hello hl;
    raw_hello_init(&he, &hl, &s_m, 1, 1);
    CHECK_EQ(raw_request(p->sa, &he, NULL), DOWNPOUR__MSG_TYPE__WELCOME);
    CHECK_EQ(raw_request(p->sb, &he, NULL), DOWNPOUR__MSG_TYPE__WELCOME);
}

/* Both shards at version ver hold the same weights, bit for bit. */
static void s_pair_same(s_pair_t *p, uint64_t ver)
{
    CHECK_EQ(srv_weights(p->ca, p->wa), ver);
    CHECK_EQ(srv_weights(p->cb, p->wb), ver);
    CHECK(memcmp(p->wa, p->wb, s_m.n_floats * sizeof(float)) == 0);
}

/* Worker 0's whole push of g0 as step st to both, each on the version it
 * pulls first (ver). */
static void s_pair_push0(s_pair_t *p, uint64_t st, const float *g0, uint64_t ver)
{
    char err[DP_ERR_LEN];
    CHECK_EQ(srv_weights(p->ca, p->wa), ver);
    CHECK_EQ(srv_weights(p->cb, p->wb), ver);
    CHECK_EQ(dp_ps_client_push(p->ca, PS_PUSH_STEP(st, g0, 1.0f, 1), NULL, err), 0);
    CHECK_EQ(dp_ps_client_push(p->cb, PS_PUSH_STEP(st, g0, 1.0f, 1), NULL, err), 0);
}

/* steps_early of shard a and of b. */
static void s_pair_early(s_pair_t *p, uint64_t want_a)
{
    char err[DP_ERR_LEN];
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(p->ca, &st, err), 0);
    CHECK_EQ(st.steps_early, want_a);
    CHECK_EQ(dp_ps_client_stats(p->cb, &st, err), 0);
    CHECK_EQ(st.steps_early, 0);
}

static void s_pair_close(s_pair_t *p)
{
    zmq_close(p->sa);
    zmq_close(p->sb);
    zmq_ctx_term(p->ctx);
    dp_ps_client_destroy(&p->ca);
    dp_ps_client_destroy(&p->cb);
    free(p->g);
    free(p->wa);
    free(p->wb);
    CHECK_EQ(srv_stop(&p->a), 0);
    CHECK_EQ(srv_stop(&p->b), 0);
}

/* Worker 1's step st on version v through sock: g in two parts (the upper
 * half first, as a backward sends it), applied; or whole, applied. */
static void s_two_parts(void *sock, uint64_t st, uint64_t v, const float *g)
{
    size_t n = s_m.n_floats, h = n / 2;
    s_reply_t r = s_part(sock, st, v, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    r = s_part(sock, st, v, 1, 2, g, 0, h, 0);
    CHECK(APPLIED(r));
}

static void s_whole(void *sock, uint64_t st, uint64_t v, const float *g)
{
    s_reply_t r = s_part(sock, st, v, 0, 0, g, 0, s_m.n_floats, 0);
    CHECK(APPLIED(r));
}

/* Parts in any order hold the weights a whole push holds, bit for bit. */
static void test_parts_equal_whole(void)
{
    s_pair_t p;
    s_pair_open(&p, DP_MODE_ASYNC);
    size_t n = s_m.n_floats;
    size_t cut[4] = {0, 17, 90, n}; /* three parts, sent middle, last, first */
    uint32_t order[3] = {1, 2, 0};
    for (uint64_t st = 1; st <= 3; st++) {
        srv_fill(p.g, n, 40 + st);
        s_whole(p.sb, st, st - 1, p.g);
        for (int j = 0; j < 3; j++) {
            uint32_t k = order[j];
            s_reply_t r = s_part(p.sa, st, st - 1, k, 3, p.g, cut[k], cut[k + 1] - cut[k], 0);
            CHECK(j < 2 ? RECEIVED(r) : APPLIED(r));
        }
    }
    s_pair_same(&p, 3);
    s_pair_close(&p);
}

/* The early step (server/core/shard_early.h: a shard steps a push's
 * parts as they come) from the hostile side, in async: worker 1's steps in
 * two parts, with a NaN in the second part of one (after its first part
 * was stepped early), and one whose parts are split by worker 0's whole
 * push (which steps the shard between them, dropping the early step, which
 * begins again from the new version). The rejected step leaves no trace,
 * the split one is applied after worker 0's, on its staleness, and the
 * weights equal the whole pushes' bit for bit; a half-sent push the
 * worker gives up for a newer step does not keep that step from going
 * early; the four clean streamed steps count as made early. */
static void test_early_step_dropped(void)
{
    s_pair_t p;
    s_pair_open(&p, DP_MODE_ASYNC);
    size_t n = s_m.n_floats, h = n / 2;
    float *g = p.g, *g0 = malloc(n * sizeof *g0);
    s_reply_t r;
    /* step 1: streamed / whole */
    srv_fill(g, n, 51);
    s_two_parts(p.sa, 1, 0, g);
    s_whole(p.sb, 1, 0, g);
    /* step 2 on a: its first part stepped early, a NaN in its second */
    CHECK_EQ(srv_weights(p.ca, p.wb), 1); /* what a must still hold after it */
    srv_fill(g, n, 52);
    r = s_part(p.sa, 2, 1, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    g[h / 2] = NAN;
    r = s_part(p.sa, 2, 1, 1, 2, g, 0, h, 0);
    CHECK_REFUSED(r, "non-finite gradient", p.ca, 1, p.wb, p.wa);
    /* step 3 on a (step 2 on b): streamed / whole */
    srv_fill(g, n, 53);
    s_two_parts(p.sa, 3, 1, g);
    s_whole(p.sb, 2, 1, g);
    /* step 4 of worker 1 on version 2, split by worker 0's whole push on
     * version 2: worker 0's applies first, then worker 1's (staleness 1) */
    srv_fill(g, n, 54);
    r = s_part(p.sa, 4, 2, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    srv_fill(g0, n, 60);
    s_pair_push0(&p, 1, g0, 2);
    r = s_part(p.sa, 4, 2, 1, 2, g, 0, h, 0);
    CHECK(APPLIED(r));
    s_whole(p.sb, 3, 2, g);
    s_pair_same(&p, 4);
    /* step 5's first part (early from there), then worker 1 moves on to
     * step 6 (as after giving up step 5): step 5's early step is dropped
     * with its assembly and step 6's is early in turn */
    srv_fill(g, n, 55);
    r = s_part(p.sa, 5, 4, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    srv_fill(g, n, 56);
    s_two_parts(p.sa, 6, 4, g);
    s_whole(p.sb, 4, 4, g);
    s_pair_same(&p, 5);
    s_pair_early(&p, 4);
    char err[DP_ERR_LEN];
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(p.ca, &st, err), 0);
    CHECK_EQ(st.staleness_max, 1);
    free(g0);
    s_pair_close(&p);
}

/* The early step in sync (R = 2; worker 0 whole through the client, worker
 * 1 in two parts from the hostile side) against the whole pushes in the
 * same order: the push that completes a step is stepped part by part by
 * the mean of acc and its parts — begun when the other worker's push made
 * it the completing one (its first part then caught up), or at its first
 * part when it already was; a NaN in its second part leaves acc, the
 * weights and Adam's moments as they were, and a clean push of its next
 * step completes the version; a push that does not complete the step is
 * not stepped early. Bit for bit the whole pushes' weights. */
static void test_early_step_sync(void)
{
    s_pair_t p;
    s_pair_open(&p, DP_MODE_SYNC);
    size_t n = s_m.n_floats, h = n / 2;
    float *g = p.g, *g0 = malloc(n * sizeof *g0);
    s_reply_t r;
    /* version 0: worker 1's first part, then worker 0's push makes worker
     * 1's the completing one (early from there), then its second part */
    srv_fill(g, n, 71);
    srv_fill(g0, n, 81);
    r = s_part(p.sa, 1, 0, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    s_pair_push0(&p, 1, g0, 0);
    r = s_part(p.sa, 1, 0, 1, 2, g, 0, h, 0);
    CHECK(APPLIED(r));
    s_whole(p.sb, 1, 0, g);
    /* version 1: worker 0 first; worker 1's push is early from its first
     * part, with a NaN in its second; then its next step, clean */
    srv_fill(g0, n, 82);
    s_pair_push0(&p, 2, g0, 1);
    srv_fill(g, n, 72);
    r = s_part(p.sa, 2, 1, 0, 2, g, h, n - h, 0);
    CHECK(RECEIVED(r));
    g[3] = NAN;
    r = s_part(p.sa, 2, 1, 1, 2, g, 0, h, 0);
    CHECK(r.type == DOWNPOUR__MSG_TYPE__ACK && r.status == DOWNPOUR__ACK_STATUS__REJECTED);
    CHECK(strstr(r.text, "non-finite gradient") != NULL);
    srv_fill(g, n, 73);
    s_two_parts(p.sa, 3, 1, g);
    s_whole(p.sb, 2, 1, g);
    /* version 2: worker 1 in parts first (not the completing one: no early
     * step), then worker 0 */
    srv_fill(g, n, 74);
    s_two_parts(p.sa, 4, 2, g);
    s_whole(p.sb, 3, 2, g);
    srv_fill(g0, n, 83);
    s_pair_push0(&p, 3, g0, 2);
    s_pair_same(&p, 3);
    s_pair_early(&p, 2);
    free(g0);
    s_pair_close(&p);
}

/* The worker's client streaming to two shards (each slice cut into parts
 * by a bucket smaller than the model, so the parts are many) against the
 * same client pushing whole to two other shards: the same weights, bit
 * for bit; the streamed pushes took more messages. */
/* How the case declares the gradient final: every layer from the last
 * (the backward's order), only the last two (push_end sends the rest), or
 * the first layer first (out of order: nothing streams, all at the end). */
enum { S_ALL, S_TOP_TWO, S_DISORDER };

static void s_client_case(dp_ps_wire_t wire, int how, int want_early)
{
    s_setup();
    /* a model whose big layers each pass the bucket (64 K floats), so each
     * shard's slice goes in two parts, the first during the "backward" */
    dp_model_t m;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_model_parse(&m, "fc:600 relu fc:600 relu fc:600 relu fc:10 softmax", 1, 16, 16,
                            err), 0);
    srv_t s[4];
    char eps[2][600];
    for (int k = 0; k < 4; k++) {
        srv_init(&s[k], DP_MODE_ASYNC, 1);
        snprintf(s[k].cfg.model_spec, sizeof s[k].cfg.model_spec, "%s", m.spec);
        s[k].cfg.in_h = s[k].cfg.in_w = 16;
        s[k].cfg.shard_index = k % 2;
        s[k].cfg.shard_count = 2;
        s[k].cfg.optim.kind = DP_OPT_ADAM;
        s[k].cfg.optim.lr = 0.01f;
        CHECK_EQ(srv_start(&s[k]), 0);
    }
    snprintf(eps[0], sizeof eps[0], "%s,%s", s[0].endpoint, s[1].endpoint);
    snprintf(eps[1], sizeof eps[1], "%s,%s", s[2].endpoint, s[3].endpoint);
    dp_ps_client_opts_t o = {.timeout_s = TMO, .wire = wire, .transport = DP_PS_TRANSPORT_ZMQ};
    dp_ps_client_t *cs = NULL, *cw = NULL;
    CHECK_EQ(dp_ps_client_new(&cs, eps[0], &m, 0, &o, NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&cw, eps[1], &m, 0, &o, NULL, err), 0);
    size_t n = m.n_floats;
    float *g = malloc(n * sizeof *g), *ws = malloc(n * sizeof *ws), *ww = malloc(n * sizeof *ww);
    for (uint64_t st = 1; cs && cw && st <= 3; st++) {
        srv_fill(g, n, 70 + st);
        CHECK_EQ(dp_ps_client_pull(cs, ws, err), 0);
        CHECK_EQ(dp_ps_client_pull(cw, ww, err), 0);
        dp_ps_push_t p = {.grads = g, .batch = 1, .step = st};
        CHECK_EQ(dp_ps_client_push_begin(cs, &p, err), 0);
        size_t lo, hi;
        if (how == S_DISORDER && dp_model_layer_span(&m, 0, &lo, &hi))
            dp_ps_client_push_part(cs, lo, hi - lo);
        for (int l = m.n_layers - 1, seen = 0; l >= 0; l--) /* as the backward makes them */
            if (dp_model_layer_span(&m, l, &lo, &hi) && (how != S_TOP_TWO || seen++ < 2))
                dp_ps_client_push_part(cs, lo, hi - lo);
        p.loss = 1.0f;
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push_end(cs, &r, err), 0);
        CHECK_EQ(r.applied, 2);
        CHECK_EQ(r.parts, 4);
        CHECK_EQ(r.parts_early, want_early);
        CHECK_EQ(dp_ps_client_push(cw, &p, NULL, err), 0);
    }
    CHECK_EQ(dp_ps_client_pull(cs, ws, err), 0);
    CHECK_EQ(dp_ps_client_pull(cw, ww, err), 0);
    CHECK_EQ(dp_ps_client_version(cs), 6);
    CHECK(memcmp(ws, ww, n * sizeof(float)) == 0);
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(cs, &st, err), 0);
    CHECK_EQ(st.applied, 3); /* one push a step, however many parts */
    dp_ps_client_destroy(&cs);
    dp_ps_client_destroy(&cw);
    free(g);
    free(ws);
    free(ww);
    for (int k = 0; k < 4; k++) CHECK_EQ(srv_stop(&s[k]), 0);
}

/* A shard restarts (no checkpoint: it comes back at version 0, which the
 * worker had pulled) after the first part of a push went to it: push_end's
 * last part meets the new shard, which does not know the worker, and the
 * client says HELLO and sends every part again; the weights are those of
 * the same push whole on a shard that never restarted. */
static void test_client_parts_shard_restart(void)
{
    s_setup();
    dp_model_t m;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_model_parse(&m, "fc:600 relu fc:600 relu fc:600 relu fc:10 softmax", 1, 16, 16,
                            err), 0);
    srv_t s1, s2, ref;
    srv_t *all[3] = {&s1, &s2, &ref};
    for (int k = 0; k < 3; k++) {
        srv_init(all[k], DP_MODE_ASYNC, 1);
        snprintf(all[k]->cfg.model_spec, sizeof all[k]->cfg.model_spec, "%s", m.spec);
        all[k]->cfg.in_h = all[k]->cfg.in_w = 16;
    }
    CHECK_EQ(srv_start(&s1), 0);
    CHECK_EQ(srv_start(&ref), 0);
    dp_ps_client_opts_t o = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    dp_ps_client_t *c = NULL, *cr = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s1.endpoint, &m, 0, &o, NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&cr, ref.endpoint, &m, 0, &o, NULL, err), 0);
    size_t n = m.n_floats;
    float *g = malloc(n * sizeof *g), *w = malloc(n * sizeof *w), *wr = malloc(n * sizeof *wr);
    srv_fill(g, n, 99);
    dp_push_result_t r = {0};
    if (c && cr) {
        CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
        CHECK_EQ(dp_ps_client_pull(cr, wr, err), 0);
        dp_ps_push_t p = {.grads = g, .batch = 1, .step = 1};
        CHECK_EQ(dp_ps_client_push_begin(c, &p, err), 0);
        for (int l = m.n_layers - 1, seen = 0; l >= 0 && seen < 2; l--) {
            size_t lo, hi;
            if (dp_model_layer_span(&m, l, &lo, &hi)) {
                dp_ps_client_push_part(c, lo, hi - lo);
                seen++;
            }
        }
        CHECK_EQ(srv_stop(&s1), 0); /* its first part went there */
        snprintf(s2.cfg.bind, sizeof s2.cfg.bind, "%s", s1.endpoint);
        CHECK_EQ(srv_start(&s2), 0);
        CHECK_EQ(dp_ps_client_push_end(c, &r, err), 0);
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(r.parts, 3);
        CHECK_EQ(r.parts_early, 1);
        CHECK_EQ(dp_ps_client_push(cr, &p, NULL, err), 0);
        CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
        CHECK_EQ(dp_ps_client_pull(cr, wr, err), 0);
        CHECK_EQ(dp_ps_client_version(c), 1);
        CHECK(memcmp(w, wr, n * sizeof(float)) == 0);
    }
    dp_ps_client_destroy(&c);
    dp_ps_client_destroy(&cr);
    free(g);
    free(w);
    free(wr);
    CHECK_EQ(srv_stop(&s2), 0);
    CHECK_EQ(srv_stop(&ref), 0);
}

/* all four parts before push_end (each shard's last too: its slice was
 * final); with the top two layers only, shard 1's first part; out of
 * order, none */
static void test_client_parts(void) { s_client_case(DP_PS_WIRE_FP32, S_ALL, 4); }
static void test_client_parts_bf16(void) { s_client_case(DP_PS_WIRE_BF16, S_ALL, 4); }
static void test_client_parts_rest_at_end(void) { s_client_case(DP_PS_WIRE_FP32, S_TOP_TWO, 1); }
static void test_client_parts_disorder(void) { s_client_case(DP_PS_WIRE_FP32, S_DISORDER, 0); }

DP_TESTS(T(test_hostile_parts), T(test_parts_equal_whole), T(test_early_step_dropped),
         T(test_early_step_sync), T(test_client_parts),
         T(test_client_parts_bf16), T(test_client_parts_rest_at_end), T(test_client_parts_disorder),
         T(test_client_parts_shard_restart))
