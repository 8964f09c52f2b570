/* src/oscar_dequant.h -- part of the oscar.h implementation:
   oscar_dequantize_kv, validation and dispatch (kernel: dequant.cuh). */
#ifndef OSCAR_DEQUANT_H_INCLUDED
#define OSCAR_DEQUANT_H_INCLUDED

/* Shared by every entry point: a ctx must exist. */
#define OSCAR__REQUIRE_CTX(ctx, func)                                                                                  \
    do {                                                                                                               \
        if (!(ctx)) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, func ": ctx = NULL");                      \
        oscar__clear_error(ctx);                                                                                       \
    } while (0)

OSCAR__PRIVATE int oscar__is_index_dtype(oscar_dtype t) { return t == OSCAR_DTYPE_I32 || t == OSCAR_DTYPE_I64; }
OSCAR__PRIVATE int oscar__is_half_dtype(oscar_dtype t) { return t == OSCAR_DTYPE_BF16 || t == OSCAR_DTYPE_F16; }

OSCAR_API oscar_status oscar_dequantize_kv(oscar_ctx *ctx, const oscar_int2_pool_desc *pool_desc,
                                           const oscar_dequant_desc *desc, oscar_stream stream) {
    oscar__validator v;
    oscar_int2_pool_desc pool;
    oscar_dequant_desc d;
    oscar_dequant_params p;
    oscar__kernel *k;
    char name[192];
    oscar_status st;
    int64_t total, blocks;

    OSCAR__REQUIRE_CTX(ctx, "oscar_dequantize_kv");
    if (!pool_desc || !desc)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_dequantize_kv: pool and desc must be non-NULL");
    pool = oscar__pool_defaults(pool_desc);
    d = *desc;
    d.slot_dtype = oscar__def(d.slot_dtype, OSCAR_DTYPE_I32);
    d.out_dtype = oscar__def(d.out_dtype, OSCAR_DTYPE_BF16);
    d.out_head_stride = oscar__def(d.out_head_stride, pool.head_dim);
    d.out_token_stride = oscar__def(d.out_token_stride, OSCAR__CAST(int64_t, pool.num_kv_heads) * pool.head_dim);

    oscar__validate_begin(&v, ctx, "oscar_dequantize_kv");
    oscar__pool_validate(&v, &pool, "pool");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, d.num_tokens >= 0, "desc.num_tokens = %lld; expected >= 0",
                    OSCAR__CAST(long long, d.num_tokens));
    OSCAR__VALIDATE(&v, d.num_tokens == 0 || d.slots, "desc.slots = NULL; *must* be set when num_tokens > 0");
    OSCAR__VALIDATE(&v, oscar__is_index_dtype(d.slot_dtype), "desc.slot_dtype = %s; expected i32 or i64",
                    oscar__dtype_name(d.slot_dtype));
    OSCAR__VALIDATE(&v, oscar__is_half_dtype(d.out_dtype), "desc.out_dtype = %s; expected bf16 or f16",
                    oscar__dtype_name(d.out_dtype));
    OSCAR__VALIDATE(&v, d.k_out || d.v_out || d.num_tokens == 0, "desc.k_out and desc.v_out are both NULL");
    OSCAR__VALIDATE(&v,
                    d.out_head_stride >= pool.head_dim && d.out_head_stride % 4 == 0 && d.out_token_stride > 0 &&
                        d.out_token_stride % 4 == 0,
                    "desc.out_head_stride = %lld, out_token_stride = %lld; expected multiples of 4 elements, head "
                    "stride >= head_dim = %d",
                    OSCAR__CAST(long long, d.out_head_stride), OSCAR__CAST(long long, d.out_token_stride),
                    pool.head_dim);
    OSCAR__VALIDATE(&v, (OSCAR__RCAST(uintptr_t, d.k_out) | OSCAR__RCAST(uintptr_t, d.v_out)) % 8 == 0,
                    "desc.k_out = %p, v_out = %p; expected 8-byte aligned", d.k_out, d.v_out);
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK || d.num_tokens == 0) return st;

    memset(&p, 0, sizeof p);
    p.pool = oscar__pool_params(&pool);
    p.slots = OSCAR__RCAST(uint64_t, d.slots);
    p.k_out = OSCAR__RCAST(uint64_t, d.k_out);
    p.v_out = OSCAR__RCAST(uint64_t, d.v_out);
    p.num_tokens = d.num_tokens;
    p.out_token_stride = d.out_token_stride;
    p.out_head_stride = d.out_head_stride;
    p.slot_dtype = d.slot_dtype == OSCAR_DTYPE_I64 ? OSCAR_K_DTYPE_I64 : OSCAR_K_DTYPE_I32;
    p.out_dtype = oscar__k_dtype16(d.out_dtype);

    if (ctx->backend == OSCAR_BACKEND_CPU) {
        oscar__cpu_dequant(&p, pool.head_dim, pool.group_size);
        return OSCAR_OK;
    }
    oscar__name_dequant(name, sizeof name, pool.head_dim, pool.group_size, pool.page_size);
    st = oscar__jit_get(ctx, "dequant.cuh", name, &k);
    if (st != OSCAR_OK) return st;
    total = d.num_tokens * pool.num_kv_heads * (pool.head_dim / 16);
    blocks = OSCAR__MIN((total + 255) / 256, OSCAR__CAST(int64_t, 65535) * 16);
    return oscar__launch(ctx, k, OSCAR__CAST(unsigned, blocks), 256, 0, stream, &p);
}

#endif /* OSCAR_DEQUANT_H_INCLUDED */
