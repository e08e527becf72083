/* distributed: the dense kind's loop against parameter servers — pull,
 * compute, push — and its part of the chief's end (the final weights
 * evaluated and saved); the driver (driver.h) connects, records each push,
 * applies the signal rule and ends the run.
 *
 * Three loops: local steps (below), and two more. The plain one does pull, compute, push in turn (sync always:
 * its step must see every gradient of the step before). The overlapped one
 * (--overlap; by default for a GPU worker in async) hands the client to a communication thread
 * (worker/client/pipeline.h) that, while step k computes, pushes step k-1's
 * gradient and then pulls step k+1's weights; so step k+1 computes on
 * weights without step k's gradient (one step older), the gradients
 * alternate between two push buffers, and each push is stamped with the
 * versions its own weights came with. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/dylu.h"
#include "common/rng.h"
#include "common/util.h"
#include "worker/exec/data.h"
#include "worker/client/pipeline.h"
#include "worker/client/ps_beat.h"
#include "worker/client/ps_client.h"
#include "worker/train/devside.h"
#include "worker/train/driver.h"

/* Sleep for the injected delay: fixed, or exponential with that mean (the
 * heavy tail of real stragglers). */
static void s_inject_delay(const dp_train_conf_t *c, dp_rng_t *rng)
{
    if (c->delay_ms <= 0) return;
    double ms = c->delay_ms;
    if (c->delay_exp) ms = -c->delay_ms * log(1.0 - dp_rng_uniform(rng));
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
    nanosleep(&ts, NULL);
}

/* Test hook, read here only: DP_TEST_HOLD_DIR=DIR holds worker T with
 * step S's batch in hand, before it computes and pushes it (S as its
 * metrics lines count), while the file DIR/hold-T-S exists. It writes its
 * pid to DIR/held-T-S first (removed when it goes on); its heartbeats go
 * on, so the servers keep it live however long the hold. A test thus puts
 * a crew in a known state, acts on it (a scale, a kill) and lets it go by
 * removing the file; SIGTERM or SIGINT lets it go too, so a worker asked
 * to leave while held ends that step whole first. The plain and the
 * overlapped loops hold, the embed kind's with its batch in hand, and the
 * actor-critic one before a segment; --local-steps' does not. */
void dp_train_test_hold(int task, long step, volatile sig_atomic_t *stop)
{
    const char *dir = getenv("DP_TEST_HOLD_DIR");
    if (!dir || !dir[0]) return;
    char hold[PATH_MAX], held[PATH_MAX], pid[32], err[DP_ERR_LEN];
    snprintf(hold, sizeof hold, "%s/hold-%d-%ld", dir, task, step);
    if (access(hold, F_OK) != 0) return;
    snprintf(held, sizeof held, "%s/held-%d-%ld", dir, task, step);
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (dp_write_file_atomic(held, pid, (size_t)n, err) != 0) dp_log_warn("DP_TEST_HOLD_DIR: %s", err);
    dp_log_info("DP_TEST_HOLD_DIR: worker %d holds before step %ld while %s exists", task, step, hold);
    while (access(hold, F_OK) == 0 && !(stop && *stop))
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    unlink(held);
}

/* The line per push: what was computed on which version, what the shards
 * made of it, and the updates lost so far to shard restarts. */
static void s_metrics_push(cJSON *line, int task, long step, long epoch, long dealt_index, float loss,
                           uint64_t version, const dp_push_result_t *r, int applied, uint64_t lost,
                           double compute_s, double wait_s, uint32_t pull_parts)
{
    cJSON_AddNumberToObject(line, "worker", task);
    cJSON_AddNumberToObject(line, "step", step);
    cJSON_AddNumberToObject(line, "epoch", epoch);
    /* an elastic crew: the batch of the epoch shard 0 dealt (worker/exec/data.h) */
    if (dealt_index >= 0) cJSON_AddNumberToObject(line, "batch", dealt_index);
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(loss, 6));
    cJSON_AddNumberToObject(line, "version", (double)version);
    cJSON_AddNumberToObject(line, "version_after", (double)r->version);
    cJSON_AddNumberToObject(line, "staleness", dp_metrics_round(r->staleness_mean, 4));
    cJSON_AddNumberToObject(line, "staleness_max", (double)r->staleness_max);
    cJSON_AddStringToObject(line, "status", applied ? "applied" : r->rejected ? "rejected" : "dropped");
    cJSON_AddNumberToObject(line, "updates_lost", (double)lost);
    if (r->workers_live > 0) cJSON_AddNumberToObject(line, "workers", r->workers_live);
    cJSON_AddNumberToObject(line, "bytes_pushed", (double)r->bytes); /* this push's gradient bytes */
    /* its messages, all shards, and those that left during the backward (--stream-push) */
    cJSON_AddNumberToObject(line, "push_parts", r->parts);
    cJSON_AddNumberToObject(line, "push_parts_early", r->parts_early);
    /* the plain loop: the PARAMS messages its pull took, all shards (--stream-pull) */
    if (pull_parts) cJSON_AddNumberToObject(line, "pull_parts", pull_parts);
    /* where the step's time went: computing, or blocked on the servers */
    cJSON_AddNumberToObject(line, "compute_ms", dp_metrics_round(compute_s * 1e3, 3));
    cJSON_AddNumberToObject(line, "wait_ms", dp_metrics_round(wait_s * 1e3, 3));
}

