/* test_cluster: cluster spec from flags, from TF_CONFIG, both merged (flags
 * win), chief folding, and every kind of bad input with the name of the flag
 * or field in the message. */
#include <string.h>

#include "common/cluster.h"
#include "common/util.h"
#include "tests/test.h"

/* dp_cluster_t holds 2 x 256 x 256 bytes of host names: keep it off the stack. */
static dp_cluster_t s_c;
static char s_err[DP_ERR_LEN];

static dp_cluster_t *s_flags(const char *job, int index, const char *ps, const char *workers)
{
    dp_cluster_init(&s_c);
    s_c.flag_job_name = job;
    s_c.flag_task_index = index;
    s_c.flag_ps_hosts = ps;
    s_c.flag_worker_hosts = workers;
    s_err[0] = '\0';
    return &s_c;
}

/* Resolve must fail and its message contain want. */
#define CHECK_FAILS(tf, want)                                                  \
    do {                                                                       \
        CHECK_EQ(dp_cluster_resolve(&s_c, (tf), s_err), -1);                   \
        if (!strstr(s_err, (want))) {                                          \
            fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", s_err, (want)); \
        }                                                                      \
        CHECK(strstr(s_err, (want)) != NULL);                                  \
        CHECK(strchr(s_err, '\n') == NULL);                                    \
    } while (0)

static void test_flags_only(void)
{
    s_flags("worker", 1, "ps0:2222,ps1:2222", "w0:2223, w1:2223 ,w2:2223");
    CHECK_EQ(dp_cluster_resolve(&s_c, NULL, s_err), 0);
    CHECK_STR(s_c.job_name, "worker");
    CHECK_EQ(s_c.task_index, 1);
    CHECK_EQ(s_c.n_ps, 2);
    CHECK_EQ(s_c.n_workers, 3);
    CHECK_STR(s_c.ps[1], "ps1:2222");
    CHECK_STR(s_c.workers[1], "w1:2223"); /* blanks trimmed */
    CHECK_STR(dp_cluster_self(&s_c), "w1:2223");

    char out[512];
    CHECK_EQ(dp_cluster_ps_endpoints(&s_c, out, sizeof out, s_err), 0);
    CHECK_STR(out, "tcp://ps0:2222,tcp://ps1:2222");
    CHECK_EQ(dp_cluster_bind_endpoint(&s_c, out, sizeof out, s_err), 0);
    CHECK_STR(out, "tcp://*:2223");
    CHECK_EQ(dp_cluster_describe(&s_c, out, sizeof out), 0);
    CHECK_STR(out, "worker task 1 (w1:2223); 2 ps, 3 workers");

    /* A ps task binds its own port. */
    s_flags("ps", 1, "ps0:2222,ps1:3333", "w0:2223");
    CHECK_EQ(dp_cluster_resolve(&s_c, "", s_err), 0);
    CHECK_EQ(dp_cluster_bind_endpoint(&s_c, out, sizeof out, s_err), 0);
    CHECK_STR(out, "tcp://*:3333");
    /* Too small a buffer is an error, not a truncation. */
    CHECK_EQ(dp_cluster_ps_endpoints(&s_c, out, 10, s_err), -1);
}

static void test_no_job(void)
{
    /* The launcher may resolve only the lists. */
    s_flags(NULL, -1, "a:1", "b:2,c:3");
    CHECK_EQ(dp_cluster_resolve(&s_c, NULL, s_err), 0);
    CHECK_STR(s_c.job_name, "");
    CHECK_EQ(s_c.task_index, -1);
    CHECK(dp_cluster_self(&s_c) == NULL);
    char out[64];
    CHECK_EQ(dp_cluster_bind_endpoint(&s_c, out, sizeof out, s_err), -1);
    /* An index with no job is an error. */
    s_flags(NULL, 0, "a:1", "b:2");
    CHECK_FAILS(NULL, "--task-index 0 given without a job");
    /* A job whose list has one host defaults to index 0; with more it must be given. */
    s_flags("ps", -1, "a:1", "b:2,c:3");
    CHECK_EQ(dp_cluster_resolve(&s_c, NULL, s_err), 0);
    CHECK_EQ(s_c.task_index, 0);
    s_flags("worker", -1, "a:1", "b:2,c:3");
    CHECK_FAILS(NULL, "needs --task-index: --worker-hosts has 2 hosts");
}

static void test_tf_config_only(void)
{
    const char *tf = "{\"cluster\": {\"ps\": [\"ps-0.svc:2222\"],"
                     " \"worker\": [\"w-0.svc:2222\", \"w-1.svc:2222\"]},"
                     " \"task\": {\"type\": \"worker\", \"index\": 1}, \"environment\": \"cloud\"}";
    s_flags(NULL, -1, NULL, NULL);
    CHECK_EQ(dp_cluster_resolve(&s_c, tf, s_err), 0);
    CHECK_STR(s_c.job_name, "worker");
    CHECK_EQ(s_c.task_index, 1);
    CHECK_EQ(s_c.n_ps, 1);
    CHECK_EQ(s_c.n_workers, 2);
    CHECK_STR(s_c.ps[0], "ps-0.svc:2222");
    CHECK_STR(s_c.workers[1], "w-1.svc:2222");

    /* ps task, index absent -> 0 (TensorFlow's default). */
    s_flags(NULL, -1, NULL, NULL);
    CHECK_EQ(dp_cluster_resolve(&s_c, "{\"cluster\":{\"ps\":[\"p:1\",\"q:1\"],\"worker\":[\"w:1\"]},"
                                      "\"task\":{\"type\":\"ps\"}}", s_err), 0);
    CHECK_STR(s_c.job_name, "ps");
    CHECK_EQ(s_c.task_index, 0);
    /* Whitespace-only TF_CONFIG counts as unset. */
    s_flags(NULL, -1, "a:1", NULL);
    CHECK_EQ(dp_cluster_resolve(&s_c, "  \n", s_err), 0);
    CHECK_EQ(s_c.n_ps, 1);
}

static void test_flags_override_tf_config(void)
{
    const char *tf = "{\"cluster\": {\"ps\": [\"p0:1\", \"p1:1\"], \"worker\": [\"w0:1\", \"w1:1\"]},"
                     " \"task\": {\"type\": \"worker\", \"index\": 1}}";
    /* --ps-hosts replaces cluster.ps; the worker list and task stay. */
    s_flags(NULL, -1, "x0:9,x1:9,x2:9", NULL);
    CHECK_EQ(dp_cluster_resolve(&s_c, tf, s_err), 0);
    CHECK_EQ(s_c.n_ps, 3);
    CHECK_STR(s_c.ps[2], "x2:9");
    CHECK_EQ(s_c.n_workers, 2);
    CHECK_STR(s_c.workers[0], "w0:1");
    CHECK_STR(s_c.job_name, "worker");
    CHECK_EQ(s_c.task_index, 1);
    /* --task-index and --job-name win too. */
    s_flags("ps", 0, NULL, NULL);
    CHECK_EQ(dp_cluster_resolve(&s_c, tf, s_err), 0);
    CHECK_STR(s_c.job_name, "ps");
    CHECK_EQ(s_c.task_index, 0);
    CHECK_STR(dp_cluster_self(&s_c), "p0:1");
    s_flags(NULL, 0, NULL, "y:1");
    CHECK_EQ(dp_cluster_resolve(&s_c, tf, s_err), 0);
    CHECK_EQ(s_c.n_workers, 1);
    CHECK_STR(dp_cluster_self(&s_c), "y:1");
    /* The index from TF_CONFIG against a list from the flag names both. */
    s_flags(NULL, -1, NULL, "y:1");
    CHECK_FAILS(tf, "TF_CONFIG: task.index 1 out of range: --worker-hosts has 1 host");
}

static void test_chief_folding(void)
{
    const char *base = "{\"cluster\": {\"chief\": [\"c:1\"], \"ps\": [\"p:1\"],"
                       " \"worker\": [\"w0:1\", \"w1:1\"]}, \"task\": %s}";
    char tf[512];
    snprintf(tf, sizeof tf, base, "{\"type\": \"chief\", \"index\": 0}");
    s_flags(NULL, -1, NULL, NULL);
    CHECK_EQ(dp_cluster_resolve(&s_c, tf, s_err), 0);
    CHECK_STR(s_c.job_name, "worker");
    CHECK_EQ(s_c.task_index, 0);
    CHECK_EQ(s_c.n_workers, 3);
    CHECK_STR(s_c.workers[0], "c:1");
    CHECK_STR(s_c.workers[2], "w1:1");

    snprintf(tf, sizeof tf, base, "{\"type\": \"worker\", \"index\": 1}");
    s_flags(NULL, -1, NULL, NULL);
    CHECK_EQ(dp_cluster_resolve(&s_c, tf, s_err), 0);
    CHECK_STR(s_c.job_name, "worker");
    CHECK_EQ(s_c.task_index, 2);
    CHECK_STR(dp_cluster_self(&s_c), "w1:1");

    /* Index in TF_CONFIG's own numbering: worker 2 does not exist. */
    snprintf(tf, sizeof tf, base, "{\"type\": \"worker\", \"index\": 2}");
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS(tf, "TF_CONFIG: task.index 2 out of range: cluster.worker has 2 hosts");
    snprintf(tf, sizeof tf, base, "{\"type\": \"chief\", \"index\": 1}");
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS(tf, "TF_CONFIG: task.index 1 out of range: cluster.chief has 1 host");
    /* Two chiefs. */
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"cluster\": {\"chief\": [\"c:1\", \"d:1\"], \"ps\": [\"p:1\"]}}",
                "cluster.chief has 2 hosts");
    /* chief task without a chief list. */
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"], \"worker\": [\"w:1\"]},"
                " \"task\": {\"type\": \"chief\"}}", "cluster.chief is missing");
    /* --job-name chief is worker 0. */
    s_flags("chief", -1, "p:1", "w0:1,w1:1");
    CHECK_EQ(dp_cluster_resolve(&s_c, NULL, s_err), 0);
    CHECK_STR(s_c.job_name, "worker");
    CHECK_EQ(s_c.task_index, 0);
    s_flags("chief", 1, "p:1", "w0:1,w1:1");
    CHECK_FAILS(NULL, "--task-index 1: the chief is task 0");
}

