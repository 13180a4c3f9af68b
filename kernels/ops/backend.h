/* backend.h - the kernels of one device, as a table the ops dispatch on.
 *
 * An op (kernels/ops/<op>.c) checks its arguments (shapes, dtypes, that
 * its tensors share one device), records autograd, makes its outputs on
 * the inputs' device and calls that device's kernels through the
 * ts_backend returned by ts_backend_for(). A backend is one struct of
 * kernels per op family. Kernels take plain pointers (device addresses at
 * a view's first element), sizes, strides in elements and a dtype, never
 * tensors; they assume the op checked every argument, and fail only for
 * what the op cannot know beforehand (scratch memory, a device error),
 * with a ts_error message naming the op. Every entry of a backend is
 * filled: an operation a device does not offer returns TS_ERR_UNSUPPORTED.
 *
 * The CPU backend (ops/cpu/) is compiled once per CPU capability and the
 * variant is chosen once, at the first lookup, from what the CPU reports
 * or TESSERA_CPU_CAPABILITY (ops/cpu/capability.h). Another device's
 * backend (ops/cuda/, ...) adds its files and its entry in backend.c's
 * list of built-in backends, or registers at run time with
 * ts_backend_register; the op files do not change.
 */
#ifndef TS_OPS_BACKEND_H
#define TS_OPS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/rng.h"
#include "kernels/tensor.h"

/* One operand of a strided kernel: its first element, dtype and element
 * strides at the kernel's shape (0 along a broadcast dim). */
typedef struct {
    void *data;
    ts_dtype dtype;
    const int64_t *strides;
} ts_operand;

/* Whether strides are row-major contiguous for shape (dims of size 1 may
 * have any stride). */
static inline bool ts_dense_strides(int ndim, const int64_t *shape, const int64_t *strides) {
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] != 1 && strides[d] != st) return false;
        st *= shape[d];
    }
    return true;
}

/* ---- memory: storage, copies, fills (tensor.c) ---- */

typedef struct {
    /* nbytes (may be 0) of device memory, or NULL with an error */
    void *(*alloc)(int index, size_t nbytes);
    void (*free)(int index, void *data, size_t nbytes);
    /* contiguous bytes between the host and the device */
    ts_status (*upload)(int index, void *dst, const void *host, size_t nbytes);
    ts_status (*download)(int index, void *host, const void *src, size_t nbytes);
    /* dst = src (or dst += src when accumulate) elementwise over shape,
     * converting dtypes; both on this device */
    ts_status (*copy)(int ndim, const int64_t *shape, ts_operand dst, ts_operand src, bool accumulate);
    /* every element of dst over shape = value */
    ts_status (*fill)(int ndim, const int64_t *shape, ts_operand dst, double value);
} ts_memory_kernels;

/* ---- pointwise: binary arithmetic, maps, where (elementwise.c, ...) ---- */

typedef enum { TS_BIN_ADD, TS_BIN_SUB, TS_BIN_MUL, TS_BIN_DIV } ts_binary_kind;

/* The pointwise ops of one input: y = f(x; p) and its gradient. */
typedef enum {
    TS_MAP_NEG,
    TS_MAP_ADD_SCALAR,
    TS_MAP_MUL_SCALAR,
    TS_MAP_POW,
    TS_MAP_EXP,
    TS_MAP_LOG,
    TS_MAP_SQRT,
    TS_MAP_ABS,
    TS_MAP_RELU,
    TS_MAP_GELU, /* tanh form */
    TS_MAP_SIGMOID,
    TS_MAP_TANH,
    TS_NMAPS
} ts_map_kind;

/* How a binary kernel walks its operands, as the op planned it: both of
 * the output's shape (same), one a single element (scalar), one a row
 * repeated over the other (row, `period` elements), or strided by rows of
 * the last dim, or by square tiles of the last two dims (an operand read
 * across its rows, e.g. a transposed view). */
