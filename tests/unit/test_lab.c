/* test_lab: the lab — the simulator (deploy/lab/sim.h) against the known
 * results of asynchronous SGD with exponential compute times (staleness is
 * geometric: fresh fraction 1/M, mean M - 1) and with constant ones (every
 * push M - 1 stale), its determinism; record files (server/core/record.h)
 * written, replayed bit for bit, refused when damaged; the measured
 * policy step's norms.
 *
 * The simulations use a tiny model (fc:10 on Fashion-MNIST, batch 4) so
 * the thousands of real gradients cost little; the staleness figures do not
 * depend on the model. Tolerances: with p = 1/M the fresh share of n pushes
 * has sd sqrt(p(1-p)/n) and the mean staleness sd sqrt((1-p)/p^2/n); the
 * checks allow 5 of each (and the runs are deterministic: a seed that
 * passes passes always). */
#include <inttypes.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "deploy/lab/sim.h"
#include "deploy/launcher/commands.h"
#include "proto/compress.h"
#include "server/args.h"
#include "server/core/policy.h"
#include "server/core/record.h"
#include "tests/test.h"

#define TINY "fc:10 softmax"

static char s_dir[256];

static int s_have_data(void)
{
    return access(DP_FASHION_MNIST_DIR, R_OK) == 0;
}

static void s_conf(dp_sim_conf_t *c, double *slow, int M, const char *dist, uint64_t n)
{
    memset(c, 0, sizeof *c);
    dp_lab_conf_default(&c->lab);
    c->lab.train.model = TINY;
    c->lab.train.batch = 4;
    c->lab.workers = M;
    c->lab.optim.kind = DP_OPT_SGD;
    c->lab.optim.lr = 0.01f;
    for (int i = 0; i < M; i++) slow[i] = 1.0;
    c->slow = slow;
    char err[DP_ERR_LEN];
    dp_dist_parse(&c->compute, dist, err);
    c->updates = n;
}

static double s_num(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* M workers, exponential compute times: geometric staleness. */
static void s_check_exp(int M, uint64_t n)
{
    dp_sim_conf_t c;
    double slow[16];
    s_conf(&c, slow, M, "exp:10", n);
    cJSON *r = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_sim_run(&c, &r, err), 0);
    if (!r) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    double p = 1.0 / M;
    CHECK_EQ(s_num(r, "updates"), n);
    CHECK_NEAR(s_num(r, "fresh_fraction"), p, 5 * sqrt(p * (1 - p) / n));
    CHECK_NEAR(s_num(r, "staleness_mean"), M - 1, 5 * sqrt((1 - p) / (p * p) / n));
    CHECK_NEAR(s_num(r, "staleness_geometric_p"), p, 0.02);
    CHECK(s_num(r, "test_accuracy") > 0.5); /* real gradients trained it */
    cJSON_Delete(r);
}

static void test_sim_exponential(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    s_check_exp(4, 4000);
    s_check_exp(8, 4000);
}

/* Constant compute times: workers finish in turn, each push M - 1 stale
 * (the first M - 1 pushes less). */
static void test_sim_constant(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    dp_sim_conf_t c;
    double slow[16];
    s_conf(&c, slow, 5, "const:10", 500);
    cJSON *r = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_sim_run(&c, &r, err), 0);
    if (!r) return;
    CHECK_EQ(s_num(r, "staleness_max"), 4);
    CHECK_NEAR(s_num(r, "staleness_mean"), (0 + 1 + 2 + 3 + 496 * 4) / 500.0, 1e-9);
    CHECK_NEAR(s_num(r, "sim_s"), 0.01 * 100, 1e-9); /* 500 pushes by 5 workers, 10 ms each */
    cJSON_Delete(r);
    /* sync with one backup worker: R = 4 of 5, a late gradient dropped per step */
    s_conf(&c, slow, 5, "exp:10", 50);
    c.lab.mode = DP_MODE_SYNC;
    c.lab.policy.replicas = 4;
    CHECK_EQ(dp_sim_run(&c, &r, err), 0);
    if (!r) return;
    CHECK_EQ(s_num(r, "updates"), 50);
    CHECK_EQ(s_num(r, "updates_applied"), 200);
    CHECK(s_num(r, "updates_dropped") >= 40);
    CHECK_EQ(s_num(r, "staleness_max"), 0);
    cJSON_Delete(r);
}

static int s_same_file(const char *a, const char *b)
{
    uint8_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    char err[DP_ERR_LEN];
    int same = dp_read_file(a, &x, &nx, err) == 0 && dp_read_file(b, &y, &ny, err) == 0 && nx == ny &&
               memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

static const char *s_str(const cJSON *o, const char *k)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* One replay case: a simulation of 3 workers (s_conf, exp:10) that records
 * TAG<i>.rec and saves TAG<i>.safetensors under s_dir, and the replay of
 * that record into TAG<i>-replay/. A case sets what it tests in c, then
 * s_case_sim and s_case_replay. */
typedef struct {
    char rec[300];      /* the simulation's record */
    char model[300];    /* the simulation's model */
    char out[300];      /* the replay's directory */
    char replayed[340]; /* the replay's model */
    dp_sim_conf_t c;    /* the simulation */
    double slow[16];    /* c's per-worker slowness */
} s_case_t;

static void s_case_init(s_case_t *k, const char *tag, int i, uint64_t updates)
{
    snprintf(k->rec, sizeof k->rec, "%s/%s%d.rec", s_dir, tag, i);
    snprintf(k->model, sizeof k->model, "%s/%s%d.safetensors", s_dir, tag, i);
    snprintf(k->out, sizeof k->out, "%s/%s%d-replay", s_dir, tag, i);
    snprintf(k->replayed, sizeof k->replayed, "%s/model.safetensors", k->out);
    s_conf(&k->c, k->slow, 3, "exp:10", updates);
    k->c.lab.record = k->rec;
    k->c.lab.train.save = k->model;
}

/* The simulation: its result (the caller's to delete), NULL where it failed. */
static cJSON *s_case_sim(s_case_t *k)
{
    cJSON *r = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_sim_run(&k->c, &r, err), 0);
    if (!r) fprintf(stderr, "  %s\n", err);
    return r;
}

