/* devmem_cuda: the device memory of proto/devmem.h on CUDA — the thin side
 * of the device region protocol (proto/devregion.h), built only with CUDA.
 *
 * An allocation is a cudaMalloc exported with cudaIpcGetMemHandle; a worker
 * maps it with cudaIpcOpenMemHandle. That mapping is READ-WRITE whatever
 * was asked: legacy CUDA IPC has no read-only flag, so a worker holding the
 * ring's handle can write the shard's published weights (never the shard's
 * live buffers, which are not in the ring, nor another worker's slot: each
 * slot is an allocation of its own). map says so (m->writable = 1).
 * CUDA's virtual memory management (cuMemCreate, a POSIX file descriptor
 * handle, cuMemSetAccess with CU_MEM_ACCESS_FLAGS_PROT_READ) could map the
 * ring read-only; it is not used here: it needs the descriptor passed over
 * a unix socket and has not been measured on a device.
 *
 * Events are created with cudaEventInterprocess by the shard and opened by
 * the worker; a record's number (the control page's counter) is the
 * protocol's: cudaEventQuery says whether the last record is done.
 * cudaFree of an allocation a worker still maps is undefined behaviour in
 * CUDA: the protocol frees only what no live worker says it maps. Errors
 * fill err with file:line, the call and CUDA's message. */
#include "proto/devmem.h"

#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "common/util.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) <= DP_DEVMEM_HANDLE, "IPC handle too large");
_Static_assert(sizeof(cudaIpcEventHandle_t) <= DP_DEVMEM_HANDLE, "IPC event handle too large");

#define S_CK(call)                                                             \
    do {                                                                       \
        cudaError_t s_e = (call);                                              \
        if (s_e != cudaSuccess)                                                \
            return dp_err(err, "%s:%d: %s: %s", __FILE__, __LINE__, #call,     \
                          cudaGetErrorString(s_e));                            \
    } while (0)

static int s_alloc(dp_devmem_t *m, size_t bytes, int others, const char *what, char *err)
{
    (void)others; /* IPC maps are read-write whatever is asked: see above */
    memset(m, 0, sizeof *m);
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, bytes);
    if (e != cudaSuccess)
        return dp_err(err, "device memory %s (%zu bytes): cudaMalloc: %s", what, bytes,
                      cudaGetErrorString(e));
    m->ptr = d;
    m->bytes = bytes;
    m->owner = 1;
    m->writable = 1;
    return 0;
}

static int s_export(const dp_devmem_t *m, dp_devmem_handle_t *h, char *err)
{
    cudaIpcMemHandle_t ipc;
    memset(h, 0, sizeof *h);
    S_CK(cudaIpcGetMemHandle(&ipc, m->ptr));
    memcpy(h->b, &ipc, sizeof ipc);
    return 0;
}

static int s_map(dp_devmem_t *m, const dp_devmem_handle_t *h, size_t bytes, int access, char *err)
{
    (void)access; /* no read-only IPC mapping: m->writable says what we got */
    memset(m, 0, sizeof *m);
    cudaIpcMemHandle_t ipc;
    memcpy(&ipc, h->b, sizeof ipc);
    void *d = NULL;
    S_CK(cudaIpcOpenMemHandle(&d, ipc, cudaIpcMemLazyEnablePeerAccess));
    m->ptr = d;
    m->bytes = bytes;
    m->writable = 1;
    return 0;
}

static void s_unmap(dp_devmem_t *m)
{
    if (m->ptr) cudaIpcCloseMemHandle(m->ptr);
    memset(m, 0, sizeof *m);
}

static void s_free(dp_devmem_t *m)
{
    if (m->ptr) cudaFree(m->ptr);
    memset(m, 0, sizeof *m);
}

/* Done when it returns: the protocol publishes an entry, or unpins one,
 * right after its copy, and another process reads or writes it next on
 * streams of its own. cudaMemcpy alone may return before a copy from
 * pageable host memory or between device addresses has landed, so the
 * default stream it ran on is waited for. */
static int s_copy(void *dst, const void *src, size_t bytes, char *err)
{
    S_CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault)); /* unified addressing: either side */
    S_CK(cudaStreamSynchronize(0));
    return 0;
}

/* Finite, n floats on the host or the device (brought over in chunks: the
 * protocol's reference; a kernel can replace it). */
static int s_all_finite(const float *p, size_t n, char *err)
{
    struct cudaPointerAttributes a;
    S_CK(cudaPointerGetAttributes(&a, p));
    int on_device = a.type == cudaMemoryTypeDevice;
    float chunk[4096]; /* on the stack: shards may take on several threads */
    for (size_t i = 0; i < n;) {
        size_t k = n - i < sizeof chunk / sizeof *chunk ? n - i : sizeof chunk / sizeof *chunk;
        const float *q = p + i;
        if (on_device) {
            S_CK(cudaMemcpy(chunk, q, k * sizeof(float), cudaMemcpyDeviceToHost));
            q = chunk;
        }
        for (size_t j = 0; j < k; j++)
            if (!isfinite(q[j])) return 0;
        i += k;
    }
    return 1;
}

