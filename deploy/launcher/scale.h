/* scale: `downpour scale DIR N`, the request to a running `downpour local
 * --workers MIN:MAX --out DIR` (or `downpour launch`'s) to keep N workers
 * live, and the launcher's side of it. The request is a file,
 * DIR/scale.request ("N\n", written whole by the atomic writer), which the
 * launcher takes (reads and removes) on its next watch pass; the command
 * waits for that, so its exit status says whether a launcher heard it. What
 * the launcher then does is its own log's: the lowest free task indexes
 * start, the highest non-chief ones leave by SIGTERM.
 *
 * Whether anyone listens: an elastic launcher holds an exclusive flock on
 * DIR/scale.lock for as long as it runs (the kernel drops it when the
 * process ends, however it ends), so the command knows at once that no
 * launcher runs on DIR instead of waiting out its 10 s for nobody. */
#ifndef DP_SCALE_H
#define DP_SCALE_H

#include <stddef.h>

/* DIR/scale.request into out. */
void dp_scale_request_path(const char *dir, char *out, size_t n);

/* The launcher: DIR/scale.lock made (0600) and locked (the fd, close-on-exec,
 * held until the process ends), the crew's MAX written in it ("MAX\n");
 * -1 with err when it cannot be made or another launcher holds it (two
 * elastic launchers on one DIR). */
int dp_scale_listen(const char *dir, int max, char *err);

/* The command: 1 when a launcher holds dir's lock, 0 when none does; *max
 * the crew's MAX read from the lock (0 when it says none). */
int dp_scale_listening(const char *dir, int *max);

/* The launcher: a request waiting in dir? 1 with *n (removed), 0 none,
 * -1 with err for a request that is not a count, or not a regular file
 * (removed too; never opened so that it could block). */
int dp_scale_take(const char *dir, int *n, char *err);

#endif
