/* local: `downpour local` — a whole cluster on this machine. Starts K
 * downpour-ps shards and N downpour-worker processes on free loopback
 * ports, shows one live progress line, and stops everything cleanly when
 * the run ends, when any process fails (naming it and its last log line) or
 * on Ctrl-C / SIGTERM. Leaves DIR/summary.json, DIR/model.safetensors,
 * DIR/metrics/ (JSON lines) and DIR/logs/.
 *
 * Invariant: no child outlives the launcher — each runs in its own process
 * group (so a terminal's Ctrl-C reaches the launcher alone, which then stops
 * them in order) with PR_SET_PDEATHSIG, so a killed launcher takes them along. */
#include "deploy/launcher.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/dataset.h"
#include "common/util.h"

#define DP_LOCAL_MAX 64     /* processes of each kind */
#define DP_LOCAL_ARGS 128   /* argv entries per child */

typedef enum { TO_PS = 1, TO_WORKER = 2, TO_BOTH = 3 } dp_target_t;

/* Flags the launcher passes on, and to whom. */
static const struct {
    const char *name;
    int has_arg;
    dp_target_t to;
} s_forward[] = {
    {"--mode", 1, TO_PS},           {"--staleness", 1, TO_PS},
    {"--replicas-to-aggregate", 1, TO_PS}, {"--lr-staleness", 0, TO_PS},
    {"--optimizer", 1, TO_PS},      {"--lr", 1, TO_PS},
    {"--momentum", 1, TO_PS},       {"--weight-decay", 1, TO_PS},
    {"--lr-schedule", 1, TO_PS},    {"--checkpoint-dir", 1, TO_PS},
    {"--checkpoint-every", 1, TO_PS}, {"--heartbeat-timeout", 1, TO_PS},
    {"--model", 1, TO_BOTH},        {"--seed", 1, TO_BOTH},
    {"--data", 1, TO_WORKER},       {"--batch", 1, TO_WORKER},
    {"--epochs", 1, TO_WORKER},     {"--steps", 1, TO_WORKER},
    {"--threads", 1, TO_WORKER},    {"--eval-every", 1, TO_WORKER},
    {"--eval-limit", 1, TO_WORKER}, {"--delay-ms", 1, TO_WORKER},
    {"--delay-dist", 1, TO_WORKER}, {"--timeout", 1, TO_WORKER},
    {"--device", 1, TO_WORKER},
};

typedef struct {
    char name[32];               /* "ps-0", "worker-1" */
    char log[PATH_MAX];          /* its stdout + stderr */
    char metrics[PATH_MAX];
    pid_t pid;                   /* 0 once reaped */
    int status;                  /* wait status once reaped */
    int is_worker;
} dp_child_t;

typedef struct {
    int workers, shards;
    const char *gpus;            /* "0,1" or NULL */
    const char *out;
    const char *data;
    const char *mode;
    const char *steps, *epochs, *batch; /* as given, or NULL */
    char delay_ms[DP_LOCAL_MAX][24]; /* --straggler I:MS: worker I's injected delay, "" none */
    int delay_exp[DP_LOCAL_MAX];     /* ... drawn from an exponential (I:MS:exp) */
    int schedule_given;          /* --lr-schedule was passed on */
    int progress;                /* -1 auto */
    char bin_dir[PATH_MAX];
    const char *ps_args[DP_LOCAL_ARGS];
    int n_ps_args;
    const char *worker_args[DP_LOCAL_ARGS];
    int n_worker_args;
    dp_child_t kids[2 * DP_LOCAL_MAX];
    int n_kids;
} dp_local_t;

static volatile sig_atomic_t s_signal;

static void s_on_signal(int sig) { s_signal = sig; }

