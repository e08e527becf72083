/* fuzz_safetensors: bytes from a fuzzer, as a file, into the safetensors
 * reader (common/safetensors.h): the checkpoints `downpour eval` and a
 * restarting server read, which may come from anywhere.
 *
 * The input is the whole file. The reader validates the header when it
 * opens a file; whatever the bytes, each entry point returns an error naming
 * the file or a result that holds:
 *   - a header it accepts has names that are unique, every tensor of a known
 *     dtype whose byte range lies inside the data section, spans exactly its
 *     shape times its dtype's size, and overlaps no other tensor's range
 *     (checked here from the JSON, independently of the reader's own check);
 *   - reading any F32 tensor of such a header with its element count gives
 *     exactly the file's bytes; a wrong count is refused and the buffer is
 *     left as it was;
 *   - dp_checkpoint_load into a small fixed model either fills every
 *     parameter with its tensor's bytes or fails leaving the parameters,
 *     step and version untouched;
 *   - dp_safetensors_read_rows (a sparse model's row table, D = 2) either
 *     returns keys strictly ascending and finite rows of a header it
 *     accepted, or fails naming the file with its outputs untouched.
 *
 * `make fuzz` builds it with libFuzzer (see tests/fuzz/fuzz.h); built with
 * gcc, main() replays tests/fuzz/corpus/safetensors/ and mutations of it,
 * and `fuzz_safetensors --write-seeds DIR` writes that corpus with the
 * project's own writer. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>

#include "common/safetensors.h"
#include "tests/fuzz/fuzz.h"

#define S_NAME "fuzz_safetensors"
/* The checkpoint every input is also loaded as: 47 floats. */
#define S_SPEC "conv3x3:2 relu maxpool2 fc:3 softmax"
#define S_IN 1, 4, 4
#define S_MAX_READ (1u << 16) /* floats read per tensor, at most */

static void s_want(int ok, const char *what)
{
    if (!ok) fz_violation(S_NAME, what);
}

typedef struct {
    uint64_t begin, end;
} s_range_t;

static int s_range_cmp(const void *a, const void *b)
{
    const s_range_t *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int s_dsize(const char *t)
{
    static const char *names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8",
                                  "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
    static const int sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(names[i], t) == 0) return sizes[i];
    return 0;
}

/* A non-negative whole JSON number below 2^53 (what a header may hold). */
static int s_uint(const cJSON *j, uint64_t *v)
{
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0 && j->valuedouble <= 9007199254740992.0) ||
        j->valuedouble != (double)(uint64_t)j->valuedouble)
        return 0;
    *v = (uint64_t)j->valuedouble;
    return 1;
}

/* The reader accepted path: what its header says must hold, and the
 * tensors must read back as the file's bytes. */
