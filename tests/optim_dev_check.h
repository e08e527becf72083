/* optim_dev_check: one shard step device (kernels/optim_dev.h) against the
 * plain kernels/optim.c step, through the device's own protocol (alloc,
 * upload, step, download, snapshot), for tests/unit/test_optim_dev.c (the
 * "cpu" device, bit for bit) and tests/gpu/test_gpu_optim_dev.c (the CUDA
 * one, to a stated tolerance). Include after tests/test.h.
 *
 * Each run: random weights and `steps` random gradients; the reference
 * steps them with dp_optim_step at the scheduled lr (dp_optim_lr_at(t - 1),
 * t = 1, 2, ...); the device steps the same ones in place over the whole
 * range, in place in two pieces, out of place (two buffers taking turns,
 * as a shard writing its next version beside the live one), and out of
 * place in two pieces, the second piece's gradient copied up only after
 * the first is stepped (a shard's early step, its parts as they come); a
 * snapshot queued after step 2 and waited for only after step 3 must hold
 * step 2's weights. atol = rtol = 0 asks for the same bits. */
#ifndef DP_TESTS_OPTIM_DEV_CHECK_H
#define DP_TESTS_OPTIM_DEV_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "kernels/optim.h"
#include "kernels/optim_dev.h"

/* a random vector of n floats in [-scale, scale) */
static float *t_od_rand(dp_rng_t *r, size_t n, float scale)
{
    float *a = dp_malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = (2.0f * dp_rng_uniform(r) - 1.0f) * scale;
    return a;
}

/* got against want: bit for bit when atol and rtol are 0, else CHECK_CLOSE. */
static void t_od_same(const char *what, const float *got, const float *want, size_t n,
                      double atol, double rtol)
{
    if (atol > 0 || rtol > 0) {
        CHECK_CLOSE(what, got, want, n, atol, rtol);
        return;
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0) first = i;
    if (bad)
        fprintf(stderr, "  %s: %zu of %zu floats differ in their bits; first at %zu: %.9g != "
                "%.9g\n", what, bad, n, first, got[first], want[first]);
    CHECK(bad == 0);
}

/* The device's run of one way of stepping: 0 in place whole, 1 in place in
 * two pieces, 2 out of place, 3 out of place in two pieces (the gradient
 * copied up piece by piece); w and st (host) get its final weights and
 * state, snap the snapshot after step 2 (or the last step when fewer). */
static void t_od_run(dp_optim_dev_t *dev, const dp_optim_conf_t *c, size_t n, int steps,
                     const float *w0, float *const *g, int way, float *w, float *st, float *snap)
{
    const dp_optim_dev_ops_t *o = dev->ops;
    size_t ns = (size_t)dp_optim_state_floats(c) * n, cut = n / 3;
    float *d_w[2], *d_st[2], *d_g = o->alloc(dev, n * sizeof(float));
    for (int b = 0; b < 2; b++) {
        d_w[b] = o->alloc(dev, n * sizeof(float));
        d_st[b] = o->alloc(dev, ns * sizeof(float)); /* zeroed: the state's start */
    }
    o->upload(dev, d_w[0], w0, n * sizeof(float));
    int cur = 0, snapped = 0;
    for (int t = 1; t <= steps; t++) {
        float lr = dp_optim_lr_at(c, t - 1);
        int nxt = way >= 2 ? 1 - cur : cur;
        if (way == 3) {
            o->upload(dev, d_g + cut, g[t - 1] + cut, (n - cut) * sizeof(float));
            o->step(dev, c, lr, d_w[nxt], d_w[cur], d_g, d_st[nxt], d_st[cur], n, cut, n, t);
            o->upload(dev, d_g, g[t - 1], cut * sizeof(float));
            o->step(dev, c, lr, d_w[nxt], d_w[cur], d_g, d_st[nxt], d_st[cur], n, 0, cut, t);
        } else if (way == 1) {
            o->upload(dev, d_g, g[t - 1], n * sizeof(float));
            o->step(dev, c, lr, d_w[cur], d_w[cur], d_g, d_st[cur], d_st[cur], n, cut, n, t);
            o->step(dev, c, lr, d_w[cur], d_w[cur], d_g, d_st[cur], d_st[cur], n, 0, cut, t);
        } else {
            o->upload(dev, d_g, g[t - 1], n * sizeof(float));
            o->step(dev, c, lr, d_w[nxt], d_w[cur], d_g, d_st[nxt], d_st[cur], n, 0, n, t);
        }
        cur = nxt;
        if (t == 2 || (t == steps && t < 2)) {
            o->snapshot(dev, snap, d_w[cur], n * sizeof(float));
            snapped = 1;
        }
        if (t == 3) o->snapshot_wait(dev); /* after step 3 was queued */
    }
    if (snapped) o->snapshot_wait(dev);
    o->download(dev, w, d_w[cur], n * sizeof(float));
    o->download(dev, st, d_st[cur], ns * sizeof(float));
    for (int b = 0; b < 2; b++) {
        o->release(dev, d_w[b]);
        o->release(dev, d_st[b]);
    }
    o->release(dev, d_g);
}

