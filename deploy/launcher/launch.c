/* launch: `downpour launch` — torchrun for a parameter server. Starts K
 * downpour-ps shards on free loopback ports (every flag before "--" that
 * is not the launcher's own goes to them, checked first by downpour-ps's
 * own parser), then N copies of any command as the workers, each with the
 * variables a TensorFlow or torchrun program looks for:
 *
 *   TF_CONFIG   {"cluster": {"ps": [the shards], "worker": [N placeholders]},
 *                "task": {"type": "worker", "index": I}}
 *   RANK=I LOCAL_RANK=I WORLD_SIZE=N LOCAL_WORLD_SIZE=N GROUP_RANK=0
 *   DOWNPOUR_PS=tcp://...,tcp://...   (the shards, in shard order)
 *   DOWNPOUR_CURVE_SECRET, DOWNPOUR_CURVE_SERVER   (with --curve)
 *
 * downpour.Client() and downpour.torch.Worker() with no ps= read TF_CONFIG,
 * and the CURVE variables stand for their curve_secret / curve_server.
 *
 * The model: --init FILE or --model SPEC among the server flags; with
 * neither, the chief's module. Worker 0 then starts first, alone, with
 * DOWNPOUR_LAUNCH_INIT=DIR/init.safetensors and DOWNPOUR_LAUNCH_PS=
 * DIR/logs/ps.endpoints in place of TF_CONFIG: its first call,
 * downpour.torch.Worker(model), writes the init file (renamed into place
 * whole) and waits; the shards start from that file, the launcher writes
 * their endpoints there (atomically), the chief connects, and the other
 * workers start with TF_CONFIG as above. The
 * worker job's hosts in TF_CONFIG are placeholders (127.0.0.1:1+I): no
 * process listens there; TF_CONFIG's grammar needs them to say how many
 * workers there are.
 *
 * It shows one progress line from the shards' metrics, keeps every
 * process's output in DIR/logs, and ends the run when the workers have
 * ended (then the shards get SIGTERM), when a worker fails (its name and
 * last log lines; the others are stopped), or on Ctrl-C / SIGTERM (SIGTERM
 * to everything it started, SIGKILL after --grace). The exit status is the
 * chief's (worker 0): the command's own, or 128 + the signal; 1 when another
 * worker or a shard failed first. DIR/summary.json
 * holds the run as the shards saw it and every worker's exit. As
 * `downpour local`, nothing it started outlives it: each child leads a
 * process group, signalled whole, and a guard stops the groups left when
 * the launcher is killed (spawn.h, dp_spawn_guard).
 *
 * Elastic (--workers MIN:MAX, torchrun's --nnodes MIN:MAX): local_elastic.h's
 * crew, as `downpour local`'s: MIN start, the shards get --workers MIN:MAX,
 * `downpour scale DIR N` starts the lowest free task indexes or asks the
 * highest but the chief's to leave (SIGTERM), --chaos kill:S. WORLD_SIZE,
 * LOCAL_WORLD_SIZE and TF_CONFIG's worker list are MAX (the task indexes
 * there can be, as the shards count them), DOWNPOUR_MIN_WORKERS and
 * DOWNPOUR_MAX_WORKERS set. --max-restarts N (torchrun's): a worker that
 * fails (a status other than 0, or a signal the launcher did not send) is
 * started again under its task index, the chief too, N times in the run,
 * each a line and an event in summary.json ("restarts", "restart_count");
 * past N the run stops as above.
 *
 * Several machines (--nnodes N --node-rank R --master HOST:PORT, torchrun's
 * static rendezvous; launch_nodes.h): one launch each, node 0 the shards
 * at HOST:PORT+I, node R its --workers W as global ranks R*W + local. */
#include "deploy/launcher/commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/metrics.h"
#include "common/opts.h"
#include "common/signals.h"
#include "common/util.h"
#include "deploy/launcher/crew.h"
#include "deploy/launcher/launch_nodes.h"
#include "deploy/launcher/local_elastic.h"
#include "deploy/launcher/local_keys.h"
#include "deploy/launcher/scale.h"
#include "deploy/launcher/spawn.h"
#include "deploy/launcher/tee.h"
#include "server/args.h"

#define S_MAX_ARGS 256 /* server flags and their values, the command's words */

typedef struct {
    int workers, shards;  /* workers: started at the start (elastic: MIN) */
    dp_nodes_t nodes;     /* --nnodes, --node-rank, --master: one launch per machine */
    int local_shards;     /* the shards this launch runs (the crew's first): node 0's all, else 0 */
    int world, rank0;     /* WORLD_SIZE, and this node's first global rank */
    int master_gone;      /* a node but 0: the servers stopped answering while this many of its
                           * workers ran (then stopped) */
    int min_workers, max_workers; /* --workers MIN:MAX (min 0: a fixed crew of max = workers) */
    char crew_name[24];   /* "N" or "MIN:MAX", the servers' --workers */
    const char *chaos;    /* --chaos kill:SECONDS, or NULL */
    double chaos_s;
    dp_elastic_t elastic; /* an elastic crew's changes (local_elastic.h, as downpour local's) */
    int max_restarts;     /* --max-restarts N: failed workers started again, N in all */
    int restarts;
    cJSON *joins, *leaves, *restart_log; /* summary.json's events */
    int noted_life[2 * DP_CREW_MAX]; /* per crew record: the last life whose end is noted */
    double grace_s;
    int progress; /* 0: no progress line */
    int tee;      /* --tee: the workers' output on stdout too, "[RANK]: " a line */
    dp_tee_t tee_read;
    int curve;
    const char *out;
    const char *ps_args[S_MAX_ARGS]; /* the shards' flags, as given */
    int n_ps_args;
    char **cmd; /* the workers' command, NULL-terminated (argv's own) */
    dp_ps_config_t ps; /* what the shards will make of their flags */
    dp_crew_t crew;    /* the shards first, then the workers */
    dp_local_keys_t keys;
    char endpoints[DP_CREW_MAX * 48];
    int init_from_cmd;          /* no --init or --model: the chief's module is the model */
    char init_path[PATH_MAX];   /* DIR/init.safetensors, which the chief writes */
    char ps_file[PATH_MAX];     /* DIR/logs/ps.endpoints, where it then reads the shards */
    dp_child_t chief;           /* worker 0 while it is started alone */
    char bin_dir[PATH_MAX];
    char out_default[64];
    double t0;
} s_launch_t;

