/* launch_nodes: `downpour launch --nnodes N --node-rank R --master
 * HOST:PORT`, one launch per machine. Node 0 runs every shard, shard I
 * bound at HOST:PORT+I (the other nodes then know where the servers are
 * from the flags alone, with no rendezvous of their own: torchrun's
 * static rendezvous, the master's address is the meeting point); each
 * node runs its --workers as global ranks R*W .. R*W+W-1. A node other
 * than 0 waits for the shards to answer (accept a TCP connection) before
 * its workers start, and watches shard 0 while they run: the servers gone
 * for --master-timeout seconds ends the node (the chief's end, or node
 * 0's). */
#ifndef DP_LAUNCH_NODES_H
#define DP_LAUNCH_NODES_H

#include <signal.h>
#include <stddef.h>

typedef struct {
    int nnodes;        /* --nnodes N; 1: one machine, none of this applies */
    int node_rank;     /* --node-rank R */
    const char *given; /* --master as given, or NULL */
    char host[64];     /* HOST as given, then its numeric IPv4 address */
    int port;          /* PORT: shard I at PORT+I, MASTER_PORT at PORT+K */
    double timeout_s;  /* --master-timeout S (default 60) */
    double lost_at;    /* dp_now() since shard 0 stopped answering; 0 while it answers */
    double next_probe;
} dp_nodes_t;

/* --master's value: "HOST:PORT" (PORT 1..65535) into n; -1 with err. */
int dp_nodes_parse_master(dp_nodes_t *n, const char *v, char *err);

/* Once every flag is read: --node-rank in [0, N), --master given when
 * N > 1, PORT+K (K shards, then MASTER_PORT) within 65535, HOST resolved
 * to an IPv4 address. -1 with err (bad input: the launcher exits 2). */
int dp_nodes_check(dp_nodes_t *n, int shards, char *err);

/* "tcp://HOST:PORT,tcp://HOST:PORT+1,..." for K shards into out. */
void dp_nodes_endpoints(const dp_nodes_t *n, int shards, char *out, size_t len);

/* Wait (at most --master-timeout, or until *stop) until each of the K
 * shards accepts a TCP connection. -1 with err when they did not. */
int dp_nodes_await_master(const dp_nodes_t *n, int shards, const volatile sig_atomic_t *stop,
                          char *err);

/* One pass of a watch loop (a probe of shard 0 at most once a second):
 * 1 once shard 0 has not answered for --master-timeout seconds, else 0. */
int dp_nodes_master_gone(dp_nodes_t *n, double now);

#endif
