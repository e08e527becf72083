/* trace: `downpour sim --compute trace:DIR` — the step times of a real
 * run, replayed on the simulated clock.
 *
 * DIR is the --out of a `downpour local` run. Each of its workers wrote
 * DIR/metrics/worker-I.jsonl, a line per push with "step_ms": the step's
 * whole time on that worker, from its last push's record to this one's
 * (its pull, its compute with any injected delay, its push; the record of
 * the step before), measured by the driver for every kind (dense, embed,
 * an --env run's segments). The trace is those series, one per worker
 * file, in I's order, each in its lines' order (an elastic worker's later
 * lives append to its file, so they follow its first).
 *
 * Simulated worker w of M replays traced worker w mod T (T traced
 * workers) from the start of its series, in order, wrapping to its start
 * when the simulation runs past its end; when M > T, the c-th of the k
 * simulated workers on one series starts c/k of the way into it, so two
 * of them do not push in lockstep. Each step of the simulation (each
 * compute-time draw: a round of --local-steps H takes H) takes the next
 * time, times the worker's --straggler factor.
 *
 * Loading checks every line of every worker file: a JSON object ending in
 * a newline (a line cut short is refused), and on a step line (one with
 * "step" and no "event") a "step_ms" that is a number in [0, 1e9]. A
 * missing DIR, no worker files, a worker without a step, or any bad line
 * is one line in err naming the file and line. */
#ifndef DP_LAB_TRACE_H
#define DP_LAB_TRACE_H

#define DP_TRACE_MAX_WORKERS 4096

typedef struct {
    int workers;               /* T: the worker files, in their task index's order */
    int *task;                 /* [T]: each one's task index I */
    double **ms;               /* [T][3 n[i]]: its steps' times, in order: with the weights
                                * (step_ms - pull_ms - push_ms), pull_ms, push_ms */
    long *n;
    double *start_s;           /* [T]: when its first step began, s after the earliest worker's */
} dp_trace_t;

/* Simulated worker w's place in its series (dp_trace_cursor). */
typedef struct {
    const double *ms;
    long n, pos;
    double start_ms;           /* its first pull, ms after the simulation's start */
} dp_trace_cursor_t;

/* DIR's worker metrics into *t: 0, or -1 with one line in err (*t then
 * holds nothing to free). */
int dp_trace_load(dp_trace_t *t, const char *dir, char *err);
void dp_trace_free(dp_trace_t *t);

/* Where simulated worker w of M starts (the mapping above). */
void dp_trace_cursor(const dp_trace_t *t, int w, int M, dp_trace_cursor_t *c);
/* When its first pull is answered: its start and its first pull's time, ms. */
double dp_trace_first(const dp_trace_cursor_t *c);
/* The next step, wrapping: the ms from its pull's answer to its push's
 * landing; *gap_ms from that to its next pull's answer (its push's round
 * trip, its next pull's). */
double dp_trace_next(dp_trace_cursor_t *c, double *gap_ms);

#endif