static volatile sig_atomic_t s_signal;

static const char s_usage[] =
    "usage: downpour launch --workers N|MIN:MAX [--ps-shards K] [--init FILE | --model SPEC]\n"
    "                       [--out DIR] [--curve] [--grace S] [--tee] [--no-progress]\n"
    "                       [--max-restarts N] [--chaos kill:S]\n"
    "                       [--nnodes N --node-rank R --master HOST:PORT [--master-timeout S]]\n"
    "                       [downpour-ps flags...] -- COMMAND [ARGS...]\n"
    "Starts K downpour-ps shards, then N copies of COMMAND as workers 0..N-1 (0 the chief),\n"
    "each with TF_CONFIG, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and DOWNPOUR_PS set\n"
    "(downpour.torch.Worker() with no ps= finds the servers from them). Ctrl-C or SIGTERM\n"
    "stops everything; a failed worker stops the run; the exit status is the chief's.\n\n"
    "  --workers N        worker processes (1..64); MIN:MAX: elastic, MIN start, `downpour\n"
    "                     scale DIR N` sets the live count, WORLD_SIZE is MAX\n"
    "  --max-restarts N   a worker that fails is started again (same task index), N times\n"
    "                     in the run (default 0: the first failure stops the run)\n"
    "  --chaos kill:S     elastic: SIGKILL a random worker but the chief every S seconds\n"
    "  --ps-shards K      parameter-server shards (1..64, default 1)\n"
    "  --out DIR          logs/ (every process's output), metrics/, summary.json\n"
    "                     (default runs/launch-YYYYmmdd-HHMMSS)\n"
    "  --curve            CURVE keys for every shard and worker in DIR/keys; the workers\n"
    "                     get DOWNPOUR_CURVE_SECRET and DOWNPOUR_CURVE_SERVER\n"
    "  --grace S          seconds between SIGTERM and SIGKILL when stopping (default 10)\n"
    "  --tee              every worker's output on stdout as well as in its log, each line\n"
    "                     prefixed with its rank (\"[1]: ...\"; torchrun's --tee)\n"
    "  --no-progress      no progress line\n"
    "  --nnodes N         one launch on each of N machines (default 1), each with the same\n"
    "                     --workers W and --ps-shards K: node 0 runs the K shards at\n"
    "                     HOST:PORT..PORT+K-1, node R its W workers as ranks R*W..R*W+W-1\n"
    "                     (WORLD_SIZE N*W, GROUP_RANK R, MASTER_ADDR HOST, MASTER_PORT PORT+K)\n"
    "  --node-rank R      this machine's place, 0..N-1 (default 0)\n"
    "  --master HOST:PORT node 0's address (an IPv4 address or a name), where the shards bind\n"
    "  --master-timeout S a node but 0: seconds to wait for the shards to answer (else exit 2),\n"
    "                     and of their silence in the run before it stops its workers (60)\n"
    "Any other flag before \"--\" is downpour-ps's (see downpour-ps --help): --init FILE or\n"
    "--model SPEC [--input CxHxW] says the model, --mode, --optimizer, --lr, ...; with\n"
    "neither, the chief's downpour.torch.Worker(model) writes DIR/init.safetensors first\n"
    "and the servers start from it.\n";

/* "--name V" or "--name=V" at argv[*i] for one of the launcher's flags with a
 * value: the value (and *i past it), or NULL. */
static const char *s_value(int argc, char **argv, int *i, const char *name)
{
    size_t len = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, len) != 0) return NULL;
    if (a[len] == '=') return a + len + 1;
    if (a[len] || *i + 1 >= argc) return NULL;
    return argv[++*i];
}

static int s_count(const char *flag, const char *v, int *out, char *err)
{
    long n;
    if (dp_opts_parse_long(flag, v, 1, DP_CREW_MAX, &n, err) != 0) return -1;
    *out = (int)n;
    return 0;
}

/* One word of the command line before "--" at argv[*i] (and its value):
 * a launcher flag, or a server flag kept for the shards. 0, or -1 with err. */
