/* zsock: the facts every ZeroMQ socket shares (see zsock.h). */
#include "proto/zsock.h"

#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "common/util.h"

int dp_zsock_heartbeats(void *sock, int ttl, char *err)
{
    int ivl = DP_ZSOCK_ZMTP_IVL_MS, tmo = DP_ZSOCK_ZMTP_TIMEOUT_MS;
    if (zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &tmo, sizeof tmo) != 0 ||
        (ttl && zmq_setsockopt(sock, ZMQ_HEARTBEAT_TTL, &tmo, sizeof tmo) != 0))
        return dp_err(err, "ZMTP heartbeat options: %s", zmq_strerror(errno));
    return 0;
}

int dp_zsock_split(const char *list, char *items, size_t item_len, int max, char *err)
{
    int n = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == 0) return dp_err(err, "entry %d is empty", n + 1);
        if (len >= item_len)
            return dp_err(err, "entry %d is longer than %zu bytes", n + 1, item_len - 1);
        if (n == max) return dp_err(err, "more than %d entries", max);
        memcpy(items + (size_t)n * item_len, p, len);
        items[(size_t)n * item_len + len] = 0;
        n++;
        p += len;
        if (*p == ',' && *++p == 0) return dp_err(err, "entry %d is empty", n + 1);
    }
    return n;
}

int dp_zsock_local_endpoint(const char *ep)
{
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0) return 1;
    return strncmp(ep, "tcp://127.", 10) == 0 || strncmp(ep, "tcp://localhost:", 16) == 0 ||
           strncmp(ep, "tcp://[::1]", 11) == 0;
}

void dp_zsock_ctx_term(void **ctx, const char *who)
{
    while (*ctx && zmq_ctx_term(*ctx) != 0) {
        if (errno == EINTR) continue;
        dp_log_warn("%s: ending ZeroMQ: %s", who, zmq_strerror(errno));
        break;
    }
    *ctx = NULL;
}
