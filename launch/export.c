/* export.c - tessera-run --export-onnx: a checkpoint or weights file as an ONNX model. */
#include <stdio.h>

#include "kernels/io/onnx.h"
#include "launch/train.h"
#include "worker/model_open.h"

int ts_launch_export_onnx(const ts_launch_source *src, const char *out) {
    ts_job job;
    ts_model_spec spec;
    ts_model *m = ts_worker_open_model(src->path, src->job_path, src->sets, src->nsets, &job, &spec);
    if (!m || ts_onnx_export(m, &spec, out)) {
        fprintf(stderr, "tessera-run --export-onnx: %s\n", ts_last_error());
        ts_model_free(m);
        return 1;
    }
    printf("%s: %s with %lld parameters in %d initializers, opset %d -> %s\n", src->path,
           spec.arch == TS_ARCH_MLP ? "MLP" : spec.arch == TS_ARCH_CNN ? "CNN" : "GPT", (long long)m->numel,
           m->n_params, TS_ONNX_OPSET, out);
    ts_model_free(m);
    return 0;
}
