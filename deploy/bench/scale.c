/* bench/scale: `downpour bench scale` — how many pushes per second K real
 * downpour-ps shards sustain when N worker processes send them gradients as
 * fast as they are acknowledged (no compute, async mode).
 *
 * The shards are started as `downpour bench wire` starts them (loopback,
 * --ready-file). The workers are processes forked from this one before it
 * holds any ZeroMQ state; each is what downpour-worker is on the wire: a
 * dp_ps_client (one DEALER per shard, HELLO, one pull for the versions)
 * and a dp_ps_beat heartbeat thread, pushing one precomputed gradient (the
 * whole parameter vector, cut into each shard's slice by the client) in a
 * loop. Processes rather than threads because that is what a cluster is:
 * each worker has its own ZeroMQ context, I/O thread and allocator, and the
 * kernel schedules them against the servers as it would real workers.
 *
 * Timing: every worker waits for one start time t0 (the monotonic clock is
 * the same in every process), records the start and end of each push, and
 * stops starting pushes at t0 + warmup + seconds. The measured span after the
 * warm-up is cut into windows; each push counts in the windows its
 * [start, end] overlaps, in proportion to the overlap, so a window's rate
 * has no +-1 push granularity even when pushes are long. The figure is the
 * median rate over the windows; latency is the median and 99th percentile
 * of the pushes that started in the measured span. With --json the last
 * line is one JSON object. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/metrics.h"
#include "common/model.h"
#include "common/opts.h"
#include "common/signals.h"
#include "common/util.h"
#include "deploy/bench/shards.h"
#include "deploy/launcher/commands.h"
#include "deploy/launcher/spawn.h"
#include "kernels/optim.h"
#include "worker/client/ps_beat.h"
#include "worker/client/ps_client.h"

#define S_MAX_WORKERS 1024
#define S_MAX_WINDOWS 1000

/* SIGINT / SIGTERM: the launcher stops waiting and cleans up (the workers,
 * in its process group, die of the Ctrl-C themselves). */
static volatile sig_atomic_t s_stop;

typedef struct {
    long params;            /* --params: a synthetic model of about this many floats */
    const char *model;      /* --model (when --params is not given) */
    int workers, shards;
    double seconds, warmup; /* measured span and the warm-up before it */
    int windows;
    const char *optimizer;
    int transport;          /* 0 tcp, 1 ipc */
    int pull;               /* 1: a pull before every push (a step without compute) */
    double timeout;         /* a reply later than this fails the run */
    int json;
} s_conf_t;

static const char s_synopsis[] =
    "usage: downpour bench scale [--workers N] [--shards K] [--params P | --model SPEC]\n"
    "                            [--seconds S] [--warmup S] [--windows W] [--optimizer NAME]\n"
    "                            [--transport tcp|ipc] [--pull] [--json]\n"
    "Starts K real downpour-ps shards (async) and N worker processes on this machine; each\n"
    "worker pushes a precomputed gradient as fast as the shards acknowledge it. Reports the\n"
    "pushes per second the shards sustained (median over windows after the warm-up) and the\n"
    "latency of one push. On a machine with fewer cores than processes this measures the\n"
    "machine's CPU as much as the servers: compare the load line it prints.\n"
    "\n";