static int s_word(s_launch_t *L, int argc, char **argv, int *i, char *err)
{
    const char *v;
    if ((v = s_value(argc, argv, i, "--workers"))) {
        if (dp_opts_parse_crew("--workers", v, DP_CREW_MAX, &L->min_workers, &L->max_workers, err) != 0)
            return -1;
        L->workers = L->min_workers > 0 ? L->min_workers : L->max_workers;
        dp_opts_crew_name(L->min_workers, L->max_workers, L->crew_name, sizeof L->crew_name);
        return 0;
    }
    if ((v = s_value(argc, argv, i, "--chaos"))) {
        L->chaos = v;
        return dp_elastic_parse_chaos(v, &L->chaos_s, err);
    }
    if ((v = s_value(argc, argv, i, "--max-restarts"))) {
        long n;
        if (dp_opts_parse_long("--max-restarts", v, 0, 1000000, &n, err) != 0) return -1;
        L->max_restarts = (int)n;
        return 0;
    }
    if ((v = s_value(argc, argv, i, "--ps-shards"))) return s_count("--ps-shards", v, &L->shards, err);
    if ((v = s_value(argc, argv, i, "--nnodes"))) {
        long n;
        if (dp_opts_parse_long("--nnodes", v, 1, 1024, &n, err) != 0) return -1;
        L->nodes.nnodes = (int)n;
        return 0;
    }
    if ((v = s_value(argc, argv, i, "--node-rank"))) {
        long n;
        if (dp_opts_parse_long("--node-rank", v, 0, 1023, &n, err) != 0) return -1;
        L->nodes.node_rank = (int)n;
        return 0;
    }
    if ((v = s_value(argc, argv, i, "--master"))) return dp_nodes_parse_master(&L->nodes, v, err);
    if ((v = s_value(argc, argv, i, "--master-timeout")))
        return dp_opts_parse_double("--master-timeout", v, 0.1, 86400, &L->nodes.timeout_s, err);
    if ((v = s_value(argc, argv, i, "--grace")))
        return dp_opts_parse_double("--grace", v, 0, 3600, &L->grace_s, err);
    if ((v = s_value(argc, argv, i, "--out"))) {
        L->out = v;
        return 0;
    }
    if (strcmp(argv[*i], "--no-progress") == 0) {
        L->progress = 0;
        return 0;
    }
    if (strcmp(argv[*i], "--curve") == 0) {
        L->curve = 1;
        return 0;
    }
    if (strcmp(argv[*i], "--tee") == 0) {
        L->tee = 1;
        return 0;
    }
    if (strncmp(argv[*i], "--", 2) != 0)
        return dp_err(err, "unexpected argument '%s' before \"--\" (see downpour launch --help)",
                      argv[*i]);
    if (L->n_ps_args + 4 > S_MAX_ARGS) return dp_err(err, "more than %d server flags", S_MAX_ARGS);
    L->ps_args[L->n_ps_args++] = argv[*i];
    /* a flag's value follows it unless given with '=' or another flag comes */
    if (!strchr(argv[*i], '=') && *i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0)
        L->ps_args[L->n_ps_args++] = argv[++*i];
    return 0;
}

/* The server flags as shard 0 gets them, through downpour-ps's parser. */
static int s_check_ps_flags(s_launch_t *L, char *err)
{
    const char *av[S_MAX_ARGS + 8];
    int n = 0;
    av[n++] = "downpour-ps";
    for (int i = 0; i < L->n_ps_args; i++) av[n++] = L->ps_args[i];
    av[n++] = "--workers";
    av[n++] = L->crew_name;
    dp_ps_config_default(&L->ps);
    char e2[DP_ERR_LEN];
    if (dp_ps_parse_args(&L->ps, n, (char **)av, e2) != DP_OPTS_PARSED)
        return dp_err(err, "server flags: %s", e2);
    return 0;
}

/* --nnodes N: the crew is every node's (the servers count N x --workers);
 * what a single launch cannot share across machines yet is refused. */
static int s_nodes(s_launch_t *L, char *err)
{
    dp_nodes_t *n = &L->nodes;
    if (dp_nodes_check(n, L->shards, err) != 0) return -1;
    L->world = n->nnodes * L->max_workers;
    L->rank0 = n->node_rank * L->workers;
    L->local_shards = n->node_rank == 0 ? L->shards : 0;
    if (n->nnodes == 1) return 0;
    /* an elastic crew's task indexes are handed out by one launcher; the
     * keys of --curve are made in one node's DIR */
    if (L->min_workers > 0)
        return dp_err(err, "--workers MIN:MAX with --nnodes %d: an elastic crew is one machine's for "
                      "now (give each node --workers N)", n->nnodes);
    if (L->curve)
        return dp_err(err, "--curve with --nnodes %d: the keys are made on one machine; not yet "
                      "across nodes", n->nnodes);
    snprintf(L->crew_name, sizeof L->crew_name, "%d", L->world);
    return 0;
}

static dp_opts_result_t s_parse(s_launch_t *L, int argc, char **argv, char *err)
{
    L->shards = 1;
    L->grace_s = 10;
    L->progress = 1;
    L->nodes.nnodes = 1;
    L->nodes.timeout_s = 60;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(s_usage, stdout);
            return DP_OPTS_HELP_SHOWN;
        }
        if (s_word(L, argc, argv, &i, err) != 0) return DP_OPTS_BAD;
    }
    if (i + 1 >= argc) {
        dp_err(err, "no command: downpour launch [flags] -- COMMAND [ARGS...]");
        return DP_OPTS_BAD;
    }
    L->cmd = argv + i + 1;
    if (!L->workers) {
        dp_err(err, "--workers N is required (see downpour launch --help)");
        return DP_OPTS_BAD;
    }
    if (L->chaos && L->min_workers == 0) {
        dp_err(err, "--chaos needs an elastic crew: --workers MIN:MAX");
        return DP_OPTS_BAD;
    }
    if (s_nodes(L, err) != 0) return DP_OPTS_BAD;
    return s_check_ps_flags(L, err) == 0 ? DP_OPTS_PARSED : DP_OPTS_BAD;
}

