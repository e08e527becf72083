/* fuzz_model: bytes from a fuzzer into the model spec parser
 * (dp_model_parse, common/model.h), which reads specs from the command
 * line, from a HELLO and from a checkpoint's metadata (`downpour eval` takes
 * it from the file: untrusted).
 *
 * Input layout: bytes 0-5 = the input shape C, H, W (three little-endian
 * 16-bit numbers), the rest = the spec text (up to its first NUL). Whatever
 * the bytes, the parser returns an error or a model whose derived sizes are
 * consistent: each layer's input is the previous layer's output, every
 * parameter's count is the product of its shape, the parameters lie end to
 * end without a gap and their total (in bytes too) is computable without
 * wrapping, the largest activation bounds every layer's (after an
 * embed:D, whose output is the layers' input, from D x 1 x 1), and the canonical
 * spec parses again to the same model. The sizes are recomputed here in
 * 128-bit arithmetic, so a parser whose own arithmetic wraps disagrees.
 * Small models are then initialised into a buffer of exactly n_floats.
 *
 * `make fuzz` builds it with libFuzzer (see tests/fuzz/fuzz.h); built with
 * gcc, main() replays tests/fuzz/corpus/model/ and mutations of it. */
#include <math.h>

#include "common/model.h"
#include "tests/fuzz/fuzz.h"

#define S_NAME "fuzz_model"

typedef unsigned __int128 s_u128;

static void s_want(int ok, const char *what)
{
    if (!ok) fz_violation(S_NAME, what);
}

static const dp_param_t *s_param(const dp_model_t *m, int i)
{
    return i >= 0 && i < m->n_params ? &m->params[i] : NULL;
}

/* A parameter of ndim dims with the shape given (s_u128: no wrap). */
static void s_check_param(const dp_model_t *m, int idx, int ndim, const s_u128 *shape, s_u128 fan_in,
                          const char *layer, const char *what)
{
    const dp_param_t *p = s_param(m, idx);
    if (!p) {
        s_want(0, "a parametric layer without its parameter");
        return;
    }
    char name[64];
    snprintf(name, sizeof name, "%s.%s", layer, what);
    s_want(strcmp(p->name, name) == 0, "a parameter's name is not LAYER.weight / LAYER.bias");
    s_want(p->ndim == ndim, "a parameter's rank is not its layer's");
    for (int d = 0; d < ndim && d < 4; d++)
        s_want((s_u128)(unsigned)p->shape[d] == shape[d] && p->shape[d] >= 1,
               "a parameter's shape is not its layer's");
    s_want(p->fan_in >= 1 && (s_u128)(unsigned)p->fan_in == fan_in, "a parameter's fan-in is wrong");
}

