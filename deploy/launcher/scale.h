/* scale: `downpour scale DIR N`, the request to a running `downpour local
 * --workers MIN:MAX --out DIR` to keep N workers live, and the launcher's
 * side of it. The request is a file, DIR/scale.request ("N\n", written
 * whole by the atomic writer), which the launcher takes (reads and
 * removes) on its next watch pass; the command waits for that, so its exit
 * status says whether a launcher heard it. What the launcher then does is
 * its own log's: the lowest free task indexes start, the highest non-chief
 * ones leave by SIGTERM. */
#ifndef DP_SCALE_H
#define DP_SCALE_H

#include <stddef.h>

/* DIR/scale.request into out. */
void dp_scale_request_path(const char *dir, char *out, size_t n);

/* The launcher: a request waiting in dir? 1 with *n (removed), 0 none,
 * -1 with err for a request that is not a count (removed too). */
int dp_scale_take(const char *dir, int *n, char *err);

#endif
