/* tee: the workers' output on the launcher's stdout as it comes, each line
 * prefixed with the worker's rank ("[1]: ..."), while the logs under
 * DIR/logs stay whole (torchrun's --tee). The children write their logs
 * themselves; the launcher follows each log from where it last read, so a
 * child never waits on the launcher, and a line is printed once whole
 * (a last line without its newline at the end of the run). */
#ifndef DP_TEE_H
#define DP_TEE_H

#include <sys/types.h>

#include "deploy/launcher/crew.h"

typedef struct {
    off_t read[2 * DP_CREW_MAX]; /* per crew record: bytes of its log printed */
} dp_tee_t;

/* Prints the new whole lines of every worker's log in crew (final: also a
 * last line without its newline), each as "[TASK]: LINE". */
void dp_tee_follow(dp_tee_t *t, const dp_crew_t *crew, int final);

#endif
