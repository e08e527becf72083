/* downpour-worker: one per GPU or CPU slot. With --standalone it trains
 * alone (the baseline); otherwise it joins parameter servers given by --ps
 * or by the TensorFlow-style cluster flags / TF_CONFIG. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "common/util.h"
#include "worker/train.h"

static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

static void s_usage(FILE *f)
{
    fprintf(f,
"usage: downpour-worker --standalone [options]          train alone (the baseline)\n"
"       downpour-worker --ps tcp://H:P[,...] --task-index I [options]\n"
"       downpour-worker --job-name worker --task-index I --ps-hosts H:P,... --worker-hosts H:P,...\n"
"       (or the TF_CONFIG environment variable, as Kubeflow's TFJob sets it)\n"
"\n"
"data and model:\n"
"  --data SPEC          fashion-mnist[:DIR] (default: Debian's), mnist:DIR, cifar10:DIR, idx:IMAGES,LABELS\n"
"  --model SPEC         default: \"" DP_MODEL_DEFAULT_SPEC "\"\n"
"  --device DEV         cpu (default) or cuda:K\n"
"  --threads N          CPU kernel threads (default: all cores)\n"
"training:\n"
"  --batch B            per-worker batch (default 64)\n"
"  --epochs E           epochs over this worker's share (default 1)\n"
"  --steps S            run exactly S steps instead\n"
"  --seed N             weights (standalone) and data order (default 1)\n"
"  --optimizer NAME     standalone: adam (default), sgd, momentum, nesterov, adagrad\n"
"  --lr X               default: adam 0.0015, adagrad 0.01, sgd / momentum / nesterov 0.05\n"
"  --momentum X (0.9), --weight-decay X\n"
"  --lr-schedule S      constant | step:N:G | cosine:N (standalone default: cosine over the run)\n"
"distributed:\n"
"  --ps LIST            parameter-server shards, tcp://host:port,...\n"
"  --task-index I       this worker's index; 0 is the chief (evaluates, saves, writes the summary)\n"
"  --delay-ms MS        inject a delay before each push (an experiment with staleness)\n"
"  --delay-dist D       fixed (default) or exp (exponential with mean MS)\n"
"  --timeout S          seconds to wait for a server reply (default 60)\n"
"output:\n"
"  --save FILE          model.safetensors (PyTorch names and layouts)\n"
"  --summary FILE       summary.json\n"
"  --metrics FILE       JSON lines, one per step\n"
"  --tensorboard DIR    TensorBoard event files (loss, accuracy, staleness)\n"
"  --eval-every N       evaluate the test set every N steps (--eval-limit K samples)\n"
"  --progress, --no-progress\n"
"  --help\n");
}

enum {
    OPT_STANDALONE = 256, OPT_PS, OPT_TASK_INDEX, OPT_JOB_NAME, OPT_PS_HOSTS, OPT_WORKER_HOSTS,
    OPT_DEVICE, OPT_DATA, OPT_MODEL, OPT_BATCH, OPT_EPOCHS, OPT_STEPS, OPT_LR, OPT_MOMENTUM,
    OPT_WD, OPT_OPTIMIZER, OPT_SCHEDULE, OPT_SEED, OPT_THREADS, OPT_SAVE, OPT_SUMMARY,
    OPT_METRICS, OPT_TENSORBOARD, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_EVAL_EVERY, OPT_EVAL_LIMIT, OPT_DELAY,
    OPT_DELAY_DIST, OPT_TIMEOUT, OPT_HELP,
};

static const struct option s_options[] = {
    {"standalone", no_argument, 0, OPT_STANDALONE},
    {"ps", required_argument, 0, OPT_PS},
    {"task-index", required_argument, 0, OPT_TASK_INDEX},
    {"job-name", required_argument, 0, OPT_JOB_NAME},
    {"ps-hosts", required_argument, 0, OPT_PS_HOSTS},
    {"worker-hosts", required_argument, 0, OPT_WORKER_HOSTS},
    {"device", required_argument, 0, OPT_DEVICE},
    {"data", required_argument, 0, OPT_DATA},
    {"model", required_argument, 0, OPT_MODEL},
    {"batch", required_argument, 0, OPT_BATCH},
    {"epochs", required_argument, 0, OPT_EPOCHS},
    {"steps", required_argument, 0, OPT_STEPS},
    {"lr", required_argument, 0, OPT_LR},
    {"momentum", required_argument, 0, OPT_MOMENTUM},
    {"weight-decay", required_argument, 0, OPT_WD},
    {"optimizer", required_argument, 0, OPT_OPTIMIZER},
    {"lr-schedule", required_argument, 0, OPT_SCHEDULE},
    {"seed", required_argument, 0, OPT_SEED},
    {"threads", required_argument, 0, OPT_THREADS},
    {"save", required_argument, 0, OPT_SAVE},
    {"summary", required_argument, 0, OPT_SUMMARY},
    {"metrics", required_argument, 0, OPT_METRICS},
    {"tensorboard", required_argument, 0, OPT_TENSORBOARD},
    {"progress", no_argument, 0, OPT_PROGRESS},
    {"no-progress", no_argument, 0, OPT_NO_PROGRESS},
    {"eval-every", required_argument, 0, OPT_EVAL_EVERY},
    {"eval-limit", required_argument, 0, OPT_EVAL_LIMIT},
    {"delay-ms", required_argument, 0, OPT_DELAY},
    {"delay-dist", required_argument, 0, OPT_DELAY_DIST},
    {"timeout", required_argument, 0, OPT_TIMEOUT},
    {"help", no_argument, 0, OPT_HELP},
    {0, 0, 0, 0},
};

/* Parse a number flag; one clear line and exit on garbage. */
static double s_number(const char *flag, const char *text, double lo, double hi)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "downpour-worker: --%s %s: expected a number in [%g, %g]\n", flag, text, lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    dp_log_init("downpour-worker");
    dp_train_conf_t c;
    dp_train_conf_default(&c);
    dp_cluster_t cl;
    dp_cluster_init(&cl);
    int standalone = 0;
    char err[DP_ERR_LEN] = "";
    int opt;
    while ((opt = getopt_long(argc, argv, "h", s_options, NULL)) != -1) {
        switch (opt) {
        case OPT_STANDALONE: standalone = 1; break;
        case OPT_PS: c.ps = optarg; break;
        case OPT_TASK_INDEX: cl.flag_task_index = (int)s_number("task-index", optarg, 0, 1e6); break;
        case OPT_JOB_NAME: cl.flag_job_name = optarg; break;
        case OPT_PS_HOSTS: cl.flag_ps_hosts = optarg; break;
        case OPT_WORKER_HOSTS: cl.flag_worker_hosts = optarg; break;
        case OPT_DEVICE: c.device = optarg; break;
        case OPT_DATA: c.data = optarg; break;
        case OPT_MODEL: c.model = optarg; break;
        case OPT_BATCH: c.batch = (int)s_number("batch", optarg, 1, 1 << 16); break;
        case OPT_EPOCHS: c.epochs = (int)s_number("epochs", optarg, 1, 1e6); break;
        case OPT_STEPS: c.steps = (long)s_number("steps", optarg, 1, 1e12); break;
        case OPT_LR: c.optim.lr = (float)s_number("lr", optarg, 1e-12, 1e3); break;
        case OPT_MOMENTUM: c.optim.momentum = (float)s_number("momentum", optarg, 0, 1); break;
        case OPT_WD: c.optim.weight_decay = (float)s_number("weight-decay", optarg, 0, 1); break;
        case OPT_OPTIMIZER:
            if (dp_optim_parse_kind(&c.optim, optarg, err) != 0) goto usage_error;
            break;
        case OPT_SCHEDULE:
            if (dp_optim_parse_schedule(&c.optim, optarg, err) != 0) goto usage_error;
            c.schedule_given = 1;
            break;
        case OPT_SEED: c.seed = (unsigned long long)s_number("seed", optarg, 0, 1.8e19); break;
        case OPT_THREADS: c.threads = (int)s_number("threads", optarg, 1, 1024); break;
        case OPT_SAVE: c.save = optarg; break;
        case OPT_SUMMARY: c.summary = optarg; break;
        case OPT_METRICS: c.metrics = optarg; break;
        case OPT_TENSORBOARD: c.tensorboard = optarg; break;
        case OPT_PROGRESS: c.progress = 1; break;
        case OPT_NO_PROGRESS: c.progress = 0; break;
        case OPT_EVAL_EVERY: c.eval_every = (long)s_number("eval-every", optarg, 0, 1e12); break;
        case OPT_EVAL_LIMIT: c.eval_limit = (int)s_number("eval-limit", optarg, 0, 1e9); break;
        case OPT_DELAY: c.delay_ms = s_number("delay-ms", optarg, 0, 1e7); break;
        case OPT_DELAY_DIST:
            if (strcmp(optarg, "exp") == 0) c.delay_exp = 1;
            else if (strcmp(optarg, "fixed") == 0) c.delay_exp = 0;
            else {
                dp_err(err, "--delay-dist %s: expected fixed or exp", optarg);
                goto usage_error;
            }
            break;
        case OPT_TIMEOUT: c.timeout_s = s_number("timeout", optarg, 0.1, 1e6); break;
        case OPT_HELP:
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        dp_err(err, "unexpected argument '%s'", argv[optind]);
        goto usage_error;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int rc;
    if (standalone) {
        if (c.ps) {
            dp_err(err, "--standalone and --ps exclude each other");
            goto usage_error;
        }
        rc = dp_train_standalone(&c, err);
    } else {
        char endpoints[8192];
        if (!c.ps) {
            /* TensorFlow-style cluster: flags, else TF_CONFIG. */
            if (dp_cluster_resolve(&cl, getenv("TF_CONFIG"), err) != 0) goto usage_error;
            if (cl.n_ps == 0) {
                dp_err(err, "no parameter servers: give --ps tcp://H:P, --ps-hosts H:P (with --job-name worker --task-index I), TF_CONFIG, or --standalone");
                goto usage_error;
            }
            if (cl.job_name[0] && strcmp(cl.job_name, "worker") != 0) {
                dp_err(err, "--job-name %s: downpour-worker runs worker tasks (start downpour-ps for ps tasks)", cl.job_name);
                goto usage_error;
            }
            if (dp_cluster_ps_endpoints(&cl, endpoints, sizeof endpoints, err) != 0) goto usage_error;
            c.ps = endpoints;
            c.task_index = cl.task_index < 0 ? 0 : cl.task_index;
        } else {
            c.task_index = cl.flag_task_index < 0 ? 0 : cl.flag_task_index;
        }
        rc = dp_train_distributed(&c, &s_stop, err);
    }
    if (rc != 0) {
        dp_log_error("%s", err);
        return 1;
    }
    return 0;
usage_error:
    fprintf(stderr, "downpour-worker: %s\n(see downpour-worker --help)\n", err);
    return 2;
}
