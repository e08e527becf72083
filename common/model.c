/* model: spec parsing, shape inference, parameter table, initialisation. */
#include "common/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"

size_t dp_layer_out_size(const dp_layer_t *l)
{
    return (size_t)l->out_c * l->out_h * l->out_w;
}

/* Append a parameter tensor of layer l (token tok) to m: its element count
 * and the new total checked against DP_MODEL_MAX_FLOATS, fan_in against
 * DP_MODEL_MAX_DIM. Its index, or -1 with err naming tok. */
static int s_add_param(dp_model_t *m, const char *tok, const char *layer, const char *what,
                       int ndim, const int *shape, size_t fan_in, char *err)
{
    dp_param_t *p = &m->params[m->n_params];
    size_t count = 1, total = 0;
    for (int i = 0; i < ndim; i++)
        if (dp_size_mul(count, (size_t)shape[i], &count) != 0) count = SIZE_MAX;
    if (count > DP_MODEL_MAX_FLOATS || dp_size_add(m->n_floats, count, &total) != 0 ||
        total > DP_MODEL_MAX_FLOATS)
        return dp_err(err, "model spec: '%s' makes %s.%s too large (the parameters would pass "
                      "%zu floats)", tok, layer, what, DP_MODEL_MAX_FLOATS);
    if (fan_in < 1 || fan_in > DP_MODEL_MAX_DIM)
        return dp_err(err, "model spec: '%s': fan-in %zu out of range (1..%zu)", tok, fan_in,
                      DP_MODEL_MAX_DIM);
    snprintf(p->name, sizeof p->name, "%s.%s", layer, what);
    p->ndim = ndim;
    for (int i = 0; i < DP_PARAM_MAX_DIMS; i++) p->shape[i] = i < ndim ? shape[i] : 1;
    p->count = count;
    p->offset = m->n_floats;
    p->fan_in = (int)fan_in;
    p->trainable = 1;
    m->n_floats = total;
    return m->n_params++;
}

/* A decimal integer in [lo, hi] at *p (advanced past it); -1 otherwise.
 * strtol, not sscanf's %d: an out-of-range number is refused, not wrapped. */
static int s_int(const char **p, long lo, long hi, int *out)
{
    if (**p < '0' || **p > '9') return -1;
    char *end = NULL;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (errno || v < lo || v > hi) return -1;
    *p = end;
    *out = (int)v;
    return 0;
}

/* A per-sample activation c*h*w that fits DP_MODEL_MAX_DIM, else -1. */
static int s_act_ok(long c, long h, long w)
{
    size_t n;
    return dp_size_mul((size_t)c, (size_t)h, &n) == 0 && dp_size_mul(n, (size_t)w, &n) == 0 &&
                   n <= DP_MODEL_MAX_DIM
               ? 0
               : -1;
}

/* Parse "convKxK:OUT[:same|:valid]". */
static int s_parse_conv(dp_layer_t *l, const char *tok, char *err)
{
    int k1 = 0, k2 = 0, out = 0;
    const char *rest = tok + 4;
    if (s_int(&rest, 1, INT32_MAX, &k1) != 0 || *rest++ != 'x' ||
        s_int(&rest, 1, INT32_MAX, &k2) != 0 || *rest++ != ':' ||
        s_int(&rest, 1, INT32_MAX, &out) != 0 || k1 != k2)
        return dp_err(err, "model spec: bad convolution '%s' (expected convKxK:OUT, e.g. conv5x5:32)", tok);
    l->k = k1;
    l->stride = 1;
    l->out_c = out;
    if (*rest == 0 || strcmp(rest, ":same") == 0) {
        if (k1 % 2 == 0)
            return dp_err(err, "model spec: '%s': 'same' padding needs an odd kernel size", tok);
        l->pad = k1 / 2;
    } else if (strcmp(rest, ":valid") == 0) {
        l->pad = 0;
    } else {
        return dp_err(err, "model spec: bad padding in '%s' (use :same or :valid)", tok);
    }
    return 0;
}

/* Parametric layers are numbered by kind: conv1, conv2, fc1, ... */
typedef struct {
    int conv, fc;
} s_count_t;

/* Each s_layer_* sets one kind's fields and output shape; l->in_* hold the
 * previous layer's output (or the input). */

