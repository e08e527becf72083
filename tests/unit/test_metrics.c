/* test_metrics: JSON-lines metrics (every line parses, "t" first, NaN/Inf ->
 * null, strings escaped, rounding, disabled writer, periodic flush, threads),
 * the atomic summary file,
 * CRC-32C against published vectors, and TensorBoard event files read back
 * record by record with an independent decoder (and by `protoc --decode_raw`
 * and tensorboard itself when they are installed). */
#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/metrics.h"
#include "common/checksum.h"
#include "common/tbevents.h"
#include "common/util.h"
#include "tests/test.h"

static char s_dir[64];

/* A fresh temporary directory per test; removed with everything in it. */
static const char *s_tmpdir(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/dp_test_metrics.XXXXXX");
    if (!mkdtemp(s_dir)) {
        perror("mkdtemp");
        exit(2);
    }
    return s_dir;
}

static void s_rmtree(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "  cannot remove %s\n", dir);
}

/* Splits a file into lines; returns the count, lines point into *text. */
static int s_lines(const char *path, char **text, char **lines, int max)
{
    uint8_t *data = NULL;
    size_t len = 0;
    char err[DP_ERR_LEN];
    *text = NULL;
    if (dp_read_file(path, &data, &len, err) != 0) {
        fprintf(stderr, "  %s\n", err);
        return -1;
    }
    *text = (char *)data;
    int n = 0;
    char *p = *text;
    while (*p && n < max) {
        char *nl = strchr(p, '\n');
        if (!nl) {
            lines[n++] = p; /* a half line: callers check it is not there */
            break;
        }
        *nl = '\0';
        lines[n++] = p;
        p = nl + 1;
    }
    return n;
}

/* ---- JSON lines ------------------------------------------------------ */

/* One line {"t":..., key: v}. */
static void s_write_num(dp_metrics_t *m, const char *key, double v)
{
    cJSON *line = dp_metrics_line(m);
    cJSON_AddNumberToObject(line, key, v);
    dp_metrics_write(m, &line);
    CHECK(line == NULL);
}

static double s_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The line starts {"t":<10 digits>[.<1 to 3 digits>] and goes on. */
static int s_t_printed_to_ms(const char *line)
{
    if (strncmp(line, "{\"t\":", 5) != 0 || strspn(line + 5, "0123456789") != 10) return 0;
    const char *p = line + 15;
    if (*p == '.') {
        size_t d = strspn(p + 1, "0123456789");
        if (d < 1 || d > 3) return 0;
        p += 1 + d;
    }
    return *p == ',' || *p == '}';
}

static void test_jsonl_lines_parse(void)
{
    const char *dir = s_tmpdir();
    char path[256], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    dp_metrics_t *m = NULL;
    CHECK_EQ(dp_metrics_new(&m, path, err), 0);
    CHECK(m != NULL);
    double t0 = s_wall_now();

    cJSON *line = dp_metrics_line(m);
    CHECK(line != NULL);
    cJSON_AddNumberToObject(line, "step", 1);
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(0.41234511137008667, 6));
    cJSON_AddNumberToObject(line, "version", 300000000000.0); /* past INT_MAX */
    dp_metrics_write(m, &line);

    line = dp_metrics_line(m);
    cJSON_AddNumberToObject(line, "loss", NAN);
    cJSON_AddNumberToObject(line, "g", -INFINITY);
    cJSON_AddNumberToObject(line, "h", dp_metrics_round(INFINITY, 6));
    double two[2] = {NAN, 1.5};
    cJSON_AddItemToObject(line, "list", cJSON_CreateDoubleArray(two, 2));
    dp_metrics_write(m, &line);

    line = dp_metrics_line(m);
    cJSON_AddStringToObject(line, "note", "nan inf -inf stays \"text\"\n\\");
    dp_metrics_write(m, &line);

    line = dp_metrics_line(m); /* "t" alone */
    dp_metrics_write(m, &line);
    dp_metrics_destroy(&m);
    CHECK(m == NULL);
    dp_metrics_destroy(&m); /* safe twice */

    char *text, *lines[16];
    int n = s_lines(path, &text, lines, 16);
    CHECK_EQ(n, 4);
    /* Printed as expected: short numbers, integers without a point. */
    CHECK(n >= 1 && strstr(lines[0], "\"step\":1,\"loss\":0.412345,\"version\":300000000000}"));
    CHECK(n >= 2 && strstr(lines[1], "\"loss\":null,\"g\":null,\"h\":null,\"list\":[null,1.5]}"));
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_Parse(lines[i]);
        CHECK(o != NULL && cJSON_IsObject(o));
        if (!o) {
            fprintf(stderr, "  line %d does not parse: %s\n", i, lines[i]);
            continue;
        }
        /* "t" first: the wall-clock time, to the millisecond. */
        CHECK(o->child && strcmp(o->child->string, "t") == 0 && cJSON_IsNumber(o->child));
        double t = o->child ? o->child->valuedouble : 0;
        CHECK(t >= floor(t0 * 1000) / 1000 && t <= s_wall_now() + 0.001);
        CHECK(s_t_printed_to_ms(lines[i]));
        if (i == 2)
            CHECK_STR(cJSON_GetObjectItem(o, "note")->valuestring, "nan inf -inf stays \"text\"\n\\");
        if (i == 3) CHECK(o->child && o->child->next == NULL);
        cJSON_Delete(o);
    }
    free(text);
    s_rmtree(dir);
}

