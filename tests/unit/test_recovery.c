/* test_recovery: what lets a cluster survive a restart — the shard's
 * per-worker steps (a (worker, step) applied once, kept in the checkpoint),
 * the server's incarnation on every reply, ERR_UNKNOWN_WORKER without a
 * HELLO, and the client that says HELLO again and repeats its request when a
 * shard restarted (counting the updates lost), and resumes a restarted
 * worker after its steps. Servers run in threads of this process on
 * loopback; every wait is bounded. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/model.h"
#include "common/util.h"
#include "server/core/shard.h"
#include "server/core/shard_checkpoint.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 2.0 /* client timeout in these tests */

/* Async, 2 workers, the harness's small model and SGD, on bind (NULL: a
 * free loopback port), with checkpoints in ckpt_dir when given. */
static void srv_init_at(srv_t *s, const char *bind, const char *ckpt_dir)
{
    srv_init(s, DP_MODE_ASYNC, 2);
    if (bind) snprintf(s->cfg.bind, sizeof s->cfg.bind, "%s", bind);
    if (ckpt_dir) snprintf(s->cfg.checkpoint_dir, sizeof s->cfg.checkpoint_dir, "%s", ckpt_dir);
}

static dp_model_t s_small;
static void s_small_model(void) { srv_small_model(&s_small); }

/* ---- a raw DEALER ------------------------------------------------------ */

/* One bodiless request (HEARTBEAT, PULL with an empty Pull) from worker 0;
 * the reply envelope (to dp_wire_destroy), or NULL after 5 s. */
static Downpour__Envelope *s_ask(void *sock, int type)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, type, 42, 0, s_small.fingerprint);
    Downpour__Pull pull = DOWNPOUR__PULL__INIT;
    if (type == DOWNPOUR__MSG_TYPE__PULL) env.pull = &pull;
    char err[DP_ERR_LEN];
    if (dp_wire_send(sock, NULL, &env, NULL, 0, err) != 0) return NULL;
    dp_wire_rx_t rx;
    if (dp_wire_recv(sock, &rx, 0, err) != 0) return NULL; /* RCVTIMEO bounds it */
    Downpour__Envelope *rep = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
    dp_wire_rx_fini(&rx);
    return rep;
}

/* ---- cases ------------------------------------------------------------- */

/* The shard's step table: step 0 and untracked shards never repeat; a step
 * at or below the last applied one does. */
static void test_shard_steps(void)
{
    s_small_model();
    dp_shard_t s;
    char err[DP_ERR_LEN];
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    CHECK_EQ(dp_shard_init(&s, &s_small, 0, 1, 1, &o, err), 0);
    CHECK_EQ(dp_shard_step_seen(&s, 0, 1), 0); /* not tracked */
    dp_shard_step_done(&s, 0, 1);              /* ignored, no crash */
    dp_shard_track_steps(&s, 2);
    CHECK_EQ(dp_shard_step_seen(&s, 0, 1), 0);
    dp_shard_step_done(&s, 0, 3);
    CHECK_EQ(dp_shard_step_seen(&s, 0, 3), 1);
    CHECK_EQ(dp_shard_step_seen(&s, 0, 2), 1);
    CHECK_EQ(dp_shard_step_seen(&s, 0, 4), 0);
    CHECK_EQ(dp_shard_step_seen(&s, 0, 0), 0); /* no step: never a repeat */
    CHECK_EQ(dp_shard_step_seen(&s, 1, 1), 0); /* per worker */
    CHECK_EQ(dp_shard_step_seen(&s, 2, 1), 0); /* out of range: no */
    dp_shard_step_done(&s, 0, 2);              /* older: kept at 3 */
    CHECK_EQ(s.worker_step[0], 3);
    dp_shard_fini(&s);
    dp_shard_fini(&s); /* safe twice */
}

/* The steps survive a checkpoint; a file for another number of workers is
 * refused; a shard that keeps no steps ignores them. */
