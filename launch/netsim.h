/* netsim.h - the nodes of a virtual cluster, as tessera-run places on them.
 *
 * launch/tessera-netsim makes a cluster NAME of nodes n0..n{N-1} (network
 * namespaces joined by a rate-limited bridge) and lists them in
 * /run/tessera-netsim/NAME/nodes, one "n<i> ADDRESS" line per node. When
 * TESSERA_NETSIM names a cluster, tessera-run's local cluster runs each
 * process on a node ("tessera-netsim exec n<i> ..."), binding the node's
 * address: process k (0 the scheduler, then the ps, then the workers) goes
 * to node parallel.placement[k mod len], or node k mod N when the list is
 * empty (round robin).
 */
#ifndef TS_NETSIM_H
#define TS_NETSIM_H

#include "kernels/status.h"
#include "proto/job.h"

enum { TS_NETSIM_NODES_MAX = 256, TS_NETSIM_ADDR_MAX = 16 };

typedef struct {
    char name[64];                                     /* the cluster's NAME */
    int n;                                             /* nodes */
    char addr[TS_NETSIM_NODES_MAX][TS_NETSIM_ADDR_MAX]; /* dotted IPv4 of n<i> */
} ts_netsim;

/* Reads the node list of cluster name and checks that every entry of
 * placement names one of its nodes. */
ts_status ts_netsim_load(const char *name, const ts_job_ints *placement,
                         ts_netsim *ns);

/* Node of process k (0 the scheduler, 1..S the ps, then the workers). */
int ts_netsim_node(const ts_netsim *ns, const ts_job_ints *placement, int k);

#endif
