/* ps_rows_wire: ROWS_PULL and ROWS_PUSH on the wire — the handlers that
 * read a row message's frames, call the rules of server/core/ps_rows.h and
 * answer (ROWS, ACK, ERROR); the loop is server/loop/ps_loop.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/core/ps_rows.h"
#include "server/core/record.h"
#include "server/loop/ps_loop.h"

/* A row message's keys (tensor 0; wire-checked UINT64 [n]) copied out of
 * its frame (8-byte aligned: a frame need not be): malloc'd, *n set. */
static uint64_t *s_frame_keys(const Downpour__Envelope *env, const dp_wire_frame_t *frames, size_t *n)
{
    *n = (size_t)env->tensors[0]->shape[0];
    uint64_t *keys = dp_malloc((*n ? *n : 1) * sizeof *keys);
    memcpy(keys, frames[0].data, *n * sizeof *keys);
    return keys;
}

/* ZeroMQ's free callback of a ROWS frame. */
static void s_free_frame(void *data, void *hint)
{
    (void)hint;
    free(data);
}

/* ROWS: rows (malloc'd, n x D) handed to ZeroMQ, freed once sent. */
static void s_reply_rows(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                         float *rows, size_t n, uint64_t held)
{
    Downpour__Envelope rep;
    dp_ps_env(ps, &rep, DOWNPOUR__MSG_TYPE__ROWS, env->request_id, env->worker_id);
    Downpour__Rows body = DOWNPOUR__ROWS__INIT;
    body.version = ps->shard.version;
    body.held = held;
    rep.rows = &body;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[2];
    dp_wire_desc_keyed(&d, shape, "rows", DOWNPOUR__DTYPE__FLOAT32, rows, n, (size_t)ps->rows.width);
    rep.n_tensors = 1;
    rep.tensors = dv;
    dp_wire_payload_t pl = {rows, d.byte_length, s_free_frame, NULL};
    dp_ps_send(ps, id, &rep, &pl, 1);
}

/* A scan's page: the keys >= from the table holds, at most the page's
 * bound, their rows, and whether more follow (one key past the page
 * asked of the table says so). Keys and rows go to ZeroMQ, freed once
 * sent. */
static void s_on_rows_scan(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    dp_ps_rows_t *r = &ps->rows;
    const Downpour__RowsScan *scan = env->rows_pull->scan;
    uint32_t bound = dp_ps_rows_page(r);
    size_t page = scan->max_keys < bound ? scan->max_keys : bound; /* wire: >= 1 */
    uint64_t *keys = dp_malloc((page + 1) * sizeof *keys);
    size_t n = dp_rows_keys_from(r->table, scan->from, page + 1, keys);
    bool more = n > page;
    if (more) n = page;
    float *rows = dp_malloc((n ? n : 1) * (size_t)r->width * sizeof *rows);
    char why[DP_ERR_LEN];
    if (dp_rows_pull(r->table, keys, n, r->width, rows, why) < 0) { /* held keys, n <= max_keys */
        free(keys), free(rows);
        char msg[DP_ERR_LEN + 16];
        snprintf(msg, sizeof msg, "ROWS_PULL scan: %s", why);
        dp_ps_reply_error(ps, id, env->request_id, env->worker_id, msg);
        return;
    }
    Downpour__Envelope rep;
    dp_ps_env(ps, &rep, DOWNPOUR__MSG_TYPE__ROWS, env->request_id, env->worker_id);
    Downpour__Rows body = DOWNPOUR__ROWS__INIT;
    body.version = ps->shard.version;
    body.held = n;
    body.more = more;
    body.init = r->init;
    body.seed = r->seed;
    rep.rows = &body;
    Downpour__TensorDesc d[2];
    Downpour__TensorDesc *dv[2] = {&d[0], &d[1]};
    int64_t shape[2][2];
    dp_wire_desc_keyed(&d[0], shape[0], "keys", DOWNPOUR__DTYPE__UINT64, keys, n, 0);
    dp_wire_desc_keyed(&d[1], shape[1], "rows", DOWNPOUR__DTYPE__FLOAT32, rows, n, (size_t)r->width);
    rep.n_tensors = 2;
    rep.tensors = dv;
    dp_wire_payload_t pl[2] = {{keys, d[0].byte_length, s_free_frame, NULL},
                               {rows, d[1].byte_length, s_free_frame, NULL}};
    dp_ps_send(ps, id, &rep, pl, 2);
}

