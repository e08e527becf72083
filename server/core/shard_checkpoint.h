/* shard_checkpoint: a shard's parameters and optimizer state in a
 * safetensors file, written atomically and restored at start.
 *
 * The file holds "params" [n] and, for optimizers with state, "optim.state"
 * [state_per, n]; its metadata names the format ("downpour-ps-shard"), the
 * model (spec, input, fingerprint), the shard (I/K and its float range), the
 * optimizer, the version, a CRC-32 of each tensor, and the run: "run_id"
 * and "finished" ("1" once the chief's SHUTDOWN wrote it). A file that
 * exists but does not match this shard or does not read is an error, never
 * a silent fresh start.
 *
 * A checkpoint directory belongs to one run. Restoring checks the run after
 * the model: the same run id, not finished, is the same run restarted (a
 * crash, kill -9, SIGTERM) and carries on; another run id, or a finished
 * run, is refused unless resume is set, which continues the run in the file
 * (its id is adopted, its version — so its lr schedule — goes on). The
 * per-worker steps ride along as "worker_steps" (the last step applied per
 * worker, comma-separated, when the shard keeps them: a restarted shard
 * still applies a (worker, step) once and tells a restarted worker where to
 * resume) and "worker_steps_seen" (the highest step handled per worker,
 * applied or not: how far a worker's next step may be, dp_shard_step_check;
 * a file without it takes "worker_steps"). Shard 0 of an elastic crew
 * keeps its dealer beside them (server/crew/deal.h: the batches trained match
 * the weights restored).
 *
 * A shard of a model with a row table writes its rows (server/core/ps_rows.h)
 * to a file of their own beside it, named after the version
 * (DIR/ps-shard-I-of-K.rows-V: safetensors holds floats, the rows' keys
 * are 64-bit), before the shard's file, whose metadata names it
 * ("rows_file"); the older rows files go once the new shard file is in
 * place. So the pair on disk is always one version's, whenever a kill
 * comes. The whole table each time: its cost is O(rows held). */
#ifndef DP_SHARD_CHECKPOINT_H
#define DP_SHARD_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>

#include "server/core/ps_rows.h"
#include "server/core/shard.h"
#include "server/crew/deal.h"

#define DP_RUN_ID_LEN 80

/* Which run a checkpoint belongs to. */
typedef struct {
    char id[DP_RUN_ID_LEN]; /* this run's id (--run-id, or the flags' fingerprint) */
    bool resume;            /* restore: continue the file's run, whatever its id */
    bool finished;          /* write: the run ended (the chief's SHUTDOWN) */
    dp_deal_t *deal;        /* shard 0 of an elastic crew: its dealer, written with the shard
                             * (metadata "deal", tensor "deal.count") and restored with it;
                             * NULL: none */
    dp_ps_rows_t *rows;     /* a model with embed:D: the shard's rows (dp_ps_rows_save), in a
                             * file of their own (below); NULL or no table: none */
} dp_ckpt_run_t;

/* DIR/ps-shard-I-of-K.safetensors into out (n bytes). */
void dp_shard_checkpoint_path(char *out, size_t n, const char *dir, int i, int k);

/* Write s at its version to path, atomically, as run (NULL: no run id,
 * not finished). 0, or -1 with err. */
int dp_shard_checkpoint_write(const dp_shard_t *s, const char *path, const dp_ckpt_run_t *run,
                              char *err);

/* What a restore found. */
typedef enum {
    DP_CKPT_BAD = -1,     /* err says why; s is unchanged */
    DP_CKPT_NONE = 0,     /* no file: a fresh start */
    DP_CKPT_RESTORED = 1, /* s holds the file's state */
} dp_ckpt_restore_t;

/* Restore s (parameters, optimizer state, version) from path. BAD when the
 * file does not match s, does not read, fails its CRC, or belongs to
 * another or a finished run without run->resume. run may be NULL (any
 * run); with resume, run->id becomes the file's. */
dp_ckpt_restore_t dp_shard_checkpoint_restore(dp_shard_t *s, const char *path, dp_ckpt_run_t *run, char *err);

#endif