/* The worker's last line: its own staleness histogram. */
static void s_metrics_staleness(dp_session_t *s, const dp_staleness_t *h)
{
    cJSON *line = dp_metrics_line(s->metrics);
    if (!line) return;
    cJSON_AddStringToObject(line, "event", "staleness");
    cJSON_AddNumberToObject(line, "worker", s->conf.task_index);
    cJSON_AddItemToObject(line, "staleness_histogram", dp_staleness_json(h));
    cJSON_AddNumberToObject(line, "staleness_geometric_p", dp_metrics_round(dp_staleness_geometric_p(h), 6));
    dp_metrics_write(s->metrics, &line);
}

/* ---- the weights from the servers into the network --------------------- */

/* A device's sink: each tensor up from where the client lends it (a
 * shard's segment, page-locked by s_shm_lock: one DMA, no host copy). The
 * upload is done when it returns, so the client's second look at the slot's
 * seqlock comes after it (dp_ps_client_pull_to). */
static void s_upload_from(void *arg, size_t off, const float *data, size_t n)
{
    dp_session_t *s = arg;
    s->be->ops->upload(s->be, s->net.d_params + off, data, n * sizeof(float));
}

/* The device's copies to and from a shard's device region (the client's
 * dp_ps_device_t, set for a device worker): each queued on the compute
 * stream (copy_peer), then synchronize, which returns once every op queued
 * before it has completed, the copy among them. So the copy has landed
 * when the hook returns, and only then does the client unpin the ring
 * entry (a pull: the shard may rewrite it from then on) or record the
 * slot's event and count its push (the shard then reads the slot). In the
 * stream's order a pull's copy comes after the last step's ops (nothing
 * still reads the old weights) and before the next forward's; a push's
 * after the backward that wrote d_grads. */
static int s_weights_in(void *arg, size_t off, const float *src, size_t n, char *err)
{
    (void)err;
    dp_session_t *s = arg;
    s->be->ops->copy_peer(s->be, s->net.d_params + off, src, n * sizeof(float));
    s->be->ops->synchronize(s->be);
    return 0;
}

static int s_grads_out(void *arg, float *dst, const float *from, size_t off, size_t n, int device,
                       char *err)
{
    (void)err;
    dp_session_t *s = arg;
    const float *src = (from ? from : s->net.d_grads) + off;
    if (!device) { /* a slice that goes by shared memory or frames */
        s->be->ops->download(s->be, dst, src, n * sizeof(float));
        return 0;
    }
    s->be->ops->copy_peer(s->be, dst, src, n * sizeof(float));
    s->be->ops->synchronize(s->be);
    return 0;
}

static void s_enter(void *arg)
{
    dp_session_t *s = arg;
    s->be->ops->enter(s->be);
}

/* A pull straight into the network's parameters. On the CPU they are host
 * memory, so the pull writes them directly: one copy per pull from
 * ZeroMQ's buffer or the shard's shared-memory slot, not two. A device
 * copies a shard's device region's entry device to device (s_weights_in)
 * and uploads from the shards' segments where it has them, else from the
 * pinned h_params, the fast path for its copy engine. */
static int s_pull_into_net(dp_session_t *s, dp_ps_client_t *ps, char *err)
{
    if (s->be->host_memory) return dp_ps_client_pull(ps, s->net.d_params, err);
    if (dp_ps_client_shm_shards(ps) > 0 || dp_ps_client_devregion_shards(ps) > 0)
        return dp_ps_client_pull_device(ps, s_upload_from, s, err);
    if (dp_ps_client_pull(ps, s->h_params, err) != 0) return -1;
    dp_net_set_params(&s->net, s->h_params);
    return 0;
}

/* One training step for a push in turn, into *grads. On the CPU the
 * network's own gradient is host memory, and the push is done with it
 * before the next step writes it again, so it is pushed from there: no
 * copy. A device's gradient lands in lent (the shard's gradient segment,
 * page-locked: one DMA, no host copy after) or else in the pinned h_grads
 * as the backward pass goes; on_device: it stays on the device, for the
 * client to copy into each shard's device region slot (s_grads_out). */
static float s_step_for_push(dp_session_t *s, const dp_batch_t *b, float *lent, int on_device,
                             const float **grads)
{
    int host = s->be->host_memory;
    float *h = host || on_device ? NULL : lent ? lent : s->h_grads;
    float loss = dp_net_train_step_device(&s->net, b->d_x, b->d_y, s->conf.batch, h);
    *grads = h ? h : host ? s->net.d_grads : NULL; /* NULL: the client's s_grads_out */
    return loss;
}

/* Where this worker starts: after the last step every shard applied from
 * it (a restarted worker; 0 for a new one). The data order is a function of
 * the step, so it takes up exactly where it stopped. In sync mode the loop
 * pulls before it pushes, so a rejoining worker computes on the current
 * version. */
static long s_first_step(dp_ps_client_t *ps, int task, long total, long local_steps)
{
    /* with --local-steps H the servers count rounds of H data steps */
    uint64_t held = dp_ps_client_resume_step(ps) * (uint64_t)local_steps;
    long first = held < (uint64_t)total ? (long)held : total;
    if (first > 0)
        dp_log_info("worker %d: rejoining: the servers hold its steps 1..%ld; resuming at step %ld of %ld",
                    task, first, first + 1, total);
    return first;
}

