/* model: the network as a plain text spec, and everything derived from it —
 * per-layer shapes, the parameter table (PyTorch names and layouts), the
 * flat parameter vector's layout, seeded initialisation and a fingerprint.
 *
 * Spec grammar (tokens separated by spaces; "(" and ")" stand alone too):
 *   convKxK:OUT[:same|:valid][:sS][:pP]
 *                                2-D convolution, stride S (default 1), zero
 *                                padding P ("same" = K/2, the default; "valid"
 *                                = 0); no bias when a bn follows (the shift of
 *                                the bn makes it redundant, as in PyTorch's
 *                                ResNets)
 *   maxpoolK                     K x K max-pool with stride K
 *   relu                         elementwise max(0, x)
 *   bn                           batch norm (2-D after a conv, 1-D after an
 *                                fc): batch statistics in training, running
 *                                statistics in evaluation; momentum 0.1, eps
 *                                1e-5; weight, bias, running_mean,
 *                                running_var, num_batches_tracked as PyTorch
 *   gap                          global average pooling: C x H x W -> C
 *   dropout:P                    inverted dropout, drop probability P in
 *                                [0, 1); the mask is a hash of the seed, the
 *                                step, the sample's place in the batch and
 *                                the element (kernels/ops.h), so runs and
 *                                replays repeat it
 *   res( LAYERS )                a residual block: out = LAYERS(x) + shortcut(x);
 *                                the shortcut is the identity when the shapes
 *                                agree, else He et al.'s option A (stride
 *                                subsample, channels zero-padded evenly)
 *   res:b( LAYERS )              the same with option B where shapes differ:
 *                                a 1x1 convolution (stride S, no bias) and a
 *                                bn, named downsample.0 and downsample.1
 *   fc:OUT                       fully connected; flattens C,H,W first
 *   tanh                         elementwise tanh
 *   softmax                      last layer: softmax + cross-entropy loss
 *   sigmoid                      last layer, for two classes: one logit (an
 *                                fc:1 before it, or embed:1 directly), the
 *                                logistic loss (BCE with logits, in its stable
 *                                form), labels 0/1. Its output is the two
 *                                classes' probabilities (1 - p, p), so the
 *                                model has 2 classes as fc:2 softmax has.
 *                                After embed:1 it has a bias of its own, the
 *                                scalar tensor "bias" (zeros at start; shape
 *                                [1]): "embed:1 sigmoid" is logistic
 *                                regression, one weight a key plus a bias,
 *                                as FTRL-Proximal's papers write it. After
 *                                fc:1 the fc's bias is the bias ("fc1.weight",
 *                                "fc1.bias": PyTorch's nn.Linear(IN, 1) with
 *                                BCEWithLogitsLoss)
 *   embed:D                      first token only: a sparse model's embedding
 *                                (kernels/embed.h): the sample's feature keys
 *                                looked up in a row table of width D, weighted
 *                                by the features' values and summed (PyTorch's
 *                                EmbeddingBag, mode sum, per_sample_weights).
 *                                No dense parameters (the rows live in the
 *                                table, not in the flat vector): the layers
 *                                after it see an input of D x 1 x 1, whatever
 *                                shape dp_model_parse is given, and may be fc,
 *                                relu, tanh, bn, dropout, softmax (which may
 *                                follow it directly: "embed:2 softmax", the D
 *                                outputs its logits) and sigmoid ("embed:1
 *                                sigmoid", logistic regression)
 *   obsnorm                      first token only: each input component
 *                                normalised by the running mean and variance
 *                                of every input trained on (kernels/ops.h,
 *                                dp_obs_norm_forward), clipped to +-10; its
 *                                tensors obsnorm.running_mean, running_var
 *                                (one a component) and count are state, not
 *                                trained: a push carries them, the servers
 *                                keep them, a model file has them, so every
 *                                worker and downpour eval normalise alike
 *                                (an actor-critic run's --obs-norm adds it)
 *   ac:A                         last layer, instead of softmax: an actor-critic
 *                                head of A actions on the trunk before it (any
 *                                layers): a policy fc:A (softmax over the
 *                                actions) and a value fc:1, both reading the
 *                                trunk's output, named policy and value, and the
 *                                loss of kernels/ops.h (dp_ac_loss_forward).
 *                                A bare "ac" takes A from the environment
 *                                (dp_model_spec_actions); the canonical spec
 *                                has it written out
 * Blocks do not nest. Presets, usable wherever a spec is: resnetN for
 * N = 6n + 2 (resnet20, resnet32, resnet44, resnet56, resnet110): He et
 * al.'s CIFAR family, "conv3x3:16 bn relu", 3 stages of n blocks
 * "res( conv3x3:C[:s2] bn relu conv3x3:C bn ) relu" with C = 16, 32, 64
 * (stride 2 entering stages 2 and 3, option-A shortcuts), "gap fc:10
 * softmax". The canonical spec of a preset is its name.
 *
 * Names: a spec without res blocks names its parametric layers by kind in
 * order (conv1, conv2, bn1, fc1, fc2: unchanged from before blocks
 * existed). A spec with res blocks names them as torchvision does: the
 * layers outside blocks conv1, bn1, ... and fc (fc1, fc2, ... when there are
 * several); block i of stage s is layer{s}.{i} (both from 1 and 0), a new
 * stage starting at each block whose output shape differs from its input's,
 * its layers conv1, bn1, conv2, bn2, ... and downsample.0/.1. So a preset's
 * file loads into the nn.Module PyTorch users write (tests/torch_net.py).
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

/* The longest canonical spec text, its NUL included (a preset counts as its
 * name). */
