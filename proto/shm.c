/* shm: the sealed memfd segments of co-located workers (see shm.h). */
#include "proto/shm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

static size_t s_stride(size_t n)
{
    return (n * sizeof(float) + 63) & ~(size_t)63;
}

size_t dp_shm_bytes(size_t n, int slots)
{
    return DP_SHM_HEADER + s_stride(n) * (size_t)slots;
}

/* The seals every segment carries, and the one that keeps the others from
 * writing (glibc before 2.29 lacks its name). */
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#define S_SEALS_SIZE (F_SEAL_SHRINK | F_SEAL_GROW)

static int s_map(dp_shm_t *s, int fd, size_t bytes, int prot, char *err)
{
    void *p = mmap(NULL, bytes, prot, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return dp_err(err, "shared memory %s: mmap: %s", s->name, strerror(errno));
    s->base = p;
    s->bytes = bytes;
    s->hdr = p;
    return 0;
}

/* Half of this host's memory: the most one segment may take. */
static size_t s_half_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return SIZE_MAX;
    return (size_t)pages / 2 * (size_t)page;
}

int dp_shm_create(dp_shm_t *s, int shard, const char *what, size_t n, int slots, int others,
                  char *err)
{
    memset(s, 0, sizeof *s);
    if (slots < 1 || slots > DP_SHM_MAX_SLOTS || n == 0)
        return dp_err(err, "shared memory: bad layout (%d slots of %zu floats)", slots, n);
    char label[64];
    snprintf(label, sizeof label, "downpour-%d-%s", shard, what);
    int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return dp_err(err, "shared memory %s: memfd_create: %s", label, strerror(errno));
    s->owner = 1;
    s->fd = fd;
    snprintf(s->name, sizeof s->name, "/proc/%d/fd/%d", (int)getpid(), fd);
    size_t bytes = dp_shm_bytes(n, slots);
    /* A memfd has no file system size to run into, so the bound tmpfs
     * would give by default (half the memory) is kept here; fallocate
     * charges the memory now: a shortage fails here, not at the first write
     * of a slot. 0600: a memfd starts 0777, and the open through /proc
     * checks the mode too. */
    int e = ENOMEM;
    if (bytes <= s_half_memory())
        e = fchmod(fd, 0600) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    int rc = e != 0 ? dp_err(err, "shared memory %s (%zu bytes): %s", label, bytes, strerror(e))
                    : s_map(s, fd, bytes, PROT_READ | PROT_WRITE, err);
    /* Our mapping, made above, stays writable; once sealed no other
     * writable one can be made (F_SEAL_SEAL: nor the seals undone). */
    int seals = S_SEALS_SIZE | F_SEAL_SEAL | (others == DP_SHM_READ_ONLY ? F_SEAL_FUTURE_WRITE : 0);
    if (rc == 0 && fcntl(fd, F_ADD_SEALS, seals) != 0)
        rc = dp_err(err, "shared memory %s: sealing it: %s (Linux 5.1 or later needed)", label,
                    strerror(errno));
    if (rc != 0) {
        dp_shm_close(s);
        return -1;
    }
    s->n = n;
    s->stride = s_stride(n);
    s->slots = slots;
    dp_shm_header_t *h = s->hdr;
    h->magic = DP_SHM_MAGIC;
    h->layout = DP_SHM_LAYOUT;
    h->n = n;
    h->slots = (uint64_t)slots;
    h->stride = s_stride(n);
    for (int k = 0; k < DP_SHM_MAX_SLOTS; k++) atomic_init(&h->seq[k], 0);
    return 0;
}

/* What the file must be before we map it: a regular file of ours, 0600,
 * exactly the layout's size, which the seals keep (and, read-only, sealed
 * against writes: whatever we read, only its creator wrote). */
static int s_check_file(const dp_shm_t *s, int fd, size_t n, int slots, int access, char *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return dp_err(err, "shared memory %s: %s", s->name, strerror(errno));
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0)
        return dp_err(err, "shared memory %s: not a file of ours with mode 0600 (uid %d, mode %03o)",
                      s->name, (int)st.st_uid, (unsigned)(st.st_mode & 0777));
    if ((size_t)st.st_size != dp_shm_bytes(n, slots))
        return dp_err(err, "shared memory %s: %lld bytes, expected %zu", s->name,
                      (long long)st.st_size, dp_shm_bytes(n, slots));
    int seals = fcntl(fd, F_GET_SEALS);
    int want = S_SEALS_SIZE | (access == DP_SHM_READ_ONLY ? F_SEAL_FUTURE_WRITE : 0);
    if (seals < 0 || (seals & want) != want)
        return dp_err(err, "shared memory %s: not sealed (seals %#x, expected %#x)", s->name,
                      seals < 0 ? 0 : (unsigned)seals, (unsigned)want);
    return 0;
}

