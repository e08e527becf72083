/* test_dylu: asynchronous local steps that hold up (Liu et al. 2024,
 * arXiv 2401.09135) — Dynamic Local Updates (common/dylu.h: the rule, the
 * crew's table, --local-steps auto's parsing and its refusals), the
 * simulator giving its faster workers more local steps by their
 * simulated compute times, and records of the new rules (plain nesterov
 * and delayed-nesterov in async, --local-steps auto) replayed bit for bit;
 * a record whose rounds do not say their steps refused.
 *
 * The simulations are test_lab's: a tiny model (fc:10 on Fashion-MNIST,
 * batch 4), 3 workers; constant compute times make every H known ahead. */
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dylu.h"
#include "common/util.h"
#include "deploy/lab/sim.h"
#include "deploy/launcher/commands.h"
#include "server/args.h"
#include "server/core/record.h"
#include "tests/test.h"

#define TINY "fc:10 softmax"

static char s_dir[256];

static int s_have_data(void)
{
    return access(DP_FASHION_MNIST_DIR, R_OK) == 0;
}

/* The rule: the fastest H, the others in proportion to their speed, at
 * least 1, H while a time is unknown; the EWMA; the crew's table ignores
 * a time out of range and forgets a worker that left. */
static void test_rule(void)
{
    CHECK_EQ(dp_dylu_steps(8, 10, 10), 8);
    CHECK_EQ(dp_dylu_steps(8, 20, 10), 4);
    CHECK_EQ(dp_dylu_steps(8, 40, 10), 2);
    CHECK_EQ(dp_dylu_steps(8, 30, 10), 2);    /* floor(8/3) */
    CHECK_EQ(dp_dylu_steps(8, 1000, 10), 1);  /* at least one step */
    CHECK_EQ(dp_dylu_steps(8, 5, 10), 8);     /* never above H */
    CHECK_EQ(dp_dylu_steps(4, 0.7, (float)0.7), 4); /* its own time, back as a float (0.69999999): H */
    CHECK_EQ(dp_dylu_steps(1000000, 20, 10), 500000);
    CHECK_EQ(dp_dylu_steps(8, 0, 10), 8);     /* its own time not known yet */
    CHECK_EQ(dp_dylu_steps(8, 10, 0), 8);     /* nor the crew's */
    CHECK(dp_dylu_ewma(0, 12) == 12);
    CHECK(dp_dylu_ewma(10, 20) == 10 * (1 - DP_DYLU_EWMA) + 20 * DP_DYLU_EWMA);
    dp_dylu_crew_t c;
    dp_dylu_crew_init(&c, 3);
    CHECK(dp_dylu_fastest(&c) == 0);
    dp_dylu_report(&c, 0, 30);
    dp_dylu_report(&c, 2, 12);
    dp_dylu_report(&c, 1, 1e-9);  /* out of range: ignored */
    dp_dylu_report(&c, 1, NAN);
    dp_dylu_report(&c, 7, 1);     /* no such worker */
    dp_dylu_report(&c, -1, 1);
    CHECK(dp_dylu_fastest(&c) == 12);
    dp_dylu_forget(&c, 2);
    CHECK(dp_dylu_fastest(&c) == 30);
    dp_dylu_crew_fini(&c);
}

/* --local-steps TEXT: H, auto, auto:H; every other text one line. */
static void test_parse(void)
{
    long H = 0;
    int dylu = -1;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_dylu_parse("4", &H, &dylu, err), 0);
    CHECK(H == 4 && dylu == 0);
    CHECK_EQ(dp_dylu_parse("auto", &H, &dylu, err), 0);
    CHECK(H == DP_DYLU_BASE && dylu == 1);
    CHECK_EQ(dp_dylu_parse("auto:16", &H, &dylu, err), 0);
    CHECK(H == 16 && dylu == 1);
    static const char *const bad[] = {"0", "auto:1", "auto:", "auto:x", "autox", "auto16", "-3",
                                      "1000001", "", "auto:1000001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        H = 99;
        err[0] = 0;
        CHECK_EQ(dp_dylu_parse(bad[i], &H, &dylu, err), -1);
        CHECK(strstr(err, "--local-steps '") == err && !strchr(err, '\n'));
        CHECK_EQ(H, 99);
    }
}

