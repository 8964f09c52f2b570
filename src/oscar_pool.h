/* src/oscar_pool.h -- part of the oscar.h implementation: defaults and
   validation of the INT2 pool descriptor, and its translation into the
   kernels' oscar_pool_params. */
#ifndef OSCAR_POOL_H_INCLUDED
#define OSCAR_POOL_H_INCLUDED

OSCAR__PRIVATE int64_t oscar__scale_pair_bytes(oscar_scale_layout layout) {
    return layout == OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO ? 8 : 4;
}

/* Fills every zero field with its default (no validation). */
OSCAR__PRIVATE oscar_int2_pool_desc oscar__pool_defaults(const oscar_int2_pool_desc *d) {
    oscar_int2_pool_desc p = *d;
    int64_t code_row, scale_row, page_tokens, heads;
    p.page_size = oscar__def(p.page_size, 1);
    p.group_size = oscar__def(p.group_size, p.head_dim);
    p.scale_layout = oscar__def(p.scale_layout, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN);
    p.layout = oscar__def(p.layout, OSCAR_KV_LAYOUT_NHD);
    code_row = p.head_dim / 4;
    scale_row = p.group_size > 0 ? (p.head_dim / p.group_size) * oscar__scale_pair_bytes(p.scale_layout) : 0;
    page_tokens = p.page_size;
    heads = p.num_kv_heads;
    if (p.layout == OSCAR_KV_LAYOUT_HND) {
        p.codes_token_stride_bytes = oscar__def(p.codes_token_stride_bytes, code_row);
        p.codes_head_stride_bytes = oscar__def(p.codes_head_stride_bytes, code_row * page_tokens);
        p.scales_token_stride_bytes = oscar__def(p.scales_token_stride_bytes, scale_row);
        p.scales_head_stride_bytes = oscar__def(p.scales_head_stride_bytes, scale_row * page_tokens);
    } else {
        p.codes_head_stride_bytes = oscar__def(p.codes_head_stride_bytes, code_row);
        p.codes_token_stride_bytes = oscar__def(p.codes_token_stride_bytes, code_row * heads);
        p.scales_head_stride_bytes = oscar__def(p.scales_head_stride_bytes, scale_row);
        p.scales_token_stride_bytes = oscar__def(p.scales_token_stride_bytes, scale_row * heads);
    }
    p.codes_page_stride_bytes = oscar__def(p.codes_page_stride_bytes, code_row * heads * page_tokens);
    p.scales_page_stride_bytes = oscar__def(p.scales_page_stride_bytes, scale_row * heads * page_tokens);
    return p;
}

/* Validates a filled pool desc; name is how the caller calls it ("pool",
   "pools[3]"), so messages point at the right field. */
OSCAR__PRIVATE void oscar__pool_validate(oscar__validator *v, const oscar_int2_pool_desc *p, const char *name) {
    int64_t pair = oscar__scale_pair_bytes(p->scale_layout);
    OSCAR__CHECK_CANARIES(v, p, "pool");
    OSCAR__VALIDATE(v, p->head_dim == 64 || p->head_dim == 128 || p->head_dim == 256,
                    "%s.head_dim = %d; expected 64, 128 or 256", name, p->head_dim);
    OSCAR__VALIDATE(v, p->num_kv_heads >= 1 && p->num_kv_heads <= 1024, "%s.num_kv_heads = %d; expected 1..1024", name,
                    p->num_kv_heads);
    OSCAR__VALIDATE(v, p->num_pages >= 1, "%s.num_pages = %d; expected >= 1 (*must* be set)", name, p->num_pages);
    OSCAR__VALIDATE(v, p->page_size >= 1 && p->page_size <= 4096, "%s.page_size = %d; expected 1..4096", name,
                    p->page_size);
    OSCAR__VALIDATE(v,
                    (p->group_size == 32 || p->group_size == 64 || p->group_size == 128 || p->group_size == 256) &&
                        p->head_dim > 0 && p->head_dim % p->group_size == 0,
                    "%s.group_size = %d; expected 32, 64, 128 or 256 dividing head_dim = %d", name, p->group_size,
                    p->head_dim);
    OSCAR__VALIDATE(v, p->scale_layout > 0 && p->scale_layout < OSCAR__SCALE_LAYOUT_COUNT,
                    "%s.scale_layout = %d; expected an oscar_scale_layout", name, OSCAR__CAST(int, p->scale_layout));
    OSCAR__VALIDATE(v, p->layout > 0 && p->layout < OSCAR__KV_LAYOUT_COUNT, "%s.layout = %d; expected NHD or HND",
                    name, OSCAR__CAST(int, p->layout));
    OSCAR__VALIDATE(v, p->k_codes && p->v_codes && p->k_scales && p->v_scales,
                    "%s: k_codes, v_codes, k_scales and v_scales *must* be set (got %p, %p, %p, %p)", name, p->k_codes,
                    p->v_codes, p->k_scales, p->v_scales);
    OSCAR__VALIDATE(v, (OSCAR__RCAST(uintptr_t, p->k_codes) | OSCAR__RCAST(uintptr_t, p->v_codes)) % 16 == 0,
                    "%s: k_codes = %p, v_codes = %p; expected 16-byte aligned (vector loads)", name, p->k_codes,
                    p->v_codes);
    OSCAR__VALIDATE(v,
                    (OSCAR__RCAST(uintptr_t, p->k_scales) | OSCAR__RCAST(uintptr_t, p->v_scales)) %
                            OSCAR__CAST(uintptr_t, pair) ==
                        0,
                    "%s: k_scales = %p, v_scales = %p; expected %d-byte aligned for this scale layout", name,
                    p->k_scales, p->v_scales, OSCAR__CAST(int, pair));
    OSCAR__VALIDATE(v,
                    p->codes_page_stride_bytes > 0 && p->codes_token_stride_bytes > 0 &&
                        p->codes_head_stride_bytes > 0 && p->codes_page_stride_bytes % 16 == 0 &&
                        p->codes_token_stride_bytes % 16 == 0 && p->codes_head_stride_bytes % 16 == 0,
                    "%s.codes_{page,token,head}_stride_bytes = %lld, %lld, %lld; expected positive multiples of 16",
                    name, OSCAR__CAST(long long, p->codes_page_stride_bytes),
                    OSCAR__CAST(long long, p->codes_token_stride_bytes),
                    OSCAR__CAST(long long, p->codes_head_stride_bytes));
    OSCAR__VALIDATE(v,
                    p->scales_page_stride_bytes > 0 && p->scales_token_stride_bytes > 0 &&
                        p->scales_head_stride_bytes > 0 && p->scales_page_stride_bytes % pair == 0 &&
                        p->scales_token_stride_bytes % pair == 0 && p->scales_head_stride_bytes % pair == 0,
                    "%s.scales_{page,token,head}_stride_bytes = %lld, %lld, %lld; expected positive multiples of %d",
                    name, OSCAR__CAST(long long, p->scales_page_stride_bytes),
                    OSCAR__CAST(long long, p->scales_token_stride_bytes),
                    OSCAR__CAST(long long, p->scales_head_stride_bytes), OSCAR__CAST(int, pair));
}