/* The training loop's state, whichever loop runs. */
typedef struct dp_dense_cluster {
    dp_train_drv_t *d;
    dp_session_t *s;
    dp_ps_client_t *ps;
    const dp_ps_info_t *info;
    dp_batcher_t *bt;
    volatile sig_atomic_t *stop;
    float *grads2;             /* overlapped: the second push buffer (s->h_grads the first) */
    dp_rng_t delay_rng;
    long first, total, spe;    /* steps: where this worker starts, ends, per epoch */
    long applied, dropped, rejected;
    int overlap;               /* the overlapped loop runs */
    double wait_s;             /* the compute thread's time waiting on the servers */
    double step_compute_s, step_wait_s; /* the last step's, for its metrics line */
    dp_staleness_t hist;       /* this worker's applied pushes (the largest over shards) */
    int stream;                /* plain loop: the push leaves in parts during the backward */
    int stream_pull;           /* plain loop: the weights arrive in parts during the forward */
    /* the step in progress, plain loop, for the net's hooks */
    dp_ps_push_t *push;        /* begun by the hook at the forward's end (a pull in parts) */
    double pull_wait_s;        /* the forward's time blocked on the pull */
    char step_err[DP_ERR_LEN]; /* why the net's hook failed the step (net.pull_status) */
    uint32_t step_pull_parts;  /* its pull's PARAMS messages */
    uint64_t rec_version, rec_lost; /* the push being recorded: its weights' version, */
    int rec_applied;           /* the updates lost so far, whether every shard applied it */
    /* an elastic crew: shard 0 deals the batches (bt is dp_batcher_init_dealt's) */
    int dealt;
    long epochs;               /* the plan's epochs (rounded up), for the progress line */
    dp_ps_dealt_t pulled;      /* the batch the last pull brought */
    dp_ps_dealt_t batch[4];    /* step k's at k % 4 (the overlap records k - 1 while k computes) */
    int shm_locked, shm_lock_failed; /* s_shm_lock's one line each */
    dp_ps_device_t dev;        /* a device's copies to and from the device regions */
} s_loop_t;

/* The client's hook on the shards' segments (dp_ps_client_set_shm_hook):
 * a device page-locks them, so its copies from the parameter segment and
 * into the gradient segment are DMA; a failure is said once and those
 * copies go on from pageable memory (the runtime stages them). */
static void s_shm_lock(void *arg, void *base, size_t bytes, int read_only, int mapped)
{
    s_loop_t *L = arg;
    dp_backend_t *be = L->s->be;
    char err[DP_ERR_LEN];
    if (!mapped) {
        be->ops->host_unregister(be, base);
        return;
    }
    if (be->ops->host_register(be, base, bytes, read_only, err) == 0) {
        if (!L->shm_locked++)
            dp_log_info("%s: the shards' shared memory page-locked: its copies are DMA", be->name);
    } else if (!L->shm_lock_failed++) {
        dp_log_warn("%s: the shards' shared memory stays pageable: %s", be->name, err);
    }
}

/* A push's result: this worker's counters, then the driver's record (the
 * loss average, the metrics line, TensorBoard, evaluation, progress). */
static int s_record(s_loop_t *L, long step, float loss, uint64_t version,
                    const dp_push_result_t *r, uint64_t lost, double pulled_at, double pushed_at, char *err)
{
    int applied = r->applied == L->info->num_shards;
    L->applied += applied;
    if (applied) dp_staleness_add(&L->hist, r->staleness_max);
    L->dropped += r->dropped > 0;
    L->rejected += r->rejected > 0;
    L->rec_version = version;
    L->rec_lost = lost;
    L->rec_applied = applied;
    /* a round of local steps is step + 1 - done steps */
    dp_train_step_t st = {.step = step, .loss = loss,
                          .samples = (double)(step + 1 - L->d->done) * L->s->conf.batch,
                          .push = r, .pulled_at = pulled_at, .pushed_at = pushed_at, .last = !L->dealt && step + 1 == L->total};
    return dp_train_done(L->d, &st, err);
}

void dp_dense_cluster_metrics(dp_train_drv_t *d, const dp_train_step_t *st, cJSON *line)
{
    s_loop_t *L = ((dp_dense_run_t *)d->run)->cl;
    const dp_ps_dealt_t *dealt = &L->batch[st->step & 3];
    long epoch = L->dealt ? (long)dealt->epoch : st->step / L->spe;
    s_metrics_push(line, d->c->task_index, st->step, epoch, L->dealt ? (long)dealt->index : -1,
                   st->loss, L->rec_version, st->push, L->rec_applied, L->rec_lost,
                   L->step_compute_s, L->step_wait_s, L->step_pull_parts);
}

void dp_dense_cluster_progress(dp_train_drv_t *d, const dp_train_step_t *st, char *line, size_t n)
{
    s_loop_t *L = ((dp_dense_run_t *)d->run)->cl;
    const dp_ps_dealt_t *dealt = &L->batch[st->step & 3];
    long epoch = L->dealt ? (long)dealt->epoch : st->step / L->spe;
    int task = d->c->task_index;
    double dt = dp_now() - d->t0;
    long k = d->done - d->first;
    double rate = d->samples / (dt > 0 ? dt : 1e-9);
    if (L->dealt) /* its steps end when the epochs' batches do: no total of its own */
        snprintf(line, n, "worker %d  epoch %ld/%ld  step %ld  %.0f img/s  loss %.4f  staleness %.2f",
                 task, epoch + 1, L->epochs, d->done, rate, d->loss_avg, d->stale_sum / k);
    else
        snprintf(line, n, "worker %d  epoch %ld/%ld  step %ld/%ld  %.0f img/s  loss %.4f  staleness %.2f",
                 task, epoch + 1, (L->total + L->spe - 1) / L->spe, d->done, L->total, rate,
                 d->loss_avg, d->stale_sum / k);
}