static void test_metrics_round(void)
{
    CHECK(dp_metrics_round(0.41234511137008667, 6) == 0.412345);
    CHECK(dp_metrics_round((double)0.0015f, 6) == 0.0015);
    CHECK(dp_metrics_round(2.3, 6) == 2.3);
    CHECK(dp_metrics_round(-12.34567, 4) == -12.35);
    CHECK(dp_metrics_round(123456789.0, 3) == 123000000.0);
    CHECK(dp_metrics_round(1.23456e-12, 3) == 1.23e-12);
    CHECK(dp_metrics_round(0, 6) == 0);
    CHECK(isnan(dp_metrics_round(NAN, 6)));
    CHECK(dp_metrics_round(-INFINITY, 6) == -INFINITY);
    /* As printed by cJSON: as short as printf's %g would make it. */
    cJSON *n = cJSON_CreateNumber(dp_metrics_round((double)0.9125f, 5));
    char *p = cJSON_PrintUnformatted(n);
    CHECK_STR(p, "0.9125");
    cJSON_free(p);
    cJSON_Delete(n);
}

static void test_jsonl_disabled_and_bad_path(void)
{
    char err[DP_ERR_LEN] = "";
    dp_metrics_t *m = NULL;
    CHECK_EQ(dp_metrics_new(&m, NULL, err), 0);
    CHECK(m != NULL);
    CHECK(dp_metrics_line(m) == NULL); /* nothing to build */
    /* A line from elsewhere given to a disabled writer is freed all the same
     * (valgrind / ASan would tell). */
    cJSON *line = cJSON_CreateObject();
    dp_metrics_write(m, &line);
    CHECK(line == NULL);
    dp_metrics_flush(m);
    dp_metrics_destroy(&m);
    CHECK(m == NULL);
    CHECK_EQ(dp_metrics_new(&m, "", err), 0);
    CHECK(dp_metrics_line(m) == NULL);
    dp_metrics_destroy(&m);
    CHECK(dp_metrics_line(NULL) == NULL); /* NULL is a disabled writer too */
    dp_metrics_write(NULL, &line);
    dp_metrics_write(NULL, NULL);
    dp_metrics_flush(NULL);

    /* A parent folder that cannot be made (a file is in the way: even root
     * cannot): error naming the path, nothing created. Missing folders that
     * can be made are (test_paths). */
    m = (dp_metrics_t *)&m;
    CHECK_EQ(dp_metrics_new(&m, "/dev/null/sub/m.jsonl", err), -1);
    CHECK(m == NULL);
    CHECK(strstr(err, "/dev/null/sub/m.jsonl") != NULL);
    CHECK(access("/dev/null/sub", F_OK) != 0);
}

