/* model: the network as a plain text spec, and everything derived from it —
 * per-layer shapes, the parameter table (PyTorch names and layouts), the
 * flat parameter vector's layout, seeded initialisation and a fingerprint.
 *
 * Spec grammar (tokens separated by spaces):
 *   convKxK:OUT[:same|:valid]   2-D convolution, stride 1 ("same" = pad K/2)
 *   maxpoolK                     K x K max-pool with stride K
 *   relu                         elementwise max(0, x)
 *   fc:OUT                       fully connected; flattens C,H,W first
 *   softmax                      last layer: softmax + cross-entropy loss
 *
 * Invariants: the spec ends with fc:classes softmax; parameters are laid out
 * in layer order, weight then bias, each tensor contiguous in one flat float
 * vector (the order safetensors files and the wire use). Tensors follow
 * PyTorch: conv weight [out, in, kh, kw], fc weight [out, in].
 *
 * Bounds: a spec may come from an untrusted file (a checkpoint's metadata,
 * a record's header), so every size the parser derives is computed with
 * checked arithmetic and refused, naming the token, when it is out of
 * bounds: each dimension (channels, sides, kernel, fan-in, flattened
 * features) and each per-sample activation at most DP_MODEL_MAX_DIM
 * elements (the kernels index them with int); each parameter tensor and
 * the total at most DP_MODEL_MAX_FLOATS floats. So n_floats * sizeof(float)
 * (times the optimizer's state) never wraps a size_t. */
#ifndef DP_MODEL_H
#define DP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define DP_MAX_LAYERS 32
/* Tensors of a model: a spec's weights and biases, or a tensor table's
 * entries (a PyTorch state_dict: ResNet-110 with batch norm has ~660). */
#define DP_MAX_PARAMS 1024
#define DP_PARAM_NAME_LEN 96   /* state_dict keys, "layer3.17.bn2.num_batches_tracked" */
#define DP_PARAM_MAX_DIMS 8
#define DP_MODEL_MAX_DIM ((size_t)INT32_MAX)  /* elements of a dimension or activation */
/* 2^32 floats (16 GiB of float32): far above any model this trains
 * (ResNet-110 has 1.7 M parameters, VGG-16 138 M), far below a wrap. */
#define DP_MODEL_MAX_FLOATS ((size_t)1 << 32)
#define DP_MODEL_DEFAULT_SPEC                                                  \
    "conv5x5:32 relu maxpool2 conv5x5:64 relu maxpool2 fc:512 relu fc:10 softmax"

typedef enum {
    DP_LAYER_CONV,
    DP_LAYER_RELU,
    DP_LAYER_MAXPOOL,
    DP_LAYER_FC,
    DP_LAYER_SOFTMAX,
} dp_layer_kind_t;

typedef struct {
    dp_layer_kind_t kind;
    int index;             /* position in dp_model_t.layers */
    char name[16];         /* "conv1", "fc2", ... (parametric layers), else kind */
    int k;                 /* kernel size (conv, maxpool) */
    int stride;            /* conv / maxpool stride */
    int pad;               /* conv zero padding on each side */
    int in_c, in_h, in_w;  /* input per sample; fc: in_c = features, h = w = 1 */
    int out_c, out_h, out_w; /* output per sample; fc: out_c = outputs */
    int weight;            /* index into dp_model_t.params, -1 if none */
    int bias;              /* index into dp_model_t.params, -1 if none */
} dp_layer_t;

typedef struct {
    char name[DP_PARAM_NAME_LEN]; /* PyTorch state_dict key: "conv1.weight" */
    int ndim;                 /* 0 (a scalar) .. DP_PARAM_MAX_DIMS */
    int shape[DP_PARAM_MAX_DIMS]; /* dims past ndim are 1 */
    size_t offset;         /* in floats, into the flat parameter vector */
    size_t count;          /* number of floats */
    int fan_in;            /* inputs per output unit, for initialisation (0: a table's) */
    int trainable;         /* 1: trained by gradients; 0: state that is not a gradient
                            * (batch norm's running statistics, counters): a push carries
                            * its current value there, which the servers combine instead
                            * of stepping (ARCHITECTURE.md, "State that is not a gradient") */
} dp_param_t;

typedef struct {
    char spec[512];        /* canonical spec text (single spaces); DP_MODEL_TABLE_SPEC for a
                            * tensor table */
    int in_c, in_h, in_w;  /* input image shape */
    int classes;           /* outputs of the last fc layer */
    int n_layers;
    dp_layer_t layers[DP_MAX_LAYERS];
    int n_params;
    dp_param_t params[DP_MAX_PARAMS];
    size_t n_floats;       /* total parameter floats */
    size_t max_act;        /* largest per-sample activation (floats) */
    uint64_t fingerprint;  /* hash of spec, input shape and parameter shapes */
} dp_model_t;

/* The spec of a model that is only a table of named tensors (no layers,
 * input 0x0x0, classes 0): the servers hold it and a library client
 * (downpour.h) trains it; built by dp_model_from_table. */
#define DP_MODEL_TABLE_SPEC "tensors"

/* One entry of a tensor table: name (a state_dict key: printable ASCII, no
 * spaces or quotes, shorter than DP_PARAM_NAME_LEN, unique), shape[0..ndim)
 * (each >= 0), trainable as in dp_param_t. */
typedef struct {
    const char *name;
    int ndim;
    const int64_t *shape;
    int trainable;
} dp_table_entry_t;

/* m as the table t[0..n), laid out in the given order; every size checked as
 * a spec's is. Its fingerprint hashes the names, shapes and trainable flags
 * (not the values), so a client that builds the same table (the C library,
 * the Python package) matches the servers' HELLO check. */
int dp_model_from_table(dp_model_t *m, const dp_table_entry_t *t, int n, char *err);

/* 1 when m is a tensor table (no layers to run), else 0. */
int dp_model_is_table(const dp_model_t *m);

/* Parse spec for inputs of in_c x in_h x in_w. On error fills err with one
 * line naming the offending token and returns -1. */
int dp_model_parse(dp_model_t *m, const char *spec, int in_c, int in_h, int in_w, char *err);

/* PyTorch's default initialisation (kaiming-uniform with a = sqrt(5) for
 * weights, uniform(+-1/sqrt(fan_in)) for biases), drawn from seed. A
 * table's tensors have no rule of their own: zeros (their values come from
 * the file the table was read from). */
void dp_model_init_params(const dp_model_t *m, float *params, uint64_t seed);

/* Parameter by name, or NULL. */
const dp_param_t *dp_model_find_param(const dp_model_t *m, const char *name);

/* Floats a sample's activation takes at layer li's output. */
size_t dp_layer_out_size(const dp_layer_t *l);

/* Multiply-accumulates per sample for one forward pass (for FLOP counts). */
double dp_model_forward_macs(const dp_model_t *m);

#endif
