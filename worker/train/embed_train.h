/* embed_train: `downpour-worker --data libsvm:TRAIN[:TEST]`, a model with
 * an embedding (embed:D, common/model.h) trained standalone in one process
 * or against the servers. Three parts, each of its own module:
 *   the data     worker/exec/sparse_data.h: the libsvm files in batches
 *   the stage    kernels/embed.h: a batch's distinct keys, the bag sums
 *                and their row gradients; it is handed rows and hands
 *                back gradients, owning none
 *   the rows     standalone: server/core/rows.h's dp_rows_t in this process,
 *                stepped by its row optimizer (--row-optimizer, --row-lr,
 *                a constant lr), rows made on their first push; in a
 *                cluster: the servers' (below)
 * and the dense layers after the embedding, which are the session's net
 * (worker/train/train.h) on inputs of D x 1 x 1 with their own --optimizer and
 * schedule, as any standalone run.
 *
 * A step: the batch's distinct keys are pulled from the table (a key with
 * no row reads as its initial value), summed into the net's input, the net
 * steps and returns the gradient wrt that input, the stage turns it into
 * one gradient per distinct key, and the table takes them as one push at
 * version step + 1. Deterministic: the same flags give the same bits
 * (the table's state is a function of its pushes; the net's kernels of
 * their thread count).
 *
 * The end: the test file's accuracy, loss and AUC (two classes: the
 * probability of class 1 as the score, common/auc.h; 8 bytes a test
 * sample are held for it), --save (the dense layers and the table's rows,
 * common/safetensors.h's DP_ST_ROWS_KEYS and DP_ST_ROWS_WEIGHT, with the
 * row count, digest, init and seed in the metadata), summary.json (worker/train/train.h's fields and test_auc, rows,
 * rows_digest, row_optimizer, row_lr, row_init). */
#ifndef DP_EMBED_TRAIN_H
#define DP_EMBED_TRAIN_H

#include <signal.h>

#include "kernels/embed.h"
#include "worker/exec/sparse_data.h"
#include "worker/train/train.h"

/* The embed kind (worker/train/driver.h's dp_train_embed) runs the same
 * model standalone or against parameter servers (--ps or the cluster
 * flags), which hold the table (server/core/ps_rows.h) and the dense layers:
 * worker i of a fixed crew of N trains the training file's batches i,
 * i + N, ..., each step pulling the dense weights and its batch's rows and
 * pushing the rows' gradients, then the dense gradient. The chief (task 0)
 * ends the run: the servers' model on the test file (test_auc), the rows
 * per shard from STATS, bytes_pushed and bytes_pulled, --save (the dense
 * layers and every shard's rows, read by scans: dp_ps_client_rows_all; the
 * servers' init and seed in the metadata, no digest), and summary.json. */

/* The rows of n distinct keys (n x d into rows, in the order asked),
 * however they are held (a table here, the servers, a replay's shards). */
typedef int (*dp_embed_rows_fn)(void *arg, const uint64_t *keys, size_t n, int d, float *rows,
                                char *err);

/* What an evaluation of a sparse model reads and writes: the net (the
 * dense layers, their weights set), the data's test file, the stage, the
 * rows' source, and the buffers of one batch (x: B x D, y: B, row_w:
 * max_nnz x D) and of the test file (scores, labels: test_samples each). */
typedef struct {
    dp_net_t *net;
    dp_sparse_data_t *data;
    dp_embed_t *stage;
    dp_embed_rows_fn rows;
    void *arg;
    float *x, *row_w, *scores, *labels;
    int *y;
} dp_embed_eval_t;

/* The test file's accuracy, mean loss and AUC as a run ends it (NAN where
 * there is no test file, or one class is missing from it; the rows of
 * each test batch read once, in the file's order). -1 with err on a read
 * failure or a failure of the rows' source. The worker's chief and
 * `downpour replay` (deploy/lab/engine.h) share it, so a replay's figures
 * are the run's. */
int dp_embed_evaluate(const dp_embed_eval_t *e, double *acc, double *loss, double *auc, char *err);

/* Every row of k tables (keys in no two of them) in key order: *keys (n)
 * and *rows (n x D) malloc'd, the caller frees; n returned. */
struct dp_rows;
size_t dp_embed_rows_of(struct dp_rows *const *tables, int k, uint64_t **keys, float **rows);

/* A sparse model's file (what --save writes, standalone, the chief or a
 * replay): the dense layers and n rows, keys ascending
 * (dp_checkpoint_save_rows: no optimizer state), with the metadata
 * `downpour eval` reads: the row count, what an absent key reads as (the
 * table's init and seed), the batch the test file was scored in; the
 * table's digest when given (a standalone run's one table). */
int dp_embed_save_file(const char *path, const dp_model_t *m, const float *params, long step,
                       long version, const uint64_t *keys, const float *rows, size_t n, float init,
                       uint64_t seed, int batch, const char *digest, char *err);

/* What dp_embed_eval_file measured. */
typedef struct {
    double accuracy, loss, auc; /* the test file's (auc NAN with one class only) */
    uint64_t samples;           /* in the test file */
    uint64_t rows;              /* rows the model file held */
    int batch;                  /* the batches it was scored in */
} dp_embed_scores_t;

/* `downpour eval` of a sparse model's file (what --save wrote): its dense
 * layers and its rows (dp_safetensors_read_rows) in a table of this
 * process, scored on the libsvm file test by the code that scores a run
 * (the same batches: batch 0 takes the file's own "batch", so the numbers
 * are its summary's bit for bit at the same --threads). A key not in the
 * file reads as the table's initial value, which the file's metadata names
 * (DP_ST_ROWS_INIT, DP_ST_ROWS_SEED; zeros when absent). 0, or -1 with err
 * (one line: not such a file, a bad row table, a bad test file). */
int dp_embed_eval_file(const char *path, const char *test, int batch, int threads, dp_precision_t precision,
                       dp_embed_scores_t *out, char *err);

#endif
