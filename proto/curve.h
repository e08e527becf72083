/* curve: CurveZMQ keys and the gate in front of a server — who may talk to it.
 *
 * Keys are files of one line of Z85 text (40 characters): `downpour keygen
 * FILE` writes the secret key to FILE (mode 0600) and the public key to
 * FILE.pub. A secret key file that others can read is refused, as ssh does.
 *
 * The gate (dp_zap_t) answers ZeroMQ's authentication requests (ZAP, RFC 27)
 * for every CURVE socket of one context: a client whose public key is in the
 * allow list gets in, with its key as the messages' "User-Id" property (so
 * the server can tie a worker id to a key); any other key is refused before a
 * single message of it reaches the server. Plain (non-CURVE) clients cannot
 * even finish the handshake with a CURVE server; the gate's monitor of the
 * server socket counts them. Each refusal is counted and logged (the first
 * ones, then one in a thousand, so a flood cannot fill the log). */
#ifndef DP_CURVE_H
#define DP_CURVE_H

#include <stdint.h>

#define DP_CURVE_KEY_LEN 40 /* Z85 characters of a 32-byte key */
#define DP_CURVE_NAME_LEN 256 /* bytes kept of an allowed key's file name */

/* A key as Z85 text, NUL-terminated. */
typedef struct {
    char z85[DP_CURVE_KEY_LEN + 1];
} dp_curve_key_t;

/* Writes a new key pair: path (secret, 0600) and path.pub (public). Refuses
 * to overwrite an existing secret (one line saying so). */
int dp_curve_keygen(const char *path, char *err);

/* Reads a secret key file (mode must not let group or others read it) and
 * derives its public key. */
int dp_curve_read_secret(const char *path, dp_curve_key_t *secret, dp_curve_key_t *pub,
                         char *err);

/* Reads a public key file. */
int dp_curve_read_public(const char *path, dp_curve_key_t *pub, char *err);

/* Makes sock a CURVE server with this secret key (before zmq_bind). libzmq
 * lets every key in when no gate is bound in the context (its stable API has
 * no option to refuse instead), so a server always starts dp_zap_new too. */
int dp_curve_serve(void *sock, const dp_curve_key_t *secret, char *err);

/* Makes sock a CURVE client of the server whose public key is given, with
 * its own key pair (before zmq_connect). */
int dp_curve_connect_as(void *sock, const dp_curve_key_t *server_pub,
                        const dp_curve_key_t *secret, const dp_curve_key_t *pub, char *err);

/* ---- the gate ---------------------------------------------------------- */

typedef struct dp_zap dp_zap_t;

/* Starts the gate on ctx (one per context), after dp_curve_serve on the
 * server socket and before it binds. allow: a directory (every *.pub in it)
 * or a comma list of .pub files; it must name at least one key. server_sock
 * (or NULL): the gate also counts the clients that fail the handshake there
 * (plain clients, a wrong server key). */
int dp_zap_new(dp_zap_t **out, void *ctx, void *server_sock, const char *allow, char *err);

/* Stops the gate's thread and frees it; safe twice. Destroy it before the
 * context is terminated. */
void dp_zap_destroy(dp_zap_t **zap_p);

/* SIGHUP: the allow list read again from the --curve-allow it was made
 * with, in force from the next handshake (the gate's thread takes it under
 * a lock). -1 with err when it cannot be read or names no key: the old
 * list stays. dp_zap_rollback puts the list before the last reload back
 * (the server found the new one wrong for its workers). */
int dp_zap_reload(dp_zap_t *zap, char *err);
void dp_zap_rollback(dp_zap_t *zap);
/* Is this Z85 key in the list in force? (Any thread.) */
int dp_zap_allows(dp_zap_t *zap, const char *z85);

/* Keys in the allow list (the thread that reloads it reads these). */
int dp_zap_allowed(const dp_zap_t *zap);

/* Key i (0 <= i < dp_zap_allowed) of the allow list; *file is the name of
 * the file it was read from, without its directory ("worker-1.pub"). */
const dp_curve_key_t *dp_zap_key(const dp_zap_t *zap, int i, const char **file);

/* Clients refused so far: unknown keys, and handshakes that failed. */
uint64_t dp_zap_refused(const dp_zap_t *zap);

#endif
