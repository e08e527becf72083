/* test_ps_init: any model on the servers (downpour-ps --init FILE): the
 * tensor table read from a safetensors file, its initial values, state
 * tensors combined instead of stepped (async: the pushed value; sync: the
 * mean), the HELLO's table check, checkpoints, and bad files refused with
 * one line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "deploy/lab/engine.h"
#include "server/core/record.h"
#include "server/core/shard.h"
#include "tests/ps_harness.h"
#include "tests/test.h"

/* The file's tensors, in the order their data lies: fc.weight [3, 4],
 * fc.bias [3], bn.running_mean [3] (state), bn.num_batches_tracked []
 * (state, a scalar), 19 floats. */
#define N_FLOATS 19
static const int64_t s_w[2] = {3, 4}, s_b[1] = {3};

static void s_values(float *x)
{
    for (int i = 0; i < N_FLOATS; i++) x[i] = 0.25f * (float)(i + 1);
}

/* Write the file at path with metadata state (NULL: none). */
static int s_write(const char *path, const char *state, char *err)
{
    float x[N_FLOATS];
    s_values(x);
    dp_st_tensor_t t[4] = {{"fc.weight", x, 2, s_w},
                           {"fc.bias", x + 12, 1, s_b},
                           {"bn.running_mean", x + 15, 1, s_b},
                           {"bn.num_batches_tracked", x + 18, 0, NULL}};
    const char *meta[] = {DP_ST_STATE_KEY, state, NULL};
    return dp_safetensors_write(path, t, 4, state ? meta : NULL, err);
}

/* The table a client builds for the same module. */
static void s_client_model(dp_model_t *m)
{
    dp_table_entry_t t[4] = {{"fc.weight", 2, s_w, 1},
                             {"fc.bias", 1, s_b, 1},
                             {"bn.running_mean", 1, s_b, 0},
                             {"bn.num_batches_tracked", 0, NULL, 0}};
    char err[DP_ERR_LEN];
    if (dp_model_from_table(m, t, 4, err) != 0) {
        fprintf(stderr, "table: %s\n", err);
        exit(1);
    }
}

static char s_dir[] = "/tmp/dp-test-ps-init-XXXXXX";

static const char *s_path(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", s_dir, name);
    return p[k];
}

/* A server of mode and workers that serves the --init file (written
 * afresh, its state named in the metadata); the case adds its own flags
 * and starts it. The file's path. */
static const char *s_init_server(srv_t *s, dp_mode_t mode, int workers)
{
    char err[DP_ERR_LEN] = "";
    const char *f = s_path("init.safetensors");
    CHECK_EQ(s_write(f, "bn.running_mean,bn.num_batches_tracked", err), 0);
    srv_init(s, mode, workers);
    snprintf(s->cfg.init_path, sizeof s->cfg.init_path, "%s", f);
    return f;
}

static void test_read_table(void)
{
    char err[DP_ERR_LEN] = "";
    const char *f = s_path("init.safetensors");
    CHECK_EQ(s_write(f, "bn.running_mean,bn.num_batches_tracked", err), 0);
    dp_model_t m, want;
    float *v = NULL;
    CHECK_EQ(dp_safetensors_read_table(f, NULL, &m, &v, err), 0);
    s_client_model(&want);
    CHECK_EQ(m.n_params, 4);
    CHECK_EQ(m.n_floats, N_FLOATS);
    CHECK_STR(m.params[2].name, "bn.running_mean");
    CHECK_EQ(m.params[2].trainable, 0);
    CHECK_EQ(m.params[3].ndim, 0);
    CHECK_EQ(m.params[0].trainable, 1);
    CHECK_EQ(m.fingerprint, want.fingerprint); /* a client's same table matches */
    float x[N_FLOATS];
    s_values(x);
    CHECK(v && memcmp(v, x, sizeof x) == 0);
    free(v);
    /* the state named by a flag instead of the metadata: the same table */
    CHECK_EQ(s_write(f, NULL, err), 0);
    CHECK_EQ(dp_safetensors_read_table(f, "bn.running_mean,bn.num_batches_tracked", &m, NULL, err), 0);
    CHECK_EQ(m.fingerprint, want.fingerprint);
    /* none named: every tensor trained, another table */
    CHECK_EQ(dp_safetensors_read_table(f, NULL, &m, NULL, err), 0);
    CHECK(m.fingerprint != want.fingerprint);
}

