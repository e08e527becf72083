/* local_device: `downpour local --ps-device cpu|gpu` — where the shards keep
 * their weights and optimizer state. With gpu each shard is a device shard
 * (downpour-ps --device cuda:G) on a listed GPU: shard i on the i-th entry
 * of --gpus (wrapping when --ps-shards is given larger), so `--gpus 0,1`
 * puts one half of the model on each GPU beside its worker and `--gpus 0,0`
 * puts both shards and both workers on GPU 0.
 *
 * Test hook, read here only (dp_local_device_init): DP_TEST_PS_DEVICE=DEV
 * makes --ps-device gpu hand every shard DEV (e.g. cpu:staged, the CPU
 * stand-in of the device protocol) instead of cuda:G, and lets it run
 * without --gpus, so a machine without a GPU runs the launcher's device
 * path end to end. */
#ifndef DP_LOCAL_DEVICE_H
#define DP_LOCAL_DEVICE_H

#include <stddef.h>

#define DP_LOCAL_DEVICE_LEN 24 /* "cuda:1024", "cpu:staged" */

typedef struct {
    const char *flag;  /* --ps-device as given, or NULL (cpu) */
    int gpu;           /* --ps-device gpu */
    const char *test;  /* DP_TEST_PS_DEVICE, or NULL */
    char device[DP_LOCAL_DEVICE_LEN]; /* the shard being started: its --device */
} dp_local_device_t;

/* Checks --ps-device against --gpus (NULL: none) and settles the shard
 * count: with gpu and --ps-shards not given (shards_given 0), one shard per
 * listed GPU. Returns -1 with one line in err (bad usage). */
int dp_local_device_init(dp_local_device_t *d, const char *gpus, int shards_given, int *shards,
                         int max_shards, char *err);

/* "cuda:G" for the i-th entry of gpus into out. */
void dp_local_gpu_at(const char *gpus, int i, char *out, size_t n);

/* Shard i's --device (NULL: the daemon's default, cpu); the string lives in
 * d until the next call. */
const char *dp_local_device_shard(dp_local_device_t *d, const char *gpus, int i);

/* Every shard's device, comma-separated ("cuda:0,cuda:1"), for summary.json. */
void dp_local_device_list(const dp_local_device_t *d, const char *gpus, int shards, char *out, size_t n);

#endif
