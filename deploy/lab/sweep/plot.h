/* sweep/plot: the sweep report's plots — the curves and histograms as
 * plain columns under out/data/, a gnuplot script out/plots.gp, and the
 * PNGs it draws (gnuplot from Debian's gnuplot-nox; its png terminal).
 * The script reads paths relative to out, so `cd out && gnuplot plots.gp`
 * redraws them after an edit. */
#ifndef DP_SWEEP_PLOT_H
#define DP_SWEEP_PLOT_H

#include <stddef.h>

#include "deploy/lab/sweep/report.h"

/* The full path of gnuplot on PATH into path (1), or 0 when there is none. */
int dp_sweep_find_gnuplot(char *path, size_t n);

/* Writes out/data/ and out/plots.gp (BAD with err when it cannot); then,
 * when draw is set, runs gnuplot: NO_PLOTS with one line in why when it
 * is missing or fails (the report stands without the plots). simulated:
 * the seconds are a simulated clock's. */
dp_sweep_report_t dp_sweep_plot(const dp_sweep_config_t *cfg, int n_cfg, const char *out, int simulated, int draw,
                  char *why, char *err);

#endif