/* The net's hook (worker/exec/net.h): layer by layer, the push's parts leave. */
static void s_grads_ready(void *arg, size_t off, size_t n)
{
    dp_ps_client_push_part(arg, off, n);
}

/* The net's hook (worker/exec/net.h): the forward waits for the floats it reads
 * next. At its end every float is in, the pull is complete, and a push in
 * parts begins before the backward makes its first part (its stamp is that
 * pull's versions). A failure stops the step (step_err says why). */
static dp_pull_status_t s_params_needed(void *arg, size_t end)
{
    s_loop_t *L = arg;
    double t0 = dp_now();
    dp_pull_status_t st = dp_ps_client_pull_until(L->ps, end, L->step_err);
    L->pull_wait_s += dp_now() - t0;
    if (st == DP_PULL_OK && end >= L->s->model.n_floats && L->stream &&
        dp_ps_client_push_begin(L->ps, L->push, L->step_err) != 0)
        return DP_PULL_FAILED;
    return st;
}

/* The batch the last pull dealt, as step's, gathered into *b. */
static int s_take_batch(s_loop_t *L, long step, dp_batch_t *b, char *err)
{
    dp_ps_dealt_t *d = &L->batch[step & 3];
    *d = L->pulled;
    return dp_batcher_take(L->bt, d->epoch, d->index, step, b, err);
}

/* An elastic crew's batch of step, dealt with the pull just begun or
 * made: gathered into *b. 1: there it is; 0: the end (the run's batches
 * are done); -1 with err. A pull in parts first waits for shard 0's first
 * part, which carries the deal (its wait counted as the pull's). */
static int s_dealt_batch(s_loop_t *L, long step, dp_batch_t *b, char *err)
{
    if (L->stream_pull) {
        double t0 = dp_now();
        if (dp_ps_client_pull_until(L->ps, 1, err) == DP_PULL_FAILED) return -1;
        L->pull_wait_s += dp_now() - t0;
    }
    if (dp_ps_client_dealt(L->ps, &L->pulled) != 0)
        return dp_err(err, "shard 0 dealt no batch with the weights");
    if (L->pulled.end) {
        /* the rest of a pull in parts, so that the client is free again */
        if (L->stream_pull &&
            dp_ps_client_pull_until(L->ps, L->s->model.n_floats, err) == DP_PULL_FAILED)
            return -1;
        return 0;
    }
    return s_take_batch(L, step, b, err) == 0 ? 1 : -1;
}

/* Pull, compute, push, in turn; with L->stream the push starts before the
 * backward and its parts leave as it makes them (from the CPU's gradient,
 * host memory, which the network makes in the shard's shared memory when
 * the whole push goes to one shard on this host, dp_ps_client_push_buffer;
 * a device's lands in the pinned h_grads layer by layer, so either way the
 * push's buffer is known before); with
 * L->stream_pull the pull is only begun before the forward, which waits
 * for each layer's weights as it reaches the layer (a device's into the
 * pinned h_params, each layer's sent up as it comes). An elastic crew's
 * batch comes with the pull (s_dealt_batch) instead of from the thread. */
