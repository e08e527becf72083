/* local_elastic: an elastic crew under `downpour local` (see local_elastic.h). */
#include "deploy/launcher/local_elastic.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "common/opts.h"
#include "common/util.h"
#include "deploy/launcher/scale.h"

int dp_elastic_parse_chaos(const char *v, double *s, char *err)
{
    if (strncmp(v, "kill:", 5) != 0 || dp_opts_parse_double("--chaos", v + 5, 0.1, 1e6, s, NULL) != 0)
        return dp_err(err, "--chaos '%s': expected kill:SECONDS (SECONDS in [0.1, 1e6], e.g. "
                      "kill:15)", v);
    return 0;
}

void dp_elastic_init(dp_elastic_t *e, int min, int max, double chaos_s, uint64_t seed, const char *dir,
                     dp_crew_t *crew, dp_elastic_start_fn start, void *arg, double now)
{
    memset(e, 0, sizeof *e);
    e->min = min;
    e->max = max;
    e->target = min;
    e->chaos_s = chaos_s;
    e->next_chaos = now + chaos_s;
    dp_rng_seed(&e->rng, seed * 6364136223846793005ULL + 17);
    e->dir = dir;
    e->crew = crew;
    e->who = "downpour local";
    e->start = start;
    e->arg = arg;
}

/* Workers running that were not asked to go. */
static int s_live(const dp_elastic_t *e)
{
    int k = 0;
    for (int i = 0; i < e->max; i++) {
        dp_child_t *c = dp_crew_running_worker(e->crew, i);
        k += c && !c->stopping;
    }
    return k;
}

/* A worker that finished its own steps (exit 0, not asked to go): the run is ending. */
static void s_check_ending(dp_elastic_t *e)
{
    for (int k = 0; k < e->crew->n && !e->ending; k++) {
        const dp_child_t *c = &e->crew->kids[k];
        if (c->is_worker && c->pid == 0 && !c->stopping && WIFEXITED(c->status) &&
            WEXITSTATUS(c->status) == 0)
            e->ending = 1;
    }
}

/* SIGKILL a random running worker other than the chief. */
static void s_chaos_kill(dp_elastic_t *e)
{
    int pick[DP_CREW_MAX], n = 0;
    for (int i = 1; i < e->max; i++) {
        dp_child_t *c = dp_crew_running_worker(e->crew, i);
        if (c && !c->stopping) pick[n++] = i;
    }
    if (n == 0) return;
    dp_child_t *c = dp_crew_running_worker(e->crew, pick[dp_rng_below(&e->rng, (uint32_t)n)]);
    c->stopping = 1;
    kill(-c->pid, SIGKILL);
    kill(c->pid, SIGKILL);
    e->kills++;
    fprintf(stderr, "%s: --chaos: worker %d killed (SIGKILL)\n", e->who, c->task);
}

/* Start or stop workers until target are live (starts: the lowest free
 * task indexes; leaves: the highest running ones, never the chief). */
static int s_keep_target(dp_elastic_t *e, char *err)
{
    int live = s_live(e);
    for (int i = 0; i < e->max && live < e->target && !e->ending; i++) {
        if (dp_crew_running_worker(e->crew, i)) continue;
        if (e->start(e->arg, i, err) != 0) return -1;
        e->starts++;
        live++;
        fprintf(stderr, "%s: worker %d started (%d live)\n", e->who, i, live);
    }
    for (int i = e->max - 1; i > 0 && live > e->target; i--) {
        dp_child_t *c = dp_crew_running_worker(e->crew, i);
        if (!c || c->stopping) continue;
        c->stopping = 1;
        kill(c->pid, SIGTERM);
        e->leaves++;
        live--;
        fprintf(stderr, "%s: worker %d asked to leave (SIGTERM; %d stay)\n", e->who, i, live);
    }
    return 0;
}

int dp_elastic_tick(dp_elastic_t *e, double now, char *err)
{
    if (e->max == 0) return 0;
    s_check_ending(e);
    int n = 0;
    char why[DP_ERR_LEN];
    int r = dp_scale_take(e->dir, &n, why);
    if (r < 0) fprintf(stderr, "%s: scale request ignored: %s\n", e->who, why);
    if (r > 0 && n > e->max)
        fprintf(stderr, "%s: scale %d ignored: above --workers %d:%d's MAX\n", e->who, n,
                e->min, e->max);
    else if (r > 0) {
        fprintf(stderr, "%s: scale to %d worker(s)%s\n", e->who, n,
                n < e->min ? " (below MIN: sync waits until MIN are live)" : "");
        e->target = n;
    }
    if (e->chaos_s > 0 && now >= e->next_chaos && !e->ending) {
        s_chaos_kill(e);
        e->next_chaos = now + e->chaos_s;
    }
    return s_keep_target(e, err);
}

int dp_elastic_survives(dp_elastic_t *e, const dp_child_t *c)
{
    if (e->max == 0 || !c->is_worker || c->task == 0) return 0;
    if (!c->stopping && !WIFSIGNALED(c->status)) return 0; /* it failed by itself */
    if (!c->stopping)
        fprintf(stderr, "%s: worker %d killed by signal %d; the run goes on without it\n", e->who,
                c->task, WTERMSIG(c->status));
    return 1;
}