static void test_checkpoint_worker_steps(void)
{
    s_small_model();
    char dir[] = "/tmp/dp_recovery_XXXXXX", path[512], err[DP_ERR_LEN] = "";
    CHECK(mkdtemp(dir) != NULL);
    dp_shard_checkpoint_path(path, sizeof path, dir, 0, 1);
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    dp_shard_t a, b, c, d;
    CHECK_EQ(dp_shard_init(&a, &s_small, 0, 1, 1, &o, err), 0);
    dp_shard_track_steps(&a, 3);
    dp_shard_step_done(&a, 0, 7);
    dp_shard_step_done(&a, 2, 12345678901ULL);
    a.version = 9;
    CHECK_EQ(dp_shard_checkpoint_write(&a, path, NULL, err), 0);
    CHECK_EQ(dp_shard_init(&b, &s_small, 0, 1, 1, &o, err), 0);
    dp_shard_track_steps(&b, 3);
    CHECK_EQ(dp_shard_checkpoint_restore(&b, path, NULL, err), DP_CKPT_RESTORED);
    CHECK_EQ(b.version, 9);
    CHECK_EQ(b.worker_step[0], 7);
    CHECK_EQ(b.worker_step[1], 0);
    CHECK_EQ(b.worker_step[2], 12345678901ULL);
    CHECK_EQ(dp_shard_init(&c, &s_small, 0, 1, 1, &o, err), 0);
    dp_shard_track_steps(&c, 2);
    CHECK_EQ(dp_shard_checkpoint_restore(&c, path, NULL, err), DP_CKPT_BAD);
    CHECK(strstr(err, "worker_steps") != NULL);
    CHECK_EQ(c.version, 0); /* unchanged */
    CHECK_EQ(dp_shard_init(&d, &s_small, 0, 1, 1, &o, err), 0);
    CHECK_EQ(dp_shard_checkpoint_restore(&d, path, NULL, err), DP_CKPT_RESTORED);
    CHECK_EQ(d.version, 9);
    dp_shard_fini(&a), dp_shard_fini(&b), dp_shard_fini(&c), dp_shard_fini(&d);
    unlink(path);
    rmdir(dir);
}

/* Every reply carries the server's incarnation, a new one per start; a
 * PULL from a connection that said no HELLO is ERR_UNKNOWN_WORKER. */
static void test_incarnation_and_unknown_worker(void)
{
    s_small_model();
    srv_t s1, s2;
    srv_init_at(&s1, NULL, NULL);
    CHECK_EQ(srv_start(&s1), 0);
    void *ctx = zmq_ctx_new();
    void *sock = raw_dealer(ctx, s1.endpoint, 5000);
    uint64_t inc1 = 0;
    Downpour__Envelope *e = s_ask(sock, DOWNPOUR__MSG_TYPE__HEARTBEAT);
    CHECK(e != NULL);
    if (e) {
        CHECK_EQ(e->type, DOWNPOUR__MSG_TYPE__HEARTBEAT);
        inc1 = e->incarnation;
        CHECK(inc1 != 0);
    }
    dp_wire_destroy(&e);
    e = s_ask(sock, DOWNPOUR__MSG_TYPE__PULL);
    CHECK(e != NULL);
    if (e) {
        CHECK_EQ(e->type, DOWNPOUR__MSG_TYPE__ERROR);
        CHECK_EQ(e->error->code, DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER);
        CHECK_EQ(e->incarnation, inc1);
    }
    dp_wire_destroy(&e);
    zmq_close(sock);
    CHECK_EQ(srv_stop(&s1), 0);
    srv_init_at(&s2, s1.endpoint, NULL); /* the same port */
    CHECK_EQ(srv_start(&s2), 0);
    sock = raw_dealer(ctx, s2.endpoint, 5000);
    e = s_ask(sock, DOWNPOUR__MSG_TYPE__HEARTBEAT);
    CHECK(e != NULL);
    if (e) CHECK(e->incarnation != 0 && e->incarnation != inc1);
    dp_wire_destroy(&e);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s2), 0);
}

/* The last line of a metrics file holding key (to cJSON_Delete), or NULL. */
static cJSON *s_last_line_with(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char line[4096];
    cJSON *last = NULL;
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        if (o && cJSON_GetObjectItemCaseSensitive(o, key)) {
            cJSON_Delete(last);
            last = o;
        } else {
            cJSON_Delete(o);
        }
    }
    fclose(f);
    return last;
}

