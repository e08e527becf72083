/* test_checkpoint_run: a checkpoint directory belongs to one run
 * (server/core/shard_checkpoint.h) — the same run restarted restores, another
 * run or a finished one is refused unless resumed, a corrupted tensor fails
 * its CRC, a crash between write and rename leaves the previous checkpoint
 * loadable, a file of another model, range or optimizer is refused naming
 * what differs; and the run id the flags imply (dp_ps_config_run_id). A server
 * (tests/ps_harness.h) writes its version 0 at a fresh start, removes the
 * temporary files an interrupted checkpoint of its own left, and says a
 * failing checkpoint loudly: counted in its metrics, its stop line and its
 * final error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "common/util.h"
#include "server/args.h"
#include "server/core/policy.h"
#include "server/core/shard.h"
#include "server/core/shard_checkpoint.h"
#include "server/core/shard_dc.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define SPEC "fc:6 softmax"

static char s_dir[256], s_path[512];

/* A fresh directory for the checkpoint of shard 0/1. */
static void s_fresh_dir(const char *tag)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/dp-test-ckrun-%s-%d", tag, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system(cmd) != 0 || mkdir(s_dir, 0755) != 0) fprintf(stderr, "  cannot make %s\n", s_dir);
    dp_shard_checkpoint_path(s_path, sizeof s_path, s_dir, 0, 1);
}

static void s_rm_dir(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system(cmd) != 0) fprintf(stderr, "  cannot remove %s\n", s_dir);
}

/* Shard index of count of model spec (input 1x4x4) with optimizer kind,
 * initialised from seed; its optimizer state filled with known values. */
static int s_shard_of(dp_shard_t *s, const char *spec, int index, int count, dp_optim_kind_t kind,
                      uint64_t seed)
{
    char err[DP_ERR_LEN];
    dp_model_t m;
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    o.kind = kind;
    memset(s, 0, sizeof *s);
    if (dp_model_parse(&m, spec, 1, 4, 4, err) != 0 || dp_shard_init(s, &m, index, count, seed, &o, err) != 0) {
        fprintf(stderr, "  shard: %s\n", err);
        return -1;
    }
    for (size_t i = 0; i < s->n * (size_t)s->state_per; i++) s->state[i] = 0.001f * (float)i;
    return 0;
}

/* An adam shard, the only one of the small model. */
static int s_shard(dp_shard_t *s, uint64_t seed)
{
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    return s_shard_of(s, SPEC, 0, 1, o.kind, seed);
}

static dp_ckpt_run_t s_run(const char *id, int resume, int finished)
{
    dp_ckpt_run_t r = {.resume = resume, .finished = finished};
    snprintf(r.id, sizeof r.id, "%s", id);
    return r;
}

/* Same run id, not finished: a restart restores weights, state, version. */
static void test_same_run_restores(void)
{
    s_fresh_dir("same");
    dp_shard_t a, b;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(s_shard(&a, 1), 0);
    CHECK_EQ(s_shard(&b, 2), 0);
    a.version = 42;
    dp_ckpt_run_t run = s_run("run-a", 0, 0);
    CHECK_EQ(dp_shard_checkpoint_write(&a, s_path, &run, err), 0);
    CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &run, err), DP_CKPT_RESTORED);
    CHECK_EQ(b.version, 42);
    CHECK_CLOSE("params", b.w, a.w, a.n, 0, 0);
    CHECK_CLOSE("state", b.state, a.state, a.n * (size_t)a.state_per, 0, 0);
    dp_shard_fini(&a);
    dp_shard_fini(&b);
    s_rm_dir();
}

/* RMSProp's square average is the checkpoint's optim.state: a shard
 * stepped 3 times, checkpointed and restored into a fresh one, then both
 * stepped twice more, hold the same bits — the restart lost none of it (a
 * zeroed square average would make the next step ~10x larger). An adagrad
 * shard, one state float per parameter too, refuses the file by its name. */
