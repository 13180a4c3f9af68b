/* secure.c - job key files, CURVE socket options and the ZAP handler thread. */
#include "proto/secure.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#define KEY_CHARS 40
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

/* ZAP handlers running in this process; servers refuse to start without one. */
static atomic_int zap_running;

ts_status ts_secure_available(void) {
    if (!zmq_has("curve"))
        return ts_error(TS_ERR_UNSUPPORTED, "secure: this libzmq was built without CURVE");
    return TS_OK;
}

/* ---- key files --------------------------------------------------------- */

static const char *const KEY_NAMES[4] = {"server-public", "server-secret", "client-public",
                                         "client-secret"};

/* The four key strings of k, in KEY_NAMES order. */
static char *key_slot(ts_secure_keys *k, int i) {
    char *slots[4] = {k->server_public, k->server_secret, k->client_public, k->client_secret};
    return slots[i];
}

ts_status ts_secure_keygen(const char *path, ts_secure_keys *keys) {
    ts_status s = ts_secure_available();
    if (s) return s;
    ts_secure_keys k;
    if (zmq_curve_keypair(k.server_public, k.server_secret) ||
        zmq_curve_keypair(k.client_public, k.client_secret))
        return ts_error(TS_ERR_UNSUPPORTED, "secure keygen: zmq_curve_keypair failed: %s",
                        zmq_strerror(zmq_errno()));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return ts_error(TS_ERR_IO, "secure keygen: cannot create key file %s: %s", path,
                        strerror(errno));
    char text[512];
    int n = snprintf(text, sizeof text,
                     "# tessera job key file: CURVE keypairs in Z85. Keep it secret (mode 0600).\n"
                     "%s: %s\n%s: %s\n%s: %s\n%s: %s\n",
                     KEY_NAMES[0], k.server_public, KEY_NAMES[1], k.server_secret, KEY_NAMES[2],
                     k.client_public, KEY_NAMES[3], k.client_secret);
    bool ok = fchmod(fd, 0600) == 0 && write(fd, text, (size_t)n) == n;
    ok = (fsync(fd) == 0) && ok;
    ok = (close(fd) == 0) && ok;
    if (!ok) {
        s = ts_error(TS_ERR_IO, "secure keygen: writing %s failed: %s", path, strerror(errno));
        unlink(path);
        return s;
    }
    if (keys) *keys = k;
    return TS_OK;
}

/* Checks that v is 40 Z85 characters that decode to a key. */
static bool valid_z85(const char *v) {
    static const char alphabet[] =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    uint8_t raw[32];
    if (strlen(v) != KEY_CHARS) return false;
    for (int i = 0; i < KEY_CHARS; i++)
        if (!strchr(alphabet, v[i])) return false;
    return zmq_z85_decode(raw, v) != NULL;
}

/* Parses the key file text into *k; the message names path and line. */
static ts_status parse_keys(const char *path, char *text, ts_secure_keys *k) {
    bool seen[4] = {false, false, false, false};
    int lineno = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
            line[--len] = '\0';
        while (*line == ' ' || *line == '\t') line++;
        if (*line == '\0' || *line == '#') continue;
        /* a name is letters, digits and dashes; Z85 keys may hold ':' */
        char *colon = line + strspn(line, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-");
        if (*colon != ':')
            return ts_error(TS_ERR_FORMAT, "secure: key file %s line %d: expected 'name: key'",
                            path, lineno);
        *colon = '\0';
        char *value = colon + 1;
        while (*value == ' ' || *value == '\t') value++;
        int which = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(line, KEY_NAMES[i]) == 0) which = i;
        if (which < 0)
            return ts_error(TS_ERR_FORMAT, "secure: key file %s line %d: unknown name '%s'",
                            path, lineno, line);
        if (seen[which])
            return ts_error(TS_ERR_FORMAT, "secure: key file %s line %d: %s given twice", path,
                            lineno, line);
        if (!valid_z85(value))
            return ts_error(TS_ERR_FORMAT, "secure: key file %s line %d: %s is not a %d-char "
                            "Z85 key", path, lineno, line, KEY_CHARS);
        seen[which] = true;
        memcpy(key_slot(k, which), value, KEY_CHARS + 1);
    }
    for (int i = 0; i < 4; i++)
        if (!seen[i])
            return ts_error(TS_ERR_FORMAT, "secure: key file %s has no %s", path, KEY_NAMES[i]);
    for (int pair = 0; pair < 2; pair++) {
        char derived[TS_SECURE_KEY_TEXT];
        if (zmq_curve_public(derived, key_slot(k, 2 * pair + 1)) ||
            strcmp(derived, key_slot(k, 2 * pair)) != 0)
            return ts_error(TS_ERR_FORMAT, "secure: key file %s: %s does not belong to %s", path,
                            KEY_NAMES[2 * pair], KEY_NAMES[2 * pair + 1]);
    }
    return TS_OK;
}

