/* sweep/report: a sweep's report directory — report.md (one table row per
 * configuration: final test accuracy mean +- std over seeds, time and
 * updates to each target accuracy, staleness mean and max), results.json
 * (the same numbers and every run's), data/ (the curves and histograms as
 * columns) and, through gnuplot, accuracy_vs_updates.png,
 * accuracy_vs_seconds.png and staleness.png. */
#ifndef DP_SWEEP_REPORT_H
#define DP_SWEEP_REPORT_H

#include <limits.h>

#include "deploy/lab/sweep/grid.h"
#include "deploy/lab/sweep/read.h"

typedef struct {
    char dir[PATH_MAX];     /* the run's directory */
    char seed[24];
    int status;             /* exit status; -1 not run (interrupted) */
    dp_sweep_result_t res;  /* .ok once read */
} dp_sweep_seed_run_t;

typedef struct {
    char id[16];            /* "c01" */
    char label[512];        /* the axes that vary: "mode=async lr=0.001" */
    int pick[DP_SWEEP_N_AXES];
    dp_sweep_seed_run_t *run; /* one per seed */
    int n_run;
} dp_sweep_config_t;

/* How far a report (or its plots) got. */
typedef enum {
    DP_SWEEP_REPORT_BAD = -1,     /* not written: err says why */
    DP_SWEEP_REPORT_WHOLE = 0,    /* written, with the plots asked for */
    DP_SWEEP_REPORT_NO_PLOTS = 1, /* written, but gnuplot is missing or failed: why says so */
} dp_sweep_report_t;

/* Writes the report into out; plots: 1 to draw the PNGs. */
dp_sweep_report_t dp_sweep_report_write(const dp_sweep_grid_t *g, const dp_sweep_config_t *cfg, int n_cfg,
                          const char *out, int plots, char *why, char *err);

#endif