#define DP_MODEL_SPEC_LEN 512
/* Layers of a spec: a block is about 8 (ResNet-110 has 438). */
#define DP_MAX_LAYERS 1024
/* Tensors of a model: a spec's weights and biases, or a tensor table's
 * entries (a PyTorch state_dict: ResNet-110 with batch norm has ~660). */
#define DP_MAX_PARAMS 1024
#define DP_PARAM_NAME_LEN 96   /* state_dict keys, "layer3.17.bn2.num_batches_tracked" */
#define DP_PARAM_MAX_DIMS 8
#define DP_MODEL_MAX_DIM ((size_t)INT32_MAX)  /* elements of a dimension or activation */
/* 2^32 floats (16 GiB of float32): far above any model this trains
 * (ResNet-110 has 1.7 M parameters, VGG-16 138 M), far below a wrap. */
#define DP_MODEL_MAX_FLOATS ((size_t)1 << 32)
/* The widest embedding (embed:D): D at most, the row table's own bound
 * (server/core/rows.h's DP_ROWS_MAX_WIDTH, kernels/embed.h's DP_EMBED_MAX_DIM). */
#define DP_MODEL_MAX_EMBED 4096
/* Actions of an actor-critic head (ac:A): 2 .. this. */
#define DP_MODEL_MAX_ACTIONS 64
/* The actor-critic model an environment gets when none is given (the
 * workers' and the servers' --env alike); its "ac" takes the environment's
 * actions (dp_model_spec_actions). */
#define DP_MODEL_AC_DEFAULT_SPEC "fc:64 tanh fc:64 tanh ac"
#define DP_MODEL_DEFAULT_SPEC                                                  \
    "conv5x5:32 relu maxpool2 conv5x5:64 relu maxpool2 fc:512 relu fc:10 softmax"
/* The grammar above in one paragraph, for the --help of every program that
 * takes --model (downpour-worker, downpour local, downpour sim): kept here,
 * next to the grammar it sums up, so that there is one text to keep true. */
