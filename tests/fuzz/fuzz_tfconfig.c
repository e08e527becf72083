/* fuzz_tfconfig: bytes from a fuzzer into the cluster spec resolver
 * (dp_cluster_resolve, common/cluster.h): TF_CONFIG as Kubeflow sets it,
 * merged with the cluster flags.
 *
 * Input layout: byte 0 = which flags are given (bit 0 --job-name, bit 1
 * --task-index, bit 2 --ps-hosts, bit 3 --worker-hosts); byte 1 = the job
 * name (ps, worker, chief, "" or "evaluator", by byte 1 mod 5); byte 2 = the
 * task index - 2 (so -2 .. 253); the rest = TF_CONFIG, then, after a NUL,
 * the --ps-hosts value, then after another NUL the --worker-hosts value.
 * Whatever the bytes, resolve returns one error line or a cluster for which
 * cluster.c's invariants hold: every host a trimmed valid host:port, no
 * endpoint twice, the job ps / worker / "" with its index in range (-1 with
 * no job), a worker with servers; then the endpoint helpers work on it. */
#include "common/cluster.h"
#include "tests/fuzz/fuzz.h"

#define S_NAME "fuzz_tfconfig"

static void s_want(int ok, const char *what)
{
    if (!ok) fz_violation(S_NAME, what);
}

/* One list entry: NUL-terminated within DP_HOST_LEN, trimmed, host:port. */
static void s_check_host(const char *h)
{
    size_t n = strnlen(h, DP_HOST_LEN);
    s_want(n > 0 && n < DP_HOST_LEN, "a host entry is empty or not terminated");
    if (n == 0 || n >= DP_HOST_LEN) return;
    s_want(h[0] != ' ' && h[0] != '\t' && h[n - 1] != ' ' && h[n - 1] != '\t', "a host entry is not trimmed");
    char host[DP_HOST_LEN], err[DP_ERR_LEN];
    int port = 0;
    s_want(dp_cluster_parse_host_port(h, host, sizeof host, &port, err) == 0 && port >= 1 && port <= 65535,
           "a host entry is not a valid host:port");
}

static void s_check(const dp_cluster_t *c)
{
    s_want(c->n_ps >= 0 && c->n_ps <= DP_CLUSTER_MAX_HOSTS && c->n_workers >= 0 &&
               c->n_workers <= DP_CLUSTER_MAX_HOSTS, "a host count out of range");
    if (c->n_ps < 0 || c->n_ps > DP_CLUSTER_MAX_HOSTS || c->n_workers < 0 || c->n_workers > DP_CLUSTER_MAX_HOSTS)
        return;
    for (int i = 0; i < c->n_ps; i++) s_check_host(c->ps[i]);
    for (int i = 0; i < c->n_workers; i++) s_check_host(c->workers[i]);
    for (int a = 0; a < c->n_ps + c->n_workers; a++)
        for (int b = a + 1; b < c->n_ps + c->n_workers; b++) {
            const char *ha = a < c->n_ps ? c->ps[a] : c->workers[a - c->n_ps];
            const char *hb = b < c->n_ps ? c->ps[b] : c->workers[b - c->n_ps];
            s_want(strncmp(ha, hb, DP_HOST_LEN) != 0, "an endpoint listed twice");
        }
    int is_ps = strcmp(c->job_name, "ps") == 0, is_worker = strcmp(c->job_name, "worker") == 0;
    s_want(is_ps || is_worker || c->job_name[0] == 0, "a job name other than ps, worker or none");
    char out[DP_CLUSTER_MAX_HOSTS * (DP_HOST_LEN + 8)], err[DP_ERR_LEN];
    if (!c->job_name[0]) {
        s_want(c->task_index == -1, "a task index without a job");
        s_want(dp_cluster_self(c) == NULL, "a self without a job");
    } else {
        int n = is_ps ? c->n_ps : c->n_workers;
        s_want(c->task_index >= 0 && c->task_index < n, "a task index out of its job's range");
        s_want(!is_worker || c->n_ps >= 1, "a worker without servers");
        const char *self = dp_cluster_self(c);
        s_want(self && self == (is_ps ? c->ps[c->task_index] : c->workers[c->task_index]),
               "self is not the task's own entry");
        s_want(dp_cluster_bind_endpoint(c, out, sizeof out, err) == 0 && strncmp(out, "tcp://*:", 8) == 0,
               "no bind endpoint for a task");
    }
    if (c->n_ps > 0) {
        s_want(dp_cluster_ps_endpoints(c, out, sizeof out, err) == 0, "the ps endpoints do not fit");
        char small[16];
        dp_cluster_ps_endpoints(c, small, sizeof small, err); /* may refuse; must not overflow */
    }
    char line[DP_HOST_LEN + 96];
    s_want(dp_cluster_describe(c, line, sizeof line) == 0, "describe failed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    static const char *jobs[] = {"ps", "worker", "chief", "", "evaluator"};
    int mask = data[0];
    const char *job = jobs[data[1] % 5];
    int index = (int)data[2] - 2;
    char *text = fz_str(data + 3, size - 3);
    size_t tlen = strlen(text), rest = size - 3;
    const char *ps = tlen + 1 <= rest ? text + tlen + 1 : "";
    size_t plen = tlen + 1 <= rest ? strlen(ps) : 0;
    const char *workers = tlen + 1 + plen + 1 <= rest ? ps + plen + 1 : "";
    static dp_cluster_t c;
    dp_cluster_init(&c);
    if (mask & 1) c.flag_job_name = job;
    if (mask & 2) c.flag_task_index = index;
    if (mask & 4) c.flag_ps_hosts = ps;
    if (mask & 8) c.flag_worker_hosts = workers;
    char err[DP_ERR_LEN] = "";
    if (dp_cluster_resolve(&c, text, err) == 0) {
        fz_accepted++;
        s_check(&c);
    } else {
        s_want(err[0] && !strchr(err, '\n'), "an error that is not one line");
    }
    free(text);
    return 0;
}

#ifndef DP_LIBFUZZER
int main(int argc, char **argv)
{
    return fz_main(argc, argv, "tfconfig", 20000);
}
#endif