static void test_rmsprop_state_restores(void)
{
    s_fresh_dir("rms");
    dp_shard_t a, b, c;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(s_shard_of(&a, SPEC, 0, 1, DP_OPT_RMSPROP, 1), 0);
    CHECK_EQ(s_shard_of(&b, SPEC, 0, 1, DP_OPT_RMSPROP, 2), 0);
    CHECK_EQ(s_shard_of(&c, SPEC, 0, 1, DP_OPT_ADAGRAD, 2), 0);
    CHECK_EQ(a.state_per, 1);
    memset(a.state, 0, a.n * sizeof(float));
    float *g = dp_malloc(a.n * sizeof(float));
    for (int t = 1; t <= 5; t++) {
        for (size_t i = 0; i < a.n; i++) g[i] = 0.01f * (float)((int)((i * 5 + (size_t)t) % 13) - 6);
        dp_grad_slice_t sl = {g, a.n * 4, 0};
        if (t == 4) { /* the restart, after 3 steps */
            dp_ckpt_run_t run = s_run("run-rms", 0, 0);
            CHECK_EQ(dp_shard_checkpoint_write(&a, s_path, &run, err), 0);
            CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &run, err), DP_CKPT_RESTORED);
            CHECK_EQ(b.version, 3);
            CHECK_CLOSE("square average", b.state, a.state, a.n, 0, 0);
            CHECK_EQ(dp_shard_checkpoint_restore(&c, s_path, &run, err), DP_CKPT_BAD);
            fprintf(stderr, "  (expected) %s\n", err);
            CHECK(strstr(err, "checkpoint has optimizer 'rmsprop', this shard has 'adagrad'") != NULL);
        }
        dp_shard_step(&a, &sl, 1, 0.01f);
        if (t >= 4) dp_shard_step(&b, &sl, 1, 0.01f);
    }
    CHECK_EQ(b.version, 5);
    CHECK_CLOSE("params after the restart", b.w, a.w, a.n, 0, 0);
    CHECK_CLOSE("square average after the restart", b.state, a.state, a.n, 0, 0);
    free(g);
    dp_shard_fini(&a);
    dp_shard_fini(&b);
    dp_shard_fini(&c);
    s_rm_dir();
}

/* One step of worker 0's gradient g on shard x, computed on version pv,
 * compensated when the shard kept its pull (server/core/shard_dc.h). */
static void s_dc_step(dp_shard_t *x, uint64_t pv, const float *g)
{
    dp_grad_slice_t sl = {g, x->n * 4, 0}, one;
    if (dp_shard_dc_apply(x, 0, pv, &sl, 1, &one)) sl = one;
    dp_shard_step(x, &sl, 1, 0.05f);
}

/* DC-ASGD-a's mean square rides in the checkpoint ("dc.ms", with its CRC):
 * a shard (sgd, whose file has no optim.state, and adam, whose has) with
 * --delay-compensation adaptive, stepped, checkpointed and restored into a
 * fresh one, then both stepped on: the same bits (the slots are refilled
 * by the next pulls; a zeroed MS would make lambda far larger). A file
 * without MS leaves it zero. */
