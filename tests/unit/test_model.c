/* test_model: spec parsing, shapes, parameter table, init, fingerprint. */
#include "common/model.h"
#include "common/util.h"
#include "tests/test.h"

#include <string.h>

static void test_default_spec_shapes(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, DP_MODEL_DEFAULT_SPEC, 1, 28, 28, err), 0);
    CHECK_EQ(m.n_layers, 10);
    CHECK_EQ(m.n_params, 8);
    CHECK_STR(m.params[0].name, "conv1.weight");
    CHECK_EQ(m.params[0].shape[0], 32);
    CHECK_EQ(m.params[0].shape[1], 1);
    CHECK_EQ(m.params[0].shape[2], 5);
    CHECK_STR(m.params[4].name, "fc1.weight");
    CHECK_EQ(m.params[4].shape[0], 512);
    CHECK_EQ(m.params[4].shape[1], 64 * 7 * 7);
    CHECK_STR(m.params[7].name, "fc2.bias");
    CHECK_EQ(m.classes, 10);
    /* 32*25+32 + 64*800+64 + 512*3136+512 + 10*512+10 */
    CHECK_EQ(m.n_floats, 832 + 51264 + 1606144 + 5130);
    CHECK_EQ(m.params[7].offset + m.params[7].count, m.n_floats);
    CHECK_NEAR(dp_model_forward_macs(&m) * 2 * 3 / 1e6, 73.6, 0.1);
}

static void test_bad_specs(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "conv5x5:32 relu banana fc:10 softmax", 1, 28, 28, err), -1);
    CHECK(strstr(err, "banana") != NULL);
    CHECK_EQ(dp_model_parse(&m, "conv5x5:32 relu fc:10", 1, 28, 28, err), -1);
    CHECK(strstr(err, "softmax") != NULL);
    CHECK_EQ(dp_model_parse(&m, "conv4x4:8 fc:10 softmax", 1, 28, 28, err), -1);
    CHECK_EQ(dp_model_parse(&m, "maxpool64 fc:10 softmax", 1, 28, 28, err), -1);
    CHECK_EQ(dp_model_parse(&m, "fc:10 softmax relu", 1, 28, 28, err), -1);
    CHECK_EQ(dp_model_parse(&m, "", 1, 28, 28, err), -1);
    CHECK_EQ(dp_model_parse(&m, "fc:10 conv3x3:2 fc:10 softmax", 1, 28, 28, err), -1);
}

/* Every refusal, word for word: a spec a user mistyped gets one line that
 * names the token and what was expected. */