static void test_bad_files(void)
{
    char err[DP_ERR_LEN] = "";
    const char *f = s_path("bad.safetensors");
    dp_model_t m;
    float *v = (float *)1;
    /* a state name that is no tensor: refused (a typo would train a buffer) */
    CHECK_EQ(s_write(f, "bn.running_mean,bn.runing_var", err), 0);
    CHECK_EQ(dp_safetensors_read_table(f, NULL, &m, &v, err), -1);
    CHECK(strstr(err, "metadata 'downpour.state' names 'bn.runing_var', which is not a tensor") != NULL);
    CHECK(v == (float *)1);
    CHECK_EQ(s_write(f, NULL, err), 0);
    CHECK_EQ(dp_safetensors_read_table(f, "nope", &m, NULL, err), -1);
    CHECK(strstr(err, "--state-tensors names 'nope'") != NULL);
    /* a non-finite initial value */
    float x[3] = {1, NAN, 2};
    dp_st_tensor_t t = {"w", x, 1, s_b};
    CHECK_EQ(dp_safetensors_write(f, &t, 1, NULL, err), 0);
    CHECK_EQ(dp_safetensors_read_table(f, NULL, &m, &v, err), -1);
    CHECK(strstr(err, "tensor 'w' element 1 is not finite") != NULL);
    /* no tensors at all */
    const char *meta[] = {"k", "v", NULL};
    CHECK_EQ(dp_safetensors_write(f, NULL, 0, meta, err), 0);
    CHECK_EQ(dp_safetensors_read_table(f, NULL, &m, NULL, err), -1);
    CHECK(strstr(err, "0 tensors; a --init file holds 1..1024") != NULL);
    /* another dtype: a hand-made header with one I64 scalar */
    const char hdr[] = "{\"n\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}}";
    FILE *fp = fopen(f, "wb");
    uint64_t len = sizeof hdr - 1, zero = 0;
    fwrite(&len, 8, 1, fp);
    fwrite(hdr, 1, len, fp);
    fwrite(&zero, 8, 1, fp);
    fclose(fp);
    CHECK_EQ(dp_safetensors_read_table(f, NULL, &m, NULL, err), -1);
    CHECK(strstr(err, "tensor 'n' is I64; the servers hold float32 tensors") != NULL);
}

/* A shard over part of a state tensor steps its trainable floats and takes
 * the pushed values for its state floats, whatever the cut. */
static void test_shard_state_ranges(void)
{
    dp_model_t m;
    s_client_model(&m);
    float x[N_FLOATS], g[N_FLOATS];
    s_values(x);
    for (int i = 0; i < N_FLOATS; i++) g[i] = 100.0f + (float)i;
    dp_optim_conf_t o = {.kind = DP_OPT_SGD, .lr = 0.5f};
    char err[DP_ERR_LEN];
    for (int k = 1; k <= 3; k++)
        for (int i = 0; i < k; i++) {
            dp_shard_t s;
            CHECK_EQ(dp_shard_init_values(&s, &m, i, k, x, &o, err), 0);
            dp_grad_slice_t sl = {g + s.lo, s.n * sizeof(float), s.lo};
            dp_shard_step(&s, &sl, 1, 0.5f);
            for (size_t j = s.lo; j < s.hi; j++) {
                float want = j >= 15 ? g[j] : x[j] - 0.5f * g[j];
                CHECK(s.w[j - s.lo] == want);
            }
            dp_shard_fini(&s);
        }
}

/* The server from --init: the client with the same table says HELLO and
 * pulls the file's values; a push steps the trainable floats (SGD) and sets
 * the state floats to its values; a client whose table differs (a buffer
 * taken for a parameter) is refused. */