static void test_bad_json(void)
{
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"]", "TF_CONFIG: not valid JSON");
    CHECK_FAILS("{\"cluster\": {}} trailing", "TF_CONFIG: not valid JSON");
    CHECK_FAILS("[1, 2]", "TF_CONFIG: must be a JSON object");
    CHECK_FAILS("{\"cluster\": [\"p:1\"]}", "TF_CONFIG: cluster must be an object");
    CHECK_FAILS("{\"cluster\": {\"ps\": \"p:1\"}}", "TF_CONFIG: cluster.ps must be a list");
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\", 7]}}", "TF_CONFIG: cluster.ps[1] must be a");
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": 3}", "TF_CONFIG: task must be an object");
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"index\": 0}}",
                "TF_CONFIG: task.type must be a string");
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"evaluator\"}}",
                "TF_CONFIG: task.type \"evaluator\" is not supported");
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\", \"index\": -1}}",
                "TF_CONFIG: task.index must be an integer >= 0");
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0.5}}",
                "TF_CONFIG: task.index must be an integer >= 0");
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\", \"index\": \"0\"}}",
                "TF_CONFIG: task.index must be an integer >= 0");
}

static void test_bad_host_port(void)
{
    static const struct {
        const char *list, *want;
    } cases[] = {
        {"p", "--ps-hosts entry 0 \"p\" is not host:port: missing :port"},
        {"p:1,", "--ps-hosts entry 1 \"\" is not host:port: empty entry"},
        {"p:1,q:0", "--ps-hosts entry 1 \"q:0\" is not host:port: port out of range 1..65535"},
        {"p:65536", "port out of range"},
        {"p:99999999999999999999", "port out of range"},
        {"p:22a", "port is not a number"},
        {"p:-1", "port is not a number"},
        {"p:", "empty port"},
        {":80", "empty host"},
        {"::1:80", "an IPv6 address needs brackets"},
        {"[::1:80", "'[' without ']'"},
        {"[::1]", "missing :port after ']'"},
        {"[host]:80", "brackets are only for IPv6"},
        {"bad/host:80", "bad character in host name"},
        {"p:1,p:1", "--ps-hosts: p:1 is listed twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s_flags(NULL, -1, cases[i].list, NULL);
        CHECK_FAILS(NULL, cases[i].want);
    }
    /* Accepted forms. */
    s_flags("ps", 1, "[::1]:2222,[fe80::1%eth0]:3,10.0.0.1:65535,node_7.example-x.org:1", "h:5");
    CHECK_EQ(dp_cluster_resolve(&s_c, NULL, s_err), 0);
    CHECK_EQ(s_c.n_ps, 4);
    char out[64];
    CHECK_EQ(dp_cluster_bind_endpoint(&s_c, out, sizeof out, s_err), 0);
    CHECK_STR(out, "tcp://*:3");
    char host[64];
    int port = 0;
    CHECK_EQ(dp_cluster_parse_host_port("[::1]:2222", host, sizeof host, &port, s_err), 0);
    CHECK_STR(host, "::1");
    CHECK_EQ(port, 2222);
    CHECK_EQ(dp_cluster_parse_host_port("x", host, sizeof host, &port, s_err), -1);
    /* An endpoint in both lists. */
    s_flags(NULL, -1, "a:1", "b:1,a:1");
    CHECK_FAILS(NULL, "a:1 is in both --ps-hosts and --worker-hosts");
    /* In TF_CONFIG, the field is named with its index. */
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"cluster\": {\"worker\": [\"w:1\", \"w:0\"]}}",
                "TF_CONFIG: cluster.worker[1] \"w:0\" is not host:port: port out of range");
    /* An over-long entry. */
    char longhost[400];
    memset(longhost, 'a', sizeof longhost);
    strcpy(longhost + 300, ":80");
    s_flags(NULL, -1, longhost, NULL);
    CHECK_FAILS(NULL, "longer than 255 characters");
}

