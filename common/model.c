/* model: spec parsing, shape inference, parameter table, initialisation. */
#include "common/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"

int dp_model_layer_span(const dp_model_t *m, int i, size_t *lo, size_t *hi)
{
    const dp_layer_t *l = &m->layers[i];
    int idx[5] = {l->weight, l->bias, l->running_mean, l->running_var, l->num_batches_tracked};
    *lo = (size_t)-1;
    *hi = 0;
    for (int k = 0; k < 5; k++) {
        if (idx[k] < 0) continue;
        const dp_param_t *p = &m->params[idx[k]];
        if (p->offset < *lo) *lo = p->offset;
        if (p->offset + p->count > *hi) *hi = p->offset + p->count;
    }
    return *hi > *lo;
}

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
    if (m->n_params == DP_MAX_PARAMS)
        return dp_err(err, "model spec: '%s': more than %d parameter tensors", tok, DP_MAX_PARAMS);
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
    p->init = DP_INIT_FAN_IN;
    p->counter = 0;
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

/* Parse "convKxK:OUT[:same|:valid][:sS][:pP]". */
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
    int pad = -1, same = 1;
    while (*rest) {
        if (*rest++ != ':') return dp_err(err, "model spec: bad convolution '%s'", tok);
        if (strncmp(rest, "same", 4) == 0 && (rest[4] == 0 || rest[4] == ':')) {
            same = 1;
            rest += 4;
        } else if (strncmp(rest, "valid", 5) == 0 && (rest[5] == 0 || rest[5] == ':')) {
            same = 0;
            rest += 5;
        } else if (*rest == 's') {
            rest++;
            if (s_int(&rest, 1, 64, &l->stride) != 0)
                return dp_err(err, "model spec: bad stride in '%s' (:sS, S in 1..64)", tok);
        } else if (*rest == 'p') {
            rest++;
            if (s_int(&rest, 0, 64, &pad) != 0)
                return dp_err(err, "model spec: bad padding in '%s' (:pP, P in 0..64)", tok);
        } else {
            return dp_err(err, "model spec: bad option in '%s' (use :same, :valid, :sS or :pP)", tok);
        }
    }
    if (pad >= 0) {
        l->pad = pad;
    } else if (same) {
        if (k1 % 2 == 0)
            return dp_err(err, "model spec: '%s': 'same' padding needs an odd kernel size", tok);
        l->pad = k1 / 2;
    } else {
        l->pad = 0;
    }
    return 0;
}

/* The parser's state: parametric layers numbered by kind (conv1, fc1, ...),
 * within a block by the block's own counters. */
typedef struct {
    int conv, fc, bn;      /* outside blocks */
    int bconv, bbn;        /* inside the open block */
    int torch_names;       /* the spec has blocks: torchvision's names */
    int n_fc;              /* fc tokens in the spec */
    int next_is_bn;        /* the token after this one is bn */
    int in_block;          /* inside res( ... ) */
} s_count_t;

/* "conv2" or, inside a block, "conv2" of the block (prefixed when it closes). */
static void s_name(dp_layer_t *l, const char *kind, int *outer, int *inner, const s_count_t *n)
{
    snprintf(l->name, sizeof l->name, "%s%d", kind, n->in_block ? ++*inner : ++*outer);
}

/* Each s_layer_* sets one kind's fields and output shape; l->in_* hold the
 * previous layer's output (or the input). */

