/* eval: `downpour eval --checkpoint F [--data D] [--device DEV]` — the test
 * accuracy of a saved model as one JSON line. The model spec and input shape
 * come from the checkpoint's own metadata, so any Downpour checkpoint can be
 * evaluated without repeating how it was trained. */
#include "deploy/launcher.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dataset.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "worker/net.h"

int dp_eval_main(int argc, char **argv)
{
    const char *ckpt = NULL, *data = "fashion-mnist", *device = "cpu";
    int batch = 256, limit = 0;
    static const struct option opts[] = {
        {"checkpoint", required_argument, 0, 'c'}, {"data", required_argument, 0, 'd'},
        {"device", required_argument, 0, 'D'},     {"batch", required_argument, 0, 'b'},
        {"limit", required_argument, 0, 'l'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'c': ckpt = optarg; break;
        case 'd': data = optarg; break;
        case 'D': device = optarg; break;
        case 'b': batch = atoi(optarg); break;
        case 'l': limit = atoi(optarg); break;
        case 'h':
            printf("usage: downpour eval --checkpoint FILE.safetensors [--data SPEC] [--device cpu|cuda:K]\n"
                   "                     [--batch B] [--limit N]\n"
                   "Prints {\"test_accuracy\": ..., \"test_loss\": ..., \"n\": ...} for the test split.\n");
            return 0;
        default: return 2;
        }
    }
    if (!ckpt || batch < 1) {
        fprintf(stderr, "downpour eval: --checkpoint FILE is required (see downpour eval --help)\n");
        return 2;
    }
    char err[DP_ERR_LEN] = "";
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
    if (dp_model_parse(&m, spec, test.c, test.h, test.w, err) != 0) goto done;
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
    printf("{\"test_accuracy\": %.5f, \"test_loss\": %.5f, \"n\": %d, \"checkpoint\": \"%s\"}\n",
           acc, loss, n, ckpt);
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