static void test_error_messages(void)
{
    static char many[6 * (DP_MAX_LAYERS + 2)], huge[8300], long_fc[700];
    many[0] = 0;
    for (int i = 0; i < DP_MAX_LAYERS + 1; i++) strcat(many, "relu ");
    memset(huge, 'x', sizeof huge - 1);
    /* fc:000...010 is fc:10, but its canonical text outgrows dp_model_t.spec */
    snprintf(long_fc, sizeof long_fc, "fc:%0600d softmax", 10);
    static const struct {
        const char *spec;
        int in_c;
        const char *err;
    } cases[] = {
        {"fc:10 softmax", 0, "model spec: bad input shape 0x28x28"},
        {huge, 1, "model spec: too long"},
        {long_fc, 1, "model spec: too long (over 511 bytes written out; a preset's name stands for "
                     "its whole text)"},
        {many, 1, "model spec: more than 1024 layers"},
        {"fc:10 softmax relu", 1, "model spec: 'relu' after softmax (it must be last)"},
        {"conv5x4:8 fc:10 softmax", 1,
         "model spec: bad convolution 'conv5x4:8' (expected convKxK:OUT, e.g. conv5x5:32)"},
        {"conv4x4:8 fc:10 softmax", 1,
         "model spec: 'conv4x4:8': 'same' padding needs an odd kernel size"},
        {"conv3x3:8:full fc:10 softmax", 1,
         "model spec: bad option in 'conv3x3:8:full' (use :same, :valid, :sS or :pP)"},
        {"fc:10 conv3x3:2 fc:10 softmax", 1,
         "model spec: 'conv3x3:2' after a fully connected layer"},
        {"conv29x29:2:valid fc:10 softmax", 1,
         "model spec: 'conv29x29:2:valid' leaves no output on a 28x28 input"},
        {"maxpoolx fc:10 softmax", 1,
         "model spec: bad pooling 'maxpoolx' (expected maxpoolK, e.g. maxpool2)"},
        {"fc:10 maxpool2 fc:10 softmax", 1, "model spec: 'maxpool2' after a fully connected layer"},
        {"maxpool64 fc:10 softmax", 1, "model spec: 'maxpool64' leaves no output on a 28x28 input"},
        {"fc:0 softmax", 1,
         "model spec: bad fully connected layer 'fc:0' (expected fc:OUT, e.g. fc:512)"},
        {"relu softmax", 1, "model spec: softmax must follow a fully connected layer (or embed:D, "
                            "as in 'embed:2 softmax')"},
        {"banana fc:10 softmax", 1,
         "model spec: unknown layer 'banana' (known: convKxK:OUT, maxpoolK, relu, tanh, bn, gap, "
         "dropout:P, res( ... ), res:b( ... ), fc:OUT, softmax, sigmoid, ac:A, embed:D or obsnorm first)"},
        {" \t\n", 1, "model spec: empty"},
        {"fc:10 relu", 1, "model spec: must end with 'fc:CLASSES softmax' (or 'fc:1 sigmoid' for "
                          "two classes, or an actor-critic head, ac)"},
        {"fc:1 softmax", 1,
         "model spec: the last fc layer (or embed:D before softmax) needs at least 2 outputs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dp_model_t m;
        char err[DP_ERR_LEN] = "";
        CHECK_EQ(dp_model_parse(&m, cases[i].spec, cases[i].in_c, 28, 28, err), -1);
        CHECK_STR(err, cases[i].err);
    }
}

/* embed:D (a sparse model's embedding): first token only, no dense
 * parameters of its own, the layers after it on D x 1 x 1 whatever input
 * shape is given, the canonical spec keeps it and the fingerprint tells it
 * from the same layers without it. */
static void test_embed(void)
{
    dp_model_t m, plain;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "embed:2 softmax", 1, 28, 28, err), 0); /* logistic regression */
    CHECK_EQ(m.embed_dim, 2);
    CHECK_EQ(m.n_layers, 1);
    CHECK_EQ(m.layers[0].kind, DP_LAYER_SOFTMAX);
    CHECK_EQ(m.layers[0].in_c, 2);
    CHECK_EQ(m.classes, 2);
    CHECK_EQ(m.n_params, 0);
    CHECK_EQ(m.n_floats, 0);
    CHECK_STR(m.spec, "embed:2 softmax");
    CHECK_EQ(dp_model_parse(&m, "  embed:16 relu   fc:64 relu fc:2 softmax ", 3, 32, 32, err), 0);
    CHECK_STR(m.spec, "embed:16 relu fc:64 relu fc:2 softmax");
    CHECK_EQ(m.embed_dim, 16);
    CHECK(m.in_c == 16 && m.in_h == 1 && m.in_w == 1);
    CHECK_EQ(m.n_layers, 5);
    CHECK_EQ(m.layers[0].kind, DP_LAYER_RELU);
    CHECK_EQ(m.layers[0].in_c, 16);
    CHECK_STR(m.params[0].name, "fc1.weight");
    CHECK_EQ(m.params[0].shape[1], 16);
    CHECK_EQ(m.n_floats, (size_t)64 * 16 + 64 + 2 * 64 + 2);
    /* the same layers on a 16 x 1 x 1 input without the embedding: the
     * same parameters, another model */
    CHECK_EQ(dp_model_parse(&plain, "relu fc:64 relu fc:2 softmax", 16, 1, 1, err), 0);
    CHECK_EQ(plain.embed_dim, 0);
    CHECK_EQ(plain.n_floats, m.n_floats);
    CHECK(plain.fingerprint != m.fingerprint);
    dp_model_t again;
    CHECK_EQ(dp_model_parse(&again, m.spec, 1, 28, 28, err), 0); /* any input shape: the same */
    CHECK(again.fingerprint == m.fingerprint);
    CHECK_EQ(dp_model_parse(&m, "embed:4 bn dropout:0.5 tanh fc:2 softmax", 1, 1, 1, err), 0);
    CHECK_EQ(dp_model_parse(&m, "embed:4096 fc:2 softmax", 1, 1, 1, err), 0);
    static const struct {
        const char *spec;
        const char *err;
    } bad[] = {
        {"fc:8 embed:8 fc:2 softmax", "model spec: 'embed:8' must be the first token (the "
         "embedding turns the sample's sparse features into the input of the layers after it)"},
        {"embed:2 embed:2 softmax", "model spec: 'embed:2' must be the first token (the "
         "embedding turns the sample's sparse features into the input of the layers after it)"},
        {"embed:0 softmax", "model spec: bad embedding 'embed:0' (expected embed:D, D in 1..4096 "
         "floats a row)"},
        {"embed:4097 fc:2 softmax", "model spec: bad embedding 'embed:4097' (expected embed:D, D "
         "in 1..4096 floats a row)"},
        {"embed fc:2 softmax", "model spec: bad embedding 'embed' (expected embed:D, D in 1..4096 "
         "floats a row)"},
        {"embed:8x fc:2 softmax", "model spec: bad embedding 'embed:8x' (expected embed:D, D in "
         "1..4096 floats a row)"},
        {"embed:8", "model spec: embed:8 needs layers after it, ending in softmax or sigmoid (e.g. "
         "'embed:1 sigmoid')"},
        {"embed:1 softmax", "model spec: the last fc layer (or embed:D before softmax) needs at "
         "least 2 outputs"},
        {"embed:8 conv3x3:4 fc:2 softmax", "model spec: 'conv3x3:4' after embed:8 (the embedding "
         "gives 8 features: fc, relu, tanh, bn, dropout, softmax and sigmoid may follow it)"},
        {"embed:8 res( fc:8 ) fc:2 softmax", "model spec: 'res' after embed:8 (the embedding "
         "gives 8 features: fc, relu, tanh, bn, dropout, softmax and sigmoid may follow it)"},
        {"embed:8 ac:2", "model spec: 'ac:2' after embed:8 (the embedding gives 8 features: fc, "
         "relu, tanh, bn, dropout, softmax and sigmoid may follow it)"},
        {"embed:8 relu softmax", "model spec: softmax must follow a fully connected layer (or "
         "embed:D, as in 'embed:2 softmax')"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(dp_model_parse(&m, bad[i].spec, 1, 28, 28, err), -1);
        CHECK_STR(err, bad[i].err);
    }
}

