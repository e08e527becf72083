/* shard_checkpoint: write / restore a shard (see shard_checkpoint.h). */
#include "server/core/shard_checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/checksum.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "server/core/shard_dc.h"

void dp_shard_checkpoint_path(char *out, size_t n, const char *dir, int i, int k)
{
    snprintf(out, n, "%s/ps-shard-%d-of-%d.safetensors", dir, i, k);
}

/* ---- the per-worker steps: metadata "worker_steps" (applied) and
 * "worker_steps_seen" (handled, the plausibility bound) ----------------- */

/* "S0,S1,...": one step per worker out of steps (malloc'd), or NULL when the
 * shard keeps none. */
static char *s_steps_meta(const dp_shard_t *s, const uint64_t *steps)
{
    if (!steps) return NULL;
    size_t cap = (size_t)s->n_workers * 21 + 1, at = 0;
    char *out = dp_malloc(cap);
    out[0] = 0;
    for (int i = 0; i < s->n_workers; i++)
        at += (size_t)snprintf(out + at, cap - at, "%s%" PRIu64, i ? "," : "", steps[i]);
    return out;
}

/* The steps of key back into into; a file without the key (written before
 * such steps were kept) leaves them as they are. */
static int s_steps_read(dp_shard_t *s, const char *path, const char *key, uint64_t *into, char *err)
{
    char e2[DP_ERR_LEN] = "";
    char *v = dp_safetensors_read_meta(path, key, e2);
    if (!v) return e2[0] ? dp_err(err, "%s", e2) : 0;
    uint64_t *st = dp_calloc((size_t)s->n_workers, sizeof *st);
    int n = 0, bad = 0;
    for (char *p = v; *p && !bad; n++) {
        char *end = NULL;
        errno = 0;
        unsigned long long x = strtoull(p, &end, 10);
        bad = errno || end == p || (*end && *end != ',') || n >= s->n_workers;
        if (!bad) st[n] = x;
        p = *end ? end + 1 : end;
    }
    free(v);
    if (!bad && n == s->n_workers) memcpy(into, st, (size_t)n * sizeof *st);
    free(st);
    if (bad || n != s->n_workers)
        return dp_err(err, "%s: checkpoint's %s is not %d steps (was --workers changed?)", path,
                      key, s->n_workers);
    return 0;
}

/* Both back; a file without "worker_steps_seen" handled what it applied. */
static int s_steps_restore(dp_shard_t *s, const char *path, char *err)
{
    if (!s->worker_step) return 0;
    if (s_steps_read(s, path, "worker_steps", s->worker_step, err) != 0 ||
        s_steps_read(s, path, "worker_steps_seen", s->worker_seen, err) != 0)
        return -1;
    for (int i = 0; i < s->n_workers; i++)
        if (s->worker_seen[i] < s->worker_step[i]) s->worker_seen[i] = s->worker_step[i];
    return 0;
}

/* ---- shard 0's dealer: metadata "deal" (its text) and tensor
 * "deal.count" (the times each batch was trained, as floats) ------------ */

static float *s_deal_counts(const dp_deal_t *d)
{
    float *c = dp_malloc((size_t)d->total * sizeof *c);
    for (uint64_t g = 0; g < d->total; g++) c[g] = d->count[g];
    return c;
}

/* The file's dealer into d; a file without one (a fresh start's version 0
 * before any HELLO, or written by a fixed crew) leaves d as it is. */
static int s_deal_restore(dp_deal_t *d, const char *path, char *err)
{
    char e2[DP_ERR_LEN] = "";
    char *text = dp_safetensors_read_meta(path, "deal", e2);
    if (!text) return e2[0] ? dp_err(err, "%s", e2) : 0;
    uint64_t total = 0;
    float *c = NULL;
    unsigned char *count = NULL;
    int rc = dp_deal_saved_total(text, &total, e2);
    if (rc == 0) {
        c = dp_malloc((size_t)total * sizeof *c);
        count = dp_malloc((size_t)total);
        rc = dp_safetensors_read_tensor(path, "deal.count", c, (size_t)total, e2);
    }
    for (uint64_t g = 0; rc == 0 && g < total; g++) {
        if (!(c[g] >= 0 && c[g] <= 255 && c[g] == (float)(int)c[g]))
            rc = dp_err(e2, "deal.count[%" PRIu64 "] is not a count", g);
        else count[g] = (unsigned char)c[g];
    }
    if (rc == 0) rc = dp_deal_restore(d, text, count, total, e2);
    if (rc != 0) dp_err(err, "%s: corrupt shard checkpoint: %s", path, e2);
    free(text);
    free(c);
    free(count);
    return rc;
}

