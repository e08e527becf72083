/* eval: `downpour eval --checkpoint F [--data D] [--device DEV]` — the test
 * accuracy of a saved model as one JSON line; a policy's (an actor-critic
 * model, `--env NAME [--episodes N]`) greedy return as test_return. The model spec and input shape
 * come from the checkpoint's own metadata, so any Downpour checkpoint can be
 * evaluated without repeating how it was trained. A sparse model's file
 * (embed:D, its rows in the file) is scored on --data libsvm:TEST by the
 * worker's own evaluation (worker/train/embed_train.h: dp_embed_eval_file), so
 * its test_accuracy, test_loss and test_auc are its run's, unrounded. */
#include "deploy/launcher/commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dataset.h"
#include "common/metrics.h"
#include "common/opts.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "worker/exec/a3c.h"
#include "worker/train/a3c_train.h"
#include "worker/train/embed_train.h"
#include "worker/exec/env/env.h"
#include "worker/exec/net.h"
#include "worker/exec/sparse_data.h"

static const char s_synopsis[] =
    "usage: downpour eval --checkpoint FILE.safetensors [--data SPEC] [--device cpu|cuda:K]\n"
    "                     [--batch B] [--limit N] [--precision fp32|bf16]\n"
    "       downpour eval --checkpoint FILE.safetensors --data libsvm:TEST [--batch B] [--threads N]\n"
    "Prints {\"test_accuracy\": ..., \"test_loss\": ..., \"n\": ...} for the test split; for a\n"
    "sparse model (embed:D, its rows in the file) on libsvm data also test_auc and rows, the\n"
    "numbers its run's summary.json reported for the same test file (at its --threads).\n"
    "       downpour eval --checkpoint FILE.safetensors --env NAME [--episodes N] [--seed S]\n"
    "Prints {\"test_return\": ..., \"episodes\": N, ...}: a policy's (an actor-critic model's)\n"
    "greedy mean return over N fresh episodes, as its run's summary.json reports test_return.\n"
    "\n";

/* The kinds of model a checkpoint can hold, told from its spec's text, so
 * that a command given the wrong kind says which kind the file is. */
typedef enum { S_DENSE, S_SPARSE, S_POLICY } s_kind_t;

static s_kind_t s_spec_kind(const char *spec)
{
    if (strncmp(spec, "embed:", 6) == 0) return S_SPARSE;
    const char *last = spec + strlen(spec);
    while (last > spec && (last[-1] == ' ' || last[-1] == '\t')) last--;
    const char *tok = last;
    while (tok > spec && tok[-1] != ' ' && tok[-1] != '\t') tok--;
    if (last - tok >= 2 && strncmp(tok, "ac", 2) == 0 && (last - tok == 2 || tok[2] == ':')) return S_POLICY;
    return S_DENSE;
}

static const char *s_kind_what(s_kind_t k)
{
    return k == S_SPARSE ? "a sparse model (embed:D): score it on libsvm data (--data libsvm:TEST)"
         : k == S_POLICY ? "a policy (an actor-critic head): score it with --env NAME"
                         : "a dense model: score it on its image data (--data, default fashion-mnist)";
}

/* The result line: out with the checkpoint's name last, one JSON line on
 * stdout (out freed). */
static void s_print(cJSON *out, const char *ckpt)
{
    cJSON_AddStringToObject(out, "checkpoint", ckpt);
    char *line = cJSON_PrintUnformatted(out);
    printf("%s\n", line);
    cJSON_free(line);
    cJSON_Delete(out);
}

/* The checkpoint's spec (malloc'd), or NULL with err. */
static char *s_read_spec(const char *ckpt, char *err)
{
    char *spec = dp_safetensors_read_meta(ckpt, "spec", err);
    if (!spec && !err[0]) dp_err(err, "%s: no model spec in the metadata (not a Downpour checkpoint?)", ckpt);
    return spec;
}

/* A policy's greedy return in env over episodes fresh episodes (the ones
 * a run's test_return plays, for seed): one JSON line. The exit status. */