static void s_check_accepted(const char *path, const uint8_t *data, size_t size)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | data[i];
    s_want(size >= 8 && n <= size - 8, "accepted a header longer than the file");
    if (size < 8 || n > size - 8) return;
    uint64_t data_len = size - 8 - n;
    const uint8_t *body = data + 8 + n;
    cJSON *root = cJSON_ParseWithLength((const char *)data + 8, (size_t)n);
    s_want(cJSON_IsObject(root), "accepted a header that is not a JSON object");
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return;
    }
    int cap = cJSON_GetArraySize(root), nr = 0;
    s_range_t *rs = dp_malloc((size_t)(cap ? cap : 1) * sizeof *rs);
    const cJSON *e;
    char err[DP_ERR_LEN];
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        int dsize = cJSON_IsString(dt) ? s_dsize(dt->valuestring) : 0;
        s_range_t r = {0, 0};
        int ok = dsize && cJSON_IsArray(sh) && cJSON_GetArraySize(off) == 2 &&
                 s_uint(off->child, &r.begin) && s_uint(off->child->next, &r.end);
        s_want(ok, "accepted a tensor without a known dtype, a shape and two offsets");
        if (!ok) continue;
        unsigned __int128 count = 1;
        uint64_t v = 0;
        const cJSON *d;
        int good = 1;
        cJSON_ArrayForEach(d, sh)
        {
            if (!s_uint(d, &v)) good = 0;
            count *= v;
            if (count > ((unsigned __int128)1 << 64)) count = (unsigned __int128)1 << 64; /* stays too big */
        }
        s_want(good, "accepted a bad shape entry");
        s_want(r.begin <= r.end && r.end <= data_len, "accepted a tensor outside the data section");
        s_want((unsigned __int128)(r.end - r.begin) == count * (unsigned)dsize,
               "accepted a tensor whose range is not its shape times its dtype");
        if (!good || r.begin > r.end || r.end > data_len) continue;
        rs[nr++] = r;
        /* The same name twice: which one a lookup sees is undefined. */
        for (const cJSON *p = root->child; p != e; p = p->next)
            s_want(strcmp(p->string, e->string) != 0, "accepted a header naming a tensor twice");
        if (strcmp(dt->valuestring, "F32") != 0 || count > S_MAX_READ) continue;
        size_t cnt = (size_t)count;
        float *got = dp_malloc((cnt + 1) * sizeof(float));
        memset(got, 0x5a, (cnt + 1) * sizeof(float));
        if (dp_safetensors_read_tensor(path, e->string, got, cnt, err) != 0) {
            s_want(0, "an accepted F32 tensor does not read");
        } else {
            s_want(cnt == 0 || memcmp(got, body + r.begin, cnt * sizeof(float)) == 0,
                   "a tensor read is not the file's bytes");
            uint8_t canary[4];
            memset(canary, 0x5a, 4);
            s_want(memcmp(got + cnt, canary, 4) == 0, "a tensor read wrote past its count");
        }
        memset(got, 0x5a, (cnt + 1) * sizeof(float));
        if (dp_safetensors_read_tensor(path, e->string, got, cnt + 1, err) == 0) {
            s_want(0, "a tensor read with the wrong count succeeded");
        } else {
            for (size_t i = 0; i < (cnt + 1) * sizeof(float); i++)
                if (((uint8_t *)got)[i] != 0x5a) {
                    s_want(0, "a refused tensor read changed the buffer");
                    break;
                }
        }
        free(got);
    }
    /* No two tensors share a byte (empty ones hold none). */
    qsort(rs, (size_t)nr, sizeof *rs, s_range_cmp);
    uint64_t reach = 0;
    for (int i = 0; i < nr; i++) {
        if (rs[i].begin == rs[i].end) continue;
        s_want(rs[i].begin >= reach, "accepted tensors whose byte ranges overlap");
        if (rs[i].end > reach) reach = rs[i].end;
    }
    free(rs);
    cJSON_Delete(root);
}

/* Load as the fixed model's checkpoint: all or nothing. */
static void s_check_load(const char *path, int header_ok)
{
    static dp_model_t m;
    static int parsed;
    char err[DP_ERR_LEN];
    if (!parsed && (dp_model_parse(&m, S_SPEC, S_IN, err) != 0 || m.n_floats > 64)) abort();
    parsed = 1;
    float params[64];
    long step = -7, version = -7;
    memset(params, 0x5a, sizeof params);
    if (dp_checkpoint_load(path, &m, params, &step, &version, err) != 0) {
        for (size_t i = 0; i < sizeof params; i++)
            if (((uint8_t *)params)[i] != 0x5a) {
                s_want(0, "a refused checkpoint load changed the parameters");
                break;
            }
        s_want(step == -7 && version == -7, "a refused checkpoint load changed step or version");
        s_want(strncmp(err, path, strlen(path)) == 0, "a checkpoint error that does not name the file");
        return;
    }
    s_want(header_ok, "a checkpoint loaded from a file whose header was refused");
    for (size_t i = m.n_floats * sizeof(float); i < sizeof params; i++)
        if (((uint8_t *)params)[i] != 0x5a) {
            s_want(0, "a checkpoint load wrote past n_floats");
            break;
        }
    /* Each parameter holds its tensor, as a lookup by name reads it. */
    for (int i = 0; i < m.n_params; i++) {
        const dp_param_t *p = &m.params[i];
        float t[64];
        s_want(dp_safetensors_read_tensor(path, p->name, t, p->count, err) == 0 &&
                   memcmp(t, params + p->offset, p->count * sizeof(float)) == 0,
               "a loaded parameter is not its tensor");
    }
}

