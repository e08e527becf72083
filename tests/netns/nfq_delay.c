/* nfq_delay: a slow link where the kernel has no `tc netem`. Every packet
 * that an iptables rule sends to netfilter queue Q is held for --delay-ms
 * (plus a uniform --jitter-ms) and then accepted, in arrival order, so TCP
 * sees a longer round trip but no reordering. tests/netns/lib.sh starts one
 * inside a network namespace and queues that namespace's INPUT from its
 * link: delaying what arrives, not what leaves, adds latency without
 * starving TCP of its own ACK clock the way a held outgoing queue does.
 *
 *   nfq_delay --queue 7 --delay-ms 40 [--jitter-ms 10] [--ready-file F]
 *
 * Invariants: a packet is released at most once; on exit (SIGTERM, SIGINT,
 * or the parent's death via PR_SET_PDEATHSIG) everything still held is
 * accepted, never dropped, and the queue is unbound. The rule should carry
 * --queue-bypass, so packets flow undelayed while no helper is bound. When
 * more than --max-held packets wait, new ones pass at once (counted). */
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include "common/opts.h"
#include "common/rng.h"
#include "common/signals.h"
#include "common/util.h"

typedef struct {
    uint32_t id;    /* the kernel's packet id, for the verdict */
    double release; /* dp_now() at which it is accepted */
} s_held_t;

typedef struct {
    struct nfq_handle *h;   /* the netlink connection */
    struct nfq_q_handle *q; /* the bound queue */
    s_held_t *ring;         /* held packets, oldest at head */
    long cap, head, n;      /* ring capacity, oldest slot, packets held */
    double delay, jitter;   /* seconds */
    double last;            /* the latest release time given: keeps FIFO order */
    dp_rng_t rng;           /* jitter */
    long passed, overflow;  /* packets released after the delay / at once (ring full) */
} s_delay_t;

static void s_accept(s_delay_t *d, uint32_t id)
{
    nfq_set_verdict(d->q, id, NF_ACCEPT, 0, NULL);
}

/* A packet arrived: hold it, or let it through when the ring is full. */
static int s_on_packet(struct nfq_q_handle *q, struct nfgenmsg *msg, struct nfq_data *nfa, void *arg)
{
    (void)q;
    (void)msg;
    s_delay_t *d = arg;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph) return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (d->n == d->cap) {
        d->overflow++;
        s_accept(d, id);
        return 0;
    }
    double r = dp_now() + d->delay + d->jitter * dp_rng_uniform(&d->rng);
    if (r < d->last) r = d->last;
    d->last = r;
    d->ring[(d->head + d->n) % d->cap] = (s_held_t){.id = id, .release = r};
    d->n++;
    return 0;
}

/* Accept every held packet due by now (all of them when all != 0). */
static void s_release(s_delay_t *d, int all)
{
    double now = dp_now();
    while (d->n > 0 && (all || d->ring[d->head].release <= now)) {
        s_accept(d, d->ring[d->head].id);
        d->head = (d->head + 1) % d->cap;
        d->n--;
        d->passed++;
    }
}

/* Bind queue qnum, metadata only (the verdict needs no payload), a kernel
 * queue as deep as the ring, fail-open so an overfull kernel queue accepts. */
static int s_open(s_delay_t *d, int qnum, char *err)
{
    d->h = nfq_open();
    if (!d->h) return dp_err(err, "nfq_open: %s (needs root and CONFIG_NETFILTER_NETLINK_QUEUE)", strerror(errno));
    d->q = nfq_create_queue(d->h, (uint16_t)qnum, s_on_packet, d);
    if (!d->q) return dp_err(err, "binding queue %d: %s (another helper on it?)", qnum, strerror(errno));
    if (nfq_set_mode(d->q, NFQNL_COPY_META, 0) < 0)
        return dp_err(err, "queue %d: metadata mode: %s", qnum, strerror(errno));
    if (nfq_set_queue_maxlen(d->q, (uint32_t)d->cap) < 0)
        return dp_err(err, "queue %d: maxlen %ld: %s", qnum, d->cap, strerror(errno));
    /* Older kernels lack fail-open; the ring's own overflow path remains. */
    nfq_set_queue_flags(d->q, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN);
    nfnl_rcvbufsiz(nfq_nfnlh(d->h), 8u << 20);
    return 0;
}