/* The record replayed: the simulation's model to the bit. */
static void s_case_replay(s_case_t *k)
{
    char *av[] = {"replay", k->rec, "--out", k->out, NULL};
    CHECK_EQ(dp_replay_main(4, av), 0);
    CHECK(s_same_file(k->model, k->replayed));
}

/* Whether cases i and j of TAG saved the same model. */
static int s_case_same(const char *tag, int i, int j)
{
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/%s%d.safetensors", s_dir, tag, i);
    snprintf(b, sizeof b, "%s/%s%d.safetensors", s_dir, tag, j);
    return s_same_file(a, b);
}

/* Pushes compressed by COMPRESS, error feedback EF. */
static void s_compress(dp_sim_conf_t *c, const char *compress, const char *ef)
{
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_compress_parse(compress, &c->lab.train.compress, err), 0);
    CHECK_EQ(dp_compress_ef_parse(ef, &c->lab.train.compress.error_feedback, err), 0);
}

/* TINY's floats on Fashion-MNIST's 1x28x28 (and a check that it parses). */
static size_t s_tiny_floats(void)
{
    dp_model_t m;
    memset(&m, 0, sizeof m);
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, TINY, 1, 28, 28, err), 0);
    return m.n_floats;
}

/* The bytes of one push of N floats in c's encoding (top-k 0.05 or sign). */
static double s_push_bytes(const dp_sim_conf_t *c, size_t n)
{
    return c->lab.train.compress.kind == DP_COMPRESS_TOPK ? (double)dp_compress_topk_k(0.05, n) * 8
                                                          : (double)((n + 7) / 8 + 4);
}

/* H = 4 local steps in MODE: the inner optimizer INNER (NULL: s_conf's
 * SGD), the servers' outer one OUTER (NULL: their default, averaging at
 * lr 1). */
static void s_local_steps(dp_sim_conf_t *c, dp_mode_t mode, const char *inner, const char *outer)
{
    char err[DP_ERR_LEN] = "";
    c->lab.mode = mode;
    c->lab.local_steps = 4;
    if (inner) CHECK_EQ(dp_optim_parse_kind(&c->lab.optim, inner, err), 0);
    c->lab.inner = c->lab.optim;
    dp_ps_config_t ps;
    dp_ps_config_default(&ps);
    if (outer) snprintf(ps.outer_optimizer, sizeof ps.outer_optimizer, "%s", outer);
    ps.mode = mode;
    ps.num_workers = c->lab.workers;
    CHECK_EQ(dp_ps_outer_optim(&ps, &c->lab.optim, err), 0);
}

/* A simulation with --record, twice, and its replays: every model the same
 * bits; another schedule (constant compute times) another model. */
static void test_record_replay(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    char rec[300], rec2[300], m1[300], m2[300], m3[300], out[300];
    snprintf(rec, sizeof rec, "%s/a.rec", s_dir);
    snprintf(rec2, sizeof rec2, "%s/b.rec", s_dir);
    dp_sim_conf_t c;
    double slow[16];
    s_conf(&c, slow, 3, "exp:10", 200);
    c.lab.train.model = "conv3x3:2 relu maxpool2 fc:10 softmax";
    c.lab.optim.kind = DP_OPT_ADAM;
    c.lab.optim.lr = 0.002f;
    c.lab.record = rec;
    snprintf(m1, sizeof m1, "%s/sim.safetensors", s_dir);
    c.lab.train.save = m1;
    cJSON *r = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_sim_run(&c, &r, err), 0);
    cJSON_Delete(r);
    char *av[] = {"replay", rec, "--out", out, NULL};
    for (int i = 0; i < 2; i++) {
        snprintf(out, sizeof out, "%s/replay%d", s_dir, i);
        CHECK_EQ(dp_replay_main(4, av), 0);
    }
    snprintf(m2, sizeof m2, "%s/replay0/model.safetensors", s_dir);
    snprintf(m3, sizeof m3, "%s/replay1/model.safetensors", s_dir);
    CHECK(s_same_file(m1, m2));
    CHECK(s_same_file(m2, m3));
    /* another schedule, all else equal */
    dp_dist_parse(&c.compute, "const:10", err);
    c.lab.record = rec2;
    CHECK_EQ(dp_sim_run(&c, &r, err), 0);
    cJSON_Delete(r);
    CHECK(!s_same_file(m1, m2));
    dp_rec_t a, b;
    CHECK_EQ(dp_rec_load(&a, rec, err), 0);
    CHECK_EQ(dp_rec_load(&b, rec2, err), 0);
    CHECK_EQ(a.n, b.n);
    int differ = 0;
    for (size_t i = 0; i < a.n && i < b.n; i++)
        differ |= a.ev[i].worker != b.ev[i].worker || a.ev[i].version != b.ev[i].version;
    CHECK(differ);
    dp_rec_fini(&a);
    dp_rec_fini(&b);
}

/* Batch norm (2-D and 1-D, running statistics as state) and dropout, in
 * async and in sync: the simulation's record replays to the same bits (the
 * daemons' records replay so too: tests/integration/test_lab_cluster.sh). */
static void test_record_replay_bn(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    static const dp_mode_t modes[] = {DP_MODE_ASYNC, DP_MODE_SYNC};
    for (int i = 0; i < 2; i++) {
        s_case_t k;
        s_case_init(&k, "bn", i, 30);
        k.c.lab.train.model = "conv3x3:2 bn relu maxpool2 res( conv3x3:2 bn relu conv3x3:4:s2 bn ) relu "
                              "gap fc:8 bn relu dropout:0.25 fc:10 softmax";
        k.c.lab.mode = modes[i];
        k.c.lab.optim.kind = DP_OPT_MOMENTUM;
        k.c.lab.optim.momentum = 0.9f;
        k.c.lab.optim.lr = 0.05f;
        cJSON_Delete(s_case_sim(&k));
        s_case_replay(&k);
    }
}

/* RMSProp with A3C's eps 0.1 and an alpha other than the default: replay
 * rebuilds both from the record's header and reaches the same bits; the
 * summary names the optimizer. */
static void test_record_replay_rmsprop(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    s_case_t k;
    s_case_init(&k, "rms", 0, 200);
    k.c.lab.optim.kind = DP_OPT_RMSPROP;
    k.c.lab.optim.lr = 0.001f;
    k.c.lab.optim.alpha = 0.9f;
    k.c.lab.optim.eps = 0.1f;
    cJSON *r = s_case_sim(&k);
    if (r) CHECK_STR(s_str(r, "optimizer"), "rmsprop");
    cJSON_Delete(r);
    s_case_replay(&k);
}

