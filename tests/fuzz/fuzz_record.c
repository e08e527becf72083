/* fuzz_record: bytes from a fuzzer, as a file, into the record loader
 * (dp_rec_load, server/core/record.h), the reader `downpour replay FILE` starts
 * with, then the header's optimizer (dp_record_optim_parse), which replay
 * reads next.
 *
 * Input layout: byte 0's low bit picks how the rest becomes the file:
 *   0: the file as it is (footer, hash and all);
 *   1: the lines before the footer: a footer with their true event count and
 *      FNV-1a hash is appended here, so mutated records get past the hash
 *      and into everything the loader does with a record it believes whole.
 * Whatever the bytes, the loader returns an error naming the file (leaving
 * an empty record, safe to free again, as replay does) or a record whose
 * events are what the format allows: pushes with a known status, shard and
 * worker within bounds; member strings of L / F / G only; the header an
 * object of version 1. A footer the harness made counts the events: the
 * loader must hold exactly that many.
 *
 * `make fuzz` builds it with libFuzzer (see tests/fuzz/fuzz.h); built with
 * gcc, main() replays tests/fuzz/corpus/record/ and mutations of it, and
 * `fuzz_record --write-seeds DIR` writes that corpus with the project's own
 * record writer. */
#include <inttypes.h>
#include <math.h>

#include "server/core/record.h"
#include "tests/fuzz/fuzz.h"

#define S_NAME "fuzz_record"

static void s_want(int ok, const char *what)
{
    if (!ok) fz_violation(S_NAME, what);
}