void dp_ps_on_rows_pull(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                        const dp_wire_frame_t *frames, int n_frames)
{
    (void)n_frames;
    dp_ps_rows_t *r = &ps->rows;
    char msg[DP_ERR_LEN + 16], why[DP_ERR_LEN];
    int w = env->worker_id;
    if (!r->table) {
        dp_ps_reply_error(ps, id, env->request_id, w,
                          "ROWS_PULL: this shard's model has no row table (no embed:D layer)");
        return;
    }
    if ((int)env->rows_pull->width != r->width) {
        snprintf(msg, sizeof msg, "ROWS_PULL: rows of width %u asked; this shard's are %d wide",
                 env->rows_pull->width, r->width);
        dp_ps_reply_error(ps, id, env->request_id, w, msg);
        return;
    }
    if (env->rows_pull->scan) {
        s_on_rows_scan(ps, id, env);
        return;
    }
    size_t n = (size_t)env->tensors[0]->shape[0];
    if (dp_ps_rows_count_ok(r, n, why) != 0) { /* before the keys' copy and the rows are sized by n */
        r->n_pulled[w] = 0;
        snprintf(msg, sizeof msg, "ROWS_PULL: %s", why);
        dp_ps_reply_error(ps, id, env->request_id, w, msg);
        return;
    }
    uint64_t *keys = s_frame_keys(env, frames, &n);
    float *rows = dp_malloc((n ? n : 1) * (size_t)r->width * sizeof(float));
    long held = dp_ps_rows_pull(r, w, keys, n, rows, why);
    free(keys);
    if (held < 0) {
        free(rows);
        snprintf(msg, sizeof msg, "ROWS_PULL: %s", why);
        dp_ps_reply_error(ps, id, env->request_id, w, msg);
        return;
    }
    /* in async, row pushes land between dense versions: a replay gives the
     * worker the table as of this point in the shard's stream */
    dp_record_rows_pull(ps->rec, (int)r->shard, w, ps->shard.version, (uint64_t)n);
    s_reply_rows(ps, id, env, rows, n, (uint64_t)held); /* rows go with it */
}

void dp_ps_on_rows_push(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                        const dp_wire_frame_t *frames, int n_frames)
{
    (void)n_frames;
    dp_ps_rows_t *r = &ps->rows;
    const Downpour__RowsPush *p = env->rows_push;
    int w = env->worker_id;
    if (!r->table) {
        dp_ps_reply_error(ps, id, env->request_id, w,
                          "ROWS_PUSH: this shard's model has no row table (no embed:D layer)");
        return;
    }
    /* The dense push's step rule, the same call: before the step may count
     * as a repeat, one message cannot put the worker's row steps out of its
     * reach (a stranger's step 2^62 made every later push a "repeat"). */
    char msg[DP_ERR_LEN];
    if (dp_shard_step_check(&ps->shard, w, p->step, msg, sizeof msg) != 0) {
        /* a row push refused: counted with the row table's (row_pushes_rejected) */
        r->rejected++;
        ps->shard.counts.malformed++;
        dp_ps_send_error(ps, id, env->request_id, w, DOWNPOUR__ERROR_CODE__ERR_NONE, msg);
        return;
    }
    dp_shard_step_handled(&ps->shard, w, p->step);
    dp_push_outcome_t o;
    size_t n = (size_t)env->tensors[0]->shape[0];
    int repeat = 0;
    if (dp_ps_rows_count_ok(r, n, msg) != 0) { /* before the keys' copy is sized by n */
        dp_ps_rows_refuse(r, msg, &o);
    } else {
        uint64_t *keys = s_frame_keys(env, frames, &n);
        repeat = dp_ps_rows_push(r, w, p->step, p->version, ps->shard.version, (int)p->width, keys,
                                 n, frames[1].data, &o);
        free(keys);
    }
    if (o.status == DP_PUSH_REJECTED)
        dp_log_debug("shard %d: worker %d: ROWS_PUSH rejected: %s", ps->cfg->shard_index, w, o.reason);
    if (!repeat) /* a repeat changes nothing: not an event */
        dp_record_rows_push(ps->rec, (int)r->shard, w, p->step, p->version, &o, n,
                            o.status == DP_PUSH_REJECTED ? NULL : frames[1].data, r->width);
    dp_ps_reply_ack(ps, id, env->request_id, w, &o);
}