static int s_loop_plain(s_loop_t *L, char *err)
{
    dp_session_t *s = L->s;
    int host = s->be->host_memory;
    s->net.h_pull = host ? NULL : s->h_params;
    dp_batch_t batch;
    for (;;) {
        long step = L->dealt ? L->d->done : dp_batcher_next(L->bt, &batch);
        if (step < 0 || dp_train_stopped(L->d)) break;
        dp_ps_push_t push = {.grads = host ? s->net.d_grads : s->h_grads,
                             .batch = s->conf.batch, .step = (uint64_t)step + 1};
        L->push = &push;
        L->pull_wait_s = 0;
        if (L->dealt) dp_ps_client_deal_step(L->ps, push.step);
        /* through a device region the pull is whole, one copy device to device */
        int parts = L->stream_pull && !dp_ps_client_devregion_shards(L->ps);
        double t0 = dp_now();
        if ((parts ? dp_ps_client_pull_begin(L->ps, host ? s->net.d_params : s->h_params, err)
                   : s_pull_into_net(s, L->ps, err)) != 0)
            return -1;
        double t1 = dp_now();
        /* between the pull and the first byte of the push (streamed, that
         * leaves during the backward): a slow worker's push arrives late */
        s_inject_delay(&s->conf, &L->delay_rng);
        double tc = dp_now();
        if (L->dealt) {
            int got = s_dealt_batch(L, step, &batch, err);
            if (got <= 0) return got;
        }
        dp_train_test_hold(s->conf.task_index, step, L->stop);
        if (host) { /* made where it is pushed from, if it can be (one shard on this host) */
            dp_net_grads_into(&s->net, dp_ps_client_push_buffer(L->ps, s->model.n_floats));
            push.grads = s->net.d_grads;
        }
        const float *grads;
        s->net.step = (unsigned long long)step; /* dropout's mask, by global step */
        /* a device's whole push: from the device into each shard's region
         * slot where every shard has one (--stream-push too: its parts
         * would hide nothing there, the PUSH is one descriptor and the copy
         * device to device), else to one shard on this host into its
         * segment */
        int on_dev = !host && dp_ps_client_push_on_device(L->ps);
        int stream = L->stream && !on_dev;
        if (stream && !parts && dp_ps_client_push_begin(L->ps, &push, err) != 0)
            return -1;
        if (stream) {
            s->net.on_grads = s_grads_ready;
            s->net.on_grads_arg = L->ps;
        }
        if (parts) {
            s->net.on_params = s_params_needed;
            s->net.on_params_arg = L;
        }
        float *lent = host || stream || on_dev
                          ? NULL : dp_ps_client_push_buffer(L->ps, s->model.n_floats);
        float loss = s_step_for_push(s, &batch, lent, on_dev, &grads);
        s->net.on_grads = NULL;
        s->net.on_params = NULL;
        if (s->net.pull_status == DP_PULL_FAILED) return dp_err(err, "%s", L->step_err);
        uint64_t version = dp_ps_client_version(L->ps);
        L->step_pull_parts = dp_ps_client_pull_parts(L->ps);
        double t2 = dp_now(); /* the push's wait counts from here: the end of the backward */
        dp_push_result_t r;
        push.grads = grads;
        push.loss = loss;
        if ((stream ? dp_ps_client_push_end(L->ps, &r, err)
                       : dp_ps_client_push(L->ps, &push, &r, err)) != 0)
            return -1;
        L->step_compute_s = t2 - tc - L->pull_wait_s;
        L->step_wait_s = (t1 - t0) + L->pull_wait_s + (dp_now() - t2);
        L->wait_s += L->step_wait_s;
        if (s_record(L, step, loss, version, &r, dp_ps_client_updates_lost(L->ps), t1, t2, err) != 0)
            return -1;
    }
    return 0;
}

/* --local-steps H (local SGD, DiLoCo): a round pulls the servers' weights
 * w0, takes H steps of this worker's own optimizer (--optimizer, --lr: the
 * inner one, its state kept from round to round, its lr scheduled by the
 * data step) on its own copy, and pushes the pseudo-gradient w0 - wH; the
 * servers step by it with their optimizer, the outer one (downpour-ps
 * --outer-optimizer: averaging, lr 1, or Nesterov). A push's step is the
 * round (1, 2, ...), so repeats and a rejoin count rounds, and staleness is
 * counted in outer versions. The last round may be shorter. */
static int s_loop_local(s_loop_t *L, char *err)
{
    dp_session_t *s = L->s;
    const dp_train_conf_t *c = &s->conf;
    size_t n = s->model.n_floats;
    const dp_optim_conf_t *opt = &c->optim;
    size_t n_state = n * (size_t)dp_optim_state_floats(opt);
    float *d_state = n_state ? s->be->ops->alloc(s->be, n_state * sizeof(float)) : NULL;
    float *w0 = dp_aligned_alloc((n + 1) * sizeof(float));
    long H = c->local_steps, step = -1;
    /* DyLU (--local-steps auto): each round's h by this worker's step time
     * (an EWMA of its own compute) against the crew's fastest, which the
     * last push's ACKs gave; its rounds counted from 0, not step / H */
    int dylu = L->info->local_auto;
    long h = H, round = dylu ? (long)dp_ps_client_resume_step(L->ps) - 1 : -1;
    double own_ms = 0, crew_ms = 0;
    dp_batch_t batch;
    int rc = -1;
    while ((step = dp_batcher_next(L->bt, &batch)) >= 0) {
        if (dp_train_stopped(L->d)) break;
        double t0 = dp_now();
        if (dp_ps_client_pull(L->ps, s->h_params, err) != 0) goto out;
        memcpy(w0, s->h_params, n * sizeof(float));
        dp_net_set_params(&s->net, s->h_params);
        double t1 = dp_now();
        uint64_t version = dp_ps_client_version(L->ps);
        long last = step, done = 0;
        round = dylu ? round + 1 : step / H;
        if (dylu) h = dp_dylu_steps(H, own_ms, crew_ms);
        float loss = 0;
        for (;;) {
            s->net.step = (unsigned long long)last;
            float l = dp_net_train_step_device(&s->net, batch.d_x, batch.d_y, c->batch, NULL);
            loss += l / (float)(dylu ? h : H);
            dp_net_optim_step(&s->net, opt, dp_optim_lr_at(opt, last), d_state, last + 1);
            done++;
            if ((dylu ? done == h : (last + 1) % H == 0) || last + 1 >= L->total) break;
            if ((step = dp_batcher_next(L->bt, &batch)) < 0) break;
            last = step;
        }
        dp_net_get_params(&s->net, s->h_params);
        dp_net_pseudo_gradient(&s->net, w0, s->h_params, s->h_grads);
        double t2 = dp_now();
        if (dylu) own_ms = dp_dylu_ewma(own_ms, (t2 - t1) * 1000.0 / (double)done);
        s_inject_delay(c, &L->delay_rng);
        dp_push_result_t r;
        double t3 = dp_now();
        dp_ps_push_t push = {.grads = s->h_grads, .loss = loss, .batch = c->batch,
                             .step = (uint64_t)round + 1};
        if (dylu) {
            push.local_steps = (uint32_t)done;
            push.step_ms = dp_dylu_valid_ms(own_ms) ? (float)own_ms : 0;
        }
        if (dp_ps_client_push(L->ps, &push, &r, err) != 0) goto out;
        if (dylu && r.crew_step_ms > 0) crew_ms = r.crew_step_ms;
        L->step_compute_s = t2 - t1;
        L->step_wait_s = (t1 - t0) + (dp_now() - t3);
        L->wait_s += L->step_wait_s;
        if (s_record(L, last, loss, version, &r, dp_ps_client_updates_lost(L->ps), t1, t3, err) != 0)
            goto out;
    }
    rc = 0;
out:
    free(w0);
    if (d_state) s->be->ops->release(s->be, d_state);
    return rc;
}

