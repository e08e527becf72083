/* dylu: see dylu.h. */
#include "common/dylu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"

int dp_dylu_parse(const char *text, long *H, int *dylu, char *err)
{
    long h = DP_DYLU_BASE;
    int is_auto = strncmp(text, "auto", 4) == 0 && (text[4] == 0 || text[4] == ':');
    if (is_auto ? text[4] == ':' && dp_opts_parse_long("--local-steps", text + 5, 2, 1000000, &h, NULL) != 0
                : dp_opts_parse_long("--local-steps", text, 1, 1000000, &h, NULL) != 0)
        return dp_err(err, "--local-steps '%s': a whole number H in 1..1000000, or auto (DyLU: each "
                      "worker's H by its speed, the fastest's %d) or auto:H (H in 2..1000000)",
                      text, DP_DYLU_BASE);
    *H = h;
    *dylu = is_auto;
    return 0;
}

long dp_dylu_steps(long H, double own_ms, double fastest_ms)
{
    if (!(own_ms > 0) || !(fastest_ms > 0) || H <= 1) return H;
    /* relative 1e-6: a worker exactly k times slower gets H / k, and the fastest H, though
     * its time came back from the servers as a float (Ack.crew_step_ms), not one less */
    double h = floor((double)H * fastest_ms / own_ms * (1 + 1e-6));
    if (h < 1) return 1;
    return h > (double)H ? H : (long)h;
}

double dp_dylu_ewma(double prev_ms, double round_ms)
{
    if (!(prev_ms > 0)) return round_ms;
    return (1 - DP_DYLU_EWMA) * prev_ms + DP_DYLU_EWMA * round_ms;
}

int dp_dylu_valid_ms(double ms)
{
    return isfinite(ms) && ms >= DP_DYLU_MIN_MS && ms <= DP_DYLU_MAX_MS;
}

void dp_dylu_crew_init(dp_dylu_crew_t *c, int workers)
{
    c->n = workers > 0 ? workers : 0;
    c->ms = c->n ? dp_calloc((size_t)c->n, sizeof *c->ms) : NULL;
}

void dp_dylu_crew_fini(dp_dylu_crew_t *c)
{
    free(c->ms);
    c->ms = NULL;
    c->n = 0;
}

void dp_dylu_report(dp_dylu_crew_t *c, int worker, double ms)
{
    if (worker >= 0 && worker < c->n && dp_dylu_valid_ms(ms)) c->ms[worker] = ms;
}

void dp_dylu_forget(dp_dylu_crew_t *c, int worker)
{
    if (worker >= 0 && worker < c->n) c->ms[worker] = 0;
}

double dp_dylu_fastest(const dp_dylu_crew_t *c)
{
    double best = 0;
    for (int w = 0; w < c->n; w++)
        if (c->ms[w] > 0 && (best == 0 || c->ms[w] < best)) best = c->ms[w];
    return best;
}