/* sigmoid, the binary head: one logit (fc:1's, or embed:1's plus the head's
 * own scalar bias), two classes' probabilities out; anything else refused
 * with one line. */
static void test_sigmoid(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "embed:1 sigmoid", 1, 28, 28, err), 0); /* logistic regression */
    CHECK_EQ(m.n_layers, 1);
    CHECK_EQ(m.layers[0].kind, DP_LAYER_SIGMOID);
    CHECK(m.layers[0].in_c == 1 && m.layers[0].out_c == 2);
    CHECK_EQ(m.classes, 2);
    CHECK_EQ(m.n_params, 1); /* the bias: one float, zeros at start, named as PyTorch's */
    CHECK_STR(m.params[0].name, "bias");
    CHECK(m.params[0].ndim == 1 && m.params[0].shape[0] == 1 && m.n_floats == 1);
    CHECK_EQ(m.layers[0].bias, 0);
    float b = 7;
    dp_model_init_params(&m, &b, 3);
    CHECK_EQ(b, 0.0f);
    uint64_t lr = m.fingerprint;
    CHECK_EQ(dp_model_parse(&m, "embed:8 relu fc:4 tanh fc:1 sigmoid", 1, 1, 1, err), 0);
    CHECK_STR(m.params[2].name, "fc2.weight"); /* nn.Linear(4, 1): the fc's bias is the bias */
    CHECK(m.params[2].shape[0] == 1 && m.params[2].shape[1] == 4);
    CHECK_EQ(m.n_params, 4);
    CHECK_EQ(m.layers[m.n_layers - 1].bias, -1);
    CHECK_EQ(m.classes, 2);
    CHECK_EQ(dp_model_parse(&m, "fc:16 relu fc:1 sigmoid", 3, 8, 8, err), 0); /* an image model */
    CHECK_EQ(m.classes, 2);
    CHECK_EQ(dp_model_parse(&m, "embed:2 softmax", 1, 1, 1, err), 0);
    CHECK(m.fingerprint != lr);
    static const struct {
        const char *spec;
        const char *err;
    } bad[] = {
        {"fc:2 sigmoid", "model spec: sigmoid reads one logit but fc1 gives 2 (write fc:1 sigmoid, "
         "or softmax for 2 classes)"},
        {"embed:2 sigmoid", "model spec: sigmoid reads one logit but the embedding gives 2 (write "
         "embed:1 sigmoid, or softmax for 2 classes)"},
        {"fc:1 sigmoid relu", "model spec: 'relu' after sigmoid (it must be last)"},
        {"embed:1 sigmoid fc:1 sigmoid", "model spec: 'fc:1' after sigmoid (it must be last)"},
        {"fc:1 sigmoid sigmoid", "model spec: 'sigmoid' after sigmoid (it must be last)"},
        {"fc:1 relu sigmoid", "model spec: sigmoid must follow fc:1 or embed:1 (its one logit, as in "
         "'fc:1 sigmoid' or 'embed:1 sigmoid')"},
        {"sigmoid", "model spec: sigmoid must follow fc:1 or embed:1 (its one logit, as in 'fc:1 "
         "sigmoid' or 'embed:1 sigmoid')"},
        {"fc:1 sigmoid softmax", "model spec: 'softmax' after sigmoid (it must be last)"},
        {"fc:1 softmax", "model spec: the last fc layer (or embed:D before softmax) needs at least "
         "2 outputs"},
        {"conv3x3:4 res( fc:1 sigmoid )", "model spec: 'fc:1' inside a res block"},
        {"fc:1 sigmoid ac:2", "model spec: 'ac:2' after sigmoid (it must be last)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK_EQ(dp_model_parse(&m, bad[i].spec, 1, 28, 28, err), -1);
        CHECK_STR(err, bad[i].err);
    }
}