static int s_layer_conv(dp_model_t *m, dp_layer_t *l, const char *tok, s_count_t *n, char *err)
{
    if (s_parse_conv(l, tok, err) != 0) return -1;
    if (n->fc > 0) return dp_err(err, "model spec: '%s' after a fully connected layer", tok);
    l->kind = DP_LAYER_CONV;
    s_name(l, "conv", &n->conv, &n->bconv, n);
    /* In 64 bits: sides, pad and kernel are each below 2^31. */
    long long oh = ((long long)l->in_h + 2LL * l->pad - l->k) / l->stride + 1;
    long long ow = ((long long)l->in_w + 2LL * l->pad - l->k) / l->stride + 1;
    if ((long long)l->in_h + 2LL * l->pad < l->k || (long long)l->in_w + 2LL * l->pad < l->k ||
        oh < 1 || ow < 1)
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
    if ((l->weight = s_add_param(m, tok, l->name, "weight", 4, ws, fan_in, err)) < 0) return -1;
    if (!n->next_is_bn &&
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
    if (n->in_block) return dp_err(err, "model spec: '%s' inside a res block", tok);
    l->kind = DP_LAYER_FC;
    if (n->torch_names && n->n_fc == 1)
        snprintf(l->name, sizeof l->name, "fc");
    else
        snprintf(l->name, sizeof l->name, "fc%d", ++n->fc);
    if (n->fc == 0) n->fc = 1; /* "after a fully connected layer" checks count it */
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

/* A parameter-free layer whose output has its input's shape. */
static void s_same_shape(dp_layer_t *l, dp_layer_kind_t kind, const char *name)
{
    l->kind = kind;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->out_c = l->in_c;
    l->out_h = l->in_h;
    l->out_w = l->in_w;
}

/* A layer's running statistics (bn's, obsnorm's): the mean (zeros), the
 * variance (ones) and the counter named count_name, all state, not trained.
 * -1 with err when one does not fit. */
static int s_add_running_stats(dp_model_t *m, dp_layer_t *l, const char *tok, int n,
                               const char *count_name, char *err)
{
    if ((l->running_mean = s_add_param(m, tok, l->name, "running_mean", 1, &n, 1, err)) < 0 ||
        (l->running_var = s_add_param(m, tok, l->name, "running_var", 1, &n, 1, err)) < 0 ||
        (l->num_batches_tracked = s_add_param(m, tok, l->name, count_name, 0, NULL, 1, err)) < 0)
        return -1;
    int idx[3] = {l->running_mean, l->running_var, l->num_batches_tracked};
    for (int k = 0; k < 3; k++) {
        m->params[idx[k]].init = k == 1 ? DP_INIT_ONES : DP_INIT_ZEROS;
        m->params[idx[k]].trainable = 0;
    }
    m->params[l->num_batches_tracked].counter = 1;
    return 0;
}

/* bn: PyTorch's five tensors, weight and bias trained, the rest state. */
static int s_layer_bn(dp_model_t *m, dp_layer_t *l, const char *tok, s_count_t *n, char *err)
{
    s_same_shape(l, DP_LAYER_BN, "");
    s_name(l, "bn", &n->bn, &n->bbn, n);
    l->eps = 1e-5f;
    l->momentum = 0.1f;
    int c = l->in_c;
    if ((l->weight = s_add_param(m, tok, l->name, "weight", 1, &c, 1, err)) < 0 ||
        (l->bias = s_add_param(m, tok, l->name, "bias", 1, &c, 1, err)) < 0 ||
        s_add_running_stats(m, l, tok, c, "num_batches_tracked", err) != 0)
        return -1;
    m->params[l->weight].init = DP_INIT_ONES;
    m->params[l->bias].init = DP_INIT_ZEROS;
    return 0;
}

/* obsnorm: the input's running mean and variance, and their count: state. */
static int s_layer_obsnorm(dp_model_t *m, dp_layer_t *l, const char *tok, char *err)
{
    if (l->index != 0 || m->embed_dim > 0)
        return dp_err(err, "model spec: 'obsnorm' must be the first token (it normalises the input)");
    s_same_shape(l, DP_LAYER_OBSNORM, "obsnorm");
    return s_add_running_stats(m, l, tok, (int)dp_layer_out_size(l), "count", err);
}

/* sigmoid: the binary head on one logit, an fc:1's or embed:1's (which
 * has no bias, so the head brings its own: the scalar "bias"). */
static int s_layer_sigmoid(dp_model_t *m, dp_layer_t *l, const s_count_t *n, char *err)
{
    int after_embed = l->index == 0 && m->embed_dim > 0;
    const dp_layer_t *prev = l->index > 0 ? &m->layers[l->index - 1] : NULL;
    if (!after_embed && (!prev || prev->kind != DP_LAYER_FC))
        return dp_err(err, "model spec: sigmoid must follow fc:1 or embed:1 (its one logit, as "
                      "in 'fc:1 sigmoid' or 'embed:1 sigmoid')");
    if (l->in_c != 1)
        return dp_err(err, "model spec: sigmoid reads one logit but %s gives %d (write %s:1 "
                      "sigmoid, or softmax for %d classes)", after_embed ? "the embedding" :
                      prev->name, l->in_c, after_embed ? "embed" : "fc", l->in_c);
    if (n->in_block) return dp_err(err, "model spec: sigmoid inside a res block");
    l->kind = DP_LAYER_SIGMOID;
    snprintf(l->name, sizeof l->name, "sigmoid");
    l->out_c = 2; /* the probabilities of classes 0 and 1 */
    l->out_h = l->out_w = 1;
    m->classes = 2;
    if (after_embed) {
        int one = 1;
        if ((l->bias = s_add_param(m, "sigmoid", "sigmoid", "bias", 1, &one, 1, err)) < 0)
            return -1;
        snprintf(m->params[l->bias].name, sizeof m->params[l->bias].name, "bias");
        m->params[l->bias].init = DP_INIT_ZEROS;
    }
    return 0;
}

/* One token: which kind it is, then that kind's parse and shapes. */
static int s_parse_layer(dp_model_t *m, dp_layer_t *l, const char *tok, s_count_t *n, char *err)
{
    if (strncmp(tok, "conv", 4) == 0) return s_layer_conv(m, l, tok, n, err);
    if (strncmp(tok, "maxpool", 7) == 0) return s_layer_maxpool(l, tok, n, err);
    if (strncmp(tok, "fc:", 3) == 0) return s_layer_fc(m, l, tok, n, err);
    if (strcmp(tok, "relu") == 0) {
        s_same_shape(l, DP_LAYER_RELU, "relu");
        return 0;
    }
    if (strcmp(tok, "tanh") == 0) {
        s_same_shape(l, DP_LAYER_TANH, "tanh");
        return 0;
    }
    if (strcmp(tok, "bn") == 0) return s_layer_bn(m, l, tok, n, err);
    if (strcmp(tok, "obsnorm") == 0) return s_layer_obsnorm(m, l, tok, err);
    if (strcmp(tok, "gap") == 0) {
        if (n->fc > 0) return dp_err(err, "model spec: 'gap' after a fully connected layer");
        s_same_shape(l, DP_LAYER_GAP, "gap");
        l->out_h = l->out_w = 1;
        return 0;
    }
    if (strncmp(tok, "dropout:", 8) == 0) {
        char *end = NULL;
        errno = 0;
        double p = strtod(tok + 8, &end);
        if (end == tok + 8 || *end || errno || !(p >= 0 && p < 1))
            return dp_err(err, "model spec: bad dropout '%s' (expected dropout:P, 0 <= P < 1)", tok);
        s_same_shape(l, DP_LAYER_DROPOUT, "dropout");
        l->p = (float)p;
        return 0;
    }
    if (strcmp(tok, "softmax") == 0) {
        /* right after an embedding its D outputs are the logits */
        int after_embed = l->index == 0 && m->embed_dim > 0;
        if (!after_embed && (l->index == 0 || m->layers[l->index - 1].kind != DP_LAYER_FC))
            return dp_err(err, "model spec: softmax must follow a fully connected layer (or "
                          "embed:D, as in 'embed:2 softmax')");
        if (n->in_block) return dp_err(err, "model spec: softmax inside a res block");
        l->kind = DP_LAYER_SOFTMAX;
        snprintf(l->name, sizeof l->name, "softmax");
        l->out_c = l->in_c;
        l->out_h = l->out_w = 1;
        m->classes = l->in_c;
        return 0;
    }
    if (strcmp(tok, "sigmoid") == 0) return s_layer_sigmoid(m, l, n, err);
    return dp_err(err, "model spec: unknown layer '%s' (known: convKxK:OUT, maxpoolK, relu, tanh, "
                  "bn, gap, dropout:P, res( ... ), res:b( ... ), fc:OUT, softmax, sigmoid, ac:A, "
                  "embed:D or obsnorm first)", tok);
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

/* A table's fingerprint: every name, rank, shape and trainable flag, and
 * its row table's width. */
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
    /* a row table beside it (a table without one keeps its fingerprint) */
    if (m->embed_dim) fp = dp_fnv1a(fp, &m->embed_dim, sizeof m->embed_dim);
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

int dp_model_table_rows(dp_model_t *m, int d, char *err)
{
    if (!dp_model_is_table(m)) return dp_err(err, "a row table beside a spec's model: use embed:D");
    if (d < 1 || d > DP_MODEL_MAX_EMBED)
        return dp_err(err, "tensor table: a row table of width %d (1..%d)", d, DP_MODEL_MAX_EMBED);
    m->embed_dim = d;
    m->fingerprint = s_table_fingerprint(m);
    return 0;
}

int dp_model_is_table(const dp_model_t *m)
{
    return m->n_layers == 0 && strcmp(m->spec, DP_MODEL_TABLE_SPEC) == 0;
}

/* A preset's grammar text (malloc'd), or NULL when name is no preset: resnetN,
 * N = 6n + 2 (He et al.'s CIFAR ResNets). */
static char *s_preset(const char *name, char *err)
{
    if (strncmp(name, "resnet", 6) != 0) return NULL;
    const char *p = name + 6;
    int depth = 0;
    if (s_int(&p, 8, 1202, &depth) != 0 || *p || (depth - 2) % 6 != 0) {
        dp_err(err, "model spec: unknown preset '%s' (resnetN with N = 6n + 2: resnet20, "
               "resnet32, resnet44, resnet56, resnet110)", name);
        return NULL;
    }
    int blocks = (depth - 2) / 6;
    size_t cap = 64 + (size_t)blocks * 3 * 64, len = 0;
    char *out = dp_malloc(cap);
    len += (size_t)snprintf(out + len, cap - len, "conv3x3:16 bn relu");
    for (int st = 0; st < 3; st++)
        for (int i = 0; i < blocks; i++) {
            int c = 16 << st;
            len += (size_t)snprintf(out + len, cap - len,
                                    " res( conv3x3:%d%s bn relu conv3x3:%d bn ) relu", c,
                                    st > 0 && i == 0 ? ":s2" : "", c);
        }
    snprintf(out + len, cap - len, " gap fc:10 softmax");
    return out;
}

/* Split spec into tokens, "(" and ")" standing alone; *n tokens in the
 * returned array of pointers into *buf (both malloc'd). */
static char **s_tokens(const char *spec, char **buf, int *n)
{
    size_t len = strlen(spec);
    char *b = dp_malloc(3 * len + 1); /* each parenthesis becomes " ( ": 3 bytes of 1 */
    size_t at = 0;
    for (size_t i = 0; i < len; i++) {
        if (spec[i] == '(' || spec[i] == ')') {
            b[at++] = ' ';
            b[at++] = spec[i];
            b[at++] = ' ';
            continue;
        }
        b[at++] = spec[i];
    }
    b[at] = 0;
    char **tok = dp_malloc((at / 2 + 2) * sizeof *tok);
    int k = 0;
    char *save = NULL;
    for (char *t = strtok_r(b, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save)) tok[k++] = t;
    *buf = b;
    *n = k;
    return tok;
}

/* A new layer after the current ones, reading boundary in0. */
static dp_layer_t *s_new_layer(dp_model_t *m, int in0, char *err)
{
    if (m->n_layers == DP_MAX_LAYERS) {
        dp_err(err, "model spec: more than %d layers", DP_MAX_LAYERS);
        return NULL;
    }
    dp_layer_t *l = &m->layers[m->n_layers];
    memset(l, 0, sizeof *l);
    l->index = m->n_layers;
    l->weight = l->bias = l->running_mean = l->running_var = l->num_batches_tracked = -1;
    l->in0 = in0;
    l->in1 = -1;
    const dp_layer_t *src = in0 > 0 ? &m->layers[in0 - 1] : NULL;
    l->in_c = src ? src->out_c : m->in_c;
    l->in_h = src ? src->out_h : m->in_h;
    l->in_w = src ? src->out_w : m->in_w;
    return l;
}

static void s_boundary_shape(const dp_model_t *m, int b, int *c, int *h, int *w)
{
    const dp_layer_t *l = b > 0 ? &m->layers[b - 1] : NULL;
    *c = l ? l->out_c : m->in_c;
    *h = l ? l->out_h : m->in_h;
    *w = l ? l->out_w : m->in_w;
}

static void s_track_act(dp_model_t *m, const dp_layer_t *l)
{
    size_t in_sz = (size_t)l->in_c * l->in_h * l->in_w;
    if (in_sz > m->max_act) m->max_act = in_sz;
    if (dp_layer_out_size(l) > m->max_act) m->max_act = dp_layer_out_size(l);
}

/* One fc layer of the actor-critic head, reading boundary in, named name
 * (its tensors name.weight, name.bias). */
static int s_head_fc(dp_model_t *m, int in, int out, const char *name, s_count_t *n, char *err)
{
    dp_layer_t *l = s_new_layer(m, in, err);
    if (!l) return -1;
    char tok[32];
    snprintf(tok, sizeof tok, "fc:%d", out);
    if (s_layer_fc(m, l, tok, n, err) != 0) return -1;
    snprintf(l->name, sizeof l->name, "%s", name);
    snprintf(m->params[l->weight].name, sizeof m->params[l->weight].name, "%s.weight", name);
    snprintf(m->params[l->bias].name, sizeof m->params[l->bias].name, "%s.bias", name);
    s_track_act(m, l);
    m->n_layers++;
    return 0;
}

/* ac:A after the trunk (the layers so far; none: the input itself): the
 * policy fc:A and the value fc:1 both read the trunk's output, the loss
 * layer reads both. */
static int s_ac_head(dp_model_t *m, const char *tok, s_count_t *n, char *err)
{
    const char *p = tok + 2;
    int A = 0;
    if (*p == 0)
        return dp_err(err, "model spec: 'ac' needs its number of actions: write ac:A, or give "
                      "--env, which fills in its own");
    if (*p++ != ':' || s_int(&p, 2, DP_MODEL_MAX_ACTIONS, &A) != 0 || *p)
        return dp_err(err, "model spec: bad actor-critic head '%s' (expected ac:A, A in 2..%d "
                      "actions)", tok, DP_MODEL_MAX_ACTIONS);
    if (n->in_block) return dp_err(err, "model spec: '%s' inside a res block", tok);
    int trunk = m->n_layers;
    if (s_head_fc(m, trunk, A, "policy", n, err) != 0 || s_head_fc(m, trunk, 1, "value", n, err) != 0)
        return -1;
    dp_layer_t *l = s_new_layer(m, trunk + 1, err);
    if (!l) return -1;
    l->kind = DP_LAYER_AC;
    snprintf(l->name, sizeof l->name, "ac");
    l->in1 = trunk + 2;
    l->src_c = 1, l->src_h = l->src_w = 1;
    l->out_c = A;
    l->out_h = l->out_w = 1;
    m->classes = A;
    s_track_act(m, l);
    m->n_layers++;
    return 0;
}

int dp_model_is_ac(const dp_model_t *m)
{
    return m->n_layers > 0 && m->layers[m->n_layers - 1].kind == DP_LAYER_AC;
}

int dp_model_spec_env(const char *spec, int A, int obs_norm, char *out, size_t n, char *err)
{
    char text[DP_MODEL_SPEC_LEN];
    if (dp_model_spec_actions(spec, A, text, sizeof text, err) != 0) return -1;
    int has = strncmp(text, "obsnorm", 7) == 0 && (text[7] == ' ' || text[7] == 0);
    int w = snprintf(out, n, "%s%s", obs_norm && !has ? "obsnorm " : "", text);
    if (w < 0 || (size_t)w >= n) return dp_err(err, "model spec: too long");
    return 0;
}

int dp_model_spec_actions(const char *spec, int A, char *out, size_t n, char *err)
{
    size_t len = 0;
    int heads = 0;
    const char *s = spec;
    out[0] = 0;
    for (;;) {
        s += strspn(s, " \t\n");
        if (!*s) break;
        size_t tl = strcspn(s, " \t\n");
        int w;
        if (tl == 2 && strncmp(s, "ac", 2) == 0) {
            w = snprintf(out + len, n - len, "%sac:%d", len ? " " : "", A);
            heads++;
        } else {
            const char *p = s + 3;
            int k = 0;
            if (tl > 3 && strncmp(s, "ac:", 3) == 0) {
                heads++;
                if (s_int(&p, 0, INT32_MAX, &k) == 0 && p == s + tl && k != A)
                    return dp_err(err, "model spec: '%.*s' but the environment has %d actions "
                                  "(write ac, and it takes the environment's)", (int)tl, s, A);
            }
            w = snprintf(out + len, n - len, "%s%.*s", len ? " " : "", (int)tl, s);
        }
        if (w < 0 || (size_t)w >= n - len) return dp_err(err, "model spec: too long");
        len += (size_t)w;
        s += tl;
    }
    if (heads == 0)
        return dp_err(err, "model spec: '%s' has no actor-critic head, which an environment needs: "
                      "end it with ac (e.g. 'fc:64 tanh fc:64 tanh ac')", spec);
    return 0;
}

/* A block's state while its body is parsed. */
typedef struct {
    int in;                 /* boundary of the block's input */
    int first_layer, first_param;
    int proj;               /* res:b: option B where shapes differ */
    int stage, index;       /* of the previous block (stage 0: none yet) */
    int prev_c, prev_h, prev_w;
} s_block_t;

/* Close the block: the shortcut (projection layers first for option B), the
 * add, and the torchvision names of what the block added. */
static int s_close_block(dp_model_t *m, s_block_t *bk, s_count_t *n, char *err)
{
    int ic, ih, iw;
    s_boundary_shape(m, bk->in, &ic, &ih, &iw);
    int body = m->n_layers; /* boundary of the body's output */
    if (body == bk->in) return dp_err(err, "model spec: empty res block");
    int oc, oh, ow;
    s_boundary_shape(m, body, &oc, &oh, &ow);
    int stride = (ih + oh - 1) / oh;
    if (oc < ic || stride < 1 || (ih - 1) / stride + 1 != oh || (iw - 1) / stride + 1 != ow)
        return dp_err(err, "model spec: a res block maps %dx%dx%d to %dx%dx%d: no shortcut "
                      "(channels may only grow, sides shrink by one stride)", ic, ih, iw, oc, oh, ow);
    int same = oc == ic && stride == 1, from = bk->in;
    if (!same && bk->proj) {
        /* option B: downsample.0 = 1x1 conv (stride, no bias), .1 = bn */
        dp_layer_t *c = s_new_layer(m, bk->in, err);
        if (!c) return -1;
        char tok[64];
        snprintf(tok, sizeof tok, "conv1x1:%d:valid:s%d", oc, stride);
        int keep = n->next_is_bn;
        n->next_is_bn = 1;
        if (s_layer_conv(m, c, tok, n, err) != 0) return -1;
        snprintf(c->name, sizeof c->name, "downsample.0");
        snprintf(m->params[c->weight].name, sizeof m->params[c->weight].name, "downsample.0.weight");
        c->branch = 1;
        s_track_act(m, c);
        m->n_layers++;
        dp_layer_t *b = s_new_layer(m, m->n_layers, err);
        if (!b) return -1;
        if (s_layer_bn(m, b, "bn", n, err) != 0) return -1;
        snprintf(b->name, sizeof b->name, "downsample.1");
        static const char *what[5] = {"weight", "bias", "running_mean", "running_var",
                                      "num_batches_tracked"};
        int idx[5] = {b->weight, b->bias, b->running_mean, b->running_var, b->num_batches_tracked};
        for (int k = 0; k < 5; k++)
            snprintf(m->params[idx[k]].name, sizeof m->params[idx[k]].name, "downsample.1.%s", what[k]);
        b->branch = 1;
        s_track_act(m, b);
        m->n_layers++;
        n->next_is_bn = keep;
        from = m->n_layers;
        stride = 1;
        ic = oc;
    }
    dp_layer_t *a = s_new_layer(m, body, err);
    if (!a) return -1;
    s_same_shape(a, DP_LAYER_ADD, "add");
    a->in1 = from;
    s_boundary_shape(m, from, &a->src_c, &a->src_h, &a->src_w);
    a->stride = stride;
    s_track_act(m, a);
    m->n_layers++;
    /* torchvision's names: a new stage where the block changes the shape */
    if (bk->stage == 0 || !same) {
        bk->stage++;
        bk->index = 0;
    } else {
        bk->index++;
    }
    char prefix[32];
    snprintf(prefix, sizeof prefix, "layer%d.%d.", bk->stage, bk->index);
    for (int i = bk->first_layer; i < m->n_layers; i++) {
        dp_layer_t *l = &m->layers[i];
        if (l->kind == DP_LAYER_ADD || l->weight < 0) continue;
        char nm[DP_LAYER_NAME_LEN];
        snprintf(nm, sizeof nm, "%s%s", prefix, l->name);
        snprintf(l->name, sizeof l->name, "%s", nm);
    }
    for (int i = bk->first_param; i < m->n_params; i++) {
        char nm[DP_PARAM_NAME_LEN];
        snprintf(nm, sizeof nm, "%s%s", prefix, m->params[i].name);
        snprintf(m->params[i].name, sizeof m->params[i].name, "%s", nm);
    }
    n->in_block = 0;
    return 0;
}

/* "embed:D" as the spec's first token: the layers after it read the
 * embedding's D x 1 x 1 output, whatever input shape the caller gave. */
static int s_embed(dp_model_t *m, const char *tok, int first, char *err)
{
    const char *p = tok + 5;
    int d = 0;
    if (*p++ != ':' || s_int(&p, 1, DP_MODEL_MAX_EMBED, &d) != 0 || *p)
        return dp_err(err, "model spec: bad embedding '%s' (expected embed:D, D in 1..%d floats "
                      "a row)", tok, DP_MODEL_MAX_EMBED);
    if (!first)
        return dp_err(err, "model spec: '%s' must be the first token (the embedding turns the "
                      "sample's sparse features into the input of the layers after it)", tok);
    m->embed_dim = d;
    m->in_c = d;
    m->in_h = m->in_w = 1;
    return 0;
}

/* What may follow an embedding: layers of D features (no image layers,
 * no blocks, no actor-critic head: its data are libsvm samples). */
static int s_dense_only(const dp_model_t *m, const char *t, char *err)
{
    static const char *image[] = {"conv", "maxpool", "gap", "res", "(", ")", "ac"};
    for (size_t k = 0; m->embed_dim > 0 && k < sizeof image / sizeof image[0]; k++)
        if (strncmp(t, image[k], strlen(image[k])) == 0)
            return dp_err(err, "model spec: '%s' after embed:%d (the embedding gives %d features: "
                          "fc, relu, tanh, bn, dropout, softmax and sigmoid may follow it)", t,
                          m->embed_dim, m->embed_dim);
    return 0;
}

static int s_parse_tokens(dp_model_t *m, char **tok, int ntok, char *err)
{
    s_count_t count;
    memset(&count, 0, sizeof count);
    for (int i = 0; i < ntok; i++) {
        if (strcmp(tok[i], "res") == 0 || strcmp(tok[i], "res:b") == 0) count.torch_names = 1;
        if (strncmp(tok[i], "fc:", 3) == 0) count.n_fc++;
    }
    s_block_t bk;
    memset(&bk, 0, sizeof bk);
    for (int i = 0; i < ntok; i++) {
        const char *t = tok[i];
        if (strncmp(t, "embed", 5) == 0 && (t[5] == 0 || t[5] == ':')) {
            if (s_embed(m, t, i == 0, err) != 0) return -1;
            continue;
        }
        if (s_dense_only(m, t, err) != 0) return -1;
        const dp_layer_t *prev = m->n_layers ? &m->layers[m->n_layers - 1] : NULL;
        if (prev && (prev->kind == DP_LAYER_SOFTMAX || prev->kind == DP_LAYER_AC ||
                     prev->kind == DP_LAYER_SIGMOID))
            return dp_err(err, "model spec: '%s' after %s (it must be last)", t,
                          prev->kind == DP_LAYER_AC        ? "the actor-critic head"
                          : prev->kind == DP_LAYER_SIGMOID ? "sigmoid"
                                                           : "softmax");
        if (strcmp(t, "res") == 0 || strcmp(t, "res:b") == 0) {
            if (i + 1 >= ntok || strcmp(tok[i + 1], "(") != 0)
                return dp_err(err, "model spec: '%s' without '(' (write %s( LAYERS ))", t, t);
            if (count.in_block) return dp_err(err, "model spec: res blocks do not nest");
            if (count.fc > 0) return dp_err(err, "model spec: a res block after a fully connected layer");
            count.in_block = 1;
            count.bconv = count.bbn = 0;
            bk.in = m->n_layers;
            bk.first_layer = m->n_layers;
            bk.first_param = m->n_params;
            bk.proj = t[3] == ':';
            i++;
            continue;
        }
        if (strcmp(t, "(") == 0) return dp_err(err, "model spec: '(' without res before it");
        if (strcmp(t, ")") == 0) {
            if (!count.in_block) return dp_err(err, "model spec: ')' without a res block open");
            if (s_close_block(m, &bk, &count, err) != 0) return -1;
            continue;
        }
        if (strncmp(t, "ac", 2) == 0 && (t[2] == 0 || t[2] == ':')) {
            if (s_ac_head(m, t, &count, err) != 0) return -1;
            continue;
        }
        dp_layer_t *l = s_new_layer(m, m->n_layers, err);
        if (!l) return -1;
        count.next_is_bn = i + 1 < ntok && strcmp(tok[i + 1], "bn") == 0;
        if (s_parse_layer(m, l, t, &count, err) != 0) return -1;
        s_track_act(m, l);
        m->n_layers++;
    }
    if (count.in_block) return dp_err(err, "model spec: a res block without ')'");
    return 0;
}

/* The layers of text (the grammar: no preset) into m, whose input shape is
 * set; with canon, its canonical text (single spaces) into canon, of
 * DP_MODEL_SPEC_LEN bytes. A preset's text passes no canon: its canonical
 * spec is its name, however long the text it stands for. */
static int s_parse_grammar(dp_model_t *m, const char *text, char *canon, char *err)
{
    char *buf = NULL;
    int ntok = 0;
    char **tok = s_tokens(text, &buf, &ntok);
    int rc = s_parse_tokens(m, tok, ntok, err);
    size_t len = 0;
    for (int i = 0; canon && rc == 0 && i < ntok; i++) {
        len += (size_t)snprintf(canon + len, DP_MODEL_SPEC_LEN - len, "%s%s", i ? " " : "", tok[i]);
        if (len >= DP_MODEL_SPEC_LEN)
            rc = dp_err(err, "model spec: too long (over %d bytes written out; a preset's name "
                        "stands for its whole text)", DP_MODEL_SPEC_LEN - 1);
    }
    free(tok);
    free(buf);
    if (rc != 0) return -1;
    if (m->n_layers == 0 && m->embed_dim > 0)
        return dp_err(err, "model spec: embed:%d needs layers after it, ending in softmax or "
                      "sigmoid (e.g. 'embed:1 sigmoid')", m->embed_dim);
    if (m->n_layers == 0) return dp_err(err, "model spec: empty");
    if (dp_model_is_ac(m)) return 0;
    if (m->layers[m->n_layers - 1].kind == DP_LAYER_SIGMOID) return 0;
    if (m->layers[m->n_layers - 1].kind != DP_LAYER_SOFTMAX)
        return dp_err(err, "model spec: must end with 'fc:CLASSES softmax' (or 'fc:1 sigmoid' for "
                      "two classes, or an actor-critic head, ac)");
    if (m->classes < 2)
        return dp_err(err, "model spec: the last fc layer (or embed:D before softmax) needs at "
                      "least 2 outputs");
    return 0;
}

int dp_model_parse(dp_model_t *m, const char *spec, int in_c, int in_h, int in_w, char *err)
{
    memset(m, 0, sizeof *m);
    if (in_c < 1 || in_h < 1 || in_w < 1 || s_act_ok(in_c, in_h, in_w) != 0)
        return dp_err(err, "model spec: bad input shape %dx%dx%d", in_c, in_h, in_w);
    m->in_c = in_c;
    m->in_h = in_h;
    m->in_w = in_w;
    if (strlen(spec) >= 8192) return dp_err(err, "model spec: too long");
    /* a preset stands alone; its canonical spec is its name */
    char one[64] = "";
    if (sscanf(spec, " %63s", one) == 1 && strncmp(one, "resnet", 6) == 0) {
        char tail[2];
        if (sscanf(spec, " %*s %1s", tail) == 1)
            return dp_err(err, "model spec: the preset '%s' stands alone", one);
        char *text = s_preset(one, err);
        if (!text) return -1;
        int rc = s_parse_grammar(m, text, NULL, err);
        free(text);
        if (rc != 0) return -1;
        snprintf(m->spec, sizeof m->spec, "%s", one);
    } else if (s_parse_grammar(m, spec, m->spec, err) != 0) {
        return -1;
    }
    m->fingerprint = s_fingerprint(m);
    return 0;
}

int dp_model_has_state(const dp_model_t *m)
{
    for (int i = 0; i < m->n_params; i++)
        if (!m->params[i].trainable) return 1;
    return 0;
}

void dp_model_copy_state(const dp_model_t *m, size_t base, size_t lo, size_t hi, float *w,
                         const float *v)
{
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        if (p->trainable) continue;
        size_t a = p->offset > lo ? p->offset : lo;
        size_t b = p->offset + p->count < hi ? p->offset + p->count : hi;
        if (a < b) memcpy(w + (a - base), v + (a - base), (b - a) * sizeof(float));
    }
}

void dp_model_init_params(const dp_model_t *m, float *params, uint64_t seed)
{
    dp_rng_t rng;
    dp_rng_seed(&rng, seed);
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        if (p->init == DP_INIT_ONES) {
            for (size_t j = 0; j < p->count; j++) params[p->offset + j] = 1.0f;
            continue;
        }
        if (p->fan_in < 1 || p->init == DP_INIT_ZEROS) { /* a table's: its values come from its file */
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
        else if (l->kind == DP_LAYER_BN || l->kind == DP_LAYER_ADD)
            macs += (double)l->out_c * l->out_h * l->out_w;
    }
    return macs;
}
