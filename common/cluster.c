/* cluster: merge the TensorFlow-style cluster flags with TF_CONFIG and
 * validate the result (see cluster.h for the shape of both).
 *
 * Invariants after a successful dp_cluster_resolve:
 *   - every ps[] / workers[] entry is a trimmed, valid "host:port" (port
 *     1..65535, IPv6 literals in brackets), shorter than DP_HOST_LEN, and no
 *     host:port appears twice across both lists;
 *   - job_name is "ps", "worker" or "" (a "chief" task is folded into worker
 *     0); task_index is -1 exactly when job_name is "", else in range of the
 *     job's list; a worker always has at least one ps host.
 * Errors are one line naming the flag or the TF_CONFIG field at fault, since
 * these are what a user typed into a job script or a TFJob manifest; what
 * they quote of the input goes through s_quote, so a newline or a terminal
 * escape inside a JSON string or a flag cannot split or forge a log line. */
#include "common/cluster.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* One host list while it is being built, and the name to blame for it. */
typedef struct {
    int n;
    int cap;                     /* room in hosts; 0 means DP_CLUSTER_MAX_HOSTS */
    char (*hosts)[DP_HOST_LEN];  /* points into the cluster's ps[] or workers[] */
    char src[48];                /* "--ps-hosts" or "TF_CONFIG: cluster.ps" */
} s_list_t;

/* Room for S_QUOTE_MAX input bytes (a whole host entry), each written as
 * up to 4. */
#define S_QUOTE_MAX DP_HOST_LEN
typedef struct {
    char s[4 * S_QUOTE_MAX + 1];
} s_quoted_t;

/* At most max (<= S_QUOTE_MAX) bytes of s[0..len) for an error message,
 * with each control byte written as \n, \t, \r or \xHH. */
static const char *s_quote(s_quoted_t *q, const char *s, size_t len, size_t max)
{
    size_t k = 0;
    if (max > S_QUOTE_MAX) max = S_QUOTE_MAX;
    for (size_t i = 0; i < len && i < max && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != 0x7f) q->s[k++] = (char)c;
        else if (c == '\n' || c == '\t' || c == '\r') {
            q->s[k++] = '\\';
            q->s[k++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else {
            k += (size_t)snprintf(q->s + k, sizeof q->s - k, "\\x%02x", c);
        }
    }
    q->s[k] = 0;
    return q->s;
}

void dp_cluster_init(dp_cluster_t *c)
{
    memset(c, 0, sizeof *c);
    c->flag_job_name = NULL;
    c->flag_task_index = -1;
    c->flag_ps_hosts = NULL;
    c->flag_worker_hosts = NULL;
    c->task_index = -1;
}

/* Checks one host:port of length len (not NUL-terminated). On failure sets
 * *why to a static reason and returns -1. */
static int s_check_host_port(const char *s, size_t len, char *host, size_t host_n, int *port,
                             const char **why)
{
    size_t colon;  /* index of the ':' before the port */
    size_t h0, h1; /* host is s[h0, h1) */
    if (len == 0) {
        *why = "empty entry";
        return -1;
    }
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close) {
            *why = "'[' without ']'";
            return -1;
        }
        h0 = 1;
        h1 = (size_t)(close - s);
        if (h1 + 1 >= len || s[h1 + 1] != ':') {
            *why = "missing :port after ']'";
            return -1;
        }
        colon = h1 + 1;
        int has_colon = 0;
        for (size_t i = h0; i < h1; i++) {
            /* IPv6 literal, possibly with a %zone (letters and digits). */
            if (!(isalnum((unsigned char)s[i]) || s[i] == ':' || s[i] == '.' || s[i] == '%')) {
                *why = "bad character in IPv6 address";
                return -1;
            }
            if (s[i] == ':') has_colon = 1;
        }
        if (!has_colon) {
            *why = "brackets are only for IPv6 addresses";
            return -1;
        }
    } else {
        const char *last = NULL;
        for (size_t i = 0; i < len; i++)
            if (s[i] == ':') last = s + i;
        if (!last) {
            *why = "missing :port";
            return -1;
        }
        h0 = 0;
        h1 = colon = (size_t)(last - s);
        for (size_t i = h0; i < h1; i++) {
            if (s[i] == ':') {
                *why = "an IPv6 address needs brackets: [addr]:port";
                return -1;
            }
            if (!(isalnum((unsigned char)s[i]) || s[i] == '-' || s[i] == '.' || s[i] == '_')) {
                *why = "bad character in host name";
                return -1;
            }
        }
    }
    if (h1 == h0) {
        *why = "empty host";
        return -1;
    }
    size_t p0 = colon + 1;
    if (p0 >= len) {
        *why = "empty port";
        return -1;
    }
    long p = 0;
    for (size_t i = p0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) {
            *why = "port is not a number";
            return -1;
        }
        if (p <= 65535) p = p * 10 + (s[i] - '0');
    }
    if (p < 1 || p > 65535) {
        *why = "port out of range 1..65535";
        return -1;
    }
    if (host) {
        size_t hl = h1 - h0;
        if (hl >= host_n) {
            *why = "host name too long";
            return -1;
        }
        memcpy(host, s + h0, hl);
        host[hl] = '\0';
    }
    if (port) *port = (int)p;
    return 0;
}