/* Each delay rule and compensation, recorded by the simulator and
 * replayed: the same bits, and each did something (a scaled lr, a
 * skipped push, compensated pushes); the result and summary name them. */
static void test_record_replay_delay(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    static const struct {
        const char *rule, *dc;
    } cases[] = {
        {"adaptive", "off"}, {"threshold:1.5", "off"}, {"none", "const:0.5"}, {"adaptive", "adaptive:0.2"},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        s_case_t k;
        s_case_init(&k, "delay", i, 200);
        dp_sim_conf_t *c = &k.c;
        char err[DP_ERR_LEN] = "";
        CHECK_EQ(dp_delay_lr_parse(cases[i].rule, &c->lab.policy.delay_lr, &c->lab.policy.delay_k, err), 0);
        CHECK_EQ(dp_optim_parse_dc(&c->lab.optim, cases[i].dc, err), 0);
        cJSON *r = s_case_sim(&k);
        if (!r) continue;
        CHECK_STR(s_str(r, "delay_lr"), cases[i].rule);
        CHECK_STR(s_str(r, "delay_compensation"), cases[i].dc);
        if (c->lab.policy.delay_lr == DP_DELAY_THRESHOLD) CHECK(s_num(r, "updates_dropped") > 0);
        if (c->lab.optim.dc != DP_DC_OFF) CHECK(s_num(r, "dc_compensated") > 100);
        cJSON_Delete(r);
        dp_rec_t a;
        int scaled = 0, marked = 0;
        if (dp_rec_load(&a, k.rec, err) == 0) {
            for (size_t j = 0; j < a.n; j++) {
                scaled += a.ev[j].kind == DP_REC_PUSH && a.ev[j].status == DP_PUSH_APPLIED && a.ev[j].lr < 0.01f;
                marked += a.ev[j].dc == 1;
            }
            dp_rec_fini(&a);
        }
        CHECK(c->lab.policy.delay_lr != DP_DELAY_ADAPTIVE || scaled > 0); /* tau > 3 happened */
        CHECK(c->lab.optim.dc == DP_DC_OFF || marked > 100);
        s_case_replay(&k);
        char sum[340];
        snprintf(sum, sizeof sum, "%s/summary.json", k.out);
        uint8_t *text = NULL;
        size_t len = 0;
        if (dp_read_file(sum, &text, &len, err) == 0) {
            CHECK(strstr((char *)text, cases[i].rule) != NULL && strstr((char *)text, cases[i].dc) != NULL);
            free(text);
        }
    }
    CHECK(!s_case_same("delay", 0, 3)); /* the compensation moved the weights: case 3 is case 0 with it */
}

/* Top-k and sign, each with and without error feedback, recorded by the
 * simulator and replayed: the same bits (every virtual worker's residual
 * rebuilt from the record's header); the result names them; the chief's
 * bytes are its pushes times the encoding's exact size; error feedback
 * moved the weights. */
static void test_record_replay_compress(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    static const struct {
        const char *compress, *ef;
    } cases[] = {{"topk:0.05", "on"}, {"topk:0.05", "off"}, {"sign", "on"}, {"sign", "off"}};
    size_t n = s_tiny_floats();
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        s_case_t k;
        s_case_init(&k, "compress", i, 150);
        s_compress(&k.c, cases[i].compress, cases[i].ef);
        cJSON *r = s_case_sim(&k);
        if (!r) continue;
        CHECK_STR(s_str(r, "compress"), cases[i].compress);
        CHECK_STR(s_str(r, "error_feedback"), cases[i].ef);
        /* worker 0's pushes, each the encoding's exact size */
        double pushes = s_num(r, "bytes_pushed") / s_push_bytes(&k.c, n);
        CHECK(pushes >= 10 && pushes == floor(pushes));
        cJSON_Delete(r);
        s_case_replay(&k);
    }
    for (int i = 0; i < 4; i += 2) CHECK(!s_case_same("compress", i, i + 1)); /* error feedback on against off */
}

/* Local steps in the simulator, recorded and replayed to the same bits:
 * each push a round of H inner SGD steps per worker (inner state carried),
 * the servers' outer averaging or, async, the delayed Nesterov; the result
 * names them. */
static void test_record_replay_local_steps(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    static const struct {
        const char *outer, *inner;
        dp_mode_t mode;
    } cases[] = {{"sgd", "sgd", DP_MODE_ASYNC}, {"delayed-nesterov", "momentum", DP_MODE_ASYNC},
                 {"nesterov", "adam", DP_MODE_SYNC}};
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        s_case_t k;
        s_case_init(&k, "local", i, 30);
        s_local_steps(&k.c, cases[i].mode, cases[i].inner, cases[i].outer);
        CHECK_EQ(k.c.lab.optim.period, cases[i].mode == DP_MODE_ASYNC && i == 1 ? 3 : 0);
        cJSON *r = s_case_sim(&k);
        if (!r) continue;
        CHECK_EQ(s_num(r, "local_steps"), 4);
        CHECK_STR(s_str(r, "outer_optimizer"), cases[i].outer);
        CHECK_STR(s_str(r, "optimizer"), cases[i].inner);
        CHECK(i != 1 || s_num(r, "outer_momentum_every") == 3);
        cJSON_Delete(r);
        s_case_replay(&k);
    }
    /* a round is H steps: H = 4 moved the weights otherwise than H = 1 */
    CHECK(!s_case_same("local", 0, 1));
}

/* Local steps with compression in the simulator: each push is a round's
 * pseudo-gradient compressed once (error feedback's residual carried from
 * round to round), recorded and replayed to the same bits (the record's
 * header has the rounds and the codec); sync's 30 rounds cost worker 0
 * exactly 30 encodings; error feedback moved the weights. */