/* ---- the rows' file ------------------------------------------------------ */

/* path's name without ".safetensors" (the shard's file, for its rows files'
 * names): its length in path. */
static size_t s_stem(const char *path)
{
    size_t n = strlen(path), ext = strlen(".safetensors");
    return n > ext && strcmp(path + n - ext, ".safetensors") == 0 ? n - ext : n;
}

/* The rows file of version v beside the shard file path. */
static void s_rows_path(char *out, size_t n, const char *path, uint64_t v)
{
    snprintf(out, n, "%.*s.rows-%" PRIu64, (int)s_stem(path), path, v);
}

/* Remove the rows files beside path but keep (a name without directory;
 * NULL: all of them). */
static void s_rows_prune(const char *path, const char *keep)
{
    char dir[PATH_MAX], prefix[PATH_MAX];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    const char *base = slash ? slash + 1 : path;
    snprintf(prefix, sizeof prefix, "%.*s.rows-", (int)(s_stem(base)), base);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && (!keep || strcmp(e->d_name, keep) != 0)) {
            char full[PATH_MAX * 2];
            snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
            unlink(full);
        }
    closedir(d);
}

/* The shard's rows to their file of version v; its name (no directory)
 * into name. 0, or -1 with err. */
static int s_rows_write(const dp_ps_rows_t *r, const char *path, uint64_t v, char *name,
                        size_t n, char *err)
{
    size_t len;
    uint8_t *buf = dp_ps_rows_save(r, &len);
    char full[PATH_MAX];
    s_rows_path(full, sizeof full, path, v);
    const char *slash = strrchr(full, '/');
    snprintf(name, n, "%s", slash ? slash + 1 : full);
    int rc = dp_write_file_atomic(full, buf, len, err);
    free(buf);
    return rc;
}

/* The rows the file's metadata names, into r. A file without rows (written
 * before the table had any, or by an older build) leaves r empty, said. */
static int s_rows_restore(dp_ps_rows_t *r, const dp_shard_t *s, const char *path, char *err)
{
    char e2[DP_ERR_LEN] = "";
    char *name = dp_safetensors_read_meta(path, "rows_file", e2);
    if (!name) {
        if (e2[0]) return dp_err(err, "%s", e2);
        dp_log_info("shard %d: %s holds no rows: the row table starts empty", s->index, path);
        return 0;
    }
    char full[PATH_MAX * 2];
    const char *slash = strrchr(path, '/');
    snprintf(full, sizeof full, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path, name);
    int rc = -1;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (strchr(name, '/') || !name[0])
        dp_err(err, "%s: corrupt shard checkpoint: rows_file '%.80s'", path, name);
    else if (dp_read_file(full, &buf, &len, e2) != 0)
        dp_err(err, "%s: its rows: %s", path, e2);
    else if (dp_ps_rows_load(r, buf, len, e2) != 0)
        dp_err(err, "%s: %s", full, e2);
    else
        rc = 0;
    free(buf);
    free(name);
    return rc;
}

/* CRC-32 of n floats as 8 hex digits. */
static void s_crc_hex(char out[16], const float *x, size_t n)
{
    snprintf(out, 16, "%08x", (unsigned)dp_crc32(0, x, n * sizeof(float)));
}

