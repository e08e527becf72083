/* bench_client: the C worker's client (worker/client/ps_client.h, linked as
 * downpour-worker links it) timing pull + push of the whole parameter
 * vector against running servers, the C side of tests/bench/py_client.py
 * (which runs it between its own Python rounds, so both see the same load).
 *
 *   bench_client ENDPOINTS TASK ROUNDS [SPEC [zmq|auto]]
 *
 * Connects as worker TASK of the spec (default: the default model), makes
 * 3 warm-up rounds, then ROUNDS rounds of one pull into a buffer of its own
 * (as the CPU worker pulls) and one push of a constant gradient, and prints
 * one line per round: "c PULL_MS PUSH_MS". Exit status non-zero on error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/util.h"
#include "worker/client/ps_client.h"

int main(int argc, char **argv)
{
    char err[DP_ERR_LEN];
    if (argc < 4) {
        fprintf(stderr, "usage: bench_client ENDPOINTS TASK ROUNDS [SPEC [zmq|auto]]\n");
        return 2;
    }
    int task = atoi(argv[2]), rounds = atoi(argv[3]);
    const char *spec = argc > 4 ? argv[4] : DP_MODEL_DEFAULT_SPEC;
    dp_ps_client_opts_t o = {.timeout_s = 30};
    if (argc > 5 && dp_ps_transport_parse(argv[5], &o.transport, err) != 0) {
        fprintf(stderr, "bench_client: %s\n", err);
        return 2;
    }
    dp_model_t *m = dp_malloc(sizeof *m);
    dp_ps_client_t *c = NULL;
    if (dp_model_parse(m, spec, 1, 28, 28, err) != 0 ||
        dp_ps_client_new(&c, argv[1], m, task, &o, NULL, err) != 0) {
        fprintf(stderr, "bench_client: %s\n", err);
        free(m);
        return 1;
    }
    float *params = dp_aligned_alloc(m->n_floats * sizeof(float));
    float *grads = dp_aligned_alloc(m->n_floats * sizeof(float));
    for (size_t i = 0; i < m->n_floats; i++) grads[i] = 1e-6f;
    int rc = 0;
    for (int r = 0; r < 3 + rounds && rc == 0; r++) {
        double t0 = dp_now();
        if (dp_ps_client_pull(c, params, err) != 0) rc = 1;
        double t1 = dp_now();
        dp_ps_push_t p = {.grads = grads, .batch = 1, .step = dp_ps_client_resume_step(c) + r + 1};
        if (rc == 0 && dp_ps_client_push(c, &p, NULL, err) != 0) rc = 1;
        double t2 = dp_now();
        if (rc == 0 && r >= 3) printf("c %.4f %.4f\n", (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    }
    if (rc == 0 && dp_ps_client_finish(c, err) != 0) rc = 1;
    if (rc) fprintf(stderr, "bench_client: %s\n", err);
    dp_ps_client_destroy(&c);
    free(params);
    free(grads);
    free(m);
    return rc;
}