static void test_valid_padding_and_odd_shapes(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "conv3x3:5:valid relu maxpool2 fc:7 softmax", 3, 13, 11, err), 0);
    CHECK_EQ(m.layers[0].out_h, 11);
    CHECK_EQ(m.layers[0].out_w, 9);
    CHECK_EQ(m.layers[2].out_h, 5);
    CHECK_EQ(m.layers[2].out_w, 4);
    CHECK_EQ(m.layers[3].in_c, 5 * 5 * 4);
}

static void test_init_and_fingerprint(void)
{
    dp_model_t a, b;
    CHECK_EQ(dp_model_parse(&a, DP_MODEL_DEFAULT_SPEC, 1, 28, 28, NULL), 0);
    CHECK_EQ(dp_model_parse(&b, "conv5x5:32 relu maxpool2 conv5x5:64 relu maxpool2 fc:256 relu fc:10 softmax", 1, 28, 28, NULL), 0);
    CHECK(a.fingerprint != b.fingerprint);
    dp_model_t a2;
    CHECK_EQ(dp_model_parse(&a2, "  conv5x5:32  relu maxpool2 conv5x5:64 relu maxpool2 fc:512 relu fc:10 softmax ", 1, 28, 28, NULL), 0);
    CHECK(a.fingerprint == a2.fingerprint);
    float *p = dp_malloc(a.n_floats * sizeof(float));
    float *q = dp_malloc(a.n_floats * sizeof(float));
    dp_model_init_params(&a, p, 7);
    dp_model_init_params(&a, q, 7);
    CHECK(memcmp(p, q, a.n_floats * sizeof(float)) == 0);
    /* conv1 fan_in 25: bound 0.2; fc1 fan_in 3136: bound ~0.01786 */
    float mx = 0;
    for (size_t i = 0; i < 800; i++) mx = fabsf(p[i]) > mx ? fabsf(p[i]) : mx;
    CHECK(mx <= 0.2f && mx > 0.19f);
    const dp_param_t *fc1 = dp_model_find_param(&a, "fc1.weight");
    mx = 0;
    for (size_t i = 0; i < fc1->count; i++) mx = fabsf(p[fc1->offset + i]) > mx ? fabsf(p[fc1->offset + i]) : mx;
    CHECK_NEAR(mx, 1.0 / sqrt(3136.0), 1e-4);
    free(p);
    free(q);
}