typedef enum {
    TS_WALK_SAME,
    TS_WALK_A_SCALAR,
    TS_WALK_B_SCALAR,
    TS_WALK_A_ROW,
    TS_WALK_B_ROW,
    TS_WALK_STRIDED,
    TS_WALK_TILED
} ts_walk;

/* out (contiguous, n elements of the broadcast shape) = a op b; sa and sb
 * are the operands' strides at that shape (STRIDED and TILED). */
typedef struct {
    ts_walk walk;
    const void *a, *b;
    void *out;
    int64_t n, period;
    int ndim;
    int64_t shape[TS_MAX_DIMS], sa[TS_MAX_DIMS], sb[TS_MAX_DIMS];
} ts_binary_plan;

typedef struct {
    ts_status (*binary)(ts_binary_kind kind, ts_dtype dt, const ts_binary_plan *plan);
    /* y[i] = f(x[i]; p) over n contiguous elements */
    ts_status (*map)(ts_map_kind kind, ts_dtype dt, const void *x, void *y, int64_t n, double p);
    /* gx[i] = g[i] f'(x[i]) from the gradient g, the input x and the output
     * y (an operand the op's derivative does not read may be g again) */
    ts_status (*map_backward)(ts_map_kind kind, ts_dtype dt, const void *g, const void *x, const void *y, void *gx,
                              int64_t n, double p);
    /* out (contiguous over shape) = mask ? a : b, mask u8 */
    ts_status (*where)(int ndim, const int64_t *shape, ts_operand mask, ts_operand a, ts_operand b, void *out);
} ts_pointwise_kernels;

/* ---- reductions over [outer, red, inner] (reduce.c, the engine) ---- */

typedef struct {
    /* out[o, i] = scale * sum over r of x[o, r, i] */
    ts_status (*sum)(ts_dtype dt, const void *x, void *out, int64_t outer, int64_t red, int64_t inner, double scale);
    /* out[o, i] = max over r (red >= 1), idx = the first r reaching it (NaN wins) */
    ts_status (*max)(ts_dtype dt, const void *x, void *out, int64_t *idx, int64_t outer, int64_t red, int64_t inner);
    /* gx = 0 except gx[o, idx[o, i], i] = g[o, i] */
    ts_status (*max_backward)(ts_dtype dt, const void *g, const int64_t *idx, void *gx, int64_t outer, int64_t red,
                              int64_t inner);
} ts_reduce_kernels;

/* ---- rows of the last dim: softmax, layernorm, losses, embedding, dropout ---- */

typedef struct {
    /* y = softmax (or log_softmax when lg) of R contiguous rows of n */
    ts_status (*forward)(ts_dtype dt, const void *x, void *y, int64_t R, int64_t n, bool lg);
    ts_status (*backward)(ts_dtype dt, const void *y, const void *g, void *gx, int64_t R, int64_t n, bool lg);
} ts_softmax_kernels;

typedef struct {
    /* y = (x - mean) rstd w + b over R rows of D (w, b may be NULL) */
    ts_status (*forward)(ts_dtype dt, const void *x, const void *w, const void *b, void *y, void *mean, void *rstd,
                         int64_t R, int64_t D, double eps);
    /* dx, dw, db (each may be NULL: not wanted) from the gradient g */
    ts_status (*backward)(ts_dtype dt, const void *x, const void *w, const void *mean, const void *rstd,
                          const void *g, void *dx, void *dw, void *db, int64_t R, int64_t D);
} ts_layernorm_kernels;

typedef struct {
    /* lse per row of N x C logits and *total = sum of lse - x[target]
     * over rows whose target is not ign (targets i64, checked) */
    ts_status (*cross_entropy)(ts_dtype dt, const void *x, const int64_t *t, void *lse, int64_t N, int64_t C,
                               int64_t ign, double *total);
    /* gx = (softmax - onehot) scale, zero rows for ignored targets */
    ts_status (*cross_entropy_backward)(ts_dtype dt, const void *x, const int64_t *t, const void *lse, void *gx,
                                        int64_t N, int64_t C, int64_t ign, double scale);
    /* *total = sum of (a - b)^2 over n */
    ts_status (*mse)(ts_dtype dt, const void *a, const void *b, int64_t n, double *total);
    /* ga = 2 (a - b) scale, gb = -ga (either may be NULL) */
    ts_status (*mse_backward)(ts_dtype dt, const void *a, const void *b, void *ga, void *gb, int64_t n, double scale);
} ts_loss_kernels;

