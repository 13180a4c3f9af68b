/* weights.h - initialising a model from a safetensors file written
 * elsewhere (PyTorch, Hugging Face), with an optional name map.
 *
 * Without a map, the file's names must be the model's own PyTorch-style
 * names (a torch state_dict of the same modules). A name map is a JSON file:
 *   {"format": "tessera-name-map", "version": 1,
 *    "strip_prefix": ["transformer."],            (tried in order, first wins)
 *    "rename": {"h.{i}.ln_1.weight": "blocks.{i}.ln1.weight", ...},
 *    "transpose": ["blocks.{i}.attn.qkv.weight", ...], (model names whose
 *                  file tensor is stored [in, out], e.g. GPT-2's Conv1D)
 *    "ignore": ["lm_head.weight", "h.{i}.attn.bias"]}  (file names, after
 *                  the prefix is stripped)
 * "{i}" in a pattern matches a decimal number and carries it to the target.
 * Names the map does not rename keep their own name.
 *
 * Loading checks everything before writing anything: every parameter of the
 * model has exactly one tensor, shapes agree (after the transpose), dtypes
 * are floating (F32, F64, BF16, F16; converted to the model's f32, exactly
 * but for F64), every value is finite (a weight that is inf or NaN, as an
 * F16 file may hold for a value past its range, is refused), and with
 * strict every tensor of the file that is not ignored is used. Errors name
 * the file, the tensor (its name in the file and in the model) and both
 * shapes, or the element that is not finite.
 */
#ifndef TS_IO_WEIGHTS_H
#define TS_IO_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/nn/model.h"

typedef struct ts_name_map ts_name_map;

/* Reads and checks the name map at path; NULL with a message naming the
 * file and the field on error. */
ts_name_map *ts_name_map_load(const char *path);
void ts_name_map_free(ts_name_map *map);

/* What the map makes of the file's tensor name src: 1 with its model name
 * in dst (cap bytes) and *transpose set, 0 when the map ignores it, -1 when
 * the result does not fit. map NULL: the name itself. */
int ts_name_map_apply(const ts_name_map *map, const char *src, char *dst, size_t cap, bool *transpose);

/* Copies the tensors of the safetensors file at path into m's parameters
 * through the map at map_path (NULL or "": names as they are). strict: the
 * file may hold nothing else (a model that is a slice of the whole, like a
 * pipeline stage, passes false). Syncs the bf16 compute copy. */
ts_status ts_weights_load(ts_model *m, const char *path, const char *map_path, bool strict);

/* The whole model's check for a part of it that loaded non-strictly:
 * every tensor of the file at path (through the map at map_path; those it
 * ignores aside) names one of the n parameter names, else an error names
 * it. */
ts_status ts_weights_check_names(const char *path, const char *map_path, char *const *names, int n);

#endif
