/* shm: POSIX shared-memory segments for co-located workers (see shm.h). */
#include "proto/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
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

static int s_map(dp_shm_t *s, int fd, size_t bytes, char *err)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return dp_err(err, "shared memory %s: mmap: %s", s->name, strerror(errno));
    s->base = p;
    s->bytes = bytes;
    s->hdr = p;
    return 0;
}

int dp_shm_create(dp_shm_t *s, int shard, const char *what, size_t n, int slots, char *err)
{
    memset(s, 0, sizeof *s);
    if (slots < 1 || slots > DP_SHM_MAX_SLOTS || n == 0)
        return dp_err(err, "shared memory: bad layout (%d slots of %zu floats)", slots, n);
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd) rnd = (uint32_t)dp_now();
    snprintf(s->name, sizeof s->name, "/downpour-%d-%d-%s-%08x", (int)getpid(), shard, what, rnd);
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int e = errno;
        dp_err(err, "shared memory %s: %s", s->name, strerror(e));
        s->name[0] = 0;
        return -1;
    }
    s->owner = 1;
    size_t bytes = dp_shm_bytes(n, slots);
    /* fchmod too: the umask must not widen or narrow what we meant */
    /* fallocate, not only ftruncate: a /dev/shm too small for the segment
     * (containers often give 64 MB) must fail here, not as a SIGBUS when a
     * step first writes the slot */
    int e = fchmod(fd, 0600) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    int rc = e != 0 ? dp_err(err, "shared memory %s (%zu bytes): %s", s->name, bytes, strerror(e))
                    : s_map(s, fd, bytes, err);
    close(fd);
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

/* What the header and the file must say before we use a segment. */
static int s_check_opened(const dp_shm_t *s, const struct stat *st, size_t n, int slots, char *err)
{
    if (st->st_uid != geteuid() || (st->st_mode & 077) != 0)
        return dp_err(err, "shared memory %s: not ours or not mode 0600 (uid %d, mode %03o)", s->name,
                      (int)st->st_uid, (unsigned)(st->st_mode & 0777));
    if ((size_t)st->st_size < dp_shm_bytes(n, slots))
        return dp_err(err, "shared memory %s: %lld bytes, expected %zu", s->name,
                      (long long)st->st_size, dp_shm_bytes(n, slots));
    const dp_shm_header_t *h = s->hdr;
    if (h->magic != DP_SHM_MAGIC || h->layout != DP_SHM_LAYOUT || h->n != n ||
        h->slots != (uint64_t)slots || h->stride != s_stride(n))
        return dp_err(err, "shared memory %s: header does not describe %d slots of %zu floats",
                      s->name, slots, n);
    return 0;
}

int dp_shm_open(dp_shm_t *s, const char *name, size_t n, int slots, char *err)
{
    memset(s, 0, sizeof *s);
    if (!name || name[0] != '/' || strlen(name) >= sizeof s->name || strchr(name + 1, '/'))
        return dp_err(err, "shared memory: bad segment name '%.100s'", name ? name : "");
    if (slots < 1 || slots > DP_SHM_MAX_SLOTS || n == 0)
        return dp_err(err, "shared memory: bad layout (%d slots of %zu floats)", slots, n);
    snprintf(s->name, sizeof s->name, "%s", name);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        int e = errno;
        s->name[0] = 0;
        return dp_err(err, "shared memory %s: %s (is the server on another host?)", name, strerror(e));
    }
    struct stat st;
    int rc = fstat(fd, &st) != 0 ? dp_err(err, "shared memory %s: %s", name, strerror(errno))
                                 : (size_t)st.st_size < DP_SHM_HEADER
                                       ? dp_err(err, "shared memory %s: too small", name)
                                       : s_map(s, fd, dp_shm_bytes(n, slots) > (size_t)st.st_size
                                                          ? DP_SHM_HEADER
                                                          : dp_shm_bytes(n, slots),
                                               err);
    close(fd);
    if (rc == 0) rc = s_check_opened(s, &st, n, slots, err);
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
    if (s->owner && s->name[0] && shm_unlink(s->name) != 0)
        dp_log_warn("shared memory %s: unlink: %s", s->name, strerror(errno));
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

int dp_shm_sweep_stale(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = 0, used = 0;
        if (sscanf(e->d_name, "downpour-%d-%n", &pid, &used) != 1 || used == 0 || pid <= 0) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to ask */
        char path[300], name[300];
        struct stat st;
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (stat(path, &st) != 0 || st.st_uid != geteuid()) continue;
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0) removed++;
    }
    closedir(d);
    return removed;
}