int dp_cluster_parse_host_port(const char *s, char *host, size_t host_n, int *port, char *err)
{
    const char *why = NULL;
    if (!s) return dp_err(err, "missing host:port");
    s_quoted_t q;
    if (s_check_host_port(s, strlen(s), host, host_n, port, &why) != 0)
        return dp_err(err, "\"%s\" is not host:port: %s", s_quote(&q, s, strlen(s), S_QUOTE_MAX), why);
    return 0;
}

/* Appends one entry s[0..len) to l after trimming blanks and validating it;
 * `where` names it in errors ("--ps-hosts entry 2", "TF_CONFIG: cluster.ps[1]"). */
static int s_list_add(s_list_t *l, const char *s, size_t len, const char *where, char *err)
{
    while (len > 0 && isspace((unsigned char)s[0])) s++, len--;
    while (len > 0 && isspace((unsigned char)s[len - 1])) len--;
    const char *why = NULL;
    if (len >= DP_HOST_LEN)
        return dp_err(err, "%s: host:port longer than %d characters", where, DP_HOST_LEN - 1);
    s_quoted_t q;
    if (s_check_host_port(s, len, NULL, 0, NULL, &why) != 0)
        return dp_err(err, "%s \"%s\" is not host:port: %s", where, s_quote(&q, s, len, S_QUOTE_MAX), why);
    if (l->n >= (l->cap ? l->cap : DP_CLUSTER_MAX_HOSTS))
        return dp_err(err, "%s: more than %d hosts", l->src,
                      l->cap ? l->cap : DP_CLUSTER_MAX_HOSTS);
    memcpy(l->hosts[l->n], s, len);
    l->hosts[l->n][len] = '\0';
    l->n++;
    return 0;
}

/* "h:p,h:p" from a flag. An empty flag value is an error: a script that
 * expands an empty variable into --ps-hosts "" should say so. */
static int s_list_from_flag(s_list_t *l, const char *flag, const char *value, char *err)
{
    snprintf(l->src, sizeof l->src, "%s", flag);
    l->n = 0;
    const char *p = value;
    int k = 0;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char where[64];
        snprintf(where, sizeof where, "%s entry %d", flag, k);
        if (s_list_add(l, p, len, where, err) != 0) return -1;
        k++;
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
}

/* cluster.<job> of TF_CONFIG: absent (n = 0, returns 0), or an array of
 * host:port strings. */
