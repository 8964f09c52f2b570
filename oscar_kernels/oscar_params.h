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

#endif /* OSCAR_K_PARAMS_H */
