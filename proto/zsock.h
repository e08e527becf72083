/* zsock: the facts every ZeroMQ socket of Downpour shares, each defined
 * here once — how many shards a cluster may have, how an endpoint list is
 * written, which endpoints only this host can reach, the ZMTP heartbeats
 * every connection runs, and how a context is ended.
 *
 * Invariants: a parsed list has no empty entry and at most its maximum
 * (an empty entry is a typo, never skipped); dp_zsock_ctx_term leaves
 * *ctx NULL whatever happened. */
#ifndef DP_ZSOCK_H
#define DP_ZSOCK_H

#include <stddef.h>

/* Shards a worker can talk to (its arrays are this long). */
#define DP_ZSOCK_MAX_SHARDS 256
/* Bytes of one endpoint, its terminating NUL included. */
#define DP_ZSOCK_ENDPOINT_LEN 256

/* ZMTP heartbeats (ZeroMQ's own, below the protocol): a PING every second
 * on each connection, and a peer silent for 5 s is dropped (a client's
 * socket redials it), so a vanished peer's connection and what ZeroMQ
 * queued for it go away. */
#define DP_ZSOCK_ZMTP_IVL_MS 1000
#define DP_ZSOCK_ZMTP_TIMEOUT_MS 5000

/* The ZMTP heartbeats on sock (before connect or bind). ttl: also ask the
 * peer to drop us after DP_ZSOCK_ZMTP_TIMEOUT_MS of silence (ZMQ_HEARTBEAT_TTL,
 * what a client's DEALER sends its server). 0, or -1 with err. */
int dp_zsock_heartbeats(void *sock, int ttl, char *err);

/* The comma list "a[,b...]" into items (a flat array of max entries of
 * item_len bytes each); returns how many, or -1 with err ("entry 2 is
 * empty", "entry 3 is longer than 255 bytes", "more than 256 entries"),
 * for the caller to put after the list's name. An empty list has 0. */
int dp_zsock_split(const char *list, char *items, size_t item_len, int max, char *err);

/* Only this host can reach the endpoint: ipc, inproc, tcp on 127.x,
 * localhost or [::1]. Such a wire needs no CRC (the bytes never leave the
 * host's memory), may use shared memory, and needs no CURVE to keep other
 * hosts out. */
int dp_zsock_local_endpoint(const char *ep);

/* Ends *ctx (NULL: nothing): retried while a signal interrupts it, one
 * warning (prefixed by who) if it fails otherwise; *ctx is NULL after.
 * Waits for ZeroMQ's I/O thread, so every buffer lent to it is released. */
void dp_zsock_ctx_term(void **ctx, const char *who);

#endif
