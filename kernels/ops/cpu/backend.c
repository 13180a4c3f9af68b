/* backend.c - this capability variant's CPU backend: the kernel tables of
 * the family files, gathered. */
#include "kernels/ops/cpu/cpu.h"

const ts_backend TS_VARIANT(ts_cpu_backend) = {
    .name = "cpu",
    .capability = TS_CPU_STRING(TS_CPU_CAP),
    .memory = &TS_VARIANT(ts_cpu_memory),
    .pointwise = &TS_VARIANT(ts_cpu_pointwise),
    .reduce = &TS_VARIANT(ts_cpu_reduce),
    .softmax = &TS_VARIANT(ts_cpu_softmax),
    .layernorm = &TS_VARIANT(ts_cpu_layernorm),
    .loss = &TS_VARIANT(ts_cpu_loss),
    .embedding = &TS_VARIANT(ts_cpu_embedding),
    .dropout = &TS_VARIANT(ts_cpu_dropout),
    .matmul = &TS_VARIANT(ts_cpu_matmul),
    .attention = &TS_VARIANT(ts_cpu_attention),
    .conv = &TS_VARIANT(ts_cpu_conv),
    .pool = &TS_VARIANT(ts_cpu_pool),
    .optim = &TS_VARIANT(ts_cpu_optim),
};