/* DIR and its logs/ and metrics/; the keys with --curve. */
static int s_prepare(s_launch_t *L, char *err)
{
    if (!L->out) {
        time_t now = time(NULL);
        strftime(L->out_default, sizeof L->out_default, "runs/launch-%Y%m%d-%H%M%S", localtime(&now));
        L->out = L->out_default;
    }
    char path[PATH_MAX];
    if (dp_crew_make_out(L->out, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/summary.json", L->out);
    unlink(path);
    if (L->curve && dp_local_keys_make(&L->keys, L->out, L->shards, L->max_workers, err) != 0) return -1;
    if (L->local_shards == 0) return 0; /* node 0's chief writes the model, if anyone */
    for (int i = 0; i < L->n_ps_args; i++)
        if (strncmp(L->ps_args[i], "--init", 6) == 0 || strncmp(L->ps_args[i], "--model", 7) == 0)
            return 0;
    L->init_from_cmd = 1;
    snprintf(L->init_path, sizeof L->init_path, "%s/init.safetensors", L->out);
    snprintf(L->ps_file, sizeof L->ps_file, "%s/logs/ps.endpoints", L->out);
    unlink(L->init_path);
    unlink(L->ps_file);
    return 0;
}

static int s_start_shards(s_launch_t *L, const char *argv0, char *err)
{
    char bin[PATH_MAX + 16], shard[24], ready[PATH_MAX], bind[96];
    dp_spawn_bin_dir(L->bin_dir, sizeof L->bin_dir, argv0);
    snprintf(bin, sizeof bin, "%s/downpour-ps", L->bin_dir);
    for (int i = 0; i < L->shards; i++) {
        dp_child_t *c = dp_crew_add(&L->crew, L->out, "ps", i);
        snprintf(shard, sizeof shard, "%d/%d", i, L->shards);
        dp_crew_ready_path(L->out, i, ready, sizeof ready);
        unlink(ready);
        unlink(c->metrics);
        const char *av[S_MAX_ARGS + 24];
        int n = 0;
        av[n++] = bin;
        /* several nodes: shard I at the master's HOST:PORT+I, where the
         * other nodes know to look; one: any free loopback port */
        if (L->nodes.given) snprintf(bind, sizeof bind, "tcp://%s:%d", L->nodes.host, L->nodes.port + i);
        else snprintf(bind, sizeof bind, "tcp://127.0.0.1:*");
        av[n++] = "--bind"; av[n++] = bind;
        av[n++] = "--ready-file"; av[n++] = ready;
        av[n++] = "--shard"; av[n++] = shard;
        av[n++] = "--workers"; av[n++] = L->crew_name;
        av[n++] = "--metrics"; av[n++] = c->metrics;
        if (L->curve) dp_local_keys_ps_args(&L->keys, i, av, &n);
        for (int k = 0; k < L->n_ps_args; k++) av[n++] = L->ps_args[k];
        av[n] = NULL;
        if (dp_spawn(&c->pid, av, c->log, err) != 0) return -1;
    }
    return 0;
}

/* Worker i's TF_CONFIG into out. */
static void s_tf_config(const s_launch_t *L, int i, char *out, size_t n)
{
    cJSON *root = cJSON_CreateObject(), *cluster = cJSON_AddObjectToObject(root, "cluster");
    cJSON *ps = cJSON_AddArrayToObject(cluster, "ps"), *wk = cJSON_AddArrayToObject(cluster, "worker");
    for (const char *p = L->endpoints; *p;) {
        size_t len = strcspn(p, ",");
        char hp[256];
        const char *h = strncmp(p, "tcp://", 6) == 0 ? p + 6 : p;
        snprintf(hp, sizeof hp, "%.*s", (int)(len - (size_t)(h - p)), h);
        cJSON_AddItemToArray(ps, cJSON_CreateString(hp));
        p += len + (p[len] == ',');
    }
    for (int k = 0; k < L->world; k++) {
        char hp[32];
        snprintf(hp, sizeof hp, "127.0.0.1:%d", 1 + k); /* placeholders: see the top */
        cJSON_AddItemToArray(wk, cJSON_CreateString(hp));
    }
    cJSON *task = cJSON_AddObjectToObject(root, "task");
    cJSON_AddStringToObject(task, "type", "worker");
    cJSON_AddNumberToObject(task, "index", i);
    char *text = cJSON_PrintUnformatted(root);
    snprintf(out, n, "TF_CONFIG=%s", text);
    cJSON_free(text);
    cJSON_Delete(root);
}

/* Worker i into c: the command with its variables; before the shards are
 * up (the chief writing the init file) with DOWNPOUR_LAUNCH_INIT and
 * DOWNPOUR_LAUNCH_PS in place of TF_CONFIG and DOWNPOUR_PS. */
static int s_start_worker(s_launch_t *L, int i, dp_child_t *c, char *err)
{
    static char tf[16384], ps[sizeof L->endpoints + 16], secret[PATH_MAX + 32], server[PATH_MAX + 32];
    static char init[PATH_MAX + 32], ps_file[PATH_MAX + 32];
    char rank[32], local[32], world[32], lworld[32], min[40], max[40], group[32], maddr[96], mport[32];
    /* an elastic crew: MAX, the task indexes there can be (TF_CONFIG's
     * worker list too); MIN and MAX as torchrun's agent has them. i is
     * the global rank; the node's own are rank0 .. rank0 + workers - 1 */
    snprintf(world, sizeof world, "WORLD_SIZE=%d", L->world);
    snprintf(lworld, sizeof lworld, "LOCAL_WORLD_SIZE=%d", L->max_workers);
    snprintf(rank, sizeof rank, "RANK=%d", i);
    snprintf(local, sizeof local, "LOCAL_RANK=%d", i - L->rank0);
    snprintf(group, sizeof group, "GROUP_RANK=%d", L->nodes.node_rank);
    snprintf(min, sizeof min, "DOWNPOUR_MIN_WORKERS=%d", L->min_workers);
    snprintf(max, sizeof max, "DOWNPOUR_MAX_WORKERS=%d", L->max_workers);
    const char *env[16] = {rank, local, world, lworld, group};
    int n = 5;
    if (L->nodes.given) {
        /* torchrun's: node 0's address, and a port there for the program's
         * own torch.distributed store (rank 0 binds it): the first after
         * the shards', which hold PORT .. PORT+K-1 */
        snprintf(maddr, sizeof maddr, "MASTER_ADDR=%s", L->nodes.host);
        snprintf(mport, sizeof mport, "MASTER_PORT=%d", L->nodes.port + L->shards);
        env[n++] = maddr;
        env[n++] = mport;
    }
    if (L->min_workers > 0) {
        env[n++] = min;
        env[n++] = max;
    }
    if (L->endpoints[0]) {
        s_tf_config(L, i, tf, sizeof tf);
        snprintf(ps, sizeof ps, "DOWNPOUR_PS=%s", L->endpoints);
        env[n++] = tf;
        env[n++] = ps;
    } else {
        snprintf(init, sizeof init, "DOWNPOUR_LAUNCH_INIT=%s", L->init_path);
        snprintf(ps_file, sizeof ps_file, "DOWNPOUR_LAUNCH_PS=%s", L->ps_file);
        env[n++] = init;
        env[n++] = ps_file;
    }
    if (L->curve) {
        const char *av[8];
        int k = 0;
        dp_local_keys_worker_args(&L->keys, i, av, &k); /* --curve-secret F --curve-server LIST */
        snprintf(secret, sizeof secret, "DOWNPOUR_CURVE_SECRET=%s", av[1]);
        snprintf(server, sizeof server, "DOWNPOUR_CURVE_SERVER=%s", av[3]);
        env[n++] = secret;
        env[n++] = server;
    }
    env[n] = NULL;
    /* putenv keeps the pointers: the child's copy of these buffers is made
     * by fork before the next worker's are written */
    return dp_spawn_env(&c->pid, (const char *const *)L->cmd, env, c->log, err);
}

/* The chief first, alone, until its first call (downpour.torch.Worker)
 * wrote the servers' init file from its module: the run's model. */
static int s_start_chief_for_init(s_launch_t *L, char *err)
{
    dp_child_t *c = &L->chief;
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "worker-0");
    snprintf(c->log, sizeof c->log, "%s/logs/worker-0.log", L->out);
    c->is_worker = 1;
    if (s_start_worker(L, 0, c, err) != 0) return -1;
    double until = dp_now() + 600;
    while (access(L->init_path, F_OK) != 0) {
        int st;
        if (waitpid(c->pid, &st, WNOHANG) == c->pid) {
            c->pgid = c->pid; /* what it started is stopped with the crew */
            c->pid = 0;
            c->status = st;
            char how[64], last[512];
            dp_child_describe_exit(c, how, sizeof how);
            dp_last_line(c->log, last, sizeof last);
            return dp_err(err, "worker-0 %s before writing the model (downpour.torch.Worker(model) "
                          "does, or give --init FILE / --model SPEC); last log line: %s", how,
                          last[0] ? last : "(empty)");
        }
        if (s_signal) return dp_err(err, "stopped by signal %d while starting", (int)s_signal);
        if (dp_now() > until) return dp_err(err, "worker-0 wrote no %s in 600 s", L->init_path);
        usleep(20 * 1000);
    }
    L->ps_args[L->n_ps_args++] = "--init";
    L->ps_args[L->n_ps_args++] = L->init_path;
    return 0;
}

/* Task i's next life (its first, a restart, a join): DIR/logs/worker-I.log,
 * then worker-I.L.log. */
static int s_start_task(s_launch_t *L, int i, char *err)
{
    dp_child_t *c = dp_crew_worker_life(&L->crew, L->out, i);
    if (!c) return dp_err(err, "worker %d: running already, or more than %d children", i, 2 * DP_CREW_MAX);
    return s_start_worker(L, i, c, err);
}

/* local_elastic's start: a worker joining (scale, or one in place of a
 * --chaos kill), kept for summary.json's "joins". */
static int s_start_joining(void *arg, int task, char *err)
{
    s_launch_t *L = arg;
    if (s_start_task(L, task, err) != 0) return -1;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "task", task);
    cJSON_AddNumberToObject(o, "t", dp_now() - L->t0);
    cJSON_AddItemToArray(L->joins, o);
    return 0;
}

