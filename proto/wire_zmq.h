/* wire_zmq: Downpour's messages over ZeroMQ — a received multipart kept
 * zero-copy under the receiver's limits, and the multipart a sender hands to
 * ZeroMQ without copies. The codec and the structural checks (proto/wire.h)
 * know no socket, so what validates and applies a message (server/core/)
 * builds without ZeroMQ; only the loops that own sockets include this. */
#ifndef DP_WIRE_ZMQ_H
#define DP_WIRE_ZMQ_H

#include <stddef.h>
#include <zmq.h>

#include "proto/wire.h"

/* ---- receiving -------------------------------------------------------- */

/* A received multipart. parts[] keep the frames zero-copy. A message over
 * the limits (more than DP_WIRE_MAX_PARTS parts, or more bytes in all than
 * the receiver allows) is not kept: each frame past the limit is closed as
 * soon as it is read and the ones kept so far are closed too, all but the
 * first part when it is at most DP_WIRE_MAX_IDENTITY bytes (on a ROUTER, the
 * identity to answer through). n_total > n_parts says a message was cut. */
typedef struct {
    zmq_msg_t parts[DP_WIRE_MAX_PARTS];
    int n_parts;           /* parts kept (initialised) */
    int n_total;           /* parts the message had */
    size_t n_bytes;        /* bytes the message had, all parts */
} dp_wire_rx_t;

/* Receive one whole multipart (flags: 0 or ZMQ_DONTWAIT), at most max_bytes
 * in all (SIZE_MAX: only the part limit). Returns 0, or -1 with errno EAGAIN
 * / EINTR left for the caller and err filled. On -1 rx holds nothing to close.
 *
 * ZeroMQ hands a multipart over only once all of it has arrived (its queue
 * holds it whole), so the limit decides what the receiver keeps, not what
 * ZeroMQ buffered. ZMQ_MAXMSGSIZE (per frame) and ZMQ_RCVHWM (messages
 * queued per peer) bound that only in part: ZeroMQ has no limit on the
 * number of frames of one message. */
int dp_wire_recv_bounded(void *sock, dp_wire_rx_t *rx, int flags, size_t max_bytes, char *err);
/* dp_wire_recv_bounded without a byte limit. */
int dp_wire_recv(void *sock, dp_wire_rx_t *rx, int flags, char *err);
void dp_wire_rx_fini(dp_wire_rx_t *rx);

/* dst (not initialised) becomes a copy of src (ZeroMQ shares the bytes). */
int dp_wire_msg_copy(zmq_msg_t *dst, zmq_msg_t *src, char *err);
/* dst (not initialised) takes src's content; src stays open, empty. */
int dp_wire_msg_move(zmq_msg_t *dst, zmq_msg_t *src, char *err);
/* zmq_msg_close; its only failure (a message never initialised) is logged. */
void dp_wire_msg_close(zmq_msg_t *m);

/* ---- sending ---------------------------------------------------------- */

/* A tensor frame to send: data is handed to ZeroMQ without a copy; ffn(data,
 * hint) runs (on ZeroMQ's I/O thread) once ZeroMQ no longer needs it, or at
 * once if sending failed. ffn may be NULL (data must then outlive the send). */
typedef struct {
    const void *data;
    size_t len;
    zmq_free_fn *ffn;
    void *hint;
} dp_wire_payload_t;

/* Send [identity]? env payloads... as one multipart. identity may be NULL
 * (DEALER side); it is copied, not consumed. Every payload's ffn runs exactly
 * once whatever happens. */
int dp_wire_send(void *sock, zmq_msg_t *identity, const Downpour__Envelope *env,
                 const dp_wire_payload_t *payloads, int n_payloads, char *err);

#endif