static void test_jsonl_flushed_within_a_second(void)
{
    const char *dir = s_tmpdir();
    char path[256], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    dp_metrics_t *m = NULL;
    CHECK_EQ(dp_metrics_new(&m, path, err), 0);
    s_write_num(m, "step", 7);
    struct stat st;
    /* Buffered: nothing on disk straight away... */
    CHECK(stat(path, &st) == 0 && st.st_size == 0);
    /* ...and the flusher writes it within about a second, unasked. */
    usleep(1300 * 1000);
    CHECK(stat(path, &st) == 0 && st.st_size > 0);
    s_write_num(m, "step", 8);
    dp_metrics_flush(m);
    char *text, *lines[4];
    CHECK_EQ(s_lines(path, &text, lines, 4), 2);
    free(text);
    dp_metrics_destroy(&m);
    s_rmtree(dir);
}

/* --metrics appends: a second writer on the same file keeps the first's lines. */
static void test_jsonl_appends(void)
{
    const char *dir = s_tmpdir();
    char path[256], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    for (int run = 0; run < 2; run++) {
        dp_metrics_t *m = NULL;
        CHECK_EQ(dp_metrics_new(&m, path, err), 0);
        s_write_num(m, "run", run);
        dp_metrics_destroy(&m);
    }
    char *text, *lines[4];
    CHECK_EQ(s_lines(path, &text, lines, 4), 2);
    CHECK(strstr(lines[0], "\"run\":0") != NULL);
    CHECK(strstr(lines[1], "\"run\":1") != NULL);
    free(text);
    s_rmtree(dir);
}

/* The state a progress line shows is the last record, never an event:
 * a run's files end in events (the worker's staleness and eval, the
 * shard's leaves), which carry no step or applied count of their own. */
static void test_metrics_last_passes_events(void)
{
    const char *dir = s_tmpdir();
    char path[300];
    snprintf(path, sizeof path, "%s/w.jsonl", dir);
    CHECK(dp_metrics_last(path) == NULL); /* no file */
    FILE *f = fopen(path, "w");
    fputs("{\"t\":1,\"event\":\"start\",\"total_steps\":100}\n", f);
    fclose(f);
    CHECK(dp_metrics_last(path) == NULL); /* events only */
    f = fopen(path, "a");
    for (int i = 0; i < 3000; i++) /* past the 64 KiB read from the end */
        fprintf(f, "{\"t\":2,\"step\":%d,\"loss\":0.5,\"pad\":\"..............\"}\n", i);
    fputs("{\"t\":3,\"event\":\"staleness\",\"staleness_histogram\":[30]}\n"
          "{\"t\":3,\"event\":\"eval\",\"step\":3000,\"test_accuracy\":0.6}\n"
          "{\"t\":3,\"event\":\"leave\",\"task\":0}\n"
          "{\"t\":3,\"step\":", f); /* and half a line, as a crash leaves */
    fclose(f);
    cJSON *o = dp_metrics_last(path);
    CHECK(o != NULL);
    const cJSON *step = o ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
    CHECK(cJSON_IsNumber(step) && step->valuedouble == 2999);
    CHECK(o && !cJSON_GetObjectItemCaseSensitive(o, "event"));
    cJSON_Delete(o);
    s_rmtree(dir);
}

typedef struct {
    dp_metrics_t *m;
    int id;
} s_writer_arg_t;

static void *s_writer(void *p)
{
    s_writer_arg_t *a = p;
    for (int i = 0; i < 2000; i++) {
        cJSON *line = dp_metrics_line(a->m);
        cJSON_AddNumberToObject(line, "thread", a->id);
        cJSON_AddNumberToObject(line, "i", i);
        cJSON_AddStringToObject(line, "pad", "................................................");
        dp_metrics_write(a->m, &line);
    }
    return NULL;
}

