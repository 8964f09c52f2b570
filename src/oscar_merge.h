/* src/oscar_merge.h -- part of the oscar.h implementation: oscar_merge_states,
   validation and dispatch (kernel: merge.cuh). */
#ifndef OSCAR_MERGE_H_INCLUDED
#define OSCAR_MERGE_H_INCLUDED

OSCAR_API oscar_status oscar_merge_states(oscar_ctx *ctx, const oscar_merge_desc *desc, oscar_stream stream) {
    oscar__validator v;
    oscar_merge_desc d;
    oscar_merge_params p;
    oscar_status st;
    int i;
    OSCAR__REQUIRE_CTX(ctx, "oscar_merge_states");
    if (!desc) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_merge_states: desc = NULL");
    d = *desc;
    d.dtype = oscar__def(d.dtype, OSCAR_DTYPE_BF16);
    d.lse_base = oscar__def(d.lse_base, OSCAR_LSE_BASE_E);
    d.row_stride = oscar__def(d.row_stride, d.head_dim);
    d.out_row_stride = oscar__def(d.out_row_stride, d.head_dim);
    oscar__validate_begin(&v, ctx, "oscar_merge_states");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, d.num_states >= 1 && d.num_states <= 8, "desc.num_states = %d; expected 1..8", d.num_states);
    OSCAR__VALIDATE(&v, d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256,
                    "desc.head_dim = %d; expected 64, 128 or 256", d.head_dim);
    OSCAR__VALIDATE(&v, d.num_rows >= 0, "desc.num_rows = %lld; expected >= 0", OSCAR__CAST(long long, d.num_rows));
    OSCAR__VALIDATE(&v, d.dtype == OSCAR_DTYPE_BF16 || d.dtype == OSCAR_DTYPE_F16 || d.dtype == OSCAR_DTYPE_F32,
                    "desc.dtype = %s; expected bf16, f16 or f32", oscar__dtype_name(d.dtype));
    OSCAR__VALIDATE(&v, d.lse_base > 0 && d.lse_base < OSCAR__LSE_BASE_COUNT, "desc.lse_base = %d; expected E or 2",
                    OSCAR__CAST(int, d.lse_base));
    OSCAR__VALIDATE(&v, d.row_stride >= d.head_dim && d.out_row_stride >= d.head_dim,
                    "desc.row_stride = %lld, out_row_stride = %lld; expected >= head_dim",
                    OSCAR__CAST(long long, d.row_stride), OSCAR__CAST(long long, d.out_row_stride));
    OSCAR__VALIDATE(&v, d.out_o != NULL, "desc.out_o = NULL; *must* be set");
    for (i = 0; i < d.num_states && i < 8; i++)
        OSCAR__VALIDATE(&v, d.o[i] && d.lse[i], "desc.o[%d] = %p, desc.lse[%d] = %p; both *must* be set", i, d.o[i], i,
                        OSCAR__CAST(const void *, d.lse[i]));
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK || d.num_rows == 0) return st;
    memset(&p, 0, sizeof p);
    for (i = 0; i < d.num_states; i++) {
        p.o[i] = OSCAR__RCAST(uint64_t, d.o[i]);
        p.lse[i] = OSCAR__RCAST(uint64_t, d.lse[i]);
    }
    p.out_o = OSCAR__RCAST(uint64_t, d.out_o);
    p.out_lse = OSCAR__RCAST(uint64_t, d.out_lse);
    p.num_rows = d.num_rows;
    p.row_stride = d.row_stride;
    p.out_row_stride = d.out_row_stride;
    p.num_states = d.num_states;
    p.dtype = oscar__k_dtype(d.dtype);
    p.lse_base = d.lse_base == OSCAR_LSE_BASE_2 ? 2 : 1;
    if (ctx->backend == OSCAR_BACKEND_CPU) {
        oscar__cpu_merge(&p, d.head_dim);
        return OSCAR_OK;
    }
    {
        char name[192];
        oscar__kernel *k;
        /* rows (warps) per CTA: the tuning table's, else 4 (tune/oscar_tune.h) */
        int32_t rows = oscar__tune_merge_rows(ctx, d.head_dim, d.num_states, d.dtype, d.num_rows);
        oscar__name_merge(name, sizeof name, d.head_dim, rows);
        st = oscar__jit_get(ctx, "merge.cuh", name, &k);
        if (st != OSCAR_OK) return st;
        return oscar__launch(ctx, k, OSCAR__CAST(unsigned, (d.num_rows + rows - 1) / rows), OSCAR__CAST(unsigned, 32 * rows),
                             0, stream, &p);
    }
}

/* Reads up to 8 device buffers once (benchmarks' read floor, the tuner's
   bandwidth probe). */
OSCAR__PRIVATE oscar_status oscar__probe_read(oscar_ctx *ctx, const void *const *ptrs, const size_t *bytes, int n,
                                              void *sink, oscar_stream stream) {
    oscar_probe_params p;
    oscar__kernel *k;
    oscar_status st;
    int i;
    if (n < 1 || n > 8) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar__probe_read: n = %d; expected 1..8", n);
    memset(&p, 0, sizeof p);
    for (i = 0; i < n; i++) {
        p.ptr[i] = OSCAR__RCAST(uint64_t, ptrs[i]);
        p.bytes[i] = OSCAR__CAST(int64_t, bytes[i]);
    }
    p.count = n;
    p.sink = OSCAR__RCAST(uint64_t, sink);
    st = oscar__jit_get(ctx, "probe.cuh", "oscar::probe_read_kernel<4>", &k);
    if (st != OSCAR_OK) return st;
    return oscar__launch(ctx, k, OSCAR__CAST(unsigned, 8 * OSCAR__MAX(ctx->num_sms, 1)), 256, 0, stream, &p);
}

#endif /* OSCAR_MERGE_H_INCLUDED */