/* One configuration at size n: every way of stepping against the reference. */
static void t_optim_dev_compare(dp_optim_dev_t *dev, const dp_optim_conf_t *c, size_t n,
                                int steps, double atol, double rtol, uint64_t seed)
{
    dp_rng_t r;
    dp_rng_seed(&r, seed);
    size_t ns = (size_t)dp_optim_state_floats(c) * n;
    float *w0 = t_od_rand(&r, n, 1.0f), *g[16];
    if (steps > 16) steps = 16;
    for (int t = 0; t < steps; t++) g[t] = t_od_rand(&r, n, 0.5f);
    float *w_ref = dp_malloc(n * sizeof(float)), *st_ref = dp_calloc(ns + 1, sizeof(float));
    float *snap_ref = dp_malloc(n * sizeof(float));
    memcpy(w_ref, w0, n * sizeof(float));
    for (int t = 1; t <= steps; t++) {
        dp_optim_step(c, dp_optim_lr_at(c, t - 1), w_ref, g[t - 1], st_ref, n, t);
        if (t == 2 || (t == steps && t < 2)) memcpy(snap_ref, w_ref, n * sizeof(float));
    }
    static const char *const ways[] = {"in place", "in two pieces", "out of place",
                                       "out of place in two pieces"};
    float *w = dp_malloc(n * sizeof(float)), *st = dp_malloc((ns + 1) * sizeof(float));
    float *snap = dp_malloc(n * sizeof(float));
    for (int way = 0; way < 4; way++) {
        char what[160];
        t_od_run(dev, c, n, steps, w0, g, way, w, st, snap);
        snprintf(what, sizeof what, "%s period %ld n %zu %s: w", dp_optim_kind_name(c->kind),
                 c->period, n, ways[way]);
        t_od_same(what, w, w_ref, n, atol, rtol);
        snprintf(what, sizeof what, "%s period %ld n %zu %s: state", dp_optim_kind_name(c->kind),
                 c->period, n, ways[way]);
        t_od_same(what, st, st_ref, ns, atol, rtol);
        snprintf(what, sizeof what, "%s n %zu %s: snapshot of step 2", dp_optim_kind_name(c->kind),
                 n, ways[way]);
        t_od_same(what, snap, snap_ref, n, atol, rtol);
    }
    for (int t = 0; t < steps; t++) free(g[t]);
    free(w0);
    free(w_ref);
    free(st_ref);
    free(snap_ref);
    free(w);
    free(st);
    free(snap);
}

/* Delay compensation (c->dc) on the device against dp_optim_dc_range, with
 * the weights the gradient was computed on known and not (w_bak NULL), and
 * as a shard runs it: in place, in pieces, against weights copied on the
 * device. */
