/* oscar_kernels/oscar_params.h -- the parameter structs every kernel receives
   by value, shared by the host (C11) and the device (CUDA C++ through NVRTC,
   which has no system headers). Fixed-width types only, 64-bit strides.
   sizeof and selected offsetof are pinned on both sides, so host and device
   cannot drift apart. */
#ifndef OSCAR_K_PARAMS_H
#define OSCAR_K_PARAMS_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
typedef long long oscar_i64;
typedef unsigned long long oscar_u64;
typedef int oscar_i32;
typedef unsigned int oscar_u32;
typedef unsigned short oscar_u16;
typedef unsigned char oscar_u8;
#define OSCAR_PARAMS_STATIC_ASSERT(c, m) static_assert(c, m)
/* offsetof needs <stddef.h>, which NVRTC does not have: layouts are pinned
   by offsetof on the host and by sizeof on both sides */
#define OSCAR_PARAMS_OFFSET_ASSERT(T, f, v)
#else
/* the host includes <stddef.h> and <stdint.h> first (oscar.h does) */
typedef int64_t oscar_i64;
typedef uint64_t oscar_u64;
typedef int32_t oscar_i32;
typedef uint32_t oscar_u32;
typedef uint16_t oscar_u16;
typedef uint8_t oscar_u8;
#ifdef __cplusplus
#define OSCAR_PARAMS_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define OSCAR_PARAMS_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif
#define OSCAR_PARAMS_OFFSET_ASSERT(T, f, v) OSCAR_PARAMS_STATIC_ASSERT(offsetof(T, f) == (v), #T " layout")
#endif

/* Scale layouts (values of oscar_scale_layout). */
#define OSCAR_K_SCALE_F16_SCALE_MIN 1
#define OSCAR_K_SCALE_F32_SCALE_ZERO 2
/* Element dtypes (values of oscar_dtype). */
#define OSCAR_K_DTYPE_BF16 1
#define OSCAR_K_DTYPE_F16 2
#define OSCAR_K_DTYPE_F32 3
#define OSCAR_K_DTYPE_I32 4
#define OSCAR_K_DTYPE_I64 5

/* Kernel trace (oscar_desc.trace_records; the values of oscar_trace_kernel and
   oscar_trace_mark in oscar.h). The buffer: a 16-byte header (u32 marks
   dropped for lack of room, 12 bytes unused), then one 16-byte record slot
   per (kernel, CTA, mark), {u64 %globaltimer ns; u32 cta; u16 sm; u8 kernel;
   u8 mark}, at ((kernel - 1) * cta_slots + cta) * OSCAR_K_TRACE_MARKS + mark
   (time 0: no mark). */
#define OSCAR_K_TRACE_DECODE_PREP 1
#define OSCAR_K_TRACE_DECODE_INT2 2
#define OSCAR_K_TRACE_DECODE_WINDOW 3
#define OSCAR_K_TRACE_DECODE_MERGE 4
#define OSCAR_K_TRACE_DECODE_MERGE_HEAD 5
#define OSCAR_K_TRACE_QUANTIZE 6
#define OSCAR_K_TRACE_ENTRY 0
#define OSCAR_K_TRACE_WAITED 1
#define OSCAR_K_TRACE_LOOP_END 2
#define OSCAR_K_TRACE_DONE 3
#define OSCAR_K_TRACE_KERNELS 6 /* the largest kernel id */
#define OSCAR_K_TRACE_MARKS 4
#define OSCAR_K_TRACE_HEADER_BYTES 16
#define OSCAR_K_TRACE_RECORD_BYTES 16

/* Geometry of one layer's INT2 pool, in bytes. Row = one (slot, kv head). */
typedef struct oscar_pool_params {
    oscar_u64 k_codes, v_codes;   /* device addresses */
    oscar_u64 k_scales, v_scales;
    oscar_i64 codes_page_stride, codes_token_stride, codes_head_stride;
    oscar_i64 scales_page_stride, scales_token_stride, scales_head_stride;
    oscar_i32 page_size;          /* runtime page size (kernels templated on 0 use it) */
    oscar_i32 num_kv_heads;
    oscar_i32 scale_layout;       /* OSCAR_K_SCALE_* */
    oscar_i32 num_pages;
} oscar_pool_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_pool_params) == 96, "oscar_pool_params size");
OSCAR_PARAMS_OFFSET_ASSERT(oscar_pool_params, page_size, 80);