static void s_check(const dp_rec_t *rec, long want_events)
{
    s_want(cJSON_IsObject(rec->header) && dp_record_num(rec->header, "downpour_record", 0) == DP_RECORD_VERSION,
           "accepted a header that is not a version-1 object");
    s_want(want_events < 0 || rec->n == (size_t)want_events, "the event count is not the footer's");
    for (size_t i = 0; i < rec->n; i++) {
        const dp_rec_event_t *e = &rec->ev[i];
        s_want(e->shard >= 0 && e->shard <= 1 << 20, "an event's shard out of range");
        if (e->kind == DP_REC_PUSH) {
            s_want(e->status == DP_PUSH_APPLIED || e->status == DP_PUSH_DROPPED || e->status == DP_PUSH_REJECTED,
                   "a push with an unknown status");
            s_want(e->worker >= 0 && e->worker <= 1 << 20, "a push's worker out of range");
            s_want(e->members == NULL, "a push with members");
            s_want(!e->dealt || (e->batch.epoch <= (1ull << 53) && e->batch.index <= (1ull << 53)),
                   "a dealt batch (be, bi) past what a record's number holds");
        } else if (e->kind == DP_REC_MEMBERS) {
            s_want(e->members != NULL, "a members event without members");
            if (e->members)
                for (const char *c = e->members; *c; c++)
                    if (*c != 'L' && *c != 'F' && *c != 'G' && *c != 'X') {
                        s_want(0, "a member state other than L, F, G, X");
                        break;
                    }
            s_want(e->call == 0 || e->call == 1, "a members event's call not 0 or 1");
        } else if (e->kind == DP_REC_ROWS || e->kind == DP_REC_ROWS_PULL) {
            s_want(e->worker >= 0 && e->worker <= 1 << 20, "a row event's worker out of range");
            s_want(e->members == NULL, "a row event with members");
            s_want(e->keys <= (1ull << 53) && e->version <= (1ull << 53), "a row event's n or v past 2^53");
            s_want(e->grad_norm == -1 || (e->grad_norm >= 0 && isfinite(e->grad_norm)),
                   "a row push's norm neither absent nor finite and >= 0");
            s_want(e->kind == DP_REC_ROWS_PULL || e->status == DP_PUSH_APPLIED ||
                   e->status == DP_PUSH_DROPPED || e->status == DP_PUSH_REJECTED,
                   "a row push with an unknown status");
        } else {
            s_want(0, "an event of unknown kind");
        }
    }
    /* The row table's conf, refused with a 'record header: ' line or whole. */
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(rec->header, "rows");
    if (rows) {
        dp_rows_conf_t rc;
        dp_mode_t mode;
        char err[DP_ERR_LEN] = "";
        if (dp_record_rows_parse(rows, &rc, &mode, err) == 0)
            s_want(rc.width >= 1 && rc.width <= DP_ROWS_MAX_WIDTH && rc.optim.kind < DP_ROW_OPTIM_KINDS,
                   "a row conf of bad width or optimizer");
        else
            s_want(strncmp(err, "record header: ", 15) == 0, "a rows error that is not 'record header: '");
    }
    /* What replay reads next: the optimizer, refused or whole. */
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(rec->header, "optim");
    if (o) {
        dp_optim_conf_t conf;
        char err[DP_ERR_LEN] = "";
        if (dp_record_optim_parse(o, &conf, err) == 0) {
            s_want(conf.kind >= 0 && conf.kind < DP_OPT_KINDS, "an optimizer of unknown kind");
            s_want(conf.schedule == DP_LR_CONSTANT || conf.schedule == DP_LR_STEP || conf.schedule == DP_LR_COSINE,
                   "an unknown lr schedule");
            float lr = dp_optim_lr_at(&conf, 1000);
            (void)lr; /* any float: what is checked is that computing it is defined */
        } else {
            s_want(strncmp(err, "record header: ", 15) == 0, "an optimizer error that is not 'record header: '");
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int fix = data[0] & 1;
    data++, size--;
    uint8_t *file = dp_malloc(size + 128);
    memcpy(file, data, size);
    size_t len = size;
    long want = -1;
    if (fix) {
        if (len && file[len - 1] != '\n') file[len++] = '\n';
        long lines = 0;
        for (size_t i = 0; i < len; i++) lines += file[i] == '\n';
        want = lines > 0 ? lines - 1 : 0;
        char foot[128];
        int n = snprintf(foot, sizeof foot, "{\"end\":\"downpour_record\",\"events\":%ld,\"fnv1a\":\"%016" PRIx64 "\"}\n",
                         want, dp_fnv1a(DP_FNV_SEED, file, len));
        memcpy(file + len, foot, (size_t)n);
        len += (size_t)n;
        if (lines < 1) want = -1; /* no header line: must be refused anyway */
    }
    const char *path = fz_file(file, len);
    free(file);
    dp_rec_t rec;
    char err[DP_ERR_LEN] = "";
    if (dp_rec_load(&rec, path, err) == 0) {
        fz_accepted++;
        s_check(&rec, want);
    } else {
        s_want(strncmp(err, path, strlen(path)) == 0, "an error that does not name the file");
        s_want(rec.header == NULL && rec.ev == NULL && rec.n == 0, "a refused record is not left empty");
    }
    dp_rec_fini(&rec); /* replay frees it whatever happened: twice after a refusal */
    return 0;
}

#ifndef DP_LIBFUZZER
/* PATH's record as seeds DIR/NAME-whole (mode 0) and, without its footer,
 * DIR/NAME-footerless (mode 1); PATH removed. */
static int s_seed_pair(const char *dir, const char *path, const char *name, char *err)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    char out[1024];
    if (dp_read_file(path, &buf, &len, err) != 0) return -1;
    unlink(path);
    uint8_t *seed = dp_malloc(len + 1);
    memcpy(seed + 1, buf, len);
    seed[0] = 0;
    snprintf(out, sizeof out, "%s/%s-whole", dir, name);
    int rc = dp_write_file_atomic(out, seed, len + 1, err);
    size_t body = len - 1; /* the footer is the last line */
    while (body > 0 && buf[body - 1] != '\n') body--;
    seed[0] = 1;
    snprintf(out, sizeof out, "%s/%s-footerless", dir, name);
    if (rc == 0) rc = dp_write_file_atomic(out, seed, body + 1, err);
    free(seed);
    free(buf);
    return rc;
}

/* A sparse model's record: the header's "rows", row pulls and pushes
 * (applied, dropped, rejected) between the dense pushes. */
static int s_write_rows_seeds(const char *dir, char *err)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/record.tmp-rows", dir);
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "model", "embed:4 fc:2 softmax");
    cJSON_AddStringToObject(h, "input", "1x1x1");
    cJSON_AddNumberToObject(h, "workers", 2);
    cJSON_AddNumberToObject(h, "shards", 1);
    cJSON_AddStringToObject(h, "mode", "sync");
    dp_rows_conf_t rc;
    dp_rows_conf_default(&rc, 4, DP_ROW_ADAGRAD);
    rc.init = DP_ROWS_INIT_UNIFORM;
    rc.init_scale = 0.01f;
    rc.seed = 18446744073709551615ull;
    cJSON_AddItemToObject(h, "rows", dp_record_rows_json(&rc, DP_MODE_ASYNC));
    dp_record_t *w = NULL;
    int rc2 = dp_record_new(&w, path, h, err);
    cJSON_Delete(h);
    if (rc2 != 0) return -1;
    float g[8] = {0.5f, -0.25f, 1, 2, 0, 0, 3, -1};
    for (int i = 0; i < 4; i++) {
        int wk = i % 2;
        dp_record_rows_pull(w, 0, wk, (uint64_t)i / 2, 2);
        dp_push_outcome_t ro = {.status = i == 3 ? DP_PUSH_DROPPED : DP_PUSH_APPLIED, .staleness = (uint64_t)wk};
        dp_record_rows_push(w, 0, wk, (uint64_t)i / 2 + 1, (uint64_t)i / 2, &ro, 2, g, 4);
        dp_push_outcome_t o = {.status = DP_PUSH_APPLIED, .lr = 0.0015, .grad_norm = 1.5, .update_norm = 0.5};
        dp_record_push(w, 0, wk, (uint64_t)i / 2 + 1, (uint64_t)i / 2, &o, (uint64_t)i / 2 + 1, NULL, NULL);
    }
    dp_record_rows_push(w, 0, 1, 3, 9, &(dp_push_outcome_t){.status = DP_PUSH_REJECTED}, 1, NULL, 4);
    if (dp_record_close(&w, err) != 0) return -1;
    return s_seed_pair(dir, path, "rows", err);
}