static void test_jsonl_threads_and_big_lines(void)
{
    const char *dir = s_tmpdir();
    char path[256], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    dp_metrics_t *m = NULL;
    CHECK_EQ(dp_metrics_new(&m, path, err), 0);
    pthread_t th[4];
    s_writer_arg_t args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (s_writer_arg_t){m, i};
        pthread_create(&th[i], NULL, s_writer, &args[i]);
    }
    /* Lines bigger than the stack buffer and than the whole buffer, in the
     * middle of it all. */
    size_t sizes[2] = {5000, 100000};
    for (int k = 0; k < 2; k++) {
        char *big = dp_malloc(sizes[k] + 1);
        memset(big, 'x', sizes[k]);
        big[sizes[k]] = '\0';
        cJSON *line = dp_metrics_line(m);
        cJSON_AddStringToObject(line, "big", big);
        dp_metrics_write(m, &line);
        free(big);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    dp_metrics_destroy(&m);

    static char *lines[9000];
    char *text;
    int n = s_lines(path, &text, lines, 9000);
    CHECK_EQ(n, 8002);
    int bad = 0, per[4] = {0}, bigs = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_Parse(lines[i]);
        if (!o) {
            bad++;
            continue;
        }
        cJSON *t = cJSON_GetObjectItem(o, "thread");
        if (cJSON_IsNumber(t) && t->valueint >= 0 && t->valueint < 4) per[t->valueint]++;
        cJSON *b = cJSON_GetObjectItem(o, "big");
        if (cJSON_IsString(b) && (strlen(b->valuestring) == sizes[0] || strlen(b->valuestring) == sizes[1]))
            bigs++;
        cJSON_Delete(o);
    }
    CHECK_EQ(bad, 0);
    for (int i = 0; i < 4; i++) CHECK_EQ(per[i], 2000);
    CHECK_EQ(bigs, 2);
    free(text);
    s_rmtree(dir);
}

static void test_summary_atomic(void)
{
    const char *dir = s_tmpdir();
    char path[256], err[DP_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/summary.json", dir);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", "async");
    cJSON_AddNumberToObject(o, "workers", 4);
    cJSON_AddNumberToObject(o, "test_accuracy", 0.9125);
    cJSON_AddNumberToObject(o, "staleness_mean", NAN);
    CHECK_EQ(dp_summary_write(path, o, err), 0);
    /* Rewriting replaces it whole. */
    cJSON_ReplaceItemInObject(o, "workers", cJSON_CreateNumber(8));
    CHECK_EQ(dp_summary_write(path, o, err), 0);
    cJSON_Delete(o);

    uint8_t *data = NULL;
    size_t len = 0;
    CHECK_EQ(dp_read_file(path, &data, &len, err), 0);
    cJSON *back = data ? cJSON_Parse((char *)data) : NULL;
    CHECK(back != NULL);
    if (back) {
        CHECK_STR(cJSON_GetObjectItem(back, "mode")->valuestring, "async");
        CHECK_EQ(cJSON_GetObjectItem(back, "workers")->valueint, 8);
        CHECK_NEAR(cJSON_GetObjectItem(back, "test_accuracy")->valuedouble, 0.9125, 1e-12);
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(back, "staleness_mean")));
    }
    CHECK(data && len > 0 && data[len - 1] == '\n');
    cJSON_Delete(back);
    free(data);
    /* Nothing left beside it. */
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') entries++;
    if (d) closedir(d);
    CHECK_EQ(entries, 1);
    /* Bad input. */
    o = cJSON_CreateObject();
    CHECK_EQ(dp_summary_write("/dev/null/summary.json", o, err), -1);
    CHECK(strstr(err, "/dev/null/summary.json") != NULL);
    CHECK_EQ(dp_summary_write(path, NULL, err), -1);
    cJSON_Delete(o);
    s_rmtree(dir);
}

/* ---- CRC-32C ------------------------------------------------------------ */