OSCAR__PRIVATE oscar_pool_params oscar__pool_params(const oscar_int2_pool_desc *p) {
    oscar_pool_params k;
    memset(&k, 0, sizeof k);
    k.k_codes = OSCAR__RCAST(uint64_t, p->k_codes);
    k.v_codes = OSCAR__RCAST(uint64_t, p->v_codes);
    k.k_scales = OSCAR__RCAST(uint64_t, p->k_scales);
    k.v_scales = OSCAR__RCAST(uint64_t, p->v_scales);
    k.codes_page_stride = p->codes_page_stride_bytes;
    k.codes_token_stride = p->codes_token_stride_bytes;
    k.codes_head_stride = p->codes_head_stride_bytes;
    k.scales_page_stride = p->scales_page_stride_bytes;
    k.scales_token_stride = p->scales_token_stride_bytes;
    k.scales_head_stride = p->scales_head_stride_bytes;
    k.page_size = p->page_size;
    k.num_kv_heads = p->num_kv_heads;
    k.scale_layout = OSCAR__CAST(int32_t, p->scale_layout);
    k.num_pages = p->num_pages;
    return k;
}

OSCAR_API oscar_status oscar_query_int2_pool_defaults(oscar_ctx *ctx, const oscar_int2_pool_desc *desc,
                                                      oscar_int2_pool_desc *out) {
    if (!desc || !out)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                           "oscar_query_int2_pool_defaults: desc and out must be non-NULL");
    *out = oscar__pool_defaults(desc);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_int2_pool_bytes(oscar_ctx *ctx, const oscar_int2_pool_desc *desc,
                                             size_t *out_code_bytes, size_t *out_scale_bytes) {
    oscar_int2_pool_desc p;
    oscar__validator v;
    int64_t rows;
    if (!desc || !out_code_bytes || !out_scale_bytes)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_int2_pool_bytes: arguments must be non-NULL");
    p = oscar__pool_defaults(desc);
    oscar__validate_begin(&v, ctx, "oscar_int2_pool_bytes");
    OSCAR__VALIDATE(&v, p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
                    "pool.head_dim = %d; expected 64, 128 or 256", p.head_dim);
    OSCAR__VALIDATE(&v, p.num_kv_heads >= 1 && p.num_pages >= 1 && p.page_size >= 1,
                    "pool.num_kv_heads = %d, num_pages = %d, page_size = %d; expected all >= 1", p.num_kv_heads,
                    p.num_pages, p.page_size);
    OSCAR__VALIDATE(&v, p.group_size > 0 && p.head_dim % p.group_size == 0,
                    "pool.group_size = %d; expected a divisor of head_dim", p.group_size);
    if (oscar__validate_end(&v) != OSCAR_OK) return v.status;
    rows = OSCAR__CAST(int64_t, p.num_pages) * p.page_size * p.num_kv_heads;
    *out_code_bytes = OSCAR__CAST(size_t, rows * (p.head_dim / 4));
    *out_scale_bytes = OSCAR__CAST(size_t, rows * (p.head_dim / p.group_size) * oscar__scale_pair_bytes(p.scale_layout));
    return OSCAR_OK;
}

#endif /* OSCAR_POOL_H_INCLUDED */
