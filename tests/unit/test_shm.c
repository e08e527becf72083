/* test_shm: the shared-memory segments (proto/shm.h) — made 0600 and
 * unlinked by their owner; opened only when owner, mode, size and header
 * match what the opener expects; the seqlock tells a good copy from one
 * that raced a write. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/shm.h"
#include "tests/test.h"

#define NF 1000

static void test_create_open(void)
{
    char err[DP_ERR_LEN] = "";
    dp_shm_t a, b;
    CHECK_EQ(dp_shm_create(&a, 0, "test", NF, 3, err), 0);
    char path[160];
    snprintf(path, sizeof path, "/dev/shm%s", a.name);
    struct stat st;
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0600);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, err), 0);
    for (int i = 0; i < NF; i++) dp_shm_slot(&a, 2)[i] = (float)i;
    CHECK(b.base && dp_shm_slot(&b, 2)[999] == 999.0f);
    dp_shm_close(&b);
    /* the wrong layout, size or name is refused */
    CHECK_EQ(dp_shm_open(&b, a.name, NF + 1, 3, err), -1);
    CHECK(strstr(err, "expected") != NULL || strstr(err, "header") != NULL);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 2, err), -1);
    CHECK_EQ(dp_shm_open(&b, "/no-such-downpour-segment", NF, 3, err), -1);
    CHECK_EQ(dp_shm_open(&b, "../etc/passwd", NF, 3, err), -1);
    CHECK(strstr(err, "bad segment name") != NULL);
    /* a tampered header */
    a.hdr->n = 7;
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, err), -1);
    CHECK(strstr(err, "header") != NULL);
    a.hdr->n = NF;
    /* readable by others: refused */
    CHECK_EQ(chmod(path, 0644), 0);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, err), -1);
    CHECK(strstr(err, "0600") != NULL);
    CHECK(b.base == NULL);
    dp_shm_close(&a);
    CHECK(stat(path, &st) != 0); /* unlinked */
    dp_shm_close(&a);            /* safe twice */
}

static void test_seqlock(void)
{
    char err[DP_ERR_LEN] = "";
    dp_shm_t a, b;
    CHECK_EQ(dp_shm_create(&a, 1, "seq", NF, 3, err), 0);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, err), 0);
    float out[NF];
    dp_shm_write_begin(&a, 1);
    for (int i = 0; i < NF; i++) dp_shm_slot(&a, 1)[i] = 2.0f * (float)i;
    uint64_t q = dp_shm_write_end(&a, 1);
    CHECK_EQ(q % 2, 0);
    CHECK_EQ(dp_shm_seq(&b, 1), q);
    CHECK_EQ(dp_shm_read(&b, 1, q, 10, out, 5), 1);
    CHECK(out[0] == 20.0f && out[4] == 28.0f);
    dp_shm_write_begin(&a, 1); /* a writer at work: no copy is good */
    CHECK_EQ(dp_shm_read(&b, 1, q, 0, out, NF), 0);
    CHECK_EQ(dp_shm_read(&b, 1, dp_shm_seq(&b, 1), 0, out, NF), 0); /* odd */
    uint64_t q2 = dp_shm_write_end(&a, 1);
    CHECK(q2 > q);
    CHECK_EQ(dp_shm_read(&b, 1, q, 0, out, NF), 0); /* an older version's seq */
    CHECK_EQ(dp_shm_read(&b, 1, q2, 0, out, NF), 1);
    dp_shm_close(&b);
    dp_shm_close(&a);
}

/* More than /dev/shm holds: refused at creation (not a SIGBUS at the first
 * write), nothing left behind. */
static void test_too_large(void)
{
    char err[DP_ERR_LEN] = "";
    dp_shm_t a;
    CHECK_EQ(dp_shm_create(&a, 2, "huge", (size_t)1 << 40, 3, err), -1);
    CHECK(strstr(err, "shared memory") != NULL);
    CHECK(a.base == NULL && a.name[0] == 0);
}

/* A segment named for a process that is gone is swept; ours (alive) stays. */
static void test_sweep_stale(void)
{
    pid_t kid = fork();
    if (kid == 0) _exit(0);
    waitpid(kid, NULL, 0);
    char name[96];
    snprintf(name, sizeof name, "/downpour-%d-0-params-test", (int)kid);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    char err[DP_ERR_LEN] = "";
    dp_shm_t mine;
    CHECK_EQ(dp_shm_create(&mine, 0, "alive", 16, 1, err), 0);
    CHECK(dp_shm_sweep_stale() >= 1);
    CHECK(shm_open(name, O_RDWR, 0) < 0 && errno == ENOENT);
    dp_shm_t again;
    CHECK_EQ(dp_shm_open(&again, mine.name, 16, 1, err), 0);
    dp_shm_close(&again);
    dp_shm_close(&mine);
}

DP_TESTS(T(test_create_open), T(test_seqlock), T(test_too_large), T(test_sweep_stale))
