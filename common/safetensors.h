/* safetensors: the Hugging Face safetensors file format, and model
 * checkpoints stored in it.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON (padded with
 * spaces to a multiple of 8, as the reference writer does), then the raw
 * little-endian tensor bytes. The JSON maps each tensor name to {"dtype",
 * "shape", "data_offsets": [begin, end]} (offsets relative to the data
 * start) and may hold "__metadata__", a map of string to string.
 *
 * This module writes F32 tensors, I64 for counters (batch norm's
 * num_batches_tracked, which PyTorch saves as int64) and U64 for a row
 * table's keys (below); it reads files
 * holding any dtype (validating every entry) but returns F32 tensors only,
 * and a model's counters from I64 or F32. Writes are atomic
 * (temp file, fsync, rename): a crash never leaves a partial file at the
 * path. Readers validate the whole header (bounded length, valid JSON, known
 * dtypes, shapes matching byte counts, offsets in range and non-overlapping)
 * before touching the caller's buffers, and leave them unchanged on any
 * error; errors are one line "PATH: what is wrong". Assumes a little-endian
 * host (checked at compile time). */
#ifndef DP_SAFETENSORS_H
#define DP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/model.h"

#define DP_ST_MAX_DIMS 8
#define DP_ST_MAX_HEADER ((uint64_t)100 << 20) /* the reference reader's limit */

/* One tensor to write: shape[0..ndim) (ndim 0 = scalar), data holds
 * the product of the shape floats, C order. */
typedef struct {
    const char *name;
    const float *data;
    int ndim;
    const int64_t *shape;
} dp_st_tensor_t;

/* Write tensors t[0..n) (names unique, non-empty, not "__metadata__") and
 * metadata pairs meta_kv = {key, value, ..., NULL} (may be NULL) to path,
 * atomically. Tensors are laid in the given order, contiguous. */
int dp_safetensors_write(const char *path, const dp_st_tensor_t *t, int n,
                         const char *const *meta_kv, char *err);

/* As dp_safetensors_write, tensor i of the dtype i64[i] says (i64 may be
 * NULL: all F32): DP_ST_F32; DP_ST_I64, each float an integer count,
 * rounded to the nearest integer; DP_ST_U64, data then points at uint64_t
 * values (a row table's keys), written as they are. */
#define DP_ST_F32 0
#define DP_ST_I64 1
#define DP_ST_U64 2
int dp_safetensors_write_typed(const char *path, const dp_st_tensor_t *t, const int *i64, int n,
                               const char *const *meta_kv, char *err);

/* Read tensor name, which must be F32 with exactly count elements, into
 * out[0..count). out unchanged on error. */
int dp_safetensors_read_tensor(const char *path, const char *name, float *out, size_t count,
                               char *err);

/* The metadata value for key as a malloc'd string. NULL when the file is bad
 * (err says why) or when the key is absent (err is then set to ""). */
char *dp_safetensors_read_meta(const char *path, const char *key, char *err);

/* The metadata key naming, comma-separated, the tensors of a --init file
 * that are state, not trained by gradients (dp_param_t.trainable = 0). */
#define DP_ST_STATE_KEY "downpour.state"

/* The metadata key giving, as a decimal D, the width of a row table the
 * servers hold beside a --init file's tensors (dp_model_table_rows: a
 * PyTorch module's sparse embedding, whose weight is not in the file). */
#define DP_ST_ROWS_KEY "downpour.rows"

/* A tensor table from the safetensors file at path (downpour-ps --init):
 * every tensor, in the order its data lies in the file (ties, which only
 * empty tensors make, in header order), each F32 of at most
 * DP_PARAM_MAX_DIMS dimensions; those named in the metadata's
 * DP_ST_STATE_KEY or in extra_state (a comma list, may be NULL) are state.
 * With values not NULL, *values gets the tensors' floats laid out as m says
 * (64-byte aligned, the caller frees), each checked finite. On error m and
 * *values are unchanged. */
int dp_safetensors_read_table(const char *path, const char *extra_state, dp_model_t *m,
                              float **values, char *err);

/* A sparse model's row table in its file (embed:D, common/model.h): two
 * tensors named after the embedding, as a PyTorch module holding an
 * nn.EmbeddingBag named "embed" would name its weight:
 *   DP_ST_ROWS_KEYS    U64 [n], the keys, strictly ascending
 *   DP_ST_ROWS_WEIGHT  F32 [n, D], row i is key i's
 * (no optimizer state: a model file, not a checkpoint to resume). A key
 * not in the file reads as the table's initial value, which the metadata
 * names (DP_ST_ROWS_INIT: the bound of the uniform start, 0 for zeros;
 * DP_ST_ROWS_SEED: its seed), so the file scores as the table did. */
#define DP_ST_ROWS_KEYS "embed.keys"
#define DP_ST_ROWS_WEIGHT "embed.weight"
#define DP_ST_ROWS_INIT "embed_row_init"
#define DP_ST_ROWS_SEED "embed_row_seed"

/* The row table of the file at path, rows d wide: *keys (n) and *rows
 * (n x d) malloc'd (the caller frees both; NULL when n is 0). Refused with
 * one line "PATH: ..." and nothing returned: either tensor missing, a
 * dtype other than U64 / F32, a shape other than [n] / [n, d], keys not
 * strictly ascending (a key twice, or out of order), a value not finite.
 * Memory: what the file's bytes say, each checked against its length. */
int dp_safetensors_read_rows(const char *path, int d, uint64_t **keys, float **rows, size_t *n,
                             char *err);

/* Model checkpoint: one tensor per m->params entry (PyTorch names, layouts
 * and dtypes: counters, dp_param_t.counter, as I64) and metadata "format": "downpour", "spec": m->spec, "input":
 * "CxHxW", "classes", "fingerprint" (16 hex digits), "step", "version", then
 * the pairs of extra_kv ({key, value, ..., NULL}, may be NULL). */
int dp_checkpoint_save(const char *path, const dp_model_t *m, const float *params, long step,
                       long version, const char *const *extra_kv, char *err);

/* As dp_checkpoint_save, plus tensors extra[0..n_extra) after the model's
 * (e.g. the optimizer state the parameter server restores with
 * dp_safetensors_read_tensor). */
int dp_checkpoint_save_ex(const char *path, const dp_model_t *m, const float *params, long step,
                          long version, const dp_st_tensor_t *extra, int n_extra,
                          const char *const *extra_kv, char *err);

/* As dp_checkpoint_save, plus a sparse model's row table: n keys
 * (strictly ascending) as DP_ST_ROWS_KEYS and their rows (n x D, D =
 * m->embed_dim) as DP_ST_ROWS_WEIGHT, after the model's tensors. */
int dp_checkpoint_save_rows(const char *path, const dp_model_t *m, const float *params, long step,
                            long version, const uint64_t *keys, const float *rows, size_t n,
                            const char *const *extra_kv, char *err);

/* Load a checkpoint into params[0..m->n_floats). Every tensor of m must be
 * present as F32 with m's shape (a counter: I64 or F32, each value an
 * integer below 2^24 so that the float holds it exactly); other tensors in the file are ignored.
 * step / version (may be NULL) come from the metadata, 0 when absent. On any
 * error params, *step and *version are unchanged. */
int dp_checkpoint_load(const char *path, const dp_model_t *m, float *params, long *step,
                       long *version, char *err);

#endif