/* dequant.cuh: INT2 rows of listed slots -> dense bf16/f16. */
typedef struct oscar_dequant_params {
    oscar_pool_params pool;
    oscar_u64 slots;               /* device array of slot ids */
    oscar_u64 k_out, v_out;        /* 0 = skip */
    oscar_i64 num_tokens;
    oscar_i64 out_token_stride;    /* elements */
    oscar_i64 out_head_stride;     /* elements */
    oscar_i32 slot_dtype;          /* OSCAR_K_DTYPE_I32 / I64 */
    oscar_i32 out_dtype;           /* OSCAR_K_DTYPE_BF16 / F16 */
} oscar_dequant_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_dequant_params) == 152, "oscar_dequant_params size");
OSCAR_PARAMS_OFFSET_ASSERT(oscar_dequant_params, slot_dtype, 144);

/* quantize.cuh: rows of K and V -> rotate -> clip -> INT2 codes + scales. */
#define OSCAR_K_MAX_QUANT_LAYERS 48
typedef struct oscar_quantize_layer {
    oscar_u64 src_k, src_v;         /* source rows (bf16/f16) */
    oscar_u64 rot_k, rot_v;         /* [D][D] f32 row-major, 0 = no rotation */
    oscar_u64 k_codes, v_codes;     /* this layer's INT2 pool */
    oscar_u64 k_scales, v_scales;
    oscar_u64 rot_k_prepared, rot_v_prepared; /* 0 = none: oscar_prepare_rotation's images (quantize.cuh) */
} oscar_quantize_layer;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_quantize_layer) == 80, "oscar_quantize_layer size");
/* A prepared rotation image (oscar_prepare_rotation): a 64-byte header (magic,
   version, head dim, OSCAR_K_DTYPE_* of the rows it rotates) and R rounded to
   that dtype in the two shared-memory layouts of quantize_kernel, each
   head_dim^2 16-bit values: the wgmma path's K-major swizzled R^T, then the
   mma.sync path's swizzled row-major R. */
#define OSCAR_K_ROT_PREP_MAGIC 0x5052534Fu
#define OSCAR_K_ROT_PREP_VERSION 1u
#define OSCAR_K_ROT_PREP_HEADER 64
typedef struct oscar_rotation_prepare_params {
    oscar_u64 rotation; /* [D][D] f32 */
    oscar_u64 out;      /* the image */
} oscar_rotation_prepare_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_rotation_prepare_params) == 16, "oscar_rotation_prepare_params size");

typedef struct oscar_quantize_params {
    oscar_pool_params pool;         /* destination geometry (its bases are unused: see layers) */
    oscar_u64 src_slots;            /* 0: dense rows, token t is source slot t */
    oscar_u64 dst_slots;            /* INT2 pool slot of token t */
    oscar_i64 num_tokens;
    oscar_i64 src_page_stride, src_token_stride, src_head_stride; /* elements */
    oscar_i32 src_page_size;
    oscar_i32 slot_dtype;           /* OSCAR_K_DTYPE_I32 / I64, both slot arrays */
    oscar_i32 k_clip_index;         /* -1: no clipping; else tau = sorted|x|[index] */
    oscar_i32 v_clip_index;
    oscar_i32 lloyd_max;            /* 0: uniform min-max codes; 1: Lloyd-Max codes (G = 1 only) */
    oscar_i32 num_layers;
    oscar_i32 side_ctas[2];         /* CTAs per layer for K and for V (grid.x = the larger; the other side's extra CTAs exit) */
    oscar_quantize_layer layers[OSCAR_K_MAX_QUANT_LAYERS];
} oscar_quantize_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_quantize_params) == 176 + 80 * OSCAR_K_MAX_QUANT_LAYERS,
                           "oscar_quantize_params size");