/* 3 workers, constant compute times x1, x2, x4: H = 4 (or auto's base)
 * local steps of inner SGD, the outer optimizer OUTER, MODE, U updates;
 * recorded to TAG.rec, the model to TAG/. */
static void s_conf(dp_sim_conf_t *c, double *slow, const char *outer, dp_mode_t mode, int dylu,
                   const char *tag, uint64_t updates, char *rec, size_t rec_n)
{
    memset(c, 0, sizeof *c);
    dp_lab_conf_default(&c->lab);
    c->lab.train.model = TINY;
    c->lab.train.batch = 4;
    c->lab.workers = 3;
    c->lab.mode = mode;
    c->lab.optim.kind = DP_OPT_SGD;
    c->lab.optim.lr = 0.05f;
    c->lab.inner = c->lab.optim;
    c->lab.local_steps = dylu ? DP_DYLU_BASE : 4;
    c->lab.dylu = dylu;
    slow[0] = 1, slow[1] = 2, slow[2] = 4;
    c->slow = slow;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_dist_parse(&c->compute, "const:10", err), 0);
    c->updates = updates;
    dp_ps_config_t ps;
    dp_ps_config_default(&ps);
    snprintf(ps.outer_optimizer, sizeof ps.outer_optimizer, "%s", outer);
    ps.mode = mode;
    ps.num_workers = 3;
    CHECK_EQ(dp_ps_outer_optim(&ps, &c->lab.optim, err), 0);
    snprintf(rec, rec_n, "%s/%s.rec", s_dir, tag);
    c->lab.record = rec;
}

static double s_num(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
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

/* Simulate c (its model into TAG.safetensors), then replay its record into
 * TAG-replay/: the same bits. The simulation's result (the caller's). */
static cJSON *s_sim_and_replay(dp_sim_conf_t *c, const char *tag)
{
    char model[300], out[300], replayed[340];
    snprintf(model, sizeof model, "%s/%s.safetensors", s_dir, tag);
    snprintf(out, sizeof out, "%s/%s-replay", s_dir, tag);
    snprintf(replayed, sizeof replayed, "%s/model.safetensors", out);
    c->lab.train.save = model;
    cJSON *r = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_sim_run(c, &r, err), 0);
    if (!r) {
        fprintf(stderr, "  %s\n", err);
        return NULL;
    }
    char *av[] = {"replay", (char *)c->lab.record, "--out", out, NULL};
    CHECK_EQ(dp_replay_main(4, av), 0);
    CHECK(s_same_file(model, replayed));
    return r;
}

/* The simulator's DyLU: with compute times 10, 20, 40 ms a step, the
 * fastest worker's every round is auto's H = 8, the others' 4 and 2 after
 * their first (8: no time known yet), so their mean H over R rounds is
 * (8 + 4 (R - 1)) / R and (8 + 2 (R - 1)) / R; the result says so, and
 * the record (each push's "h") replays to the same bits, in async with
 * delayed-nesterov and in sync. */
static void test_sim_auto(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    static const struct {
        const char *outer;
        dp_mode_t mode;
    } cases[] = {{"delayed-nesterov", DP_MODE_ASYNC}, {"nesterov", DP_MODE_SYNC}};
    for (int i = 0; i < 2; i++) {
        dp_sim_conf_t c;
        double slow[3];
        char rec[300], tag[32];
        snprintf(tag, sizeof tag, "auto%d", i);
        s_conf(&c, slow, cases[i].outer, cases[i].mode, 1, tag, 42, rec, sizeof rec);
        cJSON *r = s_sim_and_replay(&c, tag);
        if (!r) continue;
        CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "local_steps_auto")));
        CHECK_EQ(s_num(r, "local_steps"), DP_DYLU_BASE);
        const cJSON *hs = cJSON_GetObjectItemCaseSensitive(r, "local_steps_mean");
        CHECK_EQ(cJSON_GetArraySize(hs), 3);
        double h[3];
        for (int w = 0; w < 3; w++) h[w] = cJSON_GetNumberValue(cJSON_GetArrayItem(hs, w));
        fprintf(stderr, "  %s %s: mean H per worker %g %g %g\n", dp_mode_name(cases[i].mode),
                cases[i].outer, h[0], h[1], h[2]);
        CHECK(h[0] == 8); /* the fastest: the base H every round */
        CHECK(h[1] > h[2] && h[1] < 8 && h[2] < 8); /* the faster, the more local steps */
        CHECK(h[1] >= 4 && h[2] >= 2);
        if (cases[i].mode == DP_MODE_SYNC) { /* 42 rounds each: (8 + 41 h) / 42 */
            CHECK_NEAR(h[1], (8 + 41 * 4) / 42.0, 0.01); /* the result rounds it */
            CHECK_NEAR(h[2], (8 + 41 * 2) / 42.0, 0.01);
        }
        cJSON_Delete(r);
    }
}