/* What the header must say. */
static int s_check_header(const dp_shm_t *s, size_t n, int slots, char *err)
{
    const dp_shm_header_t *h = s->hdr;
    if (h->magic != DP_SHM_MAGIC || h->layout != DP_SHM_LAYOUT || h->n != n ||
        h->slots != (uint64_t)slots || h->stride != s_stride(n))
        return dp_err(err, "shared memory %s: header does not describe %d slots of %zu floats",
                      s->name, slots, n);
    return 0;
}

/* "/proc/PID/fd/FD" exactly (digits, no sign, nothing after). */
static int s_name_ok(const char *name)
{
    int pid = 0, fd = -1, used = 0;
    if (!name || strlen(name) >= sizeof ((dp_shm_t *)0)->name ||
        sscanf(name, "/proc/%9d/fd/%9d%n", &pid, &fd, &used) != 2 || name[used] != 0)
        return 0;
    char canon[96];
    snprintf(canon, sizeof canon, "/proc/%d/fd/%d", pid, fd);
    return pid > 0 && fd >= 0 && strcmp(canon, name) == 0;
}

int dp_shm_open(dp_shm_t *s, const char *name, size_t n, int slots, int access, char *err)
{
    memset(s, 0, sizeof *s);
    if (!s_name_ok(name))
        return dp_err(err, "shared memory: bad segment name '%.100s'", name ? name : "");
    if (slots < 1 || slots > DP_SHM_MAX_SLOTS || n == 0)
        return dp_err(err, "shared memory: bad layout (%d slots of %zu floats)", slots, n);
    snprintf(s->name, sizeof s->name, "%s", name);
    int writable = access == DP_SHM_WRITABLE;
    /* A magic link, followed. Whatever the other side named (a FIFO, a
     * terminal) must neither block nor become ours: s_check_file then
     * takes only a regular file. */
    int fd = open(name, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        s->name[0] = 0;
        return dp_err(err, "shared memory %s: %s (is the server on another host, in another PID "
                           "namespace, or another user's?)",
                      name, strerror(e));
    }
    int rc = s_check_file(s, fd, n, slots, access, err);
    if (rc == 0)
        rc = s_map(s, fd, dp_shm_bytes(n, slots), writable ? PROT_READ | PROT_WRITE : PROT_READ, err);
    close(fd); /* the mapping keeps the memory */
    if (rc == 0) rc = s_check_header(s, n, slots, err);
    if (rc != 0) {
        dp_shm_close(s);
        return -1;
    }
    s->n = n;
    s->stride = s_stride(n);
    s->slots = slots;
    return 0;
}

void dp_shm_close(dp_shm_t *s)
{
    if (s->base) munmap(s->base, s->bytes);
    if (s->owner) close(s->fd); /* the memory goes with the last mapping */
    memset(s, 0, sizeof *s);
}

float *dp_shm_slot(const dp_shm_t *s, int k)
{
    return (float *)((char *)s->base + DP_SHM_HEADER + (size_t)k * s->stride);
}

void dp_shm_write_begin(dp_shm_t *s, int k)
{
    uint64_t q = atomic_load_explicit(&s->hdr->seq[k], memory_order_relaxed);
    atomic_store_explicit(&s->hdr->seq[k], q | 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* odd before any byte of the slot changes */
}

uint64_t dp_shm_write_end(dp_shm_t *s, int k)
{
    uint64_t q = (atomic_load_explicit(&s->hdr->seq[k], memory_order_relaxed) | 1) + 1;
    atomic_store_explicit(&s->hdr->seq[k], q, memory_order_release);
    return q;
}

uint64_t dp_shm_seq(const dp_shm_t *s, int k)
{
    return atomic_load_explicit(&s->hdr->seq[k], memory_order_acquire);
}

int dp_shm_read(const dp_shm_t *s, int k, uint64_t seq, size_t off, float *dst, size_t n)
{
    if (seq & 1 || dp_shm_seq(s, k) != seq) return 0;
    memcpy(dst, dp_shm_slot(s, k) + off, n * sizeof(float));
    atomic_thread_fence(memory_order_acquire); /* the copy before the second look */
    return atomic_load_explicit(&s->hdr->seq[k], memory_order_relaxed) == seq;
}

int dp_shm_peer_local(const char *a)
{
    if (!a) return 0;
    /* ipc: "localhost", then ":uid:gid:pid" where SO_PEERCRED exists */
    if (strcmp(a, "localhost") == 0 || strncmp(a, "localhost:", 10) == 0) return 1;
    if (strcmp(a, "::1") == 0) return 1;
    if (strncmp(a, "::ffff:", 7) == 0) a += 7; /* IPv4 on a dual-stack socket */
    struct in_addr v4;
    return inet_pton(AF_INET, a, &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}
