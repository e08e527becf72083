/* eval: `downpour eval --checkpoint F [--data D] [--device DEV]` — the test
 * accuracy of a saved model as one JSON line. The model spec and input shape
 * come from the checkpoint's own metadata, so any Downpour checkpoint can be
 * evaluated without repeating how it was trained. A sparse model's file
 * (embed:D, its rows in the file) is scored on --data libsvm:TEST by the
 * worker's own evaluation (worker/embed_train.h: dp_embed_eval_file), so
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
#include "worker/embed_train.h"
#include "worker/net.h"
#include "worker/sparse_data.h"

static const char s_synopsis[] =
    "usage: downpour eval --checkpoint FILE.safetensors [--data SPEC] [--device cpu|cuda:K]\n"
    "                     [--batch B] [--limit N]\n"
    "       downpour eval --checkpoint FILE.safetensors --data libsvm:TEST [--batch B] [--threads N]\n"
    "Prints {\"test_accuracy\": ..., \"test_loss\": ..., \"n\": ...} for the test split; for a\n"
    "sparse model (embed:D, its rows in the file) on libsvm data also test_auc and rows, the\n"
    "numbers its run's summary.json reported for the same test file (at its --threads).\n"
    "\n";

/* A sparse model's file on the libsvm file of spec ("libsvm:TEST", or the
 * run's own "libsvm:TRAIN:TEST": its test file). The exit status. */
static int s_eval_sparse(const char *ckpt, const char *spec, int batch, int limit, int threads)
{
    char err[DP_ERR_LEN] = "";
    const char *test = strrchr(spec, ':') + 1; /* dp_sparse_data_is: "libsvm:" at least */
    dp_embed_scores_t e;
    if (limit > 0) dp_err(err, "--limit is for image data: cut the libsvm file (head -n N) instead");
    else if (!test[0]) dp_err(err, "--data %s: name the test file (libsvm:TEST)", spec);
    if (err[0] || dp_embed_eval_file(ckpt, test, batch, threads, &e, err) != 0) {
        fprintf(stderr, "downpour eval: %s\n", err);
        return 1;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "test_accuracy", e.accuracy);
    cJSON_AddNumberToObject(out, "test_loss", e.loss);
    cJSON_AddNumberToObject(out, "test_auc", e.auc);
    cJSON_AddNumberToObject(out, "n", (double)e.samples);
    cJSON_AddNumberToObject(out, "rows", (double)e.rows);
    cJSON_AddNumberToObject(out, "batch", e.batch);
    cJSON_AddStringToObject(out, "checkpoint", ckpt);
    char *line = cJSON_PrintUnformatted(out);
    printf("%s\n", line);
    cJSON_free(line);
    cJSON_Delete(out);
    return 0;
}

int dp_eval_main(int argc, char **argv)
{
    const char *ckpt = NULL, *data = "fashion-mnist", *device = "cpu";
    int batch = 0, limit = 0, threads = 0;
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
    };
    dp_opts_t o;
    dp_opts_init(&o, "downpour eval", s_synopsis, NULL);
    dp_opts_add(&o, t, (int)(sizeof t / sizeof t[0]));
    char err[DP_ERR_LEN] = "";
    dp_opts_result_t r = dp_opts_parse(&o, argc, argv, err);
    if (r == DP_OPTS_PARSED && !ckpt) r = dp_err(err, "--checkpoint FILE is required (see downpour eval --help)");
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("downpour eval", r, err);
    if (dp_sparse_data_is(data)) return s_eval_sparse(ckpt, data, batch, limit, threads);
    if (threads > 0) dp_cpu_set_threads(threads);
    if (batch == 0) batch = 256;
    dp_dataset_t test = {0};
    dp_model_t m;
    dp_backend_t *be = NULL;
    dp_net_t net = {0};
    float *params = NULL, *x = NULL;
    int *y = NULL, rc = 1;
    char *spec = dp_safetensors_read_meta(ckpt, "spec", err);
    if (!spec) {
        if (!err[0]) snprintf(err, sizeof err, "%s: no model spec in the metadata (not a Downpour checkpoint?)", ckpt);
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
    if (m.embed_dim > 0) { /* its data is sparse: an image set cannot feed it */
        dp_err(err, "%s: '%s' starts with an embedding: score it on libsvm data (--data "
               "libsvm:TEST)", ckpt, m.spec);
        goto done;
    }
    params = dp_malloc(m.n_floats * sizeof(float));
    if (dp_checkpoint_load(ckpt, &m, params, NULL, NULL, err) != 0) goto done;
    if (dp_backend_new(&be, device, err) != 0) goto done;
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
    cJSON_AddStringToObject(out, "checkpoint", ckpt);
    char *line = cJSON_PrintUnformatted(out);
    printf("%s\n", line);
    cJSON_free(line);
    cJSON_Delete(out);
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