static void s_usage(FILE *f)
{
    fprintf(f,
"usage: downpour local --workers N [--ps-shards K] [--gpus 0,1,...] [--mode sync|async|ssp]\n"
"                      [--out DIR] [flags for downpour-ps and downpour-worker]\n"
"\n"
"Runs K parameter-server shards and N workers on this machine (loopback ports),\n"
"shows one progress line and leaves in DIR (default runs/local-<time>):\n"
"  summary.json  model.safetensors  metrics/*.jsonl  tensorboard/  logs/*.log\n"
"\n"
"  --workers N        worker processes (default 2; with --gpus, one per listed GPU)\n"
"  --ps-shards K      parameter-server processes, each owning a slice (default 1)\n"
"  --gpus LIST        one worker per listed GPU (cuda:K); default: CPU workers\n"
"  --mode M           sync (default), async or ssp (with --staleness S)\n"
"  --straggler I:MS   worker I sleeps MS ms before each push (I:MS:exp: exponential)\n"
"  --out DIR          where results land\n"
"  --no-progress      no live line\n"
"The learning rate anneals to zero over the run (cosine) unless --lr-schedule is given.\n"
"Passed on to downpour-ps: --mode --staleness --replicas-to-aggregate --lr-staleness\n"
"  --optimizer --lr --momentum --weight-decay --lr-schedule --checkpoint-dir\n"
"  --checkpoint-every --heartbeat-timeout --model --seed\n"
"Passed on to downpour-worker: --data --batch --epochs --steps --threads --eval-every\n"
"  --eval-limit --delay-ms --delay-dist --timeout --device --model --seed\n");
}

/* A free TCP port on 127.0.0.1 (the kernel picks; we release it at once). */
static int s_free_port(char *err)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return dp_err(err, "socket: %s", strerror(errno));
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return dp_err(err, "cannot find a free loopback port: %s", strerror(errno));
    }
    close(fd);
    return ntohs(a.sin_port);
}

static int s_mkdir(const char *path, char *err)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return dp_err(err, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

/* Start one child with its output in c->log. */
static int s_spawn(dp_child_t *c, const char *const *argv, char *err)
{
    int fd = open(c->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dp_err(err, "%s: cannot create: %s", c->log, strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        return dp_err(err, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);  /* the launcher died before prctl */
        dup2(fd, 1);
        dup2(fd, 2);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        /* Several processes share the cores: OpenMP threads that spin for
         * long at each barrier steal them from each other (a 2-thread step
         * measured 10x slower). A short spin costs nothing on a quiet machine. */
        setenv("GOMP_SPINCOUNT", "10000", 0);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "%s: cannot execute: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    setpgid(pid, pid);
    c->pid = pid;
    return 0;
}

/* The last non-empty line of a file, into out. */
static void s_last_line(const char *path, char *out, size_t n)
{
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char buf[8192];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = 0;
    while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r')) buf[--got] = 0;
    char *start = strrchr(buf, '\n');
    start = start ? start + 1 : buf;
    /* A live "\r" line: keep its last state. */
    char *cr = strrchr(start, '\r');
    if (cr) start = cr + 1;
    snprintf(out, n, "%s", start);
}

/* Parse the last complete JSON line of a metrics file, or NULL. */
static cJSON *s_last_metrics(const char *path)
{
    char line[8192];
    s_last_line(path, line, sizeof line);
    return line[0] == '{' ? cJSON_Parse(line) : NULL;
}

static double s_num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* Total steps per worker, read once from the worker's first metrics line
 * (with its steps per epoch and batch). */
static long s_total_steps(const char *path, long *steps_per_epoch, long *batch)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    long total = 0;
    if (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        if (o) {
            total = (long)s_num(o, "total_steps", 0);
            *steps_per_epoch = (long)s_num(o, "steps_per_epoch", 0);
            *batch = (long)s_num(o, "batch", 0);
            cJSON_Delete(o);
        }
    }
    fclose(f);
    return total;
}

/* One progress line: rewritten in place on a terminal (live), else a plain
 * line of its own. */
static void s_show_progress(dp_local_t *L, double t0, long *total, long *spe, long *batch,
                            int live)
{
    long steps_min = -1, steps_sum = 0;
    double loss = 0, stale = 0;
    int n = 0;
    for (int i = 0; i < L->n_kids; i++) {
        dp_child_t *c = &L->kids[i];
        if (!c->is_worker) continue;
        if (*total == 0) *total = s_total_steps(c->metrics, spe, batch);
        cJSON *o = s_last_metrics(c->metrics);
        if (!o) continue;
        long step = (long)s_num(o, "step", -1) + 1;
        if (steps_min < 0 || step < steps_min) steps_min = step;
        steps_sum += step;
        loss += s_num(o, "loss", 0);
        stale += s_num(o, "staleness", 0);
        n++;
        cJSON_Delete(o);
    }
    if (n == 0) {
        fprintf(stderr, "%sstarting %d ps shard(s) and %d worker(s)...%s", live ? "\r\033[K" : "",
                L->shards, L->workers, live ? "" : "\n");
        return;
    }
    double dt = dp_now() - t0;
    long epoch = *spe > 0 ? steps_min / *spe + 1 : 1;
    long epochs = *spe > 0 && *total > 0 ? (*total + *spe - 1) / *spe : 1;
    if (epoch > epochs) epoch = epochs;
    fprintf(stderr, "%sepoch %ld/%ld  step %ld/%ld  %.0f img/s  loss %.4f  staleness %.2f%s",
            live ? "\r\033[K" : "", epoch, epochs, steps_min, *total,
            steps_sum * (double)*batch / (dt > 0 ? dt : 1), loss / n, stale / n, live ? "" : "\n");
}

/* SIGTERM every live child, then SIGKILL what is left after grace_s. */
static void s_stop_all(dp_local_t *L, double grace_s)
{
    for (int i = 0; i < L->n_kids; i++)
        if (L->kids[i].pid > 0) kill(L->kids[i].pid, SIGTERM);
    double until = dp_now() + grace_s;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < L->n_kids; i++) {
            dp_child_t *c = &L->kids[i];
            if (c->pid <= 0) continue;
            if (waitpid(c->pid, &c->status, WNOHANG) == c->pid) c->pid = 0;
            else alive++;
        }
        if (!alive) return;
        if (dp_now() > until) break;
        usleep(50 * 1000);
    }
    for (int i = 0; i < L->n_kids; i++) {
        dp_child_t *c = &L->kids[i];
        if (c->pid <= 0) continue;
        kill(-c->pid, SIGKILL);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &c->status, 0);
        c->pid = 0;
    }
}

