/* oom.h - how many processes the kernel's OOM killer has killed.
 *
 * A child that ends by SIGKILL nobody in tessera-run sent was killed by
 * another process or by the kernel for memory; the count read when it
 * started and again when it ended tells which may be the case. The count
 * is oom_kill of this process's memory cgroup (v2 memory.events, which
 * counts its descendants too; v1 memory.oom_control), where the children
 * run unless moved, else of the whole machine (/proc/vmstat).
 */
#ifndef TS_OOM_H
#define TS_OOM_H

#include <stdint.h>

/* The OOM-kill count, -1 when none can be read. */
int64_t ts_oom_kills(void);

#endif