/* Take the communication thread's results in order, recording each push,
 * up to and including the next pull (its stamp into *stamp), or until none
 * is left. */
static int s_take(s_loop_t *L, dp_pipeline_t *pl, dp_ps_stamp_t *stamp, char *err)
{
    dp_pipe_job_t j;
    double tw = dp_now();
    int rc = 0;
    L->step_wait_s = 0; /* recorded pushes come in before the pull: their wait is unknown yet */
    while (dp_pipeline_wait(pl, &j) == 0) {
        if (j.rc != 0) {
            rc = dp_err(err, "%s", j.err);
            break;
        }
        if (j.op == DP_PIPE_PULL) {
            *stamp = j.stamp;
            L->pulled = j.dealt;
            break;
        }
        if (s_record(L, (long)j.step - 1, j.loss, dp_ps_stamp_sum(&j.stamp), &j.res, j.updates_lost, 0,
                     0, err) != 0) {
            rc = -1;
            break;
        }
    }
    L->step_wait_s = dp_now() - tw;
    L->wait_s += L->step_wait_s;
    return rc;
}

/* The step after step: the thread's next batch, or (an elastic crew)
 * step + 1, whose batch the last pull dealt. */
static long s_overlap_next(s_loop_t *L, long step, dp_batch_t *b)
{
    return L->dealt ? step + 1 : dp_batcher_next(L->bt, b);
}

/* The overlapped loop's pull job: into h_params, or on the device into the
 * double buffer's d_next (x set: devside.h). */
static dp_pipe_job_t s_pull_job(dp_session_t *s, dp_devside_t *x, uint64_t deal_step)
{
    if (x)
        return (dp_pipe_job_t){.op = DP_PIPE_PULL, .sink = dp_devside_sink, .sink_arg = x,
                               .deal_step = deal_step};
    return (dp_pipe_job_t){.op = DP_PIPE_PULL, .params = s->h_params, .deal_step = deal_step};
}

/* While step k computes, the thread pushes step k-1 and pulls for k+1
 * (posted in that order: the pull then sees step k-1's gradient applied).
 * An elastic crew's pull for k+1 brings k+1's batch: the loop ends when it
 * brings the end, once the pushes still queued are in. A device worker
 * whose shards all map their regions (x) pulls and pushes device to device
 * through the double buffers of devside.h; else through h_params and the
 * two host push buffers. */
static int s_loop_overlap(s_loop_t *L, dp_devside_t *x, char *err)
{
    dp_session_t *s = L->s;
    dp_pipeline_t *pl = NULL;
    if (x) dp_ps_client_set_device(L->ps, &x->dev); /* the thread's copies, side stream */
    if (dp_pipeline_new(&pl, L->ps, err) != 0) {
        dp_ps_client_set_device(L->ps, x ? &L->dev : NULL);
        return -1;
    }
    dp_ps_stamp_t stamp;
    dp_pipe_job_t job;
    float *grads[2] = {s->h_grads, L->grads2};
    int rc = -1;
    dp_batch_t batch;
    long step = L->dealt ? L->first : dp_batcher_next(L->bt, &batch);
    job = s_pull_job(s, x, L->dealt ? (uint64_t)step + 1 : 0);
    if (step >= 0) dp_pipeline_post(pl, &job);
    if (s_take(L, pl, &stamp, err) != 0) goto out;
    for (; step >= 0; step = s_overlap_next(L, step, &batch)) {
        if (dp_train_stopped(L->d)) { /* the driver's signal rule */
            rc = 0;
            goto out;
        }
        if (L->dealt) {
            if (L->pulled.end) break;
            if (s_take_batch(L, step, &batch, err) != 0) goto out;
        }
        dp_train_test_hold(s->conf.task_index, step, L->stop);
        /* h_params (d_next) is free for the next pull from here */
        if (x) dp_devside_take(x);
        else dp_net_set_params(&s->net, s->h_params);
        job = s_pull_job(s, x, L->dealt ? (uint64_t)step + 2 : 0);
        if (L->dealt || step + 1 < L->total) dp_pipeline_post(pl, &job);
        float *g = x ? NULL : grads[step & 1]; /* the push of step - 2 from it ended before that pull */
        double tc = dp_now();
        s->net.step = (unsigned long long)step;
        float loss = dp_net_train_step_device(&s->net, batch.d_x, batch.d_y, s->conf.batch, g);
        const float *dg = x ? dp_devside_grads(x, step) : NULL; /* the same rule for its copy */
        L->step_compute_s = dp_now() - tc;
        s_inject_delay(&s->conf, &L->delay_rng);
        job = (dp_pipe_job_t){.op = DP_PIPE_PUSH, .grads = g, .d_grads = dg,
                              .step = (uint64_t)step + 1, .loss = loss, .batch = s->conf.batch,
                              .stamp = stamp};
        dp_pipeline_post(pl, &job);
        if (s_take(L, pl, &stamp, err) != 0) goto out;
    }
    if (L->dealt && s_take(L, pl, &stamp, err) != 0) goto out; /* the last push */
    rc = 0;
out:
    dp_pipeline_destroy(&pl); /* after the jobs queued: the client is ours again */
    if (x) dp_ps_client_set_device(L->ps, &L->dev);
    return rc;
}