static int s_eval_policy(const char *ckpt, const char *env, int episodes, uint64_t seed, const char *device,
                         dp_precision_t precision)
{
    char err[DP_ERR_LEN] = "";
    dp_model_t m;
    dp_backend_t *be = NULL;
    dp_net_t net = {0};
    float *params = NULL;
    int rc = 1;
    const dp_env_kind_t *kind = dp_env_find(env, err);
    char *spec = kind ? s_read_spec(ckpt, err) : NULL;
    if (!spec) goto done;
    if (s_spec_kind(spec) != S_POLICY) {
        dp_err(err, "%s holds '%s', %s; --env scores a policy", ckpt, spec, s_kind_what(s_spec_kind(spec)));
        rc = 2; /* the wrong kind of file for the command: a usage error */
        goto done;
    }
    if (dp_a3c_model(&m, spec, kind, 0, err) != 0) goto done;
    params = dp_malloc(m.n_floats * sizeof(float));
    if (dp_checkpoint_load(ckpt, &m, params, NULL, NULL, err) != 0) goto done;
    if (dp_backend_new_in(&be, device, precision, err) != 0) goto done;
    if (dp_net_init(&net, &m, be, 1, err) != 0) goto done;
    dp_net_set_params(&net, params);
    double ret = dp_a3c_test_return(kind, &net, seed, 0, episodes);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "test_return", dp_metrics_round(ret, 4));
    cJSON_AddNumberToObject(out, "episodes", episodes);
    cJSON_AddStringToObject(out, "env", kind->name);
    s_print(out, ckpt);
    rc = 0;
done:
    if (rc) fprintf(stderr, "downpour eval: %s\n", err);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(spec);
    free(params);
    return rc;
}

/* A sparse model's file on the libsvm file of spec ("libsvm:TEST", or the
 * run's own "libsvm:TRAIN:TEST": its test file). The exit status. */
static int s_eval_sparse(const char *ckpt, const char *spec, int batch, int limit, int threads,
                         dp_precision_t precision)
{
    char err[DP_ERR_LEN] = "";
    const char *test = strrchr(spec, ':') + 1; /* dp_sparse_data_is: "libsvm:" at least */
    dp_embed_scores_t e;
    char *mspec = NULL;
    int rc = 1;
    if (limit > 0) dp_err(err, "--limit is for image data: cut the libsvm file (head -n N) instead");
    else if (!test[0]) dp_err(err, "--data %s: name the test file (libsvm:TEST)", spec);
    else if ((mspec = s_read_spec(ckpt, err)) && s_spec_kind(mspec) != S_SPARSE) {
        dp_err(err, "%s holds '%s', %s; libsvm data scores a sparse model", ckpt, mspec, s_kind_what(s_spec_kind(mspec)));
        rc = 2;
    }
    free(mspec);
    if (err[0] || dp_embed_eval_file(ckpt, test, batch, threads, precision, &e, err) != 0) {
        fprintf(stderr, "downpour eval: %s\n", err);
        return rc;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "test_accuracy", e.accuracy);
    cJSON_AddNumberToObject(out, "test_loss", e.loss);
    cJSON_AddNumberToObject(out, "test_auc", e.auc);
    cJSON_AddNumberToObject(out, "n", (double)e.samples);
    cJSON_AddNumberToObject(out, "rows", (double)e.rows);
    cJSON_AddNumberToObject(out, "batch", e.batch);
    s_print(out, ckpt);
    return 0;
}

static int s_set_precision(void *arg, const char *v, char *err)
{
    return dp_precision_parse(v, arg, err);
}

