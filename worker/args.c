/* args: downpour-worker's option table and what the flags imply (see
 * args.h): --standalone excludes servers; without --ps the servers and this
 * worker's index come from the TensorFlow-style cluster (flags, else
 * TF_CONFIG), and the resolved cluster is logged at start so a TFJob's
 * worker says which task it took itself for. */
#include "worker/args.h"

#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/util.h"
#include "worker/ps_client.h"

static const char s_synopsis[] =
"usage: downpour-worker --standalone [options]          train alone (the baseline)\n"
"       downpour-worker --ps tcp://H:P[,...] --task-index I [options]\n"
"       downpour-worker --job-name worker --task-index I --ps-hosts H:P,... --worker-hosts H:P,...\n"
"       (or the TF_CONFIG environment variable, as Kubeflow's TFJob sets it)\n"
"\n";

void dp_worker_args_default(dp_worker_args_t *a)
{
    memset(a, 0, sizeof *a);
    dp_train_conf_default(&a->conf);
    dp_cluster_init(&a->cluster);
}

static int s_set_optimizer(void *arg, const char *v, char *err)
{
    return dp_optim_parse_kind(&((dp_train_conf_t *)arg)->optim, v, err);
}

static int s_set_schedule(void *arg, const char *v, char *err)
{
    dp_train_conf_t *c = arg;
    c->schedule_given = 1;
    return dp_optim_parse_schedule(&c->optim, v, err);
}

static int s_set_transport(void *arg, const char *v, char *err)
{
    return dp_ps_transport_parse(v, &((dp_train_conf_t *)arg)->transport, err);
}

static int s_set_wire(void *arg, const char *v, char *err)
{
    return dp_ps_wire_parse(v, &((dp_train_conf_t *)arg)->wire, err);
}

static int s_set_compress(void *arg, const char *v, char *err)
{
    return dp_compress_parse(v, &((dp_train_conf_t *)arg)->compress, err);
}

static int s_set_error_feedback(void *arg, const char *v, char *err)
{
    return dp_compress_ef_parse(v, &((dp_train_conf_t *)arg)->compress.error_feedback, err);
}

