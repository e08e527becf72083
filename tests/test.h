/* test.h: the tiny harness every unit test program uses.
 *
 *   static void test_foo(void) { CHECK_EQ(1 + 1, 2); }
 *   DP_TESTS(T(test_foo), T(test_bar))
 *
 * CHECK* print file:line and both values and keep going; the program's last
 * line is "N passed, N failed" and its exit status is non-zero on any
 * failure. `-t NAME` runs one test. A test that checks nothing fails: no test
 * may pass without checking something. A skip names its reason. */
#ifndef DP_TEST_H
#define DP_TEST_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"
#include "kernels/env.h"

static int t_checks;      /* checks made by the current test */
static int t_failures;    /* failed checks in the current test */
static int t_skipped;     /* the current test skipped itself */

#define CHECK(cond)                                                            \
    do {                                                                       \
        t_checks++;                                                            \
        if (!(cond)) {                                                         \
            t_failures++;                                                      \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
        }                                                                      \
    } while (0)

#define CHECK_EQ(a, b)                                                         \
    do {                                                                       \
        long long t_a = (long long)(a), t_b = (long long)(b);                  \
        t_checks++;                                                            \
        if (t_a != t_b) {                                                      \
            t_failures++;                                                      \
            fprintf(stderr, "  %s:%d: CHECK_EQ(%s, %s): %lld != %lld\n", __FILE__, \
                    __LINE__, #a, #b, t_a, t_b);                               \
        }                                                                      \
    } while (0)

#define CHECK_STR(a, b)                                                        \
    do {                                                                       \
        const char *t_a = (a), *t_b = (b);                                     \
        t_checks++;                                                            \
        if (!t_a || !t_b || strcmp(t_a, t_b) != 0) {                           \
            t_failures++;                                                      \
            fprintf(stderr, "  %s:%d: CHECK_STR(%s, %s): \"%s\" != \"%s\"\n", \
                    __FILE__, __LINE__, #a, #b, t_a ? t_a : "(null)",          \
                    t_b ? t_b : "(null)");                                     \
        }                                                                      \
    } while (0)

/* |a - b| <= tol */
#define CHECK_NEAR(a, b, tol)                                                  \
    do {                                                                       \
        double t_a = (double)(a), t_b = (double)(b), t_t = (double)(tol);      \
        t_checks++;                                                            \
        if (!(fabs(t_a - t_b) <= t_t)) {                                       \
            t_failures++;                                                      \
            fprintf(stderr, "  %s:%d: CHECK_NEAR(%s, %s, %s): %.9g vs %.9g (diff %.3g)\n", \
                    __FILE__, __LINE__, #a, #b, #tol, t_a, t_b, fabs(t_a - t_b)); \
        }                                                                      \
    } while (0)

#define SKIP(why)                                                              \
    do {                                                                       \
        t_skipped = 1;                                                         \
        fprintf(stderr, "  skip: %s\n", why);                                  \
        return;                                                                \
    } while (0)

/* Compare n floats: |got - want| <= atol + rtol |want|. Prints the first few
 * mismatches and the worst difference; counts as one check. */
static inline int t_check_close(const char *file, int line, const char *what, const float *got,
                                const float *want, size_t n, double atol, double rtol)
{
    size_t bad = 0, worst_i = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        double lim = atol + rtol * fabs((double)want[i]);
        if (!(d <= lim)) {
            if (bad < 5)
                fprintf(stderr, "  %s:%d: %s[%zu]: got %.9g want %.9g\n", file, line, what, i,
                        got[i], want[i]);
            bad++;
        }
        if (d > worst || d != d) {
            worst = d;
            worst_i = i;
        }
    }
    t_checks++;
    if (bad) {
        t_failures++;
        fprintf(stderr, "  %s:%d: %s: %zu of %zu differ; worst |diff| %.3g at %zu\n", file, line,
                what, bad, n, worst, worst_i);
    }
    return bad == 0;
}
#define CHECK_CLOSE(what, got, want, n, atol, rtol)                            \
    t_check_close(__FILE__, __LINE__, what, got, want, n, atol, rtol)

typedef struct {
    const char *name;
    void (*fn)(void);
} t_test_t;
#define T(fn) {#fn, fn}

static inline int t_main(int argc, char **argv, const t_test_t *tests, int n)
{
    const char *only = NULL;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) only = argv[++i];
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n; i++) {
        if (only && strcmp(only, tests[i].name) != 0) continue;
        t_checks = t_failures = t_skipped = 0;
        fprintf(stderr, "%s ...\n", tests[i].name);
        tests[i].fn();
        if (t_skipped && t_failures == 0) {
            skipped++;
            continue;
        }
        if (t_checks == 0) {
            fprintf(stderr, "  %s checked nothing\n", tests[i].name);
            t_failures++;
        }
        if (t_failures) {
            failed++;
            fprintf(stderr, "FAIL %s (%d of %d checks)\n", tests[i].name, t_failures, t_checks);
        } else {
            passed++;
        }
    }
    if (only && passed + failed + skipped == 0) {
        fprintf(stderr, "no test named %s\n", only);
        failed = 1;
    }
    if (skipped)
        printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    else
        printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* The Python that runs the PyTorch parity scripts: $TORCH_PY, default
 * Debian's /usr/bin/python3 (python3-torch); NULL when torch does not
 * import there (the caller skips, saying so). */
static inline const char *t_torch_py(void)
{
    const char *p = getenv("TORCH_PY");
    p = p && p[0] ? p : "/usr/bin/python3";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' 2>/dev/null", p);
    return system(cmd) == 0 ? p : NULL;
}

/* The environment's knobs, read first as each program's main does
 * (kernels/env.h): a bad one is one line, and the caller exits 2 before any
 * test runs. */
static int t_env(void)
{
    char err[DP_ERR_LEN];
    if (dp_log_env(err) == 0 && dp_kernels_env(err) == 0) return 0;
    fprintf(stderr, "%s: %s\n", program_invocation_short_name, err);
    return -1;
}

#define DP_TESTS(...)                                                          \
    int main(int argc, char **argv)                                            \
    {                                                                          \
        static const t_test_t t_all[] = {__VA_ARGS__};                         \
        if (t_env() != 0) return 2;                                            \
        return t_main(argc, argv, t_all, (int)(sizeof t_all / sizeof t_all[0])); \
    }

#endif
