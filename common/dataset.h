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
 * a gzip bomb costs what its header claims and never more. */
#ifndef DP_DATASET_H
#define DP_DATASET_H

#include <stdint.h>

#define DP_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
/* 4 GiB of pixels: 90x Fashion-MNIST's training set, 27x CIFAR-10's. */
#define DP_DATASET_MAX_BYTES ((size_t)4 << 30)

typedef enum { DP_SPLIT_TRAIN, DP_SPLIT_TEST } dp_split_t;

typedef struct {
    char name[32];      /* "fashion-mnist", "mnist", "cifar10", "idx" */
    int n;              /* samples */
    int c, h, w;        /* image shape (1x28x28, 3x32x32) */
    int classes;        /* number of classes (10) */
    uint8_t *pixels;    /* n * c*h*w bytes, each sample C,H,W order */
    uint8_t *labels;    /* n, each < classes */
} dp_dataset_t;

/* Load split of the data set named by spec into ds (overwritten; call
 * dp_dataset_fini on a previously loaded one first). -1 with err on failure,
 * ds then empty (dp_dataset_fini on it is harmless). */
int dp_dataset_init(dp_dataset_t *ds, const char *spec, dp_split_t split, char *err);

/* Frees and zeroes ds; safe twice and on an empty/failed dataset. */
void dp_dataset_fini(dp_dataset_t *ds);

/* Gather samples idx[0..B) as floats pixel/255 into out[B*c*h*w] and labels
 * into labels[B] (labels may be NULL). Every idx[i] must be in [0, n). */
void dp_dataset_gather(const dp_dataset_t *ds, const int *idx, int B, float *out, int *labels);

/* Bytes of one sample (c*h*w). */
static inline int dp_dataset_sample_size(const dp_dataset_t *ds)
{
    return ds->c * ds->h * ds->w;
}

#endif