static dp_opts_result_t s_parse(s_conf_t *c, int argc, char **argv, char *err)
{
    const dp_opts_flag_t t[] = {
        DP_FLAG_NUM("workers", DP_OPTS_INT, "N", &c->workers, 1, S_MAX_WORKERS, 0,
                    "worker processes (default 4)"),
        DP_FLAG_NUM("shards", DP_OPTS_INT, "K", &c->shards, 1, DP_BENCH_MAX_SHARDS, 0,
                    "parameter-server shards (default 1)"),
        DP_FLAG_NUM("params", DP_OPTS_LONG, "P", &c->params, 100, 1000000000L, 0,
                    "a model of about P parameters (one fc layer; 4 P bytes per push)"),
        DP_FLAG_STR("model", "SPEC", &c->model, 0,
                    "the model, 1x28x28 input (default: the default model)"),
        DP_FLAG_NUM("seconds", DP_OPTS_DOUBLE, "S", &c->seconds, 0.1, 3600, 0,
                    "the measured span (default 5)"),
        DP_FLAG_NUM("warmup", DP_OPTS_DOUBLE, "S", &c->warmup, 0, 600, 0,
                    "seconds of pushing before it, not counted (default 1)"),
        DP_FLAG_NUM("windows", DP_OPTS_INT, "W", &c->windows, 1, S_MAX_WINDOWS, 0,
                    "the measured span is cut into W windows; the rate is their median (default 10)"),
        DP_FLAG_STR("optimizer", "NAME", &c->optimizer, 0,
                    "the servers' optimizer: sgd|momentum|nesterov|adam|adagrad|rmsprop (default sgd)"),
        DP_FLAG_CHOICE("transport", "tcp|ipc", &c->transport, 0,
                       "tcp on 127.0.0.1 (default) or ipc (unix sockets)"),
        DP_FLAG_SET("pull", &c->pull, 1, 0,
                    "pull the whole vector before every push (a worker's step without compute)"),
        DP_FLAG_NUM("timeout", DP_OPTS_DOUBLE, "S", &c->timeout, 1, 3600, 0,
                    "a reply later than S seconds fails the run (default 60)"),
        DP_FLAG_SET("json", &c->json, 1, 0, "end with one JSON line"),
    };
    dp_opts_t o;
    dp_opts_init(&o, "downpour bench scale", s_synopsis, NULL);
    dp_opts_add(&o, t, (int)(sizeof t / sizeof t[0]));
    dp_opts_result_t r = dp_opts_parse(&o, argc, argv, err);
    if (r == DP_OPTS_PARSED && c->params && c->model)
        r = dp_err(err, "--params and --model: give one of them");
    if (r == DP_OPTS_PARSED) {
        dp_optim_conf_t oc;
        r = dp_optim_parse_kind(&oc, c->optimizer, err);
    }
    return r;
}

/* ---- one worker process --------------------------------------------------- */

/* What a worker says once connected (one write, under PIPE_BUF: atomic). */
typedef struct {
    int worker;
    int ok;
    char err[DP_ERR_LEN];
} s_ready_t;

/* A worker's results file: this header, then n records of 3 doubles
 * (start, after the pull, end) for every push it started. */
typedef struct {
    long n;
    long applied, dropped, rejected; /* shard replies, summed */
    int failed;
    char err[DP_ERR_LEN];            /* the failure, or the first non-applied reason */
} s_result_t;

typedef struct {
    s_result_t r;
    double *t;      /* 3 per push */
    long cap;
} s_record_t;

static void s_record(s_record_t *rec, double t0, double t1, double t2)
{
    if (rec->r.n == rec->cap) {
        rec->cap = rec->cap ? 2 * rec->cap : 4096;
        rec->t = dp_realloc(rec->t, sizeof(double) * 3 * (size_t)rec->cap);
    }
    double *p = rec->t + 3 * rec->r.n++;
    p[0] = t0, p[1] = t1, p[2] = t2;
}

/* Pushes from t0 until t_end (a pull before each with --pull), each with
 * its step as downpour-worker sends them (the shards apply a step once). */
static void s_push_loop(const s_conf_t *c, dp_ps_client_t *pc, const float *grads, float *params,
                        double t0, double t_end, s_record_t *rec)
{
    while (dp_now() < t0) usleep(1000);
    uint64_t step = 0;
    for (double s = dp_now(); s < t_end; s = dp_now()) {
        char err[DP_ERR_LEN];
        if (c->pull && dp_ps_client_pull(pc, params, err) != 0) {
            rec->r.failed = 1;
            snprintf(rec->r.err, sizeof rec->r.err, "pull: %.240s", err);
            return;
        }
        double mid = dp_now();
        dp_push_result_t res;
        dp_ps_push_t push = {.grads = grads, .loss = 0.0f, .batch = 1, .step = ++step};
        if (dp_ps_client_push(pc, &push, &res, err) != 0) {
            rec->r.failed = 1;
            snprintf(rec->r.err, sizeof rec->r.err, "push: %.240s", err);
            return;
        }
        s_record(rec, s, mid, dp_now());
        rec->r.applied += res.applied;
        rec->r.dropped += res.dropped;
        rec->r.rejected += res.rejected;
        if ((res.dropped || res.rejected) && !rec->r.err[0])
            snprintf(rec->r.err, sizeof rec->r.err, "%s", res.reason);
    }
}