static void s_describe_exit(const dp_child_t *c, char *out, size_t n)
{
    if (WIFEXITED(c->status)) snprintf(out, n, "exited with status %d", WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status)) snprintf(out, n, "killed by signal %d", WTERMSIG(c->status));
    else snprintf(out, n, "ended");
}

/* "--straggler I:MS[:exp]": worker I sleeps MS ms before each push (fixed,
 * or exponential with that mean), the others do not — the experiment that
 * shows what one slow worker does to everybody's staleness. */
static int s_parse_straggler(dp_local_t *L, const char *v, char *err)
{
    char *end = NULL;
    long i = strtol(v, &end, 10);
    if (end == v || *end != ':' || i < 0 || i >= DP_LOCAL_MAX)
        return dp_err(err, "--straggler %s: expected WORKER:MS[:exp], e.g. 1:50", v);
    const char *ms = end + 1;
    double d = strtod(ms, &end);
    if (end == ms || d < 0 || (*end && strcmp(end, ":exp") != 0))
        return dp_err(err, "--straggler %s: expected WORKER:MS[:exp], e.g. 1:50", v);
    snprintf(L->delay_ms[i], sizeof L->delay_ms[i], "%.*s", (int)(end - ms), ms);
    L->delay_exp[i] = *end != 0;
    return 0;
}

/* Parse the launcher's own flags; the rest are sorted into ps / worker args. */
static int s_parse(dp_local_t *L, int argc, char **argv, char *err)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            s_usage(stdout);
            exit(0);
        } else if (strcmp(a, "--workers") == 0 && v) {
            L->workers = atoi(v);
            i++;
        } else if (strcmp(a, "--ps-shards") == 0 && v) {
            L->shards = atoi(v);
            i++;
        } else if (strcmp(a, "--gpus") == 0 && v) {
            L->gpus = v;
            i++;
        } else if (strcmp(a, "--out") == 0 && v) {
            L->out = v;
            i++;
        } else if (strcmp(a, "--straggler") == 0 && v) {
            if (s_parse_straggler(L, v, err) != 0) return -1;
            i++;
        } else if (strcmp(a, "--no-progress") == 0) {
            L->progress = 0;
        } else if (strcmp(a, "--progress") == 0) {
            L->progress = 1;
        } else {
            size_t k;
            for (k = 0; k < sizeof s_forward / sizeof s_forward[0]; k++)
                if (strcmp(a, s_forward[k].name) == 0) break;
            if (k == sizeof s_forward / sizeof s_forward[0])
                return dp_err(err, "unknown flag '%s' (see downpour local --help)", a);
            if (s_forward[k].has_arg && !v) return dp_err(err, "%s needs a value", a);
            if (L->n_ps_args + 2 >= DP_LOCAL_ARGS - 16 || L->n_worker_args + 2 >= DP_LOCAL_ARGS - 24)
                return dp_err(err, "too many flags");
            if (s_forward[k].to & TO_PS) {
                L->ps_args[L->n_ps_args++] = a;
                if (s_forward[k].has_arg) L->ps_args[L->n_ps_args++] = v;
            }
            if (s_forward[k].to & TO_WORKER) {
                L->worker_args[L->n_worker_args++] = a;
                if (s_forward[k].has_arg) L->worker_args[L->n_worker_args++] = v;
            }
            if (strcmp(a, "--data") == 0) L->data = v;
            if (strcmp(a, "--mode") == 0) L->mode = v;
            if (strcmp(a, "--steps") == 0) L->steps = v;
            if (strcmp(a, "--epochs") == 0) L->epochs = v;
            if (strcmp(a, "--batch") == 0) L->batch = v;
            if (strcmp(a, "--lr-schedule") == 0) L->schedule_given = 1;
            if (s_forward[k].has_arg) i++;
        }
    }
    if (L->gpus) {
        int n = 1;
        for (const char *p = L->gpus; *p; p++) n += *p == ',';
        L->workers = n;
    }
    if (L->workers < 1 || L->workers > DP_LOCAL_MAX)
        return dp_err(err, "--workers must be in 1..%d", DP_LOCAL_MAX);
    for (int i = L->workers; i < DP_LOCAL_MAX; i++)
        if (L->delay_ms[i][0])
            return dp_err(err, "--straggler %d: there are only %d workers", i, L->workers);
    if (L->shards < 1 || L->shards > DP_LOCAL_MAX)
        return dp_err(err, "--ps-shards must be in 1..%d", DP_LOCAL_MAX);
    return 0;
}