/* The corpus: a record from the project's writer, whole (mode 0) and
 * without its footer (mode 1); a sparse model's the same way. */
static int s_write_seeds(const char *dir)
{
    char path[1024], err[DP_ERR_LEN];
    snprintf(path, sizeof path, "%s/record.tmp-seed", dir);
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "model", "fc:10 softmax");
    cJSON_AddStringToObject(h, "input", "1x28x28");
    cJSON_AddStringToObject(h, "seed", "1");
    cJSON_AddNumberToObject(h, "workers", 2);
    cJSON_AddNumberToObject(h, "shards", 1);
    cJSON_AddNumberToObject(h, "shard", 0);
    cJSON_AddStringToObject(h, "mode", "async");
    dp_optim_conf_t oc;
    dp_optim_conf_default(&oc);
    oc.schedule = DP_LR_STEP;
    oc.step_size = 100;
    oc.gamma = 0.5f;
    cJSON_AddItemToObject(h, "optim", dp_record_optim_json(&oc));
    cJSON_AddNumberToObject(h, "start_version", 0);
    dp_record_t *w = NULL;
    if (dp_record_new(&w, path, h, err) != 0) goto fail;
    cJSON_Delete(h);
    dp_members_t m;
    dp_members_init(&m, 2, 0, 0, 0.0);
    dp_record_members(w, 0, &m);
    for (int i = 0; i < 4; i++) {
        dp_push_outcome_t o = {.status = i == 3 ? DP_PUSH_DROPPED : DP_PUSH_APPLIED, .staleness = (uint64_t)(i % 2),
                               .lr = 0.0015, .grad_norm = 1.25 + i, .update_norm = 0.01 * i};
        dp_record_push(w, 0, i % 2, (uint64_t)i / 2 + 1, (uint64_t)i, &o, (uint64_t)i + 1, &m, NULL);
    }
    m.w[1].finished = 1;
    dp_record_push(w, 0, 0, 3, 4, &(dp_push_outcome_t){.status = DP_PUSH_REJECTED}, 4, &m, NULL);
    if (dp_record_close(&w, err) != 0) goto fail;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dp_read_file(path, &buf, &len, err) != 0) goto fail;
    unlink(path);
    uint8_t *seed = dp_malloc(len + 1);
    memcpy(seed + 1, buf, len);
    seed[0] = 0;
    snprintf(path, sizeof path, "%s/ok-whole", dir);
    if (dp_write_file_atomic(path, seed, len + 1, err) != 0) goto fail;
    size_t body = len - 1; /* the footer is the last line */
    while (body > 0 && buf[body - 1] != '\n') body--;
    seed[0] = 1;
    snprintf(path, sizeof path, "%s/ok-footerless", dir);
    if (dp_write_file_atomic(path, seed, body + 1, err) != 0) goto fail;
    free(seed);
    free(buf);
    dp_members_fini(&m);
    if (s_write_rows_seeds(dir, err) != 0) goto fail;
    return 0;
fail:
    fprintf(stderr, "%s: %s\n", S_NAME, err);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return s_write_seeds(argv[2]);
    return fz_main(argc, argv, "record", 10000);
}
#endif
