/* wire: the codec of Downpour's protocol — ZeroMQ multipart framing around a
 * protobuf-c Envelope (proto/downpour.proto), and the structural validation
 * every receiver runs before a message may touch state.
 *
 * Framing: [identity]? [Envelope] [tensor 0] ... [tensor n-1]. The identity
 * frame exists only on the ROUTER (server) side. Tensor frames are sent
 * without copies and received without copies (proto/wire_zmq.h: the only
 * part of the wire that knows ZeroMQ).
 *
 * Invariants after dp_wire_check() returned 0: protocol_version is
 * DP_PROTOCOL_VERSION; type is a known MsgType; the sub-message the type needs
 * is present; tensors appear only on PUSH, PARAMS and the row messages
 * (ROWS_PULL: "keys" UINT64 [n], or none with a scan whose max_keys is 1
 * to DP_WIRE_MAX_ROW_KEYS; ROWS: "rows" FLOAT32 [n, D], or "keys" UINT64
 * [n] then "rows" [n, D], a scan's page, the only ROWS whose `more` may be
 * set, and then with n >= 1; ROWS_PUSH: "keys" then "grads" FLOAT32 [n,
 * width], all at offset 0, in frames, D at most DP_WIRE_MAX_ROW_WIDTH;
 * UINT64 nowhere else), at most
 * DP_WIRE_MAX_TENSORS; there is exactly one frame per descriptor; each
 * descriptor is FLOAT32 (or BFLOAT16 in frames: 2 bytes an element where
 * 4 is said here; or UINT32 and BIT in a compressed PUSH, Push.compression
 * TOPK or SIGN, whose layout proto/compress.h checks), its shape's product
 * * 4 (BIT: / 8, rounded up) == byte_length == the
 * frame's length, and crc32(frame) == its crc32 unless the descriptor says
 * NO_CHECKSUM (a sender whose transport already protects the bytes: loopback,
 * ipc, CURVE); offset + count does not overflow; a PUSH's part is below
 * its parts (0 read as 1), which are at most DP_WIRE_MAX_PUSH_PARTS, and a
 * push of more than one part is dense (not compressed); a PULL's cuts are
 * strictly ascending and fewer than DP_WIRE_MAX_PULL_PARTS, a PARAMS's part
 * below its parts (0 read as 1, at most as many). A message with env->shm
 * has no tensor frames at all: its descriptors name bytes in shared memory
 * (proto/shm.h), which the receiver bounds-checks against its segment. Nothing here asserts on network input: every failure is a
 * message in err, starting with "malformed: ". */
#ifndef DP_WIRE_H
#define DP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/downpour.pb-c.h"

#define DP_PROTOCOL_VERSION 1
#define DP_WIRE_MAX_TENSORS 64              /* descriptors (and frames) per message */
#define DP_WIRE_MAX_PARTS (DP_WIRE_MAX_TENSORS + 2) /* + identity + envelope */
#define DP_WIRE_MAX_IDENTITY 255            /* bytes of a ROUTER identity (ZeroMQ's own limit) */
#define DP_WIRE_MAX_ENVELOPE (1u << 20)     /* bytes of frame 0 we agree to unpack */
#define DP_WIRE_MAX_KEY 128                 /* bytes of a tensor key */
#define DP_WIRE_MAX_TEXT 4096               /* bytes of any string field */
/* Parts (Push.parts) one push to one shard may come in: a worker streams
 * its gradient in parts of at least a bucket (worker/client/ps_client.h), one per
 * layer or run of small layers, so a few tens even for a deep model; the
 * bound caps what a shard tracks per worker (server/core/shard_parts.h). A pull
 * in parts (Pull.cuts, Params.parts) has a bound of its own. */
#define DP_WIRE_MAX_PUSH_PARTS 64
/* Parts (Params.parts) one PARAMS reply may come in (a pull in parts:
 * Pull.cuts, at most one fewer). A shard queues a reply's parts at once,
 * so they must fit well inside the replies its ROUTER queues per peer
 * (server/loop/ps.c's S_SNDHWM, 16, past which ZeroMQ drops them); the first
 * layers are what the forward needs early, so a few parts are enough. */
#define DP_WIRE_MAX_PULL_PARTS 8
/* Floats per row of a row table (server/core/rows.h's DP_ROWS_MAX_WIDTH is this). */
#define DP_WIRE_MAX_ROW_WIDTH 4096
/* Keys one row request may name or a scan page ask for (RowsScan.max_keys;
 * server/core/rows.h's DP_ROWS_MAX_KEYS, the ceiling of a shard's max_keys, is
 * this). */
#define DP_WIRE_MAX_ROW_KEYS (1u << 20)

/* Consistency policy of the parameter server. */
typedef enum { DP_MODE_SYNC = 1, DP_MODE_ASYNC = 2, DP_MODE_SSP = 3 } dp_mode_t;