/* Steps each worker runs (the worker's own rule: --steps, else epochs over
 * its share of n samples in global batches). */
static long s_run_steps(const dp_local_t *L, int n)
{
    if (L->steps) return atol(L->steps);
    long epochs = L->epochs ? atol(L->epochs) : 1;
    long batch = L->batch ? atol(L->batch) : 64;
    return batch > 0 ? epochs * (n / (batch * L->workers)) : 0;
}

/* The directory holding the running binary (where its siblings are). */
static void s_bin_dir(char *out, size_t n, const char *argv0)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0) {
        self[len] = 0;
    } else {
        snprintf(self, sizeof self, "%s", argv0);
    }
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    else snprintf(self, sizeof self, ".");
    snprintf(out, n, "%s", self);
}

static void s_print_summary(const char *path)
{
    uint8_t *text = NULL;
    size_t len = 0;
    if (dp_read_file(path, &text, &len, NULL) != 0) return;
    cJSON *o = cJSON_Parse((const char *)text);
    free(text);
    if (!o) return;
    const char *mode = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "mode"));
    fprintf(stderr,
            "done: %s, %g worker(s), %g shard(s): test accuracy %.4f (loss %.4f), %.0f images/s, %.1f s;"
            " updates applied %g, dropped %g, rejected %g; staleness mean %.2f, max %g\n",
            mode ? mode : "?",
            s_num(o, "workers", 0), s_num(o, "ps_shards", 0), s_num(o, "test_accuracy", 0),
            s_num(o, "test_loss", 0), s_num(o, "images_per_s", 0), s_num(o, "wall_s", 0),
            s_num(o, "updates_applied", 0), s_num(o, "updates_dropped", 0),
            s_num(o, "updates_rejected", 0), s_num(o, "staleness_mean", 0),
            s_num(o, "staleness_max", 0));
    cJSON_Delete(o);
}