/* The loop, then this worker's last line (not when a signal ended it: the
 * driver's rule then says what the run does). */
int dp_dense_cluster_loop(dp_train_drv_t *d, char *err)
{
    dp_dense_run_t *run = d->run;
    s_loop_t *L = run->cl;
    dp_session_t *s = L->s;
    int task = s->conf.task_index, rc;
    if (s->conf.local_steps > 1) {
        rc = s_loop_local(L, err);
    } else if (L->overlap) {
        /* a device worker every shard of which maps its region: device to device */
        dp_devside_t side = {0};
        int dev = !s->be->host_memory && dp_ps_client_push_on_device(L->ps);
        if (dev) dp_devside_init(&side, s->be, s->net.d_params, s->net.d_grads, s->model.n_floats);
        L->grads2 = s->be->ops->host_alloc(s->be, s->model.n_floats * sizeof(float));
        rc = s_loop_overlap(L, dev ? &side : NULL, err);
        s->be->ops->host_release(s->be, L->grads2);
        L->grads2 = NULL;
        dp_devside_fini(&side);
    } else {
        rc = s_loop_plain(L, err);
        dp_net_grads_into(&s->net, NULL); /* the client's buffer goes with the client */
    }
    if (rc != 0) return -1;
    if (dp_train_stopped(d)) return 0;
    dp_progress_done(&s->progress);
    s_metrics_staleness(s, &L->hist);
    double train_s = dp_now() - d->t0;
    long n = d->done - d->first;
    dp_log_info("worker %d: %ld steps in %.1f s (%.0f images/s), %.1f s of it waiting on the servers: %ld applied, %ld dropped, %ld rejected",
                task, n, train_s, n * s->conf.batch / (train_s > 0 ? train_s : 1e-9), L->wait_s,
                L->applied, L->dropped, L->rejected);
    uint64_t dev_pulls, dev_pushes;
    dp_ps_client_device_counts(L->ps, &dev_pulls, &dev_pushes);
    if (dp_ps_client_devregion_shards(L->ps) > 0 || dev_pulls || dev_pushes)
        dp_log_info("worker %d: device region: %llu shard pulls and %llu shard pushes device to "
                    "device", task, (unsigned long long)dev_pulls, (unsigned long long)dev_pushes);
    return 0;
}

/* --overlap as given, else on in async for a GPU worker only. Sync stays in
 * turn: its step must see every gradient of the step before. On a GPU the
 * host is idle while the device computes, so the wire hides behind it; a
 * CPU worker's compute and the wire share the same cores, so the overlap
 * buys little there and still costs one version of staleness per step (and
 * accuracy: BENCHMARKS.md), so it is asked for. Ssp's --staleness S is a
 * promise the pull-ahead would loosen by one (the pull for step k+1 is
 * judged before step k's push counts), so there too it is asked for. */
static int s_overlap(int flag, dp_mode_t mode, const char *device)
{
    if (mode == DP_MODE_SYNC) {
        if (flag == 1) dp_log_info("--overlap on: ignored in sync mode (each step waits for the last)");
        return 0;
    }
    if (flag >= 0) return flag;
    return mode == DP_MODE_ASYNC && device && strncmp(device, "cuda", 4) == 0;
}

/* --stream-push / --stream-pull where the plain loop runs: the overlapped
 * loop moves the tensors from a thread, and local steps push a
 * pseudo-gradient made after the round and pull once a round. On by
 * default on the CPU (measured: BENCHMARKS.md); on a device only when
 * asked for, until the GPU rows measure it (a device's per-layer copies
 * are the parts: worker/exec/net.h). */
static int s_stream(const char *name, int flag, int overlap, long local_steps,
                    const dp_backend_t *be)
{
    const char *why = overlap ? "--overlap" : local_steps > 1 ? "--local-steps" : NULL;
    if (flag == 1 && why) dp_log_info("%s on: ignored with %s (it moves the tensors whole)", name, why);
    return !why && (flag == 1 || (flag < 0 && be->host_memory));
}

/* The start line: the crew, the steps, which loop; the first metrics line. */
static void s_log_plan(const s_loop_t *L)
{
    const dp_train_conf_t *c = &L->s->conf;
    const dp_ps_info_t *info = L->info;
    char steps[64];
    if (L->dealt) snprintf(steps, sizeof steps, "the batches shard 0 deals for %ld epoch(s)", L->epochs);
    else snprintf(steps, sizeof steps, "%ld steps", L->total);
    dp_log_info("worker %d/%d: %s mode, %d shard(s), batch %d, %s on %s in %s; %s",
                c->task_index, info->num_workers, dp_mode_name(info->mode), info->num_shards, c->batch,
                steps, c->device, L->s->be->precision,
                c->local_steps > 1 ? "local steps: a push of the pseudo-gradient every --local-steps"
                : L->overlap ? "overlap on: pulls and pushes on a thread while computing, on weights one step older"
                : L->stream && L->stream_pull ? "overlap off: pull, compute, push in turn, the pull in parts as the forward needs them, the push in parts as the backward makes them"
                : L->stream ? "overlap off: pull, compute, push in turn, the push in parts as the backward makes them"
                : L->stream_pull ? "overlap off: pull, compute, push in turn, the pull in parts as the forward needs them"
                          : "overlap off: pull, compute, push in turn");
    dp_session_log_start(L->s, c->task_index, L->dealt ? -L->epochs : L->total, L->spe);
}