/* The workers not yet running, once the shards listen (the chief, started
 * for the init file, told where they are); an elastic crew's MIN, with
 * `downpour scale DIR N` listened for as under downpour local. */
static int s_start_workers(s_launch_t *L, char *err)
{
    int first = 0;
    if (L->chief.pid > 0) {
        *dp_crew_add(&L->crew, L->out, "worker", 0) = L->chief;
        L->chief.pid = 0; /* the crew's now */
        if (dp_write_file_atomic(L->ps_file, L->endpoints, strlen(L->endpoints), err) != 0) return -1;
        first = 1;
    }
    /* the lock is held until this process ends: the fd is never closed */
    if (L->min_workers > 0 && dp_scale_listen(L->out, L->max_workers, err) < 0) return -1;
    for (int i = first; i < L->workers; i++)
        if (s_start_task(L, L->rank0 + i, err) != 0) return -1;
    if (L->min_workers > 0) {
        dp_elastic_init(&L->elastic, L->min_workers, L->max_workers, L->chaos_s, L->ps.seed, L->out,
                        &L->crew, s_start_joining, L, dp_now());
        L->elastic.who = "downpour launch";
    }
    return 0;
}

/* The shards' last metrics records (not their events: a run's file ends
 * in the workers' leaves): the run as shard 0 saw it, the version summed;
 * NULL before any. */