static int s_list_from_json(s_list_t *l, const cJSON *cluster, const char *job, char *err)
{
    snprintf(l->src, sizeof l->src, "TF_CONFIG: cluster.%s", job);
    l->n = 0;  /* l->cap stays: the worker list leaves room for a chief */
    const cJSON *a = cluster ? cJSON_GetObjectItemCaseSensitive(cluster, job) : NULL;
    if (!a || cJSON_IsNull(a)) return 0;
    if (!cJSON_IsArray(a))
        return dp_err(err, "TF_CONFIG: cluster.%s must be a list of \"host:port\" strings", job);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        char where[64];
        snprintf(where, sizeof where, "TF_CONFIG: cluster.%s[%d]", job, i);
        if (!cJSON_IsString(e) || !e->valuestring)
            return dp_err(err, "%s must be a \"host:port\" string", where);
        if (s_list_add(l, e->valuestring, strlen(e->valuestring), where, err) != 0) return -1;
        i++;
    }
    return 0;
}

/* What TF_CONFIG said, before flags are merged in. */
typedef struct {
    int present;
    char type[16];       /* task.type as given: ps, worker, chief; "" if none */
    int index;           /* task.index as given; -1 if no task */
    int n_chief;         /* entries of cluster.chief (0 or 1) */
    s_list_t ps, worker; /* worker includes the chief first */
} s_tf_t;

/* tf before any TF_CONFIG: no task, empty lists that fill ps[] and workers[]. */
static void s_tf_init(s_tf_t *tf, char (*ps)[DP_HOST_LEN], char (*workers)[DP_HOST_LEN])
{
    memset(tf, 0, sizeof *tf);
    tf->index = -1;
    tf->ps.hosts = ps;
    tf->worker.hosts = workers;
    snprintf(tf->ps.src, sizeof tf->ps.src, "TF_CONFIG: cluster.ps");
    snprintf(tf->worker.src, sizeof tf->worker.src, "TF_CONFIG: cluster.worker");
}

/* text as a JSON document, or NULL with err saying where it stops being one. */
static cJSON *s_tf_json(const char *text, char *err)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (root) return root;
    size_t off = end ? (size_t)(end - text) : 0;
    if (!end || !*end) {
        dp_err(err, "TF_CONFIG: not valid JSON: it ends early (byte %zu)", off);
        return NULL;
    }
    s_quoted_t q;
    dp_err(err, "TF_CONFIG: not valid JSON at byte %zu: \"%s\"", off, s_quote(&q, end, strlen(end), 20));
    return NULL;
}

/* cluster: the ps list, then the chief and the workers into one worker
 * list, the chief first (it is worker 0). */
static int s_tf_cluster(s_tf_t *tf, const cJSON *cluster, char *err)
{
    if (cluster && !cJSON_IsNull(cluster) && !cJSON_IsObject(cluster))
        return dp_err(err, "TF_CONFIG: cluster must be an object of job name -> [\"host:port\", ...]");
    if (s_list_from_json(&tf->ps, cluster, "ps", err) != 0) return -1;
    if (s_list_from_json(&tf->worker, cluster, "chief", err) != 0) return -1;
    tf->n_chief = tf->worker.n;
    if (tf->n_chief > 1)
        return dp_err(err, "TF_CONFIG: cluster.chief has %d hosts; there is at most one chief",
                      tf->n_chief);
    /* Room for the chief is kept at the front of workers[]. */
    s_list_t w = {.n = 0, .cap = DP_CLUSTER_MAX_HOSTS - tf->n_chief,
                  .hosts = tf->worker.hosts + tf->n_chief};
    if (s_list_from_json(&w, cluster, "worker", err) != 0) return -1;
    tf->worker.n = tf->n_chief + w.n;
    return 0;
}

/* task.index: absent or null is 0 (TensorFlow's default), else an integer
 * in [0, 1e6]. */
static int s_tf_index(s_tf_t *tf, const cJSON *index, char *err)
{
    if (!index || cJSON_IsNull(index)) {
        tf->index = 0;
        return 0;
    }
    double v = cJSON_IsNumber(index) ? index->valuedouble : -1;
    if (!cJSON_IsNumber(index) || v < 0 || v != floor(v) || v > 1e6)
        return dp_err(err, "TF_CONFIG: task.index must be an integer >= 0");
    tf->index = (int)v;
    return 0;
}