static void s_check(const dp_model_t *m, const char *spec_in, int c0, int h0, int w0)
{
    s_want(m->n_layers >= 1 && m->n_layers <= DP_MAX_LAYERS, "layer count out of range");
    s_want(m->n_params >= 0 && m->n_params <= DP_MAX_PARAMS, "parameter count out of range");
    if (m->n_layers < 1 || m->n_layers > DP_MAX_LAYERS || m->n_params < 0 || m->n_params > DP_MAX_PARAMS)
        return;
    if (m->embed_dim != 0) { /* embed:D: the layers read its D x 1 x 1, whatever was given */
        s_want(m->embed_dim >= 1 && m->embed_dim <= DP_MODEL_MAX_EMBED, "embed:D out of range");
        s_want(strncmp(m->spec, "embed:", 6) == 0, "an embedding not first in the canonical spec");
        for (int i = 0; i < m->n_layers; i++)
            s_want(m->layers[i].kind != DP_LAYER_CONV && m->layers[i].kind != DP_LAYER_MAXPOOL &&
                       m->layers[i].kind != DP_LAYER_ADD && m->layers[i].kind != DP_LAYER_AC,
                   "an image layer after an embedding");
        c0 = m->embed_dim, h0 = w0 = 1;
    }
    s_want(m->in_c == c0 && m->in_h == h0 && m->in_w == w0, "input shape not the one given");
    s_want(m->layers[m->n_layers - 1].kind == DP_LAYER_SOFTMAX || dp_model_is_ac(m),
           "the last layer is neither softmax nor an actor-critic head");
    if (dp_model_is_ac(m)) { /* policy fc:A and value fc:1 on one trunk, then the loss */
        const dp_layer_t *p = &m->layers[m->n_layers - 3], *v = &m->layers[m->n_layers - 2];
        s_want(m->n_layers >= 3 && p->kind == DP_LAYER_FC && v->kind == DP_LAYER_FC &&
                   p->in0 == v->in0 && p->out_c == m->classes && v->out_c == 1 &&
                   m->classes >= 2 && m->layers[m->n_layers - 1].in1 == m->n_layers - 1,
               "an actor-critic head is not policy fc:A + value fc:1 on one trunk");
    }
    s_want(strlen(m->spec) < sizeof m->spec && strlen(m->spec) <= strlen(spec_in),
           "canonical spec longer than the spec");
    /* The activation chain, in exact arithmetic, for a chain of the seed
     * family's layers; a graph (residual blocks, batch norm, strides, the
     * presets) keeps the checks below it: the flat vector, the canonical
     * spec, the initialisation. */
    int chain = 1;
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        if ((l->kind != DP_LAYER_CONV && l->kind != DP_LAYER_MAXPOOL && l->kind != DP_LAYER_RELU &&
             l->kind != DP_LAYER_FC && l->kind != DP_LAYER_SOFTMAX) ||
            (l->kind == DP_LAYER_CONV && (l->stride != 1 || l->bias < 0)))
            chain = 0;
    }
    s_u128 c = (unsigned)c0, h = (unsigned)h0, w = (unsigned)w0;
    int convs = 0, fcs = 0, used = 0;
    for (int i = 0; chain && i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        s_want(l->index == i, "a layer's index is not its position");
        s_want(l->in_c >= 1 && l->in_h >= 1 && l->in_w >= 1, "a layer's input is empty");
        s_want(l->out_c >= 1 && l->out_h >= 1 && l->out_w >= 1, "a layer's output is empty");
        s_u128 in_sz = c * h * w;
        s_want((s_u128)m->max_act >= in_sz, "max_act below a layer's input");
        char lname[16];
        switch (l->kind) {
        case DP_LAYER_CONV: {
            s_want((s_u128)(unsigned)l->in_c == c && (s_u128)(unsigned)l->in_h == h &&
                       (s_u128)(unsigned)l->in_w == w, "a convolution's input is not the previous output");
            s_want(fcs == 0, "a convolution after a fully connected layer");
            s_want(l->k >= 1 && l->stride == 1 && (l->pad == 0 || l->pad == l->k / 2),
                   "a convolution's kernel, stride or padding is wrong");
            s_u128 k = (unsigned)(l->k > 0 ? l->k : 0), pad = (unsigned)(l->pad > 0 ? l->pad : 0);
            s_u128 oh = h + 2 * pad >= k ? h + 2 * pad - k + 1 : 0;
            s_u128 ow = w + 2 * pad >= k ? w + 2 * pad - k + 1 : 0;
            s_want((s_u128)(unsigned)l->out_h == oh && (s_u128)(unsigned)l->out_w == ow,
                   "a convolution's output size is wrong");
            snprintf(lname, sizeof lname, "conv%d", ++convs);
            s_want(strcmp(l->name, lname) == 0, "a convolution's name is wrong");
            s_u128 out = (unsigned)(l->out_c > 0 ? l->out_c : 0);
            s_u128 ws[4] = {out, c, k, k};
            s_check_param(m, l->weight, 4, ws, c * k * k, l->name, "weight");
            s_check_param(m, l->bias, 1, &out, c * k * k, l->name, "bias");
            used += 2;
            c = out, h = oh, w = ow;
            break;
        }
        case DP_LAYER_MAXPOOL:
            s_want(fcs == 0, "a pooling after a fully connected layer");
            s_want(l->k >= 1 && l->k <= 64 && l->stride == l->k, "a pooling's size is wrong");
            s_want((s_u128)(unsigned)l->out_c == c && (s_u128)(unsigned)l->out_h == h / (unsigned)l->k &&
                       (s_u128)(unsigned)l->out_w == w / (unsigned)l->k, "a pooling's output size is wrong");
            s_want(l->weight < 0 && l->bias < 0, "a pooling with parameters");
            h = h / (unsigned)(l->k > 0 ? l->k : 1), w = w / (unsigned)(l->k > 0 ? l->k : 1);
            break;
        case DP_LAYER_RELU:
            s_want((s_u128)(unsigned)l->out_c == c && (s_u128)(unsigned)l->out_h == h &&
                       (s_u128)(unsigned)l->out_w == w, "a relu changes the shape");
            s_want(l->weight < 0 && l->bias < 0, "a relu with parameters");
            break;
        case DP_LAYER_FC: {
            s_u128 in = c * h * w;
            s_want((s_u128)(unsigned)l->in_c == in && l->in_h == 1 && l->in_w == 1,
                   "a fully connected layer's input is not the flattened previous output");
            s_want(l->out_c >= 1 && l->out_c <= 1 << 20 && l->out_h == 1 && l->out_w == 1,
                   "a fully connected layer's output is wrong");
            snprintf(lname, sizeof lname, "fc%d", ++fcs);
            s_want(strcmp(l->name, lname) == 0, "a fully connected layer's name is wrong");
            s_u128 out = (unsigned)(l->out_c > 0 ? l->out_c : 0);
            s_u128 ws[2] = {out, in};
            s_check_param(m, l->weight, 2, ws, in, l->name, "weight");
            s_check_param(m, l->bias, 1, &out, in, l->name, "bias");
            used += 2;
            c = out, h = 1, w = 1;
            break;
        }
        case DP_LAYER_SOFTMAX:
            s_want(i == m->n_layers - 1, "softmax not last");
            /* first after embed:D, the embedding's D outputs are the logits */
            s_want(i > 0 ? m->layers[i - 1].kind == DP_LAYER_FC : m->embed_dim > 0,
                   "softmax not after a fully connected layer or an embedding");
            s_want((s_u128)(unsigned)l->out_c == c && h == 1 && w == 1 && l->out_h == 1 && l->out_w == 1,
                   "softmax changes the shape");
            s_want((s_u128)(unsigned)m->classes == c && m->classes >= 2, "classes is not the last fc's outputs");
            break;
        default: s_want(0, "an unknown layer kind"); break;
        }
        s_want((s_u128)m->max_act >= c * h * w, "max_act below a layer's output");
    }
    s_want(!chain || used == m->n_params, "parameters that belong to no layer");
    /* The flat vector: end to end, in exact arithmetic. */
    s_u128 off = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        s_u128 count = 1;
        for (int d = 0; d < p->ndim && d < 4; d++) count *= (unsigned)(p->shape[d] > 0 ? p->shape[d] : 0);
        s_want((s_u128)p->count == count, "a parameter's count is not the product of its shape");
        s_want((s_u128)p->offset == off, "a parameter does not start where the previous one ends");
        s_want(dp_model_find_param(m, p->name) == p, "two parameters share a name");
        off += count;
    }
    s_want((s_u128)m->n_floats == off, "n_floats is not the sum of the parameters' counts");
    s_want(off * sizeof(float) <= (s_u128)SIZE_MAX, "the parameters' bytes do not fit in size_t");
    double macs = dp_model_forward_macs(m);
    s_want(macs >= 0 && isfinite(macs), "forward MACs not a finite count");
    /* The canonical spec stands for the model: it parses to the same one. */
    static dp_model_t again;
    char err[DP_ERR_LEN];
    if (dp_model_parse(&again, m->spec, c0, h0, w0, err) != 0) {
        s_want(0, "the canonical spec does not parse");
        return;
    }
    s_want(strcmp(again.spec, m->spec) == 0 && again.fingerprint == m->fingerprint &&
               again.n_floats == m->n_floats && again.max_act == m->max_act,
           "the canonical spec parses to another model");
    /* What every user does next, within reason: parameters of exactly n_floats. */
    if (off <= (1u << 20)) {
        float *params = dp_malloc((m->n_floats ? m->n_floats : 1) * sizeof(float));
        dp_model_init_params(m, params, 42);
        for (size_t i = 0; i < m->n_floats; i++)
            if (!isfinite(params[i])) {
                s_want(0, "initial parameters not finite");
                break;
            }
        free(params);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 6) return 0;
    int c = data[0] | data[1] << 8, h = data[2] | data[3] << 8, w = data[4] | data[5] << 8;
    char *spec = fz_str(data + 6, size - 6);
    static dp_model_t m;
    char err[DP_ERR_LEN] = "";
    if (dp_model_parse(&m, spec, c, h, w, err) == 0) {
        fz_accepted++;
        s_check(&m, spec, c, h, w);
    } else {
        s_want(strncmp(err, "model spec: ", 12) == 0 && !strchr(err, '\n'),
               "an error that is not one 'model spec: ' line");
    }
    free(spec);
    return 0;
}

#ifndef DP_LIBFUZZER
int main(int argc, char **argv)
{
    return fz_main(argc, argv, "model", 20000);
}
#endif