static void test_server_async(void)
{
    char err[DP_ERR_LEN] = "";
    srv_t s;
    const char *f = s_init_server(&s, DP_MODE_ASYNC, 1);
    snprintf(s.cfg.record, sizeof s.cfg.record, "%s", s_path("rec.jsonl"));
    CHECK_EQ(srv_start(&s), 0);
    dp_model_t m;
    s_client_model(&m);
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &m, 0, PS_OPTS(5), NULL, err), 0);
    float w[N_FLOATS], x[N_FLOATS], g[N_FLOATS];
    s_values(x);
    CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
    CHECK(memcmp(w, x, sizeof x) == 0);
    for (int i = 0; i < N_FLOATS; i++) g[i] = (float)i;
    g[18] = 5; /* the counter's value after this step */
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(1, g, 1.0f, 8), &r, err), 0);
    CHECK_EQ(r.applied, 1);
    CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
    for (int i = 0; i < 15; i++) CHECK(w[i] == x[i] - 0.1f * g[i]);
    for (int i = 15; i < N_FLOATS; i++) CHECK(w[i] == g[i]);
    dp_ps_client_destroy(&c);
    /* a table with bn.running_mean trainable is another model */
    int64_t b[1] = {3};
    dp_table_entry_t t[4] = {{"fc.weight", 2, s_w, 1}, {"fc.bias", 1, b, 1},
                             {"bn.running_mean", 1, b, 1}, {"bn.num_batches_tracked", 0, NULL, 0}};
    dp_model_t other;
    CHECK_EQ(dp_model_from_table(&other, t, 4, err), 0);
    dp_ps_err_t kind = DP_PS_OK;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &other, 0,
                              &(dp_ps_client_opts_t){.timeout_s = 5, .new_error = &kind}, NULL, err), -1);
    CHECK(strstr(err, "model mismatch: this shard serves another model than the worker's "
                      "tensor table of 19 floats") != NULL);
    CHECK_EQ(kind, DP_PS_ERR_MODEL_MISMATCH);
    CHECK_EQ(srv_stop(&s), 0);
    /* the record keeps the schedule; replay says why it cannot recompute it */
    dp_rec_t rec;
    CHECK_EQ(dp_rec_load(&rec, s.cfg.record, err), 0);
    CHECK_STR(dp_record_str(rec.header, "model"), DP_MODEL_TABLE_SPEC);
    CHECK_STR(dp_record_str(rec.header, "init"), f);
    size_t pushes = 0;
    for (size_t i = 0; i < rec.n; i++) pushes += rec.ev[i].kind == DP_REC_PUSH;
    CHECK_EQ(pushes, 1);
    dp_lab_conf_t lc;
    dp_lab_conf_default(&lc);
    CHECK_EQ(dp_lab_conf_from_header(&lc, rec.header, err), -1);
    CHECK(strstr(err, "a run of downpour-ps --init (a tensor table): replay recomputes") != NULL);
    dp_rec_fini(&rec);
}

/* Delay compensation transforms gradients, never the values state floats
 * carry: a stale push under DC-ASGD still sets them to exactly its values,
 * while its trainable floats are compensated. */
