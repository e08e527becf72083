/* bench/wire: `downpour bench wire` — what the parameter server's wire costs
 * next to a plain ZeroMQ round trip of the same bytes (iperf for the PS).
 *
 * It starts K real downpour-ps shards on loopback (async, one worker, each
 * binding a free port or an ipc path and saying which in its --ready-file),
 * connects one client as worker 0, and times pulls and pushes of the whole
 * parameter vector: a pull whose tensors are lent from ZeroMQ's receive
 * buffer (dp_ps_client_pull_to), and beside it a pull copied into a buffer
 * of the caller's, as the CPU worker makes it. In the same run a child
 * process of its own echoes a message of the same bytes over a DEALER /
 * ROUTER pair: one raw round trip moves what one pull plus one push move, so
 *     ratio = (pull + push) / raw round trip.
 * Rounds alternate (pulls, push, raw echo, memcpy) so that other load on the
 * machine falls on both sides; every figure is a median over the rounds
 * after the warm-up. With --json the last line is one JSON object. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <cjson/cJSON.h>

#include "common/metrics.h"
#include "common/model.h"
#include "common/opts.h"
#include "common/util.h"
#include "deploy/bench/shards.h"
#include "deploy/launcher/commands.h"
#include "deploy/launcher/spawn.h"
#include "kernels/optim.h"
#include "proto/compress.h"
#include "proto/zsock.h"
#include "worker/client/ps_client.h"


typedef struct {
    long bytes;             /* --bytes: a synthetic model of about this many bytes */
    const char *model;      /* --model (when --bytes is not given) */
    int shards;
    const char *optimizer;
    int transport;          /* 0 tcp, 1 ipc, 2 shm (control on tcp 127.0.0.1, tensors in shared memory) */
    int rounds, warmup;
    int json;
    int threads;            /* --threads for the servers; 0 = their default */
    int crc;                /* 0 auto (the client's default), 1 on, 2 off */
    int bf16;               /* --wire bf16: tensors as bfloat16 (and the raw echo moves as many bytes) */
    dp_compress_conf_t compress; /* --compress: pushes compressed (error feedback on) */
} s_conf_t;

typedef struct {
    double *pull, *push, *raw, *copy; /* ms per measured round */
    double *pull_copy;      /* a pull into a buffer of the caller's */
    double *enc, *dec;      /* --compress: encoding the vector, expanding it (ms) */
    uint64_t push_bytes;    /* a push's bytes (dp_push_result_t.bytes) */
    int n;
} s_times_t;

static const char s_synopsis[] =
    "usage: downpour bench wire [--bytes N | --model SPEC] [--shards K] [--optimizer NAME]\n"
    "                           [--transport tcp|ipc|shm] [--rounds N] [--warmup N] [--json]\n"
    "                           [--threads N] [--crc auto|on|off] [--wire fp32|bf16]\n"
    "                           [--compress none|topk:F|sign]\n"
    "Times pull and push of the whole parameter vector against real downpour-ps shards on\n"
    "this machine, beside a plain ZeroMQ round trip of the same bytes and a memcpy of them.\n"
    "\n";

static int s_set_compress(void *arg, const char *v, char *err)
{
    return dp_compress_parse(v, &((s_conf_t *)arg)->compress, err);
}