ts_status ts_secure_load(const char *path, ts_secure_keys *keys) {
    ts_status s = ts_secure_available();
    if (s) return s;
    if (!path || !*path) return ts_error(TS_ERR_VALUE, "secure: no key file given");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_error(TS_ERR_IO, "secure: cannot open key file %s: %s", path, strerror(errno));
    struct stat st;
    char text[2048];
    ssize_t n = -1;
    if (fstat(fd, &st)) {
        s = ts_error(TS_ERR_IO, "secure: cannot stat key file %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        s = ts_error(TS_ERR_STATE, "secure: key file %s is not a regular file", path);
    } else if (st.st_mode & 077) {
        s = ts_error(TS_ERR_STATE, "secure: key file %s has mode %04o; it must not be readable "
                     "by group or others (chmod 600)", path, (unsigned)(st.st_mode & 07777));
    } else if ((n = read(fd, text, sizeof text)) < 0) {
        s = ts_error(TS_ERR_IO, "secure: reading key file %s: %s", path, strerror(errno));
    } else if ((size_t)n == sizeof text) {
        s = ts_error(TS_ERR_FORMAT, "secure: key file %s is larger than %zu bytes", path,
                     sizeof text - 1);
    } else if (memchr(text, 0, (size_t)n)) {
        s = ts_error(TS_ERR_FORMAT, "secure: key file %s contains a NUL byte", path);
    }
    close(fd);
    if (s) return s;
    text[n] = '\0';
    ts_secure_keys k;
    if ((s = parse_keys(path, text, &k))) return s;
    *keys = k;
    return TS_OK;
}

/* ---- socket options ---------------------------------------------------- */

static ts_status setopt(void *sock, int opt, const void *v, size_t n, const char *what) {
    if (zmq_setsockopt(sock, opt, v, n))
        return ts_error(TS_ERR_IO, "secure: setting %s failed: %s", what,
                        zmq_strerror(zmq_errno()));
    return TS_OK;
}

ts_status ts_secure_server(void *sock, const ts_secure_keys *keys) {
    ts_status s = ts_secure_available();
    if (s) return s;
    if (atomic_load(&zap_running) == 0)
        return ts_error(TS_ERR_STATE, "secure server: no ZAP handler is running; call "
                        "ts_secure_zap_start on the socket's context first");
    int one = 1;
    if ((s = setopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one, "ZMQ_CURVE_SERVER"))) return s;
    if ((s = setopt(sock, ZMQ_CURVE_SECRETKEY, keys->server_secret, KEY_CHARS + 1,
                    "ZMQ_CURVE_SECRETKEY")))
        return s;
    return setopt(sock, ZMQ_ZAP_DOMAIN, TS_SECURE_ZAP_DOMAIN, strlen(TS_SECURE_ZAP_DOMAIN),
                  "ZMQ_ZAP_DOMAIN");
}

ts_status ts_secure_client(void *sock, const ts_secure_keys *keys) {
    ts_status s = ts_secure_available();
    if (s) return s;
    if ((s = setopt(sock, ZMQ_CURVE_SERVERKEY, keys->server_public, KEY_CHARS + 1,
                    "ZMQ_CURVE_SERVERKEY")))
        return s;
    if ((s = setopt(sock, ZMQ_CURVE_PUBLICKEY, keys->client_public, KEY_CHARS + 1,
                    "ZMQ_CURVE_PUBLICKEY")))
        return s;
    return setopt(sock, ZMQ_CURVE_SECRETKEY, keys->client_secret, KEY_CHARS + 1,
                  "ZMQ_CURVE_SECRETKEY");
}

void ts_secure_warn_plain(const char *field, const char *what) {
    fprintf(stderr, "warning: %s \"none\": %s is neither encrypted nor authenticated; use it only on a trusted "
                    "network\n", field, what);
}

/* ---- ZAP handler ------------------------------------------------------- */

struct ts_secure_zap {
    pthread_t thread;
    void *rep;       /* bound to ZAP_ENDPOINT; used by the thread */
    void *ctl_in;    /* thread side of the stop pipe */
    void *ctl_out;   /* caller side of the stop pipe */
    uint8_t client_key[32];
    atomic_uint_least64_t refused, admitted;
};

/* Receives all frames of one ZAP request into f (at most 8 kept; sizes in n).
 * Returns the number of frames, or -1 on error. */
static int zap_read(void *sock, zmq_msg_t *f, int max) {
    int count = 0, more = 1;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, 0) < 0) {
            zmq_msg_close(&part);
            for (int i = 0; i < count && i < max; i++) zmq_msg_close(&f[i]);
            return -1;
        }
        more = zmq_msg_more(&part);
        if (count < max) {
            zmq_msg_init(&f[count]);
            zmq_msg_move(&f[count], &part);
        }
        zmq_msg_close(&part);
        count++;
    }
    return count;
}

static bool frame_is(zmq_msg_t *m, const char *s) {
    size_t n = strlen(s);
    return zmq_msg_size(m) == n && memcmp(zmq_msg_data(m), s, n) == 0;
}

