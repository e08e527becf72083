/* launch_nodes: one launch per machine (see launch_nodes.h). */
#include "deploy/launcher/launch_nodes.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/util.h"

int dp_nodes_parse_master(dp_nodes_t *n, const char *v, char *err)
{
    const char *colon = strrchr(v, ':');
    n->given = v;
    if (!colon || colon == v || !colon[1] || memchr(v, ':', (size_t)(colon - v)))
        return dp_err(err, "--master: '%s' is not HOST:PORT (an IPv4 address or a name, and a port)", v);
    if ((size_t)(colon - v) >= sizeof n->host)
        return dp_err(err, "--master: the host of '%s' is longer than %zu characters", v,
                      sizeof n->host - 1);
    long port;
    if (dp_opts_parse_long("--master's PORT", colon + 1, 1, 65535, &port, err) != 0) return -1;
    snprintf(n->host, sizeof n->host, "%.*s", (int)(colon - v), v);
    n->port = (int)port;
    return 0;
}

/* HOST into its numeric IPv4 address: the shards bind it (ZeroMQ binds no
 * names) and every node's workers connect to the same text. */
static int s_resolve(dp_nodes_t *n, char *err)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(n->host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return dp_err(err, "--master: '%s' does not resolve to an IPv4 address (%s)", n->host,
                      rc ? gai_strerror(rc) : "no address");
    const struct sockaddr_in *sa = (const struct sockaddr_in *)res->ai_addr;
    inet_ntop(AF_INET, &sa->sin_addr, n->host, sizeof n->host);
    freeaddrinfo(res);
    return 0;
}

int dp_nodes_check(dp_nodes_t *n, int shards, char *err)
{
    if (n->node_rank >= n->nnodes)
        return dp_err(err, "--node-rank %d is out of range: --nnodes %d has ranks 0..%d", n->node_rank,
                      n->nnodes, n->nnodes - 1);
    if (n->nnodes == 1 && !n->given) return 0;
    if (!n->given) return dp_err(err, "--nnodes %d needs --master HOST:PORT (node 0's address)", n->nnodes);
    if (n->port + shards > 65535)
        return dp_err(err, "--master: port %d leaves no room for %d shard(s) and MASTER_PORT (PORT+%d "
                      "must be at most 65535)", n->port, shards, shards);
    return s_resolve(n, err);
}

void dp_nodes_endpoints(const dp_nodes_t *n, int shards, char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < shards && used < len; i++) {
        int w = snprintf(out + used, len - used, "%stcp://%s:%d", i ? "," : "", n->host, n->port + i);
        if (w < 0) break;
        used += (size_t)w;
    }
}

/* 1 when HOST:port accepts a TCP connection within wait_ms (closed at
 * once: the shard's ZeroMQ socket drops a peer gone before its greeting). */
static int s_answers(const char *host, int port, int wait_ms)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), ok = 0;
    if (fd < 0) return 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        ok = 1;
    } else if (errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int e = 0;
        socklen_t el = sizeof e;
        if (poll(&p, 1, wait_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0)
            ok = 1;
    }
    close(fd);
    return ok;
}

int dp_nodes_await_master(const dp_nodes_t *n, int shards, const volatile sig_atomic_t *stop,
                          char *err)
{
    double until = dp_now() + n->timeout_s;
    int up = 0; /* shards 0..up-1 answered */
    while (up < shards) {
        if (s_answers(n->host, n->port + up, 500)) {
            up++;
            continue;
        }
        if (*stop) return dp_err(err, "stopped by signal %d while waiting for the master", (int)*stop);
        if (dp_now() >= until)
            return dp_err(err, "node %d: the master's servers at %s:%d did not answer within %g s "
                          "(shard %d of %d: is node 0's launch running with --master %s?)",
                          n->node_rank, n->host, n->port + up, n->timeout_s, up, shards, n->given);
        usleep(100 * 1000);
    }
    return 0;
}

int dp_nodes_master_gone(dp_nodes_t *n, double now)
{
    if (now < n->next_probe) return n->lost_at > 0 && now - n->lost_at >= n->timeout_s;
    n->next_probe = now + 1.0;
    if (s_answers(n->host, n->port, 500)) {
        n->lost_at = 0;
        return 0;
    }
    if (n->lost_at == 0) n->lost_at = now;
    return now - n->lost_at >= n->timeout_s;
}