static dp_opts_result_t s_parse(s_conf_t *c, int argc, char **argv, char *err)
{
    const dp_opts_flag_t t[] = {
        DP_FLAG_NUM("bytes", DP_OPTS_LONG, "N", &c->bytes, 64, 4L << 30, 0,
                    "a model of about N bytes of parameters (one fc layer)"),
        DP_FLAG_STR("model", "SPEC", &c->model, 0, "the model (default: the default model)"),
        DP_FLAG_NUM("shards", DP_OPTS_INT, "K", &c->shards, 1, DP_BENCH_MAX_SHARDS, 0,
                    "parameter-server shards (default 1)"),
        DP_FLAG_STR("optimizer", "NAME", &c->optimizer, 0,
                    "the servers' optimizer: sgd|momentum|nesterov|adam|adagrad|rmsprop (default sgd)"),
        DP_FLAG_CHOICE("transport", "tcp|ipc|shm", &c->transport, 0,
                       "tcp on 127.0.0.1 (default), ipc (unix sockets), or shm\n"
                       "(shared memory, control messages on tcp 127.0.0.1)"),
        DP_FLAG_NUM("rounds", DP_OPTS_INT, "N", &c->rounds, 1, 100000, 0,
                    "measured rounds (default 20)"),
        DP_FLAG_NUM("warmup", DP_OPTS_INT, "N", &c->warmup, 0, 100000, 0,
                    "rounds before them, not counted (default 3)"),
        DP_FLAG_SET("json", &c->json, 1, 0, "end with one JSON line"),
        DP_FLAG_NUM("threads", DP_OPTS_INT, "N", &c->threads, 1, 256, 0,
                    "the servers' optimizer threads (default: theirs)"),
        DP_FLAG_CHOICE("crc", "auto|on|off", &c->crc, 0,
                       "CRC-32 on the tensors (default auto: off on this host)"),
        DP_FLAG_CHOICE("wire", "fp32|bf16", &c->bf16, 0,
                       "precision of the tensors in frames (the raw round trip moves\n"
                       "the same number of bytes)"),
        DP_FLAG_CALL("compress", "none|topk:F|sign", s_set_compress, c, 0,
                     "compressed pushes (error feedback on): their bytes, and the time\n"
                     "to encode and to expand the vector beside the push's"),
    };
    dp_opts_t o;
    dp_opts_init(&o, "downpour bench wire", s_synopsis, NULL);
    dp_opts_add(&o, t, (int)(sizeof t / sizeof t[0]));
    dp_opts_result_t r = dp_opts_parse(&o, argc, argv, err);
    if (r == DP_OPTS_PARSED && c->bytes && c->model)
        r = dp_err(err, "--bytes and --model: give one of them");
    if (r == DP_OPTS_PARSED) {
        dp_optim_conf_t oc;
        r = dp_optim_parse_kind(&oc, c->optimizer, err);
    }
    return r;
}

/* ---- the raw ZeroMQ echo ------------------------------------------------ */

/* The child: a ROUTER that sends every message back as it came (the same
 * zmq_msg, no copy) until an empty one. Its endpoint goes up the pipe. */
static void s_echo_main(int transport, const char *dir, int fd)
{
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[PATH_MAX + 16];
    if (transport == 1) snprintf(ep, sizeof ep, "ipc://%s/echo", dir);
    else snprintf(ep, sizeof ep, "tcp://127.0.0.1:*");
    size_t len = sizeof ep;
    if (!ctx || !sock || zmq_bind(sock, ep) != 0 ||
        zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &len) != 0)
        _exit(1);
    if (write(fd, ep, strlen(ep) + 1) < 0) _exit(1);
    close(fd);
    for (;;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, sock, 0) < 0 || zmq_msg_recv(&body, sock, 0) < 0) break;
        int last = zmq_msg_size(&body) == 0;
        if (zmq_msg_send(&id, sock, ZMQ_SNDMORE) < 0 || zmq_msg_send(&body, sock, 0) < 0) break;
        if (last) break;
    }
    zmq_close(sock);
    dp_zsock_ctx_term(&ctx, "bench wire: echo");
    _exit(0);
}

/* Forks the echo child before this process has a ZeroMQ context. */
static int s_echo_start(int transport, const char *dir, pid_t *pid, char *ep, size_t n, char *err)
{
    int fds[2];
    if (pipe(fds) != 0) return dp_err(err, "pipe: %s", strerror(errno));
    *pid = fork();
    if (*pid < 0) return dp_err(err, "fork: %s", strerror(errno));
    if (*pid == 0) {
        close(fds[0]);
        s_echo_main(transport, dir, fds[1]);
    }
    close(fds[1]);
    ssize_t got = read(fds[0], ep, n - 1);
    close(fds[0]);
    if (got <= 0) return dp_err(err, "the raw ZeroMQ echo process did not start");
    ep[got] = 0;
    return 0;
}

