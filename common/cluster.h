/* cluster: who is who in a training cluster, in TensorFlow's terms — a "ps"
 * job and a "worker" job, each a list of host:port, and this process's job
 * name and task index. Given by flags (--job-name, --task-index, --ps-hosts,
 * --worker-hosts) or by the TF_CONFIG environment variable that Kubeflow's
 * TFJob sets:
 *   {"cluster": {"ps": ["h:p", ...], "worker": ["h:p", ...],
 *                "chief": ["h:p"]},              (optional: chief = worker 0)
 *    "task": {"type": "worker", "index": 0}}
 * Flags win over TF_CONFIG field by field. With a "chief" job, the chief is
 * worker task 0 and the "worker" list's tasks are shifted by one. */
#ifndef DP_CLUSTER_H
#define DP_CLUSTER_H

#include <stddef.h>

#define DP_CLUSTER_MAX_HOSTS 256
#define DP_HOST_LEN 256

typedef struct {
    /* As given by flags; NULL / -1 when absent. Not owned. */
    const char *flag_job_name;
    int flag_task_index;
    const char *flag_ps_hosts;      /* "h:p,h:p" */
    const char *flag_worker_hosts;  /* "h:p,h:p" */

    /* Resolved by dp_cluster_resolve. */
    char job_name[16];              /* "ps", "worker" or "" when not given */
    int task_index;                 /* -1 when not given */
    int n_ps;
    int n_workers;                  /* chief included, as worker 0 */
    char ps[DP_CLUSTER_MAX_HOSTS][DP_HOST_LEN];
    char workers[DP_CLUSTER_MAX_HOSTS][DP_HOST_LEN];
} dp_cluster_t;

/* Set the flag fields to "absent". */
void dp_cluster_init(dp_cluster_t *c);

/* Merge flags with tf_config (the TF_CONFIG text, or NULL) and validate:
 * host:port syntax, task index in range of its job. Returns -1 with one line
 * in err naming the flag or TF_CONFIG field at fault. */
int dp_cluster_resolve(dp_cluster_t *c, const char *tf_config, char *err);

/* "tcp://h1:p1,tcp://h2:p2" for the ps job, into out (n bytes). */
int dp_cluster_ps_endpoints(const dp_cluster_t *c, char *out, size_t n, char *err);

/* "tcp://" "*:PORT" (one string) for this task's own port: what it binds, on
 * every interface. */
int dp_cluster_bind_endpoint(const dp_cluster_t *c, char *out, size_t n, char *err);

/* This task's own "host:port" after resolve, or NULL when no job was given. */
const char *dp_cluster_self(const dp_cluster_t *c);

/* Validate one "host:port" ("[v6]:port" for IPv6; port 1..65535); host
 * (brackets stripped) and port are filled when non-NULL. */
int dp_cluster_parse_host_port(const char *s, char *host, size_t host_n, int *port, char *err);

/* One line for logs: "worker task 1 (h:p); 2 ps, 3 workers". */
int dp_cluster_describe(const dp_cluster_t *c, char *out, size_t n);
/* Log that line ("cluster: ..."): the daemons do at start when the cluster
 * spec placed them, so a TFJob pod's log says which task it took itself for. */
void dp_cluster_log(const dp_cluster_t *c);

#endif