#define DP_MODEL_SPEC_HELP                                                            \
    "--model SPEC: layers separated by blanks, the last softmax (or sigmoid, one logit of\n" \
    "two classes, after fc:1 or embed:1; or ac, an actor-critic head, with --env; obsnorm\n" \
    "first normalises its observations): convKxK:OUT[:sS][:pP], maxpoolK, relu, tanh,\n"   \
    "bn (batch norm), gap (global average pool), dropout:P, fc:OUT; embed:D first: a\n"    \
    "sparse model's embedding of its libsvm features (--data libsvm:, e.g. 'embed:16 relu\n" \
    "fc:32 relu fc:1 sigmoid'; 'embed:1 sigmoid' is logistic regression);\n"                 \
    "res( LAYERS ) is a residual block (identity shortcut, or option A where the shape\n"  \
    "changes; res:b( ... ) a 1x1 conv + bn projection). Presets: resnet20, resnet32,\n"    \
    "resnet44, resnet56, resnet110 (He et al.'s CIFAR ResNets). Example:\n"                \
    "  'conv3x3:16 bn relu res( conv3x3:32:s2 bn relu conv3x3:32 bn ) relu gap fc:10 softmax'\n" \
    "Default: '" DP_MODEL_DEFAULT_SPEC "'.\n"

typedef enum {
    DP_LAYER_CONV,
    DP_LAYER_RELU,
    DP_LAYER_MAXPOOL,
    DP_LAYER_FC,
    DP_LAYER_SOFTMAX,
    DP_LAYER_BN,
    DP_LAYER_GAP,
    DP_LAYER_DROPOUT,
    DP_LAYER_ADD,      /* end of a residual block: input + shortcut(block input) */
    DP_LAYER_TANH,
    DP_LAYER_AC,       /* actor-critic loss: reads the policy's logits (in0) and the value
                        * (in1); its output is the policy (A floats a sample) */
    DP_LAYER_OBSNORM,  /* the input normalised by running statistics (state, not trained) */
    DP_LAYER_SIGMOID,  /* binary head: one logit in (plus its own bias after embed:1), the
                        * probabilities of classes 0 and 1 out, the logistic loss */
} dp_layer_kind_t;

#define DP_LAYER_NAME_LEN 48 /* "layer3.17.downsample.0" */

typedef struct {
    dp_layer_kind_t kind;
    int index;             /* position in dp_model_t.layers */
    char name[DP_LAYER_NAME_LEN]; /* "conv1", "layer1.0.bn2", ... (parametric layers), else kind */
    int k;                 /* kernel size (conv, maxpool) */
    int stride;            /* conv / maxpool stride; add: the shortcut's */
    int pad;               /* conv zero padding on each side */
    int in_c, in_h, in_w;  /* input per sample; fc: in_c = features, h = w = 1 */
    int out_c, out_h, out_w; /* output per sample; fc: out_c = outputs */
    int weight;            /* index into dp_model_t.params, -1 if none */
    int bias;              /* index into dp_model_t.params, -1 if none */
    /* The graph: activation boundary b is the batch (b = 0) or layer b-1's
     * output. A layer reads boundary in0 (its own index, except the
     * projection of an option-B shortcut, which reads its block's input);
     * an add also reads in1, through its shortcut. */
    int in0, in1;
    int src_c, src_h, src_w; /* add: boundary in1's shape */
    int branch;            /* 1: on a shortcut's projection, not on the block's main path */
    /* bn */
    int running_mean, running_var, num_batches_tracked; /* params, -1 if none */
    float eps, momentum;
    float p;               /* dropout probability */
} dp_layer_t;

enum {
    DP_INIT_FAN_IN = 0,    /* PyTorch's default for conv / fc (zeros for a table's) */
    DP_INIT_ZEROS,         /* bn bias, running_mean, num_batches_tracked */
    DP_INIT_ONES,          /* bn weight, running_var */
};