static void t_optim_dev_dc(dp_optim_dev_t *dev, const dp_optim_conf_t *c, size_t n, double atol,
                           double rtol, uint64_t seed)
{
    const dp_optim_dev_ops_t *o = dev->ops;
    dp_rng_t r;
    dp_rng_seed(&r, seed);
    float *g = t_od_rand(&r, n, 0.5f), *w = t_od_rand(&r, n, 1.0f), *bak = t_od_rand(&r, n, 1.0f);
    float *out = t_od_rand(&r, n, 1.0f), *ms = dp_calloc(n, sizeof(float));
    float *got = dp_malloc(n * sizeof(float)), *got_ms = dp_malloc(n * sizeof(float));
    size_t bytes = n * sizeof(float);
    float *d_g = o->alloc(dev, bytes), *d_w = o->alloc(dev, bytes), *d_bak = o->alloc(dev, bytes);
    float *d_out = o->alloc(dev, bytes), *d_ms = o->alloc(dev, bytes);
    o->upload(dev, d_g, g, bytes);
    o->upload(dev, d_w, w, bytes);
    o->upload(dev, d_bak, bak, bytes);
    o->upload(dev, d_out, out, bytes);
    for (int known = 0; known < 2; known++) { /* MS first follows a gradient without w_bak */
        dp_optim_dc_range(c, out, g, w, known ? bak : NULL, ms, 0, n);
        o->dc(dev, c, d_out, d_g, d_w, known ? d_bak : NULL, d_ms, 0, n);
        o->download(dev, got, d_out, bytes);
        o->download(dev, got_ms, d_ms, bytes);
        t_od_same(known ? "dc out" : "dc out (w_bak unknown: unwritten)", got, out, n, atol, rtol);
        t_od_same("dc ms", got_ms, ms, n, atol, rtol);
    }
    /* A shard's way: w_bak copied device to device from the weights (a
     * pull's slot), the weights moved on, the gradient compensated in
     * place in two pieces (around a state tensor's floats, left as they
     * are). */
    size_t cut = n / 3, skip = n - cut > 5 ? 5 : n - cut;
    o->copy_out(dev, d_bak, d_w, bytes);
    memcpy(bak, w, bytes);
    for (size_t i = 0; i < n; i++) w[i] += 0.25f * g[i];
    o->upload(dev, d_w, w, bytes);
    memcpy(out, g, bytes);
    dp_optim_dc_range(c, out, out, w, bak, ms, 0, cut);
    dp_optim_dc_range(c, out, out, w, bak, ms, cut + skip, n);
    o->dc(dev, c, d_g, d_g, d_w, d_bak, d_ms, 0, cut);
    o->dc(dev, c, d_g, d_g, d_w, d_bak, d_ms, cut + skip, n);
    o->download(dev, got, d_g, bytes);
    o->download(dev, got_ms, d_ms, bytes);
    t_od_same("dc in place in two pieces", got, out, n, atol, rtol);
    t_od_same("dc ms in two pieces", got_ms, ms, n, atol, rtol);
    o->release(dev, d_g);
    o->release(dev, d_w);
    o->release(dev, d_bak);
    o->release(dev, d_out);
    o->release(dev, d_ms);
    free(g);
    free(w);
    free(bak);
    free(out);
    free(ms);
    free(got);
    free(got_ms);
}

/* The configurations every device is held to: each optimizer with weight
 * decay and a cosine schedule, and delayed Nesterov (period 3). i in
 * [0, T_OD_CONFS); -1 past the end. */
#define T_OD_CONFS (DP_OPT_KINDS + 1)
static void t_od_conf(int i, dp_optim_conf_t *c)
{
    dp_optim_conf_default(c);
    c->kind = i < DP_OPT_KINDS ? (dp_optim_kind_t)i : DP_OPT_NESTEROV;
    c->lr = c->kind == DP_OPT_ADAM ? 0.01f : 0.05f;
    c->weight_decay = 0.01f;
    c->schedule = DP_LR_COSINE;
    c->total_steps = 10;
    if (i == DP_OPT_KINDS) c->period = 3;
}

#endif