static void test_server_dc_keeps_state(void)
{
    char err[DP_ERR_LEN] = "";
    srv_t s;
    s_init_server(&s, DP_MODE_ASYNC, 2);
    s.cfg.optim.dc = DP_DC_CONST;
    s.cfg.optim.dc_lambda = 0.5f;
    CHECK_EQ(srv_start(&s), 0);
    dp_model_t m;
    s_client_model(&m);
    dp_ps_client_t *c0 = NULL, *c1 = NULL;
    CHECK_EQ(dp_ps_client_new(&c0, s.endpoint, &m, 0, PS_OPTS(5), NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&c1, s.endpoint, &m, 1, PS_OPTS(5), NULL, err), 0);
    float w0[N_FLOATS], w1[N_FLOATS], w[N_FLOATS], g0[N_FLOATS], g1[N_FLOATS];
    CHECK_EQ(dp_ps_client_pull(c0, w0, err), 0);
    CHECK_EQ(dp_ps_client_pull(c1, w1, err), 0);
    for (int i = 0; i < N_FLOATS; i++) {
        g0[i] = 1.0f + (float)i;
        g1[i] = 2.0f + (float)i;
    }
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_push(c0, PS_PUSH_STEP(1, g0, 1.0f, 8), &r, err), 0);
    CHECK_EQ(dp_ps_client_push(c1, PS_PUSH_STEP(1, g1, 1.0f, 8), &r, err), 0); /* 1 stale */
    CHECK_EQ(r.staleness_max, 1);
    CHECK_EQ(dp_ps_client_pull(c0, w, err), 0);
    int compensated = 0;
    for (int i = 0; i < 15; i++) {
        float after0 = w1[i] - 0.1f * g0[i];
        float gc = g1[i] + 0.5f * g1[i] * g1[i] * (after0 - w1[i]);
        CHECK(w[i] == after0 - 0.1f * gc);
        compensated += gc != g1[i];
    }
    CHECK(compensated > 0);
    for (int i = 15; i < N_FLOATS; i++) CHECK(w[i] == g1[i]);
    dp_ps_client_destroy(&c0);
    dp_ps_client_destroy(&c1);
    CHECK_EQ(srv_stop(&s), 0);
}

/* Sync with 2 workers: the trainable floats step by the mean gradient, the
 * state floats become the mean of the two values; a restart from the
 * checkpoint gives back exactly those floats. */
static void test_server_sync_and_restore(void)
{
    char err[DP_ERR_LEN] = "";
    srv_t s;
    s_init_server(&s, DP_MODE_SYNC, 2);
    snprintf(s.cfg.checkpoint_dir, sizeof s.cfg.checkpoint_dir, "%s", s_path("ckpt"));
    snprintf(s.cfg.run_id, sizeof s.cfg.run_id, "init-test");
    CHECK_EQ(srv_start(&s), 0);
    dp_model_t m;
    s_client_model(&m);
    dp_ps_client_t *c0 = NULL, *c1 = NULL;
    CHECK_EQ(dp_ps_client_new(&c0, s.endpoint, &m, 0, PS_OPTS(5), NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&c1, s.endpoint, &m, 1, PS_OPTS(5), NULL, err), 0);
    float w[N_FLOATS], x[N_FLOATS], g0[N_FLOATS], g1[N_FLOATS];
    s_values(x);
    CHECK_EQ(dp_ps_client_pull(c0, w, err), 0);
    CHECK_EQ(dp_ps_client_pull(c1, w, err), 0);
    for (int i = 0; i < N_FLOATS; i++) {
        g0[i] = (float)i;
        g1[i] = 3.0f * (float)i;
    }
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_push(c0, PS_PUSH_STEP(1, g0, 1.0f, 8), &r, err), 0);
    CHECK_EQ(dp_ps_client_push(c1, PS_PUSH_STEP(1, g1, 1.0f, 8), &r, err), 0);
    CHECK_EQ(dp_ps_client_pull(c0, w, err), 0);
    float want[N_FLOATS];
    for (int i = 0; i < N_FLOATS; i++) {
        float mean = (g0[i] + g1[i]) * 0.5f;
        want[i] = i < 15 ? x[i] - 0.1f * mean : mean;
        CHECK(w[i] == want[i]);
    }
    dp_ps_client_destroy(&c0);
    dp_ps_client_destroy(&c1);
    CHECK_EQ(srv_stop(&s), 0); /* the final checkpoint */
    srv_t s2;
    srv_init(&s2, DP_MODE_SYNC, 2);
    s2.cfg = s.cfg;
    s2.cfg.on_ready = NULL;
    CHECK_EQ(srv_start(&s2), 0);
    CHECK_EQ(dp_ps_client_new(&c0, s2.endpoint, &m, 0, PS_OPTS(5), NULL, err), 0);
    CHECK_EQ(dp_ps_client_pull(c0, w, err), 0);
    CHECK(memcmp(w, want, sizeof want) == 0);
    dp_ps_client_destroy(&c0);
    CHECK_EQ(srv_stop(&s2), 0);
}

