/* shard_checkpoint: a shard's parameters and optimizer state in a
 * safetensors file, written atomically and restored at start.
 *
 * The file holds "params" [n] and, for optimizers with state, "optim.state"
 * [state_per, n]; its metadata names the format ("downpour-ps-shard"), the
 * model (spec, input, fingerprint), the shard (I/K and its float range), the
 * optimizer and the version, and "worker_steps" (the last step applied per
 * worker, comma-separated, when the shard keeps them: a restarted shard
 * still applies a (worker, step) once and tells a restarted worker where to
 * resume). A file that exists but does not match this
 * shard or does not read is an error, never a silent fresh start. */
#ifndef DP_SHARD_CHECKPOINT_H
#define DP_SHARD_CHECKPOINT_H

#include <stddef.h>

#include "server/shard.h"

/* DIR/ps-shard-I-of-K.safetensors into out (n bytes). */
void dp_shard_checkpoint_path(char *out, size_t n, const char *dir, int i, int k);

/* Write s at its version to path. 0, or -1 with err. */
int dp_shard_checkpoint_write(const dp_shard_t *s, const char *path, char *err);

/* Restore s (parameters, optimizer state, version) from path: 1 when
 * restored, 0 when there is no file, -1 with err when the file does not
 * match s or does not read (s is then unchanged). */
int dp_shard_checkpoint_restore(dp_shard_t *s, const char *path, char *err);

#endif
