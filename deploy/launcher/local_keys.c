/* local_keys: the keys of `downpour local --secure` (see local_keys.h). */
#include "deploy/launcher/local_keys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/curve.h"

static int s_mkdir(const char *path, char *err)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return dp_err(err, "cannot create %s: %s", path, strerror(errno));
    return 0;
}

/* kind-i in DIR/keys/sub, replacing an earlier run's pair. */
static int s_pair(dp_local_keys_t *k, const char *sub, const char *kind, int i, char *err)
{
    char pub[PATH_MAX + 8];
    snprintf(k->secret, sizeof k->secret, "%s/%s/%s-%d", k->dir, sub, kind, i);
    snprintf(pub, sizeof pub, "%s.pub", k->secret);
    unlink(k->secret);
    unlink(pub);
    return dp_curve_keygen(k->secret, err);
}

int dp_local_keys_make(dp_local_keys_t *k, const char *out, int shards, int workers, char *err)
{
    char sub[PATH_MAX];
    snprintf(k->dir, sizeof k->dir, "%s/keys", out);
    snprintf(k->allow, sizeof k->allow, "%s/workers", k->dir);
    snprintf(sub, sizeof sub, "%s/servers", k->dir);
    if (s_mkdir(k->dir, err) != 0 || s_mkdir(k->allow, err) != 0 || s_mkdir(sub, err) != 0)
        return -1;
    size_t cap = (size_t)shards * (strlen(sub) + 32) + 1, used = 0;
    free(k->servers);
    k->servers = dp_calloc(cap, 1);
    for (int i = 0; i < shards; i++) {
        if (s_pair(k, "servers", "ps", i, err) != 0) return -1;
        used += (size_t)snprintf(k->servers + used, cap - used, "%s%s.pub", i ? "," : "", k->secret);
    }
    for (int i = 0; i < workers; i++)
        if (s_pair(k, "workers", "worker", i, err) != 0) return -1;
    return 0;
}

void dp_local_keys_ps_args(dp_local_keys_t *k, int i, const char **av, int *n)
{
    snprintf(k->secret, sizeof k->secret, "%s/servers/ps-%d", k->dir, i);
    av[(*n)++] = "--curve-secret";
    av[(*n)++] = k->secret;
    av[(*n)++] = "--curve-allow";
    av[(*n)++] = k->allow;
}

void dp_local_keys_worker_args(dp_local_keys_t *k, int i, const char **av, int *n)
{
    snprintf(k->secret, sizeof k->secret, "%s/workers/worker-%d", k->dir, i);
    av[(*n)++] = "--curve-secret";
    av[(*n)++] = k->secret;
    av[(*n)++] = "--curve-server";
    av[(*n)++] = k->servers;
}

void dp_local_keys_fini(dp_local_keys_t *k)
{
    free(k->servers);
    k->servers = NULL;
}
