/* local_keys: `downpour local --secure` — a CURVE key pair for every shard
 * and every worker of one run, in DIR/keys, and the flags that hand them to
 * each daemon: a shard gets its secret and admits the workers' public keys
 * (every .pub in DIR/keys/workers); a worker gets its secret and the shards' public
 * keys in shard order. Keys of an earlier run in DIR are replaced. */
#ifndef DP_LOCAL_KEYS_H
#define DP_LOCAL_KEYS_H

#include <limits.h>

typedef struct {
    char dir[PATH_MAX / 2]; /* DIR/keys */
    char allow[PATH_MAX];   /* DIR/keys/workers: what the shards admit */
    char *servers;          /* the shards' public key files, comma list in shard order */
    char secret[PATH_MAX];  /* the daemon being started: its secret key file */
} dp_local_keys_t;

/* Writes the pairs DIR/keys/servers/ps-I and DIR/keys/workers/worker-J. */
int dp_local_keys_make(dp_local_keys_t *k, const char *out, int shards, int workers, char *err);

/* Appends shard i's (or worker i's) CURVE flags to av at *n. The strings
 * live in k until the next call. */
void dp_local_keys_ps_args(dp_local_keys_t *k, int i, const char **av, int *n);
void dp_local_keys_worker_args(dp_local_keys_t *k, int i, const char **av, int *n);

void dp_local_keys_fini(dp_local_keys_t *k); /* safe on a zeroed or finished k */

#endif