static int s_layer_conv(dp_model_t *m, dp_layer_t *l, const char *tok, s_count_t *n, char *err)
{
    if (s_parse_conv(l, tok, err) != 0) return -1;
    if (n->fc > 0) return dp_err(err, "model spec: '%s' after a fully connected layer", tok);
    l->kind = DP_LAYER_CONV;
    snprintf(l->name, sizeof l->name, "conv%d", ++n->conv);
    /* In 64 bits: sides, pad and kernel are each below 2^31. */
    long long oh = ((long long)l->in_h + 2LL * l->pad - l->k) / l->stride + 1;
    long long ow = ((long long)l->in_w + 2LL * l->pad - l->k) / l->stride + 1;
    if (oh < 1 || ow < 1)
        return dp_err(err, "model spec: '%s' leaves no output on a %dx%d input", tok, l->in_h, l->in_w);
    if (s_act_ok(l->out_c, (long)oh, (long)ow) != 0)
        return dp_err(err, "model spec: '%s': its output (%d x %lld x %lld) passes %zu floats "
                      "a sample", tok, l->out_c, oh, ow, DP_MODEL_MAX_DIM);
    l->out_h = (int)oh;
    l->out_w = (int)ow;
    int ws[4] = {l->out_c, l->in_c, l->k, l->k};
    size_t fan_in = SIZE_MAX;
    if (dp_size_mul((size_t)l->in_c, (size_t)l->k, &fan_in) != 0 ||
        dp_size_mul(fan_in, (size_t)l->k, &fan_in) != 0)
        fan_in = SIZE_MAX;
    if ((l->weight = s_add_param(m, tok, l->name, "weight", 4, ws, fan_in, err)) < 0 ||
        (l->bias = s_add_param(m, tok, l->name, "bias", 1, &l->out_c, fan_in, err)) < 0)
        return -1;
    return 0;
}

static int s_layer_maxpool(dp_layer_t *l, const char *tok, const s_count_t *n, char *err)
{
    char *end = NULL;
    long k = strtol(tok + 7, &end, 10);
    if (end == tok + 7 || *end || k < 1 || k > 64)
        return dp_err(err, "model spec: bad pooling '%s' (expected maxpoolK, e.g. maxpool2)", tok);
    if (n->fc > 0) return dp_err(err, "model spec: '%s' after a fully connected layer", tok);
    l->kind = DP_LAYER_MAXPOOL;
    snprintf(l->name, sizeof l->name, "maxpool");
    l->k = l->stride = (int)k;
    l->out_c = l->in_c;
    l->out_h = l->in_h / l->k;
    l->out_w = l->in_w / l->k;
    if (l->out_h < 1 || l->out_w < 1)
        return dp_err(err, "model spec: '%s' leaves no output on a %dx%d input", tok, l->in_h, l->in_w);
    return 0;
}

static int s_layer_fc(dp_model_t *m, dp_layer_t *l, const char *tok, s_count_t *n, char *err)
{
    char *end = NULL;
    long out = strtol(tok + 3, &end, 10);
    if (end == tok + 3 || *end || out < 1 || out > (1 << 20))
        return dp_err(err, "model spec: bad fully connected layer '%s' (expected fc:OUT, e.g. fc:512)", tok);
    l->kind = DP_LAYER_FC;
    snprintf(l->name, sizeof l->name, "fc%d", ++n->fc);
    /* Flattened; the previous layer's output was bounded by s_act_ok. */
    l->in_c = (int)((size_t)l->in_c * (size_t)l->in_h * (size_t)l->in_w);
    l->in_h = l->in_w = 1;
    l->out_c = (int)out;
    l->out_h = l->out_w = 1;
    int ws[2] = {l->out_c, l->in_c};
    if ((l->weight = s_add_param(m, tok, l->name, "weight", 2, ws, (size_t)l->in_c, err)) < 0 ||
        (l->bias = s_add_param(m, tok, l->name, "bias", 1, &l->out_c, (size_t)l->in_c, err)) < 0)
        return -1;
    return 0;
}