/* The spec of a checkpoint or record is untrusted: sizes that would wrap
 * (or merely pass the stated bounds) are refused with one line naming the
 * token, never parsed into a model whose n_floats * 4 wrapped. */
static void test_sizes_are_bounded(void)
{
    /* 4369 + 4369 + 2146500591 * 4369 + ... = exactly 2^62 floats, so
     * n_floats * sizeof(float) wraps to 0 in a size_t (downpour eval then
     * allocated 1 byte and read conv1.weight's 4369 floats into it). */
    const char *wrap = "conv1x1:4369 conv1x1:2146500591 maxpool28 conv1x1:2147483647 "
                       "fc:978689 softmax";
    static const struct {
        const char *spec;
        const char *err;
    } cases[] = {
        {"conv1x1:4369 conv1x1:2146500591 maxpool28 conv1x1:2147483647 fc:978689 softmax",
         "model spec: 'conv1x1:2146500591': its output (2146500591 x 28 x 28) passes "
         "2147483647 floats a sample"},
        /* the same sum past the activations: 2^62 floats again */
        {"conv1x1:4369 maxpool28 conv1x1:2146500591 conv1x1:2147483647 fc:978689 softmax",
         "model spec: 'conv1x1:2146500591' makes conv2.weight too large (the parameters would "
         "pass 4294967296 floats)"},
        /* per-sample activation 2^31 x 28 x 28 (flattened, it wrapped an int) */
        {"conv1x1:2147483647 fc:10 softmax",
         "model spec: 'conv1x1:2147483647': its output (2147483647 x 28 x 28) passes "
         "2147483647 floats a sample"},
        /* a huge 'same' kernel: 28 + 2 * pad overflowed an int */
        {"conv2147483647x2147483647:1 fc:10 softmax",
         "model spec: 'conv2147483647x2147483647:1' makes conv1.weight too large (the "
         "parameters would pass 4294967296 floats)"},
        /* just past the total: 65536 * 65537 floats */
        {"conv1x1:65536 maxpool28 conv1x1:65537 fc:10 softmax",
         "model spec: 'conv1x1:65537' makes conv2.weight too large (the parameters would pass "
         "4294967296 floats)"},
        /* numbers past an int: sscanf's %d wrapped 2^32 + 2 to 2 */
        {"conv3x3:4294967298 fc:10 softmax",
         "model spec: bad convolution 'conv3x3:4294967298' (expected convKxK:OUT, e.g. conv5x5:32)"},
        {"conv3x3:-2 fc:10 softmax",
         "model spec: bad convolution 'conv3x3:-2' (expected convKxK:OUT, e.g. conv5x5:32)"},
        {"conv+3x3:2 fc:10 softmax",
         "model spec: bad convolution 'conv+3x3:2' (expected convKxK:OUT, e.g. conv5x5:32)"},
        /* fc:2^20 on a 2^31-1 flattened input: 2^51 floats */
        {"conv1x1:2739 fc:1048576 softmax",
         "model spec: 'fc:1048576' makes fc1.weight too large (the parameters would pass "
         "4294967296 floats)"},
    };
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, wrap, 1, 28, 28, err), -1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = 0;
        CHECK_EQ(dp_model_parse(&m, cases[i].spec, 1, 28, 28, err), -1);
        CHECK_STR(err, cases[i].err);
    }
    /* the input shape itself: 65536^3 samples are no input */
    CHECK_EQ(dp_model_parse(&m, "fc:10 softmax", 65536, 65536, 65536, err), -1);
    CHECK_STR(err, "model spec: bad input shape 65536x65536x65536");
    /* Large but in bounds: accepted, and the totals are exact. */
    CHECK_EQ(dp_model_parse(&m, "conv1x1:1024 maxpool28 conv1x1:1048576 fc:10 softmax", 1, 28,
                            28, err), 0);
    CHECK_EQ(m.n_floats, 1024 + 1024 + 1048576ull * 1024 + 1048576 + 10ull * 1048576 + 10);
    CHECK(m.n_floats <= DP_MODEL_MAX_FLOATS);
    CHECK_EQ(m.max_act, 1048576); /* conv2's output */
}