static cJSON *s_shards_state(const s_launch_t *L, double *version)
{
    cJSON *first = NULL;
    *version = 0;
    for (int i = 0; i < L->local_shards; i++) {
        cJSON *o = dp_metrics_last(L->crew.kids[i].metrics);
        if (!o) continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "version");
        if (cJSON_IsNumber(v)) *version += v->valuedouble;
        if (!first) first = o;
        else cJSON_Delete(o);
    }
    return first;
}

static double s_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static void s_show_progress(const s_launch_t *L, int live)
{
    double version;
    cJSON *o = s_shards_state(L, &version);
    double dt = dp_now() - L->t0;
    if (!o) {
        fprintf(stderr, "%s%d worker(s) starting...%s", live ? "\r\033[K" : "", L->workers,
                live ? "" : "\n");
        return;
    }
    fprintf(stderr, "%sversion %.0f  %.0f pushes applied (%.1f/s)  staleness %.2f  %d worker(s)  %.0f s%s",
            live ? "\r\033[K" : "", version, s_num(o, "applied"), s_num(o, "applied") / (dt > 0 ? dt : 1),
            s_num(o, "staleness_mean"), L->workers, dt, live ? "" : "\n");
    cJSON_Delete(o);
}

/* The workers' ends this pass found that the launcher asked for (a
 * scale's leave, a --chaos kill): summary.json's "leaves". */
static void s_note_leaves(s_launch_t *L)
{
    for (int k = L->local_shards; k < L->crew.n; k++) {
        const dp_child_t *c = &L->crew.kids[k];
        if (c->pid > 0 || L->noted_life[k] == c->lives) continue;
        L->noted_life[k] = c->lives;
        if (!c->stopping) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "task", c->task);
        cJSON_AddNumberToObject(o, "status", WIFEXITED(c->status) ? WEXITSTATUS(c->status)
                                                                 : 128 + WTERMSIG(c->status));
        cJSON_AddNumberToObject(o, "t", dp_now() - L->t0);
        cJSON_AddItemToArray(L->leaves, o);
    }
}

/* A worker that failed started again under its task index while
 * --max-restarts allows (one line, one event): 1 when it was. */
static int s_restart(s_launch_t *L, const dp_child_t *c)
{
    if (!c->is_worker || L->restarts >= L->max_restarts) return 0;
    int task = c->task, st = WIFEXITED(c->status) ? WEXITSTATUS(c->status) : 128 + WTERMSIG(c->status);
    char err[DP_ERR_LEN];
    L->restarts++;
    fprintf(stderr, "downpour launch: worker %d exited with status %d; restart %d of %d\n", task, st,
            L->restarts, L->max_restarts);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "task", task);
    cJSON_AddNumberToObject(o, "status", st);
    cJSON_AddNumberToObject(o, "t", dp_now() - L->t0);
    cJSON_AddItemToArray(L->restart_log, o);
    if (s_start_task(L, task, err) == 0) return 1;
    fprintf(stderr, "downpour launch: %s\n", err);
    return 0;
}

/* Until a signal, a failed worker (returned), or every worker's end. */
static const dp_child_t *s_watch(s_launch_t *L)
{
    int live = L->progress && isatty(2) && !L->tee; /* a "\r" line would cut the tee's */
    double last = 0;
    for (;;) {
        if (L->tee) dp_tee_follow(&L->tee_read, &L->crew, 0);
        int alive, workers_alive;
        const dp_child_t *bad = dp_crew_reap(&L->crew, &alive, &workers_alive);
        s_note_leaves(L);
        if (bad && !s_signal && dp_elastic_survives(&L->elastic, bad)) bad = NULL;
        if (bad && !s_signal && s_restart(L, bad)) continue; /* counted again next pass */
        if (s_signal || workers_alive == 0) return bad && bad->is_worker ? bad : NULL;
        if (bad) return bad; /* a worker, or a shard that died under the workers */
        /* a node but 0: the servers gone while its workers run (the chief
         * ended the run without them, or node 0 failed) end it too */
        if (L->nodes.node_rank > 0 && dp_nodes_master_gone(&L->nodes, dp_now())) {
            L->master_gone = workers_alive;
            return NULL;
        }
        char err[DP_ERR_LEN];
        if (dp_elastic_tick(&L->elastic, dp_now(), err) != 0) {
            fprintf(stderr, "downpour launch: %s\n", err);
            return NULL;
        }
        if (L->progress && dp_now() - last >= (live ? 0.5 : 15.0)) {
            s_show_progress(L, live);
            last = dp_now();
        }
        usleep(100 * 1000);
    }
}