static void test_dc_mean_square_restores(void)
{
    const dp_optim_kind_t kinds[2] = {DP_OPT_SGD, DP_OPT_ADAM};
    for (int k = 0; k < 2; k++) {
        s_fresh_dir("dcms");
        char err[DP_ERR_LEN] = "";
        dp_model_t m;
        dp_optim_conf_t o;
        dp_optim_conf_default(&o);
        o.kind = kinds[k];
        CHECK_EQ(dp_optim_parse_dc(&o, "adaptive:0.5", err), 0);
        dp_shard_t a, b, plain;
        CHECK_EQ(dp_model_parse(&m, SPEC, 1, 4, 4, err), 0);
        CHECK_EQ(dp_shard_init(&a, &m, 0, 1, 1, &o, err), 0);
        CHECK_EQ(dp_shard_init(&b, &m, 0, 1, 2, &o, err), 0);
        dp_shard_dc_init(&a, 2);
        dp_shard_dc_init(&b, 2);
        float *g = dp_malloc(a.n * sizeof(float)), *h = dp_malloc(a.n * sizeof(float));
        dp_ckpt_run_t run = s_run("run-dc", 0, 0);
        for (int t = 1; t <= 5; t++) {
            for (size_t i = 0; i < a.n; i++) {
                g[i] = 0.3f * (float)((int)((i * 5 + (size_t)t) % 13) - 6);
                h[i] = 0.2f * (float)((int)((i * 3 + (size_t)t) % 7) - 3);
            }
            if (t == 4) { /* the restart, after 3 rounds */
                CHECK_EQ(dp_shard_checkpoint_write(&a, s_path, &run, err), 0);
                CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &run, err), DP_CKPT_RESTORED);
                CHECK_EQ(b.version, 6);
                CHECK_CLOSE("mean square", b.dc->ms, a.dc->ms, a.n, 0, 0);
            }
            /* worker 0 pulls, another worker's step lands, worker 0 pushes */
            for (int x = 0; x < (t >= 4 ? 2 : 1); x++) {
                dp_shard_t *sh = x ? &b : &a;
                uint64_t pv = sh->version;
                dp_shard_dc_pulled(sh, 0);
                dp_grad_slice_t hs = {h, sh->n * 4, 0};
                dp_shard_step(sh, &hs, 1, 0.05f);
                s_dc_step(sh, pv, g);
            }
        }
        CHECK_EQ(a.dc->compensated, 5);
        CHECK_EQ(b.dc->compensated, 2);
        CHECK_CLOSE("params after the restart", b.w, a.w, a.n, 0, 0);
        CHECK_CLOSE("mean square after the restart", b.dc->ms, a.dc->ms, a.n, 0, 0);
        /* a file of a run without the mean square: restored, MS zero */
        o.dc = DP_DC_OFF;
        CHECK_EQ(dp_shard_init(&plain, &m, 0, 1, 1, &o, err), 0);
        CHECK_EQ(dp_shard_checkpoint_write(&plain, s_path, &run, err), 0);
        CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &run, err), DP_CKPT_RESTORED);
        int zero = 1;
        for (size_t i = 0; i < b.n; i++) zero &= b.dc->ms[i] == 0;
        CHECK(zero);
        free(g);
        free(h);
        dp_shard_fini(&a);
        dp_shard_fini(&b);
        dp_shard_fini(&plain);
        s_rm_dir();
    }
}

/* Another run, or the same one finished: refused with one line naming the
 * directory and --resume; the shard unchanged. --resume takes it and adopts
 * the file's run id. */
static void test_other_or_finished_run_refused(void)
{
    s_fresh_dir("other");
    dp_shard_t a, b;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(s_shard(&a, 1), 0);
    CHECK_EQ(s_shard(&b, 2), 0);
    a.version = 7;
    dp_ckpt_run_t first = s_run("run-a", 0, 1);
    CHECK_EQ(dp_shard_checkpoint_write(&a, s_path, &first, err), 0);
    dp_ckpt_run_t other = s_run("run-b", 0, 0);
    CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &other, err), DP_CKPT_BAD);
    fprintf(stderr, "  (expected) %s\n", err);
    CHECK(strstr(err, s_dir) != NULL && strstr(err, "run-a") && strstr(err, "--resume"));
    CHECK(strchr(err, '\n') == NULL);
    CHECK_EQ(b.version, 0);
    dp_ckpt_run_t same = s_run("run-a", 0, 0);
    CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &same, err), DP_CKPT_BAD);
    fprintf(stderr, "  (expected) %s\n", err);
    CHECK(strstr(err, "holds the finished run run-a") != NULL);
    CHECK_EQ(b.version, 0);
    dp_ckpt_run_t resume = s_run("run-c", 1, 0);
    CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &resume, err), DP_CKPT_RESTORED);
    CHECK_EQ(b.version, 7);
    CHECK_STR(resume.id, "run-a");
    CHECK_CLOSE("resumed params", b.w, a.w, a.n, 0, 0);
    dp_shard_fini(&a);
    dp_shard_fini(&b);
    s_rm_dir();
}