static int s_event_create(dp_devmem_event_t *e, _Atomic uint64_t *ctr, dp_devmem_handle_t *h,
                          char *err)
{
    memset(e, 0, sizeof *e);
    memset(h, 0, sizeof *h);
    cudaEvent_t ev;
    S_CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcEventHandle_t ipc;
    cudaError_t x = cudaIpcGetEventHandle(&ipc, ev);
    if (x != cudaSuccess) {
        cudaEventDestroy(ev);
        return dp_err(err, "device event: cudaIpcGetEventHandle: %s", cudaGetErrorString(x));
    }
    memcpy(h->b, &ipc, sizeof ipc);
    e->ctr = ctr;
    e->impl = ev;
    e->owner = 1;
    return 0;
}

static int s_event_open(dp_devmem_event_t *e, _Atomic uint64_t *ctr, const dp_devmem_handle_t *h,
                        char *err)
{
    memset(e, 0, sizeof *e);
    cudaIpcEventHandle_t ipc;
    memcpy(&ipc, h->b, sizeof ipc);
    cudaEvent_t ev;
    S_CK(cudaIpcOpenEventHandle(&ev, ipc));
    e->ctr = ctr;
    e->impl = ev;
    return 0;
}

static int s_event_record(dp_devmem_event_t *e, void *stream, char *err)
{
    S_CK(cudaEventRecord((cudaEvent_t)e->impl, (cudaStream_t)stream));
    atomic_fetch_add_explicit(e->ctr, 1, memory_order_release);
    return 0;
}

static int s_event_wait(dp_devmem_event_t *e, char *err)
{
    S_CK(cudaEventSynchronize((cudaEvent_t)e->impl));
    return 0;
}

static int s_event_query(dp_devmem_event_t *e, uint64_t want, char *err)
{
    /* the count first: a record not yet counted is not the one wanted */
    if (atomic_load_explicit(e->ctr, memory_order_acquire) < want) return 0;
    cudaError_t x = cudaEventQuery((cudaEvent_t)e->impl);
    if (x == cudaSuccess) return 1;
    if (x == cudaErrorNotReady) return 0;
    return dp_err(err, "device event: cudaEventQuery: %s", cudaGetErrorString(x));
}

static void s_event_destroy(dp_devmem_event_t *e)
{
    if (e->impl) cudaEventDestroy((cudaEvent_t)e->impl);
    memset(e, 0, sizeof *e);
}

/* Devices by PCI bus id: the one name every process on the host agrees
 * on (device numbers are each process's, after CUDA_VISIBLE_DEVICES). */
static int s_device_of(const dp_devmem_t *m, char *id, char *err)
{
    struct cudaPointerAttributes a;
    S_CK(cudaPointerGetAttributes(&a, m->ptr));
    S_CK(cudaDeviceGetPCIBusId(id, DP_DEVMEM_DEVICE, a.device));
    return 0;
}

static int s_reach(const char *id, int *same, int *peer, char *err)
{
    int dev = 0, mine = 0, can = 0;
    *same = *peer = 0;
    if (cudaDeviceGetByPCIBusId(&dev, id) != cudaSuccess) {
        cudaGetLastError(); /* not visible to this process: neither */
        return 0;
    }
    S_CK(cudaGetDevice(&mine));
    if (dev == mine) {
        *same = 1;
        return 0;
    }
    S_CK(cudaDeviceCanAccessPeer(&can, mine, dev));
    *peer = can;
    return 0;
}

/* This thread's device to id's, once: a second call finds it on already. */
static int s_peer_enable(const char *id, char *err)
{
    int dev = 0;
    S_CK(cudaDeviceGetByPCIBusId(&dev, id));
    cudaError_t e = cudaDeviceEnablePeerAccess(dev, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
        return 0;
    }
    S_CK(e);
    return 0;
}

const dp_devmem_ops_t dp_devmem_cuda = {
    .name = "cuda",
    .survives_free = 0,
    .alloc = s_alloc,
    .export_handle = s_export,
    .map = s_map,
    .unmap = s_unmap,
    .free = s_free,
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

/* The provider for a shard or a worker on device (kernels/backend.h's
 * dp_devmem_for_device finds it by name): the calling thread is put on
 * device, so the region's allocations and mappings made next on it land
 * there (cudaMalloc and cudaIpcOpenMemHandle take the thread's device). */
const dp_devmem_ops_t *dp_devmem_cuda_on(int device, char *err)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        dp_err(err, "device region on cuda:%d: cudaSetDevice: %s", device, cudaGetErrorString(e));
        return NULL;
    }
    return &dp_devmem_cuda;
}