/* Read as a row table of width 2: all or nothing, keys ascending. */
static void s_check_rows(const char *path, int header_ok)
{
    char err[DP_ERR_LEN];
    uint64_t sentinel_k, *keys = &sentinel_k;
    float sentinel_w, *rows = &sentinel_w;
    size_t n = 7;
    if (dp_safetensors_read_rows(path, 2, &keys, &rows, &n, err) != 0) {
        s_want(keys == &sentinel_k && rows == &sentinel_w && n == 7,
               "a refused row table changed its outputs");
        s_want(strncmp(err, path, strlen(path)) == 0, "a row table error that does not name the file");
        return;
    }
    s_want(header_ok, "a row table read from a file whose header was refused");
    s_want(n == 0 ? !keys && !rows : keys && rows, "a row table's buffers disagree with its count");
    for (size_t i = 1; i < n; i++) s_want(keys[i] > keys[i - 1], "a row table's keys not ascending");
    for (size_t i = 0; i < 2 * n; i++) s_want(isfinite(rows[i]), "a row table's value not finite");
    free(keys);
    free(rows);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fz_file(data, size);
    char err[DP_ERR_LEN] = "";
    char *spec = dp_safetensors_read_meta(path, "spec", err);
    int header_ok = spec || !err[0];
    if (header_ok) {
        fz_accepted++;
        s_check_accepted(path, data, size);
    } else {
        s_want(strncmp(err, path, strlen(path)) == 0, "an error that does not name the file");
    }
    free(spec);
    s_check_load(path, header_ok);
    s_check_rows(path, header_ok);
    return 0;
}

#ifndef DP_LIBFUZZER
/* The corpus: files from the project's own writer. */
static int s_write_seeds(const char *dir)
{
    dp_model_t m;
    char err[DP_ERR_LEN], path[1024];
    if (dp_model_parse(&m, S_SPEC, S_IN, err) != 0) return 1;
    float params[64];
    dp_model_init_params(&m, params, 7);
    snprintf(path, sizeof path, "%s/ok-checkpoint", dir);
    const char *extra[] = {"run_id", "fuzz", "worker_steps", "1,2,3", NULL};
    if (dp_checkpoint_save(path, &m, params, 12, 34, extra, err) != 0) goto fail;
    float a[6] = {1, 2, 3, 4, 5, 6}, s = 9;
    int64_t sh23[] = {2, 3}, sh0[] = {0, 4};
    dp_st_tensor_t t[] = {{"a", a, 2, sh23}, {"scalar", &s, 0, NULL}, {"empty", a, 2, sh0}};
    snprintf(path, sizeof path, "%s/ok-tensors", dir);
    if (dp_safetensors_write(path, t, 3, NULL, err) != 0) goto fail;
    const char *meta[] = {"format", "downpour", "version", "5", NULL};
    snprintf(path, sizeof path, "%s/ok-metadata", dir);
    if (dp_safetensors_write(path, NULL, 0, meta, err) != 0) goto fail;
    dp_model_t em; /* a sparse model's file: its dense layer and its rows */
    if (dp_model_parse(&em, "embed:2 fc:2 softmax", 1, 1, 1, err) != 0) goto fail;
    float ep[8] = {0.5f, -1, 2, 0.25f, 0, 1}, rows[6] = {1, -1, 0.5f, 0.25f, -2, 3};
    uint64_t keys[3] = {3, 17, 1ull << 63};
    snprintf(path, sizeof path, "%s/ok-rows", dir);
    if (em.n_floats > 8 || dp_checkpoint_save_rows(path, &em, ep, 1, 1, keys, rows, 3, NULL, err) != 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "%s: %s\n", S_NAME, err);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return s_write_seeds(argv[2]);
    return fz_main(argc, argv, "safetensors", 5000);
}
#endif