/* The table in --help order: data and model, training, distributed, output. */
void dp_worker_options(dp_opts_t *o, dp_worker_args_t *a)
{
    const int P = DP_OPTS_PASS;
    dp_train_conf_t *c = &a->conf;
    dp_cluster_t *cl = &a->cluster;
    const dp_opts_flag_t t[] = {
        DP_FLAG_TITLE("data and model:"),
        DP_FLAG_STR("data", "SPEC", &c->data, P,
                    "fashion-mnist[:DIR] (default: Debian's), mnist:DIR, cifar10:DIR,\nidx:IMAGES,LABELS"),
        DP_FLAG_NUM("train-samples", DP_OPTS_INT, "N", &c->train_samples, 0, 1 << 30, P,
                    "train on the first N samples of the training split only (default 0:\nall; the test split stays whole)"),
        DP_FLAG_STR("model", "SPEC", &c->model, P, "default: \"" DP_MODEL_DEFAULT_SPEC "\""),
        DP_FLAG_SET("augment", &c->augment, 1, P,
                    "random crop (zero padding 4) and horizontal flip of each training\n"
                    "sample, drawn by seed, step and place in the global batch"),
        DP_FLAG_STR("normalize", "train|M,../S,..", &c->normalize, P,
                    "per-channel (x - mean) / std: the training set's figures, or\n"
                    "these (e.g. 0.4914,0.4822,0.4465/0.2470,0.2435,0.2616)"),
        DP_FLAG_STR("device", "DEV", &c->device, P,
                    "cpu (default), cuda:K, or cpu:staged (the CPU through a\n"
                    "device's copies: for testing the device paths)"),
        DP_FLAG_NUM("threads", DP_OPTS_INT, "N", &c->threads, 1, 1024, P,
                    "CPU kernel threads (default: all cores)"),
        DP_FLAG_TITLE("training:"),
        DP_FLAG_SET("standalone", &a->standalone, 1, 0, "train alone (the baseline), no servers"),
        DP_FLAG_NUM("batch", DP_OPTS_INT, "B", &c->batch, 1, 1 << 16, P, "per-worker batch (default 64)"),
        DP_FLAG_NUM("epochs", DP_OPTS_INT, "E", &c->epochs, 1, 1000000, P,
                    "epochs over this worker's share (default 1)"),
        DP_FLAG_NUM("steps", DP_OPTS_LONG, "S", &c->steps, 1, 1000000000000L, P, "run exactly S steps instead"),
        DP_FLAG_SEED("seed", &c->seed, P, "weights (standalone) and data order (default 1)"),
        DP_FLAG_NUM("bn-ghost-batch", DP_OPTS_INT, "G", &c->bn_ghost_batch, 1, 1 << 16, P,
                    "standalone: batch norm statistics per ghost batch of G samples\n"
                    "(--batch R*G then equals sync with R workers at batch G)"),
        /* passed on by `downpour local` as the servers' are: the workers
         * use them only alone or as the inner optimizer of --local-steps */
        DP_FLAG_CALL("optimizer", "NAME", s_set_optimizer, c, P,
                     "standalone and --local-steps' inner optimizer: adam (default),\n"
                     "sgd, momentum, nesterov, adagrad, rmsprop"),
        DP_FLAG_NUM("lr", DP_OPTS_FLOAT, "X", &c->optim.lr, 1e-12, 1e6, P,
                    "default: adam 0.0015, adagrad / rmsprop 0.01, sgd / momentum / nesterov 0.05"),
        DP_FLAG_NUM("momentum", DP_OPTS_FLOAT, "X", &c->optim.momentum, 0, 1, P, "default 0.9"),
        DP_FLAG_NUM("rms-alpha", DP_OPTS_FLOAT, "X", &c->optim.alpha, 0, 1, P,
                    "rmsprop: square average's smoothing (default 0.99)"),
        DP_FLAG_NUM("eps", DP_OPTS_FLOAT, "X", &c->optim.eps, 1e-30, 1e3, P,
                    "adam, adagrad, rmsprop: added to the root (default 1e-8)"),
        DP_FLAG_NUM("weight-decay", DP_OPTS_FLOAT, "X", &c->optim.weight_decay, 0, 1e3, P,
                    "default 0"),
        DP_FLAG_CALL("lr-schedule", "S", s_set_schedule, c, P,
                     "constant | step:N:G | cosine:N, by data step (standalone default:\n"
                     "cosine over the run; --local-steps: constant)"),
        DP_FLAG_TITLE("distributed:"),
        DP_FLAG_STR("ps", "LIST", &c->ps, 0, "parameter-server shards, tcp://host:port,..."),
        DP_FLAG_NUM("task-index", DP_OPTS_INT, "I", &cl->flag_task_index, 0, 1000000, 0,
                    "this worker's index; 0 is the chief (evaluates, saves, writes the summary)"),
        DP_FLAG_STR("job-name", "worker", &cl->flag_job_name, 0, "TensorFlow-style cluster (or TF_CONFIG)"),
        DP_FLAG_STR("ps-hosts", "H:P,...", &cl->flag_ps_hosts, 0, "the ps job's tasks"),
        DP_FLAG_STR("worker-hosts", "H:P,...", &cl->flag_worker_hosts, 0, "the worker job's tasks"),
        DP_FLAG_NUM("local-steps", DP_OPTS_LONG, "H", &c->local_steps, 1, 1000000, P,
                    "local SGD / DiLoCo: H steps of --optimizer on this worker's own\n"
                    "copy, then one push of the weights pulled minus those reached\n"
                    "(the servers need the same --local-steps; default 1: off)"),
        DP_FLAG_NUM("delay-ms", DP_OPTS_DOUBLE, "MS", &c->delay_ms, 0, 1e7, P,
                    "inject a delay before each push (an experiment with staleness)"),
        DP_FLAG_CHOICE("delay-dist", "fixed|exp", &c->delay_exp, P,
                       "fixed (default) or exponential with mean MS"),
        DP_FLAG_CALL("transport", "auto|shm|zmq", s_set_transport, c, P,
                     "tensors through shared memory with servers on this host\n"
                     "(auto, the default: when the endpoint is ipc or loopback), or\n"
                     "always (shm: fail if not granted), or never (zmq: frames)"),
        DP_FLAG_CALL("wire", "fp32|bf16", s_set_wire, c, P,
                     "precision of gradients and weights in ZeroMQ frames (default\n"
                     "fp32; bf16 halves the bytes, the servers keep fp32)"),
        DP_FLAG_CALL("compress", "none|topk:F|sign", s_set_compress, c, P,
                     "compress each push: topk:F sends the largest F of the entries\n"
                     "by magnitude (0 < F <= 0.5, e.g. 0.01), sign one bit each and\n"
                     "their mean magnitude (default none); always in frames"),
        DP_FLAG_CALL("error-feedback", "on|off", s_set_error_feedback, c, P,
                     "with --compress: keep what a push did not send and add it to\n"
                     "the next gradient (default on)"),
        DP_FLAG_CHOICE("overlap", "off|on", &c->overlap, P,
                       "pull the next weights and push the last gradient while computing,\n"
                       "on weights one step older (default: on for a GPU worker in async,\n"
                       "else off; sync: always off)"),
        DP_FLAG_CHOICE("stream-push", "off|on", &c->stream_push, P,
                       "push each layer's gradient as soon as the backward pass has\n"
                       "made it (in parts of at least 256 KiB), so the push travels\n"
                       "under the rest of the backward; the servers apply the step\n"
                       "once all its parts are in and checked (default on for a\n"
                       "CPU worker, off for a GPU's, whose parts are its per-layer\n"
                       "copies; not with --overlap or --local-steps)"),
        DP_FLAG_CHOICE("stream-pull", "off|on", &c->stream_pull, P,
                       "pull each layer's weights in the order the forward needs them\n"
                       "(each shard's reply cut where a layer begins), so the forward\n"
                       "starts on the first layers while the later ones travel; the\n"
                       "weights are the same snapshot as a whole pull's (default on\n"
                       "for a CPU worker, off for a GPU's, which uploads each layer\n"
                       "as it comes; not with --overlap or --local-steps; over\n"
                       "ZeroMQ frames only: shared memory is read whole)"),
        DP_FLAG_NUM("timeout", DP_OPTS_DOUBLE, "S", &c->timeout_s, 0.1, 1e6, P,
                    "seconds to wait for a server reply (default 60)"),
        DP_FLAG_STR("curve-secret", "FILE", &c->curve_secret, 0,
                    "CURVE: this worker's secret key (downpour keygen FILE)"),
        DP_FLAG_STR("curve-server", "FILE.pub[,...]", &c->curve_server, 0,
                    "CURVE: the servers' public key (one for all, or one per\nserver in --ps order)"),
        DP_FLAG_TITLE("output:"),
        DP_FLAG_STR("save", "FILE", &c->save, 0, "model.safetensors (PyTorch names and layouts)"),
        DP_FLAG_STR("summary", "FILE", &c->summary, 0, "summary.json"),
        DP_FLAG_STR("metrics", "FILE", &c->metrics, 0, "JSON lines, one per step"),
        DP_FLAG_STR("tensorboard", "DIR", &c->tensorboard, 0,
                    "TensorBoard event files (loss, accuracy, staleness)"),
        DP_FLAG_NUM("eval-every", DP_OPTS_LONG, "N", &c->eval_every, 0, 1000000000000L, P,
                    "evaluate the test set every N steps (0: at the end)"),
        DP_FLAG_NUM("eval-limit", DP_OPTS_INT, "K", &c->eval_limit, 0, 1000000000, P,
                    "test samples per periodic evaluation (0: all)"),
        DP_FLAG_SET("progress", &c->progress, DP_PROGRESS_ON, 0, "the live progress line (default: on a terminal)"),
        DP_FLAG_SET("no-progress", &c->progress, DP_PROGRESS_OFF, 0, "no progress line"),
    };
    dp_opts_init(o, "downpour-worker", s_synopsis, DP_MODEL_SPEC_HELP);
    dp_opts_add(o, t, (int)(sizeof t / sizeof t[0]));
}