/* One flipped byte in the tensor data fails the CRC. */
static void test_crc_catches_corruption(void)
{
    s_fresh_dir("crc");
    dp_shard_t a, b;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(s_shard(&a, 1), 0);
    CHECK_EQ(s_shard(&b, 2), 0);
    dp_ckpt_run_t run = s_run("run-a", 0, 0);
    CHECK_EQ(dp_shard_checkpoint_write(&a, s_path, &run, err), 0);
    uint8_t *bytes = NULL;
    size_t len = 0;
    CHECK_EQ(dp_read_file(s_path, &bytes, &len, err), 0);
    if (bytes && len > 8) {
        bytes[len - 5] ^= 0x40; /* inside the last tensor's floats */
        CHECK_EQ(dp_write_file_atomic(s_path, bytes, len, err), 0);
    }
    free(bytes);
    CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &run, err), DP_CKPT_BAD);
    fprintf(stderr, "  (expected) %s\n", err);
    CHECK(strstr(err, "crc32") != NULL);
    CHECK_EQ(b.version, 0);
    dp_shard_fini(&a);
    dp_shard_fini(&b);
    s_rm_dir();
}

/* A checkpoint of another model (fingerprint), of another shard range or
 * another optimizer is refused with one line naming the key and both
 * values; the shard keeps its own weights and version 0. The cases of the
 * same float count (relu has no parameters; the halves of a 2-shard split)
 * would otherwise load without a complaint. */
static void test_other_shard_refused(void)
{
    s_fresh_dir("shape");
    char half[600], err[DP_ERR_LEN] = "";
    snprintf(half, sizeof half, "%s/half-0-of-2.safetensors", s_dir);
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    dp_shard_t a, h;
    CHECK_EQ(s_shard(&a, 1), 0);
    CHECK_EQ(s_shard_of(&h, SPEC, 0, 2, o.kind, 1), 0);
    a.version = h.version = 9;
    dp_ckpt_run_t run = s_run("run-a", 0, 0);
    CHECK_EQ(dp_shard_checkpoint_write(&a, s_path, &run, err), 0);
    CHECK_EQ(dp_shard_checkpoint_write(&h, half, &run, err), 0);
    struct {
        const char *what, *file, *spec, *want;
        int index, count, sgd;
    } cases[] = {
        {"another model, as many floats", s_path, "relu fc:6 softmax", "checkpoint has fingerprint '", 0, 1, 0},
        {"another model", s_path, "fc:7 softmax", "checkpoint has fingerprint '", 0, 1, 0},
        {"shard 0 of 2", s_path, SPEC, "checkpoint has range_hi '102', this shard has '51'", 0, 2, 0},
        {"the other half", half, SPEC, "checkpoint has range_lo '0', this shard has '51'", 1, 2, 0},
        {"another optimizer", s_path, SPEC, "checkpoint has optimizer 'adam', this shard has 'sgd'", 0, 1, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dp_shard_t b;
        if (s_shard_of(&b, cases[k].spec, cases[k].index, cases[k].count, cases[k].sgd ? DP_OPT_SGD : o.kind,
                       2) != 0) {
            CHECK(0);
            continue;
        }
        float *w0 = dp_malloc(b.n * sizeof(float));
        memcpy(w0, b.w, b.n * sizeof(float));
        err[0] = 0;
        CHECK_EQ(dp_shard_checkpoint_restore(&b, cases[k].file, &run, err), DP_CKPT_BAD);
        fprintf(stderr, "  (expected, %s) %s\n", cases[k].what, err);
        CHECK(strstr(err, cases[k].want) != NULL);
        CHECK(strstr(err, cases[k].file) != NULL && strstr(err, "remove the file or fix the flags") != NULL);
        CHECK(strchr(err, '\n') == NULL);
        CHECK_EQ(b.version, 0);
        CHECK_CLOSE("the shard's own weights", b.w, w0, b.n, 0, 0);
        free(w0);
        dp_shard_fini(&b);
    }
    dp_shard_fini(&a);
    dp_shard_fini(&h);
    s_rm_dir();
}

/* A process killed between write and rename (DP_TEST_CRASH_BEFORE_RENAME)
 * leaves the previous checkpoint in place and loadable. */
static void test_crash_before_rename_keeps_previous(void)
{
    s_fresh_dir("crash");
    dp_shard_t a, b;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(s_shard(&a, 1), 0);
    CHECK_EQ(s_shard(&b, 2), 0);
    a.version = 5;
    dp_ckpt_run_t run = s_run("run-a", 0, 0);
    CHECK_EQ(dp_shard_checkpoint_write(&a, s_path, &run, err), 0);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("DP_TEST_CRASH_BEFORE_RENAME", "ps-shard", 1);
        a.version = 6;
        a.w[0] += 1.0f;
        dp_shard_checkpoint_write(&a, s_path, &run, err);
        _exit(0); /* not reached when the hook works */
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 3);
    CHECK_EQ(dp_shard_checkpoint_restore(&b, s_path, &run, err), DP_CKPT_RESTORED);
    CHECK_EQ(b.version, 5);
    CHECK_CLOSE("previous params", b.w, a.w, a.n, 0, 0);
    dp_shard_fini(&a);
    dp_shard_fini(&b);
    s_rm_dir();
}