/* Every worker's exit and the shards' last view into DIR/summary.json. */
static void s_summary(const s_launch_t *L)
{
    double version;
    cJSON *st = s_shards_state(L, &version), *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "mode", dp_mode_name(L->ps.mode));
    cJSON_AddNumberToObject(root, "workers", L->workers);
    cJSON_AddNumberToObject(root, "ps_shards", L->shards);
    if (L->nodes.nnodes > 1) { /* the counts below are node 0's shards', on node 0 */
        cJSON_AddNumberToObject(root, "nnodes", L->nodes.nnodes);
        cJSON_AddNumberToObject(root, "node_rank", L->nodes.node_rank);
        cJSON_AddNumberToObject(root, "world_size", L->world);
    }
    cJSON_AddNumberToObject(root, "wall_s", dp_now() - L->t0);
    cJSON_AddNumberToObject(root, "version", version);
    static const char *keys[] = {"applied", "dropped", "rejected", "staleness_mean", "staleness_max"};
    static const char *names[] = {"updates_applied", "updates_dropped", "updates_rejected",
                                  "staleness_mean", "staleness_max"};
    for (int k = 0; st && k < 5; k++) cJSON_AddNumberToObject(root, names[k], s_num(st, keys[k]));
    cJSON *cmd = cJSON_AddArrayToObject(root, "command");
    for (char **p = L->cmd; *p; p++) cJSON_AddItemToArray(cmd, cJSON_CreateString(*p));
    /* the chief's result: its exit and its log's last line (an example's
     * test accuracy), as the run's last line says it */
    const dp_child_t *chief = &L->crew.kids[L->local_shards];
    char last[512];
    dp_last_line(chief->log, last, sizeof last);
    cJSON_AddStringToObject(root, "chief_result", last);
    cJSON *ex = cJSON_AddArrayToObject(root, "worker_exit");
    for (int i = L->local_shards; i < L->crew.n; i++) {
        const dp_child_t *c = &L->crew.kids[i];
        int s = WIFEXITED(c->status) ? WEXITSTATUS(c->status) : 128 + WTERMSIG(c->status);
        cJSON_AddItemToArray(ex, cJSON_CreateNumber(s));
    }
    /* the crew's changes: an elastic crew's joins and leaves, --max-restarts' restarts */
    if (L->min_workers > 0) {
        cJSON_AddNumberToObject(root, "workers_min", L->min_workers);
        cJSON_AddNumberToObject(root, "workers_max", L->max_workers);
        cJSON_AddItemToObject(root, "joins", cJSON_Duplicate(L->joins, 1));
        cJSON_AddItemToObject(root, "leaves", cJSON_Duplicate(L->leaves, 1));
    }
    cJSON_AddNumberToObject(root, "restart_count", L->restarts);
    cJSON_AddItemToObject(root, "restarts", cJSON_Duplicate(L->restart_log, 1));
    char path[PATH_MAX], *text = cJSON_Print(root), err[DP_ERR_LEN];
    snprintf(path, sizeof path, "%s/summary.json", L->out);
    if (dp_write_file_atomic(path, text, strlen(text), err) != 0)
        fprintf(stderr, "downpour launch: %s\n", err);
    cJSON_free(text);
    cJSON_Delete(root);
    cJSON_Delete(st);
}

/* The run's last line: what the servers applied, as their last records
 * say, and the chief's result (its exit and its log's last line: the
 * example's test accuracy). */
static void s_say_done(const s_launch_t *L, const dp_child_t *chief)
{
    double version;
    if (L->nodes.node_rank > 0) { /* the servers' counts are node 0's to say */
        char how[64], last[512];
        dp_child_describe_exit(chief, how, sizeof how);
        dp_last_line(chief->log, last, sizeof last);
        fprintf(stderr, "downpour launch: done: node %d of %d, %d worker(s) (ranks %d..%d of %d), the "
                "servers node 0's at %s:%d; %.1f s; %s %s: %s\n", L->nodes.node_rank, L->nodes.nnodes,
                L->workers, L->rank0, L->rank0 + L->workers - 1, L->world, L->nodes.host, L->nodes.port,
                dp_now() - L->t0, chief->name, how, last[0] ? last : "(its log is empty)");
        return;
    }
    cJSON *st = s_shards_state(L, &version);
    char how[64], last[512];
    dp_child_describe_exit(chief, how, sizeof how);
    dp_last_line(chief->log, last, sizeof last);
    fprintf(stderr,
            "downpour launch: done: %s, %d worker(s), %d shard(s): %.0f pushes applied (version %.0f), "
            "dropped %.0f, rejected %.0f; staleness mean %.2f; %.1f s; the chief %s: %s\n",
            dp_mode_name(L->ps.mode), L->nodes.nnodes > 1 ? L->world : L->workers, L->shards,
            s_num(st, "applied"), version,
            s_num(st, "dropped"), s_num(st, "rejected"), s_num(st, "staleness_mean"), dp_now() - L->t0,
            how, last[0] ? last : "(its log is empty)");
    cJSON_Delete(st);
}