static void s_write_result(const char *dir, int id, const s_record_t *rec)
{
    size_t tail = sizeof(double) * 3 * (size_t)rec->r.n;
    char *buf = dp_malloc(sizeof rec->r + tail);
    memcpy(buf, &rec->r, sizeof rec->r);
    if (tail) memcpy(buf + sizeof rec->r, rec->t, tail);
    char path[PATH_MAX], err[DP_ERR_LEN];
    snprintf(path, sizeof path, "%s/worker-%d.bin", dir, id);
    if (dp_write_file_atomic(path, buf, sizeof rec->r + tail, err) != 0) dp_log_error("%s", err);
    free(buf);
}

/* The child: connect, say so on ready_fd, wait for t0 on go_fd, push, write
 * the results, exit. Never returns. */
static void s_worker_main(const s_conf_t *c, const dp_model_t *m, const char *dir,
                          const char *endpoints, int id, int ready_fd, int go_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    signal(SIGINT, SIG_DFL); /* the parent's flag handler is not ours */
    signal(SIGTERM, SIG_DFL);
    s_ready_t rd = {.worker = id, .ok = 1};
    s_record_t rec = {.r = {.n = 0}};
    dp_ps_client_t *pc = NULL;
    dp_ps_beat_t *beat = NULL;
    float *params = dp_aligned_alloc(m->n_floats * sizeof(float));
    float *grads = dp_aligned_alloc(m->n_floats * sizeof(float));
    /* Small, finite and not all equal: the servers validate every value and
     * the weights must stay finite over millions of pushes. */
    for (size_t i = 0; i < m->n_floats; i++) grads[i] = 1e-7f * (float)((int)((i + id) % 7) - 3);
    dp_ps_client_opts_t opts = {.timeout_s = c->timeout, .session = dp_ps_session_new()};
    if (dp_ps_client_new(&pc, endpoints, m, id, &opts, NULL, rd.err) != 0 ||
        dp_ps_beat_new(&beat, endpoints, id, opts.session, NULL, rd.err) != 0 ||
        dp_ps_client_pull(pc, params, rd.err) != 0)
        rd.ok = 0;
    if (!c->pull) {
        free(params); /* only the first pull needed it */
        params = NULL;
    }
    double t0 = 0;
    int go = write(ready_fd, &rd, sizeof rd) == (ssize_t)sizeof rd && rd.ok &&
             read(go_fd, &t0, sizeof t0) == (ssize_t)sizeof t0;
    if (go) s_push_loop(c, pc, grads, params, t0, t0 + c->warmup + c->seconds, &rec);
    if (go) s_write_result(dir, id, &rec);
    dp_ps_beat_destroy(&beat);
    dp_ps_client_destroy(&pc);
    free(params);
    free(grads);
    free(rec.t);
    _exit(go && !rec.r.failed ? 0 : 1);
}

/* ---- the run ------------------------------------------------------------ */

typedef struct {
    pid_t pid[S_MAX_WORKERS];
    int n;
    int ready_fd, go_fd; /* our ends: workers' ready records in, t0 out */
    double at[2];        /* when the CPU times were read: start and end of the measured span */
    double cpu[2][2];    /* [start, end][shards, workers]: CPU seconds used so far, summed */
    int cpu_lost;        /* a process was gone at a sample: no CPU figures */
} s_workers_t;

/* CPU seconds (user + system, every thread) process pid has used; -1 once
 * it is gone. */
static double s_cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the name may hold spaces; the fields follow it */
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* The CPU time of the shards and of the workers, as sample k (0: start,
 * 1: end of the measured span). */
