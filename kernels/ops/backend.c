/* backend.c - the backend of each device type, and the lookup the ops do. */
#include "kernels/ops/backend.h"

#include <stdatomic.h>

#include "kernels/ops/cpu/capability.h"
#if TESSERA_WITH_CUDA
#include "kernels/ops/cuda/cuda.h"
#endif

/* The backends by device type; the CPU's is chosen by capability at the
 * first lookup. A device whose kernels are part of this library adds its
 * table here, built when its toolkit is (e.g. under a TESSERA_WITH_...
 * switch). */
static _Atomic(const ts_backend *) backends[TS_NDEVICE_TYPES] = {
#if TESSERA_WITH_CUDA
    [TS_DEVICE_CUDA] = &ts_cuda_backend,
#endif
};

const ts_backend *ts_backend_cpu(void) {
    const ts_backend *b = atomic_load(&backends[TS_DEVICE_CPU]);
    if (b) return b;
    ts_cpu_capability c;
    if (ts_cpu_capability_get(&c)) return NULL;
    b = ts_cpu_capability_backend(c);
    atomic_store(&backends[TS_DEVICE_CPU], b);
    return b;
}

ts_status ts_backend_register(ts_device_type type, const ts_backend *b) {
    if ((unsigned)type >= TS_NDEVICE_TYPES || type == TS_DEVICE_CPU)
        return ts_error(TS_ERR_VALUE, "backend: device type %d cannot be registered (the CPU's is built in)",
                        (int)type);
    if (!b) return ts_error(TS_ERR_VALUE, "backend: NULL table for device type %d", (int)type);
    atomic_store(&backends[type], b);
    return TS_OK;
}

const ts_backend *ts_backend_of(const char *op, ts_device d) {
    const ts_backend *b = NULL;
    if (d.type == TS_DEVICE_CPU) {
        b = ts_backend_cpu();
        if (!b) ts_error(ts_last_status(), "%s: %s", op, ts_last_error());
        return b;
    }
    if ((unsigned)d.type < TS_NDEVICE_TYPES && d.index >= 0) b = atomic_load(&backends[d.type]);
    if (!b) ts_error(TS_ERR_DEVICE, "%s: no kernels for device %s in this build", op, ts_device_name(d));
    return b;
}

const ts_backend *ts_backend_for(const char *op, int n, ts_tensor *const *t) {
    const ts_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!t[i]) continue;
        if (!first) first = t[i];
        else if (!ts_device_equal(ts_tensor_device(t[i]), ts_tensor_device(first))) {
            ts_error(TS_ERR_DEVICE, "%s: expected all tensors on the same device, got %s and %s", op,
                     ts_device_name(ts_tensor_device(first)), ts_device_name(ts_tensor_device(t[i])));
            return NULL;
        }
    }
    if (!first) {
        ts_error(TS_ERR_VALUE, "%s: no tensor given", op);
        return NULL;
    }
    return ts_backend_of(op, ts_tensor_device(first));
}