/* No --ps: the servers and this task's index from the cluster spec. */
static int s_from_cluster(dp_worker_args_t *a, char *err)
{
    dp_cluster_t *cl = &a->cluster;
    if (dp_cluster_resolve(cl, getenv("TF_CONFIG"), err) != 0) return -1;
    if (cl->n_ps == 0)
        return dp_err(err, "no parameter servers: give --ps tcp://H:P, --ps-hosts H:P (with "
                           "--job-name worker --task-index I), TF_CONFIG, or --standalone");
    if (cl->job_name[0] && strcmp(cl->job_name, "worker") != 0)
        return dp_err(err, "--job-name %s: downpour-worker runs worker tasks (start downpour-ps "
                           "for ps tasks)", cl->job_name);
    if (dp_cluster_ps_endpoints(cl, a->endpoints, sizeof a->endpoints, err) != 0) return -1;
    a->conf.ps = a->endpoints;
    a->conf.task_index = cl->task_index < 0 ? 0 : cl->task_index;
    dp_cluster_log(cl);
    return 0;
}

int dp_worker_parse_args(dp_worker_args_t *a, int argc, char **argv, char *err)
{
    dp_opts_t o;
    dp_worker_options(&o, a);
    int rc = dp_opts_parse(&o, argc, argv, err);
    if (rc != 0) return rc;
    if (a->standalone) {
        if (a->conf.ps) return dp_err(err, "--standalone and --ps exclude each other");
        return 0;
    }
    if (!a->conf.curve_secret != !a->conf.curve_server)
        return dp_err(err, "--curve-secret and --curve-server go together: give both (this "
                           "worker's secret key and the servers' public keys) or neither");
    if (a->conf.ps) {
        a->conf.task_index = a->cluster.flag_task_index < 0 ? 0 : a->cluster.flag_task_index;
        return 0;
    }
    return s_from_cluster(a, err);
}
