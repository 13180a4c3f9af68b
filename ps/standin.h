/* standin.h - the cluster stand-in of tessera-ps.
 *
 * Until the parameter-server strategy exists, a ps joins the job as role
 * ps, heartbeats (the membership client does it), logs every new
 * generation's world size and exits with the scheduler's code on SHUTDOWN,
 * or 1 when the membership client found the scheduler silent (the line
 * names it).
 * Output (stdout): "joined rank=R generation=G world=W", then one line per
 * generation change.
 */
#ifndef TS_PS_STANDIN_H
#define TS_PS_STANDIN_H

#include "proto/job.h"

/* Runs the stand-in ps of job against the scheduler at address with the key
 * file; rank = the rank to ask for, -1 = any. Returns the exit status. */
int ts_ps_standin_run(const char *address, const char *key_file,
                      const ts_job *job, int rank);

#endif