static double s_num(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* A push of a (worker, step) already applied is acknowledged as applied,
 * with a "repeat" reason, and not applied again; the server's metrics
 * count it in "repeats" (and once in "applied"); a new client of the same
 * worker hears where to resume. */
static void test_push_applied_once(void)
{
    s_small_model();
    srv_t s;
    srv_init_at(&s, NULL, NULL);
    char metrics[128];
    snprintf(metrics, sizeof metrics, "/tmp/dp_recovery_metrics_%d.jsonl", (int)getpid());
    unlink(metrics);
    snprintf(s.cfg.metrics_path, sizeof s.cfg.metrics_path, "%s", metrics);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL, *c2 = NULL;
    size_t n = s_small.n_floats;
    float *p = dp_calloc(n, 4), *g = dp_calloc(n, 4);
    for (size_t i = 0; i < n; i++) g[i] = 0.01f * (float)(i % 7);
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 1, PS_OPTS(TMO), NULL, err), 0);
    if (c) {
        CHECK_EQ(dp_ps_client_resume_step(c), 0);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(1, g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(r.reason[0], 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(1, g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1); /* the worker's push did count, once */
        CHECK_EQ(r.version, 1); /* not applied again */
        CHECK(strstr(r.reason, "repeat: step 1 of worker 1") != NULL);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(2, g, 1, 8), &r, err), 0);
        CHECK_EQ(r.version, 2);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0); /* no step: always applied */
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.version, 4);
    }
    /* The counters, asked by the chief (only it may ask STATS). */
    dp_ps_client_t *chief = NULL;
    CHECK_EQ(dp_ps_client_new(&chief, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (chief) {
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(chief, &st, err), 0);
        CHECK_EQ(st.applied, 4);
        CHECK_EQ(st.rejected, 0);
        CHECK_EQ(st.dropped, 0);
    }
    /* Worker 1 restarted (its old connection closed): it resumes after step 2. */
    dp_ps_client_destroy(&c);
    int rc;
    SRV_REJOIN(rc, err, dp_ps_client_new(&c2, s.endpoint, &s_small, 1, PS_OPTS(TMO), NULL, err));
    CHECK_EQ(rc, 0);
    if (c2) CHECK_EQ(dp_ps_client_resume_step(c2), 2);
    dp_ps_client_destroy(&c2);
    dp_ps_client_destroy(&chief);
    free(p), free(g);
    CHECK_EQ(srv_stop(&s), 0);
    /* The stop writes a last metrics line: one repeat, four applied. */
    cJSON *m = s_last_line_with(metrics, "repeats");
    CHECK(m != NULL);
    if (m) {
        CHECK_EQ(s_num(m, "repeats"), 1);
        CHECK_EQ(s_num(m, "applied"), 4);
        CHECK_EQ(s_num(m, "version"), 4);
    }
    cJSON_Delete(m);
    unlink(metrics);
}

static int s_copy(const char *from, const char *to)
{
    uint8_t *buf;
    size_t len;
    char err[DP_ERR_LEN];
    if (dp_read_file(from, &buf, &len, err) != 0) return -1;
    int rc = dp_write_file_atomic(to, buf, len, err);
    free(buf);
    return rc;
}

/* The shard "crashes" after its checkpoint of version 2 and comes back on
 * the same port: the client's next push says HELLO again, counts the one
 * update lost, and is applied on the restored version; a repeat of a step
 * the checkpoint holds is not applied again. */
static void test_client_rejoins_restarted_shard(void)
{
    s_small_model();
    char dir[] = "/tmp/dp_recovery_XXXXXX", path[512], saved[600], err[DP_ERR_LEN] = "";
    CHECK(mkdtemp(dir) != NULL);
    dp_shard_checkpoint_path(path, sizeof path, dir, 0, 1);
    snprintf(saved, sizeof saved, "%s/v2.safetensors", dir);
    srv_t s1, s2;
    srv_init_at(&s1, NULL, dir);
    s1.cfg.checkpoint_every = 2;
    CHECK_EQ(srv_start(&s1), 0);
    dp_ps_client_t *c = NULL;
    size_t n = s_small.n_floats;
    float *p = dp_calloc(n, 4), *g = dp_calloc(n, 4);
    for (size_t i = 0; i < n; i++) g[i] = 0.01f * (float)(i % 5);
    CHECK_EQ(dp_ps_client_new(&c, s1.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (!c) goto done;
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    for (uint64_t step = 1; step <= 3; step++) {
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(step, g, 1, 8), &r, err), 0);
        if (step == 2) CHECK_EQ(s_copy(path, saved), 0); /* the checkpoint of version 2 */
    }
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    CHECK_EQ(dp_ps_client_version(c), 3);
    CHECK_EQ(srv_stop(&s1), 0);
    CHECK_EQ(rename(saved, path), 0); /* as if killed after version 2's checkpoint */
    srv_init_at(&s2, s1.endpoint, dir);
    s2.cfg.checkpoint_every = 2; /* the same flags: step 4 may follow the restored 2 */
    CHECK_EQ(srv_start(&s2), 0);
    double t0 = dp_now();
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(4, g, 1, 8), &r, err), 0);
    CHECK(dp_now() - t0 < TMO); /* ERR_UNKNOWN_WORKER or the incarnation: no timeout */
    CHECK_EQ(r.applied, 1);
    CHECK_EQ(r.version, 3);     /* stamped with, and applied on, version 2 */
    CHECK_EQ(dp_ps_client_updates_lost(c), 1);
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(2, g, 1, 8), &r, err), 0);
    CHECK(strstr(r.reason, "repeat") != NULL); /* the checkpoint knew step 2 */
    CHECK_EQ(r.version, 3);
    CHECK_EQ(srv_stop(&s2), 0);
