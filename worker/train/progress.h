/* progress: one live status line on a terminal ("\r" rewritten at most 5
 * times a second), or a plain line every 10 s when stderr is not a terminal
 * (logs), so long runs are never silent and logs are not flooded. */
#ifndef DP_PROGRESS_H
#define DP_PROGRESS_H

typedef struct {
    int tty;          /* stderr is a terminal */
    int enabled;
    double last;      /* time of the last line */
    int dirty;        /* a "\r" line is on screen without its newline */
} dp_progress_t;

/* Whether a run shows its progress line (--progress / --no-progress). */
typedef enum {
    DP_PROGRESS_AUTO = -1, /* the default: on, live where stderr is a terminal */
    DP_PROGRESS_OFF = 0,   /* --no-progress */
    DP_PROGRESS_ON = 1,    /* --progress: on (the launcher's line live even off a terminal) */
} dp_progress_mode_t;

void dp_progress_init(dp_progress_t *p, dp_progress_mode_t mode);
/* Whether it is time for the line (force: now), so that a caller words
 * it only then. */
int dp_progress_due(const dp_progress_t *p, int force);
/* Print the line if it is time to (force: print now). */
void dp_progress_update(dp_progress_t *p, int force, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* End the live line with a newline. */
void dp_progress_done(dp_progress_t *p);

#endif