/* One token: which kind it is, then that kind's parse and shapes. */
static int s_parse_layer(dp_model_t *m, dp_layer_t *l, const char *tok, s_count_t *n, char *err)
{
    if (strncmp(tok, "conv", 4) == 0) return s_layer_conv(m, l, tok, n, err);
    if (strncmp(tok, "maxpool", 7) == 0) return s_layer_maxpool(l, tok, n, err);
    if (strncmp(tok, "fc:", 3) == 0) return s_layer_fc(m, l, tok, n, err);
    if (strcmp(tok, "relu") == 0) {
        l->kind = DP_LAYER_RELU;
        snprintf(l->name, sizeof l->name, "relu");
        l->out_c = l->in_c;
        l->out_h = l->in_h;
        l->out_w = l->in_w;
        return 0;
    }
    if (strcmp(tok, "softmax") == 0) {
        if (l->index == 0 || m->layers[l->index - 1].kind != DP_LAYER_FC)
            return dp_err(err, "model spec: softmax must follow a fully connected layer");
        l->kind = DP_LAYER_SOFTMAX;
        snprintf(l->name, sizeof l->name, "softmax");
        l->out_c = l->in_c;
        l->out_h = l->out_w = 1;
        m->classes = l->in_c;
        return 0;
    }
    return dp_err(err, "model spec: unknown layer '%s' (known: convKxK:OUT, maxpoolK, relu, fc:OUT, softmax)", tok);
}

/* Hash of what makes two models interchangeable on the wire: the canonical
 * spec, the input shape and every parameter's name and shape. */
static uint64_t s_fingerprint(const dp_model_t *m)
{
    uint64_t fp = dp_fnv1a(DP_FNV_SEED, m->spec, strlen(m->spec));
    int dims[3] = {m->in_c, m->in_h, m->in_w};
    fp = dp_fnv1a(fp, dims, sizeof dims);
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        fp = dp_fnv1a(fp, p->name, strlen(p->name));
        /* the first 4 dims only: a spec's tensors have at most 4, and files
         * written before shapes had 8 slots keep their fingerprints */
        fp = dp_fnv1a(fp, p->shape, 4 * sizeof p->shape[0]);
    }
    return fp;
}

/* A table's fingerprint: every name, rank, shape and trainable flag. */
static uint64_t s_table_fingerprint(const dp_model_t *m)
{
    uint64_t fp = dp_fnv1a(DP_FNV_SEED, m->spec, strlen(m->spec));
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        int head[2] = {p->ndim, p->trainable};
        fp = dp_fnv1a(fp, p->name, strlen(p->name) + 1);
        fp = dp_fnv1a(fp, head, sizeof head);
        fp = dp_fnv1a(fp, p->shape, (size_t)p->ndim * sizeof p->shape[0]);
    }
    return fp;
}

/* A state_dict key the safetensors JSON, the logs and the error lines can
 * carry as they are. */
static int s_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= DP_PARAM_NAME_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (name[i] <= ' ' || name[i] > '~' || name[i] == '"' || name[i] == '\\') return 0;
    return 1;
}

int dp_model_from_table(dp_model_t *m, const dp_table_entry_t *t, int n, char *err)
{
    memset(m, 0, sizeof *m);
    snprintf(m->spec, sizeof m->spec, "%s", DP_MODEL_TABLE_SPEC);
    if (n < 1 || n > DP_MAX_PARAMS)
        return dp_err(err, "tensor table: %d tensors (1..%d)", n, DP_MAX_PARAMS);
    for (int i = 0; i < n; i++) {
        const char *name = t[i].name ? t[i].name : "";
        if (!s_name_ok(name))
            return dp_err(err, "tensor table: entry %d: bad name '%.*s' (1..%d printable "
                          "characters, no spaces, quotes or backslashes)", i, DP_PARAM_NAME_LEN,
                          name, DP_PARAM_NAME_LEN - 1);
        if (dp_model_find_param(m, name))
            return dp_err(err, "tensor table: '%s' appears twice", name);
        if (t[i].ndim < 0 || t[i].ndim > DP_PARAM_MAX_DIMS || (t[i].ndim > 0 && !t[i].shape))
            return dp_err(err, "tensor table: '%s': rank %d (0..%d)", name, t[i].ndim,
                          DP_PARAM_MAX_DIMS);
        dp_param_t *p = &m->params[m->n_params];
        size_t count = 1, total = 0;
        for (int d = 0; d < DP_PARAM_MAX_DIMS; d++) p->shape[d] = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            int64_t v = t[i].shape[d];
            if (v < 0 || (uint64_t)v > DP_MODEL_MAX_DIM)
                return dp_err(err, "tensor table: '%s': dimension %d is %lld (0..%zu)", name, d,
                              (long long)v, DP_MODEL_MAX_DIM);
            p->shape[d] = (int)v;
            if (dp_size_mul(count, (size_t)v, &count) != 0) count = SIZE_MAX;
        }
        if (count > DP_MODEL_MAX_FLOATS || dp_size_add(m->n_floats, count, &total) != 0 ||
            total > DP_MODEL_MAX_FLOATS)
            return dp_err(err, "tensor table: '%s' makes the table pass %zu floats", name,
                          DP_MODEL_MAX_FLOATS);
        snprintf(p->name, sizeof p->name, "%s", name);
        p->ndim = t[i].ndim;
        p->count = count;
        p->offset = m->n_floats;
        p->trainable = t[i].trainable ? 1 : 0;
        m->n_floats = total;
        m->n_params++;
    }
    m->fingerprint = s_table_fingerprint(m);
    return 0;
}

