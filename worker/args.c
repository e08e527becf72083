/* args: downpour-worker's option table and what the flags imply (see
 * args.h): --standalone excludes servers; without --ps the servers and this
 * worker's index come from the TensorFlow-style cluster (flags, else
 * TF_CONFIG), and the resolved cluster is logged at start so a TFJob's
 * worker says which task it took itself for. */
#include "worker/args.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/dylu.h"
#include "common/model.h"
#include "common/util.h"
#include "worker/exec/a3c.h"
#include "worker/client/ps_client.h"

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

static int s_set_row_optimizer(void *arg, const char *v, char *err)
{
    return dp_row_optim_parse_kind(v, &((dp_train_conf_t *)arg)->row_optim, err);
}

static int s_set_local_steps(void *arg, const char *v, char *err)
{
    dp_worker_args_t *a = arg;
    return dp_dylu_parse(v, &a->conf.local_steps, &a->conf.local_auto, err);
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

static int s_set_precision(void *arg, const char *v, char *err)
{
    return dp_precision_parse(v, &((dp_train_conf_t *)arg)->precision, err);
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

/* The table in --help order: data and model, training, distributed, output;
 * each value lands at an offset into dp_worker_args_t (dp_opts_add_at). */
#define S_AT(field) offsetof(dp_worker_args_t, field)

static const dp_opts_entry_t s_table[] = {
    {DP_FLAG_TITLE("data and model:"), 0},
    {DP_FLAG_STR("data", "SPEC", NULL, DP_OPTS_PASS,
        "fashion-mnist[:DIR] (default: Debian's), mnist:DIR, cifar10:DIR,\nidx:IMAGES,LABELS; "
        "libsvm:TRAIN[:TEST] (sparse svmlight files, plain or\ngzip, for a model that starts with "
        "embed:D)"),
     S_AT(conf.data)},
    {DP_FLAG_NUM("train-samples", DP_OPTS_INT, "N", NULL, 0, 1 << 30, DP_OPTS_PASS,
        "train on the first N samples of the training split only (default 0:\nall; the test split stays whole)"),
     S_AT(conf.train_samples)},
    {DP_FLAG_STR("model", "SPEC", NULL, DP_OPTS_PASS, "default: \"" DP_MODEL_DEFAULT_SPEC "\""),
     S_AT(conf.model)},
    {DP_FLAG_SET("augment", NULL, 1, DP_OPTS_PASS,
        "random crop (zero padding 4) and horizontal flip of each training\n"
        "sample, drawn by seed, step and place in the global batch"), S_AT(conf.augment)},
    {DP_FLAG_STR("normalize", "train|M,../S,..", NULL, DP_OPTS_PASS,
        "per-channel (x - mean) / std: the training set's figures, or\n"
        "these (e.g. 0.4914,0.4822,0.4465/0.2470,0.2435,0.2616)"), S_AT(conf.normalize)},
    {DP_FLAG_STR("device", "DEV", NULL, DP_OPTS_PASS,
        "cpu (default), cuda:K, or cpu:staged (the CPU through a\n"
        "device's copies: for testing the device paths)"), S_AT(conf.device)},
    {DP_FLAG_NUM("threads", DP_OPTS_INT, "N", NULL, 1, 1024, DP_OPTS_PASS,
        "CPU kernel threads (default: all cores)"), S_AT(conf.threads)},
    {DP_FLAG_CALL("precision", "fp32|bf16", s_set_precision, NULL, DP_OPTS_PASS,
        "the conv and fc layers' arithmetic (default fp32); bf16: bf16\n"
        "operands, fp32 sums, on a CPU with AMX or AVX512_BF16 (the rest\n"
        "of the step and the servers' weights stay fp32)"), S_AT(conf)},
    {DP_FLAG_TITLE("training:"), 0},
    {DP_FLAG_SET("standalone", NULL, 1, 0, "train alone (the baseline), no servers"),
     S_AT(standalone)},
    {DP_FLAG_NUM("batch", DP_OPTS_INT, "B", NULL, 1, 1 << 16, DP_OPTS_PASS, "per-worker batch (default 64)"),
     S_AT(conf.batch)},
    {DP_FLAG_NUM("epochs", DP_OPTS_INT, "E", NULL, 1, 1000000, DP_OPTS_PASS,
        "epochs over this worker's share (default 1)"), S_AT(conf.epochs)},
    {DP_FLAG_NUM("steps", DP_OPTS_LONG, "S", NULL, 1, 1000000000000L, DP_OPTS_PASS, "run exactly S steps instead"),
     S_AT(conf.steps)},
    {DP_FLAG_SEED("seed", NULL, DP_OPTS_PASS, "weights (standalone) and data order (default 1)"),
     S_AT(conf.seed)},
    {DP_FLAG_NUM("bn-ghost-batch", DP_OPTS_INT, "G", NULL, 1, 1 << 16, DP_OPTS_PASS,
        "standalone: batch norm statistics per ghost batch of G samples\n"
        "(--batch R*G then equals sync with R workers at batch G)"), S_AT(conf.bn_ghost_batch)},
    /* passed on by `downpour local` as the servers' are: the workers
     * use them only alone or as the inner optimizer of --local-steps */
    {DP_FLAG_CALL("optimizer", "NAME", s_set_optimizer, NULL, DP_OPTS_PASS,
        "standalone and --local-steps' inner optimizer: adam (default),\n"
        "sgd, momentum, nesterov, adagrad, rmsprop"), S_AT(conf)},
    {DP_FLAG_NUM("lr", DP_OPTS_FLOAT, "X", NULL, 1e-12, 1e6, DP_OPTS_PASS,
        "default: adam 0.0015, adagrad / rmsprop 0.01, sgd / momentum / nesterov 0.05"),
     S_AT(conf.optim.lr)},
    {DP_FLAG_NUM("momentum", DP_OPTS_FLOAT, "X", NULL, 0, 1, DP_OPTS_PASS, "default 0.9"),
     S_AT(conf.optim.momentum)},
    {DP_FLAG_NUM("rms-alpha", DP_OPTS_FLOAT, "X", NULL, 0, 1, DP_OPTS_PASS,
        "rmsprop: square average's smoothing (default 0.99)"), S_AT(conf.optim.alpha)},
    {DP_FLAG_NUM("eps", DP_OPTS_FLOAT, "X", NULL, 1e-30, 1e3, DP_OPTS_PASS,
        "adam, adagrad, rmsprop: added to the root (default 1e-8)"), S_AT(conf.optim.eps)},
    {DP_FLAG_NUM("weight-decay", DP_OPTS_FLOAT, "X", NULL, 0, 1e3, DP_OPTS_PASS,
        "default 0"), S_AT(conf.optim.weight_decay)},
    {DP_FLAG_CALL("lr-schedule", "S", s_set_schedule, NULL, DP_OPTS_PASS,
        "constant | step:N:G | cosine:N, by data step (standalone default:\n"
        "cosine over the run; --local-steps: constant)"), S_AT(conf)},
    {DP_FLAG_TITLE("sparse models, standalone (in a cluster, downpour-ps's flags):"), 0},
    {DP_FLAG_CALL("row-optimizer", "NAME", s_set_row_optimizer, NULL, 0,
        "the embedding rows' optimizer, each row stepped when its key is\n"
        "in a batch: adagrad (default), sgd, adam, ftrl, sparse_adam\n"
        "(torch.optim.SparseAdam's: bias corrected by the table's steps)"), S_AT(conf)},
    {DP_FLAG_NUM("row-lr", DP_OPTS_FLOAT, "X", NULL, 1e-12, 1e6, 0,
        "the rows' lr (ftrl: alpha), constant (default: the dense layers'\n--lr)"),
     S_AT(conf.row_lr)},
    {DP_FLAG_NUM("row-init", DP_OPTS_FLOAT, "X", NULL, 0, 1e3, 0,
        "a new row starts uniform in [-X, X) by seed and key; 0: zeros\n"
        "(default 0.01; ftrl: 0, the only start it allows)"), S_AT(conf.row_init)},
    {DP_FLAG_TITLE("reinforcement learning (A3C; async is A3C, sync A2C):"), 0},
    {DP_FLAG_STR("env", "NAME", NULL, DP_OPTS_PASS,
        "act in an environment instead of training on --data: cartpole-v1\n"
        "or acrobot-v1 (the model: --model ending in ac, default\n"
        "\"" DP_A3C_DEFAULT_SPEC "\")"), S_AT(conf.a3c.env)},
    {DP_FLAG_NUM("envs", DP_OPTS_INT, "K", NULL, 1, DP_A3C_MAX_ENVS, DP_OPTS_PASS,
        "environments each worker acts in (default 1)"), S_AT(conf.a3c.envs)},
    {DP_FLAG_NUM("t-max", DP_OPTS_INT, "T", NULL, 1, DP_A3C_MAX_T, DP_OPTS_PASS,
        "steps of each environment per push (default 5)"), S_AT(conf.a3c.t_max)},
    {DP_FLAG_NUM("entropy", DP_OPTS_FLOAT, "B", NULL, 0, 100, DP_OPTS_PASS,
        "weight of the entropy bonus (default 0.01)"), S_AT(conf.a3c.entropy)},
    {DP_FLAG_NUM("gamma", DP_OPTS_FLOAT, "G", NULL, 0, 1, DP_OPTS_PASS,
        "discount (default 0.99)"), S_AT(conf.a3c.gamma)},
    {DP_FLAG_CHOICE("obs-norm", "off|on", NULL, DP_OPTS_PASS,
        "on: the model's first layer obsnorm, each observation component\nnormalised by the running statistics the servers keep (default off)"),
     S_AT(conf.a3c.obs_norm)},
    {DP_FLAG_NUM("reward-scale", DP_OPTS_FLOAT, "S", NULL, 1e-6, 1e6, DP_OPTS_PASS,
        "each reward times S in the returns learned from (default 0.1;\n1: off); returns reported stay unscaled"),
     S_AT(conf.a3c.reward_scale)},
    {DP_FLAG_NUM("clip-norm", DP_OPTS_FLOAT, "N", NULL, 0, 1e9, DP_OPTS_PASS,
        "clip each gradient to this global L2 norm (default 40, as A3C;\n0: off)"),
     S_AT(conf.a3c.clip_norm)},
    {DP_FLAG_NUM("env-steps", DP_OPTS_LONG, "N", NULL, 1, 1000000000000L, DP_OPTS_PASS,
        "the run's budget in environment steps, all workers together\n(default 500000)"),
     S_AT(conf.a3c.env_steps)},
    {DP_FLAG_TITLE("distributed:"), 0},
    {DP_FLAG_STR("ps", "LIST", NULL, 0, "parameter-server shards, tcp://host:port,..."),
     S_AT(conf.ps)},
    {DP_FLAG_NUM("task-index", DP_OPTS_INT, "I", NULL, 0, 1000000, 0,
        "this worker's index; 0 is the chief (evaluates, saves, writes the summary)"),
     S_AT(cluster.flag_task_index)},
    {DP_FLAG_STR("job-name", "worker", NULL, 0, "TensorFlow-style cluster (or TF_CONFIG)"),
     S_AT(cluster.flag_job_name)},
    {DP_FLAG_STR("ps-hosts", "H:P,...", NULL, 0, "the ps job's tasks"),
     S_AT(cluster.flag_ps_hosts)},
    {DP_FLAG_STR("worker-hosts", "H:P,...", NULL, 0, "the worker job's tasks"),
     S_AT(cluster.flag_worker_hosts)},
    {DP_FLAG_CALL("local-steps", "H|auto[:H]", s_set_local_steps, NULL, DP_OPTS_PASS,
        "local SGD / DiLoCo: H steps of --optimizer on this worker's own\n"
        "copy, then one push of the weights pulled minus those reached\n"
        "(the servers need the same --local-steps; default 1: off); auto\n"
        "(DyLU): H x this worker's speed / the crew's fastest, a round"), 0},
    {DP_FLAG_NUM("delay-ms", DP_OPTS_DOUBLE, "MS", NULL, 0, 1e7, DP_OPTS_PASS,
        "inject a delay before each push (an experiment with staleness)"), S_AT(conf.delay_ms)},
    {DP_FLAG_CHOICE("delay-dist", "fixed|exp", NULL, DP_OPTS_PASS,
        "fixed (default) or exponential with mean MS"), S_AT(conf.delay_exp)},
    {DP_FLAG_CALL("transport", "auto|shm|zmq", s_set_transport, NULL, DP_OPTS_PASS,
        "tensors through shared memory with servers on this host\n"
        "(auto, the default: when the endpoint is ipc or loopback), or\n"
        "always (shm: fail if not granted), or never (zmq: frames)"), S_AT(conf)},
    {DP_FLAG_CALL("wire", "fp32|bf16", s_set_wire, NULL, DP_OPTS_PASS,
        "precision of gradients and weights in ZeroMQ frames (default\n"
        "fp32; bf16 halves the bytes, the servers keep fp32)"), S_AT(conf)},
    {DP_FLAG_CALL("compress", "none|topk:F|sign", s_set_compress, NULL, DP_OPTS_PASS,
        "compress each push: topk:F sends the largest F of the entries\n"
        "by magnitude (0 < F <= 0.5, e.g. 0.01), sign one bit each and\n"
        "their mean magnitude (default none); always in frames"), S_AT(conf)},
    {DP_FLAG_CALL("error-feedback", "on|off", s_set_error_feedback, NULL, DP_OPTS_PASS,
        "with --compress: keep what a push did not send and add it to\n"
        "the next gradient (default on)"), S_AT(conf)},
    {DP_FLAG_CHOICE("overlap", "off|on", NULL, DP_OPTS_PASS,
        "pull the next weights and push the last gradient while computing,\n"
        "on weights one step older (default: on for a GPU worker in async,\n"
        "else off; sync: always off)"), S_AT(conf.overlap)},
    {DP_FLAG_CHOICE("stream-push", "off|on", NULL, DP_OPTS_PASS,
        "push each layer's gradient as soon as the backward pass has\n"
        "made it (in parts of at least 256 KiB), so the push travels\n"
        "under the rest of the backward; the servers apply the step\n"
        "once all its parts are in and checked (default on for a\n"
        "CPU worker, off for a GPU's, whose parts are its per-layer\n"
        "copies; not with --overlap or --local-steps)"), S_AT(conf.stream_push)},
    {DP_FLAG_CHOICE("stream-pull", "off|on", NULL, DP_OPTS_PASS,
        "pull each layer's weights in the order the forward needs them\n"
        "(each shard's reply cut where a layer begins), so the forward\n"
        "starts on the first layers while the later ones travel; the\n"
        "weights are the same snapshot as a whole pull's (default on\n"
        "for a CPU worker, off for a GPU's, which uploads each layer\n"
        "as it comes; not with --overlap or --local-steps; over\n"
        "ZeroMQ frames only: shared memory is read whole)"), S_AT(conf.stream_pull)},
    {DP_FLAG_NUM("timeout", DP_OPTS_DOUBLE, "S", NULL, 0.1, 1e6, DP_OPTS_PASS,
        "seconds to wait for a server reply (default 60)"), S_AT(conf.timeout_s)},
    {DP_FLAG_STR("curve-secret", "FILE", NULL, 0,
        "CURVE: this worker's secret key (downpour keygen FILE)"), S_AT(conf.curve_secret)},
    {DP_FLAG_STR("curve-server", "FILE.pub[,...]", NULL, 0,
        "CURVE: the servers' public key (one for all, or one per\nserver in --ps order)"),
     S_AT(conf.curve_server)},
    {DP_FLAG_TITLE("output:"), 0},
    {DP_FLAG_STR("save", "FILE", NULL, 0, "model.safetensors (PyTorch names and layouts)"),
     S_AT(conf.save)},
    {DP_FLAG_STR("summary", "FILE", NULL, 0, "summary.json"), S_AT(conf.summary)},
    {DP_FLAG_STR("metrics", "FILE", NULL, 0, "JSON lines, one per step"), S_AT(conf.metrics)},
    {DP_FLAG_STR("tensorboard", "DIR", NULL, 0,
        "TensorBoard event files (loss, accuracy, staleness)"), S_AT(conf.tensorboard)},
    {DP_FLAG_NUM("eval-every", DP_OPTS_LONG, "N", NULL, 0, 1000000000000L, DP_OPTS_PASS,
        "evaluate the test set every N steps (0: at the end)"), S_AT(conf.eval_every)},
    {DP_FLAG_NUM("eval-limit", DP_OPTS_INT, "K", NULL, 0, 1000000000, DP_OPTS_PASS,
        "test samples per periodic evaluation (0: all)"), S_AT(conf.eval_limit)},
    {DP_FLAG_SET("progress", NULL, DP_PROGRESS_ON, 0, "the live progress line (default: on a terminal)"),
     S_AT(conf.progress)},
    {DP_FLAG_SET("no-progress", NULL, DP_PROGRESS_OFF, 0, "no progress line"), S_AT(conf.progress)},
};

void dp_worker_options(dp_opts_t *o, dp_worker_args_t *a)
{
    dp_opts_init(o, "downpour-worker", s_synopsis, DP_MODEL_SPEC_HELP);
    dp_opts_add_at(o, a, s_table, (int)(sizeof s_table / sizeof s_table[0]));
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

/* A sparse model's spec (its first token embed:D) reads no data for its
 * shapes: checked with the flags, so that a malformed one is a bad command
 * line (status 2) as downpour local's and downpour sim's are. Other specs
 * need the data's input shape, which the run reads. */
static int s_check_embed_model(const char *spec, char *err)
{
    if (!spec || strncmp(spec + strspn(spec, " \t\n"), "embed", 5) != 0) return 0;
    dp_model_t *m = dp_malloc(sizeof *m);
    int rc = dp_model_parse(m, spec, 1, 1, 1, err);
    free(m);
    return rc;
}

dp_opts_result_t dp_worker_parse_args(dp_worker_args_t *a, int argc, char **argv, char *err)
{
    dp_opts_t o;
    dp_worker_options(&o, a);
    dp_opts_result_t rc = dp_opts_parse(&o, argc, argv, err);
    if (rc != DP_OPTS_PARSED) return rc;
    if (a->conf.a3c.env && !dp_opts_find(&o, "model")->given) a->conf.model = NULL; /* the RL default */
    if (a->conf.a3c.env) dp_optim_actor_critic_default(&a->conf.optim);
    if (s_check_embed_model(a->conf.model, err) != 0) return DP_OPTS_BAD;
    /* a precision this host cannot run: refused before anything starts */
    if (dp_precision_check(a->conf.device, a->conf.precision, err) != 0) return DP_OPTS_BAD;
    if (a->standalone) {
        if (a->conf.ps) return dp_err(err, "--standalone and --ps exclude each other");
        return DP_OPTS_PARSED;
    }
    if (!a->conf.curve_secret != !a->conf.curve_server)
        return dp_err(err, "--curve-secret and --curve-server go together: give both (this "
                           "worker's secret key and the servers' public keys) or neither");
    if (a->conf.ps) {
        a->conf.task_index = a->cluster.flag_task_index < 0 ? 0 : a->cluster.flag_task_index;
        return DP_OPTS_PARSED;
    }
    return s_from_cluster(a, err);
}
