/* shard_checkpoint: write / restore a shard (see shard_checkpoint.h). */
#include "server/shard_checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "common/util.h"

void dp_shard_checkpoint_path(char *out, size_t n, const char *dir, int i, int k)
{
    snprintf(out, n, "%s/ps-shard-%d-of-%d.safetensors", dir, i, k);
}

int dp_shard_checkpoint_write(const dp_shard_t *s, const char *path, char *err)
{
    int64_t pshape[1] = {(int64_t)s->n};
    int64_t sshape[2] = {s->state_per, (int64_t)s->n};
    dp_st_tensor_t t[2] = {{"params", s->w, 1, pshape}, {"optim.state", s->state, 2, sshape}};
    char ver[32], lo[32], hi[32], nf[32], fp[32], shard[32], input[48];
    snprintf(ver, sizeof ver, "%" PRIu64, s->version);
    snprintf(lo, sizeof lo, "%zu", s->lo);
    snprintf(hi, sizeof hi, "%zu", s->hi);
    snprintf(nf, sizeof nf, "%zu", s->model.n_floats);
    snprintf(fp, sizeof fp, "%016" PRIx64, s->model.fingerprint);
    snprintf(shard, sizeof shard, "%d/%d", s->index, s->count);
    snprintf(input, sizeof input, "%dx%dx%d", s->model.in_c, s->model.in_h, s->model.in_w);
    const char *meta[] = {"format", "downpour-ps-shard", "spec", s->model.spec, "input", input,
                          "fingerprint", fp, "shard", shard, "range_lo", lo, "range_hi", hi,
                          "n_floats", nf, "optimizer", dp_optim_kind_name(s->optim.kind),
                          "version", ver, "step", ver, NULL};
    return dp_safetensors_write(path, t, s->state_per ? 2 : 1, meta, err);
}

/* Metadata value key must equal want. */
static int s_meta_is(const char *path, const char *key, const char *want, char *err)
{
    char e2[DP_ERR_LEN] = "";
    char *v = dp_safetensors_read_meta(path, key, e2);
    if (!v) {
        if (e2[0]) return dp_err(err, "%s", e2);
        return dp_err(err, "%s: corrupt shard checkpoint: no '%s' in its metadata", path, key);
    }
    int same = strcmp(v, want) == 0;
    if (!same)
        dp_err(err, "%s: checkpoint has %s '%s', this shard has '%s' (remove the file or fix the flags)",
               path, key, v, want);
    free(v);
    return same ? 0 : -1;
}

/* The file is this shard's: format, model, range and optimizer; its version. */
static int s_check_meta(const dp_shard_t *s, const char *path, uint64_t *version, char *err)
{
    char lo[32], hi[32], fp[32];
    snprintf(lo, sizeof lo, "%zu", s->lo);
    snprintf(hi, sizeof hi, "%zu", s->hi);
    snprintf(fp, sizeof fp, "%016" PRIx64, s->model.fingerprint);
    if (s_meta_is(path, "format", "downpour-ps-shard", err) != 0 ||
        s_meta_is(path, "fingerprint", fp, err) != 0 || s_meta_is(path, "range_lo", lo, err) != 0 ||
        s_meta_is(path, "range_hi", hi, err) != 0 ||
        s_meta_is(path, "optimizer", dp_optim_kind_name(s->optim.kind), err) != 0)
        return -1;
    char e2[DP_ERR_LEN] = "";
    char *v = dp_safetensors_read_meta(path, "version", e2);
    if (!v) return dp_err(err, "%s", e2[0] ? e2 : "corrupt shard checkpoint: no version");
    char *end = NULL;
    errno = 0;
    unsigned long long ver = strtoull(v, &end, 10);
    int bad = errno || end == v || *end;
    free(v);
    if (bad) return dp_err(err, "%s: corrupt shard checkpoint: bad version in metadata", path);
    *version = ver;
    return 0;
}

int dp_shard_checkpoint_restore(dp_shard_t *s, const char *path, char *err)
{
    if (access(path, F_OK) != 0) return 0;
    uint64_t ver = 0;
    if (s_check_meta(s, path, &ver, err) != 0) return -1;
    float *w = dp_malloc(s->n * sizeof(float) + 1);
    float *st = dp_calloc(s->n * (size_t)s->state_per + 1, sizeof(float));
    int rc = -1;
    if (dp_safetensors_read_tensor(path, "params", w, s->n, err) != 0) goto done;
    if (s->state_per &&
        dp_safetensors_read_tensor(path, "optim.state", st, s->n * s->state_per, err) != 0)
        goto done;
    for (size_t i = 0; i < s->n; i++)
        if (!isfinite(w[i])) {
            dp_err(err, "%s: corrupt shard checkpoint: parameter %zu is not finite", path, i);
            goto done;
        }
    memcpy(s->w, w, s->n * sizeof(float));
    if (s->state_per) memcpy(s->state, st, s->n * s->state_per * sizeof(float));
    s->version = ver;
    rc = 1;
done:
    free(w);
    free(st);
    return rc;
}
