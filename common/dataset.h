/* dataset: image classification data sets read whole into memory — IDX
 * (MNIST, Fashion-MNIST; plain or gzip) and the CIFAR-10 binary version.
 *
 * Spec forms accepted by dp_dataset_init:
 *   fashion-mnist                   Debian's dataset-fashion-mnist (DP_FASHION_MNIST_DIR)
 *   fashion-mnist:DIR, mnist:DIR    IDX files train-images-idx3-ubyte[.gz],
 *                                   train-labels-idx1-ubyte[.gz], t10k-... in DIR
 *   cifar10:DIR                     data_batch_1..5.bin / test_batch.bin in DIR
 *                                   (or in DIR/cifar-10-batches-bin)
 *   idx:IMAGES,LABELS[,CLASSES]     one explicit IDX pair (the split is ignored);
 *                                   CLASSES defaults to 10
 * A file NAME is read as NAME.gz when that exists, else NAME (zlib reads plain
 * files transparently too).
 *
 * Invariants after a successful load: n >= 1; pixels holds n * c*h*w bytes,
 * each sample in C,H,W order; every labels[i] < classes. Files are validated
 * completely (magic, dimensions, counts, truncation, trailing bytes, label
 * range): an error is one line naming the file and what is wrong, and the
 * dataset is left empty.
 *
 * Bounds: a data set holds at most DP_DATASET_MAX_BYTES of pixels, all its
 * files together. An IDX header announcing more is refused before a byte
 * of its data is decompressed; the data is decompressed only up to the
 * size its header announces (plus one byte, to refuse a longer stream), so
 * a gzip bomb costs what its header claims and never more.
 *
 * Normalisation (--normalize): a set may carry a per-channel mean and std;
 * its gather then gives (pixel/255 - mean[c]) / std[c], the float ops of
 * torchvision's ToTensor + Normalize, so every consumer (the prefetch
 * thread, the lab, evaluation) sees the same values. */
#ifndef DP_DATASET_H
#define DP_DATASET_H

#include <stddef.h>
#include <stdint.h>

#define DP_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
/* 4 GiB of pixels: 90x Fashion-MNIST's training set, 27x CIFAR-10's. */
#define DP_DATASET_MAX_BYTES ((size_t)4 << 30)
/* Channels a normalisation covers (the sets read here have 1 or 3). */
#define DP_DATASET_MAX_C 16
/* "M0,M1,.../S0,S1,...": the longest normalisation text (%.9g each). */
#define DP_DATASET_NORM_LEN (2 * DP_DATASET_MAX_C * 18 + 2)

typedef enum { DP_SPLIT_TRAIN, DP_SPLIT_TEST } dp_split_t;

typedef struct {
    char name[32];      /* "fashion-mnist", "mnist", "cifar10", "idx" */
    int n;              /* samples */
    int c, h, w;        /* image shape (1x28x28, 3x32x32) */
    int classes;        /* number of classes (10) */
    uint8_t *pixels;    /* n * c*h*w bytes, each sample C,H,W order */
    uint8_t *labels;    /* n, each < classes */
    int normalized;     /* 1: gather normalises by mean / std (dp_dataset_set_normalize) */
    float mean[DP_DATASET_MAX_C], std[DP_DATASET_MAX_C]; /* of pixel/255, per channel */
} dp_dataset_t;

/* Load split of the data set named by spec into ds (overwritten; call
 * dp_dataset_fini on a previously loaded one first). -1 with err on failure,
 * ds then empty (dp_dataset_fini on it is harmless). */
int dp_dataset_init(dp_dataset_t *ds, const char *spec, dp_split_t split, char *err);

/* Frees and zeroes ds; safe twice and on an empty/failed dataset. */
void dp_dataset_fini(dp_dataset_t *ds);

/* Keep the first n samples only (--train-samples: a training subset that
 * every mode, the simulator and replay draw from alike); n <= 0 or at least
 * ds->n keeps all. The buffers stay as loaded: gather reads below n. */
void dp_dataset_limit(dp_dataset_t *ds, int n);

/* Gather samples idx[0..B) as floats pixel/255 (normalised when the set
 * is) into out[B*c*h*w] and labels into labels[B] (labels may be NULL).
 * Every idx[i] must be in [0, n). */
void dp_dataset_gather(const dp_dataset_t *ds, const int *idx, int B, float *out, int *labels);

/* The mean and (population) std of pixel/255 per channel over all of ds,
 * into mean[c], std[c]: from per-channel histograms of the bytes, so exact
 * sums in any order (the same figures on every worker and machine). */
void dp_dataset_channel_stats(const dp_dataset_t *ds, float *mean, float *std);

/* Normalise ds's gathers by mean[0..c), std[0..c) (each finite, std > 0). */
int dp_dataset_set_normalize(dp_dataset_t *ds, const float *mean, const float *std, char *err);

/* "M0,M1,.../S0,S1,..." (c numbers each) into mean, std; -1 with one line. */
int dp_dataset_parse_normalize(const char *text, int c, float *mean, float *std, char *err);
/* ds's normalisation as that text (round-trips floats exactly), "" if none. */
void dp_dataset_normalize_text(const dp_dataset_t *ds, char *out, size_t n);

/* The gathered value of a 0 pixel in channel ch: 0, or -mean/std when
 * normalised (the zero padding of a random crop, as torchvision pads the
 * image before normalising). */
float dp_dataset_zero(const dp_dataset_t *ds, int ch);

/* Bytes of one sample (c*h*w). */
static inline int dp_dataset_sample_size(const dp_dataset_t *ds)
{
    return ds->c * ds->h * ds->w;
}

#endif
