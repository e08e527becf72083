/* test_torch_parity: resnet20 against PyTorch (tests/torch_parity.py, run
 * with $TORCH_PY, default Debian's /usr/bin/python3 with python3-torch):
 * the same weights and batch give the same training loss (relative 1e-5),
 * the same gradients (each tensor within 1e-4 of its norm), the same
 * running statistics after the step (PyTorch's momentum and unbiased
 * variance) and the same evaluation-mode outputs; the model file loads
 * with load_state_dict(strict=True), num_batches_tracked as int64. Also
 * the file's round trip through dp_checkpoint_load (I64 read back). Skipped
 * when torch is not importable. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model.h"
#include "common/rng.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "worker/exec/net.h"
#include "tests/test.h"

static const char *s_py(void)
{
    const char *p = getenv("TORCH_PY");
    return p && p[0] ? p : "/usr/bin/python3";
}

static void test_resnet20_matches_pytorch(void)
{
    char cmd[1024], dir[256], path[512], err[DP_ERR_LEN] = "";
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' 2>/dev/null", s_py());
    if (system(cmd) != 0) SKIP("no python3-torch ($TORCH_PY)");
    snprintf(dir, sizeof dir, "/tmp/dp-test-parity-%d", (int)getpid());
    CHECK_EQ(mkdir(dir, 0755), 0);
    dp_model_t m;
    int side = 28; /* Fashion-MNIST's: 28 -> 14 -> 7, odd sides in stage 3 */
    CHECK_EQ(dp_model_parse(&m, "resnet20", 1, side, side, err), 0);
    CHECK_EQ(m.n_params, 1 + 5 + 9 * (2 + 10) + 2);
    CHECK(dp_model_find_param(&m, "layer3.2.bn2.num_batches_tracked") != NULL);
    CHECK(dp_model_find_param(&m, "layer1.0.conv1.bias") == NULL);
    CHECK(dp_model_find_param(&m, "fc.weight") != NULL);
    int B = 8;
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    size_t n = m.n_floats, nx = (size_t)B * side * side;
    float *w = dp_malloc(n * sizeof(float)), *g = dp_malloc(n * sizeof(float));
    float *after = dp_malloc(n * sizeof(float)), *back = dp_malloc(n * sizeof(float));
    float *x = dp_malloc(nx * sizeof(float)), yf[8], probs[8 * 10];
    int y[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    dp_model_init_params(&m, w, 7);
    dp_rng_t r;
    dp_rng_seed(&r, 10);
    /* batch norm away from its initial 1 / 0 / 0 / 1, so that every term shows.
     * The seed matters in one way: a relu whose input lies within float
     * noise of 0 (|x| ~ 1e-7, which seed 8 draws in layer2.2) may go either
     * way in two float implementations, and one such element moves a
     * tensor's gradient by ~1e-3 of its norm; this seed draws none. */
    for (int i = 0; i < m.n_params; i++) {
        const dp_param_t *p = &m.params[i];
        for (size_t j = 0; j < p->count && !strstr(p->name, "conv"); j++) {
            float u = dp_rng_uniform(&r);
            if (strstr(p->name, "running_var")) w[p->offset + j] = 0.5f + u;
            else if (strstr(p->name, "num_batches")) w[p->offset + j] = 3;
            else if (strstr(p->name, "bn")) w[p->offset + j] += 0.4f * (2 * u - 1);
        }
    }
    for (size_t i = 0; i < nx; i++) x[i] = dp_rng_uniform(&r);
    for (int b = 0; b < B; b++) yf[b] = (float)y[b];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_EQ(dp_checkpoint_save(path, &m, w, 0, 0, NULL, err), 0);
    CHECK_EQ(dp_checkpoint_load(path, &m, back, NULL, NULL, err), 0);
    CHECK(memcmp(back, w, n * sizeof(float)) == 0);
    dp_net_set_params(&net, w);
    int correct = 0;
    dp_net_evaluate(&net, x, y, B, &correct);
    memcpy(probs, net.h_probs, sizeof probs);
    float loss = dp_net_train_step(&net, x, y, B);
    dp_net_get_grads(&net, g);
    dp_net_get_params(&net, after);
    /* step.safetensors: batch, loss, probabilities, gradients, state after */
    dp_st_tensor_t *t = dp_malloc((size_t)(m.n_params + 4) * sizeof *t);
    int64_t sx[4] = {B, 1, side, side}, sy[1] = {B}, sl[1] = {1}, sp[2] = {B, 10};
    int64_t shapes[DP_MAX_PARAMS][DP_PARAM_MAX_DIMS];
    char names[DP_MAX_PARAMS][DP_PARAM_NAME_LEN + 8];
    int k = 0;
    t[k++] = (dp_st_tensor_t){"x", x, 4, sx};
    t[k++] = (dp_st_tensor_t){"y", yf, 1, sy};
    t[k++] = (dp_st_tensor_t){"loss", &loss, 1, sl};
    t[k++] = (dp_st_tensor_t){"probs", probs, 2, sp};
    for (int i = 0; i < m.n_params; i++) {
        const dp_param_t *p = &m.params[i];
        for (int d = 0; d < p->ndim; d++) shapes[i][d] = p->shape[d];
        snprintf(names[i], sizeof names[i], "%s.%s", p->trainable ? "grad" : "after", p->name);
        t[k++] = (dp_st_tensor_t){names[i], (p->trainable ? g : after) + p->offset, p->ndim, shapes[i]};
    }
    snprintf(path, sizeof path, "%s/step.safetensors", dir);
    CHECK_EQ(dp_safetensors_write(path, t, k, NULL, err), 0);
    snprintf(cmd, sizeof cmd, "'%s' tests/torch_parity.py '%s' >&2", s_py(), dir);
    CHECK_EQ(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "  cannot remove %s\n", dir);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(t), free(w), free(g), free(after), free(back), free(x);
}

DP_TESTS(T(test_resnet20_matches_pytorch))
