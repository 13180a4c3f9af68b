/* secure.h - the job secret: ZeroMQ CURVE keys and the ZAP gate.
 *
 * A job key file holds two CURVE keypairs in Z85 text: the server pair
 * (every binding socket: scheduler, ps) and the client pair (every
 * connecting socket). Every process of the job reads the same file (env
 * TESSERA_KEY_FILE or --key-file). The file must be a regular file with no
 * group/other permission bits (0600 or stricter); anything else is refused.
 *
 * File format (text, one "name: value" per line; '#' lines are comments):
 *   server-public: <40 Z85 chars>
 *   server-secret: <40 Z85 chars>
 *   client-public: <40 Z85 chars>
 *   client-secret: <40 Z85 chars>
 * Each public key must be the one derived from its secret key.
 *
 * A CURVE server socket alone admits any client that knows the server public
 * key; the ZAP handler (ZeroMQ RFC 27, ZAP 1.0, inproc://zeromq.zap.01)
 * started on the same context admits only clients presenting the job's
 * client public key, and counts refusals. Start it before binding servers;
 * there is one per context.
 */
#ifndef TS_PROTO_SECURE_H
#define TS_PROTO_SECURE_H

#include <stdint.h>

#include "kernels/status.h"

/* Z85 text of a 32-byte key is 40 chars plus NUL. */
#define TS_SECURE_KEY_TEXT 41

/* ZAP domain the server sockets announce. */
#define TS_SECURE_ZAP_DOMAIN "tessera"

typedef struct {
    char server_public[TS_SECURE_KEY_TEXT];
    char server_secret[TS_SECURE_KEY_TEXT];
    char client_public[TS_SECURE_KEY_TEXT];
    char client_secret[TS_SECURE_KEY_TEXT];
} ts_secure_keys;

/* TS_OK when libzmq was built with CURVE (zmq_has("curve")), else
 * TS_ERR_UNSUPPORTED with a message. */
ts_status ts_secure_available(void);

/* Makes fresh keypairs into *keys (may be NULL) and writes them to a new file
 * at path with mode 0600. Refuses (TS_ERR_IO) to overwrite an existing file. */
ts_status ts_secure_keygen(const char *path, ts_secure_keys *keys);

/* Reads and checks a key file: regular file, mode without group/other bits,
 * exactly the four keys, valid Z85, publics matching secrets. TS_ERR_IO for
 * unreadable files, TS_ERR_STATE for wide permissions, TS_ERR_FORMAT for bad
 * content; the message names the path and the problem. */
ts_status ts_secure_load(const char *path, ts_secure_keys *keys);

/* Makes sock a CURVE server with the job's server secret key and the ZAP
 * domain. Call before zmq_bind. */
ts_status ts_secure_server(void *sock, const ts_secure_keys *keys);

/* Makes sock a CURVE client of the job's servers with the client keypair.
 * Call before zmq_connect. */
ts_status ts_secure_client(void *sock, const ts_secure_keys *keys);

/* Warns on stderr that the traffic `what` carries is neither encrypted
 * nor authenticated because job field `field` is "none". */
void ts_secure_warn_plain(const char *field, const char *what);

/* A running ZAP handler thread. */
typedef struct ts_secure_zap ts_secure_zap;

/* Starts the ZAP handler on ctx, admitting only CURVE clients whose public
 * key is keys->client_public (any other mechanism is refused as well).
 * NULL with a message when the endpoint is taken or a thread cannot start. */
ts_secure_zap *ts_secure_zap_start(void *ctx, const ts_secure_keys *keys);

/* Handshakes refused / admitted so far (thread-safe). */
uint64_t ts_secure_zap_refused(const ts_secure_zap *zap);
uint64_t ts_secure_zap_admitted(const ts_secure_zap *zap);

/* Stops the thread and frees the handler. Call before zmq_ctx_term. NULL is fine. */
void ts_secure_zap_stop(ts_secure_zap *zap);

#endif