/* The flags that define a run name it; the others do not. */
static void test_config_run_id(void)
{
    dp_ps_config_t c, d;
    dp_ps_config_default(&c);
    dp_ps_config_default(&d);
    char a[DP_RUN_ID_LEN], b[DP_RUN_ID_LEN];
    dp_ps_config_run_id(&c, a, sizeof a);
    d.checkpoint_every = 50;
    d.metrics_every = 1;
    snprintf(d.bind, sizeof d.bind, "tcp://127.0.0.1:*");
    dp_ps_config_run_id(&d, b, sizeof b);
    CHECK_STR(a, b);
    CHECK(strncmp(a, "cfg-", 4) == 0 && strlen(a) == 20);
    d.optim.lr = 0.01f;
    dp_ps_config_run_id(&d, b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    d = c;
    d.shard_index = 1;
    d.shard_count = 2;
    dp_ps_config_run_id(&d, b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    d = c;
    d.seed = 2;
    dp_ps_config_run_id(&d, b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    d = c; /* the delay rule and compensation too; none / off keep the ids of before */
    d.delay_lr = DP_DELAY_ADAPTIVE;
    dp_ps_config_run_id(&d, b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    d = c;
    d.delay_lr = DP_DELAY_INVERSE; /* --lr-staleness: its id of before */
    dp_ps_config_run_id(&d, b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    d = c;
    d.optim.dc = DP_DC_CONST;
    d.optim.dc_lambda = 0.5f;
    dp_ps_config_run_id(&d, b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    d = c; /* --rms-alpha defines the run too */
    d.optim.alpha = 0.9f;
    dp_ps_config_run_id(&d, b, sizeof b);
    CHECK(strcmp(a, b) != 0);
}

static int s_touch(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    return f && fclose(f) == 0 ? 0 : -1;
}

static int s_exists(const char *dir, const char *name)
{
    char p[600];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return lstat(p, &st) == 0;
}

/* The last metrics line's number at key (-1 when absent). */
static double s_last_metric(const char *path, const char *key)
{
    uint8_t *text = NULL;
    size_t len = 0;
    char err[DP_ERR_LEN];
    if (dp_read_file(path, &text, &len, err) != 0) return -1;
    while (len > 0 && text[len - 1] == '\n') text[--len] = 0;
    char *last = strrchr((char *)text, '\n');
    cJSON *o = cJSON_Parse(last ? last + 1 : (char *)text);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    double x = cJSON_IsNumber(v) ? v->valuedouble : -1;
    cJSON_Delete(o);
    free(text);
    return x;
}

/* A fresh start writes version 0 at once (so a restart that finds no file
 * is no lost run) and first removes what a kill mid-checkpoint left of its
 * own file, nothing else; a checkpoint that cannot be written (a full disk,
 * DP_TEST_WRITE_FAIL) is counted in the metrics, and the final one failing
 * fails the server with the count; the file keeps the last good version. */
static void test_server_checkpoint_failures_are_loud(void)
{
    s_fresh_dir("loud");
    char err[DP_ERR_LEN] = "", metrics[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", s_dir);
    const char *mine = "ps-shard-0-of-1.safetensors.tmp.AbC123";
    const char *keep[] = {"ps-shard-0-of-1.safetensors.tmp.AbC12", "ps-shard-0-of-1.safetensors.tmp",
                          "ps-shard-1-of-2.safetensors.tmp.XyZ789", "notes.tmp.AbC123"};
    CHECK_EQ(s_touch(s_dir, mine), 0);
    for (int i = 0; i < 4; i++) CHECK_EQ(s_touch(s_dir, keep[i]), 0);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    snprintf(s.cfg.checkpoint_dir, sizeof s.cfg.checkpoint_dir, "%s", s_dir);
    snprintf(s.cfg.metrics_path, sizeof s.cfg.metrics_path, "%.*s", (int)sizeof s.cfg.metrics_path - 1, metrics);
    s.cfg.checkpoint_every = 1;
    s.cfg.metrics_every = 3600;
    CHECK_EQ(srv_start(&s), 0);
    CHECK_EQ(access(s_path, F_OK), 0); /* version 0, before any push */
    char *v = dp_safetensors_read_meta(s_path, "version", err);
    CHECK_STR(v, "0");
    free(v);
    CHECK(!s_exists(s_dir, mine));
    for (int i = 0; i < 4; i++) CHECK(s_exists(s_dir, keep[i]));
    /* From here every checkpoint write fails as on a full disk. */
    setenv("DP_TEST_WRITE_FAIL", "ps-shard", 1);
    dp_model_t m;
    srv_small_model(&m);
    float *p = dp_calloc(m.n_floats, sizeof(float)), *g = dp_calloc(m.n_floats, sizeof(float));
    srv_fill(g, m.n_floats, 1);
    dp_ps_client_t *c = NULL;
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &m, 0, PS_OPTS(5.0), NULL, err), 0);
    for (int i = 0; c && i < 2; i++) {
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0); /* applied: versions 1, 2 */
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), -1); /* the final checkpoint (version 2) fails too */
    fprintf(stderr, "  (expected) %s\n", s.err);
    CHECK(strstr(s.err, "the final checkpoint failed (3 checkpoint failures in this run)") != NULL);
    CHECK(strstr(s.err, "No space left on device") != NULL);
    CHECK_EQ(s_last_metric(metrics, "checkpoint_failures"), 3);
    CHECK_EQ(s_last_metric(metrics, "version"), 2);
    unsetenv("DP_TEST_WRITE_FAIL");
    v = dp_safetensors_read_meta(s_path, "version", err);
    CHECK_STR(v, "0"); /* the last good one, whole */
    free(v);
    /* A directory that cannot be written fails the start, not the run. */
    s_fresh_dir("nostart");
    setenv("DP_TEST_WRITE_FAIL", "ps-shard", 1);
    srv_t s2;
    srv_init(&s2, DP_MODE_ASYNC, 1);
    snprintf(s2.cfg.checkpoint_dir, sizeof s2.cfg.checkpoint_dir, "%s", s_dir);
    CHECK_EQ(srv_start(&s2), -1);
    CHECK_EQ(srv_stop(&s2), -1);
    unsetenv("DP_TEST_WRITE_FAIL");
    fprintf(stderr, "  (expected) %s\n", s2.err);
    CHECK(strstr(s2.err, "cannot write the first checkpoint") != NULL);
    free(p);
    free(g);
    s_rm_dir();
    s_fresh_dir("loud");
    s_rm_dir();
}

int main(int argc, char **argv)
{
    if (t_env() != 0) return 2;
    const t_test_t tests[] = {
        T(test_same_run_restores),
        T(test_rmsprop_state_restores),
        T(test_dc_mean_square_restores),
        T(test_other_or_finished_run_refused),
        T(test_crc_catches_corruption),
        T(test_other_shard_refused),
        T(test_crash_before_rename_keeps_previous),
        T(test_config_run_id),
        T(test_server_checkpoint_failures_are_loud),
    };
    return t_main(argc, argv, tests, (int)(sizeof tests / sizeof tests[0]));
}
