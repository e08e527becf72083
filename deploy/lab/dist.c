/* dist: the simulator's laws, parsed and drawn (deploy/lab/sim.h): a
 * worker's compute time (--compute) and the crew's churn (--churn). */
#include "deploy/lab/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"

int dp_dist_parse(dp_dist_t *d, const char *text, char *err)
{
    dp_dist_fini(d);
    if (strncmp(text, "trace:", 6) == 0 && text[6]) {
        dp_trace_t t;
        if (dp_trace_load(&t, text + 6, err) != 0) return -1;
        d->kind = DP_DIST_TRACE;
        d->trace = dp_malloc(sizeof *d->trace);
        *d->trace = t;
        return 0;
    }
    const char *colon = strchr(text, ':');
    char kind[16];
    if (!colon || colon - text >= (long)sizeof kind) goto bad;
    snprintf(kind, sizeof kind, "%.*s", (int)(colon - text), text);
    const char *rest = colon + 1, *second = strchr(rest, ':');
    char first[64];
    size_t len = second ? (size_t)(second - rest) : strlen(rest);
    if (len >= sizeof first) goto bad;
    snprintf(first, sizeof first, "%.*s", (int)len, rest);
    if (strcmp(kind, "const") == 0 || strcmp(kind, "exp") == 0) {
        d->kind = kind[0] == 'c' ? DP_DIST_CONST : DP_DIST_EXP;
        d->b = 0;
        if (second || dp_opts_parse_double("--compute", first, 1e-6, 1e9, &d->a, NULL) != 0) goto bad;
        return 0;
    }
    if (strcmp(kind, "lognormal") == 0 && second) {
        d->kind = DP_DIST_LOGNORMAL;
        if (dp_opts_parse_double("--compute", first, -50, 50, &d->a, NULL) != 0 ||
            dp_opts_parse_double("--compute", second + 1, 0, 10, &d->b, NULL) != 0)
            goto bad;
        return 0;
    }
bad:
    return dp_err(err, "'%s' is not const:MS, exp:MEAN_MS, lognormal:MU:SIGMA or trace:DIR (MS > 0; "
                       "lognormal: exp(MU + SIGMA z) ms, SIGMA in [0, 10]; DIR: a downpour local --out)", text);
}

void dp_dist_fini(dp_dist_t *d)
{
    if (d->trace) dp_trace_free(d->trace);
    free(d->trace);
    d->trace = NULL;
}

int dp_churn_parse(dp_churn_t *c, const char *text, char *err)
{
    const char *colon = strchr(text, ':');
    int leave = colon && colon - text == 5 && strncmp(text, "leave", 5) == 0;
    int kill = colon && colon - text == 4 && strncmp(text, "kill", 4) == 0;
    if ((!leave && !kill) || dp_opts_parse_double("--churn", colon + 1, 1e-6, 1e9, &c->mean_s, NULL) != 0)
        return dp_err(err, "'%s' is not leave:MEAN_S or kill:MEAN_S (a change of the crew every "
                           "MEAN_S simulated seconds on average, MEAN_S > 0)", text);
    c->kind = leave ? DP_CHURN_LEAVE : DP_CHURN_KILL;
    return 0;
}

double dp_uniform01(dp_rng_t *r)
{
    return ((double)(dp_rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double dp_dist_draw_ms(const dp_dist_t *d, dp_rng_t *r)
{
    switch (d->kind) {
    case DP_DIST_CONST: return d->a;
    case DP_DIST_EXP: return -d->a * log(dp_uniform01(r));
    case DP_DIST_LOGNORMAL: {
        double z = sqrt(-2 * log(dp_uniform01(r))) * cos(2 * M_PI * dp_uniform01(r));
        return exp(d->a + d->b * z);
    }
    case DP_DIST_TRACE: break; /* the worker's cursor, not a draw (s_start) */
    }
    return d->a;
}