done:
    dp_ps_client_destroy(&c);
    free(p), free(g);
    unlink(path);
    unlink(saved);
    rmdir(dir);
}

/* As above, but worker 1 reaches the restarted shard first and pushes the
 * version past what worker 0 had seen: worker 0 still counts the update
 * lost, from the version the shard restarted at (Welcome.start_version),
 * not from the version its HELLO found. */
static void test_loss_counted_after_others_pushed(void)
{
    s_small_model();
    char dir[] = "/tmp/dp_recovery_XXXXXX", path[512], saved[600], err[DP_ERR_LEN] = "";
    CHECK(mkdtemp(dir) != NULL);
    dp_shard_checkpoint_path(path, sizeof path, dir, 0, 1);
    snprintf(saved, sizeof saved, "%s/v2.safetensors", dir);
    srv_t s1, s2;
    srv_init_at(&s1, NULL, dir);
    s1.cfg.checkpoint_every = 2;
    CHECK_EQ(srv_start(&s1), 0);
    dp_ps_client_t *c = NULL, *c1 = NULL;
    size_t n = s_small.n_floats;
    float *p = dp_calloc(n, 4), *g = dp_calloc(n, 4);
    for (size_t i = 0; i < n; i++) g[i] = 0.01f * (float)(i % 5);
    CHECK_EQ(dp_ps_client_new(&c, s1.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (!c) goto done;
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    for (uint64_t step = 1; step <= 3; step++) {
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(step, g, 1, 8), &r, err), 0);
        if (step == 2) CHECK_EQ(s_copy(path, saved), 0);
    }
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    CHECK_EQ(dp_ps_client_version(c), 3); /* worker 0 saw version 3 */
    CHECK_EQ(srv_stop(&s1), 0);
    CHECK_EQ(rename(saved, path), 0);     /* killed after version 2's checkpoint */
    srv_init_at(&s2, s1.endpoint, dir);
    s2.cfg.checkpoint_every = 2; /* the same flags: step 4 may follow the restored 2 */
    CHECK_EQ(srv_start(&s2), 0);
    CHECK_EQ(dp_ps_client_new(&c1, s2.endpoint, &s_small, 1, PS_OPTS(TMO), NULL, err), 0);
    if (c1) {
        CHECK_EQ(dp_ps_client_pull(c1, p, err), 0);
        for (uint64_t step = 1; step <= 3; step++)
            CHECK_EQ(dp_ps_client_push(c1, PS_PUSH_STEP(step, g, 1, 8), &r, err), 0);
        CHECK_EQ(r.version, 5);           /* past the 3 worker 0 saw */
    }
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(4, g, 1, 8), &r, err), 0);
    CHECK_EQ(r.applied, 1);
    CHECK_EQ(dp_ps_client_updates_lost(c), 1); /* version 3: seen, then lost */
    CHECK_EQ(srv_stop(&s2), 0);
done:
    dp_ps_client_destroy(&c1);
    dp_ps_client_destroy(&c);
    free(p), free(g);
    unlink(path);
    unlink(saved);
    rmdir(dir);
}

DP_TESTS(T(test_shard_steps), T(test_checkpoint_worker_steps), T(test_incarnation_and_unknown_worker),
         T(test_push_applied_once), T(test_client_rejoins_restarted_shard),
         T(test_loss_counted_after_others_pushed))