/* What an error quotes of the input stays on its line: a newline or a
 * terminal escape in a TFJob manifest's string or in a flag is written as
 * \n, \xHH (found by fuzz_tfconfig; CHECK_FAILS checks for a newline). */
static void test_errors_quote_control_bytes(void)
{
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"a\\nINFO forged:1\"]}}",
                "TF_CONFIG: cluster.ps[0] \"a\\nINFO forged:1\" is not host:port");
    CHECK_FAILS("{\"task\": {\"type\": \"w\\u001b[2Jx\"}}", "task.type \"w\\x1b[2Jx\" is not supported");
    CHECK_FAILS("{\"a\": x\n\001}", "TF_CONFIG: not valid JSON at byte 6: \"x\\n\\x01}\"");
    s_flags(NULL, -1, "p:1,b\nad:2", NULL);
    CHECK_FAILS(NULL, "--ps-hosts entry 1 \"b\\nad:2\" is not host:port: bad character in host name");
    s_flags("w\norker", -1, NULL, NULL);
    CHECK_FAILS(NULL, "--job-name \"w\\norker\": expected ps or worker");
    char host[64];
    int port = 0;
    CHECK_EQ(dp_cluster_parse_host_port("h\x7f:1", host, sizeof host, &port, s_err), -1);
    CHECK(strstr(s_err, "\"h\\x7f:1\" is not host:port") != NULL);
}