/* One raw round trip of len bytes; ms, or -1. */
static double s_echo_once(void *sock, const void *data, size_t len)
{
    zmq_msg_t m;
    double t0 = dp_now();
    if (zmq_msg_init_data(&m, (void *)data, len, NULL, NULL) != 0) return -1;
    if (zmq_msg_send(&m, sock, 0) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    zmq_msg_init(&m);
    int got = zmq_msg_recv(&m, sock, 0);
    zmq_msg_close(&m);
    return got < 0 ? -1 : (dp_now() - t0) * 1e3;
}

/* ---- measuring ---------------------------------------------------------- */

/* The lent pull's sink: counts what arrives (the whole vector, checked
 * after each pull) and touches nothing, as ZeroMQ's raw receive does not. */
static void s_count_sink(void *arg, size_t off, const float *data, size_t n)
{
    (void)off, (void)data;
    *(size_t *)arg += n;
}

/* A lent pull; ms, or -1 with err. */
static double s_pull_lent(dp_ps_client_t *pc, size_t n, char *err)
{
    size_t got = 0;
    double t0 = dp_now();
    if (dp_ps_client_pull_to(pc, s_count_sink, &got, err) != 0) return -1;
    double t1 = dp_now();
    if (got != n) return dp_err(err, "a pull delivered %zu of %zu floats", got, n);
    return (t1 - t0) * 1e3;
}

/* Rounds of pulls, push, raw echo and memcpy, interleaved. */
static int s_measure(const s_conf_t *c, dp_ps_client_t *pc, void *raw, size_t n, s_times_t *t,
                     char *err)
{
    float *params = dp_aligned_alloc(n * sizeof(float));
    float *grads = dp_aligned_alloc(n * sizeof(float));
    float *copy = dp_aligned_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) grads[i] = 1e-4f * (float)((i % 7) - 3);
    /* the codec alone, on the whole vector: what the client's encoding of
     * every slice and the shards' expansions cost together */
    dp_compressor_t z;
    if (c->compress.kind != DP_COMPRESS_NONE) dp_compressor_init(&z, &c->compress, n);
    int rc = 0;
    for (int r = 0; r < c->warmup + c->rounds && rc == 0; r++) {
        dp_push_result_t res;
        double t0 = dp_now();
        if (dp_ps_client_pull(pc, params, err) != 0) rc = -1;
        double pull_copy = (dp_now() - t0) * 1e3;
        double pull = rc == 0 ? s_pull_lent(pc, n, err) : -1;
        if (pull < 0) rc = -1;
        double t1 = dp_now();
        dp_ps_push_t push = {.grads = grads, .loss = 0.0f, .batch = 1};
        if (rc == 0 && dp_ps_client_push(pc, &push, &res, err) != 0) rc = -1;
        double t2 = dp_now();
        double echo = s_echo_once(raw, grads, n * (c->bf16 ? 2 : sizeof(float)));
        if (rc == 0 && echo < 0) rc = dp_err(err, "the raw ZeroMQ round trip failed: %s",
                                             zmq_strerror(errno));
        double t3 = dp_now();
        memcpy(copy, params, n * sizeof(float));
        __asm__ volatile("" : : "r"(copy) : "memory"); /* the copy counts as read */
        double t4 = dp_now(), t5 = t4, t6 = t4;
        if (c->compress.kind != DP_COMPRESS_NONE) {
            dp_compressor_encode(&z, grads);
            t5 = dp_now();
            dp_compressor_expand(&z, copy);
            __asm__ volatile("" : : "r"(copy) : "memory");
            t6 = dp_now();
        }
        if (r < c->warmup || rc != 0) continue;
        t->enc[t->n] = (t5 - t4) * 1e3;
        t->dec[t->n] = (t6 - t5) * 1e3;
        t->push_bytes = res.bytes;
        t->pull[t->n] = pull;
        t->pull_copy[t->n] = pull_copy;
        t->push[t->n] = (t2 - t1) * 1e3;
        t->raw[t->n] = echo;
        t->copy[t->n] = (t4 - t3) * 1e3;
        t->n++;
    }
    if (c->compress.kind != DP_COMPRESS_NONE) dp_compressor_fini(&z);
    free(params);
    free(grads);
    free(copy);
    return rc;
}

static const char *const s_transport_name[] = {"tcp 127.0.0.1", "ipc",
                                                "shm (control on tcp 127.0.0.1)"};