static void s_sample_cpu(s_workers_t *w, const dp_bench_shards_t *cl, int k)
{
    w->at[k] = dp_now();
    w->cpu[k][0] = w->cpu[k][1] = 0;
    for (int i = 0; i < cl->n + w->n; i++) {
        pid_t pid = i < cl->n ? cl->pid[i] : w->pid[i - cl->n];
        double t = pid > 0 ? s_cpu_seconds(pid) : -1;
        if (t < 0) w->cpu_lost = 1;
        else w->cpu[k][i >= cl->n] += t;
    }
}

/* One ready record from every worker, within the timeout; a worker that
 * exits first (a crash: it did not say why) is noticed within 0.1 s. */
static int s_wait_ready(s_workers_t *w, const s_conf_t *c, char *err)
{
    double deadline = dp_now() + c->timeout + 30;
    for (int got = 0; got < c->workers;) {
        if (s_stop) return dp_err(err, "interrupted");
        struct pollfd pf = {.fd = w->ready_fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0) {
            for (int i = 0; i < w->n; i++)
                if (w->pid[i] > 0 && waitpid(w->pid[i], NULL, WNOHANG) == w->pid[i]) {
                    w->pid[i] = 0;
                    return dp_err(err, "worker %d exited before it connected", i);
                }
            if (dp_now() > deadline)
                return dp_err(err, "%d of %d workers connected within %.0f s", got, c->workers,
                              c->timeout + 30);
            continue;
        }
        s_ready_t rd;
        if (read(w->ready_fd, &rd, sizeof rd) != (ssize_t)sizeof rd)
            return dp_err(err, "a worker process died before it connected");
        if (!rd.ok) return dp_err(err, "worker %d: %s", rd.worker, rd.err);
        got++;
    }
    return 0;
}

/* Forks the workers and waits until each has connected. */
static int s_start_workers(s_workers_t *w, const s_conf_t *c, const dp_model_t *m,
                           const dp_bench_shards_t *cl, char *err)
{
    int rp[2], gp[2];
    if (pipe(rp) != 0 || pipe(gp) != 0) return dp_err(err, "pipe: %s", strerror(errno));
    w->ready_fd = rp[0], w->go_fd = gp[1];
    for (int i = 0; i < c->workers; i++) {
        pid_t pid = fork();
        if (pid < 0) return dp_err(err, "fork: %s", strerror(errno));
        if (pid == 0) {
            close(rp[0]), close(gp[1]);
            s_worker_main(c, m, cl->dir, cl->endpoints, i, rp[1], gp[0]);
        }
        w->pid[w->n++] = pid;
    }
    close(rp[1]), close(gp[0]);
    return s_wait_ready(w, c, err);
}

/* t0 to every worker, then waits for them all (they stop starting pushes
 * at t0 + warmup + seconds; the last push may take up to the timeout).
 * *t0_out: the start. A worker's failure is in its results file. */
static int s_run_workers(s_workers_t *w, const s_conf_t *c, const dp_bench_shards_t *cl, double *t0_out,
                         char *err)
{
    double t0 = dp_now() + 0.05;
    /* the second a little early: the workers exit soon after the end */
    double mark[2] = {t0 + c->warmup, t0 + c->warmup + c->seconds - 0.03};
    int sampled = 0;
    *t0_out = t0;
    for (int i = 0; i < w->n; i++)
        if (write(w->go_fd, &t0, sizeof t0) != (ssize_t)sizeof t0)
            return dp_err(err, "start the workers: %s", strerror(errno));
    double deadline = t0 + c->warmup + c->seconds + c->timeout + 10;
    for (int left = w->n; left > 0;) {
        if (s_stop) return dp_err(err, "interrupted");
        if (sampled < 2 && dp_now() >= mark[sampled]) s_sample_cpu(w, cl, sampled++);
        for (int i = 0; i < w->n; i++)
            if (w->pid[i] > 0 && waitpid(w->pid[i], NULL, WNOHANG) == w->pid[i]) {
                w->pid[i] = 0;
                left--;
            }
        if (left > 0 && dp_now() > deadline)
            return dp_err(err, "%d workers still pushing %.0f s after the end", left, c->timeout);
        if (left > 0) usleep(20 * 1000);
    }
    return 0;
}