int dp_eval_main(int argc, char **argv)
{
    const char *ckpt = NULL, *data = "fashion-mnist", *device = "cpu", *env = NULL;
    int batch = 0, limit = 0, threads = 0, episodes = DP_A3C_TEST_EPISODES;
    dp_precision_t precision = DP_PRECISION_FP32;
    uint64_t seed = 1;
    const dp_opts_flag_t t[] = {
        DP_FLAG_STR("checkpoint", "FILE", &ckpt, 0, "a Downpour checkpoint (required)"),
        DP_FLAG_STR("data", "SPEC", &data, 0, "the dataset whose test split scores it (default fashion-mnist)"),
        DP_FLAG_STR("device", "DEV", &device, 0, "cpu (default) or cuda:K"),
        DP_FLAG_NUM("batch", DP_OPTS_INT, "B", &batch, 1, 1 << 16, 0,
                    "evaluation batch (default 256; a sparse model: the batch it was trained at)"),
        DP_FLAG_NUM("threads", DP_OPTS_INT, "N", &threads, 0, 4096, 0,
                    "CPU kernel threads (default 0: all cores)"),
        DP_FLAG_NUM("limit", DP_OPTS_INT, "N", &limit, 0, 1000000000, 0,
                    "the first N test samples (default 0: all)"),
        DP_FLAG_STR("env", "NAME", &env, 0, "a policy: the environment it plays (cartpole-v1, acrobot-v1)"),
        DP_FLAG_NUM("episodes", DP_OPTS_INT, "N", &episodes, 1, 1000000, 0,
                    "a policy: the greedy episodes averaged (default 100, as a run's test_return)"),
        DP_FLAG_SEED("seed", &seed, 0, "a policy: the episodes' seed (default 1, a run's default --seed)"),
        DP_FLAG_CALL("precision", "fp32|bf16", s_set_precision, &precision, 0,
                     "the conv and fc layers' arithmetic (default fp32; as\ndownpour-worker --help says)"),
    };
    dp_opts_t o;
    dp_opts_init(&o, "downpour eval", s_synopsis, NULL);
    dp_opts_add(&o, t, (int)(sizeof t / sizeof t[0]));
    char err[DP_ERR_LEN] = "";
    dp_opts_result_t r = dp_opts_parse(&o, argc, argv, err);
    if (r == DP_OPTS_PARSED && !ckpt) r = dp_err(err, "--checkpoint FILE is required (see downpour eval --help)");
    if (r == DP_OPTS_PARSED && dp_precision_check(device, precision, err) != 0) r = DP_OPTS_BAD;
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("downpour eval", r, err);
    if (env) return s_eval_policy(ckpt, env, episodes, seed, device, precision);
    if (dp_sparse_data_is(data)) return s_eval_sparse(ckpt, data, batch, limit, threads, precision);
    if (threads > 0) dp_cpu_set_threads(threads);
    if (batch == 0) batch = 256;
    dp_dataset_t test = {0};
    dp_model_t m;
    dp_backend_t *be = NULL;
    dp_net_t net = {0};
    float *params = NULL, *x = NULL;
    int *y = NULL, rc = 1;
    char *spec = s_read_spec(ckpt, err);
    if (!spec) goto done;
    if (s_spec_kind(spec) != S_DENSE) {
        dp_err(err, "%s holds '%s', %s", ckpt, spec, s_kind_what(s_spec_kind(spec)));
        rc = 2;
        goto done;
    }
    if (dp_dataset_init(&test, data, DP_SPLIT_TEST, err) != 0) goto done;
    /* the normalisation it was trained under (--normalize), if any */
    char *norm = dp_safetensors_read_meta(ckpt, "normalize", err);
    if (norm) {
        float mean[DP_DATASET_MAX_C], std[DP_DATASET_MAX_C];
        int bad = dp_dataset_parse_normalize(norm, test.c, mean, std, err) != 0 ||
                  dp_dataset_set_normalize(&test, mean, std, err) != 0;
        free(norm);
        if (bad) {
            char why[DP_ERR_LEN];
            snprintf(why, sizeof why, "%s", err);
            dp_err(err, "%s: its metadata's normalisation: %s", ckpt, why);
            goto done;
        }
    } else if (err[0]) {
        goto done;
    }
    if (dp_model_parse(&m, spec, test.c, test.h, test.w, err) != 0) goto done;
    params = dp_malloc(m.n_floats * sizeof(float));
    if (dp_checkpoint_load(ckpt, &m, params, NULL, NULL, err) != 0) goto done;
    if (dp_backend_new_in(&be, device, precision, err) != 0) goto done;
    if (dp_net_init(&net, &m, be, batch, err) != 0) goto done;
    dp_net_set_params(&net, params);
    int n = limit > 0 && limit < test.n ? limit : test.n;
    x = dp_malloc((size_t)batch * dp_dataset_sample_size(&test) * sizeof(float));
    y = dp_malloc((size_t)batch * sizeof(int));
    double acc = 0, loss = 0;
    dp_net_evaluate_dataset(&net, &test, n, x, y, &acc, &loss);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "test_accuracy", dp_metrics_round(acc, 5));
    cJSON_AddNumberToObject(out, "test_loss", dp_metrics_round(loss, 5));
    cJSON_AddNumberToObject(out, "n", n);
    s_print(out, ckpt);
    rc = 0;
done:
    if (rc) fprintf(stderr, "downpour eval: %s\n", err);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    dp_dataset_fini(&test);
    free(spec);
    free(params);
    free(x);
    free(y);
    return rc;
}
