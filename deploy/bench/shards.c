/* bench/shards: the benchmarks' model and real shards (shards.h). */
#include "deploy/bench/shards.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/util.h"
#include "deploy/launcher/spawn.h"

int dp_bench_model(dp_model_t *m, const char *spec, long params, char *input, size_t n, char *err)
{
    if (params <= 0) {
        snprintf(input, n, "1x28x28");
        return dp_model_parse(m, spec ? spec : DP_MODEL_DEFAULT_SPEC, 1, 28, 28, err);
    }
    /* fc:10 over F inputs holds 10 F + 10 floats */
    long f = (params - 10 + 5) / 10;
    if (f < 1) f = 1;
    long h = 1, w = f;
    if (f > 65536) {
        h = (f + 500) / 1000;
        w = 1000;
    }
    snprintf(input, n, "1x%ldx%ld", h, w);
    return dp_model_parse(m, "fc:10 softmax", 1, (int)h, (int)w, err);
}

int dp_bench_shards_init(dp_bench_shards_t *b, const char *name, const char *argv0, char *err)
{
    memset(b, 0, sizeof *b);
    snprintf(b->dir, sizeof b->dir, "/tmp/downpour-%s-XXXXXX", name);
    if (!mkdtemp(b->dir)) {
        b->dir[0] = '\0';
        return dp_err(err, "mkdtemp: %s", strerror(errno));
    }
    char bin_dir[PATH_MAX];
    dp_spawn_bin_dir(bin_dir, sizeof bin_dir, argv0);
    snprintf(b->bin, sizeof b->bin, "%s/downpour-ps", bin_dir);
    return 0;
}

int dp_bench_shards_start(dp_bench_shards_t *b, const dp_bench_shards_conf_t *c, char *err)
{
    char workers[16], threads[16];
    snprintf(workers, sizeof workers, "%d", c->workers);
    snprintf(threads, sizeof threads, "%d", c->threads);
    for (int i = 0; i < c->shards && i < DP_BENCH_MAX_SHARDS; i++) {
        char bind[PATH_MAX + 16], ready[PATH_MAX], log[PATH_MAX], shard[24], ep[256];
        if (c->ipc) snprintf(bind, sizeof bind, "ipc://%s/ps-%d", b->dir, i);
        else snprintf(bind, sizeof bind, "tcp://127.0.0.1:*");
        snprintf(ready, sizeof ready, "%s/ready-%d", b->dir, i);
        snprintf(log, sizeof log, "%s/ps-%d.log", b->dir, i);
        snprintf(shard, sizeof shard, "%d/%d", i, c->shards);
        const char *av[] = {b->bin, "--bind", bind, "--ready-file", ready, "--shard", shard,
                            "--workers", workers, "--mode", "async", "--model", c->spec,
                            "--input", c->input, "--optimizer", c->optimizer,
                            c->threads ? "--threads" : NULL, threads, NULL};
        if (dp_spawn(&b->pid[i], av, log, err) != 0) return -1;
        b->n = i + 1;
        if (dp_spawn_wait_ready(ready, b->pid[i], log, 30, ep, sizeof ep, err) != 0) return -1;
        size_t used = strlen(b->endpoints);
        snprintf(b->endpoints + used, sizeof b->endpoints - used, "%s%s", i ? "," : "", ep);
    }
    return 0;
}

void dp_bench_shards_stop(dp_bench_shards_t *b)
{
    for (int i = 0; i < b->n; i++) kill(b->pid[i], SIGTERM);
    for (int i = 0; i < b->n; i++) waitpid(b->pid[i], NULL, 0);
    b->n = 0;
}

void dp_bench_shards_fini(dp_bench_shards_t *b)
{
    dp_bench_shards_stop(b);
    if (!b->dir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", b->dir);
    if (system(cmd) != 0) dp_log_warn("could not remove %s", b->dir);
    b->dir[0] = '\0';
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dp_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