/* A tensor table: laid out in order, a scalar counts one float, the
 * fingerprint follows names, shapes and trainable flags, bad entries are
 * refused naming the tensor. */
static void test_table(void)
{
    dp_model_t m, m2;
    char err[DP_ERR_LEN] = "";
    int64_t w[2] = {3, 4}, b[1] = {3};
    dp_table_entry_t t[3] = {{"fc.weight", 2, w, 1}, {"fc.bias", 1, b, 1},
                             {"bn.num_batches_tracked", 0, NULL, 0}};
    CHECK_EQ(dp_model_from_table(&m, t, 3, err), 0);
    CHECK(dp_model_is_table(&m));
    CHECK_EQ(m.n_params, 3);
    CHECK_EQ(m.n_floats, 12 + 3 + 1);
    CHECK_EQ(m.params[1].offset, 12);
    CHECK_EQ(m.params[2].offset, 15);
    CHECK_EQ(m.params[2].trainable, 0);
    CHECK_EQ(m.params[0].trainable, 1);
    CHECK_EQ(m.n_layers, 0);
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = 7;
    dp_model_init_params(&m, v, 1);
    CHECK(v[0] == 0 && v[15] == 0);
    /* same table: same fingerprint; any change of name, shape, flag: another */
    CHECK_EQ(dp_model_from_table(&m2, t, 3, err), 0);
    CHECK_EQ(m2.fingerprint, m.fingerprint);
    t[2].trainable = 1;
    CHECK_EQ(dp_model_from_table(&m2, t, 3, err), 0);
    CHECK(m2.fingerprint != m.fingerprint);
    t[2].trainable = 0;
    w[1] = 5;
    CHECK_EQ(dp_model_from_table(&m2, t, 3, err), 0);
    CHECK(m2.fingerprint != m.fingerprint);
    w[1] = 4;
    t[1].name = "fc.bias2";
    CHECK_EQ(dp_model_from_table(&m2, t, 3, err), 0);
    CHECK(m2.fingerprint != m.fingerprint);
    /* a spec model is never a table, whatever its tensors */
    CHECK_EQ(dp_model_parse(&m2, "fc:10 softmax", 1, 2, 2, err), 0);
    CHECK(!dp_model_is_table(&m2));
    /* refused */
    t[1].name = "fc.weight";
    CHECK_EQ(dp_model_from_table(&m2, t, 3, err), -1);
    CHECK_STR(err, "tensor table: 'fc.weight' appears twice");
    t[1].name = "fc bias";
    CHECK_EQ(dp_model_from_table(&m2, t, 3, err), -1);
    CHECK(strstr(err, "entry 1: bad name 'fc bias'") != NULL);
    t[1].name = "fc.bias";
    b[0] = -1;
    CHECK_EQ(dp_model_from_table(&m2, t, 3, err), -1);
    CHECK_STR(err, "tensor table: 'fc.bias': dimension 0 is -1 (0..2147483647)");
    b[0] = 3;
    int64_t huge[3] = {1 << 30, 1 << 30, 1 << 30};
    dp_table_entry_t big = {"big", 3, huge, 1};
    CHECK_EQ(dp_model_from_table(&m2, &big, 1, err), -1);
    CHECK(strstr(err, "'big' makes the table pass") != NULL);
    CHECK_EQ(dp_model_from_table(&m2, t, 0, err), -1);
}

/* Every preset README names parses on CIFAR's input with its name as its
 * canonical spec (the text it stands for is several times
 * DP_MODEL_SPEC_LEN: resnet32 was refused as "too long" when the text's
 * canonical form was written out): 6n + 2 layers with weights (the 1x1
 * projections of the downsampling blocks aside), the three stages, more
 * floats with every depth, a fingerprint of its own. A name outside the
 * family, or a preset with anything after it, is one clear error. */