/* task.index within its job's list, in TF_CONFIG's own numbering, so the
 * message names the numbers the user wrote: TF_CONFIG must be consistent
 * on its own even when flags replace some of it. A job without a list here
 * is checked after merging, in folded numbering. */
static int s_tf_index_in_range(const s_tf_t *tf, char *err)
{
    const char *t = tf->type;
    int n = strcmp(t, "ps") == 0       ? tf->ps.n
            : strcmp(t, "chief") == 0  ? tf->n_chief
                                       : tf->worker.n - tf->n_chief;
    if (n > 0 && tf->index >= n)
        return dp_err(err, "TF_CONFIG: task.index %d out of range: cluster.%s has %d host%s",
                      tf->index, t, n, n == 1 ? "" : "s");
    if (strcmp(t, "chief") == 0 && tf->n_chief == 0)
        return dp_err(err, "TF_CONFIG: task.type is \"chief\" but cluster.chief is missing");
    return 0;
}

/* task (absent or null: none): its type, ps, worker or chief, and index. */
static int s_tf_task(s_tf_t *tf, const cJSON *task, char *err)
{
    if (!task || cJSON_IsNull(task)) return 0;
    if (!cJSON_IsObject(task))
        return dp_err(err, "TF_CONFIG: task must be an object {\"type\": ..., \"index\": ...}");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(task, "type");
    if (!cJSON_IsString(type) || !type->valuestring)
        return dp_err(err, "TF_CONFIG: task.type must be a string: \"ps\", \"worker\" or \"chief\"");
    const char *t = type->valuestring;
    if (strcmp(t, "ps") != 0 && strcmp(t, "worker") != 0 && strcmp(t, "chief") != 0) {
        s_quoted_t q;
        return dp_err(err, "TF_CONFIG: task.type \"%s\" is not supported: ps, worker or chief",
                      s_quote(&q, t, strlen(t), 32));
    }
    snprintf(tf->type, sizeof tf->type, "%s", t);
    if (s_tf_index(tf, cJSON_GetObjectItemCaseSensitive(task, "index"), err) != 0) return -1;
    return s_tf_index_in_range(tf, err);
}

/* TF_CONFIG's text (NULL, empty or blank: none) into tf, its lists into
 * ps[] and workers[]. */
static int s_parse_tf_config(s_tf_t *tf, const char *text, char (*ps)[DP_HOST_LEN],
                             char (*workers)[DP_HOST_LEN], char *err)
{
    s_tf_init(tf, ps, workers);
    if (!text) return 0;
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (*p == '\0') return 0; /* TF_CONFIG="" is the same as unset */
    tf->present = 1;
    cJSON *root = s_tf_json(text, err);
    if (!root) return -1;
    int rc = -1;
    if (!cJSON_IsObject(root))
        dp_err(err, "TF_CONFIG: must be a JSON object with \"cluster\" and \"task\"");
    else if (s_tf_cluster(tf, cJSON_GetObjectItemCaseSensitive(root, "cluster"), err) == 0 &&
             s_tf_task(tf, cJSON_GetObjectItemCaseSensitive(root, "task"), err) == 0)
        rc = 0;
    cJSON_Delete(root);
    return rc;
}

/* The flags on their own, before TF_CONFIG: the job name is one we run and
 * the index fits it. An empty --job-name counts as absent (a scripted
 * --job-name "$ROLE" with ROLE unset); *fjob is the job flag or NULL. */
static int s_check_flags(const dp_cluster_t *c, const char **fjob, char *err)
{
    *fjob = c->flag_job_name && c->flag_job_name[0] ? c->flag_job_name : NULL;
    const char *j = *fjob;
    s_quoted_t q;
    if (j && strcmp(j, "ps") != 0 && strcmp(j, "worker") != 0 && strcmp(j, "chief") != 0)
        return dp_err(err, "--job-name \"%s\": expected ps or worker", s_quote(&q, j, strlen(j), 32));
    if (c->flag_task_index < -1)
        return dp_err(err, "--task-index %d: must be >= 0", c->flag_task_index);
    if (j && strcmp(j, "chief") == 0 && c->flag_task_index > 0)
        return dp_err(err, "--task-index %d: the chief is task 0 (it is worker 0)",
                      c->flag_task_index);
    return 0;
}