static void s_stop_workers(s_workers_t *w)
{
    for (int i = 0; i < w->n; i++)
        if (w->pid[i] > 0) kill(w->pid[i], SIGTERM);
    for (int i = 0; i < w->n; i++)
        if (w->pid[i] > 0) waitpid(w->pid[i], NULL, 0);
    if (w->ready_fd > 0) close(w->ready_fd);
    if (w->go_fd > 0) close(w->go_fd);
    w->n = 0;
}

/* ---- the figures ---------------------------------------------------------- */

typedef struct {
    double rate, rate_min, rate_max;       /* pushes/s over the windows: median, extremes */
    double push_ms, push_p99, pull_ms;     /* per push (and its pull with --pull) */
    double worker_min, worker_max;         /* one worker's pushes/s over the measured span */
    long pushes;                           /* pushes started in the measured span */
    long applied, dropped, rejected;       /* shard replies, every push of the run */
    double total;                          /* pushes in the measured span (fractional) */
    double cpu_shards, cpu_workers;        /* cores they used over the measured span */
    double shard_ms;                       /* the shards' CPU time per push */
} s_stats_t;

typedef struct {
    double *v;
    long n, cap;
} s_vec_t;

static void s_vec_add(s_vec_t *a, double x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 1024;
        a->v = dp_realloc(a->v, sizeof(double) * (size_t)a->cap);
    }
    a->v[a->n++] = x;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0.5: the median) of v, sorting it; 0 when empty. */
