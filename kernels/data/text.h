/* text.h - byte-level text corpora for language models.
 *
 * A corpus is the bytes of one file, or of every regular file under a
 * folder (recursively, in sorted path order; hidden entries, fortune index
 * files "*.dat" and the "*.u8" links are skipped). The last val_fraction
 * of each file goes to the validation part, the rest to training, so both
 * parts sample every file. Tokens are bytes (vocab 256). A text dataset
 * cuts a part into windows of T+1 bytes starting every `stride` bytes:
 * sample i is input = bytes[s, s+T) and target = bytes[s+1, s+T+1) with
 * s = i * stride, both i64 [T].
 */
#ifndef TS_DATA_TEXT_H
#define TS_DATA_TEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/data/dataset.h"

#define TS_TEXT_DEFAULT_PATH "/usr/share/games/fortunes"
#define TS_TEXT_VOCAB 256

typedef struct {
    uint8_t *train, *val;
    int64_t n_train, n_val;
    int nfiles;
} ts_text_corpus;

/* Loads path (a file or folder; NULL: the fortunes folder) holding out the
 * last val_fraction (in [0, 1)) of each file. */
ts_text_corpus *ts_text_load(const char *path, double val_fraction);
void ts_text_free(ts_text_corpus *c);
/* Bytes of the corpus at path (NULL: the fortunes folder), from the sizes
 * of the files ts_text_load would read: what it holds in memory. */
ts_status ts_text_size(const char *path, int64_t *bytes);

/* Windows of T+1 bytes over the training (or validation) part, one every
 * stride bytes (stride <= 0: T). The corpus must outlive the dataset. */
ts_dataset *ts_text_dataset(const ts_text_corpus *c, bool validation, int64_t T, int64_t stride);

/* Bits per byte for a mean cross-entropy loss in nats per byte. */
double ts_text_bits_per_byte(double loss_nats);

#endif