static void s_report(const s_conf_t *c, const dp_model_t *m, s_times_t *t)
{
    /* pull + push per round first: the medians below sort the arrays. */
    double *sum = dp_malloc(sizeof(double) * (size_t)(t->n > 0 ? t->n : 1));
    for (int i = 0; i < t->n; i++) sum[i] = t->pull[i] + t->push[i];
    double rt = dp_bench_median(sum, t->n), raw = dp_bench_median(t->raw, t->n), cp = dp_bench_median(t->copy, t->n);
    double pull = dp_bench_median(t->pull, t->n), push = dp_bench_median(t->push, t->n);
    for (int i = 0; i < t->n; i++) sum[i] = t->pull_copy[i] + t->push[i];
    double rt_copy = dp_bench_median(sum, t->n), pull_copy = dp_bench_median(t->pull_copy, t->n);
    double enc = dp_bench_median(t->enc, t->n), dec = dp_bench_median(t->dec, t->n);
    free(sum);
    char zname[48];
    dp_compress_name(&c->compress, zname, sizeof zname);
    double mb = (double)m->n_floats * 4 / 1e6;
    printf("wire: %.2f MB of parameters, %d shard%s, %s, optimizer %s; medians of %d rounds\n", mb,
           c->shards, c->shards > 1 ? "s" : "", s_transport_name[c->transport],
           c->optimizer, t->n);
    printf("  pull %.3f ms   push %.3f ms   pull+push %.3f ms\n", pull, push, rt);
    printf("  plain ZeroMQ round trip of the same bytes %.3f ms   ratio %.2fx\n", raw, rt / raw);
    printf("  a pull copied into the caller's buffer %.3f ms   ratio with it %.2fx\n", pull_copy,
           rt_copy / raw);
    printf("  memcpy of the same bytes %.3f ms (%.1f GB/s); pull + push against two memcpys %.2fx\n",
           cp, mb / cp, rt / (2 * cp));
    if (c->compress.kind != DP_COMPRESS_NONE)
        printf("  --compress %s: a push moves %llu bytes (%.2f %% of the float32 push); encode "
               "%.3f ms, expand %.3f ms beside the push's %.3f ms\n", zname,
               (unsigned long long)t->push_bytes, 100.0 * (double)t->push_bytes / ((double)m->n_floats * 4),
               enc, dec, push);
    if (!c->json) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "bytes", (double)m->n_floats * 4);
    cJSON_AddNumberToObject(o, "shards", c->shards);
    cJSON_AddStringToObject(o, "transport", c->transport == 0 ? "tcp" : c->transport == 1 ? "ipc" : "shm");
    cJSON_AddStringToObject(o, "optimizer", c->optimizer);
    cJSON_AddStringToObject(o, "crc", c->crc == 0 ? "auto" : c->crc == 1 ? "on" : "off");
    cJSON_AddStringToObject(o, "wire", c->bf16 ? "bf16" : "fp32");
    cJSON_AddStringToObject(o, "compress", zname);
    cJSON_AddNumberToObject(o, "push_bytes", (double)t->push_bytes);
    if (c->compress.kind != DP_COMPRESS_NONE) {
        cJSON_AddNumberToObject(o, "encode_ms", dp_metrics_round(enc, 4));
        cJSON_AddNumberToObject(o, "expand_ms", dp_metrics_round(dec, 4));
    }
    if (c->threads) cJSON_AddNumberToObject(o, "threads", c->threads);
    cJSON_AddNumberToObject(o, "rounds", t->n);
    cJSON_AddNumberToObject(o, "pull_ms", dp_metrics_round(pull, 4));
    cJSON_AddNumberToObject(o, "push_ms", dp_metrics_round(push, 4));
    cJSON_AddNumberToObject(o, "roundtrip_ms", dp_metrics_round(rt, 4));
    cJSON_AddNumberToObject(o, "raw_zmq_roundtrip_ms", dp_metrics_round(raw, 4));
    cJSON_AddNumberToObject(o, "ratio", dp_metrics_round(rt / raw, 3));
    cJSON_AddNumberToObject(o, "pull_copy_ms", dp_metrics_round(pull_copy, 4));
    cJSON_AddNumberToObject(o, "ratio_copy", dp_metrics_round(rt_copy / raw, 3));
    cJSON_AddNumberToObject(o, "memcpy_ms", dp_metrics_round(cp, 4));
    /* a pull and a push move the vector twice, so two memcpys are the
     * memory-speed floor of one round */
    cJSON_AddNumberToObject(o, "memcpy_ratio", dp_metrics_round(rt / (2 * cp), 3));
    char *line = cJSON_PrintUnformatted(o);
    printf("%s\n", line);
    cJSON_free(line);
    cJSON_Delete(o);
}