typedef struct {
    /* out[i] = table[idx[i]] (rows of D, indices checked) */
    ts_status (*forward)(ts_dtype dt, const void *table, const int64_t *idx, void *out, int64_t n, int64_t D);
    /* gtable (V x D) = 0 plus g[i] at row idx[i] */
    ts_status (*backward)(ts_dtype dt, const int64_t *idx, const void *g, void *gtable, int64_t n, int64_t V,
                          int64_t D);
} ts_embedding_kernels;

typedef struct {
    /* y = x keep(key, i) / (1 - p) over n (the same mask both ways) */
    ts_status (*apply)(ts_dtype dt, ts_key key, const void *x, void *y, int64_t n, double p);
} ts_dropout_kernels;

/* ---- matrix products (matmul.c, attention.c) ---- */

typedef struct {
    /* C = alpha op(A) op(B) + beta C, row-major with leading dims */
    ts_status (*gemm)(ts_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                      const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
} ts_matmul_kernels;

/* Where one operand's heads lie: head h = b H + j (batch b, head j of H)
 * starts sb b + sh j elements past the operand's pointer, its rows sr
 * apart, each row's elements contiguous. Dense [B, H, T, D] heads are
 * sb = H T D, sh = T D, sr = D; a GPT's q inside its [B, T, 3 H D] qkv
 * rows is sb = 3 T H D, sh = D, sr = 3 H D. */
typedef struct {
    int64_t sb, sh, sr;
} ts_attention_layout;

/* Problem of one attention call: BH = B H heads of q [Tq, D], k [Tk, D],
 * v [Tk, Dv] and out [Tq, Dv]; scale already resolved. dq, dk, dv share
 * the layouts of q, k, v, and dout that of out. */
typedef struct {
    int64_t BH, H, Tq, Tk, D, Dv;
    bool causal;
    double scale;
    ts_attention_layout q, k, v, o;
} ts_attention_geom;

typedef struct {
    /* out and the log-sum-exp of each score row, lse [BH, Tq] (contiguous) */
    ts_status (*forward)(ts_dtype dt, const ts_attention_geom *g, const void *q, const void *k, const void *v,
                         void *out, void *lse);
    /* dq, dk, dv (each may be NULL: not wanted) from dout, overwritten */
    ts_status (*backward)(ts_dtype dt, const ts_attention_geom *g, const void *q, const void *k, const void *v,
                          const void *out, const void *lse, const void *dout, void *dq, void *dk, void *dv);
    /* whether the kernels follow the geometry's layouts; when false they
     * take dense [B, H, T, D] heads only and ops give them nothing else */
    bool strided;
} ts_attention_kernels;

/* ---- images: conv2d and pooling, NCHW contiguous (conv.c, pool.c) ---- */

/* Sizes of one convolution: input N,C,H,W; O output channels; kernel
 * KH,KW; stride sh,sw; padding ph,pw; dilation dh,dw; output Ho,Wo. */
typedef struct {
    int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, Ho, Wo;
} ts_conv_geom;

typedef struct {
    /* out = conv(x, w) + bias (bias may be NULL) */
    ts_status (*forward)(ts_dtype dt, const ts_conv_geom *g, const void *x, const void *w, const void *bias,
                         void *out);
    /* from dout: dw (skipped when NULL, and then x may be NULL) and dx
     * (skipped when NULL, and then w may be NULL), overwritten */
    ts_status (*backward)(ts_dtype dt, const ts_conv_geom *g, const void *x, const void *w, const void *dout,
                          void *dw, void *dx);
    /* db[o] = sum of dout over images and pixels */
    ts_status (*bias_backward)(ts_dtype dt, const ts_conv_geom *g, const void *dout, void *db);
} ts_conv_kernels;

/* Sizes of one pooling: planes = N*C of H x W, window kh x kw, stride,
 * padding, output Ho x Wo. */
typedef struct {
    int64_t planes, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw;
} ts_pool_geom;

typedef struct {
    /* max over each window; idx (may be NULL) its plane index ih * W + iw */
    ts_status (*max)(ts_dtype dt, const ts_pool_geom *g, const void *x, void *out, int32_t *idx);
    ts_status (*max_backward)(ts_dtype dt, const ts_pool_geom *g, const void *dout, const int32_t *idx, void *dx);
    ts_status (*avg)(ts_dtype dt, const ts_pool_geom *g, const void *x, void *out);
    ts_status (*avg_backward)(ts_dtype dt, const ts_pool_geom *g, const void *dout, void *dx);
} ts_pool_kernels;

/* ---- optimizer steps and flat-buffer arithmetic (optim/) ---- */

/* One run of an optimizer step over n elements with fixed multipliers
 * (the values optim.c derives from the config, the step and the group). */
typedef struct {
    float *params;
    const float *grads;
    float *s0, *s1; /* state: SGD's momentum buffer (or NULL); Adam's m and v */
    int64_t n;
    /* SGD */
    float lr, weight_decay, momentum, damp_keep; /* damp_keep = 1 - dampening */
    bool nesterov, first;
    /* Adam / AdamW */
    float step_size, bc2_sqrt, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, l2, shrink;
} ts_optim_run;

typedef struct {
    ts_status (*sgd)(const ts_optim_run *r);
    ts_status (*adam)(const ts_optim_run *r);
    /* *sum = sum of g[i]^2 in double */
    ts_status (*sq_norm)(const float *g, int64_t n, double *sum);
    ts_status (*scale)(float *g, int64_t n, float factor);
    ts_status (*to_bf16)(const float *x, uint16_t *y, int64_t n);
    /* acc[i] += scale g[i], g of dtype f32 or bf16 */
    ts_status (*accumulate)(float *acc, const void *g, ts_dtype dt, int64_t n, float scale);
} ts_optim_kernels;

/* ---- the table ---- */

typedef struct ts_backend {
    const char *name;       /* "cpu", "cuda" */
    const char *capability; /* the variant: "avx2", ... ("" when one) */
    const ts_memory_kernels *memory;
    const ts_pointwise_kernels *pointwise;
    const ts_reduce_kernels *reduce;
    const ts_softmax_kernels *softmax;
    const ts_layernorm_kernels *layernorm;
    const ts_loss_kernels *loss;
    const ts_embedding_kernels *embedding;
    const ts_dropout_kernels *dropout;
    const ts_matmul_kernels *matmul;
    const ts_attention_kernels *attention;
    const ts_conv_kernels *conv;
    const ts_pool_kernels *pool;
    const ts_optim_kernels *optim;
} ts_backend;

/* The backend of the device the n tensors share (NULL entries skipped;
 * at least one given). NULL with "op: expected all tensors on the same
 * device, got cpu and cuda:0" or "op: no kernels for device cuda:0 in this
 * build" (or the CPU's capability error). */
const ts_backend *ts_backend_for(const char *op, int n, ts_tensor *const *t);

/* The backend of device d; NULL with "op: no kernels for device ..." */
const ts_backend *ts_backend_of(const char *op, ts_device d);

/* The CPU's backend (for kernels over host memory: the optimizer);
 * NULL with the capability error when TESSERA_CPU_CAPABILITY is refused. */
const ts_backend *ts_backend_cpu(void);

/* Installs b as the backend of every device of type (replacing one
 * there, except the CPU's); for a device whose kernels live outside this
 * library. */
ts_status ts_backend_register(ts_device_type type, const ts_backend *b);

#endif