/* Job and index, each from the flag when given, else from TF_CONFIG
 * (folded: chief -> worker 0, worker i -> worker i+1 with a chief).
 * *index_src names where the index came from, for messages. */
static void s_pick_task(const dp_cluster_t *c, const char *fjob, const s_tf_t *tf, char *job,
                        size_t job_n, int *index, const char **index_src)
{
    int tf_index_folded = -1;
    if (tf->type[0]) {
        if (strcmp(tf->type, "chief") == 0)
            tf_index_folded = 0;
        else if (strcmp(tf->type, "worker") == 0)
            tf_index_folded = tf->index + tf->n_chief;
        else
            tf_index_folded = tf->index;
    }
    job[0] = '\0';
    *index = -1;
    *index_src = "--task-index";
    if (fjob) {
        snprintf(job, job_n, "%s", strcmp(fjob, "chief") == 0 ? "worker" : fjob);
        if (strcmp(fjob, "chief") == 0) *index = 0;
    } else if (tf->type[0]) {
        snprintf(job, job_n, "%s", strcmp(tf->type, "chief") == 0 ? "worker" : tf->type);
    }
    if (c->flag_task_index >= 0) {
        *index = c->flag_task_index;
    } else if (*index < 0 && tf_index_folded >= 0) {
        *index = tf_index_folded;
        *index_src = "TF_CONFIG: task.index";
    }
}

/* No duplicate endpoints: two tasks cannot bind one port. */
static int s_check_unique(const s_list_t *ps, const s_list_t *workers, char *err)
{
    for (int a = 0; a < ps->n + workers->n; a++) {
        const char *ha = a < ps->n ? ps->hosts[a] : workers->hosts[a - ps->n];
        for (int b = a + 1; b < ps->n + workers->n; b++) {
            const char *hb = b < ps->n ? ps->hosts[b] : workers->hosts[b - ps->n];
            if (strcmp(ha, hb) != 0) continue;
            const char *sa = a < ps->n ? ps->src : workers->src;
            const char *sb = b < ps->n ? ps->src : workers->src;
            if (sa == sb) return dp_err(err, "%s: %s is listed twice", sa, ha);
            return dp_err(err, "%s is in both %s and %s", ha, sa, sb);
        }
    }
    return 0;
}

/* This task within its job: the job lists hosts, the index is in range
 * (or implied by a single host), a worker has servers. */
static int s_check_task(const char *job, int *index, const char *index_src, const s_list_t *ps,
                        const s_list_t *workers, char *err)
{
    if (!job[0] && *index >= 0)
        return dp_err(err, "%s %d given without a job: add --job-name ps|worker", index_src, *index);
    if (!job[0]) return 0;
    int is_ps = strcmp(job, "ps") == 0;
    const s_list_t *own = is_ps ? ps : workers;
    const char *flag = is_ps ? "--ps-hosts" : "--worker-hosts";
    const char *field = is_ps ? "cluster.ps" : "cluster.worker";
    if (own->n == 0)
        return dp_err(err, "%s task needs its job's hosts: give %s (or %s in TF_CONFIG)", job, flag,
                      field);
    if (*index < 0) {
        if (own->n != 1)
            return dp_err(err, "%s task needs --task-index: %s has %d hosts", job, own->src, own->n);
        *index = 0;
    }
    if (*index >= own->n)
        return dp_err(err, "%s %d out of range: %s has %d host%s", index_src, *index, own->src,
                      own->n, own->n == 1 ? "" : "s");
    if (!is_ps && ps->n == 0)
        return dp_err(err, "worker task needs the ps hosts: give --ps-hosts (or cluster.ps in "
                           "TF_CONFIG)");
    return 0;
}

