/* pull: what a pull in parts says of the weights asked for — one status
 * from the client (worker/client/ps_client.h: pull_begin, pull_until) through the
 * executor's hook (worker/exec/net.h: on_params) to its forward, which starts
 * again on TORN and stops the step on FAILED. */
#ifndef DP_PULL_H
#define DP_PULL_H

typedef enum {
    DP_PULL_OK,     /* the floats asked for are in place */
    DP_PULL_TORN,   /* they are, but floats handed out before were replaced (a shard
                     * restarted or lost the pull): the forward starts again */
    DP_PULL_FAILED, /* the pull failed (err says why): the step stops, no backward, no push */
} dp_pull_status_t;

#endif