/* downpour-ps's flags: --init replaces --model and --input, and
 * --state-tensors needs it. */
static void test_flags(void)
{
    char err[DP_ERR_LEN] = "";
    dp_ps_config_t c;
    dp_ps_config_default(&c);
    char *a1[] = {"downpour-ps", "--init", "m.safetensors", "--model", "fc:10 softmax", NULL};
    CHECK_EQ(dp_ps_parse_args(&c, 5, a1, err), DP_OPTS_BAD);
    CHECK_STR(err, "--init m.safetensors gives the model: drop --model and --input");
    dp_ps_config_default(&c);
    char *a3[] = {"downpour-ps", "--state-tensors", "bn.running_mean", NULL};
    CHECK_EQ(dp_ps_parse_args(&c, 3, a3, err), DP_OPTS_BAD);
    CHECK(strstr(err, "give --init too") != NULL);
    dp_ps_config_default(&c);
    char *a4[] = {"downpour-ps", "--init", "m.safetensors", NULL};
    CHECK_EQ(dp_ps_parse_args(&c, 3, a4, err), DP_OPTS_PARSED);
    CHECK_STR(c.init_path, "m.safetensors");
    /* the run id follows the file, not the (unused) spec */
    char id1[80], id2[80];
    dp_ps_config_run_id(&c, id1, sizeof id1);
    snprintf(c.init_path, sizeof c.init_path, "other.safetensors");
    dp_ps_config_run_id(&c, id2, sizeof id2);
    CHECK(strcmp(id1, id2) != 0);
}

/* One scratch directory for the program, made before the cases and
 * removed after them (a constructor and a destructor: DP_TESTS owns main). */
__attribute__((constructor)) static void s_setup(void)
{
    if (!mkdtemp(s_dir)) {
        perror("mkdtemp");
        exit(1);
    }
}

__attribute__((destructor)) static void s_cleanup(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", s_dir);
}

/* A worker that lies about a count: a push whose bn.num_batches_tracked is
 * negative is refused with one line naming the tensor, and nothing of it is
 * applied (its trainable floats neither); the same push with the count at
 * 0 is applied. Sync too: a lying worker does not get into the mean. */
static void s_negative_count_refused(dp_mode_t mode)
{
    char err[DP_ERR_LEN] = "";
    srv_t s;
    s_init_server(&s, mode, 1);
    CHECK_EQ(srv_start(&s), 0);
    dp_model_t m;
    s_client_model(&m);
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &m, 0, PS_OPTS(5), NULL, err), 0);
    float w[N_FLOATS], x[N_FLOATS], g[N_FLOATS];
    s_values(x);
    CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
    for (int i = 0; i < N_FLOATS; i++) g[i] = 1.0f;
    g[18] = -3.0f;
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(1, g, 1.0f, 8), &r, err), 0);
    CHECK_EQ(r.applied, 0);
    CHECK_EQ(r.rejected, 1);
    CHECK(strstr(r.reason, "bn.num_batches_tracked element 0 is -3") != NULL);
    CHECK(strchr(r.reason, '\n') == NULL);
    CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
    CHECK(memcmp(w, x, sizeof x) == 0); /* nothing applied */
    g[18] = 0.0f;
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(2, g, 1.0f, 8), &r, err), 0);
    CHECK_EQ(r.applied, 1);
    CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
    CHECK(w[18] == 0.0f && w[0] == x[0] - 0.1f);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

static void test_negative_count_refused(void)
{
    s_negative_count_refused(DP_MODE_ASYNC);
    s_negative_count_refused(DP_MODE_SYNC);
}

DP_TESTS(T(test_read_table), T(test_bad_files), T(test_shard_state_ranges), T(test_server_async),
         T(test_server_dc_keeps_state), T(test_negative_count_refused),
         T(test_server_sync_and_restore), T(test_flags))
