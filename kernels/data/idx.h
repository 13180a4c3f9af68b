/* idx.h - IDX image/label files (MNIST, Fashion-MNIST), gzip or plain.
 *
 * An IDX file is a 4-byte magic (0, 0, type, ndim), ndim big-endian uint32
 * dims, then the row-major data; only type 0x08 (unsigned byte) is read.
 * gzip-compressed files are recognised by content (zlib), so "x.gz" and "x"
 * read the same. Reading checks the magic, the dims and the exact data
 * length (a truncated or over-long file is an error naming the path and
 * the expected and actual sizes). Images become f32 (x/255 - mean)/std,
 * labels i64 checked against the number of classes.
 */
#ifndef TS_DATA_IDX_H
#define TS_DATA_IDX_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/tensor.h"

#define TS_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define TS_FASHION_MNIST_MEAN 0.2860f
#define TS_FASHION_MNIST_STD 0.3530f

/* The file's contents as a u8 tensor with the file's dims. */
ts_tensor *ts_idx_read(const char *path);

/* The number of elements the file's header announces (the product of its
 * dims), read without the data: what loading it will take. */
ts_status ts_idx_numel(const char *path, int64_t *numel);

/* u8 images [N, R, C] -> f32 [N, 1, R, C] (other ranks keep their shape)
 * with (x/255 - mean)/std; std > 0. */
ts_tensor *ts_idx_images(const ts_tensor *u8, float mean, float std);

/* u8 labels [N] -> i64 [N]; a label >= num_classes is an error naming
 * what (a path, for messages), the index and the value. */
ts_tensor *ts_idx_labels(const ts_tensor *u8, int64_t num_classes, const char *what);

/* Reads an image file and a label file, normalises, checks the counts agree. */
ts_status ts_idx_load(const char *images_path, const char *labels_path, int64_t num_classes, float mean, float std,
                      ts_tensor **images, ts_tensor **labels);

/* Paths of the Fashion-MNIST train (or t10k) files in dir (NULL: the
 * Debian package's folder), preferring "<name>.gz" over "<name>". */
ts_status ts_idx_fashion_mnist_paths(const char *dir, bool train, char *images, char *labels, size_t cap);

/* Fashion-MNIST images [N, 1, 28, 28] f32 with the default mean/std and
 * labels [N] i64 (10 classes) from dir (NULL: the Debian folder). */
ts_status ts_idx_load_fashion_mnist(const char *dir, bool train, ts_tensor **images, ts_tensor **labels);

/* Deterministic split along dim 0: validation = the last k rows, with
 * k = val_count when >= 0, else round(N * val_fraction); train = the rest.
 * Outputs are views (new references). */
ts_status ts_idx_split(ts_tensor *x, ts_tensor *y, int64_t val_count, double val_fraction, ts_tensor **train_x,
                       ts_tensor **train_y, ts_tensor **val_x, ts_tensor **val_y);

#endif