/* Stop what is left and say how the run ended; the exit status. */
static int s_finish(s_launch_t *L, const dp_child_t *failed)
{
    int sig = (int)s_signal;
    dp_crew_stop_all(&L->crew, L->grace_s);
    if (L->tee) dp_tee_follow(&L->tee_read, &L->crew, 1);
    if (L->progress && isatty(2) && !L->tee) fputc('\n', stderr);
    s_summary(L);
    const dp_child_t *chief = &L->crew.kids[L->local_shards];
    if (sig) {
        fprintf(stderr, "downpour launch: stopped by signal %d; every process ended; logs in %s/logs\n",
                sig, L->out);
        return 128 + sig;
    }
    if (L->master_gone) {
        fprintf(stderr, "downpour launch: node %d: the master's servers at %s:%d stopped answering "
                "%g s ago while %d worker(s) here ran; stopped them; logs in %s/logs\n",
                L->nodes.node_rank, L->nodes.host, L->nodes.port, L->nodes.timeout_s,
                L->master_gone, L->out);
        return 1;
    }
    if (failed) {
        char how[64], last[512];
        dp_child_describe_exit(failed, how, sizeof how);
        dp_last_line(failed->log, last, sizeof last);
        fprintf(stderr, "downpour launch: %s %s; last log line: %s\n(full log: %s)\n", failed->name,
                how, last[0] ? last : "(empty)", failed->log);
        return failed == chief && WIFEXITED(chief->status) ? WEXITSTATUS(chief->status) : 1;
    }
    s_say_done(L, chief);
    printf("%s/summary.json\n", L->out);
    return WIFEXITED(chief->status) ? WEXITSTATUS(chief->status) : 128 + WTERMSIG(chief->status);
}

/* Everything started: the shards (node 0), their endpoints, the workers.
 * -1 with err; -2 when the master did not answer (a node but 0: exit 2). */
static int s_start(s_launch_t *L, const char *argv0, char *err)
{
    if (L->local_shards == 0) {
        if (dp_nodes_await_master(&L->nodes, L->shards, &s_signal, err) != 0) return s_signal ? -1 : -2;
        dp_nodes_endpoints(&L->nodes, L->shards, L->endpoints, sizeof L->endpoints);
        return s_start_workers(L, err);
    }
    if ((L->init_from_cmd && s_start_chief_for_init(L, err) != 0) || s_start_shards(L, argv0, err) != 0 ||
        dp_crew_await_shards(&L->crew, L->out, L->shards, L->endpoints, sizeof L->endpoints, &s_signal,
                             err) != 0)
        return -1;
    return s_start_workers(L, err);
}

int dp_launch_main(int argc, char **argv)
{
    static s_launch_t L; /* large: keep it off the stack */
    char err[DP_ERR_LEN] = "";
    dp_opts_result_t parsed = s_parse(&L, argc, argv, err);
    if (parsed != DP_OPTS_PARSED) return dp_opts_exit_status("downpour launch", parsed, err);
    if (s_prepare(&L, err) != 0 || dp_spawn_guard(err) != 0) {
        fprintf(stderr, "downpour launch: %s\n", err);
        return 1;
    }
    dp_signals_install(&s_signal, 1);
    L.t0 = dp_now();
    L.joins = cJSON_CreateArray();
    L.leaves = cJSON_CreateArray();
    L.restart_log = cJSON_CreateArray();
    int started = s_start(&L, argv[0], err);
    if (started != 0) {
        fprintf(stderr, "downpour launch: %s\n", err);
        if (L.chief.pid > 0 || L.chief.pgid > 0) /* stopped too, with what it started */
            *dp_crew_add(&L.crew, L.out, "worker", 0) = L.chief;
        dp_crew_stop_all(&L.crew, 5.0);
        return s_signal ? 128 + (int)s_signal : started == -2 ? 2 : 1;
    }
    if (L.local_shards == 0)
        fprintf(stderr, "downpour launch: node %d of %d: the master's %d ps shard(s) at %s, %d worker(s) "
                "(ranks %d..%d of %d) of `%s`; logs in %s/logs\n", L.nodes.node_rank, L.nodes.nnodes,
                L.shards, L.endpoints, L.workers, L.rank0, L.rank0 + L.workers - 1, L.world, L.cmd[0],
                L.out);
    else if (L.nodes.nnodes > 1)
        fprintf(stderr, "downpour launch: node 0 of %d: %d ps shard(s) at %s, %d worker(s) (ranks 0..%d of "
                "%d) of `%s`, %s mode; logs in %s/logs\n", L.nodes.nnodes, L.shards, L.endpoints,
                L.workers, L.workers - 1, L.world, L.cmd[0], dp_mode_name(L.ps.mode), L.out);
    else
        fprintf(stderr, "downpour launch: %d ps shard(s) at %s, %s worker(s) of `%s`, %s mode; logs in %s/logs\n",
                L.shards, L.endpoints, L.crew_name, L.cmd[0], dp_mode_name(L.ps.mode), L.out);
    int rc = s_finish(&L, s_watch(&L));
    dp_local_keys_fini(&L.keys);
    return rc;
}