static void test_record_replay_local_compress(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    static const struct {
        const char *compress, *ef;
        dp_mode_t mode;
    } cases[] = {{"topk:0.05", "on", DP_MODE_ASYNC},
                 {"topk:0.05", "off", DP_MODE_ASYNC},
                 {"sign", "on", DP_MODE_SYNC},
                 {"sign", "off", DP_MODE_SYNC}};
    size_t n = s_tiny_floats();
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        s_case_t k;
        s_case_init(&k, "lz", i, 30);
        s_local_steps(&k.c, cases[i].mode, NULL, NULL); /* inner SGD; the servers' outer averaging at lr 1 */
        s_compress(&k.c, cases[i].compress, cases[i].ef);
        cJSON *r = s_case_sim(&k);
        if (!r) continue;
        CHECK_EQ(s_num(r, "local_steps"), 4);
        CHECK_STR(s_str(r, "compress"), cases[i].compress);
        CHECK_STR(s_str(r, "error_feedback"), cases[i].ef);
        double pushes = s_num(r, "bytes_pushed") / s_push_bytes(&k.c, n); /* worker 0's rounds */
        if (cases[i].mode == DP_MODE_SYNC) CHECK_EQ(pushes, 30); /* one a round, not one a step */
        else CHECK(pushes >= 5 && pushes == floor(pushes));
        cJSON_Delete(r);
        s_case_replay(&k);
    }
    for (int i = 0; i < 4; i += 2) CHECK(!s_case_same("lz", i, i + 1)); /* error feedback on against off */
}

/* One worker (no staleness): the update autocorrelation recovers the
 * explicit momentum, the check that the trajectory figure measures it. */
static void test_sim_momentum(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    dp_sim_conf_t c;
    double slow[16];
    s_conf(&c, slow, 1, "exp:10", 1500);
    c.lab.optim.kind = DP_OPT_MOMENTUM;
    c.lab.optim.momentum = 0.9f;
    c.diag_every = 100;
    cJSON *r = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_sim_run(&c, &r, err), 0);
    if (!r) return;
    CHECK_NEAR(s_num(r, "update_autocorrelation"), 0.9, 0.1);
    CHECK_NEAR(s_num(r, "momentum_effective"), 0.9, 1e-6);
    CHECK_EQ(s_num(r, "diag_samples"), 15);
    cJSON_Delete(r);
}

/* A record cut short, or with one byte changed, or none at all: one line. */
static void test_record_damaged(void)
{
    char path[300], bad[300], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/d.rec", s_dir);
    snprintf(bad, sizeof bad, "%s/bad.rec", s_dir);
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "model", TINY);
    dp_record_t *w = NULL;
    CHECK_EQ(dp_record_new(&w, path, h, err), 0);
    cJSON_Delete(h);
    struct stat st;
    CHECK(stat(path, &st) != 0); /* nothing at PATH until closed */
    dp_push_outcome_t o = {.status = DP_PUSH_APPLIED, .staleness = 2, .lr = 0.1f, .grad_norm = 1.0 / 3,
                           .update_norm = -1};
    dp_deal_batch_t dealt = {3, 7}; /* the last push carries a batch shard 0 dealt */
    for (int i = 0; i < 5; i++)
        dp_record_push(w, 0, i % 2, (uint64_t)i + 1, (uint64_t)i, &o, (uint64_t)i + 1, NULL,
                       i == 4 ? &dealt : NULL);
    CHECK_EQ(dp_record_close(&w, err), 0);
    dp_rec_t r;
    CHECK_EQ(dp_rec_load(&r, path, err), 0);
    CHECK_EQ(r.n, 5);
    if (r.n == 5) {
        CHECK_EQ(r.ev[3].dealt, 0);
        CHECK_EQ(r.ev[4].dealt, 1);
        CHECK_EQ(r.ev[4].batch.epoch, 3);
        CHECK_EQ(r.ev[4].batch.index, 7);
        CHECK(r.ev[4].grad_norm == 1.0 / 3); /* exact through the text */
        CHECK_EQ(r.ev[3].worker, 1);
        CHECK_EQ(r.ev[3].step, 4);
    }
    dp_rec_fini(&r);
    uint8_t *text = NULL;
    size_t len = 0;
    CHECK_EQ(dp_read_file(path, &text, &len, err), 0);
    CHECK_EQ(dp_write_file_atomic(bad, text, len - 30, err), 0); /* truncated */
    CHECK_EQ(dp_rec_load(&r, bad, err), -1);
    CHECK(strstr(err, "truncated") && strstr(err, "bad.rec") && !strchr(err, '\n'));
    text[len / 2] ^= 1; /* one bit flipped in an event */
    CHECK_EQ(dp_write_file_atomic(bad, text, len, err), 0);
    CHECK_EQ(dp_rec_load(&r, bad, err), -1);
    CHECK(strstr(err, "bad.rec") != NULL);
    CHECK_EQ(dp_rec_load(&r, "/nonexistent/x.rec", err), -1);
    free(text);
}

/* A sparse model's row events (server/core/record.h: "rpull", "rows") and the
 * header's row table read back as written; a bad row event or row conf is
 * one line. */
