/* wire_zmq: receiving and sending Downpour's multiparts (see wire_zmq.h). */
#include "proto/wire_zmq.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "common/util.h"

/* ---- receiving -------------------------------------------------------- */

void dp_wire_msg_close(zmq_msg_t *m)
{
    if (zmq_msg_close(m) != 0) dp_log_warn("wire: closing a message: %s", zmq_strerror(errno));
}

int dp_wire_msg_copy(zmq_msg_t *dst, zmq_msg_t *src, char *err)
{
    if (zmq_msg_init(dst) != 0) return dp_err(err, "message init: %s", zmq_strerror(errno));
    if (zmq_msg_copy(dst, src) != 0) {
        int e = errno;
        dp_wire_msg_close(dst);
        return dp_err(err, "message copy: %s", zmq_strerror(e));
    }
    return 0;
}

int dp_wire_msg_move(zmq_msg_t *dst, zmq_msg_t *src, char *err)
{
    if (zmq_msg_init(dst) != 0) return dp_err(err, "message init: %s", zmq_strerror(errno));
    if (zmq_msg_move(dst, src) != 0) {
        int e = errno;
        dp_wire_msg_close(dst);
        return dp_err(err, "message move: %s", zmq_strerror(e));
    }
    return 0;
}

/* Over the limits: close what was kept but a small first part. */
static void s_rx_cut(dp_wire_rx_t *rx)
{
    int keep = rx->n_parts > 0 && zmq_msg_size(&rx->parts[0]) <= DP_WIRE_MAX_IDENTITY;
    for (int i = keep; i < rx->n_parts; i++) dp_wire_msg_close(&rx->parts[i]);
    rx->n_parts = keep;
}

int dp_wire_recv_bounded(void *sock, dp_wire_rx_t *rx, int flags, size_t max_bytes, char *err)
{
    rx->n_parts = 0;
    rx->n_total = 0;
    rx->n_bytes = 0;
    int more = 1, cut = 0;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_t *m = cut || rx->n_parts == DP_WIRE_MAX_PARTS ? &tmp : &rx->parts[rx->n_parts];
        if (zmq_msg_init(m) != 0) { /* never fails in libzmq; checked all the same */
            int e = errno;
            dp_wire_rx_fini(rx);
            errno = e;
            return dp_err(err, "receive: %s", zmq_strerror(e));
        }
        /* Only the first part may fail with EAGAIN; the rest of a multipart
         * arrives atomically with it. */
        if (zmq_msg_recv(m, sock, rx->n_total == 0 ? flags : 0) < 0) {
            int e = errno;
            dp_wire_msg_close(m);
            if (rx->n_total == 0) {
                errno = e;
                return dp_err(err, "receive: %s", zmq_strerror(e));
            }
            /* Interrupted inside a multipart: keep what we have; the
             * validator will find it short. */
            break;
        }
        more = zmq_msg_more(m);
        rx->n_total++;
        rx->n_bytes += zmq_msg_size(m);
        if (m == &tmp) dp_wire_msg_close(m);
        else rx->n_parts++;
        if (!cut && (rx->n_total > DP_WIRE_MAX_PARTS || rx->n_bytes > max_bytes)) {
            cut = 1;
            s_rx_cut(rx);
        }
    }
    return 0;
}

int dp_wire_recv(void *sock, dp_wire_rx_t *rx, int flags, char *err)
{
    return dp_wire_recv_bounded(sock, rx, flags, SIZE_MAX, err);
}

void dp_wire_rx_fini(dp_wire_rx_t *rx)
{
    for (int i = 0; i < rx->n_parts; i++) dp_wire_msg_close(&rx->parts[i]);
    rx->n_parts = 0;
    rx->n_total = 0;
    rx->n_bytes = 0;
}

/* ---- sending ---------------------------------------------------------- */

static void s_release_from(const dp_wire_payload_t *p, int from, int n)
{
    for (int i = from; i < n; i++)
        if (p[i].ffn) p[i].ffn((void *)p[i].data, p[i].hint);
}

/* Send m (initialised) with flags; on failure close it and fill err. */
static int s_send_part(zmq_msg_t *m, void *sock, int flags, char *err)
{
    if (zmq_msg_send(m, sock, flags) >= 0) return 0;
    int e = errno;
    dp_wire_msg_close(m);
    return dp_err(err, "send: %s", zmq_strerror(e));
}

/* The identity (copied) and the packed envelope, the first parts. */
static int s_send_head(void *sock, zmq_msg_t *identity, const Downpour__Envelope *env, int more,
                       char *err)
{
    zmq_msg_t m;
    if (identity) {
        if (dp_wire_msg_copy(&m, identity, err) != 0) return -1;
        if (s_send_part(&m, sock, ZMQ_SNDMORE, err) != 0) return -1;
    }
    size_t len = downpour__envelope__get_packed_size(env);
    if (zmq_msg_init_size(&m, len) != 0) return dp_err(err, "send: %s", zmq_strerror(errno));
    downpour__envelope__pack(env, zmq_msg_data(&m));
    return s_send_part(&m, sock, more ? ZMQ_SNDMORE : 0, err);
}

int dp_wire_send(void *sock, zmq_msg_t *identity, const Downpour__Envelope *env,
                 const dp_wire_payload_t *payloads, int n_payloads, char *err)
{
    if (s_send_head(sock, identity, env, n_payloads > 0, err) != 0) {
        s_release_from(payloads, 0, n_payloads);
        return -1;
    }
    for (int i = 0; i < n_payloads; i++) {
        zmq_msg_t m;
        /* zero copy: ZeroMQ calls ffn when done with the bytes */
        if (zmq_msg_init_data(&m, (void *)payloads[i].data, payloads[i].len, payloads[i].ffn,
                              payloads[i].hint) != 0) {
            int e = errno;
            s_release_from(payloads, i, n_payloads);
            return dp_err(err, "send: %s", zmq_strerror(e));
        }
        /* On failure s_send_part's close runs payloads[i].ffn. */
        if (s_send_part(&m, sock, i + 1 < n_payloads ? ZMQ_SNDMORE : 0, err) != 0) {
            s_release_from(payloads, i + 1, n_payloads);
            return -1;
        }
    }
    return 0;
}
