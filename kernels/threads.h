/* threads.h - one knob for OpenMP and OpenBLAS threads.
 *
 * TESSERA_NUM_THREADS (default: the number of online CPUs) sets both the
 * OpenMP team size of Tessera's loops and OpenBLAS's thread count, so the two
 * never oversubscribe the cores. GEMMs are never called from inside an OpenMP
 * region. ts_threads_init() runs once, lazily, on the first tensor allocation;
 * ts_threads_set() changes both at run time.
 */
#ifndef TS_THREADS_H
#define TS_THREADS_H

/* Reads TESSERA_NUM_THREADS once and applies it (idempotent). */
void ts_threads_init(void);

/* Sets the thread count for OpenMP and OpenBLAS (n >= 1). */
void ts_threads_set(int n);

/* The thread count in force. */
int ts_threads_get(void);

/* OpenBLAS's own configuration string and thread count (for --env). */
const char *ts_threads_blas_config(void);
int ts_threads_blas_threads(void);

#endif
