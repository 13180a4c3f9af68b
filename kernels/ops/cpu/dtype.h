/* dtype.h - the start of a dtype template (see cpu.h): from TS_DT (32 or
 * 64) it defines T, FN(name) and the helpers whose float and double forms
 * differ. No include guard: included again for each dtype.
 *
 *   T            float or double
 *   DT           TS_F32 or TS_F64
 *   FN(name)     name_f32 or name_f64
 *   SIMD(...)    "omp simd ..." for float loops; nothing for double ones,
 *                which call libm and serve gradient checks, so every simd
 *                request made can be honoured
 *   EXP(x)       ts_expf_fast for float, libm's exp for double
 *   ROW_MAX, ROW_EXP   rowmath.h's row helpers of the dtype
 */
#include "kernels/ops/cpu/rowmath.h"

#undef T
#undef DT
#undef FN
#undef SIMD
#undef EXP
#undef ROW_MAX
#undef ROW_EXP
#if TS_DT == 32
#define T float
#define DT TS_F32
#define FN(name) name##_f32
#define SIMD(...) TS_PRAGMA(omp simd __VA_ARGS__)
#define EXP(x) ts_expf_fast(x)
#define ROW_MAX ts_row_max_f32
#define ROW_EXP ts_row_exp_f32
#elif TS_DT == 64
#define T double
#define DT TS_F64
#define FN(name) name##_f64
#define SIMD(...)
#define EXP(x) exp(x)
#define ROW_MAX ts_row_max_f64
#define ROW_EXP ts_row_exp_f64
#else
#error "define TS_DT as 32 or 64 before including a dtype template"
#endif