static void test_presets(void)
{
    static const int depth[] = {20, 32, 44, 56, 110};
    uint64_t fp[5];
    size_t last = 0;
    for (int k = 0; k < 5; k++) {
        static dp_model_t m;
        char err[DP_ERR_LEN] = "", name[16];
        snprintf(name, sizeof name, "resnet%d", depth[k]);
        CHECK_EQ(dp_model_parse(&m, name, 3, 32, 32, err), 0);
        CHECK_STR(m.spec, name);
        int conv3 = 0, adds = 0, fc = 0;
        for (int i = 0; i < m.n_layers; i++) {
            const dp_layer_t *l = &m.layers[i];
            conv3 += l->kind == DP_LAYER_CONV && l->k == 3;
            adds += l->kind == DP_LAYER_ADD;
            fc += l->kind == DP_LAYER_FC;
        }
        CHECK_EQ(conv3 + fc, depth[k]);
        CHECK_EQ(adds, (depth[k] - 2) / 2); /* 3 stages of (N - 2) / 6 blocks */
        CHECK_EQ(m.classes, 10);
        CHECK(m.n_floats > last);
        last = m.n_floats;
        fp[k] = m.fingerprint;
        for (int j = 0; j < k; j++) CHECK(fp[j] != fp[k]);
    }
    static const struct {
        const char *spec, *err;
    } bad[] = {
        {"resnet21", "model spec: unknown preset 'resnet21' (resnetN with N = 6n + 2: resnet20, "
                     "resnet32, resnet44, resnet56, resnet110)"},
        {"resnet56 relu", "model spec: the preset 'resnet56' stands alone"},
    };
    for (int i = 0; i < 2; i++) {
        static dp_model_t m;
        char err[DP_ERR_LEN] = "";
        CHECK_EQ(dp_model_parse(&m, bad[i].spec, 3, 32, 32, err), -1);
        CHECK_STR(err, bad[i].err);
    }
}

/* A spec of nothing but parentheses: each becomes " ( " when tokenised,
 * three bytes of one (the fuzzer found the buffer sized for two). */
/* The actor-critic head: ac:A after any trunk (the input itself too), its
 * policy and value fc layers named as such and both reading the trunk, the
 * loss layer last; tanh; a bare ac filled in from an environment's actions
 * (dp_model_spec_actions); and the ways a head is written wrong. */