OSCAR_PARAMS_OFFSET_ASSERT(oscar_quantize_params, layers, 176);

/* decode.cuh: one decode step of attention over INT2 history + bf16 windows. */
/* the most q rows (request, head) one decode_prep_kernel CTA takes: it takes
   prep_requests requests of one KV head, prep_requests x ratio <= PREP_ROWS. */
#define OSCAR_K_PREP_ROWS 16
typedef struct oscar_decode_params {
    oscar_pool_params pool;            /* INT2 pool of this layer */
    oscar_u64 int2_indptr, int2_indices, int2_last_page_len; /* i32, CSR over INT2 pages */
    oscar_u64 win_k, win_v;            /* the engine's bf16/f16 paged cache */
    oscar_i64 win_page_stride, win_token_stride, win_head_stride; /* elements */
    oscar_u64 win_indptr, win_indices, win_last_page_len;          /* i32, CSR over window pages */
    oscar_u64 q, o, lse;               /* q [b][h][D], o [b][h][D], lse [b][h] f32 (0: none) */
    oscar_i64 q_batch_stride, q_head_stride, o_batch_stride, o_head_stride; /* elements */
    oscar_u64 rot_k, rot_v;            /* [D][D] f32 (0: none) */
    oscar_u64 ws_q, ws_o, ws_lse;      /* workspace: q' mma fragments + group sums (decode.cuh);
                                          partial o [b][h][splits][D] f32; lse [b][h][splits] f32 (log2) */
    float sm_scale;                    /* softmax scale applied to q.k */
    float logit_cap;                   /* 0: none; else cap * tanh(s / cap) */
    oscar_i32 win_page_size;
    oscar_i32 batch_size;
    oscar_i32 num_q_heads;
    oscar_i32 group_ratio;             /* q heads per kv head */
    oscar_i32 int2_splits;             /* split-KV CTAs per (request, kv head) over INT2 tokens */
    oscar_i32 win_splits;              /* ... over window tokens */
    oscar_i32 q_dtype, o_dtype, kv_dtype; /* OSCAR_K_DTYPE_*: q, o, window cache */
    oscar_i32 lse_base;                /* 1: natural log, 2: base 2 */
    oscar_i32 min_chunk;               /* smallest number of tokens a split takes */
    oscar_i32 win_num_pages;           /* page ids outside [0, num_pages) are skipped */
    oscar_i32 prep_requests;           /* requests per prep CTA (x ratio <= OSCAR_K_PREP_ROWS) */
    oscar_i32 merge_requests;          /* requests per merge CTA (x ratio <= the kernel's ROWS) */
} oscar_decode_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_decode_params) == 344, "oscar_decode_params size");
OSCAR_PARAMS_OFFSET_ASSERT(oscar_decode_params, sm_scale, 280);

/* merge.cuh: exact merge of partial attention states. */
typedef struct oscar_merge_params {
    oscar_u64 o[8], lse[8];            /* states: o [rows][D] (row stride), lse f32 [rows] */
    oscar_u64 out_o, out_lse;          /* out_lse 0: not written */
    oscar_i64 num_rows, row_stride, out_row_stride; /* elements */
    oscar_i32 num_states, dtype;       /* OSCAR_K_DTYPE_BF16 / F16 / F32 */
    oscar_i32 lse_base;                /* 1: natural, 2: base 2 (inputs and output) */
    oscar_i32 pad0;
} oscar_merge_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_merge_params) == 184, "oscar_merge_params size");

/* probe.cuh: memory probes for the benchmarks and the tuner. */
typedef struct oscar_probe_params {
    oscar_u64 ptr[8];
    oscar_i64 bytes[8];               /* multiples of 16 are read; a tail is ignored */
    oscar_u64 sink;                   /* u32 written only if the impossible happens (keeps the loads) */
    oscar_i32 count;
    oscar_i32 pad0;
} oscar_probe_params;
OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_probe_params) == 144, "oscar_probe_params size");

#endif /* OSCAR_K_PARAMS_H */
