/* sweep/read: what one finished run left, as the sweep's report needs it —
 * from DIR/summary.json the final test accuracy, updates and staleness;
 * from the chief's metrics (DIR/metrics/worker-0.jsonl) the accuracy curve
 * (its "eval" lines: the test accuracy after so many server updates and
 * seconds since the chief started); the staleness histogram from the
 * summary (the servers' counts) or else every worker's push lines. A
 * simulated run (`downpour sim`, DIR/metrics/sim.jsonl) counts simulated
 * seconds. An actor-critic run's summary (its "env") gives its return
 * figures instead of an accuracy, and its return curve (summary.json's
 * "return_curve") as the curve: a point's updates are then env steps and
 * its accuracy the mean return of the last 100 episodes. */
#ifndef DP_SWEEP_READ_H
#define DP_SWEEP_READ_H

typedef struct {
    double updates;  /* optimizer steps (server versions) behind the weights scored */
    double seconds;  /* since the chief's start line */
    double accuracy; /* test accuracy (periodic ones on --eval-limit samples) */
} dp_sweep_point_t;

typedef struct {
    int ok;                  /* read: summary.json was there and whole */
    int rl;                  /* an actor-critic run (summary.json's "env"): the figures below
                              * instead of test_accuracy and the curve */
    double return_mean_100;  /* summary.json: the run's last 100 episodes */
    double test_return;      /* the greedy policy's at the end */
    double env_steps;
    double solved_at;        /* solved_at_env_steps; -1: not solved */
    double solved_threshold; /* the environment's "solved" mean return */
    double test_accuracy;    /* summary.json: final, the whole test set */
    double test_auc;         /* a sparse model's (embed:D) test AUC; -1: none */
    double updates;          /* summary.json version (optimizer steps), else updates_applied */
    double wall_s;           /* summary.json wall_s */
    double staleness_mean;   /* summary.json */
    double staleness_max;
    dp_sweep_point_t *curve; /* in order, the final evaluation last */
    int n_curve;
    long *hist;              /* pushes per staleness 0..n_hist-1 (all workers) */
    int n_hist;
} dp_sweep_result_t;

/* Reads the run in dir; -1 with err when its summary is missing or bad
 * (the curve and histogram are best effort: a run without --eval-every has
 * its final point only). */
int dp_sweep_read(dp_sweep_result_t *r, const char *dir, char *err);
void dp_sweep_result_fini(dp_sweep_result_t *r);

/* The first point of the curve at or above target: 1 with its updates and
 * seconds, 0 when the run never reached it. */
int dp_sweep_reached(const dp_sweep_result_t *r, double target, double *updates, double *seconds);

#endif