static double s_quantile(double *v, long n, double q)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    double x = q * (double)(n - 1);
    long i = (long)x;
    return i + 1 < n ? v[i] + (x - (double)i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* One worker's pushes (t: start, after the pull, end; n of them) into the
 * windows over [m0, m0 + W len): each push adds to every window it
 * overlaps the fraction of it that lies there. Returns the pushes it
 * added in all (fractional); latencies of those starting inside go to lat. */
static double s_bin(const double *t, long n, double m0, double len, int W, double *win,
                    s_vec_t *push, s_vec_t *pull)
{
    double total = 0, m1 = m0 + W * len;
    for (long k = 0; k < n; k++) {
        double s = t[3 * k], mid = t[3 * k + 1], e = t[3 * k + 2];
        if (s >= m0 && s < m1) {
            s_vec_add(push, (e - mid) * 1e3);
            s_vec_add(pull, (mid - s) * 1e3);
        }
        if (e <= m0 || s >= m1 || e <= s) continue;
        int j0 = s > m0 ? (int)((s - m0) / len) : 0;
        for (int j = j0; j < W; j++) {
            double a = m0 + j * len, b = a + len;
            if (a >= e) break;
            double part = ((e < b ? e : b) - (s > a ? s : a)) / (e - s);
            win[j] += part;
            total += part;
        }
    }
    return total;
}

/* Reads every worker's results file and makes the figures; -1 with the
 * first worker's failure when one failed. */
static int s_stats(const s_conf_t *c, const char *dir, double t0, s_stats_t *st, char *err)
{
    memset(st, 0, sizeof *st);
    double *win = dp_calloc((size_t)c->windows, sizeof(double));
    double len = c->seconds / c->windows, m0 = t0 + c->warmup;
    s_vec_t push = {0}, pull = {0}, worker = {0};
    int rc = 0;
    for (int i = 0; i < c->workers && rc == 0; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/worker-%d.bin", dir, i);
        uint8_t *buf = NULL;
        size_t n = 0;
        s_result_t r;
        if (dp_read_file(path, &buf, &n, NULL) != 0 || n < sizeof r) {
            rc = dp_err(err, "worker %d wrote no results (it died; see above)", i);
        } else {
            memcpy(&r, buf, sizeof r);
            if (r.failed) rc = dp_err(err, "worker %d: %s", i, r.err);
            else if (r.rejected || r.dropped)
                rc = dp_err(err, "worker %d: %ld pushes not applied: %s", i,
                            r.rejected + r.dropped, r.err);
            else if (n != sizeof r + sizeof(double) * 3 * (size_t)r.n)
                rc = dp_err(err, "worker %d: results file of the wrong size", i);
        }
        if (rc == 0) {
            double got = s_bin((const double *)(buf + sizeof r), r.n, m0, len, c->windows, win,
                               &push, &pull);
            s_vec_add(&worker, got / c->seconds);
            st->total += got;
            st->applied += r.applied;
        }
        free(buf);
    }
    if (rc == 0) {
        st->pushes = push.n;
        st->push_ms = s_quantile(push.v, push.n, 0.5);
        st->push_p99 = s_quantile(push.v, push.n, 0.99);
        st->pull_ms = s_quantile(pull.v, pull.n, 0.5);
        st->worker_min = s_quantile(worker.v, worker.n, 0);
        st->worker_max = s_quantile(worker.v, worker.n, 1);
        for (int j = 0; j < c->windows; j++) win[j] /= len;
        st->rate = s_quantile(win, c->windows, 0.5);
        st->rate_min = win[0];
        st->rate_max = win[c->windows - 1];
    }
    free(win), free(push.v), free(pull.v), free(worker.v);
    return rc;
}

/* CPU use over the measured span, from the two samples; -1 when there are
 * none (a process was gone at one, or the span was too short to take two). */
static void s_cpu_stats(const s_conf_t *c, const s_workers_t *w, s_stats_t *st)
{
    double dt = w->at[1] - w->at[0];
    st->cpu_shards = st->cpu_workers = st->shard_ms = -1;
    if (w->cpu_lost || dt <= 0) return;
    st->cpu_shards = (w->cpu[1][0] - w->cpu[0][0]) / dt;
    st->cpu_workers = (w->cpu[1][1] - w->cpu[0][1]) / dt;
    if (st->total > 0) st->shard_ms = 1e3 * st->cpu_shards / (st->total / c->seconds);
}

/* ---- the report ----------------------------------------------------------- */

static double s_loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

static void s_json(const s_conf_t *c, const dp_model_t *m, const s_stats_t *st, double load)
{
    double bytes = (double)m->n_floats * 4;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "workers", c->workers);
    cJSON_AddNumberToObject(o, "shards", c->shards);
    cJSON_AddNumberToObject(o, "params", (double)m->n_floats);
    cJSON_AddNumberToObject(o, "bytes_per_push", bytes);
    cJSON_AddStringToObject(o, "transport", c->transport ? "ipc" : "tcp");
    cJSON_AddStringToObject(o, "optimizer", c->optimizer);
    cJSON_AddBoolToObject(o, "pull", c->pull);
    cJSON_AddNumberToObject(o, "seconds", c->seconds);
    cJSON_AddNumberToObject(o, "warmup", c->warmup);
    cJSON_AddNumberToObject(o, "windows", c->windows);
    cJSON_AddNumberToObject(o, "pushes", (double)st->pushes);
    cJSON_AddNumberToObject(o, "pushes_per_s", dp_metrics_round(st->rate, 4));
    cJSON_AddNumberToObject(o, "pushes_per_s_min", dp_metrics_round(st->rate_min, 4));
    cJSON_AddNumberToObject(o, "pushes_per_s_max", dp_metrics_round(st->rate_max, 4));
    cJSON_AddNumberToObject(o, "mb_per_s", dp_metrics_round(st->rate * bytes / 1e6, 4));
    cJSON_AddNumberToObject(o, "push_ms", dp_metrics_round(st->push_ms, 4));
    cJSON_AddNumberToObject(o, "push_ms_p99", dp_metrics_round(st->push_p99, 4));
    if (c->pull) cJSON_AddNumberToObject(o, "pull_ms", dp_metrics_round(st->pull_ms, 4));
    cJSON_AddNumberToObject(o, "worker_pushes_per_s_min", dp_metrics_round(st->worker_min, 4));
    cJSON_AddNumberToObject(o, "worker_pushes_per_s_max", dp_metrics_round(st->worker_max, 4));
    cJSON_AddNumberToObject(o, "applied", (double)st->applied);
    if (st->cpu_shards >= 0) {
        cJSON_AddNumberToObject(o, "shards_cpu", dp_metrics_round(st->cpu_shards, 3));
        cJSON_AddNumberToObject(o, "workers_cpu", dp_metrics_round(st->cpu_workers, 3));
        cJSON_AddNumberToObject(o, "shard_cpu_ms_per_push", dp_metrics_round(st->shard_ms, 4));
    }
    cJSON_AddNumberToObject(o, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(o, "loadavg", load);
    char *line = cJSON_PrintUnformatted(o);
    printf("%s\n", line);
    cJSON_free(line);
    cJSON_Delete(o);
}

static void s_report(const s_conf_t *c, const dp_model_t *m, const s_stats_t *st, double load)
{
    double mb = (double)m->n_floats * 4 / 1e6;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("scale: %d worker process%s -> %d shard%s, %zu parameters (%.2f MB per push), async, "
           "%s, %s%s\n", c->workers, c->workers > 1 ? "es" : "", c->shards,
           c->shards > 1 ? "s" : "", m->n_floats, mb, c->optimizer,
           c->transport ? "ipc" : "tcp 127.0.0.1", c->pull ? ", a pull before each push" : "");
    printf("  pushes/s the servers sustained: %.1f (median of %d windows of %.2f s after %.1f s "
           "of warm-up; min %.1f, max %.1f) = %.1f MB/s of gradients\n", st->rate, c->windows,
           c->seconds / c->windows, c->warmup, st->rate_min, st->rate_max, st->rate * mb);
    printf("  push latency: median %.3f ms, p99 %.3f ms over %ld pushes", st->push_ms,
           st->push_p99, st->pushes);
    if (c->pull) printf("; pull median %.3f ms", st->pull_ms);
    printf("\n  one worker's pushes/s: min %.1f, max %.1f\n", st->worker_min, st->worker_max);
    if (st->cpu_shards >= 0)
        printf("  CPU over the measured span: the shards %.2f cores (%.3f ms per push), the workers "
               "%.2f cores\n", st->cpu_shards, st->shard_ms, st->cpu_workers);
    printf("  %ld cores, load average %.2f at the start%s\n", cores, load,
           c->workers + c->shards > cores
               ? ": more processes than cores, so this is the CPU's limit as much as the servers'"
               : "");
    if (c->json) s_json(c, m, st, load);
}

/* The servers and the workers up, the pushes timed, everything stopped. */
static int s_run(const s_conf_t *c, const dp_model_t *m, const char *input, const char *argv0,
                 char *err)
{
    double load = s_loadavg();
    dp_signals_install(&s_stop, 0);
    dp_bench_shards_t cl;
    if (dp_bench_shards_init(&cl, "bench-scale", argv0, err) != 0) return -1;
    dp_bench_shards_conf_t sc = {.shards = c->shards, .ipc = c->transport, .workers = c->workers,
                                 .optimizer = c->optimizer, .spec = m->spec, .input = input};
    s_workers_t *w = dp_calloc(1, sizeof *w);
    s_stats_t st;
    double t0 = 0;
    int rc = -1;
    if (dp_bench_shards_start(&cl, &sc, err) == 0 && s_start_workers(w, c, m, &cl, err) == 0 &&
        s_run_workers(w, c, &cl, &t0, err) == 0 && s_stats(c, cl.dir, t0, &st, err) == 0) {
        s_cpu_stats(c, w, &st);
        s_report(c, m, &st, load);
        rc = 0;
    }
    s_stop_workers(w);
    free(w);
    dp_bench_shards_fini(&cl);
    return rc;
}

int dp_bench_scale_main(int argc, char **argv)
{
    s_conf_t c = {.workers = 4, .shards = 1, .seconds = 5, .warmup = 1, .windows = 10,
                  .optimizer = "sgd", .timeout = 60};
    char err[DP_ERR_LEN] = "";
    dp_model_t m;
    char input[48];
    dp_opts_result_t r = s_parse(&c, argc - 1, argv + 1, err);
    if (r == DP_OPTS_PARSED) r = dp_bench_model(&m, c.model, c.params, input, sizeof input, err);
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("downpour bench scale", r, err);
    if (s_run(&c, &m, input, argv[0], err) != 0) {
        fprintf(stderr, "downpour bench scale: %s\n", err);
        return 1;
    }
    return 0;
}
