/* ring.h - backend "ring": the communicator over ZeroMQ between processes.
 *
 * Every process of a job owns one port: a PULL socket bound at an endpoint
 * (tcp:// across hosts, ipc:// within one), CURVE-secured with the job key,
 * that every peer sends to. The port lives as long as the process and is
 * announced to the scheduler when the process joins; each generation's
 * communicator (ts_comm_create with ts_comm_ring_backend, cfg.native = the
 * port, cfg.peers = every rank's port endpoint) sends to each peer it talks
 * to over the port's PUSH connection to that peer. The connection outlives
 * the communicator, so a peer receives a rank's chunks in the order they
 * were sent, across generations; it is closed once the peer is in no
 * generation any more, and connected afresh after it dropped.
 *
 * Collectives run as rings in both directions at once: the buffer's first
 * half flows to the next rank and its second half to the previous one, so
 * every link carries data both ways. allreduce is a reduce-scatter then an
 * all-gather (2(N-1)/N of the buffer sent per rank), cut into chunks that
 * are forwarded as soon as they are reduced, so the steps overlap. Each
 * chunk is one COLLECTIVE message (proto/PROTOCOL.md) and is checked before
 * use: job, generation, sender, sequence, range and length.
 *
 * No operation hangs: one that makes no progress for the communicator's
 * timeout, or whose peer's connection drops (a process that died), fails
 * with the operation, its step and the peer's rank and endpoint; messages
 * of older generations are dropped, a newer generation's are kept for it,
 * and an operation that heard of a newer generation fails once it makes no
 * progress for half a second (its peers have moved on).
 */
#ifndef TS_COLLECTIVE_RING_H
#define TS_COLLECTIVE_RING_H

#include "collective/comm.h"
#include "proto/job.h"

/* Elements of one chunk are at most this many bytes. */
#define TS_RING_CHUNK_BYTES (512u * 1024u)

typedef struct ts_ring_port ts_ring_port;

/* Binds a port at endpoint ("tcp://HOST:0" picks a free port, "ipc://PATH")
 * for job, CURVE-secured with the key file (NULL: env TESSERA_KEY_FILE);
 * with curve false its traffic is neither encrypted nor authenticated (a
 * trusted network's choice) and no key is read. */
ts_ring_port *ts_ring_port_open(const char *endpoint, const char *key_file, const char *job, bool curve);

/* The port of a worker of job: tcp on parallel.bind (a free port) or, with
 * parallel.transport "ipc", a path of this process's named by tag; secured
 * as parallel.ring_security says (a warning on stderr when not). */
ts_ring_port *ts_ring_port_for_job(const ts_job *job, const char *key_file, const char *tag);

/* The endpoint peers connect to: the port actually bound, with this
 * host's name for a wildcard address. */
const char *ts_ring_port_endpoint(const ts_ring_port *p);

/* Closes the port; its communicators must be freed first. NULL is fine. */
void ts_ring_port_close(ts_ring_port *p);

extern const ts_comm_backend ts_comm_ring_backend;

#endif