/* The cluster and the echo up, the rounds run, everything stopped. */
static int s_run(const s_conf_t *c, const char *argv0, char *err)
{
    dp_model_t m;
    char input[48];
    if (dp_bench_model(&m, c->model, c->bytes / 4, input, sizeof input, err) != 0) return -1;
    dp_bench_shards_t cl;
    if (dp_bench_shards_init(&cl, "bench-wire", argv0, err) != 0) return -1;
    char raw_ep[PATH_MAX + 16];
    pid_t echo = -1;
    void *ctx = NULL, *raw = NULL;
    dp_ps_client_t *pc = NULL;
    s_times_t t = {.n = 0};
    int rc = -1;
    if (s_echo_start(c->transport, cl.dir, &echo, raw_ep, sizeof raw_ep, err) != 0) goto done;
    dp_bench_shards_conf_t sc = {.shards = c->shards, .ipc = c->transport == 1, .workers = 1,
                                 .threads = c->threads, .optimizer = c->optimizer,
                                 .spec = m.spec, .input = input};
    if (dp_bench_shards_start(&cl, &sc, err) != 0) goto done;
    /* tcp and ipc rows measure frames even on this host */
    dp_ps_client_opts_t opts = {
        .timeout_s = 30,
        .transport = c->transport == 2 ? DP_PS_TRANSPORT_SHM : DP_PS_TRANSPORT_ZMQ,
        .wire = c->bf16 ? DP_PS_WIRE_BF16 : DP_PS_WIRE_FP32,
        .crc = c->crc == 1 ? DP_PS_CRC_ON : c->crc == 2 ? DP_PS_CRC_OFF : DP_PS_CRC_AUTO,
        .compress = {c->compress.kind, c->compress.fraction, 1}};
    if (dp_ps_client_new(&pc, cl.endpoints, &m, 0, &opts, NULL, err) != 0) goto done;
    ctx = zmq_ctx_new();
    raw = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
    if (!raw || zmq_connect(raw, raw_ep) != 0) {
        dp_err(err, "connect to the raw echo %s: %s", raw_ep, zmq_strerror(errno));
        goto done;
    }
    t.pull = dp_malloc(sizeof(double) * (size_t)c->rounds);
    t.pull_copy = dp_malloc(sizeof(double) * (size_t)c->rounds);
    t.push = dp_malloc(sizeof(double) * (size_t)c->rounds);
    t.raw = dp_malloc(sizeof(double) * (size_t)c->rounds);
    t.copy = dp_malloc(sizeof(double) * (size_t)c->rounds);
    t.enc = dp_calloc((size_t)c->rounds, sizeof(double));
    t.dec = dp_calloc((size_t)c->rounds, sizeof(double));
    if (s_measure(c, pc, raw, m.n_floats, &t, err) != 0) goto done;
    s_report(c, &m, &t);
    rc = 0;
done:
    if (raw) {
        s_echo_once(raw, "", 0); /* the echo's last message */
        int zero = 0;
        zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(raw);
    }
    dp_zsock_ctx_term(&ctx, "bench wire");
    /* The shards gone before the client's context ends: a context ended
     * while its peers are leaving loses a reconnect's allocation inside
     * libzmq 4.3.4 (LeakSanitizer saw it in about 1 run of 3 on a loaded
     * machine; none in 100 in this order). */
    if (pc && rc == 0) dp_ps_client_shutdown_servers(pc, NULL);
    dp_bench_shards_stop(&cl);
    dp_ps_client_destroy(&pc);
    if (echo > 0) {
        kill(echo, SIGTERM);
        waitpid(echo, NULL, 0);
    }
    free(t.pull), free(t.pull_copy), free(t.push), free(t.raw), free(t.copy), free(t.enc), free(t.dec);
    dp_bench_shards_fini(&cl);
    return rc;
}

int dp_bench_wire_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "wire") != 0) {
        fprintf(stderr, "downpour bench: expected `downpour bench wire` (see downpour bench wire --help)\n");
        return 2;
    }
    s_conf_t c = {.shards = 1, .optimizer = "sgd", .rounds = 20, .warmup = 3};
    char err[DP_ERR_LEN] = "";
    dp_opts_result_t r = s_parse(&c, argc - 1, argv + 1, err);
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("downpour bench wire", r, err);
    if (s_run(&c, argv[0], err) != 0) {
        fprintf(stderr, "downpour bench wire: %s\n", err);
        return 1;
    }
    return 0;
}