static void test_index_out_of_range(void)
{
    s_flags("worker", 2, "p:1", "w0:1,w1:1");
    CHECK_FAILS(NULL, "--task-index 2 out of range: --worker-hosts has 2 hosts");
    s_flags("ps", 1, "p:1", "w0:1");
    CHECK_FAILS(NULL, "--task-index 1 out of range: --ps-hosts has 1 host");
    s_flags("worker", -5, "p:1", "w0:1");
    CHECK_FAILS(NULL, "--task-index -5: must be >= 0");
    s_flags("master", 0, "p:1", "w0:1");
    CHECK_FAILS(NULL, "--job-name \"master\": expected ps or worker");
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"cluster\": {\"ps\": [\"p:1\"], \"worker\": [\"a:1\", \"b:1\"]},"
                " \"task\": {\"type\": \"worker\", \"index\": 3}}",
                "TF_CONFIG: task.index 3 out of range: cluster.worker has 2 hosts");
}

static void test_missing_hosts(void)
{
    s_flags("worker", 0, NULL, "w0:1");
    CHECK_FAILS(NULL, "worker task needs the ps hosts: give --ps-hosts");
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\"}}",
                "worker task needs the ps hosts");
    s_flags("worker", 0, "p:1", NULL);
    CHECK_FAILS(NULL, "worker task needs its job's hosts: give --worker-hosts");
    s_flags("ps", 0, NULL, "w:1");
    CHECK_FAILS(NULL, "ps task needs its job's hosts: give --ps-hosts");
    /* No ps at all is an error for the endpoints. */
    s_flags(NULL, -1, NULL, "w:1");
    CHECK_EQ(dp_cluster_resolve(&s_c, NULL, s_err), 0);
    char out[64];
    CHECK_EQ(dp_cluster_ps_endpoints(&s_c, out, sizeof out, s_err), -1);
    CHECK(strstr(s_err, "--ps-hosts") != NULL);
}