/* The dense kind's plan against the servers (connected, the task in
 * range): the loop's state, where this worker starts and ends, its batches,
 * which loop, the start line. */
int dp_dense_cluster_plan(dp_train_drv_t *d, char *err)
{
    const dp_train_conf_t *c = d->c;
    dp_dense_run_t *run = d->run;
    dp_session_t *s = &run->s;
    const dp_ps_info_t *info = &d->info;
    if (info->local_steps != (c->local_steps > 1 ? c->local_steps : 1) ||
        info->local_auto != (c->local_steps > 1 && c->local_auto))
        return dp_err(err, "the servers run --local-steps %s%ld, this worker %s%ld: give both the same "
                      "(their optimizer is the outer one only with it)", info->local_auto ? "auto:" : "",
                      info->local_steps, c->local_auto ? "auto:" : "", c->local_steps > 1 ? c->local_steps : 1);
    s_loop_t *L = run->cl = dp_calloc(1, sizeof *L);
    *L = (s_loop_t){.d = d, .s = s, .ps = d->ps, .info = info, .bt = &run->bt, .stop = d->stop};
    dp_staleness_init(&L->hist);
    L->dealt = d->elastic && d->opts.deal.batch > 0;
    L->total = d->total = L->dealt ? LONG_MAX : dp_session_total_steps(s, info->num_workers);
    L->spe = run->spe = dp_data_steps_per_epoch(s->train.n, c->batch, info->num_workers);
    L->first = d->first = s_first_step(d->ps, c->task_index, L->total, c->local_steps > 1 ? c->local_steps : 1);
    /* the epochs shard 0 deals: the plan's, or --steps a worker x MAX */
    long per_epoch = s->train.n / c->batch;
    L->epochs = c->steps <= 0 ? c->epochs
                : per_epoch > 0 ? (c->steps * info->num_workers + per_epoch - 1) / per_epoch : 0;
    if (L->dealt ? dp_batcher_init_dealt(L->bt, &s->train, s->be, c->batch, c->task_index, c->seed,
                                         c->augment, err)
                 : dp_batcher_init_at(L->bt, &s->train, s->be, c->batch, c->task_index, info->num_workers,
                                      c->seed, L->first, L->total, c->augment, err))
        return -1;
    L->overlap = c->local_steps > 1 ? 0 : s_overlap(c->overlap, info->mode, c->device);
    L->stream = s_stream("--stream-push", c->stream_push, L->overlap, c->local_steps, s->be);
    L->stream_pull = s_stream("--stream-pull", c->stream_pull, L->overlap, c->local_steps, s->be);
    s_log_plan(L);
    /* a device's copies from and to the segments: until the client ends */
    if (!s->be->host_memory && s->be->ops->host_register)
        dp_ps_client_set_shm_hook(d->ps, s_shm_lock, L);
    /* ... and to and from the shards' device regions, device to device */
    if (!s->be->host_memory) {
        L->dev = (dp_ps_device_t){.weights_in = s_weights_in, .grads_out = s_grads_out,
                                  .enter = s_enter, .arg = s};
        dp_ps_client_set_device(d->ps, &L->dev);
    }
    dp_rng_seed(&L->delay_rng, c->seed * 7919 + (unsigned long long)c->task_index);
    return 0;
}

void dp_dense_cluster_close(dp_train_drv_t *d)
{
    dp_dense_run_t *run = d->run;
    if (!run->cl) return;
    dp_staleness_fini(&run->cl->hist);
    free(run->cl);
    run->cl = NULL;
}

/* The chief's end of the run, the crew finished (r has the servers'
 * part): the final weights scored and saved. */
int dp_dense_cluster_finish(dp_train_drv_t *d, dp_run_summary_t *r, char *err)
{
    dp_dense_run_t *run = d->run;
    dp_session_t *s = &run->s;
    const dp_ps_stats_t *st = r->stats;
    if (s_pull_into_net(s, d->ps, err) != 0) return -1;
    double acc = 0, loss = 0;
    dp_session_evaluate(s, 0, &acc, &loss);
    dp_session_log_eval(s, d->done, acc, loss);
    dp_log_info("chief: test accuracy %.4f, loss %.4f; server applied %llu, dropped %llu, rejected %llu (requests refused %llu), staleness mean %.2f max %llu",
                acc, loss, (unsigned long long)st->applied, (unsigned long long)st->dropped,
                (unsigned long long)st->rejected, (unsigned long long)st->requests_refused,
                st->staleness_mean, (unsigned long long)st->staleness_max);
    if (dp_session_save(s, d->done, (long)st->version, err) != 0) return -1;
    r->epochs = run->cl->dealt ? (double)run->cl->epochs : (double)d->done / run->spe;
    r->test_accuracy = acc;
    r->test_loss = loss;
    return 0;
}