typedef struct {
    char name[DP_PARAM_NAME_LEN]; /* PyTorch state_dict key: "conv1.weight" */
    int ndim;                 /* 0 (a scalar) .. DP_PARAM_MAX_DIMS */
    int shape[DP_PARAM_MAX_DIMS]; /* dims past ndim are 1 */
    size_t offset;         /* in floats, into the flat parameter vector */
    size_t count;          /* number of floats */
    int fan_in;            /* inputs per output unit, for initialisation (0: a table's
                            * or a batch norm's: see init) */
    int init;              /* DP_INIT_*: how dp_model_init_params fills it */
    int counter;           /* 1: an integer count (num_batches_tracked): int64 in files */
    int trainable;         /* 1: trained by gradients; 0: state that is not a gradient
                            * (batch norm's running statistics, counters): a push carries
                            * its current value there, which the servers combine instead
                            * of stepping (ARCHITECTURE.md, "State that is not a gradient") */
} dp_param_t;

typedef struct {
    char spec[DP_MODEL_SPEC_LEN]; /* canonical spec text (single spaces), a preset's name for
                            * a preset; DP_MODEL_TABLE_SPEC for a tensor table */
    int in_c, in_h, in_w;  /* input image shape; with an embedding, D x 1 x 1 */
    int embed_dim;         /* embed:D: D, the rows' width (the net's input is the embedding's
                            * output, kernels/embed.h); 0: no embedding */
    int classes;           /* outputs of the last fc layer; 2 for a sigmoid head (its one
                            * logit's two probabilities) */
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

/* A tensor table's row table of width d beside its tensors (a PyTorch
 * module's sparse embedding: downpour.torch; the servers' --init file says
 * so in its metadata, DP_ST_ROWS_KEY): m->embed_dim = d, in the
 * fingerprint. -1 with err for a spec's model or a width out of range. */
int dp_model_table_rows(dp_model_t *m, int d, char *err);

/* spec with a bare "ac" token made "ac:A" (an environment's A actions) into
 * out (n bytes); an "ac:K" with K != A is refused (-1, err naming both), a
 * spec without an actor-critic head is refused too: an environment needs
 * one. */
int dp_model_spec_actions(const char *spec, int A, char *out, size_t n, char *err);
/* The same, and with obs_norm the model's first token obsnorm (added where
 * spec has none): an environment's model as --obs-norm makes it, for the
 * workers and the servers alike. */
int dp_model_spec_env(const char *spec, int A, int obs_norm, char *out, size_t n, char *err);

/* 1 when m ends in an actor-critic head (ac:A); its policy layer, value
 * layer and loss layer are the last three. */
int dp_model_is_ac(const dp_model_t *m);

/* Parse spec for inputs of in_c x in_h x in_w (a spec starting with
 * embed:D takes D x 1 x 1 instead). On error fills err with one line naming
 * the offending token and returns -1. */
int dp_model_parse(dp_model_t *m, const char *spec, int in_c, int in_h, int in_w, char *err);

/* PyTorch's default initialisation (kaiming-uniform with a = sqrt(5) for
 * weights, uniform(+-1/sqrt(fan_in)) for biases), drawn from seed. A
 * table's tensors have no rule of their own: zeros (their values come from
 * the file the table was read from). */
void dp_model_init_params(const dp_model_t *m, float *params, uint64_t seed);

/* 1 when m has tensors that are state, not gradients (trainable 0). */
int dp_model_has_state(const dp_model_t *m);

/* The rule for state that is not a gradient (ARCHITECTURE.md), for every
 * optimizer step: after a step of w over the global floats [lo, hi), the
 * state floats in that range take the carried values v instead. w and v
 * hold floats [base, ...) of the flat vector (base <= lo). */
void dp_model_copy_state(const dp_model_t *m, size_t base, size_t lo, size_t hi, float *w,
                         const float *v);

/* Parameter by name, or NULL. */
const dp_param_t *dp_model_find_param(const dp_model_t *m, const char *name);

/* Floats a sample's activation takes at layer li's output. */
size_t dp_layer_out_size(const dp_layer_t *l);
/* Layer i's parameters (a bn's state tensors with them) as the one run of
 * the flat vector they are, [*lo, *hi); 0 when it has none. */
int dp_model_layer_span(const dp_model_t *m, int i, size_t *lo, size_t *hi);

/* Multiply-accumulates per sample for one forward pass (for FLOP counts). */
double dp_model_forward_macs(const dp_model_t *m);

#endif