const char *dp_mode_name(dp_mode_t m);           /* "sync", "async", "ssp", "?" */
int dp_mode_parse(const char *s, dp_mode_t *out, char *err);
const char *dp_wire_type_name(int type);         /* "HELLO", ..., "type 42" for unknown (static buffer) */

/* zlib's CRC-32 (the tensor frames' checksum) over any length, computed by
 * ISA-L (common/checksum.h): 0.16 ms on the default model's 6.6 MB. */
uint32_t dp_wire_crc32(const void *data, size_t len);

/* One tensor frame as seen by the validator. */
typedef struct {
    const void *data;
    size_t len;
} dp_wire_frame_t;

/* Unpack frame 0. NULL with err ("malformed: ...") when it is too large or
 * does not parse. Free with dp_wire_destroy. */
Downpour__Envelope *dp_wire_decode(const void *buf, size_t len, char *err);
/* Frees a decoded envelope and sets *env_p to NULL; safe twice and on NULL. */
void dp_wire_destroy(Downpour__Envelope **env_p);

/* Structural checks listed at the top, against the frames that came with it. */
int dp_wire_check(const Downpour__Envelope *env, const dp_wire_frame_t *frames, int n_frames,
                  char *err);

/* The descriptors, in order, tile the float range [lo, hi) exactly. */
int dp_wire_check_range(const Downpour__Envelope *env, uint64_t lo, uint64_t hi, char *err);

/* The descriptors, in order, tile one run of floats [*a, *b) inside
 * [lo, hi) (a part of a push in parts; at least one descriptor). */
int dp_wire_check_run(const Downpour__Envelope *env, uint64_t lo, uint64_t hi, uint64_t *a,
                      uint64_t *b, char *err);

/* Push.parts as a count: an older sender's 0 is 1 (a whole push). */
uint32_t dp_wire_push_parts(const Downpour__Push *p);
/* Params.parts as a count: 0 is 1 (a whole reply). */
uint32_t dp_wire_params_parts(const Downpour__Params *p);

/* Every float of the frames is finite (no NaN, no Inf). Bit tests through
 * memcpy'd words, so any frame alignment works; vectorised (memory speed). */
int dp_wire_check_finite(const dp_wire_frame_t *frames, int n_frames, char *err);

/* Non-zero when some of the n floats at data (any alignment) is NaN or
 * Inf: the check above without the message, for callers that split the
 * work (the shard's threads). */
int dp_wire_any_nonfinite(const void *data, size_t n);

/* Copy n floats from src (any alignment; memory another process may write,
 * e.g. a shared segment) to dst and check the copy is finite, block by
 * block in one pass. -1 with err naming the first bad element; dst then
 * holds a partial copy. */
int dp_wire_copy_finite(float *dst, const void *src, size_t n, char *err);

/* ---- describing tensors ----------------------------------------------- */

/* Fill d (with shape storage shape[1]) to describe count floats at offset of
 * the flat vector held in data; computes the crc unless crc_known is set. */
void dp_wire_desc_fill(Downpour__TensorDesc *d, int64_t *shape, const char *key, const float *data,
                       size_t count, uint64_t offset, int crc_known, uint32_t crc);

/* A row message's tensor (offset 0, with its CRC-32): n elements of dtype
 * when width is 0 (keys: UINT64 [n]), else n x width (rows: FLOAT32
 * [n, width]); shape has room for 2. */
void dp_wire_desc_keyed(Downpour__TensorDesc *d, int64_t *shape, const char *key, int dtype,
                        const void *data, size_t n, size_t width);

/* Bytes per element of a dtype: 2 for BFLOAT16, 8 for UINT64, else 4. */
unsigned dp_wire_dtype_size(int dtype);
/* Elements a (checked) descriptor describes: byte_length / the dtype's size
 * (BIT: its shape[0] bits). */
uint64_t dp_wire_desc_count(const Downpour__TensorDesc *d);

/* bfloat16, the wire's reduced precision (--wire bf16): the top 16 bits of
 * a float32, rounded to nearest even (NaN stays NaN, Inf stays Inf, a
 * float past bf16's largest finite value rounds to Inf — the receiver's
 * finite check then refuses it). src / dst may sit at any alignment. */
void dp_wire_to_bf16(uint16_t *dst, const float *src, size_t n);
void dp_wire_from_bf16(float *dst, const void *src, size_t n);
/* Turn a FLOAT32 descriptor made by dp_wire_desc_fill into one of the
 * same elements as BFLOAT16 held at data, with its CRC-32 when crc. */
void dp_wire_desc_bf16(Downpour__TensorDesc *d, const uint16_t *data, int crc);

/* Mark d as sent without a checksum (Checksum NO_CHECKSUM). */
void dp_wire_desc_no_checksum(Downpour__TensorDesc *d);

/* A fresh envelope header. */
void dp_wire_env_init(Downpour__Envelope *env, int type, uint64_t request_id, int worker_id,
                      uint64_t fingerprint);

#endif