int dp_local_main(int argc, char **argv)
{
    static dp_local_t L;  /* large: keep it off the stack */
    memset(&L, 0, sizeof L);
    L.workers = 2;
    L.shards = 1;
    L.progress = -1;
    L.data = "fashion-mnist";
    L.mode = "sync";  /* downpour-ps's default too */
    char err[DP_ERR_LEN] = "";
    char out_default[64];
    if (s_parse(&L, argc, argv, err) != 0) {
        fprintf(stderr, "downpour local: %s\n", err);
        return 2;
    }
    if (!L.out) {
        time_t now = time(NULL);
        strftime(out_default, sizeof out_default, "runs/local-%Y%m%d-%H%M%S", localtime(&now));
        s_mkdir("runs", err);
        L.out = out_default;
    }
    s_bin_dir(L.bin_dir, sizeof L.bin_dir, argv[0]);

    /* The servers need the input shape, and the default schedule the run's
     * length: the training split tells both. */
    dp_dataset_t probe = {0};
    if (dp_dataset_init(&probe, L.data, DP_SPLIT_TRAIN, err) != 0) {
        fprintf(stderr, "downpour local: %s\n", err);
        return 1;
    }
    char input[48], schedule[64];
    snprintf(input, sizeof input, "%dx%dx%d", probe.c, probe.h, probe.w);
    if (!L.schedule_given) {
        /* Anneal the lr to zero over the run (cosine), as the standalone
         * trainer does by default: the final weights are then not just one
         * noisy point of a constant-lr walk. The servers count one version
         * per sync step, one per push otherwise. */
        long per_worker = s_run_steps(&L, probe.n);
        long updates = strcmp(L.mode, "sync") == 0 ? per_worker : per_worker * L.workers;
        if (updates > 0) {
            snprintf(schedule, sizeof schedule, "cosine:%ld", updates);
            L.ps_args[L.n_ps_args++] = "--lr-schedule";
            L.ps_args[L.n_ps_args++] = schedule;
        }
    }
    dp_dataset_fini(&probe);

    char dir[PATH_MAX], path[PATH_MAX];
    if (s_mkdir(L.out, err) != 0) goto fail;
    snprintf(dir, sizeof dir, "%s/metrics", L.out);
    if (s_mkdir(dir, err) != 0) goto fail;
    snprintf(dir, sizeof dir, "%s/logs", L.out);
    if (s_mkdir(dir, err) != 0) goto fail;
    /* Results of an earlier run in the same DIR must not pass for this one's. */
    snprintf(path, sizeof path, "%s/summary.json", L.out);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", L.out);
    unlink(path);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    /* Parameter-server shards. */
    char endpoints[DP_LOCAL_MAX * 48] = "";
    char bind[DP_LOCAL_MAX][40], shard[DP_LOCAL_MAX][24], nworkers[16], ps_bin[PATH_MAX + 16];
    snprintf(nworkers, sizeof nworkers, "%d", L.workers);
    snprintf(ps_bin, sizeof ps_bin, "%s/downpour-ps", L.bin_dir);
    for (int i = 0; i < L.shards; i++) {
        int port = s_free_port(err);
        if (port < 0) goto fail;
        snprintf(bind[i], sizeof bind[i], "tcp://127.0.0.1:%d", port);
        snprintf(shard[i], sizeof shard[i], "%d/%d", i, L.shards);
        size_t used = strlen(endpoints);
        snprintf(endpoints + used, sizeof endpoints - used, "%s%s", i ? "," : "", bind[i]);
        dp_child_t *c = &L.kids[L.n_kids++];
        snprintf(c->name, sizeof c->name, "ps-%d", i);
        snprintf(c->log, sizeof c->log, "%s/logs/ps-%d.log", L.out, i);
        snprintf(c->metrics, sizeof c->metrics, "%s/metrics/ps-%d.jsonl", L.out, i);
        const char *av[DP_LOCAL_ARGS];
        int n = 0;
        av[n++] = ps_bin;
        av[n++] = "--bind"; av[n++] = bind[i];
        av[n++] = "--shard"; av[n++] = shard[i];
        av[n++] = "--workers"; av[n++] = nworkers;
        av[n++] = "--input"; av[n++] = input;
        av[n++] = "--metrics"; av[n++] = c->metrics;
        av[n++] = "--mode"; av[n++] = L.mode;  /* said here too, so the line below is true */
        for (int k = 0; k < L.n_ps_args; k++) av[n++] = L.ps_args[k];
        av[n] = NULL;
        if (s_spawn(c, av, err) != 0) goto fail;
    }

    /* Workers; task 0 is the chief and writes the results. */
    char task[DP_LOCAL_MAX][12], device[DP_LOCAL_MAX][24], threads[24], worker_bin[PATH_MAX + 16];
    char save[PATH_MAX], summary[PATH_MAX], tensorboard[PATH_MAX];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(threads, sizeof threads, "%ld", cores / L.workers > 0 ? cores / L.workers : 1);
    snprintf(worker_bin, sizeof worker_bin, "%s/downpour-worker", L.bin_dir);
    snprintf(save, sizeof save, "%s/model.safetensors", L.out);
    snprintf(summary, sizeof summary, "%s/summary.json", L.out);
    snprintf(tensorboard, sizeof tensorboard, "%s/tensorboard", L.out);
    const char *gpu = L.gpus;
    for (int i = 0; i < L.workers; i++) {
        dp_child_t *c = &L.kids[L.n_kids++];
        c->is_worker = 1;
        snprintf(c->name, sizeof c->name, "worker-%d", i);
        snprintf(c->log, sizeof c->log, "%s/logs/worker-%d.log", L.out, i);
        snprintf(c->metrics, sizeof c->metrics, "%s/metrics/worker-%d.jsonl", L.out, i);
        unlink(c->metrics);
        snprintf(task[i], sizeof task[i], "%d", i);
        const char *av[DP_LOCAL_ARGS];
        int n = 0;
        av[n++] = worker_bin;
        av[n++] = "--ps"; av[n++] = endpoints;
        av[n++] = "--task-index"; av[n++] = task[i];
        av[n++] = "--metrics"; av[n++] = c->metrics;
        av[n++] = "--tensorboard"; av[n++] = tensorboard;
        av[n++] = "--no-progress";
        if (gpu) {
            int len = (int)strcspn(gpu, ",");
            snprintf(device[i], sizeof device[i], "cuda:%.*s", len, gpu);
            gpu = gpu[len] ? gpu + len + 1 : gpu + len;
            av[n++] = "--device"; av[n++] = device[i];
        } else {
            av[n++] = "--threads"; av[n++] = threads;
        }
        if (L.delay_ms[i][0]) {
            av[n++] = "--delay-ms"; av[n++] = L.delay_ms[i];
            if (L.delay_exp[i]) { av[n++] = "--delay-dist"; av[n++] = "exp"; }
        }
        if (i == 0) {
            av[n++] = "--save"; av[n++] = save;
            av[n++] = "--summary"; av[n++] = summary;
        }
        /* User flags last, so an explicit --threads or --device wins. */
        for (int k = 0; k < L.n_worker_args; k++) av[n++] = L.worker_args[k];
        av[n] = NULL;
        if (s_spawn(c, av, err) != 0) goto fail;
    }
    fprintf(stderr, "downpour local: %d ps shard(s) at %s, %d worker(s), %s mode; results in %s\n",
            L.shards, endpoints, L.workers, L.mode, L.out);

    /* Watch: any failure stops everything; the run ends when every worker
     * is done (the chief stops the servers itself). */
    int live_tty = L.progress == 1 || (L.progress < 0 && isatty(2));
    double t0 = dp_now(), last_progress = 0, workers_done_at = 0;
    long total = 0, spe = 0, batch = 0;
    const dp_child_t *failed = NULL;
    for (;;) {
        if (s_signal) break;
        int workers_left = 0, alive = 0;
        for (int i = 0; i < L.n_kids; i++) {
            dp_child_t *c = &L.kids[i];
            if (c->pid > 0 && waitpid(c->pid, &c->status, WNOHANG) == c->pid) {
                c->pid = 0;
                if (!WIFEXITED(c->status) || WEXITSTATUS(c->status) != 0) failed = failed ? failed : c;
            }
            if (c->pid > 0) {
                alive++;
                workers_left += c->is_worker;
            }
        }
        if (failed || alive == 0) break;
        if (workers_left == 0) {
            /* Servers get a moment to take the chief's SHUTDOWN. */
            if (workers_done_at == 0) workers_done_at = dp_now();
            if (dp_now() - workers_done_at > 10) break;
        }
        double now = dp_now();
        if (now - last_progress >= (live_tty ? 0.5 : 15.0) && L.progress != 0) {
            s_show_progress(&L, t0, &total, &spe, &batch, live_tty);
            last_progress = now;
        }
        usleep(100 * 1000);
    }
    if (live_tty && L.progress != 0) fputc('\n', stderr);
    int interrupted = s_signal != 0;
    s_stop_all(&L, 10.0);
    if (interrupted) {
        fprintf(stderr, "downpour local: stopped by signal %d; every process ended; logs in %s/logs\n",
                (int)s_signal, L.out);
        return 130;
    }
    if (failed) {
        char how[64], last[512];
        s_describe_exit(failed, how, sizeof how);
        s_last_line(failed->log, last, sizeof last);
        fprintf(stderr, "downpour local: %s %s; last log line: %s\n(full log: %s)\n", failed->name,
                how, last[0] ? last : "(empty)", failed->log);
        return 1;
    }
    if (access(summary, F_OK) != 0) {
        fprintf(stderr, "downpour local: the run ended without %s (see %s/logs)\n", summary, L.out);
        return 1;
    }
    s_print_summary(summary);
    printf("%s\n", summary);
    return 0;
fail:
    fprintf(stderr, "downpour local: %s\n", err);
    s_stop_all(&L, 5.0);
    return 1;
}