static void test_record_rows(void)
{
    char path[300], bad[300], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/rows.rec", s_dir);
    snprintf(bad, sizeof bad, "%s/rows-bad.rec", s_dir);
    dp_rows_conf_t rc, back;
    dp_rows_conf_default(&rc, 8, DP_ROW_FTRL);
    rc.optim.lr = 0.125f, rc.optim.l1 = 0.5f, rc.admit_after = 3, rc.evict_after = 1000;
    rc.init = DP_ROWS_INIT_UNIFORM, rc.init_scale = 0.01f, rc.seed = 18446744073709551615ull;
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "model", "embed:8 fc:2 softmax");
    cJSON_AddItemToObject(h, "rows", dp_record_rows_json(&rc, DP_MODE_ASYNC));
    dp_record_t *w = NULL;
    CHECK_EQ(dp_record_new(&w, path, h, err), 0);
    cJSON_Delete(h);
    float g[16] = {0.1f, 0.2f, 0.3f, -0.4f, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    dp_record_rows_pull(w, 1, 3, 7, 2);
    dp_record_rows_push(w, 1, 3, 4, 7, &(dp_push_outcome_t){.status = DP_PUSH_APPLIED, .staleness = 2}, 2,
                        (const char *)g, 8);
    dp_record_rows_push(w, 1, 3, 5, 9, &(dp_push_outcome_t){.status = DP_PUSH_REJECTED}, 1, NULL, 8);
    CHECK_EQ(dp_record_close(&w, err), 0);
    dp_rec_t r;
    CHECK_EQ(dp_rec_load(&r, path, err), 0);
    CHECK_EQ(r.n, 3);
    if (r.n == 3) {
        CHECK_EQ(r.ev[0].kind, DP_REC_ROWS_PULL);
        CHECK(r.ev[0].shard == 1 && r.ev[0].worker == 3 && r.ev[0].version == 7 && r.ev[0].keys == 2);
        CHECK_EQ(r.ev[1].kind, DP_REC_ROWS);
        CHECK(r.ev[1].step == 4 && r.ev[1].version == 7 && r.ev[1].staleness == 2 && r.ev[1].keys == 2);
        CHECK_EQ(r.ev[1].status, DP_PUSH_APPLIED);
        CHECK(r.ev[1].grad_norm == dp_record_rows_norm(g, 16)); /* 17 digits: exact */
        CHECK_EQ(r.ev[2].status, DP_PUSH_REJECTED);
        CHECK(r.ev[2].grad_norm == -1); /* a rejected push has no norm */
    }
    dp_mode_t mode = DP_MODE_SYNC;
    CHECK_EQ(dp_record_rows_parse(cJSON_GetObjectItemCaseSensitive(r.header, "rows"), &back, &mode, err), 0);
    CHECK_EQ(mode, DP_MODE_ASYNC);
    CHECK(back.width == 8 && back.optim.kind == DP_ROW_FTRL && back.optim.lr == 0.125f && back.optim.l1 == 0.5f);
    CHECK(back.admit_after == 3 && back.evict_after == 1000 && back.init == DP_ROWS_INIT_UNIFORM);
    CHECK(back.init_scale == 0.01f && back.seed == 18446744073709551615ull);
    cJSON *rows = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(r.header, "rows"), 1);
    cJSON_ReplaceItemInObjectCaseSensitive(rows, "width", cJSON_CreateNumber(0));
    CHECK_EQ(dp_record_rows_parse(rows, &back, &mode, err), -1);
    CHECK(strstr(err, "rows.width") && !strchr(err, '\n'));
    cJSON_ReplaceItemInObjectCaseSensitive(rows, "width", cJSON_CreateNumber(8));
    cJSON_ReplaceItemInObjectCaseSensitive(rows, "max_keys", cJSON_CreateNumber(-1));
    CHECK_EQ(dp_record_rows_parse(rows, &back, &mode, err), -1);
    CHECK(strstr(err, "rows.max_keys") != NULL);
    cJSON_Delete(rows);
    dp_rec_fini(&r);
    /* each line broken in one way, the footer re-hashed: refused, one line */
    const char *lines[] = {
        "{\"e\":\"rpull\",\"s\":0,\"w\":0,\"v\":1}",                 /* no n */
        "{\"e\":\"rows\",\"s\":0,\"w\":0,\"step\":1,\"v\":0,\"st\":\"applied\",\"stale\":0}", /* no n */
        "{\"e\":\"rows\",\"s\":0,\"w\":0,\"step\":1,\"v\":0,\"st\":\"kept\",\"stale\":0,\"n\":1}",
        "{\"e\":\"rows\",\"s\":0,\"w\":0,\"step\":1,\"v\":0,\"st\":\"applied\",\"stale\":0,\"n\":1,\"gn\":-1}",
        "{\"e\":\"rows\",\"s\":0,\"w\":0,\"step\":1,\"v\":-2,\"st\":\"applied\",\"stale\":0,\"n\":1}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        char text[512];
        int n = snprintf(text, sizeof text, "{\"downpour_record\":1}\n%s\n", lines[i]);
        uint64_t hash = dp_fnv1a(DP_FNV_SEED, text, (size_t)n);
        snprintf(text + n, sizeof text - (size_t)n,
                 "{\"end\":\"downpour_record\",\"events\":1,\"fnv1a\":\"%016" PRIx64 "\"}\n", hash);
        CHECK_EQ(dp_write_file_atomic(bad, text, strlen(text), err), 0);
        CHECK_EQ(dp_rec_load(&r, bad, err), -1);
        CHECK(strstr(err, "line 2 is not a record event") && !strchr(err, '\n'));
    }
}

/* A sparse run is told by its model as parsed (embed:D first, whatever the
 * spacing) or its data (libsvm:), not by text: only a sparse conf without
 * row tables (one neither a record nor sim's row flags gave) is refused,
 * in one line; a lab header carries the rows conf to a replay and back. */
static void test_lab_sparse_conf(void)
{
    const struct {
        const char *model, *data;
        int sparse;
    } cases[] = {
        {"embed:4 fc:2 softmax", NULL, 1},   {"  embed:4   softmax", NULL, 1},
        {"fc:2 softmax", NULL, 0},           {"fc:2 softmax", "libsvm:a.svm", 1},
        {"fc:16 relu fc:10 softmax", "fashion-mnist", 0},
        {"embed:0 softmax", NULL, 0}, /* not a model: the session says why */
    };
    char err[DP_ERR_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dp_lab_conf_t c;
        dp_lab_conf_default(&c);
        c.train.model = cases[i].model;
        c.train.data = cases[i].data;
        CHECK_EQ(dp_lab_is_sparse(&c), cases[i].sparse);
        err[0] = 0;
        CHECK_EQ(dp_lab_check_dense(&c, err), cases[i].sparse ? -1 : 0);
        if (cases[i].sparse) CHECK(strstr(err, "embed:D") && !strchr(err, '\n'));
        c.has_rows = 1; /* a record's: replay runs it */
        CHECK_EQ(dp_lab_check_dense(&c, err), 0);
    }
    dp_lab_conf_t c, back;
    dp_lab_conf_default(&c);
    c.train.model = "embed:4 fc:2 softmax";
    c.mode = DP_MODE_SYNC;
    c.has_rows = 1;
    dp_rows_conf_default(&c.rows, 4, DP_ROW_ADAGRAD);
    c.rows.optim.lr = 0.25f;
    c.rows_mode = DP_MODE_ASYNC;
    cJSON *h = dp_lab_conf_header(&c);
    dp_lab_conf_default(&back);
    CHECK_EQ(dp_lab_conf_from_header(&back, h, err), 0);
    CHECK(back.has_rows && back.rows.width == 4 && back.rows.optim.lr == 0.25f);
    CHECK_EQ(back.rows_mode, DP_MODE_ASYNC);
    CHECK_EQ(back.mode, DP_MODE_SYNC);
    cJSON_Delete(h);
}