int dp_model_is_table(const dp_model_t *m)
{
    return m->n_layers == 0 && strcmp(m->spec, DP_MODEL_TABLE_SPEC) == 0;
}

int dp_model_parse(dp_model_t *m, const char *spec, int in_c, int in_h, int in_w, char *err)
{
    memset(m, 0, sizeof *m);
    if (in_c < 1 || in_h < 1 || in_w < 1 || s_act_ok(in_c, in_h, in_w) != 0)
        return dp_err(err, "model spec: bad input shape %dx%dx%d", in_c, in_h, in_w);
    m->in_c = in_c;
    m->in_h = in_h;
    m->in_w = in_w;
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", spec) >= (int)sizeof buf)
        return dp_err(err, "model spec: too long");
    s_count_t count = {0, 0};
    char *save = NULL;
    size_t spec_len = 0;
    for (char *tok = strtok_r(buf, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save)) {
        if (m->n_layers == DP_MAX_LAYERS)
            return dp_err(err, "model spec: more than %d layers", DP_MAX_LAYERS);
        const dp_layer_t *prev = m->n_layers ? &m->layers[m->n_layers - 1] : NULL;
        if (prev && prev->kind == DP_LAYER_SOFTMAX)
            return dp_err(err, "model spec: '%s' after softmax (softmax must be last)", tok);
        dp_layer_t *l = &m->layers[m->n_layers];
        l->index = m->n_layers;
        l->weight = l->bias = -1;
        l->in_c = prev ? prev->out_c : in_c;
        l->in_h = prev ? prev->out_h : in_h;
        l->in_w = prev ? prev->out_w : in_w;
        if (s_parse_layer(m, l, tok, &count, err) != 0) return -1;
        size_t in_sz = (size_t)l->in_c * l->in_h * l->in_w;
        if (in_sz > m->max_act) m->max_act = in_sz;
        if (dp_layer_out_size(l) > m->max_act) m->max_act = dp_layer_out_size(l);
        spec_len += (size_t)snprintf(m->spec + spec_len, sizeof m->spec - spec_len, "%s%s",
                                     m->n_layers ? " " : "", tok);
        if (spec_len >= sizeof m->spec) return dp_err(err, "model spec: too long");
        m->n_layers++;
    }
    if (m->n_layers == 0) return dp_err(err, "model spec: empty");
    if (m->layers[m->n_layers - 1].kind != DP_LAYER_SOFTMAX)
        return dp_err(err, "model spec: must end with 'fc:CLASSES softmax'");
    if (m->classes < 2) return dp_err(err, "model spec: the last fc layer needs at least 2 outputs");
    m->fingerprint = s_fingerprint(m);
    return 0;
}

void dp_model_init_params(const dp_model_t *m, float *params, uint64_t seed)
{
    dp_rng_t rng;
    dp_rng_seed(&rng, seed);
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        if (p->fan_in < 1) { /* a table's: its values come from its file */
            memset(params + p->offset, 0, p->count * sizeof(float));
            continue;
        }
        /* kaiming_uniform(a=sqrt(5)) gives bound = sqrt(6 / ((1 + 5) * fan_in))
         * = 1/sqrt(fan_in), the same bound PyTorch uses for the bias. */
        float bound = 1.0f / sqrtf((float)p->fan_in);
        float *x = params + p->offset;
        for (size_t j = 0; j < p->count; j++) x[j] = (2.0f * dp_rng_uniform(&rng) - 1.0f) * bound;
    }
}

const dp_param_t *dp_model_find_param(const dp_model_t *m, const char *name)
{
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

double dp_model_forward_macs(const dp_model_t *m)
{
    double macs = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        if (l->kind == DP_LAYER_CONV)
            macs += (double)l->out_c * l->out_h * l->out_w * l->in_c * l->k * l->k;
        else if (l->kind == DP_LAYER_FC)
            macs += (double)l->out_c * l->in_c;
    }
    return macs;
}
