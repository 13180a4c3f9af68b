/* onnx.h - exporting a model to ONNX, and checking an ONNX file.
 *
 * ts_onnx_export writes an MLP, CNN or GPT (a whole model, built from its
 * spec) as an ONNX model: IR version 8, the default domain at opset 17,
 * producer "tessera". Initializers are the model's parameters under their
 * PyTorch-style names (fc0.weight, blocks.0.attn.qkv.weight, ...), stored
 * as they are (a Linear weight stays [out, in]; the graph transposes it).
 * Inputs and outputs are named: "input" (f32 [batch, 784] or [batch, C, H, W])
 * or "input_ids" (i64 [batch, sequence], sequence up to block_size), and
 * "logits" (f32 [batch, classes] or [batch, sequence, vocab]); "batch" and
 * "sequence" are dynamic dimensions. The GPT's causal mask is a constant
 * node [block_size, block_size] sliced to the sequence length.
 *
 * The messages are protobuf-c's, generated at build time from the
 * onnx.proto Debian's libonnx-dev installs. A build without protoc-c or
 * that file has no ONNX support: both functions then fail with
 * TS_ERR_UNSUPPORTED and say what to install.
 *
 * ts_onnx_check validates a serialized model the way the exporter needs it
 * to be: it parses, declares IR version and an opset of the default domain,
 * every node has a known operator type, every node input is a graph input,
 * an initializer or an earlier node's output (nodes in topological order),
 * names are produced once, initializers hold exactly dims' worth of data,
 * and every graph output is produced. The export checks its own bytes
 * before it writes them; a broken file is refused naming the node, the
 * value and what is wrong.
 */
#ifndef TS_IO_ONNX_H
#define TS_IO_ONNX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/nn/models.h"

enum { TS_ONNX_OPSET = 17, TS_ONNX_IR_VERSION = 8 };

/* True when this build can read and write ONNX. */
bool ts_onnx_available(void);

/* Writes the whole model m of spec to path (atomically), after checking it. */
ts_status ts_onnx_export(const ts_model *m, const ts_model_spec *spec, const char *path);

/* Checks the serialized model in buf[len]; what names the source in errors. */
ts_status ts_onnx_check(const uint8_t *buf, size_t len, const char *what);

/* Reads path and checks it. */
ts_status ts_onnx_check_file(const char *path);

#endif
