/* test_gpu_devregion: the device region protocol (proto/devregion.h) on its
 * CUDA side (kernels/cuda/devmem_cuda.c), shard and worker in two processes
 * on one device: the worker maps the ring and its slot by CUDA IPC, reads
 * the version it pinned, pushes a gradient the shard takes through the IPC
 * event; then it writes the ring through its mapping and the test prints
 * whether that went through (the threat model's row: legacy IPC maps
 * read-write, and map must say what it gave: m->writable). Beside it, a
 * device worker's own path (worker/train/distributed.c): the pinned entry
 * copied device to device into a cuda:0 backend's buffer (copy_peer, then
 * synchronize, then the unpin), and the gradient from that backend's
 * buffer into the slot the same way; the offer names the ring's device
 * (its PCI bus id) and the worker's route to it is its own device.
 *
 * The worker is forked before this process touches CUDA (a CUDA context
 * does not survive fork). Without a device: "0 passed, 0 failed, 1 skipped"
 * with the reason. Never run here: this file was written on a machine
 * without a GPU. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "proto/devregion.h"
#include "tests/test.h"

#define NF 4096

typedef struct {
    int attached, pinned_ok, pushed, wrote_ring, says_writable;
    int local, d2d_pull_ok;
} s_report_t;

static int s_recv(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static void s_send(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n) perror("test_gpu_devregion: write");
}

/* The worker: attach, check the pinned version, copy it device to device,
 * push 2 x weights device to device, write the ring. */
static int s_worker(int rd, int wr)
{
    s_report_t rep = {0};
    dp_devregion_offer_t o;
    dp_devregion_worker_t w;
    char err[DP_ERR_LEN] = "";
    static float host[NF];
    if (s_recv(rd, &o, sizeof o) != 0) return 0; /* no device: nothing offered */
    if (dp_devregion_attach(&w, &dp_devmem_cuda, &o, err) != 0) {
        fprintf(stderr, "  worker: %s\n", err);
        s_send(wr, &rep, sizeof rep);
        return 1;
    }
    rep.attached = 1;
    uint64_t v = 0;
    const float *d_x = dp_devregion_pin(&w, &v, err);
    if (d_x && dp_devmem_cuda.copy(host, d_x, sizeof host, err) == 0) {
        rep.pinned_ok = v == 1;
        for (int i = 0; i < NF; i++) rep.pinned_ok &= host[i] == (float)i;
    }
    /* a device worker's path (worker/train/distributed.c): the entry into
     * the network's buffer device to device, waited for before the unpin;
     * the gradient from the network's buffer into the slot the same way,
     * waited for before the record and the count */
    char why[DP_ERR_LEN] = "";
    rep.local = o.device[0] && dp_devregion_reach(&dp_devmem_cuda, o.device, why) ==
                                   DP_DEVREGION_LOCAL;
    float *d_g = dp_devregion_slot(&w);
    dp_backend_t *be = NULL;
    if (d_x && d_g && dp_backend_new(&be, "cuda:0", err) == 0) {
        float *d_net = be->ops->alloc(be, sizeof host);
        be->ops->copy_peer(be, d_net, d_x, sizeof host);
        be->ops->synchronize(be);
        static float back[NF];
        be->ops->download(be, back, d_net, sizeof back);
        rep.d2d_pull_ok = 1;
        for (int i = 0; i < NF; i++) rep.d2d_pull_ok &= back[i] == (float)i;
        for (int i = 0; i < NF; i++) host[i] *= 2;
        be->ops->upload(be, d_net, host, sizeof host); /* the "gradient" */
        be->ops->copy_peer(be, d_g, d_net, sizeof host);
        be->ops->synchronize(be);
        rep.pushed = dp_devregion_push(&w, NULL, err) == 0;
        be->ops->release(be, d_net);
        dp_backend_destroy(&be);
    }
    /* the measurement: a write through the ring's IPC mapping */
    rep.says_writable = w.weights.writable;
    rep.wrote_ring = d_x && cudaMemset((void *)d_x, 0xff, sizeof(float)) == cudaSuccess &&
                     cudaDeviceSynchronize() == cudaSuccess;
    if (!rep.pushed) fprintf(stderr, "  worker: %s\n", err);
    dp_devregion_unpin(&w);
    s_send(wr, &rep, sizeof rep);
    char q;
    s_recv(rd, &q, 1); /* the shard has taken the push: unmap */
    dp_devregion_detach(&w);
    return 0;
}

static int s_apply(void *ctx, const float *g, size_t n, char *err)
{
    (void)err;
    memcpy(ctx, g, n * sizeof *g);
    return 0;
}

static void s_shard(int to, int from)
{
    dp_devregion_shard_t r;
    char err[DP_ERR_LEN] = "";
    static float host[NF], got[NF], scratch[NF];
    CHECK_EQ(dp_devregion_create(&r, &dp_devmem_cuda, NF, 2, 1, err), 0);
    if (!r.ctl) return (void)fprintf(stderr, "  %s\n", err);
    for (int i = 0; i < NF; i++) host[i] = (float)i;
    float *d_e = dp_devregion_publish_begin(&r, 1);
    CHECK(d_e != NULL && dp_devmem_cuda.copy(d_e, host, sizeof host, err) == 0);
    dp_devregion_publish_end(&r);
    dp_devregion_offer_t o;
    CHECK_EQ(dp_devregion_offer(&r, 0, &o, err), 0);
    s_send(to, &o, sizeof o);
    s_report_t rep = {0};
    CHECK_EQ(s_recv(from, &rep, sizeof rep), 0);
    CHECK(rep.attached && rep.pinned_ok && rep.pushed);
    CHECK(o.device[0] != 0); /* the ring's device, by PCI bus id */
    CHECK(rep.local);        /* one GPU: the worker's own */
    CHECK(rep.d2d_pull_ok);  /* the entry device to device into a backend's buffer */
    /* and the push below is the backend's gradient, device to device */
    int took = dp_devregion_take(&r, 0, scratch, s_apply, got, err);
    CHECK_EQ(took, 1);
    if (took != 1) fprintf(stderr, "  take: %s\n", err);
    int ok = 1;
    for (int i = 0; i < NF; i++) ok &= got[i] == 2.0f * (float)i;
    CHECK(ok);
    float first = 0;
    CHECK_EQ(dp_devmem_cuda.copy(&first, d_e, sizeof first, err), 0);
    int changed = first != 0.0f;
    printf("measured: a worker's write through the ring's IPC mapping %s (map said writable=%d)\n",
           changed ? "went through" : "did not", rep.says_writable);
    CHECK(!changed || rep.says_writable); /* map never claims read-only for a writable mapping */
    s_send(to, "q", 1);
}

static void test_ipc_region(void)
{
    int down[2], up[2];
    CHECK(pipe(down) == 0 && pipe(up) == 0);
    fflush(NULL);
    pid_t kid = fork();
    if (kid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(s_worker(down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count > 0) s_shard(down[1], up[0]);
    close(down[1]); /* the worker, offered nothing, exits */
    close(up[0]);
    int st = 0;
    CHECK_EQ(waitpid(kid, &st, 0), kid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (e != cudaSuccess || count == 0) {
        char why[DP_ERR_LEN];
        snprintf(why, sizeof why, "no CUDA device (cudaGetDeviceCount: %s, %d devices)",
                 cudaGetErrorString(e), count);
        SKIP(why);
    }
}

DP_TESTS(T(test_ipc_region))