int dp_cluster_resolve(dp_cluster_t *c, const char *tf_config, char *err)
{
    c->job_name[0] = '\0';
    c->task_index = -1;
    c->n_ps = c->n_workers = 0;
    const char *fjob;
    if (s_check_flags(c, &fjob, err) != 0) return -1;

    s_tf_t tf;
    if (s_parse_tf_config(&tf, tf_config, c->ps, c->workers, err) != 0) return -1;

    /* The lists: a flag replaces TF_CONFIG's list for that job (and writes
     * straight into c->ps / c->workers, as TF_CONFIG's parse did). */
    s_list_t ps = tf.ps, workers = tf.worker;
    if (c->flag_ps_hosts) {
        ps.hosts = c->ps;
        if (s_list_from_flag(&ps, "--ps-hosts", c->flag_ps_hosts, err) != 0) return -1;
    }
    if (c->flag_worker_hosts) {
        workers.hosts = c->workers;
        if (s_list_from_flag(&workers, "--worker-hosts", c->flag_worker_hosts, err) != 0)
            return -1;
    }

    char job[16];
    int index;
    const char *index_src;
    s_pick_task(c, fjob, &tf, job, sizeof job, &index, &index_src);
    if (s_check_unique(&ps, &workers, err) != 0) return -1;
    if (s_check_task(job, &index, index_src, &ps, &workers, err) != 0) return -1;

    c->n_ps = ps.n;
    c->n_workers = workers.n;
    snprintf(c->job_name, sizeof c->job_name, "%s", job);
    c->task_index = job[0] ? index : -1;
    return 0;
}

const char *dp_cluster_self(const dp_cluster_t *c)
{
    if (c->task_index < 0) return NULL;
    if (strcmp(c->job_name, "ps") == 0 && c->task_index < c->n_ps) return c->ps[c->task_index];
    if (strcmp(c->job_name, "worker") == 0 && c->task_index < c->n_workers)
        return c->workers[c->task_index];
    return NULL;
}

int dp_cluster_ps_endpoints(const dp_cluster_t *c, char *out, size_t n, char *err)
{
    if (c->n_ps == 0) return dp_err(err, "no ps hosts: give --ps-hosts (or cluster.ps in TF_CONFIG)");
    size_t used = 0;
    for (int i = 0; i < c->n_ps; i++) {
        int w = snprintf(out + used, n - used, "%stcp://%s", i ? "," : "", c->ps[i]);
        if (w < 0 || (size_t)w >= n - used)
            return dp_err(err, "ps endpoints do not fit in %zu bytes", n);
        used += (size_t)w;
    }
    return 0;
}

int dp_cluster_bind_endpoint(const dp_cluster_t *c, char *out, size_t n, char *err)
{
    const char *self = dp_cluster_self(c);
    if (!self) return dp_err(err, "no task of this process: give --job-name and --task-index");
    int port = 0;
    if (dp_cluster_parse_host_port(self, NULL, 0, &port, err) != 0) return -1;
    int w = snprintf(out, n, "tcp://*:%d", port);
    if (w < 0 || (size_t)w >= n) return dp_err(err, "bind endpoint does not fit in %zu bytes", n);
    return 0;
}

int dp_cluster_describe(const dp_cluster_t *c, char *out, size_t n)
{
    int w;
    if (c->job_name[0])
        w = snprintf(out, n, "%s task %d (%s); %d ps, %d worker%s", c->job_name, c->task_index,
                     dp_cluster_self(c) ? dp_cluster_self(c) : "?", c->n_ps, c->n_workers,
                     c->n_workers == 1 ? "" : "s");
    else
        w = snprintf(out, n, "no task; %d ps, %d worker%s", c->n_ps, c->n_workers,
                     c->n_workers == 1 ? "" : "s");
    return w < 0 ? -1 : 0;
}

void dp_cluster_log(const dp_cluster_t *c)
{
    char line[DP_HOST_LEN + 96];
    dp_cluster_describe(c, line, sizeof line);
    dp_log_info("cluster: %s", line);
}
