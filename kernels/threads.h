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

/* Idle worker threads of both thread pools busy-wait by default and then
 * starve the other pool's threads on a machine with few cores: libgomp's
 * spin (pause, no yield) for milliseconds after each parallel region (an
 * MLP epoch at 2 threads on 2 cores ran 2-5x slower than at 1 thread), and
 * OpenBLAS's sched_yield loop after each GEMM (a CNN step at 2 threads
 * took 8.8 instead of 5.6 ms in half the runs). Both libraries read their
 * settings only when loaded, so when the user has set neither
 * OMP_WAIT_POLICY / GOMP_SPINCOUNT nor OPENBLAS_THREAD_TIMEOUT this sets
 * the missing ones (OMP_WAIT_POLICY=passive, OPENBLAS_THREAD_TIMEOUT=4:
 * sleep after 2^4 cycles) and re-executes the program (same pid, same
 * argv); it returns when the user chose both or the exec failed. Called first
 * thing in main() by every program that computes. */
void ts_threads_passive(char **argv);

#endif
