/* fuzz.h: what the file and text fuzz targets share (fuzz_safetensors,
 * fuzz_model, fuzz_record, fuzz_tfconfig; fuzz_wire predates it).
 *
 * Each target defines LLVMFuzzerTestOneInput, which hands the bytes to the
 * real parser (a file parser gets them as a file: an in-memory memfd under
 * /proc/self/fd, so no disk is touched), and checks only what holds for any
 * input: the parser returns an error or a result whose invariants hold.
 * A broken invariant is fz_violation(): under libFuzzer (-DDP_LIBFUZZER) it
 * aborts, so the fuzzer saves the input as a crash.
 *
 * Built by the normal Makefile with gcc (and run by `make test`), fz_main()
 * replays the committed seed corpus tests/fuzz/corpus/NAME/ and a few
 * thousand seeded mutations of it, reproducibly, and prints "N passed,
 * N failed". A seed named ok-* is a valid input: the parser must accept it
 * (the target counts acceptances in fz_accepted), so the harness is known
 * to reach the parser's success path and the invariant checks behind it. */
#ifndef DP_FUZZ_H
#define DP_FUZZ_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fz_violations; /* inputs whose result broke an invariant (gcc build) */
static int fz_accepted;   /* inputs the parser accepted */

static inline void fz_violation(const char *target, const char *what)
{
    fprintf(stderr, "%s: invariant violated: %s\n", target, what);
    fz_violations++;
#ifdef DP_LIBFUZZER
    abort();
#endif
}

/* The bytes as a file: one memfd, rewritten per input. Returns its path
 * (valid until the next call). */
static inline const char *fz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("dp-fuzz", 0);
        if (fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) {
        perror("fuzz: memfd write");
        abort();
    }
    return path;
}

/* The bytes as a NUL-terminated string (they stop at the first NUL). */
static inline char *fz_str(const uint8_t *data, size_t size)
{
    char *s = dp_malloc(size + 1);
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

#ifndef DP_LIBFUZZER
typedef struct {
    uint8_t *data;
    size_t len;
    int ok;  /* named ok-*: must be accepted */
    char name[256];
} fz_seed_t;

/* One mutation of buf[0..*n) (capacity cap): a bit, a byte, a digit, a
 * truncation, a chunk repeated or a chunk deleted. */
static void fz_mutate(uint8_t *buf, size_t *n, size_t cap, dp_rng_t *r)
{
    static const char digits[] = "0123456789-+.e9999999999";
    size_t len = *n;
    if (len == 0) {
        buf[0] = (uint8_t)dp_rng_next(r);
        *n = 1;
        return;
    }
    size_t at = dp_rng_below(r, (uint32_t)len);
    switch (dp_rng_below(r, 6)) {
    case 0: buf[at] ^= (uint8_t)(1u << dp_rng_below(r, 8)); break;
    case 1: buf[at] = (uint8_t)dp_rng_next(r); break;
    case 2: buf[at] = (uint8_t)digits[dp_rng_below(r, sizeof digits - 1)]; break;
    case 3: *n = at; break;
    case 4: { /* repeat buf[at, at + k) right after itself */
        size_t k = 1 + dp_rng_below(r, 16);
        if (at + k > len) k = len - at;
        if (len + k > cap) break;
        memmove(buf + at + 2 * k, buf + at + k, len - at - k);
        memmove(buf + at + k, buf + at, k); /* the source is unchanged by the first move */
        *n = len + k;
        break;
    }
    default: { /* delete buf[at, at + k) */
        size_t k = 1 + dp_rng_below(r, 8);
        if (at + k > len) k = len - at;
        memmove(buf + at, buf + at + k, len - at - k);
        *n = len - k;
        break;
    }
    }
}

static int fz_seed_cmp(const void *a, const void *b)
{
    return strcmp(((const fz_seed_t *)a)->name, ((const fz_seed_t *)b)->name);
}

/* argv[1]: the corpus directory (default tests/fuzz/corpus/NAME, from the
 * repository root, where tests/run.sh runs us); argv[2]: mutations. */
static int fz_main(int argc, char **argv, const char *name, int iters)
{
    char dir[512], err[DP_ERR_LEN];
    if (argc > 1) snprintf(dir, sizeof dir, "%s", argv[1]);
    else snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", name);
    if (argc > 2) iters = atoi(argv[2]);
    int passed = 0, failed = 0;
    fz_seed_t seeds[256];
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz_%s: %s: cannot open the seed corpus\n", name, dir);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    for (struct dirent *e; (e = readdir(d)) && n < 256;) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        fz_seed_t *s = &seeds[n];
        if (dp_read_file(path, &s->data, &s->len, err) != 0) {
            fprintf(stderr, "fuzz_%s: %s\n", name, err);
            continue;
        }
        snprintf(s->name, sizeof s->name, "%s", e->d_name);
        s->ok = strncmp(e->d_name, "ok-", 3) == 0;
        n++;
    }
    closedir(d);
    qsort(seeds, (size_t)n, sizeof *seeds, fz_seed_cmp); /* readdir's order is the disk's */
    /* 1: every seed runs clean, and the valid ones are accepted */
    int bad = 0, oks = 0;
    for (int i = 0; i < n; i++) {
        int v = fz_violations, a = fz_accepted;
        LLVMFuzzerTestOneInput(seeds[i].data, seeds[i].len);
        if (fz_violations != v) bad++;
        if (seeds[i].ok) {
            oks++;
            if (fz_accepted != a + 1) {
                fprintf(stderr, "fuzz_%s: valid seed %s refused\n", name, seeds[i].name);
                bad++;
            }
        }
    }
    if (n > 0 && oks > 0 && !bad) passed++;
    else {
        fprintf(stderr, "fuzz_%s: %d seeds (%d valid), %d bad\n", name, n, oks, bad);
        failed++;
    }
    /* 2: no mutated seed breaks an invariant */
    dp_rng_t r;
    dp_rng_seed(&r, 12345);
    size_t cap = 1 << 16;
    uint8_t *buf = dp_malloc(cap);
    int broke = 0, accepted0 = fz_accepted;
    for (int it = 0; it < iters && n > 0; it++) {
        const fz_seed_t *s = &seeds[dp_rng_below(&r, (uint32_t)n)];
        size_t len = s->len < cap ? s->len : cap;
        memcpy(buf, s->data, len);
        int muts = 1 + (int)dp_rng_below(&r, 4);
        for (int m = 0; m < muts; m++) fz_mutate(buf, &len, cap, &r);
        int v = fz_violations;
        LLVMFuzzerTestOneInput(buf, len);
        broke += fz_violations != v;
    }
    fprintf(stderr, "fuzz_%s: %d seeds, %d mutations, %d accepted, %d broke an invariant\n", name, n,
            iters, fz_accepted - accepted0, broke);
    if (broke) failed++;
    else passed++;
    for (int i = 0; i < n; i++) free(seeds[i].data);
    free(buf);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
#endif

#endif