int dp_shard_checkpoint_write(const dp_shard_t *s, const char *path, const dp_ckpt_run_t *run,
                              char *err)
{
    int64_t pshape[1] = {(int64_t)s->n};
    int64_t sshape[2] = {s->state_per, (int64_t)s->n};
    dp_shard_device_state(s); /* --device: the state's host copy brought up to date */
    dp_st_tensor_t t[4] = {{"params", s->w, 1, pshape}, {"optim.state", s->state, 2, sshape}};
    int n_t = s->state_per ? 2 : 1;
    const float *ms = s->dc ? s->dc->ms : NULL; /* DC-ASGD-a's mean square */
    if (ms) t[n_t++] = (dp_st_tensor_t){"dc.ms", (float *)ms, 1, pshape};
    char *deal = run && run->deal ? dp_deal_save(run->deal) : NULL;
    int64_t dshape[1] = {deal ? (int64_t)run->deal->total : 0};
    float *counts = deal ? s_deal_counts(run->deal) : NULL;
    if (deal) t[n_t++] = (dp_st_tensor_t){"deal.count", counts, 1, dshape};
    char ver[32], lo[32], hi[32], nf[32], fp[32], shard[32], input[48], pcrc[16], scrc[16], mcrc[16];
    snprintf(ver, sizeof ver, "%" PRIu64, s->version);
    snprintf(lo, sizeof lo, "%zu", s->lo);
    snprintf(hi, sizeof hi, "%zu", s->hi);
    snprintf(nf, sizeof nf, "%zu", s->model.n_floats);
    snprintf(fp, sizeof fp, "%016" PRIx64, s->model.fingerprint);
    snprintf(shard, sizeof shard, "%d/%d", s->index, s->count);
    snprintf(input, sizeof input, "%dx%dx%d", s->model.in_c, s->model.in_h, s->model.in_w);
    s_crc_hex(pcrc, s->w, s->n);
    s_crc_hex(scrc, s->state, s->n * (size_t)s->state_per);
    const char *meta[] = {"format", "downpour-ps-shard", "spec", s->model.spec, "input", input,
                          "fingerprint", fp, "shard", shard, "range_lo", lo, "range_hi", hi,
                          "n_floats", nf, "optimizer", dp_optim_kind_name(s->optim.kind),
                          "version", ver, "step", ver, "params_crc32", pcrc,
                          "state_crc32", scrc, "run_id", run ? run->id : "",
                          "finished", run && run->finished ? "1" : "0", NULL, NULL, NULL, NULL,
                          NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    char *steps = s_steps_meta(s, s->worker_step), *seen = s_steps_meta(s, s->worker_seen);
    size_t k = sizeof meta / sizeof meta[0] - 11; /* the ten spare slots before the final NULL */
    char rows[PATH_MAX] = "";
    if (run && run->rows && run->rows->table) {
        if (s_rows_write(run->rows, path, s->version, rows, sizeof rows, err) != 0) {
            free(steps), free(seen), free(deal), free(counts);
            return -1;
        }
        meta[k++] = "rows_file";
        meta[k++] = rows;
    }
    if (deal) {
        meta[k++] = "deal";
        meta[k++] = deal;
    }
    if (ms) {
        s_crc_hex(mcrc, ms, s->n);
        meta[k++] = "dc_ms_crc32";
        meta[k++] = mcrc;
    }
    if (steps) {
        meta[k] = "worker_steps";
        meta[k + 1] = steps;
        meta[k + 2] = "worker_steps_seen";
        meta[k + 3] = seen;
    }
    int rc = dp_safetensors_write(path, t, n_t, meta, err);
    if (rc == 0 && rows[0]) s_rows_prune(path, rows); /* the older versions' */
    free(steps);
    free(seen);
    free(deal);
    free(counts);
    return rc;
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

/* The directory part of path, for messages about the directory. */
static void s_dir_of(char *out, size_t n, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

/* May run restore this file? The same run restarted may; another run or a
 * finished one only with resume (then run->id becomes the file's). */
static int s_check_run(const char *path, dp_ckpt_run_t *run, char *err)
{
    if (!run) return 0;
    char e2[DP_ERR_LEN] = "", dir[160];
    char *id = dp_safetensors_read_meta(path, "run_id", e2);
    if (!id && e2[0]) return dp_err(err, "%s", e2);
    char *fin = dp_safetensors_read_meta(path, "finished", e2);
    int finished = fin && strcmp(fin, "1") == 0;
    free(fin);
    s_dir_of(dir, sizeof dir, path);
    int rc = 0;
    if (run->resume) {
        if (id && id[0]) snprintf(run->id, sizeof run->id, "%s", id);
    } else if (!id || strcmp(id, run->id) != 0) {
        rc = dp_err(err, "%s holds run %.60s, not this run %.60s; use another --checkpoint-dir or "
                    "--resume to continue it", dir, id && id[0] ? id : "(unnamed)", run->id);
    } else if (finished) {
        rc = dp_err(err, "%s holds the finished run %.60s; use another --checkpoint-dir or "
                    "--resume to continue it", dir, id);
    }
    free(id);
    return rc;
}

/* The floats read match the CRC the writer recorded under key. */
static int s_check_crc(const char *path, const char *key, const float *x, size_t n, char *err)
{
    char want[16], e2[DP_ERR_LEN] = "";
    s_crc_hex(want, x, n);
    char *v = dp_safetensors_read_meta(path, key, e2);
    if (!v) return dp_err(err, "%s: corrupt shard checkpoint: %s", path, e2[0] ? e2 : key);
    int same = strcmp(v, want) == 0;
    if (!same)
        dp_err(err, "%s: corrupt shard checkpoint: %s says %s, the data has %s", path, key, v, want);
    free(v);
    return same ? 0 : -1;
}

/* DC-ASGD-a's MS into ms (n floats), checked against its CRC; a file
 * without it (written without adaptive compensation, restored with
 * --resume) leaves ms zero, as a fresh start has it. */
static int s_dc_read(const dp_shard_t *s, const char *path, float *ms, char *err)
{
    char e2[DP_ERR_LEN] = "";
    char *crc = dp_safetensors_read_meta(path, "dc_ms_crc32", e2);
    if (!crc) {
        if (e2[0]) return dp_err(err, "%s", e2);
        dp_log_info("shard %d: %s holds no delay-compensation mean square: it starts from 0",
                    s->index, path);
        return 0;
    }
    free(crc);
    if (dp_safetensors_read_tensor(path, "dc.ms", ms, s->n, err) != 0) return -1;
    return s_check_crc(path, "dc_ms_crc32", ms, s->n, err);
}

dp_ckpt_restore_t dp_shard_checkpoint_restore(dp_shard_t *s, const char *path, dp_ckpt_run_t *run,
                                              char *err)
{
    if (access(path, F_OK) != 0) return DP_CKPT_NONE;
    uint64_t ver = 0;
    if (s_check_meta(s, path, &ver, err) != 0 || s_check_run(path, run, err) != 0)
        return DP_CKPT_BAD;
    size_t n_state = s->n * (size_t)s->state_per;
    float *w = dp_malloc(s->n * sizeof(float) + 1);
    float *st = dp_calloc(n_state + 1, sizeof(float));
    float *ms = s->dc && s->dc->ms ? dp_calloc(s->n + 1, sizeof(float)) : NULL;
    dp_ckpt_restore_t rc = DP_CKPT_BAD;
    if (dp_safetensors_read_tensor(path, "params", w, s->n, err) != 0) goto done;
    if (s->state_per && dp_safetensors_read_tensor(path, "optim.state", st, n_state, err) != 0)
        goto done;
    if (s_check_crc(path, "params_crc32", w, s->n, err) != 0 ||
        s_check_crc(path, "state_crc32", st, n_state, err) != 0)
        goto done;
    for (size_t i = 0; i < s->n; i++)
        if (!isfinite(w[i])) {
            dp_err(err, "%s: corrupt shard checkpoint: parameter %zu is not finite", path, i);
            goto done;
        }
    if (ms && s_dc_read(s, path, ms, err) != 0) goto done;
    if (run && run->deal && s_deal_restore(run->deal, path, err) != 0) goto done;
    if (s_steps_restore(s, path, err) != 0) goto done; /* changes s only on success */
    if (run && run->rows && run->rows->table && s_rows_restore(run->rows, s, path, err) != 0)
        goto done; /* the last: changes the rows only on success */
    memcpy(s->w, w, s->n * sizeof(float));
    if (s->state_per) memcpy(s->state, st, n_state * sizeof(float));
    if (ms) memcpy(s->dc->ms, ms, s->n * sizeof(float));
    dp_shard_device_reload(s); /* --device: both copied up */
    s->version = ver;
    rc = DP_CKPT_RESTORED;
done:
    free(w);
    free(st);
    free(ms);
    return rc;
}