static void s_close(s_delay_t *d)
{
    if (d->q) nfq_destroy_queue(d->q);
    if (d->h) nfq_close(d->h);
    free(d->ring);
}

/* Milliseconds until the oldest held packet is due (-1: none held). */
static int s_wait_ms(const s_delay_t *d)
{
    if (d->n == 0) return -1;
    double ms = (d->ring[d->head].release - dp_now()) * 1e3;
    return ms <= 0 ? 0 : (int)ms + 1;
}

/* Until a signal: read what the kernel queued, release what is due. A lost
 * netlink message (ENOBUFS) costs that packet only: the kernel dropped it. */
static int s_loop(s_delay_t *d, volatile sig_atomic_t *stop, char *err)
{
    static char buf[1 << 16];
    int fd = nfq_fd(d->h);
    while (!*stop) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, s_wait_ms(d));
        if (r < 0 && errno != EINTR) return dp_err(err, "poll: %s", strerror(errno));
        if (r > 0) {
            ssize_t len;
            while ((len = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) nfq_handle_packet(d->h, buf, (int)len);
            if (len < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS && errno != EINTR)
                return dp_err(err, "recv: %s", strerror(errno));
        }
        s_release(d, 0);
    }
    return 0;
}

static const char s_synopsis[] =
    "usage: nfq_delay --queue Q --delay-ms MS [--jitter-ms J] [--ready-file FILE]\n"
    "Holds each packet of netfilter queue Q for MS (+ uniform 0..J) milliseconds, then\n"
    "accepts it, in arrival order. Use with: iptables -A INPUT -i eth0 -j NFQUEUE\n"
    "--queue-num Q --queue-bypass (inside a network namespace).\n\n";

int main(int argc, char **argv)
{
    int qnum = -1, delay_ms = 0, jitter_ms = 0;
    long max_held = 65536;
    const char *ready = NULL;
    const dp_opts_flag_t t[] = {
        DP_FLAG_NUM("queue", DP_OPTS_INT, "Q", &qnum, 0, 65535, 0, "netfilter queue number (required)"),
        DP_FLAG_NUM("delay-ms", DP_OPTS_INT, "MS", &delay_ms, 0, 60000, 0, "hold time (default 0)"),
        DP_FLAG_NUM("jitter-ms", DP_OPTS_INT, "J", &jitter_ms, 0, 60000, 0, "plus uniform 0..J ms (default 0)"),
        DP_FLAG_NUM("max-held", DP_OPTS_LONG, "N", &max_held, 16, 1 << 22, 0,
                    "packets held at most; more pass at once (default 65536)"),
        DP_FLAG_STR("ready-file", "FILE", &ready, 0, "written (\"queue Q\") once the queue is bound"),
    };
    dp_opts_t o;
    dp_opts_init(&o, "nfq_delay", s_synopsis, NULL);
    dp_opts_add(&o, t, (int)(sizeof t / sizeof t[0]));
    char err[DP_ERR_LEN] = "";
    dp_opts_result_t r = dp_opts_parse(&o, argc, argv, err);
    if (r == DP_OPTS_PARSED && qnum < 0) r = dp_err(err, "--queue Q is required (see --help)");
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("nfq_delay", r, err);

    /* A helper must not outlive the test that started it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    static volatile sig_atomic_t stop;
    dp_signals_install(&stop, 1);
    s_delay_t d = {.cap = max_held, .delay = delay_ms / 1e3, .jitter = jitter_ms / 1e3};
    d.ring = dp_calloc((size_t)d.cap, sizeof *d.ring);
    dp_rng_seed(&d.rng, (uint64_t)qnum + 1);
    int rc = 0;
    if (s_open(&d, qnum, err) != 0) {
        rc = 1;
    } else {
        char line[64];
        int n = snprintf(line, sizeof line, "queue %d\n", qnum);
        if (ready && dp_write_file_atomic(ready, line, (size_t)n, err) != 0) rc = 1;
        if (rc == 0 && s_loop(&d, &stop, err) != 0) rc = 1;
        s_release(&d, 1);
        fprintf(stderr, "nfq_delay: queue %d: %ld packets delayed %d+%d ms, %ld passed at once\n", qnum,
                d.passed, delay_ms, jitter_ms, d.overflow);
    }
    if (rc) fprintf(stderr, "nfq_delay: %s\n", err);
    s_close(&d);
    return rc;
}