/* The outer rules as the servers now name them, each recorded and
 * replayed bit for bit in async: plain nesterov (the momentum on every
 * push: no period) and delayed-nesterov (once per 3 pushes, the crew's
 * size), fixed H = 4; the two are different runs. */
static void test_replay_outer_rules(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    static const char *const outer[] = {"nesterov", "delayed-nesterov"};
    char model[2][300];
    for (int i = 0; i < 2; i++) {
        dp_sim_conf_t c;
        double slow[3];
        char rec[300], tag[32];
        snprintf(tag, sizeof tag, "outer%d", i);
        s_conf(&c, slow, outer[i], DP_MODE_ASYNC, 0, tag, 30, rec, sizeof rec);
        CHECK_EQ(c.lab.optim.period, i ? 3 : 0);
        cJSON *r = s_sim_and_replay(&c, tag);
        snprintf(model[i], sizeof model[i], "%s/%s.safetensors", s_dir, tag);
        if (!r) continue;
        CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "outer_optimizer")), outer[i]);
        CHECK(i == 0 ? !cJSON_GetObjectItemCaseSensitive(r, "outer_momentum_every")
                     : s_num(r, "outer_momentum_every") == 3);
        cJSON_Delete(r);
    }
    CHECK(!s_same_file(model[0], model[1]));
}

/* A record of --local-steps auto whose push lost its "h", and one whose
 * header lost "local_steps_auto" (its pushes keep "h"), each rewritten
 * whole (a valid footer), are refused with one line: the rounds' data
 * cannot be known. */
static void s_rewrite(const dp_rec_t *good, const char *path, int drop_h, int drop_auto)
{
    cJSON *h = cJSON_Duplicate(good->header, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(h, "downpour_record");
    if (drop_auto) cJSON_DeleteItemFromObjectCaseSensitive(h, "local_steps_auto");
    dp_record_t *w = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_record_new(&w, path, h, err), 0);
    int dropped = 0;
    for (size_t i = 0; i < good->n; i++) {
        dp_rec_event_t e = good->ev[i];
        if (drop_h && e.kind == DP_REC_PUSH && e.h && !dropped++) e.h = 0;
        dp_record_event(w, &e);
    }
    CHECK_EQ(dp_record_close(&w, err), 0);
    cJSON_Delete(h);
}

static void test_replay_refuses_missing_h(void)
{
    if (!s_have_data()) SKIP(DP_FASHION_MNIST_DIR " not installed (dataset-fashion-mnist)");
    dp_sim_conf_t c;
    double slow[3];
    char rec[300], bad[340], out[340];
    s_conf(&c, slow, "sgd", DP_MODE_ASYNC, 1, "noh", 6, rec, sizeof rec);
    cJSON *r = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_sim_run(&c, &r, err), 0);
    cJSON_Delete(r);
    dp_rec_t good;
    CHECK_EQ(dp_rec_load(&good, rec, err), 0);
    for (int k = 0; k < 3; k++) {
        snprintf(bad, sizeof bad, "%s/noh-bad%d.rec", s_dir, k);
        s_rewrite(&good, bad, k == 1, k == 2); /* k = 0: rewritten as it was, the control */
        snprintf(out, sizeof out, "%s/noh-replay%d", s_dir, k);
        char *av[] = {"replay", bad, "--out", out, NULL};
        CHECK_EQ(dp_replay_main(4, av), k == 0 ? 0 : 1);
    }
    dp_rec_fini(&good);
}

static int s_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void s_cleanup(void)
{
    nftw(s_dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
}

static void s_setup(void) __attribute__((constructor));
static void s_setup(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/test_dylu.%d", (int)getpid());
    mkdir(s_dir, 0755);
    atexit(s_cleanup);
}

DP_TESTS(T(test_rule), T(test_parse), T(test_sim_auto), T(test_replay_outer_rules),
         T(test_replay_refuses_missing_h))