/* A record is written through a fresh O_EXCL temporary file: a symlink
 * planted at the name the writer used to take (PATH.tmp) is not followed,
 * so the file it points to is not overwritten. A failing write (a full
 * disk, DP_TEST_WRITE_FAIL) is reported at close and leaves nothing. */
static void test_record_tmp_is_safe(void)
{
    char path[300], tmp[310], victim[300], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/s.rec", s_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(victim, sizeof victim, "%s/victim", s_dir);
    CHECK_EQ(dp_write_file_atomic(victim, "precious\n", 9, err), 0);
    CHECK_EQ(symlink(victim, tmp), 0);
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "model", TINY);
    dp_record_t *w = NULL;
    CHECK_EQ(dp_record_new(&w, path, h, err), 0);
    dp_push_outcome_t o = {.status = DP_PUSH_APPLIED, .lr = 0.1f, .grad_norm = 1, .update_norm = 1};
    for (int i = 0; i < 3; i++) dp_record_push(w, 0, 0, (uint64_t)i + 1, (uint64_t)i, &o, (uint64_t)i + 1, NULL, NULL);
    CHECK_EQ(dp_record_close(&w, err), 0);
    uint8_t *text = NULL;
    size_t len = 0;
    CHECK_EQ(dp_read_file(victim, &text, &len, err), 0);
    CHECK(text && len == 9 && memcmp(text, "precious\n", 9) == 0);
    free(text);
    struct stat st;
    CHECK(lstat(tmp, &st) == 0 && S_ISLNK(st.st_mode)); /* left as it was */
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
    dp_rec_t r;
    CHECK_EQ(dp_rec_load(&r, path, err), 0);
    CHECK_EQ(r.n, 3);
    dp_rec_fini(&r);
    unlink(tmp);
    /* a write that fails: close says so, nothing at PATH nor beside it */
    char path2[300];
    snprintf(path2, sizeof path2, "%s/full.rec", s_dir);
    setenv("DP_TEST_WRITE_FAIL", "full.rec", 1);
    CHECK_EQ(dp_record_new(&w, path2, h, err), 0);
    dp_record_push(w, 0, 0, 1, 0, &o, 1, NULL, NULL);
    CHECK_EQ(dp_record_close(&w, err), -1);
    unsetenv("DP_TEST_WRITE_FAIL");
    fprintf(stderr, "  (expected) %s\n", err);
    CHECK(strstr(err, "full.rec: write failed: No space left on device") != NULL);
    CHECK(stat(path2, &st) != 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q full.rec", s_dir);
    CHECK(system(cmd) != 0); /* grep found none */
    cJSON_Delete(h);
}

/* `downpour replay FILE --out DIR` in a child, stderr to errpath; its exit
 * status (128 + a signal that killed it) and stderr's text (malloc'd). */
static int s_replay_child(const char *rec, const char *out, const char *errpath, char **text)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        char *argv[] = {"replay", (char *)rec, "--out", (char *)out, NULL};
        _exit(dp_replay_main(4, argv));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    uint8_t *b = NULL;
    size_t len = 0;
    char err[DP_ERR_LEN];
    *text = dp_read_file(errpath, &b, &len, err) == 0 ? (char *)b : dp_strdup("");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A record of header h alone (taken) at rec: `downpour replay` refuses
 * it with status 1 and one line holding want. */
static void s_replay_refuses(const char *rec, const char *out, const char *errp, cJSON *h,
                             const char *want)
{
    char err[DP_ERR_LEN] = "";
    dp_record_t *w = NULL;
    CHECK_EQ(dp_record_new(&w, rec, h, err), 0);
    cJSON_Delete(h);
    CHECK_EQ(dp_record_close(&w, err), 0);
    char *text = NULL;
    int rc = s_replay_child(rec, out, errp, &text);
    fprintf(stderr, "  (expected) status %d: %s", rc, text);
    CHECK_EQ(rc, 1);
    int lines = 0;
    for (const char *c = text; *c; c++) lines += *c == '\n';
    CHECK_EQ(lines, 1);
    CHECK(strstr(text, want) != NULL);
    free(text);
}

/* A record's header is untrusted: replay takes the model and the sizes
 * from it. A model of 2^62 floats (its n_floats * 4 wraps to 0) and a
 * batch of 2^40 are one line and exit status 1. */
static void test_replay_refuses_absurd_header(void)
{
    char rec[300], out[300], errp[300], img[300], lab[300], data[700], err[DP_ERR_LEN] = "";
    snprintf(rec, sizeof rec, "%s/absurd.rec", s_dir);
    snprintf(out, sizeof out, "%s/absurd-out", s_dir);
    snprintf(errp, sizeof errp, "%s/absurd.err", s_dir);
    snprintf(img, sizeof img, "%s/absurd-img", s_dir);
    snprintf(lab, sizeof lab, "%s/absurd-lab", s_dir);
    uint8_t im[16 + 784] = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28};
    uint8_t lb[9] = {0, 0, 8, 1, 0, 0, 0, 1, 1};
    CHECK_EQ(dp_write_file_atomic(img, im, sizeof im, err), 0);
    CHECK_EQ(dp_write_file_atomic(lab, lb, sizeof lb, err), 0);
    snprintf(data, sizeof data, "idx:%s,%s,2", img, lab); /* 2 classes, as fc:2 */
    static const struct {
        const char *model;
        double batch;
        const char *want;
    } cases[] = {
        /* 21 + 21 + 2928831 * 21 + ... + 2 * 2147483647 + 2 = 2^62 floats */
        {"conv1x1:21 maxpool28 conv1x1:2928831 conv1x1:2144558803 conv1x1:2147483647 fc:2 softmax",
         4, "downpour replay: model spec: 'conv1x1:2144558803' makes conv3.weight too large"},
        {TINY, 1099511627776.0,
         "downpour replay: record header: 'batch' is not a whole number in 1..65536"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *h = cJSON_CreateObject();
        cJSON_AddStringToObject(h, "model", cases[i].model);
        cJSON_AddStringToObject(h, "data", data);
        cJSON_AddStringToObject(h, "seed", "1");
        cJSON_AddStringToObject(h, "mode", "async");
        cJSON_AddNumberToObject(h, "batch", cases[i].batch);
        s_replay_refuses(rec, out, errp, h, cases[i].want);
    }
}

