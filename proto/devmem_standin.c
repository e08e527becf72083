/* devmem_standin: the device memory of proto/devmem.h on the CPU — each
 * allocation a sealed memfd (proto/shm.h), mapped by both processes, its
 * handle the /proc/PID/fd/N name; an event is a counter of the control
 * page. What a mapper may write is the kernel's to enforce: an allocation
 * made DP_DEVMEM_READ_ONLY is sealed against every write but its owner's
 * (F_SEAL_FUTURE_WRITE), so the map gives a PROT_READ mapping that neither
 * mprotect nor a second open can make writable. */
#include "proto/devmem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "proto/shm.h"

static size_t s_floats(size_t bytes)
{
    return (bytes + sizeof(float) - 1) / sizeof(float);
}

static void s_take(dp_devmem_t *m, dp_shm_t *s, size_t bytes, int owner, int writable)
{
    m->impl = s;
    m->ptr = dp_shm_slot(s, 0);
    m->bytes = bytes;
    m->owner = owner;
    m->writable = writable;
}

static int s_alloc(dp_devmem_t *m, size_t bytes, int others, const char *what, char *err)
{
    memset(m, 0, sizeof *m);
    dp_shm_t *s = dp_calloc(1, sizeof *s);
    int access = others == DP_DEVMEM_WRITABLE ? DP_SHM_WRITABLE : DP_SHM_READ_ONLY;
    if (dp_shm_create(s, 0, what, s_floats(bytes), 1, access, err) != 0) {
        free(s);
        return -1;
    }
    s_take(m, s, bytes, 1, 1);
    return 0;
}

static int s_export(const dp_devmem_t *m, dp_devmem_handle_t *h, char *err)
{
    const dp_shm_t *s = m->impl;
    memset(h, 0, sizeof *h);
    if (!s || !m->owner) return dp_err(err, "device memory (stand-in): export of a mapping not ours");
    memcpy(h->b, s->name, strlen(s->name)); /* < 96 bytes, NUL padded */
    return 0;
}

static int s_map(dp_devmem_t *m, const dp_devmem_handle_t *h, size_t bytes, int access, char *err)
{
    memset(m, 0, sizeof *m);
    char name[DP_DEVMEM_HANDLE + 1];
    memcpy(name, h->b, DP_DEVMEM_HANDLE);
    name[DP_DEVMEM_HANDLE] = 0; /* dp_shm_open takes /proc/PID/fd/N and nothing else */
    dp_shm_t *s = dp_calloc(1, sizeof *s);
    int writable = access == DP_DEVMEM_WRITABLE;
    if (dp_shm_open(s, name, s_floats(bytes), 1, writable ? DP_SHM_WRITABLE : DP_SHM_READ_ONLY,
                    err) != 0) {
        free(s);
        return -1;
    }
    s_take(m, s, bytes, 0, writable);
    return 0;
}

static void s_release(dp_devmem_t *m)
{
    if (m->impl) dp_shm_close(m->impl);
    free(m->impl);
    memset(m, 0, sizeof *m);
}

static int s_copy(void *dst, const void *src, size_t bytes, char *err)
{
    (void)err;
    memcpy(dst, src, bytes);
    return 0;
}

static int s_all_finite(const float *p, size_t n, char *err)
{
    (void)err;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i])) return 0;
    return 1;
}

static int s_event_create(dp_devmem_event_t *e, _Atomic uint64_t *ctr, dp_devmem_handle_t *h,
                          char *err)
{
    (void)err;
    memset(e, 0, sizeof *e);
    memset(h, 0, sizeof *h); /* the counter's place is the protocol's: nothing to hand out */
    e->ctr = ctr;
    e->owner = 1;
    return 0;
}

static int s_event_open(dp_devmem_event_t *e, _Atomic uint64_t *ctr, const dp_devmem_handle_t *h,
                        char *err)
{
    (void)h;
    (void)err;
    memset(e, 0, sizeof *e);
    e->ctr = ctr;
    return 0;
}

static int s_event_record(dp_devmem_event_t *e, void *stream, char *err)
{
    (void)stream;
    (void)err;
    /* the writes before it were plain stores, done: release them with the count */
    atomic_fetch_add_explicit(e->ctr, 1, memory_order_release);
    return 0;
}

static int s_event_wait(dp_devmem_event_t *e, char *err)
{
    (void)e;
    (void)err;
    return 0;
}

static int s_event_query(dp_devmem_event_t *e, uint64_t want, char *err)
{
    (void)err;
    return atomic_load_explicit(e->ctr, memory_order_acquire) >= want;
}

static void s_event_destroy(dp_devmem_event_t *e)
{
    memset(e, 0, sizeof *e);
}

static int s_device_of(const dp_devmem_t *m, char *id, char *err)
{
    (void)m, (void)err;
    snprintf(id, DP_DEVMEM_DEVICE, "standin");
    return 0;
}

/* One memory for every process: the same device, unless the test hook
 * says the worker's is another (standin:peer, standin:nopeer), so that the
 * route dp_devregion_reach takes for two GPUs runs here. */
static int s_reach(const char *id, int *same, int *peer, char *err)
{
    (void)err;
    const char *v = getenv("DP_TEST_DEVMEM");
    int other = v && strncmp(v, "standin:", 8) == 0;
    *same = !other && strcmp(id, "standin") == 0;
    *peer = other && strcmp(v + 8, "peer") == 0;
    return 0;
}

static int s_peer_enable(const char *id, char *err)
{
    (void)id, (void)err;
    return 0; /* one memory: nothing to turn on */
}

const dp_devmem_ops_t dp_devmem_standin = {
    .name = "standin",
    .survives_free = 1,
    .alloc = s_alloc,
    .export_handle = s_export,
    .map = s_map,
    .unmap = s_release,
    .free = s_release,
    .copy = s_copy,
    .all_finite = s_all_finite,
    .event_create = s_event_create,
    .event_open = s_event_open,
    .event_record = s_event_record,
    .event_wait = s_event_wait,
    .event_query = s_event_query,
    .event_destroy = s_event_destroy,
    .device_of = s_device_of,
    .reach = s_reach,
    .peer_enable = s_peer_enable,
};

/* Test hook, read here only: DP_TEST_DEVMEM=standin makes the daemons of
 * this process (downpour-ps, downpour-worker's client) offer and take the
 * device region on the CPU stand-in, so that `make test` runs the
 * handshake, pulls through the ring and pushes through the slots end to end
 * on a machine without a GPU (standin:peer, standin:nopeer: the same, the
 * workers told that the region is on another device, which they can reach
 * by peer access or cannot: s_reach); =off offers and takes none, not even the
 * CUDA one a device shard and a GPU worker have (the host path beside it,
 * tests/gpu/run.sh). Unset (the default, and every other value): no
 * stand-in; the device's provider where there is one. */
const dp_devmem_ops_t *dp_devmem_test_provider(void)
{
    const char *v = getenv("DP_TEST_DEVMEM");
    if (!v) return NULL;
    int ok = strcmp(v, "standin") == 0 || strcmp(v, "standin:peer") == 0 ||
             strcmp(v, "standin:nopeer") == 0;
    return ok ? &dp_devmem_standin : NULL;
}

int dp_devmem_test_off(void)
{
    const char *v = getenv("DP_TEST_DEVMEM");
    return v && strcmp(v, "off") == 0;
}
