/* test_shm: the shared-memory segments (proto/shm.h) — sealed memfds that
 * never have a name in /dev/shm; opened only as /proc/PID/fd/FD, and only
 * when owner, mode, size, seals and header match what the opener expects;
 * the parameter segment cannot be written by any process but its creator,
 * root included; the seqlock tells a good copy from one that raced a
 * write; who is on this host by its ZeroMQ Peer-Address. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/shm.h"
#include "tests/test.h"

#define NF 1000

/* Entries of /dev/shm named like this process's segments once were
 * ("downpour-PID-..."): there must be none. */
static int s_dev_shm_entries(int pid)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "downpour-%d-", pid);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d))) k += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return k;
}

static void test_create_open(void)
{
    char err[DP_ERR_LEN] = "";
    dp_shm_t a, b;
    CHECK_EQ(dp_shm_create(&a, 0, "test", NF, 3, DP_SHM_READ_ONLY, err), 0);
    char want[64];
    snprintf(want, sizeof want, "/proc/%d/fd/", (int)getpid());
    CHECK(strncmp(a.name, want, strlen(want)) == 0);
    CHECK_EQ(s_dev_shm_entries((int)getpid()), 0); /* nothing a kill -9 could leave */
    struct stat st;
    CHECK_EQ(stat(a.name, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0600);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, DP_SHM_READ_ONLY, err), 0);
    for (int i = 0; i < NF; i++) dp_shm_slot(&a, 2)[i] = (float)i;
    CHECK(b.base && dp_shm_slot(&b, 2)[999] == 999.0f);
    dp_shm_close(&b);
    /* the wrong layout, size or name is refused */
    CHECK_EQ(dp_shm_open(&b, a.name, NF + 1, 3, DP_SHM_READ_ONLY, err), -1);
    CHECK(strstr(err, "expected") != NULL || strstr(err, "header") != NULL);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 2, DP_SHM_READ_ONLY, err), -1);
    CHECK_EQ(dp_shm_open(&b, "/proc/1/fd/999999", NF, 3, DP_SHM_READ_ONLY, err), -1);
    const char *bad[] = {"../etc/passwd", "/dev/shm/downpour-1-0-params-0", "/proc/self/fd/3",
                         "/proc/1/fd/3/../4", "/proc/+1/fd/3", "/proc/1/fd/03", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_EQ(dp_shm_open(&b, bad[i], NF, 3, DP_SHM_READ_ONLY, err), -1);
        CHECK(strstr(err, "bad segment name") != NULL);
    }
    /* not a segment: a FIFO nobody writes is refused at once (an open
     * without O_NONBLOCK would wait for a writer for ever) */
    char fifo[64], path[64];
    snprintf(fifo, sizeof fifo, "/tmp/dp-test-shm-fifo-%d", (int)getpid());
    CHECK_EQ(mkfifo(fifo, 0600), 0);
    int ff = open(fifo, O_RDONLY | O_NONBLOCK);
    CHECK(ff >= 0);
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getpid(), ff);
    CHECK_EQ(dp_shm_open(&b, path, NF, 3, DP_SHM_READ_ONLY, err), -1);
    CHECK(strstr(err, "not a file of ours") != NULL);
    if (ff >= 0) close(ff);
    unlink(fifo);
    /* a tampered header */
    a.hdr->n = 7;
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, DP_SHM_READ_ONLY, err), -1);
    CHECK(strstr(err, "header") != NULL);
    a.hdr->n = NF;
    /* readable by others: refused */
    CHECK_EQ(fchmod(a.fd, 0644), 0);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, DP_SHM_READ_ONLY, err), -1);
    CHECK(strstr(err, "0600") != NULL);
    CHECK(b.base == NULL);
    CHECK_EQ(fchmod(a.fd, 0600), 0);
    /* a writable segment is no parameter segment: its write seal is missing */
    dp_shm_t g;
    CHECK_EQ(dp_shm_create(&g, 0, "grad-0", NF, 1, DP_SHM_WRITABLE, err), 0);
    CHECK_EQ(dp_shm_open(&b, g.name, NF, 1, DP_SHM_READ_ONLY, err), -1);
    CHECK(strstr(err, "not sealed") != NULL);
    dp_shm_close(&g);
    char name[96];
    snprintf(name, sizeof name, "%s", a.name);
    dp_shm_close(&a);
    CHECK_EQ(dp_shm_open(&b, name, NF, 3, DP_SHM_READ_ONLY, err), -1); /* gone with its fd */
    dp_shm_close(&a); /* safe twice */
}

static void test_seqlock(void)
{
    char err[DP_ERR_LEN] = "";
    dp_shm_t a, b;
    CHECK_EQ(dp_shm_create(&a, 1, "seq", NF, 3, DP_SHM_READ_ONLY, err), 0);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, DP_SHM_READ_ONLY, err), 0);
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

/* More than half the memory (what tmpfs would hold by default): refused
 * at creation, nothing left behind. */
static void test_too_large(void)
{
    char err[DP_ERR_LEN] = "";
    dp_shm_t a;
    CHECK_EQ(dp_shm_create(&a, 2, "huge", (size_t)1 << 40, 3, DP_SHM_READ_ONLY, err), -1);
    CHECK(strstr(err, "shared memory") != NULL);
    CHECK(a.base == NULL && a.name[0] == 0);
}

