/* local_elastic: `downpour local --workers MIN:MAX`'s crew as it changes
 * (and `downpour launch`'s: the lines then say who, dp_elastic_t.who) —
 * the live count it keeps (MIN at the start, then what `downpour scale`
 * asks: deploy/launcher/scale.h), --chaos kill:SECONDS (a random worker
 * other than the chief SIGKILLed every SECONDS, the count then kept by
 * starting another under the lowest task index not in use), and which
 * ended workers the run survives. One call per pass of the launcher's
 * watch loop; the launcher starts a worker through the callback. */
#ifndef DP_LOCAL_ELASTIC_H
#define DP_LOCAL_ELASTIC_H

#include "common/rng.h"
#include "deploy/launcher/crew.h"

/* Start worker task (its record from dp_crew_worker_life); -1 with err. */
typedef int (*dp_elastic_start_fn)(void *arg, int task, char *err);

typedef struct {
    int min, max;          /* the range; max 0: a fixed crew (nothing here applies) */
    int target;            /* workers kept live */
    double chaos_s;        /* --chaos kill:SECONDS; 0: off */
    double next_chaos;     /* dp_now() of the next kill */
    dp_rng_t rng;          /* which worker dies (--seed) */
    int ending;            /* a worker finished its steps: the run ends, nobody starts */
    long kills, starts, leaves; /* for the closing line */
    const char *dir;       /* --out: where `downpour scale` leaves its request */
    dp_crew_t *crew;
    const char *who;       /* the lines' prefix: "downpour local" (init's), "downpour launch" */
    dp_elastic_start_fn start;
    void *arg;
} dp_elastic_t;

/* "kill:SECONDS" (SECONDS in [0.1, 1e6]) into *s. */
int dp_elastic_parse_chaos(const char *v, double *s, char *err);

/* min / max from --workers (max 0: fixed), the first kill chaos_s from now. */
void dp_elastic_init(dp_elastic_t *e, int min, int max, double chaos_s, uint64_t seed, const char *dir,
                     dp_crew_t *crew, dp_elastic_start_fn start, void *arg, double now);

/* One pass: a scale request taken, a chaos kill when due, workers started
 * or asked to leave (SIGTERM: the highest task indexes but the chief's)
 * until target are live. Each action is one line on stderr. -1 with err
 * when a start failed. */
int dp_elastic_tick(dp_elastic_t *e, double now, char *err);

/* c ended (reaped) with a status other than 0: does the run go on? An
 * elastic crew survives a worker other than the chief that the launcher
 * killed or that a signal ended (one line); a fixed crew nothing. */
int dp_elastic_survives(dp_elastic_t *e, const dp_child_t *c);

#endif
