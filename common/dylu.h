/* dylu: Dynamic Local Updates (DyLU; Liu et al. 2024, "Asynchronous
 * Local-SGD Training for Language Modeling", arXiv 2401.09135), the rule
 * behind --local-steps auto: a worker's local steps per push in proportion
 * to its speed, so that the crew's pushes come at the same pace and a
 * slow worker's round is not as stale as H of its own steps would make it.
 *
 *   H_w = max(1, floor(H * fastest_ms / own_ms))
 *
 * H the base (--local-steps auto:H, default DP_DYLU_BASE): the fastest
 * worker takes H, a worker at half its speed H / 2 (the paper's
 * H_w = floor(v_w / max v * H)). own_ms is the worker's own compute time
 * per local step, an EWMA over its rounds (weight DP_DYLU_EWMA on the
 * newest; its first round is H: nothing is known yet); fastest_ms the
 * least of the step times the crew reported with its pushes, as the
 * servers answer it (Ack.crew_step_ms; the simulator keeps the same
 * table, from its simulated compute times). */
#ifndef DP_DYLU_H
#define DP_DYLU_H

#define DP_DYLU_BASE 8        /* --local-steps auto: the fastest worker's H */
#define DP_DYLU_EWMA 0.5      /* weight of the newest round in a worker's step time */
#define DP_DYLU_MIN_MS 1e-3   /* a reported step time outside [MIN, MAX] ms is ignored */
#define DP_DYLU_MAX_MS 1e9

/* H_w by the rule above; H when either time is unknown (<= 0). */
long dp_dylu_steps(long H, double own_ms, double fastest_ms);
/* The EWMA of a worker's step time after a round of round_ms per step
 * (prev_ms <= 0: none before, round_ms). */
double dp_dylu_ewma(double prev_ms, double round_ms);
/* Whether a step time a worker reported may count (finite, in range). */
int dp_dylu_valid_ms(double ms);

/* --local-steps TEXT: a whole number H in 1..1000000 (*dylu 0), or auto
 * (H DP_DYLU_BASE) or auto:H (H in 2..1000000) with *dylu 1; -1 with one
 * line in err otherwise. */
int dp_dylu_parse(const char *text, long *H, int *dylu, char *err);

/* The crew's reported step times, one per worker (0: none). */
typedef struct {
    double *ms;
    int n;
} dp_dylu_crew_t;

void dp_dylu_crew_init(dp_dylu_crew_t *c, int workers);
void dp_dylu_crew_fini(dp_dylu_crew_t *c);
/* worker reported ms with a push; an invalid one (dp_dylu_valid_ms) or an
 * index out of range changes nothing. */
void dp_dylu_report(dp_dylu_crew_t *c, int worker, double ms);
/* worker left the crew: its time no longer counts. */
void dp_dylu_forget(dp_dylu_crew_t *c, int worker);
/* The least reported step time (0: none reported). */
double dp_dylu_fastest(const dp_dylu_crew_t *c);

#endif
