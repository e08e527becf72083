/* test_gpu_devregion: the device region protocol (proto/devregion.h) on its
 * CUDA side (kernels/cuda/devmem_cuda.c), shard and worker in two processes
 * on one device: the worker maps the ring and its slot by CUDA IPC, reads
 * the version it pinned, pushes a gradient the shard takes through the IPC
 * event; then it writes the ring through its mapping and the test prints
 * whether that went through (the threat model's row: legacy IPC maps
 * read-write, and map must say what it gave: m->writable).
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
#include "proto/devregion.h"
#include "tests/test.h"

#define NF 4096

typedef struct {
    int attached, pinned_ok, pushed, wrote_ring, says_writable;
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

/* The worker: attach, check the pinned version, push 2 x weights, write the ring. */
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
    float *d_g = dp_devregion_slot(&w);
    for (int i = 0; i < NF; i++) host[i] *= 2;
    rep.pushed = d_g && dp_devmem_cuda.copy(d_g, host, sizeof host, err) == 0 &&
                 dp_devregion_push(&w, NULL, err) == 0;
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
