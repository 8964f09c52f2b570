/* oscar_kernels/calib_params.cuh -- the parameter structs of calib.cuh,
   shared by the host (C11: calib/oscar_calib.h includes this file) and the
   device (NVRTC). Like oscar_params.h: fixed-width types only, 64-bit
   strides, sizes pinned on both sides. Kept apart from oscar_params.h so the
   calibration kernels do not touch the structs of the decode path. */
#ifndef OSCAR_K_CALIB_PARAMS_CUH
#define OSCAR_K_CALIB_PARAMS_CUH

#include "oscar_params.h"

/* calib_gram_kernel / calib_reduce_kernel: S[h] += Σ_rows a·bᵀ over the rows
   of output head h, where row i of head h is input head h·group + i % group
   of token i / group, a = w[token][h]·x (w = 1 without weights) and b = x.
   The gram kernel writes one 64×64 tile partial per (tile, head, split) to
   `partials`; the reduce kernel adds the partials of every split, in split
   order, to both triangles of S (deterministic: no atomics). */
typedef struct oscar_calib_gram_params {
    oscar_u64 x;              /* input rows (bf16/f16/f32), element [token][head][d] via the strides */
    oscar_u64 weights;        /* f64 [num_tokens][num_heads], 0 = unweighted */
    oscar_u64 partials;       /* f64 [num_splits][num_heads][num_tiles][64][64] */
    oscar_u64 acc;            /* f64 [num_heads][D][D], full symmetric */
    oscar_u64 count;          /* f64 token counter, += count_add by the reduce kernel; 0 = none */
    oscar_i64 num_tokens;
    oscar_i64 token_stride;   /* elements */
    oscar_i64 head_stride;    /* elements */
    oscar_i64 rows_per_split; /* multiple of 16 */
    oscar_i64 count_add;
    oscar_i32 group;          /* input heads per output head */
    oscar_i32 num_heads;      /* output heads */
    oscar_i32 num_splits;
    oscar_i32 dtype;          /* OSCAR_K_DTYPE_BF16 / F16 / F32 */
} oscar_calib_gram_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_calib_gram_params) == 96, "oscar_calib_gram_params size");
OSCAR_PARAMS_OFFSET_ASSERT(oscar_calib_gram_params, group, 80);

/* calib_weights_kernel / calib_sum_weights_kernel: the score weights of the
   V target, w[t][h] = k_t · C[h] · k_tᵀ, and wsum[h] += Σ_t w[t][h]. */
typedef struct oscar_calib_weight_params {
    oscar_u64 k;              /* keys (bf16/f16/f32) [token][head][d] via the strides */
    oscar_u64 cq;             /* f64 [num_heads][D][D], the frozen query covariances */
    oscar_u64 weights;        /* f64 [num_tokens][num_heads] out */
    oscar_u64 wsum;           /* f64 [num_heads] accumulator */
    oscar_i64 num_tokens;
    oscar_i64 token_stride;
    oscar_i64 head_stride;
    oscar_i32 num_heads;
    oscar_i32 dtype;
} oscar_calib_weight_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_calib_weight_params) == 64, "oscar_calib_weight_params size");
OSCAR_PARAMS_OFFSET_ASSERT(oscar_calib_weight_params, num_heads, 56);

#endif /* OSCAR_K_CALIB_PARAMS_CUH */