static void test_ac_head(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "", spec[DP_MODEL_SPEC_LEN];
    CHECK_EQ(dp_model_spec_actions("fc:64  tanh fc:64 tanh ac", 2, spec, sizeof spec, err), 0);
    CHECK_STR(spec, "fc:64 tanh fc:64 tanh ac:2");
    CHECK_EQ(dp_model_parse(&m, spec, 4, 1, 1, err), 0);
    CHECK_STR(m.spec, "fc:64 tanh fc:64 tanh ac:2");
    CHECK(dp_model_is_ac(&m));
    CHECK_EQ(m.classes, 2);
    CHECK_EQ(m.n_layers, 7);
    CHECK_EQ(m.layers[1].kind, DP_LAYER_TANH);
    const dp_layer_t *pol = &m.layers[4], *val = &m.layers[5], *ac = &m.layers[6];
    CHECK_STR(pol->name, "policy");
    CHECK_STR(val->name, "value");
    CHECK_EQ(pol->kind, DP_LAYER_FC);
    CHECK_EQ(val->kind, DP_LAYER_FC);
    CHECK_EQ(pol->in0, 4); /* both read the trunk's output (boundary 4: after the 2nd tanh) */
    CHECK_EQ(val->in0, 4);
    CHECK_EQ(pol->in_c, 64);
    CHECK_EQ(val->in_c, 64);
    CHECK_EQ(pol->out_c, 2);
    CHECK_EQ(val->out_c, 1);
    CHECK_EQ(ac->kind, DP_LAYER_AC);
    CHECK_EQ(ac->in0, 5);
    CHECK_EQ(ac->in1, 6);
    CHECK_EQ(m.n_params, 8);
    CHECK_STR(m.params[4].name, "policy.weight");
    CHECK_EQ(m.params[4].shape[0], 2);
    CHECK_EQ(m.params[4].shape[1], 64);
    CHECK_STR(m.params[5].name, "policy.bias");
    CHECK_STR(m.params[6].name, "value.weight");
    CHECK_EQ(m.params[6].shape[0], 1);
    CHECK_STR(m.params[7].name, "value.bias");
    CHECK_EQ(m.n_floats, (size_t)(64 * 4 + 64 + 64 * 64 + 64 + 2 * 64 + 2 + 64 + 1));
    /* no trunk: a linear policy and critic of the observation; a conv trunk */
    CHECK_EQ(dp_model_parse(&m, "ac:3", 6, 1, 1, err), 0);
    CHECK_EQ(m.n_layers, 3);
    CHECK_EQ(m.layers[0].in0, 0);
    CHECK_EQ(m.layers[1].in0, 0);
    CHECK_EQ(dp_model_parse(&m, "conv3x3:4 tanh ac:2", 2, 5, 5, err), 0);
    CHECK_EQ(m.layers[2].in_c, 4 * 5 * 5);
    /* a spec of an ordinary classifier does not become one */
    CHECK_EQ(dp_model_parse(&m, "fc:8 softmax", 4, 1, 1, err), 0);
    CHECK(!dp_model_is_ac(&m));
    /* written wrong: one clear line each */
    static const struct { const char *spec, *why; } bad[] = {
        {"fc:8 tanh ac", "'ac' needs its number of actions"},
        {"fc:8 ac:1", "bad actor-critic head 'ac:1'"},
        {"fc:8 ac:65", "bad actor-critic head 'ac:65'"},
        {"fc:8 ac:2x", "bad actor-critic head"},
        {"fc:8 ac:2 fc:3", "'fc:3' after the actor-critic head"},
        {"fc:8 ac:2 ac:2", "after the actor-critic head"},
        {"fc:8 softmax ac:2", "after softmax"},
        {"conv3x3:4 res( conv3x3:4 ac:2 )", "inside a res block"},
        {"fc:8 tanh", "must end with"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK_EQ(dp_model_parse(&m, bad[i].spec, 4, 5, 5, err), -1);
        if (!strstr(err, bad[i].why)) fprintf(stderr, "  '%s': %s\n", bad[i].spec, err);
        CHECK(strstr(err, bad[i].why) != NULL);
    }
    CHECK_EQ(dp_model_spec_actions("fc:8 ac:3", 2, spec, sizeof spec, err), -1);
    CHECK(strstr(err, "'ac:3' but the environment has 2 actions") != NULL);
    CHECK_EQ(dp_model_spec_actions("fc:8 ac:2", 2, spec, sizeof spec, err), 0);
    CHECK_STR(spec, "fc:8 ac:2");
    CHECK_EQ(dp_model_spec_actions("fc:8 softmax", 2, spec, sizeof spec, err), -1);
    CHECK(strstr(err, "no actor-critic head") != NULL);
    CHECK_EQ(dp_model_spec_actions("resnet20", 2, spec, sizeof spec, err), -1);
    char tiny[8];
    CHECK_EQ(dp_model_spec_actions("fc:64 tanh ac", 2, tiny, sizeof tiny, err), -1);
    CHECK(strstr(err, "too long") != NULL);
}

static void test_parentheses_only(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "))))))))))))))))))))", 1, 8, 8, err), -1);
    CHECK(err[0] != 0 && strchr(err, '\n') == NULL);
    CHECK_EQ(dp_model_parse(&m, "((((((((((((((((((((", 1, 8, 8, err), -1);
    CHECK(err[0] != 0);
}

DP_TESTS(T(test_default_spec_shapes), T(test_ac_head), T(test_table), T(test_parentheses_only), T(test_presets), T(test_bad_specs), T(test_error_messages), T(test_embed), T(test_sigmoid),
         T(test_valid_padding_and_odd_shapes),
         T(test_init_and_fingerprint), T(test_sizes_are_bounded))