static void test_max_hosts(void)
{
    /* 256 workers fit; with a chief in front, 256 more do not. */
    static char list[DP_CLUSTER_MAX_HOSTS * 16 + 64];
    static char tf[DP_CLUSTER_MAX_HOSTS * 16 + 256];
    size_t used = 0;
    for (int i = 0; i < DP_CLUSTER_MAX_HOSTS; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s\"w%d:1\"", i ? "," : "", i);
    snprintf(tf, sizeof tf, "{\"cluster\": {\"ps\": [\"p:1\"], \"worker\": [%s]}}", list);
    s_flags(NULL, -1, NULL, NULL);
    CHECK_EQ(dp_cluster_resolve(&s_c, tf, s_err), 0);
    CHECK_EQ(s_c.n_workers, DP_CLUSTER_MAX_HOSTS);
    snprintf(tf, sizeof tf, "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [%s]}}", list);
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS(tf, "cluster.worker: more than 255 hosts");
}

/* What each pod of a deployment is told, as the daemons see it: resolve,
 * then the line they log at start, what a ps binds and what a worker dials. */
static void s_check_pod(const char *tf, const char *describe, const char *bind, const char *ps_eps)
{
    char out[1024];
    CHECK_EQ(dp_cluster_resolve(&s_c, tf, s_err), 0);
    if (s_err[0]) fprintf(stderr, "  resolve: %s\n", s_err);
    CHECK_EQ(dp_cluster_describe(&s_c, out, sizeof out), 0);
    CHECK_STR(out, describe);
    if (bind) {
        CHECK_EQ(dp_cluster_bind_endpoint(&s_c, out, sizeof out, s_err), 0);
        CHECK_STR(out, bind);
    }
    CHECK_EQ(dp_cluster_ps_endpoints(&s_c, out, sizeof out, s_err), 0);
    CHECK_STR(out, ps_eps);
}

/* TF_CONFIG byte for byte as Kubeflow's training operator writes it
 * (pkg/controller.v1/tensorflow/tensorflow.go, genTFConfigJSONStr: Go's
 * json.Marshal of {cluster, task, environment "cloud"}, job lists sorted by
 * name, one "<job>-<type>-<i>.<namespace>.svc:<port>" per replica) for
 * deploy/k8s/tfjob.yaml: TFJob downpour-fmnist in namespace default, PS x1,
 * Worker x2. */
static void test_tfjob_operator_ps_worker(void)
{
    static const char *const tf[3] = {
        "{\"cluster\":{\"ps\":[\"downpour-fmnist-ps-0.default.svc:2222\"],\"worker\":["
        "\"downpour-fmnist-worker-0.default.svc:2222\",\"downpour-fmnist-worker-1.default.svc:2222\"]},"
        "\"task\":{\"type\":\"ps\",\"index\":0},\"environment\":\"cloud\"}",
        "{\"cluster\":{\"ps\":[\"downpour-fmnist-ps-0.default.svc:2222\"],\"worker\":["
        "\"downpour-fmnist-worker-0.default.svc:2222\",\"downpour-fmnist-worker-1.default.svc:2222\"]},"
        "\"task\":{\"type\":\"worker\",\"index\":0},\"environment\":\"cloud\"}",
        "{\"cluster\":{\"ps\":[\"downpour-fmnist-ps-0.default.svc:2222\"],\"worker\":["
        "\"downpour-fmnist-worker-0.default.svc:2222\",\"downpour-fmnist-worker-1.default.svc:2222\"]},"
        "\"task\":{\"type\":\"worker\",\"index\":1},\"environment\":\"cloud\"}",
    };
    const char *ps = "tcp://downpour-fmnist-ps-0.default.svc:2222";
    s_flags(NULL, -1, NULL, NULL);
    s_check_pod(tf[0], "ps task 0 (downpour-fmnist-ps-0.default.svc:2222); 1 ps, 2 workers",
                "tcp://*:2222", ps);
    s_flags(NULL, -1, NULL, NULL);
    s_check_pod(tf[1], "worker task 0 (downpour-fmnist-worker-0.default.svc:2222); 1 ps, 2 workers",
                NULL, ps);
    s_flags(NULL, -1, NULL, NULL);
    s_check_pod(tf[2], "worker task 1 (downpour-fmnist-worker-1.default.svc:2222); 1 ps, 2 workers",
                NULL, ps);
}

/* The same with a Chief replica spec, two PS and two Workers, and the
 * operator's CUSTOM_CLUSTER_DOMAIN=cluster.local: the chief is worker 0,
 * Worker i is worker i+1. */