/* What another process of this user (root, here) can do to the parameter
 * segment through its name: open it O_RDWR, and then nothing that writes —
 * pwrite, a writable mapping, mprotect, a punched hole, a new size. Each
 * path that changed something is a bit of the exit status. */
static int s_hostile(const char *name)
{
    float nan = NAN;
    int fd = open(name, O_RDWR);
    int bits = 0;
    if (fd < 0) fd = open(name, O_RDONLY);
    if (fd < 0) return 0x80;
    size_t bytes = dp_shm_bytes(NF, 3);
    if (pwrite(fd, &nan, sizeof nan, DP_SHM_HEADER) == (ssize_t)sizeof nan) bits |= 1;
    float *w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w != MAP_FAILED) {
        bits |= 2;
        w[DP_SHM_HEADER / 4] = nan;
    }
    float *r = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (r != MAP_FAILED && mprotect(r, bytes, PROT_READ | PROT_WRITE) == 0) {
        bits |= 4;
        r[DP_SHM_HEADER / 4 + 1] = nan;
    }
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, DP_SHM_HEADER, 4096) == 0)
        bits |= 8;
    if (ftruncate(fd, DP_SHM_HEADER) == 0) bits |= 16;
    return bits;
}

#define S_FAULTED 77 /* a child's exit status: its write faulted */
static void s_faulted(int sig)
{
    (void)sig;
    _exit(S_FAULTED);
}

/* The parameter segment is the shard's weights: a worker maps it read-only
 * (a write through its mapping faults), and no other process of the user
 * can write it at all; the creator's own mapping still writes. */
static void test_readers_cannot_write(void)
{
    char err[DP_ERR_LEN] = "";
    dp_shm_t a, b;
    CHECK_EQ(dp_shm_create(&a, 0, "params", NF, 3, DP_SHM_READ_ONLY, err), 0);
    for (int i = 0; i < NF; i++) dp_shm_slot(&a, 0)[i] = 1.0f;
    fflush(NULL);
    pid_t kid = fork();
    if (kid == 0) { /* a worker: maps it as the client does, then writes */
        /* our handler, not a sanitizer's report: the fault is the verdict */
        struct sigaction sa = {.sa_handler = s_faulted};
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        dp_shm_t w;
        if (dp_shm_open(&w, a.name, NF, 3, DP_SHM_READ_ONLY, err) != 0) _exit(2);
        *(volatile float *)dp_shm_slot(&w, 0) = NAN;
        _exit(0); /* the write went through */
    }
    int st = 0;
    CHECK_EQ(waitpid(kid, &st, 0), kid);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), S_FAULTED);
    kid = fork();
    if (kid == 0) _exit(s_hostile(a.name));
    CHECK_EQ(waitpid(kid, &st, 0), kid);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0); /* 1 pwrite, 2 mmap, 4 mprotect, 8 hole, 16 size: went through */
    int intact = 1;
    for (int i = 0; i < NF; i++) intact &= dp_shm_slot(&a, 0)[i] == 1.0f;
    CHECK(intact);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 3, DP_SHM_READ_ONLY, err), 0); /* and still its size */
    dp_shm_slot(&a, 0)[3] = 2.0f;
    CHECK(b.base && dp_shm_slot(&b, 0)[3] == 2.0f);
    dp_shm_close(&b);
    dp_shm_close(&a);
}

/* A gradient segment is the worker's to write, never to resize (a shrunk
 * segment would be a SIGBUS in the server's copy). */
static void test_gradient_segment(void)
{
    char err[DP_ERR_LEN] = "";
    dp_shm_t a, b;
    CHECK_EQ(dp_shm_create(&a, 0, "grad-1", NF, 1, DP_SHM_WRITABLE, err), 0);
    CHECK_EQ(dp_shm_open(&b, a.name, NF, 1, DP_SHM_WRITABLE, err), 0);
    if (b.base) dp_shm_slot(&b, 0)[5] = 5.0f;
    CHECK(dp_shm_slot(&a, 0)[5] == 5.0f);
    int fd = open(a.name, O_RDWR);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(ftruncate(fd, 0) != 0);
        CHECK(fallocate(fd, 0, 0, (off_t)dp_shm_bytes(NF, 1) * 2) != 0);
        close(fd);
    }
    dp_shm_close(&b);
    dp_shm_close(&a);
}

/* Who is on this host, from ZeroMQ's Peer-Address. */
static void test_peer_local(void)
{
    const char *yes[] = {"127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1", "localhost",
                         "localhost:1000:1000:4242"};
    const char *no[] = {"", "192.0.2.2", "::ffff:192.0.2.2", "10.0.0.1", "128.0.0.1", "::2",
                        "fe80::1", "localhostx", "127.0.0.1.evil", " 127.0.0.1", "::ffff:::1"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        CHECK_EQ(dp_shm_peer_local(yes[i]), 1);
        if (!dp_shm_peer_local(yes[i])) fprintf(stderr, "  '%s'\n", yes[i]);
    }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        CHECK_EQ(dp_shm_peer_local(no[i]), 0);
        if (dp_shm_peer_local(no[i])) fprintf(stderr, "  '%s'\n", no[i]);
    }
    CHECK_EQ(dp_shm_peer_local(NULL), 0);
}

DP_TESTS(T(test_create_open), T(test_seqlock), T(test_too_large), T(test_readers_cannot_write),
         T(test_gradient_segment), T(test_peer_local))
