/* local_device: which device each of `downpour local`'s shards gets
 * (local_device.h). The launcher only names the device; the shard opens it
 * and refuses in one line when it cannot (no CUDA in the build, no such
 * GPU), which the launcher passes on as the shard's last log line. */
#include "deploy/launcher/local_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int dp_local_device_init(dp_local_device_t *d, const char *gpus, int shards_given, int *shards,
                         int max_shards, char *err)
{
    const char *flag = d->flag;
    memset(d, 0, sizeof *d);
    d->flag = flag;
    if (!flag || strcmp(flag, "cpu") == 0) return 0;
    if (strcmp(flag, "gpu") != 0)
        return dp_err(err, "--ps-device %s: expected cpu or gpu", flag);
    d->gpu = 1;
    const char *test = getenv("DP_TEST_PS_DEVICE");
    if (test && test[0]) {
        d->test = test;
        if (strlen(test) >= sizeof d->device)
            return dp_err(err, "DP_TEST_PS_DEVICE '%.40s': longer than %zu characters", test,
                          sizeof d->device - 1);
        if (!gpus) return 0; /* the stand-in needs no GPU list */
    } else if (!gpus) {
        return dp_err(err, "--ps-device gpu puts shard i on the i-th GPU of --gpus: give --gpus LIST");
    }
    int n = 1;
    for (const char *p = gpus; *p; p++) n += *p == ',';
    if (!shards_given) *shards = n > max_shards ? max_shards : n;
    return 0;
}

void dp_local_gpu_at(const char *gpus, int i, char *out, size_t n)
{
    const char *gpu = gpus;
    for (int k = 0; k < i; k++) gpu += strcspn(gpu, ",") + 1;
    snprintf(out, n, "cuda:%.*s", (int)strcspn(gpu, ","), gpu);
}

const char *dp_local_device_shard(dp_local_device_t *d, const char *gpus, int i)
{
    if (!d->gpu) return NULL;
    if (d->test) {
        snprintf(d->device, sizeof d->device, "%s", d->test);
    } else {
        int n = 1;
        for (const char *p = gpus; *p; p++) n += *p == ',';
        dp_local_gpu_at(gpus, i % n, d->device, sizeof d->device);
    }
    return d->device;
}

void dp_local_device_list(const dp_local_device_t *d, const char *gpus, int shards, char *out, size_t n)
{
    dp_local_device_t each = *d; /* dp_local_device_shard writes its buffer */
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < shards && used < n; i++) {
        const char *dev = dp_local_device_shard(&each, gpus, i);
        used += (size_t)snprintf(out + used, n - used, "%s%s", i ? "," : "", dev ? dev : "cpu");
    }
}