static void test_tfjob_operator_chief(void)
{
    const char *fmt = "{\"cluster\":{\"chief\":[\"dp-chief-0.ml.svc.cluster.local:2222\"],"
                      "\"ps\":[\"dp-ps-0.ml.svc.cluster.local:2222\",\"dp-ps-1.ml.svc.cluster.local:2222\"],"
                      "\"worker\":[\"dp-worker-0.ml.svc.cluster.local:2222\","
                      "\"dp-worker-1.ml.svc.cluster.local:2222\"]},"
                      "\"task\":{\"type\":\"%s\",\"index\":%d},\"environment\":\"cloud\"}";
    const char *ps = "tcp://dp-ps-0.ml.svc.cluster.local:2222,tcp://dp-ps-1.ml.svc.cluster.local:2222";
    char tf[1024];
    snprintf(tf, sizeof tf, fmt, "chief", 0);
    s_flags(NULL, -1, NULL, NULL);
    s_check_pod(tf, "worker task 0 (dp-chief-0.ml.svc.cluster.local:2222); 2 ps, 3 workers", NULL, ps);
    snprintf(tf, sizeof tf, fmt, "worker", 0);
    s_flags(NULL, -1, NULL, NULL);
    s_check_pod(tf, "worker task 1 (dp-worker-0.ml.svc.cluster.local:2222); 2 ps, 3 workers", NULL, ps);
    snprintf(tf, sizeof tf, fmt, "worker", 1);
    s_flags(NULL, -1, NULL, NULL);
    s_check_pod(tf, "worker task 2 (dp-worker-1.ml.svc.cluster.local:2222); 2 ps, 3 workers", NULL, ps);
    snprintf(tf, sizeof tf, fmt, "ps", 1);
    s_flags(NULL, -1, NULL, NULL);
    s_check_pod(tf, "ps task 1 (dp-ps-1.ml.svc.cluster.local:2222); 2 ps, 3 workers", "tcp://*:2222", ps);
}

/* deploy/k8s/downpour-pod's flags for the StatefulSets of
 * deploy/k8s/statefulset.yaml (1 ps, 2 workers), pod downpour-worker-1 and
 * downpour-ps-0 (test_k8s runs the script and the daemons themselves). */
static void test_statefulset_flags(void)
{
    const char *ps = "downpour-ps-0.downpour-ps:2222";
    const char *wk = "downpour-worker-0.downpour-worker:2222,downpour-worker-1.downpour-worker:2222";
    s_flags("worker", 1, ps, wk);
    s_check_pod(NULL, "worker task 1 (downpour-worker-1.downpour-worker:2222); 1 ps, 2 workers", NULL,
                "tcp://downpour-ps-0.downpour-ps:2222");
    s_flags("ps", 0, ps, wk);
    s_check_pod(NULL, "ps task 0 (downpour-ps-0.downpour-ps:2222); 1 ps, 2 workers", "tcp://*:2222",
                "tcp://downpour-ps-0.downpour-ps:2222");
}

/* The operator's other forms: an Evaluator replica is left out of the
 * cluster but its pod is told type "evaluator" (no such task here: refused
 * by name); enableDynamicWorker writes "sparseCluster" instead of
 * "cluster", so the task has no cluster at all (refused, not guessed). */
static void test_tfjob_operator_refused(void)
{
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"cluster\":{\"ps\":[\"j-ps-0.default.svc:2222\"],\"worker\":[\"j-worker-0.default.svc:2222\"]},"
                "\"task\":{\"type\":\"evaluator\",\"index\":0},\"environment\":\"cloud\"}",
                "TF_CONFIG: task.type \"evaluator\" is not supported");
    s_flags(NULL, -1, NULL, NULL);
    CHECK_FAILS("{\"sparseCluster\":{\"worker\":{\"1\":\"j-worker-1.default.svc:2222\"},"
                "\"ps\":[\"j-ps-0.default.svc:2222\"]},\"task\":{\"type\":\"worker\",\"index\":1}}",
                "worker task needs its job's hosts");
}

DP_TESTS(T(test_flags_only), T(test_no_job), T(test_tf_config_only),
         T(test_flags_override_tf_config), T(test_chief_folding), T(test_bad_json),
         T(test_bad_host_port), T(test_errors_quote_control_bytes), T(test_index_out_of_range), T(test_missing_hosts),
         T(test_max_hosts), T(test_tfjob_operator_ps_worker), T(test_tfjob_operator_chief),
         T(test_statefulset_flags), T(test_tfjob_operator_refused))