/* Answers one ZAP request: 200 for CURVE with the job's client key, else 400. */
static void zap_answer(struct ts_secure_zap *z) {
    enum { MAXF = 8 };
    zmq_msg_t f[MAXF];
    int n = zap_read(z->rep, f, MAXF);
    if (n < 0) return;
    int kept = n < MAXF ? n : MAXF;
    /* RFC 27: version, request id, domain, address, identity, mechanism, credentials... */
    bool ok = n >= 7 && n <= MAXF && frame_is(&f[0], "1.0") && frame_is(&f[5], "CURVE") &&
              zmq_msg_size(&f[6]) == 32 && memcmp(zmq_msg_data(&f[6]), z->client_key, 32) == 0;
    const char *code = ok ? "200" : "400";
    const char *text = ok ? "OK" : "not a member of this job";
    /* counted before the reply: once a peer's first message arrives, its
     * admission shows in the counts */
    atomic_fetch_add(ok ? &z->admitted : &z->refused, 1);
    /* The reply echoes the request id (frame 1) when the request had one. */
    zmq_send(z->rep, "1.0", 3, ZMQ_SNDMORE);
    if (n >= 2) zmq_send(z->rep, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else zmq_send(z->rep, "", 0, ZMQ_SNDMORE);
    zmq_send(z->rep, code, 3, ZMQ_SNDMORE);
    zmq_send(z->rep, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(z->rep, ok ? "member" : "", ok ? 6 : 0, ZMQ_SNDMORE);
    zmq_send(z->rep, "", 0, 0);
    for (int i = 0; i < kept; i++) zmq_msg_close(&f[i]);
}

static void *zap_main(void *arg) {
    struct ts_secure_zap *z = arg;
    zmq_pollitem_t items[2] = {{z->rep, 0, ZMQ_POLLIN, 0}, {z->ctl_in, 0, ZMQ_POLLIN, 0}};
    for (;;) {
        if (zmq_poll(items, 2, -1) < 0) {
            if (zmq_errno() == EINTR) continue;
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) break;
        if (items[0].revents & ZMQ_POLLIN) zap_answer(z);
    }
    zmq_close(z->rep);
    zmq_close(z->ctl_in);
    return NULL;
}

ts_secure_zap *ts_secure_zap_start(void *ctx, const ts_secure_keys *keys) {
    if (ts_secure_available()) return NULL;
    struct ts_secure_zap *z = calloc(1, sizeof *z);
    if (!z) {
        ts_error(TS_ERR_MEMORY, "secure zap: out of memory");
        return NULL;
    }
    if (!zmq_z85_decode(z->client_key, keys->client_public)) {
        ts_error(TS_ERR_VALUE, "secure zap: client public key is not Z85");
        free(z);
        return NULL;
    }
    char ctl[64];
    snprintf(ctl, sizeof ctl, "inproc://tessera-zap-ctl-%p", (void *)z);
    z->rep = zmq_socket(ctx, ZMQ_REP);
    z->ctl_in = zmq_socket(ctx, ZMQ_PAIR);
    z->ctl_out = zmq_socket(ctx, ZMQ_PAIR);
    int linger = 0;
    const char *failed = NULL;
    if (!z->rep || !z->ctl_in || !z->ctl_out) failed = "creating sockets";
    else if (zmq_bind(z->rep, ZAP_ENDPOINT)) failed = "binding " ZAP_ENDPOINT;
    else if (zmq_bind(z->ctl_in, ctl) || zmq_connect(z->ctl_out, ctl)) failed = "the stop pipe";
    if (!failed) {
        zmq_setsockopt(z->rep, ZMQ_LINGER, &linger, sizeof linger);
        if (pthread_create(&z->thread, NULL, zap_main, z)) failed = "starting the thread";
    }
    if (failed) {
        ts_error(TS_ERR_STATE, "secure zap: %s failed: %s", failed, zmq_strerror(zmq_errno()));
        if (z->rep) zmq_close(z->rep);
        if (z->ctl_in) zmq_close(z->ctl_in);
        if (z->ctl_out) zmq_close(z->ctl_out);
        free(z);
        return NULL;
    }
    atomic_fetch_add(&zap_running, 1);
    return z;
}

uint64_t ts_secure_zap_refused(const ts_secure_zap *zap) {
    return atomic_load(&((ts_secure_zap *)zap)->refused);
}

uint64_t ts_secure_zap_admitted(const ts_secure_zap *zap) {
    return atomic_load(&((ts_secure_zap *)zap)->admitted);
}

void ts_secure_zap_stop(ts_secure_zap *zap) {
    if (!zap) return;
    zmq_send(zap->ctl_out, "", 0, 0);
    pthread_join(zap->thread, NULL);
    zmq_close(zap->ctl_out);
    atomic_fetch_sub(&zap_running, 1);
    free(zap);
}