static void test_crc32c_vectors(void)
{
    /* RFC 3720 (iSCSI) B.4 and the common check value. */
    CHECK_EQ(dp_crc32c(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ(dp_crc32c(0, "", 0), 0);
    uint8_t buf[32];
    memset(buf, 0, sizeof buf);
    CHECK_EQ(dp_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, sizeof buf);
    CHECK_EQ(dp_crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    CHECK_EQ(dp_crc32c(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
    CHECK_EQ(dp_crc32c(0, buf, 32), 0x113FDB5Cu);
    /* Chaining equals one pass. */
    CHECK_EQ(dp_crc32c(dp_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    /* The mask, by hand: rotate right 15, add the constant. */
    CHECK_EQ(dp_crc32c_mask(0), 0xa282ead8u);
    CHECK_EQ(dp_crc32c_mask(0x00008000u), 0x00000001u + 0xa282ead8u);
    CHECK_EQ(dp_crc32c_mask(0xE3069283u), (uint32_t)(((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u));
}

/* ---- TensorBoard event files: an independent reader -------------------- */

typedef struct {
    double wall_time;
    int64_t step;
    char file_version[32];
    char tag[64];
    float value;
    int has_value;
    uint8_t raw[512]; /* the Event bytes, for protoc */
    size_t raw_n;
} s_event_t;

static uint32_t s_le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static int s_varint(const uint8_t *p, size_t n, size_t *i, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *i < n; shift += 7) {
        uint8_t b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return 0;
    }
    return -1;
}

/* Decodes Summary.Value { tag = 1, simple_value = 2 } inside Summary { value = 1 }. */
static int s_decode_summary(const uint8_t *p, size_t n, s_event_t *ev)
{
    size_t i = 0;
    while (i < n) {
        uint64_t key, len;
        if (s_varint(p, n, &i, &key) || (key & 7) != 2 || (key >> 3) != 1) return -1;
        if (s_varint(p, n, &i, &len) || i + len > n) return -1;
        const uint8_t *v = p + i;
        size_t j = 0;
        while (j < len) {
            uint64_t k2, l2;
            if (s_varint(v, len, &j, &k2)) return -1;
            if (k2 == ((1 << 3) | 2)) {
                if (s_varint(v, len, &j, &l2) || j + l2 > len || l2 >= sizeof ev->tag) return -1;
                memcpy(ev->tag, v + j, l2);
                ev->tag[l2] = '\0';
                j += l2;
            } else if (k2 == ((2 << 3) | 5)) {
                if (j + 4 > len) return -1;
                uint32_t u = s_le32(v + j);
                memcpy(&ev->value, &u, 4);
                ev->has_value = 1;
                j += 4;
            } else {
                return -1;
            }
        }
        i += len;
    }
    return 0;
}

static int s_decode_event(const uint8_t *p, size_t n, s_event_t *ev)
{
    memset(ev, 0, sizeof *ev);
    if (n <= sizeof ev->raw) {
        memcpy(ev->raw, p, n);
        ev->raw_n = n;
    }
    size_t i = 0;
    while (i < n) {
        uint64_t key, v;
        if (s_varint(p, n, &i, &key)) return -1;
        unsigned field = (unsigned)(key >> 3), wire = (unsigned)(key & 7);
        if (field == 1 && wire == 1 && i + 8 <= n) {
            uint64_t u = s_le32(p + i) | (uint64_t)s_le32(p + i + 4) << 32;
            memcpy(&ev->wall_time, &u, 8);
            i += 8;
        } else if (field == 2 && wire == 0) {
            if (s_varint(p, n, &i, &v)) return -1;
            ev->step = (int64_t)v;
        } else if ((field == 3 || field == 5) && wire == 2) {
            if (s_varint(p, n, &i, &v) || i + v > n) return -1;
            if (field == 3) {
                if (v >= sizeof ev->file_version) return -1;
                memcpy(ev->file_version, p + i, v);
            } else if (s_decode_summary(p + i, v, ev)) {
                return -1;
            }
            i += v;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Reads every record, checking both CRCs; returns the count or -1. */
static int s_read_events(const char *path, s_event_t *evs, int max)
{
    uint8_t *data = NULL;
    size_t len = 0, off = 0;
    char err[DP_ERR_LEN];
    if (dp_read_file(path, &data, &len, err) != 0) return -1;
    int n = 0, rc = 0;
    while (off < len && n < max) {
        if (off + 12 > len) { rc = -1; break; }
        uint64_t dlen = s_le32(data + off) | (uint64_t)s_le32(data + off + 4) << 32;
        if (s_le32(data + off + 8) != dp_crc32c_mask(dp_crc32c(0, data + off, 8))) {
            fprintf(stderr, "  record %d: bad length crc\n", n);
            rc = -1;
            break;
        }
        if (off + 12 + dlen + 4 > len) { rc = -1; break; }
        const uint8_t *d = data + off + 12;
        if (s_le32(d + dlen) != dp_crc32c_mask(dp_crc32c(0, d, dlen))) {
            fprintf(stderr, "  record %d: bad data crc\n", n);
            rc = -1;
            break;
        }
        if (s_decode_event(d, dlen, &evs[n]) != 0) {
            fprintf(stderr, "  record %d: bad Event\n", n);
            rc = -1;
            break;
        }
        n++;
        off += 12 + dlen + 4;
    }
    free(data);
    return rc ? -1 : n;
}

/* The one events.out.tfevents.* file in dir, into path. */
static int s_find_event_file(const char *dir, char *path, size_t n)
{
    DIR *d = opendir(dir);
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
            snprintf(path, n, "%s/%s", dir, e->d_name);
            found++;
        }
    if (d) closedir(d);
    return found;
}

static void test_tb_roundtrip(void)
{
    const char *dir = s_tmpdir();
    char logdir[256], err[DP_ERR_LEN] = "";
    snprintf(logdir, sizeof logdir, "%s/runs/a", dir); /* created, parents too */
    dp_tb_t *tb = NULL;
    CHECK_EQ(dp_tb_new(&tb, logdir, "worker0", err), 0);
    CHECK(tb != NULL);
    double t0 = (double)time(NULL);
    dp_tb_scalar(tb, "train/loss", 0, 2.25f);
    dp_tb_scalar(tb, "train/loss", 100, 0.5f);
    dp_tb_scalar(tb, "test/accuracy", 300000000000L, 0.875f);
    dp_tb_scalar(tb, "neg", -3, -1.0f);
    dp_tb_destroy(&tb);
    CHECK(tb == NULL);
    dp_tb_destroy(&tb);

    char path[512];
    CHECK_EQ(s_find_event_file(logdir, path, sizeof path), 1);
    /* events.out.tfevents.<time>.<host>.worker0 */
    char host[256] = "";
    gethostname(host, sizeof host);
    char want[300];
    snprintf(want, sizeof want, ".%s.worker0", host);
    CHECK(strlen(path) > strlen(want) && strcmp(path + strlen(path) - strlen(want), want) == 0);

    s_event_t ev[8];
    int n = s_read_events(path, ev, 8);
    CHECK_EQ(n, 5);
    if (n == 5) {
        CHECK_STR(ev[0].file_version, "brain.Event:2");
        CHECK(!ev[0].has_value);
        CHECK_NEAR(ev[0].wall_time, t0, 5);
        CHECK_STR(ev[1].tag, "train/loss");
        CHECK_EQ(ev[1].step, 0);
        CHECK(ev[1].has_value && ev[1].value == 2.25f);
        CHECK_EQ(ev[2].step, 100);
        CHECK(ev[2].value == 0.5f);
        CHECK_STR(ev[3].tag, "test/accuracy");
        CHECK_EQ(ev[3].step, 300000000000LL);
        CHECK(ev[3].value == 0.875f);
        CHECK_EQ(ev[4].step, -3);
        CHECK(ev[4].value == -1.0f);
        CHECK(ev[4].wall_time >= ev[1].wall_time);

        /* An independent decoder, when protoc is installed. */
        if (system("command -v protoc >/dev/null 2>&1") == 0) {
            char raw[600], cmd[1400];
            snprintf(raw, sizeof raw, "%s/ev.bin", dir);
            FILE *f = fopen(raw, "wb");
            fwrite(ev[2].raw, 1, ev[2].raw_n, f);
            fclose(f);
            snprintf(cmd, sizeof cmd, "protoc --decode_raw < '%s' > '%s.txt'", raw, raw);
            CHECK_EQ(system(cmd), 0);
            snprintf(raw + strlen(raw), sizeof raw - strlen(raw), ".txt");
            uint8_t *txt = NULL;
            size_t tl = 0;
            CHECK_EQ(dp_read_file(raw, &txt, &tl, err), 0);
            /* step, tag, and 0.5f = 0x3f000000 as fixed32. */
            CHECK(txt && strstr((char *)txt, "2: 100"));
            CHECK(txt && strstr((char *)txt, "1: \"train/loss\""));
            CHECK(txt && strstr((char *)txt, "2: 0x3f000000"));
            if (txt && !strstr((char *)txt, "2: 0x3f000000")) fprintf(stderr, "%s", txt);
            free(txt);
        } else {
            fprintf(stderr, "  note: protoc not installed; skipped the protoc --decode_raw check\n");
        }
    }

    /* A second writer in the same second gets its own file. */
    dp_tb_t *a = NULL, *b = NULL;
    CHECK_EQ(dp_tb_new(&a, logdir, "x", err), 0);
    CHECK_EQ(dp_tb_new(&b, logdir, "x", err), 0);
    CHECK(a && b);
    dp_tb_destroy(&a);
    dp_tb_destroy(&b);
    CHECK_EQ(s_find_event_file(logdir, path, sizeof path), 3);
    s_rmtree(dir);
}

static void test_tb_disabled_and_bad(void)
{
    char err[DP_ERR_LEN] = "";
    dp_tb_t *tb = NULL;
    CHECK_EQ(dp_tb_new(&tb, NULL, "x", err), 0);
    CHECK(tb != NULL);
    dp_tb_scalar(tb, "a", 1, 1.0f);
    dp_tb_destroy(&tb);
    CHECK(tb == NULL);
    dp_tb_scalar(NULL, "a", 1, 1.0f);
    CHECK_EQ(dp_tb_new(&tb, "/tmp", "a/b", err), -1);
    CHECK(strstr(err, "suffix") != NULL);
    CHECK_EQ(dp_tb_new(&tb, "/proc/dp-no/such", NULL, err), -1);
    CHECK(strstr(err, "/proc/dp-no/such") != NULL);
    /* logdir is a file */
    CHECK_EQ(dp_tb_new(&tb, "/etc/hostname/x", NULL, err), -1);
    CHECK(tb == NULL);
}

/* TensorBoard's own reader, when /usr/bin/python3 has it. */
static void test_tb_read_by_tensorboard(void)
{
    if (system("/usr/bin/python3 -c 'import tensorboard' >/dev/null 2>&1") != 0)
        SKIP("tensorboard is not installed for /usr/bin/python3 (no Debian package); "
             "the records were checked by this test's own reader");
    const char *dir = s_tmpdir();
    char err[DP_ERR_LEN] = "";
    dp_tb_t *tb = NULL;
    CHECK_EQ(dp_tb_new(&tb, dir, "tbcheck", err), 0);
    for (int i = 0; i < 10; i++) dp_tb_scalar(tb, "loss", i * 10, 1.0f / (float)(i + 1));
    dp_tb_destroy(&tb);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c '"
             "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
             "a = EventAccumulator(\"%s\"); a.Reload()\n"
             "s = a.Scalars(\"loss\")\n"
             "assert [e.step for e in s] == list(range(0, 100, 10)), s\n"
             "assert all(abs(e.value - 1.0/(i+1)) < 1e-6 for i, e in enumerate(s)), s\n"
             "'", dir);
    CHECK_EQ(system(cmd), 0);
    s_rmtree(dir);
}

/* dp_crc32 is zlib's crc32, on the check value and on odd-sized, odd-aligned
 * random buffers up to a few MB (ISA-L's SIMD paths switch on length and
 * alignment), chained too. */
static void test_crc32_matches_zlib(void)
{
    CHECK_EQ(dp_crc32(0, "123456789", 9), 0xCBF43926u);
    CHECK_EQ(dp_crc32(0, "", 0), 0);
    size_t cap = (3u << 20) + 77;
    unsigned char *buf = dp_malloc(cap);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < cap; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (unsigned char)x;
    }
    size_t lens[] = {1, 3, 15, 16, 17, 63, 64, 65, 255, 4097, 65537, (3u << 20) + 13};
    int bad = 0;
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t off = 0; off < 4; off++) {
            size_t n = lens[k];
            uint32_t want = (uint32_t)crc32(0L, buf + off, (uInt)n);
            bad += dp_crc32(0, buf + off, n) != want;
            bad += dp_crc32(dp_crc32(0, buf + off, n / 3), buf + off + n / 3, n - n / 3) != want;
        }
    CHECK_EQ(bad, 0);
    free(buf);
}

DP_TESTS(T(test_jsonl_lines_parse), T(test_metrics_round), T(test_jsonl_disabled_and_bad_path),
         T(test_jsonl_flushed_within_a_second), T(test_jsonl_appends), T(test_metrics_last_passes_events),
         T(test_jsonl_threads_and_big_lines),
         T(test_summary_atomic), T(test_crc32c_vectors), T(test_crc32_matches_zlib),
         T(test_tb_roundtrip),
         T(test_tb_disabled_and_bad), T(test_tb_read_by_tensorboard))
