/* capability.h - which build of the CPU kernels runs: chosen once, at
 * run time, from what the CPU reports.
 *
 * The CPU kernels (ops/cpu/) are compiled once per capability, each with
 * its vector width and register tiles: default (the build's baseline:
 * x86-64-v2, 16-byte SSE vectors; or aarch64 NEON), avx2 (x86-64-v3: AVX2
 * and FMA, 16 ymm registers) and avx512 (x86-64-v4: AVX-512 F/BW/DQ/VL/CD,
 * 32 zmm registers); on aarch64 only default is built. The best one the CPU
 * supports is used, unless TESSERA_CPU_CAPABILITY=default|avx2|avx512 asks
 * for another, which is refused when the CPU lacks it: then every op fails
 * with that reason (tessera-run --env says it too). The choice is made once
 * per process, at the first use of a CPU kernel.
 */
#ifndef TS_OPS_CPU_CAPABILITY_H
#define TS_OPS_CPU_CAPABILITY_H

#include <stdbool.h>

#include "kernels/ops/backend.h"
#include "kernels/status.h"

typedef enum { TS_CPU_DEFAULT, TS_CPU_AVX2, TS_CPU_AVX512, TS_NCPU_CAPS } ts_cpu_capability;

/* "default", "avx2", "avx512". */
const char *ts_cpu_capability_name(ts_cpu_capability c);

/* Whether this build has kernels for c and this CPU can run them. */
bool ts_cpu_capability_supported(ts_cpu_capability c);

/* The capability a TESSERA_CPU_CAPABILITY value asks for, checked against
 * this CPU: an unknown name, or one the CPU or the build lacks, is an
 * error naming the value, what is missing and what this machine offers. */
ts_status ts_cpu_capability_parse(const char *value, ts_cpu_capability *c);

/* The capability in use (made once: TESSERA_CPU_CAPABILITY if set, else
 * the best supported); the parse error when the variable is refused. */
ts_status ts_cpu_capability_get(ts_cpu_capability *c);

/* Whether TESSERA_CPU_CAPABILITY chose it (else the CPU did). */
bool ts_cpu_capability_forced(void);

/* The CPU backend built for capability c (NULL when not built). */
const ts_backend *ts_cpu_capability_backend(ts_cpu_capability c);

#endif
