/* test_opts: the number parsers every flag goes through (malformed,
 * out-of-range, seeds above 2^53), the table driver (every kind, both
 * value forms, unknown flag, missing value, stray argument, the one-line
 * messages), --help listing every flag of the real tables, and the seed
 * reaching downpour-ps and downpour-worker as the same uint64; environment
 * variables through the same parsers; every flag of downpour-worker's
 * table landing in its own field. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/util.h"
#include "server/args.h"
#include "tests/test.h"
#include "worker/args.h"

static char s_err[DP_ERR_LEN];

/* The call must fail with one line containing want (and the flag). */
#define CHECK_REFUSED(call, want)                                              \
    do {                                                                       \
        s_err[0] = '\0';                                                       \
        CHECK_EQ((call), -1);                                                  \
        if (!strstr(s_err, (want))) fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", s_err, (want)); \
        CHECK(strstr(s_err, (want)) != NULL);                                  \
        CHECK(strchr(s_err, '\n') == NULL);                                    \
    } while (0)

static void test_parse_long(void)
{
    long v = 0;
    CHECK_EQ(dp_opts_parse_long("--n", "42", 0, 100, &v, s_err), 0);
    CHECK_EQ(v, 42);
    CHECK_EQ(dp_opts_parse_long("--n", "-3", -5, 5, &v, s_err), 0);
    CHECK_EQ(v, -3);
    const char *bad[] = {"2abc", "", " 5", "5 ", "+5", "0x10", "1e3", "4.0", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_REFUSED(dp_opts_parse_long("--n", bad[i], 0, 100, &v, s_err), "expected an integer");
    CHECK_REFUSED(dp_opts_parse_long("--workers", "101", 1, 100, &v, s_err),
                  "--workers '101': expected an integer in [1, 100]");
    CHECK_REFUSED(dp_opts_parse_long("--workers", "0", 1, 100, &v, s_err), "[1, 100]");
    CHECK_EQ(v, -3); /* untouched by a refusal */
}

static void test_parse_double(void)
{
    double d = 0;
    CHECK_EQ(dp_opts_parse_double("--lr", "0.5", 0, 1, &d, s_err), 0);
    CHECK_NEAR(d, 0.5, 0);
    CHECK_EQ(dp_opts_parse_double("--lr", "1e-3", 0, 1, &d, s_err), 0);
    CHECK_NEAR(d, 1e-3, 0);
    const char *bad[] = {"nan", "inf", "1.5x", "0x1p3", "", " 1", "+1", "1,5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_REFUSED(dp_opts_parse_double("--lr", bad[i], 0, 10, &d, s_err), "expected a number");
    CHECK_REFUSED(dp_opts_parse_double("--momentum", "1.5", 0, 1, &d, s_err),
                  "--momentum '1.5': expected a number in [0, 1]");
}

/* Seeds above 2^53 are not doubles: they must come through exactly. */
static void test_seed_u64(void)
{
    uint64_t s = 0;
    CHECK_EQ(dp_opts_parse_u64("--seed", "9007199254740993", &s, s_err), 0);
    CHECK(s == 9007199254740993ULL);
    CHECK((uint64_t)(double)s != s); /* what a double would have made of it */
    CHECK_EQ(dp_opts_parse_u64("--seed", "18446744073709551615", &s, s_err), 0);
    CHECK(s == UINT64_MAX);
    CHECK_REFUSED(dp_opts_parse_u64("--seed", "18446744073709551616", &s, s_err),
                  "--seed '18446744073709551616': expected an integer in [0, 18446744073709551615]");
    CHECK_REFUSED(dp_opts_parse_u64("--seed", "-1", &s, s_err), "--seed '-1'");
    CHECK_REFUSED(dp_opts_parse_u64("--seed", "7x", &s, s_err), "--seed '7x'");
}

static void test_parse_tuple(void)
{
    long v[3];
    CHECK_EQ(dp_opts_parse_tuple("--input", "3x32x32", 'x', 3, 1, 100, "CxHxW", v, s_err), 0);
    CHECK_EQ(v[0], 3);
    CHECK_EQ(v[2], 32);
    const char *bad[] = {"3x32", "3x32x32x1", "3xx32", "0x32x32", "3x32x32 ", "a/b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_REFUSED(dp_opts_parse_tuple("--input", bad[i], 'x', 3, 1, 100, "CxHxW", v, s_err),
                      "expected CxHxW");
}

/* A table with every kind of entry. */
typedef struct {
    int flag, n, choice, called;
    long big;
    double x;
    float f;
    uint64_t seed;
    const char *str;
    char buf[8];
} s_conf_t;

static int s_set(void *arg, const char *v, char *err)
{
    if (strcmp(v, "good") != 0) return dp_err(err, "'%s' is not good", v);
    ((s_conf_t *)arg)->called++;
    return 0;
}

static void s_table(dp_opts_t *o, s_conf_t *c)
{
    memset(c, 0, sizeof *c);
    const dp_opts_flag_t t[] = {
        DP_FLAG_TITLE("section:"),
        DP_FLAG_SET("flag", &c->flag, 7, 0, "a flag"),
        DP_FLAG_NUM("n", DP_OPTS_INT, "N", &c->n, 1, 10, DP_OPTS_PASS, "an int"),
        DP_FLAG_NUM("big", DP_OPTS_LONG, "N", &c->big, 0, 1L << 40, 0, "a long"),
        DP_FLAG_NUM("x", DP_OPTS_DOUBLE, "X", &c->x, 0, 1, 0, "a double"),
        DP_FLAG_NUM("f", DP_OPTS_FLOAT, "X", &c->f, 0, 1, 0, "a float"),
        DP_FLAG_SEED("seed", &c->seed, 0, "a seed"),
        DP_FLAG_STR("str", "S", &c->str, 0, "a string"),
        DP_FLAG_BUF("buf", "S", c->buf, 0, "a short buffer"),
        DP_FLAG_CHOICE("pick", "a|bb|c", &c->choice, 0, "a choice"),
        DP_FLAG_CALL("call", "V", s_set, c, 0, "a parser\nover two lines"),
    };
    dp_opts_init(o, "prog", "usage: prog\n", "the end\n");
    dp_opts_add(o, t, (int)(sizeof t / sizeof t[0]));
}

static void test_driver_every_kind(void)
{
    dp_opts_t o;
    s_conf_t c;
    s_table(&o, &c);
    char *av[] = {"prog", "--flag", "--n=3", "--big", "1099511627776", "--x", "0.25", "--f=0.5",
                  "--seed", "18446744073709551557", "--str", "hello", "--buf", "1234567",
                  "--pick", "bb", "--call", "good", "--n", "4"};
    CHECK_EQ(dp_opts_parse(&o, (int)(sizeof av / sizeof av[0]), av, s_err), DP_OPTS_PARSED);
    CHECK_EQ(c.flag, 7);
    CHECK_EQ(c.n, 4); /* the last one wins */
    CHECK_EQ(c.big, 1L << 40);
    CHECK_NEAR(c.x, 0.25, 0);
    CHECK_NEAR(c.f, 0.5, 0);
    CHECK(c.seed == 18446744073709551557ULL);
    CHECK_STR(c.str, "hello");
    CHECK_STR(c.buf, "1234567");
    CHECK_EQ(c.choice, 1);
    CHECK_EQ(c.called, 1);
    CHECK_STR(dp_opts_find(&o, "n")->given, "4");
    CHECK_STR(dp_opts_find(&o, "flag")->given, "");
    CHECK(dp_opts_find(&o, "nope") == NULL);
    /* A second parse starts afresh (getopt_long restarted, given cleared). */
    char *av2[] = {"prog", "--x", "1"};
    CHECK_EQ(dp_opts_parse(&o, 3, av2, s_err), DP_OPTS_PARSED);
    CHECK(dp_opts_find(&o, "n")->given == NULL);
    CHECK_NEAR(c.x, 1, 0);
}

/* Parse prog + one or two arguments; -1 expected. */
static int s_parse2(const char *a, const char *b)
{
    dp_opts_t o;
    s_conf_t c;
    s_table(&o, &c);
    char *av[] = {"prog", (char *)a, (char *)b, NULL};
    return dp_opts_parse(&o, b ? 3 : 2, av, s_err);
}

/* -h and --help print the help and say so, for the driver and for each
 * daemon's parser above it (which must pass HELP_SHOWN up, not go on to
 * check the flags); the exit status is 0 then and 2 after a bad line. */
static void test_driver_help(void)
{
    fflush(stdout);
    int saved = dup(STDOUT_FILENO), null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    CHECK_EQ(s_parse2("-h", NULL), DP_OPTS_HELP_SHOWN);
    CHECK_EQ(s_parse2("--help", NULL), DP_OPTS_HELP_SHOWN);
    CHECK_EQ(s_parse2("--x", "1"), DP_OPTS_PARSED);
    static dp_ps_config_t pc;
    dp_ps_config_default(&pc);
    char *ps_av[] = {"downpour-ps", "--help"};
    CHECK_EQ(dp_ps_parse_args(&pc, 2, ps_av, s_err), DP_OPTS_HELP_SHOWN);
    static dp_worker_args_t wa;
    dp_worker_args_default(&wa);
    char *wk_av[] = {"downpour-worker", "--ps", "tcp://h:1", "--help"};
    CHECK_EQ(dp_worker_parse_args(&wa, 4, wk_av, s_err), DP_OPTS_HELP_SHOWN);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(null);
    CHECK_EQ(dp_opts_exit_status("prog", DP_OPTS_HELP_SHOWN, ""), 0);
    CHECK_EQ(dp_opts_exit_status("prog", DP_OPTS_BAD, "a bad line (expected here)"), 2);
}

static void test_driver_refusals(void)
{
    CHECK_REFUSED(s_parse2("--bogus", NULL), "unknown flag '--bogus' (see prog --help)");
    CHECK_REFUSED(s_parse2("--bogus=1", NULL), "unknown flag '--bogus'");
    CHECK_REFUSED(s_parse2("-q", NULL), "unknown flag '-q'");
    CHECK_REFUSED(s_parse2("--n", NULL), "--n needs a value");
    CHECK_REFUSED(s_parse2("--flag=1", NULL), "--flag takes no value");
    CHECK_REFUSED(s_parse2("stray", NULL), "unexpected argument 'stray'");
    CHECK_REFUSED(s_parse2("--n", "2abc"), "--n '2abc': expected an integer in [1, 10]");
    CHECK_REFUSED(s_parse2("--n", "11"), "--n '11': expected an integer in [1, 10]");
    CHECK_REFUSED(s_parse2("--x", "2"), "--x '2': expected a number in [0, 1]");
    CHECK_REFUSED(s_parse2("--f", "x"), "--f 'x'");
    CHECK_REFUSED(s_parse2("--seed", "1.5"), "--seed '1.5'");
    CHECK_REFUSED(s_parse2("--buf", "12345678"), "longer than 7 characters");
    CHECK_REFUSED(s_parse2("--pick", "b"), "--pick 'b': expected one of a|bb|c");
    CHECK_REFUSED(s_parse2("--call", "bad"), "--call: 'bad' is not good");
}

/* A flag is its whole name: getopt_long's unique prefix ("--epoch" for
 * --epochs) is an unknown flag, in every value form and in the daemons'
 * real tables, the message naming what was given and the whole flag. */
static void test_driver_whole_names(void)
{
    CHECK_REFUSED(s_parse2("--fla", NULL), "unknown flag '--fla' (did you mean --flag?");
    CHECK_REFUSED(s_parse2("--bi", "3"), "unknown flag '--bi' (did you mean --big?");
    CHECK_REFUSED(s_parse2("--bi=3", NULL), "unknown flag '--bi' (did you mean --big?");
    CHECK_REFUSED(s_parse2("--pic", "a"), "unknown flag '--pic'");
    CHECK_REFUSED(s_parse2("--hel", NULL), "unknown flag '--hel'");
    CHECK_EQ(s_parse2("--big", "3"), DP_OPTS_PARSED);
    CHECK_EQ(s_parse2("--big=3", NULL), DP_OPTS_PARSED);
    CHECK_EQ(s_parse2("--str", "--bi"), DP_OPTS_PARSED); /* a value, not a flag */
    static dp_worker_args_t wa;
    dp_worker_args_default(&wa);
    char *wk_av[] = {"downpour-worker", "--standalone", "--epoch", "1"};
    CHECK_REFUSED(dp_worker_parse_args(&wa, 4, wk_av, s_err), "unknown flag '--epoch'");
    static dp_ps_config_t pc;
    dp_ps_config_default(&pc);
    char *ps_av[] = {"downpour-ps", "--momentu", "0.5"};
    CHECK_REFUSED(dp_ps_parse_args(&pc, 3, ps_av, s_err), "unknown flag '--momentu'");
}

/* --help as text. */
static char *s_help(const dp_opts_t *o)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dp_opts_help(o, f);
    fclose(f);
    return text;
}

/* Every flag of t appears as "--name" at the start of a help line, and no
 * name is in the table twice (getopt_long would take the first silently). */
static void s_check_help_lists_all(dp_opts_t *o)
{
    char *text = s_help(o);
    for (int i = 0; i < o->n; i++) {
        const dp_opts_flag_t *e = &o->opt[i];
        if (e->kind == DP_OPTS_HEADING) continue;
        char want[96];
        snprintf(want, sizeof want, "\n  --%s ", e->name);
        if (!strstr(text, want)) fprintf(stderr, "  %s: --help lacks --%s\n", o->program, e->name);
        CHECK(strstr(text, want) != NULL);
        for (int j = i + 1; j < o->n; j++)
            if (o->opt[j].kind != DP_OPTS_HEADING) CHECK(strcmp(e->name, o->opt[j].name) != 0);
    }
    CHECK(strstr(text, "\n  --help ") != NULL);
    free(text);
}

static void test_help_lists_every_flag(void)
{
    dp_opts_t o;
    s_conf_t c;
    s_table(&o, &c);
    char *text = s_help(&o);
    CHECK(strncmp(text, "usage: prog\nsection:\n", 21) == 0);
    CHECK(strstr(text, "  --call V                     a parser\n"
                       "                               over two lines\n") != NULL);
    CHECK(strstr(text, "the end\n") != NULL);
    free(text);
    s_check_help_lists_all(&o);

    static dp_ps_config_t pc;
    static dp_cluster_t cl;
    static dp_worker_args_t wa;
    dp_ps_options(&o, &pc, &cl);
    s_check_help_lists_all(&o);
    dp_worker_options(&o, &wa);
    s_check_help_lists_all(&o);
}

/* A flag the launcher passes to both daemons must read the same in both. */
static void test_passed_flags_agree(void)
{
    static dp_ps_config_t pc;
    static dp_cluster_t cl;
    static dp_worker_args_t wa;
    static dp_opts_t ps, wk;
    dp_ps_options(&ps, &pc, &cl);
    dp_worker_options(&wk, &wa);
    int both = 0;
    for (int i = 0; i < ps.n; i++) {
        const dp_opts_flag_t *p = &ps.opt[i];
        const dp_opts_flag_t *w = p->kind == DP_OPTS_HEADING ? NULL : dp_opts_find(&wk, p->name);
        if (!p->pass || !w || !w->pass) continue;
        int p_text = p->kind == DP_OPTS_STR || p->kind == DP_OPTS_BUF;
        int w_text = w->kind == DP_OPTS_STR || w->kind == DP_OPTS_BUF;
        CHECK(p->kind == w->kind || (p_text && w_text));
        both++;
    }
    CHECK(both >= 2); /* --model and --seed at least */
}

/* The seed reaches the server's and the worker's configuration as the same
 * uint64, above 2^53 where a double would round it. */
static void test_seed_agrees_across_daemons(void)
{
    static dp_ps_config_t pc;
    static dp_worker_args_t wa;
    dp_ps_config_default(&pc);
    dp_worker_args_default(&wa);
    char *ps_av[] = {"downpour-ps", "--seed", "9007199254740993"};
    char *wk_av[] = {"downpour-worker", "--standalone", "--seed", "9007199254740993"};
    CHECK_EQ(dp_ps_parse_args(&pc, 3, ps_av, s_err), DP_OPTS_PARSED);
    CHECK_EQ(dp_worker_parse_args(&wa, 4, wk_av, s_err), DP_OPTS_PARSED);
    CHECK(pc.seed == 9007199254740993ULL);
    CHECK(wa.conf.seed == pc.seed);
    char *bad[] = {"downpour-worker", "--standalone", "--batch", "6x4"};
    CHECK_REFUSED(dp_worker_parse_args(&wa, 4, bad, s_err), "--batch '6x4'");
}

/* Every flag of downpour-worker's table lands in its own field: one
 * command line gives each a value no other flag's default has. */
static void test_worker_flags_land(void)
{
    static dp_worker_args_t wa;
    static dp_opts_t o;
    dp_worker_args_default(&wa);
    dp_worker_options(&o, &wa);
    char *av[] = {"downpour-worker", "--data", "mnist:D", "--train-samples", "7", "--model", "M",
                  "--augment", "--normalize", "train", "--device", "cpu:staged", "--threads", "3",
                  "--standalone", "--batch", "5", "--epochs", "6", "--steps", "8", "--seed", "9",
                  "--bn-ghost-batch", "2", "--optimizer", "rmsprop", "--lr", "0.25",
                  "--momentum", "0.5", "--rms-alpha", "0.75", "--eps", "0.125",
                  "--weight-decay", "0.0625", "--lr-schedule", "step:10:0.5", "--ps", "tcp://h:1",
                  "--task-index", "4", "--job-name", "worker", "--ps-hosts", "p:1",
                  "--worker-hosts", "w:2", "--local-steps", "auto:11", "--delay-ms", "1.5",
                  "--delay-dist", "exp", "--transport", "zmq", "--wire", "bf16", "--compress",
                  "topk:0.25", "--error-feedback", "off", "--overlap", "on", "--stream-push", "on",
                  "--stream-pull", "on", "--timeout", "12", "--curve-secret", "S",
                  "--curve-server", "P.pub", "--save", "m.st", "--summary", "s.json", "--metrics",
                  "m.jsonl", "--tensorboard", "tb", "--eval-every", "13", "--eval-limit", "14",
                  "--no-progress"};
    CHECK_EQ(dp_opts_parse(&o, (int)(sizeof av / sizeof av[0]), av, s_err), DP_OPTS_PARSED);
    const dp_train_conf_t *c = &wa.conf;
    CHECK_STR(c->data, "mnist:D");
    CHECK_EQ(c->train_samples, 7);
    CHECK_STR(c->model, "M");
    CHECK_EQ(c->augment, 1);
    CHECK_STR(c->normalize, "train");
    CHECK_STR(c->device, "cpu:staged");
    CHECK_EQ(c->threads, 3);
    CHECK_EQ(wa.standalone, 1);
    CHECK_EQ(c->batch, 5);
    CHECK_EQ(c->epochs, 6);
    CHECK_EQ(c->steps, 8);
    CHECK(c->seed == 9);
    CHECK_EQ(c->bn_ghost_batch, 2);
    CHECK_EQ(c->optim.kind, DP_OPT_RMSPROP);
    CHECK(c->optim.lr == 0.25f && c->optim.momentum == 0.5f && c->optim.alpha == 0.75f);
    CHECK(c->optim.eps == 0.125f && c->optim.weight_decay == 0.0625f);
    CHECK(c->schedule_given == 1 && c->optim.schedule == DP_LR_STEP && c->optim.step_size == 10);
    CHECK_STR(c->ps, "tcp://h:1");
    CHECK_EQ(wa.cluster.flag_task_index, 4);
    CHECK_STR(wa.cluster.flag_job_name, "worker");
    CHECK_STR(wa.cluster.flag_ps_hosts, "p:1");
    CHECK_STR(wa.cluster.flag_worker_hosts, "w:2");
    CHECK_EQ(c->local_steps, 11);
    CHECK_EQ(c->local_auto, 1);
    CHECK(c->delay_ms == 1.5 && c->delay_exp == 1);
    CHECK_EQ(c->transport, DP_PS_TRANSPORT_ZMQ);
    CHECK_EQ(c->wire, DP_PS_WIRE_BF16);
    CHECK(c->compress.kind == DP_COMPRESS_TOPK && c->compress.fraction == 0.25);
    CHECK_EQ(c->compress.error_feedback, 0);
    CHECK(c->overlap == 1 && c->stream_push == 1 && c->stream_pull == 1);
    CHECK(c->timeout_s == 12);
    CHECK_STR(c->curve_secret, "S");
    CHECK_STR(c->curve_server, "P.pub");
    CHECK_STR(c->save, "m.st");
    CHECK_STR(c->summary, "s.json");
    CHECK_STR(c->metrics, "m.jsonl");
    CHECK_STR(c->tensorboard, "tb");
    CHECK_EQ(c->eval_every, 13);
    CHECK_EQ(c->eval_limit, 14);
    CHECK_EQ(c->progress, DP_PROGRESS_OFF);
    char *on[] = {"downpour-worker", "--progress"};
    CHECK_EQ(dp_opts_parse(&o, 2, on, s_err), DP_OPTS_PARSED);
    CHECK_EQ(c->progress, DP_PROGRESS_ON);
}

/* Environment variables go through the same parsers: unset and empty keep
 * the default, a bad value is one line naming the variable. */
static void test_env(void)
{
    char err[DP_ERR_LEN] = "";
    long l = 7;
    double d = 0.25;
    int k = 5;
    unsetenv("DP_TEST_OPTS_ENV");
    CHECK_EQ(dp_opts_env_long("DP_TEST_OPTS_ENV", 0, 10, &l, err), 0);
    CHECK_EQ(l, 7);
    CHECK_EQ(dp_opts_env_choice("DP_TEST_OPTS_ENV", "a|b", &k, err), 0);
    CHECK_EQ(k, 5);
    setenv("DP_TEST_OPTS_ENV", "", 1);
    CHECK_EQ(dp_opts_env_double("DP_TEST_OPTS_ENV", 0, 1, &d, err), 0);
    CHECK_NEAR(d, 0.25, 0);
    setenv("DP_TEST_OPTS_ENV", "3", 1);
    CHECK_EQ(dp_opts_env_long("DP_TEST_OPTS_ENV", 0, 10, &l, err), 0);
    CHECK_EQ(l, 3);
    setenv("DP_TEST_OPTS_ENV", "3x", 1);
    CHECK_EQ(dp_opts_env_long("DP_TEST_OPTS_ENV", 0, 10, &l, err), -1);
    CHECK_STR(err, "DP_TEST_OPTS_ENV '3x': expected an integer in [0, 10]");
    CHECK_EQ(l, 3);
    setenv("DP_TEST_OPTS_ENV", "1.5", 1);
    CHECK_EQ(dp_opts_env_double("DP_TEST_OPTS_ENV", 0, 1, &d, err), -1);
    CHECK_STR(err, "DP_TEST_OPTS_ENV '1.5': expected a number in [0, 1]");
    setenv("DP_TEST_OPTS_ENV", " 0.5", 1); /* atof took it; the flags' parser does not */
    CHECK_EQ(dp_opts_env_double("DP_TEST_OPTS_ENV", 0, 1, &d, err), -1);
    setenv("DP_TEST_OPTS_ENV", "b", 1);
    CHECK_EQ(dp_opts_env_choice("DP_TEST_OPTS_ENV", "a|b", &k, err), 0);
    CHECK_EQ(k, 1);
    setenv("DP_TEST_OPTS_ENV", "B", 1);
    CHECK_EQ(dp_opts_env_choice("DP_TEST_OPTS_ENV", "a|b", &k, err), -1);
    CHECK_STR(err, "DP_TEST_OPTS_ENV 'B': expected one of a|b");
    unsetenv("DP_TEST_OPTS_ENV");
}

/* Every downpour-ps flag lands in its own field (the table's offsets). */
static void test_ps_flags_land(void)
{
    static dp_ps_config_t pc;
    static dp_cluster_t cl;
    static dp_opts_t o;
    dp_ps_config_default(&pc);
    dp_ps_options(&o, &pc, &cl);
    char *av[] = {"downpour-ps", "--bind", "tcp://*:7", "--job-name", "ps", "--task-index", "2",
                  "--ps-hosts", "p:1", "--worker-hosts", "w:2", "--shard", "1/3", "--workers", "4",
                  "--mode", "ssp", "--replicas-to-aggregate", "3", "--staleness", "5",
                  "--delay-lr", "threshold:3", "--early-step", "off", "--model", "M",
                  "--input", "3x8x9", "--init", "I", "--state-tensors", "a,b", "--seed", "6",
                  "--optimizer", "rmsprop", "--lr", "0.25", "--momentum", "0.5",
                  "--rms-alpha", "0.75", "--eps", "0.125", "--weight-decay", "0.0625",
                  "--lr-schedule", "step:10:0.5", "--local-steps", "auto:7",
                  "--outer-optimizer", "delayed-nesterov", "--outer-lr", "0.375", "--outer-momentum", "0.625",
                  "--outer-momentum-every", "3",
                  "--checkpoint-dir", "D", "--run-id", "R", "--resume", "--startup-timeout", "8",
                  "--threads", "2", "--checkpoint-every", "9", "--metrics", "m.jsonl",
                  "--record", "r.rec", "--metrics-every", "1.5", "--heartbeat-timeout", "2.5",
                  "--ready-file", "rf", "--curve-secret", "S", "--curve-allow", "K"};
    CHECK_EQ(dp_opts_parse(&o, (int)(sizeof av / sizeof av[0]), av, s_err), DP_OPTS_PARSED);
    CHECK_STR(pc.bind, "tcp://*:7");
    CHECK_STR(cl.flag_job_name, "ps");
    CHECK_EQ(cl.flag_task_index, 2);
    CHECK_STR(cl.flag_ps_hosts, "p:1");
    CHECK_STR(cl.flag_worker_hosts, "w:2");
    CHECK(pc.shard_index == 1 && pc.shard_count == 3);
    CHECK_EQ(pc.num_workers, 4);
    CHECK_EQ(pc.mode, DP_MODE_SSP);
    CHECK_EQ(pc.replicas, 3);
    CHECK_EQ(pc.staleness, 5);
    CHECK(pc.delay_k == 3.0f);
    CHECK_EQ(pc.early_step, 0);
    CHECK_STR(pc.model_spec, "M");
    CHECK(pc.in_c == 3 && pc.in_h == 8 && pc.in_w == 9);
    CHECK_STR(pc.init_path, "I");
    CHECK_STR(pc.state_tensors, "a,b");
    CHECK(pc.seed == 6);
    CHECK_EQ(pc.optim.kind, DP_OPT_RMSPROP);
    CHECK(pc.optim.lr == 0.25f && pc.optim.momentum == 0.5f && pc.optim.alpha == 0.75f);
    CHECK(pc.optim.eps == 0.125f && pc.optim.weight_decay == 0.0625f);
    CHECK(pc.optim.schedule == DP_LR_STEP && pc.optim.step_size == 10);
    CHECK_EQ(pc.local_steps, 7);
    CHECK_EQ(pc.local_auto, 1);
    CHECK_STR(pc.outer_optimizer, "delayed-nesterov");
    CHECK_EQ(pc.outer_every, 3);
    CHECK(pc.outer_lr == 0.375f && pc.outer_momentum == 0.625f);
    CHECK_STR(pc.checkpoint_dir, "D");
    CHECK_STR(pc.run_id, "R");
    CHECK_EQ(pc.resume, 1);
    CHECK(pc.startup_timeout == 8.0);
    CHECK_EQ(pc.threads, 2);
    CHECK_EQ(pc.checkpoint_every, 9);
    CHECK_STR(pc.metrics_path, "m.jsonl");
    CHECK_STR(pc.record, "r.rec");
    CHECK(pc.metrics_every == 1.5 && pc.heartbeat_timeout == 2.5);
    CHECK_STR(pc.ready_file, "rf");
    CHECK_STR(pc.curve_secret, "S");
    CHECK_STR(pc.curve_allow, "K");
}

DP_TESTS(T(test_env), T(test_parse_long), T(test_parse_double), T(test_seed_u64), T(test_parse_tuple),
         T(test_driver_every_kind), T(test_driver_help), T(test_driver_refusals),
         T(test_driver_whole_names), T(test_help_lists_every_flag), T(test_passed_flags_agree), T(test_seed_agrees_across_daemons), T(test_worker_flags_land),
         T(test_ps_flags_land))
