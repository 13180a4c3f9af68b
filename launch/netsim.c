/* netsim.c - reading a virtual cluster's node list; placement of processes. */
#include "launch/netsim.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

ts_status ts_netsim_load(const char *name, const ts_job_ints *placement,
                         ts_netsim *ns) {
    memset(ns, 0, sizeof *ns);
    if (strlen(name) >= sizeof ns->name)
        return ts_error(TS_ERR_VALUE, "TESSERA_NETSIM: cluster name of %zu bytes, "
                        "limit %zu", strlen(name), sizeof ns->name - 1);
    snprintf(ns->name, sizeof ns->name, "%s", name);
    char path[128], line[128];
    snprintf(path, sizeof path, "/run/tessera-netsim/%s/nodes", name);
    FILE *f = fopen(path, "r");
    if (!f)
        return ts_error(TS_ERR_IO, "virtual cluster %s (TESSERA_NETSIM): cannot read "
                        "%s: %s (tessera-netsim --name %s up makes it)", name, path,
                        strerror(errno), name);
    ts_status st = TS_OK;
    while (st == TS_OK && fgets(line, sizeof line, f)) {
        int index;
        char addr[TS_NETSIM_ADDR_MAX + 1];
        if (ns->n == TS_NETSIM_NODES_MAX)
            st = ts_error(TS_ERR_FORMAT, "%s: more than %d nodes", path,
                          TS_NETSIM_NODES_MAX);
        else if (sscanf(line, "n%d %16s", &index, addr) != 2 || index != ns->n ||
                 strlen(addr) >= TS_NETSIM_ADDR_MAX)
            st = ts_error(TS_ERR_FORMAT, "%s: line %d is not \"n%d ADDRESS\"", path,
                          ns->n + 1, ns->n);
        else /* shorter than TS_NETSIM_ADDR_MAX, checked above */
            memcpy(ns->addr[ns->n++], addr, strlen(addr) + 1);
    }
    fclose(f);
    if (st == TS_OK && ns->n == 0)
        st = ts_error(TS_ERR_FORMAT, "%s: no nodes", path);
    for (int i = 0; st == TS_OK && i < placement->n; i++)
        if (placement->v[i] >= ns->n)
            st = ts_error(TS_ERR_VALUE, "parallel.placement[%d]: node %lld, but "
                          "virtual cluster %s has nodes 0..%d", i,
                          (long long)placement->v[i], name, ns->n - 1);
    return st;
}

int ts_netsim_node(const ts_netsim *ns, const ts_job_ints *placement, int k) {
    if (placement->n > 0) return (int)placement->v[k % placement->n];
    return k % ns->n;
}
