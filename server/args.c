/* args: downpour-ps's command line (and TF_CONFIG) into a dp_ps_config_t.
 *
 * Flags take "--flag VALUE" or "--flag=VALUE". Cluster flags in TensorFlow's
 * style (--job-name ps --task-index I --ps-hosts ... / TF_CONFIG) give the
 * bind endpoint, the shard I/K (K = number of ps hosts) and, with
 * --worker-hosts, the worker count; explicit --bind / --shard / --workers
 * win. Every error is one line naming the flag. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "common/model.h"
#include "common/util.h"
#include "server/ps.h"

void dp_ps_config_default(dp_ps_config_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->bind, sizeof c->bind, "tcp://*:5555");
    c->shard_index = 0;
    c->shard_count = 1;
    c->num_workers = 1;
    c->mode = DP_MODE_SYNC;
    c->replicas = 0;
    c->staleness = 0;
    snprintf(c->model_spec, sizeof c->model_spec, "%s", DP_MODEL_DEFAULT_SPEC);
    c->in_c = 1;
    c->in_h = c->in_w = 28;
    c->seed = 1;
    dp_optim_conf_default(&c->optim);
    c->checkpoint_every = 0;
    c->metrics_every = 5.0;
    c->heartbeat_timeout = 60.0;
}

static const char s_usage[] =
    "usage: downpour-ps [flags]\n"
    "  The parameter-server shard: holds a range of the model's parameters and the\n"
    "  optimizer state, answers workers' pulls and applies their gradients.\n"
    "\n"
    "  --bind tcp://*:PORT          endpoint to bind (default tcp://*:5555)\n"
    "  --job-name ps --task-index I --ps-hosts h:p,... [--worker-hosts h:p,...]\n"
    "                               TensorFlow-style cluster (or the TF_CONFIG variable):\n"
    "                               binds this task's port, shard I of K ps hosts\n"
    "  --shard I/K                  this shard's index and the shard count (default 0/1)\n"
    "  --workers N                  workers expected (default 1, or the worker hosts)\n"
    "  --mode sync|async|ssp        consistency (default sync)\n"
    "  --replicas-to-aggregate R    sync: gradients per step (default: all workers)\n"
    "  --staleness S                ssp: max pushes a worker may be ahead (default 0)\n"
    "  --lr-staleness               async/ssp: divide lr by max(1, staleness)\n"
    "  --model SPEC                 network (default \"" DP_MODEL_DEFAULT_SPEC "\")\n"
    "  --input CxHxW                input shape (default 1x28x28)\n"
    "  --seed N                     initialisation seed (default 1)\n"
    "  --optimizer NAME             sgd|momentum|nesterov|adam|adagrad (default adam)\n"
    "  --lr X                       learning rate (default: adam 0.0015, adagrad 0.01, others 0.05)\n"
    "  --momentum X                 momentum (default 0.9)\n"
    "  --weight-decay X             L2 weight decay (default 0)\n"
    "  --lr-schedule S              constant | step:STEPS:GAMMA | cosine:TOTAL (by version)\n"
    "  --checkpoint-dir DIR         DIR/ps-shard-I-of-K.safetensors: restored at start,\n"
    "                               written every --checkpoint-every versions and at exit\n"
    "  --checkpoint-every N         versions between checkpoints (default 0: at exit only)\n"
    "  --metrics FILE               JSON lines of counters (appended)\n"
    "  --metrics-every SECONDS      between metrics lines (default 5)\n"
    "  --heartbeat-timeout SECONDS  silence before a worker stops counting (default 60, 0 = never)\n"
    "  --ready-file FILE            write the bound endpoint to FILE once listening\n"
    "  --help                       this text\n"
    "Stops on SIGINT/SIGTERM or a SHUTDOWN message (final checkpoint first).\n";

static int s_int(const char *flag, const char *v, long lo, long hi, long *out, char *err)
{
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return dp_err(err, "%s '%s': expected an integer in [%ld, %ld]", flag, v, lo, hi);
    *out = x;
    return 0;
}

static int s_num(const char *flag, const char *v, double lo, double hi, double *out, char *err)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi))
        return dp_err(err, "%s '%s': expected a number in [%g, %g]", flag, v, lo, hi);
    *out = x;
    return 0;
}

static int s_copy(char *dst, size_t n, const char *flag, const char *v, char *err)
{
    if (snprintf(dst, n, "%s", v) >= (int)n) return dp_err(err, "%s: value too long", flag);
    return 0;
}

int dp_ps_parse_args(dp_ps_config_t *c, int argc, char **argv, char *err)
{
    const char *job = NULL, *ps_hosts = NULL, *worker_hosts = NULL;
    long task_index = -1;
    int have_bind = 0, have_shard = 0, have_workers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(s_usage, stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0)
            return dp_err(err, "unexpected argument '%s' (see --help)", a);
        char name[64];
        const char *v = NULL;
        const char *eq = strchr(a, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
            v = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
        if (strcmp(name, "--lr-staleness") == 0) {
            c->lr_staleness = 1;
            continue;
        }
        if (!v) {
            if (i + 1 >= argc) return dp_err(err, "%s needs a value (see --help)", name);
            v = argv[++i];
        }
        long x;
        double d;
        if (strcmp(name, "--bind") == 0) {
            if (s_copy(c->bind, sizeof c->bind, name, v, err)) return -1;
            have_bind = 1;
        } else if (strcmp(name, "--job-name") == 0) {
            job = v;
        } else if (strcmp(name, "--task-index") == 0) {
            if (s_int(name, v, 0, 1 << 20, &task_index, err)) return -1;
        } else if (strcmp(name, "--ps-hosts") == 0) {
            ps_hosts = v;
        } else if (strcmp(name, "--worker-hosts") == 0) {
            worker_hosts = v;
        } else if (strcmp(name, "--shard") == 0) {
            int si = -1, sk = -1, used = 0;
            if (sscanf(v, "%d/%d%n", &si, &sk, &used) != 2 || v[used] || sk < 1 || si < 0 || si >= sk)
                return dp_err(err, "--shard '%s': expected I/K with 0 <= I < K, e.g. 0/2", v);
            c->shard_index = si;
            c->shard_count = sk;
            have_shard = 1;
        } else if (strcmp(name, "--workers") == 0) {
            if (s_int(name, v, 1, 100000, &x, err)) return -1;
            c->num_workers = (int)x;
            have_workers = 1;
        } else if (strcmp(name, "--mode") == 0) {
            if (dp_mode_parse(v, &c->mode, err)) return dp_err(err, "--mode '%s': use sync, async or ssp", v);
        } else if (strcmp(name, "--replicas-to-aggregate") == 0) {
            if (s_int(name, v, 1, 100000, &x, err)) return -1;
            c->replicas = (int)x;
        } else if (strcmp(name, "--staleness") == 0) {
            if (s_int(name, v, 0, 1000000, &x, err)) return -1;
            c->staleness = (int)x;
        } else if (strcmp(name, "--model") == 0) {
            if (s_copy(c->model_spec, sizeof c->model_spec, name, v, err)) return -1;
        } else if (strcmp(name, "--input") == 0) {
            int ic, ih, iw, used = 0;
            if (sscanf(v, "%dx%dx%d%n", &ic, &ih, &iw, &used) != 3 || v[used] || ic < 1 || ih < 1 || iw < 1)
                return dp_err(err, "--input '%s': expected CxHxW, e.g. 1x28x28", v);
            c->in_c = ic;
            c->in_h = ih;
            c->in_w = iw;
        } else if (strcmp(name, "--seed") == 0) {
            char *end = NULL;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end) return dp_err(err, "--seed '%s': expected an integer", v);
            c->seed = s;
        } else if (strcmp(name, "--optimizer") == 0) {
            if (dp_optim_parse_kind(&c->optim, v, err)) return -1;
        } else if (strcmp(name, "--lr") == 0) {
            if (s_num(name, v, 1e-12, 1e6, &d, err)) return -1;
            c->optim.lr = (float)d;
        } else if (strcmp(name, "--momentum") == 0) {
            if (s_num(name, v, 0, 1, &d, err)) return -1;
            c->optim.momentum = (float)d;
        } else if (strcmp(name, "--weight-decay") == 0) {
            if (s_num(name, v, 0, 1e3, &d, err)) return -1;
            c->optim.weight_decay = (float)d;
        } else if (strcmp(name, "--lr-schedule") == 0) {
            if (dp_optim_parse_schedule(&c->optim, v, err)) return -1;
        } else if (strcmp(name, "--checkpoint-dir") == 0) {
            if (s_copy(c->checkpoint_dir, sizeof c->checkpoint_dir, name, v, err)) return -1;
        } else if (strcmp(name, "--checkpoint-every") == 0) {
            if (s_int(name, v, 0, 1L << 40, &x, err)) return -1;
            c->checkpoint_every = x;
        } else if (strcmp(name, "--metrics") == 0) {
            if (s_copy(c->metrics_path, sizeof c->metrics_path, name, v, err)) return -1;
        } else if (strcmp(name, "--metrics-every") == 0) {
            if (s_num(name, v, 0.01, 1e6, &d, err)) return -1;
            c->metrics_every = d;
        } else if (strcmp(name, "--heartbeat-timeout") == 0) {
            if (s_num(name, v, 0, 1e7, &d, err)) return -1;
            c->heartbeat_timeout = d;
        } else if (strcmp(name, "--ready-file") == 0) {
            if (s_copy(c->ready_file, sizeof c->ready_file, name, v, err)) return -1;
        } else {
            return dp_err(err, "unknown flag %s (see --help)", name);
        }
    }

    /* Cluster spec: flags or TF_CONFIG. */
    const char *tf = getenv("TF_CONFIG");
    if (job || ps_hosts || worker_hosts || task_index >= 0 || (tf && tf[0])) {
        dp_cluster_t *cl = dp_malloc(sizeof *cl);
        dp_cluster_init(cl);
        cl->flag_job_name = job;
        cl->flag_task_index = (int)task_index;
        cl->flag_ps_hosts = ps_hosts;
        cl->flag_worker_hosts = worker_hosts;
        int rc = -1;
        if (dp_cluster_resolve(cl, tf && tf[0] ? tf : NULL, err) != 0) goto cl_done;
        if (cl->job_name[0] && strcmp(cl->job_name, "ps") != 0) {
            dp_err(err, "--job-name %s: downpour-ps runs ps tasks (use downpour-worker for workers)",
                   cl->job_name);
            goto cl_done;
        }
        if (cl->job_name[0]) {
            if (!have_bind && dp_cluster_bind_endpoint(cl, c->bind, sizeof c->bind, err) != 0)
                goto cl_done;
            if (!have_shard) {
                c->shard_index = cl->task_index;
                c->shard_count = cl->n_ps;
            }
        }
        if (!have_workers && cl->n_workers > 0) c->num_workers = cl->n_workers;
        rc = 0;
    cl_done:
        free(cl);
        if (rc != 0) return -1;
    }
    if (c->replicas > c->num_workers)
        return dp_err(err, "--replicas-to-aggregate %d exceeds --workers %d", c->replicas,
                      c->num_workers);
    return 0;
}