/* A sparse run's header is untrusted too: without the row tables' conf
 * (a record from before row events), rows of another width than the
 * model's embedding, a model of other than 2 classes, or data that is not
 * there: one line each, status 1. */
static void test_replay_refuses_sparse_header(void)
{
    char rec[300], out[300], errp[300], train[300], data[700], err[DP_ERR_LEN] = "";
    snprintf(rec, sizeof rec, "%s/sparse.rec", s_dir);
    snprintf(out, sizeof out, "%s/sparse-out", s_dir);
    snprintf(errp, sizeof errp, "%s/sparse.err", s_dir);
    snprintf(train, sizeof train, "%s/sparse-train.svm", s_dir);
    const char svm[] = "1 3:1 7:0.5\n0 2:1\n1 7:2\n0 3:1 9:1\n";
    CHECK_EQ(dp_write_file_atomic(train, svm, strlen(svm), err), 0);
    snprintf(data, sizeof data, "libsvm:%s", train);
    static const struct {
        const char *model, *data; /* data NULL: the file above */
        int width;                /* the rows conf's; 0: none in the header */
        const char *want;
    } cases[] = {
        {"embed:4 fc:2 softmax", NULL, 0, "a model with embed:D but no \"rows\""},
        {"embed:4 fc:2 softmax", NULL, 8, "embeds in 4 floats but the row tables' rows are 8 wide"},
        {"embed:4 fc:3 softmax", NULL, 4, "ends in 3 classes"},
        {"embed:4 fc:2 softmax", "libsvm:/nonexistent/t.svm", 4, "/nonexistent/t.svm"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *h = cJSON_CreateObject();
        cJSON_AddStringToObject(h, "model", cases[i].model);
        cJSON_AddStringToObject(h, "data", cases[i].data ? cases[i].data : data);
        cJSON_AddStringToObject(h, "seed", "1");
        cJSON_AddStringToObject(h, "mode", "async");
        cJSON_AddNumberToObject(h, "workers", 2);
        cJSON_AddNumberToObject(h, "shards", 2);
        cJSON_AddNumberToObject(h, "batch", 2);
        if (cases[i].width) {
            dp_rows_conf_t rc;
            dp_rows_conf_default(&rc, cases[i].width, DP_ROW_ADAGRAD);
            cJSON_AddItemToObject(h, "rows", dp_record_rows_json(&rc, DP_MODE_ASYNC));
        }
        s_replay_refuses(rec, out, errp, h, cases[i].want);
    }
}

/* The header's optimizer: what the writer wrote reads back exact; a number
 * its field cannot hold (1e300 as a long step count, beyond FLT_MAX as a
 * float) is refused with the field's name, never cast (undefined behaviour;
 * found by fuzz_record under UBSan). */
static void test_record_optim_out_of_range(void)
{
    dp_optim_conf_t in, out;
    dp_optim_conf_default(&in);
    CHECK_EQ(dp_optim_parse_kind(&in, "momentum", NULL), 0);
    in.lr = 0.05f;
    in.schedule = DP_LR_STEP;
    in.step_size = 1000;
    in.gamma = 0.5f;
    char err[DP_ERR_LEN] = "";
    cJSON *j = dp_record_optim_json(&in);
    CHECK_EQ(dp_record_optim_parse(j, &out, err), 0);
    CHECK(out.kind == in.kind && out.lr == in.lr && out.momentum == in.momentum && out.step_size == 1000 &&
          out.gamma == in.gamma && out.schedule == DP_LR_STEP);
    static const struct {
        const char *key, *value;
    } bad[] = {
        {"step_size", "1e300"}, {"total_steps", "1e300"}, {"step_size", "-1"}, {"step_size", "2.5"},
        {"lr", "1e39"},         {"gamma", "-1e300"},      {"lr", "\"fast\""},   {"schedule", "7"},
        {"alpha", "1e39"},      {"alpha", "\"0.99\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *k = cJSON_Duplicate(j, 1);
        cJSON_ReplaceItemInObjectCaseSensitive(k, bad[i].key, cJSON_Parse(bad[i].value));
        err[0] = 0;
        CHECK_EQ(dp_record_optim_parse(k, &out, err), -1);
        CHECK(strncmp(err, "record header: ", 15) == 0 && (strstr(err, bad[i].key) || strstr(err, "schedule")));
        if (!strstr(err, bad[i].key)) fprintf(stderr, "  %s = %s: \"%s\"\n", bad[i].key, bad[i].value, err);
        cJSON_Delete(k);
    }
    cJSON_Delete(j);
}

/* SGD: the update is lr times the gradient, and the norms say so. */
static void test_measured_step(void)
{
    dp_model_t m;
    dp_shard_t s;
    dp_members_t mem;
    dp_policy_t *p = NULL;
    char err[DP_ERR_LEN] = "";
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    o.kind = DP_OPT_SGD;
    o.lr = 0.5f;
    CHECK_EQ(dp_model_parse(&m, TINY, 1, 4, 4, err), 0);
    CHECK_EQ(dp_shard_init(&s, &m, 0, 1, 3, &o, err), 0);
    dp_members_init(&mem, 2, 0, 0, 0.0);
    dp_policy_conf_t pc = {.replicas = 1, .staleness = 0, .delay_lr = DP_DELAY_INVERSE, .delay_k = 0};
    CHECK_EQ(dp_policy_new(&p, &dp_policy_async, &pc, &s, &mem, err), 0);
    float *g = dp_malloc(s.n * sizeof(float));
    for (size_t i = 0; i < s.n; i++) g[i] = (i % 2) ? 3.0f : -4.0f;
    dp_grad_slice_t gs = {g, s.n * sizeof(float), 0};
    dp_push_outcome_t out;
    dp_policy_push(p, 0, 0, &gs, 1, false, &out);
    CHECK_NEAR(out.grad_norm, -1, 0); /* not measuring yet */
    dp_policy_measure(p);
    dp_policy_push(p, 1, 0, &gs, 1, false, &out); /* staleness 1 */
    dp_policy_push(p, 0, 0, &gs, 1, false, &out); /* staleness 2: lr / 2 */
    CHECK_EQ(out.staleness, 2);
    CHECK_NEAR(out.lr, 0.25, 1e-7);
    double gn = sqrt((double)(s.n / 2) * 9 + (double)(s.n - s.n / 2) * 16);
    CHECK_NEAR(out.grad_norm, gn, 1e-9 * gn);
    CHECK_NEAR(out.update_norm, 0.25 * gn, 1e-5 * gn);
    CHECK_EQ(p->staleness.total, 3);
    CHECK_EQ(p->staleness.count[1], 1);
    free(g);
    dp_policy_destroy(&p);
    dp_members_fini(&mem);
    dp_shard_fini(&s);
}

/* An actor-critic push's account (dp_record_account): written with the
 * next push only, read back exact (the returns' sum to the bit); a push
 * without one reads back without. The RL flags of a header read back, and
 * one out of its flag's range is refused with its name. */
static void test_record_account(void)
{
    char path[300], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/acct.rec", s_dir);
    dp_lab_conf_t c;
    dp_lab_conf_default(&c);
    dp_a3c_conf_default(&c.train.a3c);
    c.train.a3c.env = "acrobot-v1";
    c.train.a3c.envs = 3;
    c.train.a3c.t_max = 7;
    c.train.a3c.gamma = 0.97f;
    c.train.a3c.entropy = 0.03f;
    c.train.a3c.clip_norm = 0.5f;
    c.train.a3c.env_steps = 123457;
    c.train.model = TINY;
    cJSON *h = dp_lab_conf_header(&c);
    dp_record_t *w = NULL;
    CHECK_EQ(dp_record_new(&w, path, h, err), 0);
    dp_push_outcome_t o = {.status = DP_PUSH_APPLIED, .lr = 0.1f, .grad_norm = 1, .update_norm = 1};
    double sum = 0.1 + 0.2 + 1.0 / 3;
    dp_record_account(w, 21, 3, sum);
    dp_record_push(w, 0, 0, 1, 0, &o, 1, NULL, NULL);
    dp_record_push(w, 0, 1, 1, 1, &o, 2, NULL, NULL); /* no account given: none written */
    CHECK_EQ(dp_record_close(&w, err), 0);
    dp_rec_t r;
    CHECK_EQ(dp_rec_load(&r, path, err), 0);
    CHECK_EQ(r.n, 2);
    if (r.n == 2) {
        CHECK_EQ(r.ev[0].account, 1);
        CHECK_EQ(r.ev[0].env_steps, 21);
        CHECK_EQ(r.ev[0].episodes, 3);
        CHECK(r.ev[0].returns == sum);
        CHECK_EQ(r.ev[1].account, 0);
    }
    dp_lab_conf_t back;
    dp_lab_conf_default(&back);
    CHECK_EQ(dp_lab_conf_from_header(&back, r.header, err), 0);
    CHECK(back.train.a3c.env && strcmp(back.train.a3c.env, "acrobot-v1") == 0);
    CHECK_EQ(back.train.a3c.envs, 3);
    CHECK_EQ(back.train.a3c.t_max, 7);
    CHECK(back.train.a3c.gamma == 0.97f && back.train.a3c.entropy == 0.03f && back.train.a3c.clip_norm == 0.5f);
    CHECK_EQ(back.train.a3c.env_steps, 123457);
    static const struct {
        const char *key, *value, *want;
    } bad[] = {{"t_max", "0", "'t_max'"}, {"envs", "1e9", "'envs'"}, {"gamma", "2", "'gamma'"},
               {"env", "7", "'env'"}, {"env_steps", "0.5", "'env_steps'"}, {"entropy", "\"x\"", "'entropy'"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *hb = cJSON_Duplicate(r.header, 1);
        cJSON_ReplaceItemInObjectCaseSensitive(hb, bad[i].key, cJSON_Parse(bad[i].value));
        dp_lab_conf_default(&back);
        err[0] = 0;
        CHECK_EQ(dp_lab_conf_from_header(&back, hb, err), -1);
        CHECK(strstr(err, bad[i].want) != NULL);
        cJSON_Delete(hb);
    }
    dp_rec_fini(&r);
    cJSON_Delete(h);
}

/* An actor-critic record's header is untrusted too: workers, envs and
 * t_max each in range but together terabytes of rollouts, or an unknown
 * environment, are refused with one line before anything is allocated. */
static void test_replay_refuses_absurd_rl_header(void)
{
    char rec[300], out[300], errp[300];
    snprintf(rec, sizeof rec, "%s/absurd-rl.rec", s_dir);
    snprintf(out, sizeof out, "%s/absurd-rl-out", s_dir);
    snprintf(errp, sizeof errp, "%s/absurd-rl.err", s_dir);
    static const struct {
        const char *env;
        double workers;
        const char *want;
    } cases[] = {
        {"cartpole-v1", 100000, "downpour replay: --env: 100000 workers x 1024 environments x 10000 steps"},
        {"pong", 1, "downpour replay: --env 'pong': no such environment"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *h = cJSON_CreateObject();
        cJSON_AddStringToObject(h, "model", "fc:8 tanh ac:2");
        cJSON_AddStringToObject(h, "seed", "1");
        cJSON_AddStringToObject(h, "mode", "async");
        cJSON_AddNumberToObject(h, "workers", cases[i].workers);
        cJSON_AddStringToObject(h, "env", cases[i].env);
        cJSON_AddNumberToObject(h, "envs", 1024);
        cJSON_AddNumberToObject(h, "t_max", 10000);
        s_replay_refuses(rec, out, errp, h, cases[i].want);
    }
}

static int s_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void s_cleanup(void)
{
    nftw(s_dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
}

static void s_setup(void) __attribute__((constructor));
static void s_setup(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/test_lab.%d", (int)getpid());
    mkdir(s_dir, 0755);
    atexit(s_cleanup);
}

DP_TESTS(T(test_sim_exponential), T(test_sim_constant), T(test_sim_momentum), T(test_record_replay),
         T(test_record_replay_bn),
         T(test_record_replay_rmsprop), T(test_record_replay_delay), T(test_record_replay_compress),
         T(test_record_replay_local_steps), T(test_record_replay_local_compress), T(test_record_damaged), T(test_record_rows),
         T(test_lab_sparse_conf), T(test_replay_refuses_sparse_header),
         T(test_measured_step), T(test_record_tmp_is_safe),
         T(test_replay_refuses_absurd_header), T(test_record_optim_out_of_range), T(test_record_account),
         T(test_replay_refuses_absurd_rl_header))
