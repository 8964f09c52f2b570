/* src/oscar_trace.h -- the kernel trace (oscar.h, "Kernel trace"): the
   context's device buffer, reset and read.

   Why it is part of the library: every question about where a decode step's
   microseconds go (the prep wait, the INT2 loop, the window tier, the merge
   after the last split) was answered by a per-CTA %globaltimer trace, and
   each trace lived on a throw-away branch that was lost (docs/decode.md,
   sessions 8, 18, 29). Here the marks are in the kernels for good, compiled
   only into trace builds (-DOSCAR_TRACE=1, oscar__nvrtc_options), so the
   kernels of an ordinary context are the same code as without them.

   Buffer layout (OSCAR_K_TRACE_* in oscar_kernels/oscar_params.h): a 16-byte
   header {u32 marks dropped, 12 bytes unused}, then a 16-byte record slot per
   (kernel kind, CTA < oscar__trace_cta_slots, mark), laid out as oscar_trace_record;
   a slot with time 0 holds no mark. Fixed slots instead of an appended list:
   the device then needs no returning atomic (common.cuh, trace_mark). */
#ifndef OSCAR_TRACE_H_INCLUDED
#define OSCAR_TRACE_H_INCLUDED

OSCAR_PARAMS_STATIC_ASSERT(sizeof(oscar_trace_record) == OSCAR_K_TRACE_RECORD_BYTES, "trace record size");
OSCAR_PARAMS_STATIC_ASSERT(offsetof(oscar_trace_record, cta) == 8 && offsetof(oscar_trace_record, sm) == 12 &&
                               offsetof(oscar_trace_record, kernel) == 14 && offsetof(oscar_trace_record, mark) == 15,
                           "trace record layout (the device writes it as two u64)");
OSCAR_PARAMS_STATIC_ASSERT(OSCAR_TRACE_DECODE_PREP == OSCAR_K_TRACE_DECODE_PREP &&
                               OSCAR_TRACE_DECODE_INT2 == OSCAR_K_TRACE_DECODE_INT2 &&
                               OSCAR_TRACE_DECODE_WINDOW == OSCAR_K_TRACE_DECODE_WINDOW &&
                               OSCAR_TRACE_DECODE_MERGE == OSCAR_K_TRACE_DECODE_MERGE &&
                               OSCAR_TRACE_DECODE_MERGE_HEAD == OSCAR_K_TRACE_DECODE_MERGE_HEAD &&
                               OSCAR_TRACE_QUANTIZE == OSCAR_K_TRACE_QUANTIZE &&
                               OSCAR__TRACE_KERNEL_COUNT == OSCAR_K_TRACE_KERNELS + 1,
                           "trace kernel ids");
OSCAR_PARAMS_STATIC_ASSERT(OSCAR_TRACE_ENTRY == OSCAR_K_TRACE_ENTRY && OSCAR_TRACE_WAITED == OSCAR_K_TRACE_WAITED &&
                               OSCAR_TRACE_LOOP_END == OSCAR_K_TRACE_LOOP_END && OSCAR_TRACE_DONE == OSCAR_K_TRACE_DONE &&
                               OSCAR__TRACE_MARK_COUNT == OSCAR_K_TRACE_MARKS,
                           "trace mark ids");
OSCAR_PARAMS_STATIC_ASSERT(OSCAR_TRACE_MIN_RECORDS == OSCAR_K_TRACE_KERNELS * OSCAR_K_TRACE_MARKS,
                           "one slot per kernel kind and mark");

OSCAR__PRIVATE size_t oscar__trace_slot_count(const oscar_ctx *ctx) {
    return OSCAR__CAST(size_t, oscar__trace_cta_slots(ctx)) * OSCAR_K_TRACE_KERNELS * OSCAR_K_TRACE_MARKS;
}
OSCAR__PRIVATE size_t oscar__trace_bytes(const oscar_ctx *ctx) {
    return OSCAR_K_TRACE_HEADER_BYTES + oscar__trace_slot_count(ctx) * OSCAR_K_TRACE_RECORD_BYTES;
}

/* oscar_setup's part, after the device is set up: the buffer, zeroed.
   Nothing to do without a trace or a device. */
OSCAR__PRIVATE oscar_status oscar__trace_setup(oscar_ctx *ctx) {
    oscar__CUresult r;
    if (ctx->desc.trace_records <= 0 || ctx->compile_only) return OSCAR_OK;
    /* failures are oscar_setup's: reported without a context */
    r = ctx->cu.cuCtxPushCurrent(ctx->cuctx);
    if (r != 0) return oscar__cu_fail_as(&ctx->cu, NULL, r, "oscar_setup: cuCtxPushCurrent");
    r = ctx->cu.cuMemAlloc(&ctx->trace_buffer, oscar__trace_bytes(ctx));
    if (r == 0) r = ctx->cu.cuMemsetD8Async(ctx->trace_buffer, 0, oscar__trace_bytes(ctx), NULL);
    if (r == 0) r = ctx->cu.cuCtxSynchronize();
    oscar__pop(ctx);
    if (r != 0) return oscar__cu_fail_as(&ctx->cu, NULL, r, "oscar_setup: the kernel trace buffer (desc.trace_records)");
    return OSCAR_OK;
}

/* oscar__destroy's part; the caller has made the context current. */
OSCAR__PRIVATE void oscar__trace_destroy(oscar_ctx *ctx) {
    if (ctx->trace_buffer) ctx->cu.cuMemFree(ctx->trace_buffer);
    ctx->trace_buffer = 0;
}

OSCAR__PRIVATE oscar_status oscar__trace_check(oscar_ctx *ctx, const char *fn) {
    if (!ctx) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "%s: ctx = NULL", fn);
    if (!ctx->trace_buffer)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                           "%s: this context has no kernel trace (desc.trace_records = %d; it needs > 0 and a device, "
                           "not the CPU backend or a compile-only context)",
                           fn, ctx->desc.trace_records);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_trace_reset(oscar_ctx *ctx, oscar_stream stream) {
    oscar__CUresult r;
    oscar_status st = oscar__trace_check(ctx, "oscar_trace_reset");
    if (st != OSCAR_OK) return st;
    st = oscar__push(ctx);
    if (st != OSCAR_OK) return st;
    r = ctx->cu.cuMemsetD8Async(ctx->trace_buffer, 0, oscar__trace_bytes(ctx), stream);
    oscar__pop(ctx);
    if (r != 0) return oscar__cu_fail(ctx, r, "oscar_trace_reset: cuMemsetD8Async");
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_trace_read(oscar_ctx *ctx, oscar_trace_record *out, int32_t cap, int32_t *out_count,
                                        int32_t *out_dropped) {
    const size_t bytes = ctx && ctx->trace_buffer ? oscar__trace_bytes(ctx) : 0;
    uint8_t *host;
    uint32_t dropped;
    size_t i, n = 0;
    oscar__CUresult r;
    oscar_status st = oscar__trace_check(ctx, "oscar_trace_read");
    if (st != OSCAR_OK) return st;
    if (!out_count || cap < 0 || (cap > 0 && !out))
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                           "oscar_trace_read: cap = %d; expected out_count non-NULL, cap >= 0 and out non-NULL when "
                           "cap > 0",
                           cap);
    host = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, bytes));
    if (!host)
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_trace_read: out of host memory for %zu bytes", bytes);
    st = oscar__push(ctx);
    if (st != OSCAR_OK) {
        oscar__free(ctx, host);
        return st;
    }
    r = ctx->cu.cuMemcpyDtoH(host, ctx->trace_buffer, bytes);
    oscar__pop(ctx);
    if (r != 0) {
        oscar__free(ctx, host);
        return oscar__cu_fail(ctx, r, "oscar_trace_read: cuMemcpyDtoH");
    }
    for (i = 0; i < oscar__trace_slot_count(ctx); i++) {
        oscar_trace_record rec;
        memcpy(&rec, host + OSCAR_K_TRACE_HEADER_BYTES + i * OSCAR_K_TRACE_RECORD_BYTES, sizeof rec);
        if (rec.time_ns == 0) continue;
        if (n < OSCAR__CAST(size_t, cap)) out[n] = rec;
        n++;
    }
    memcpy(&dropped, host, 4);
    oscar__free(ctx, host);
    *out_count = OSCAR__CAST(int32_t, n);
    if (out_dropped) *out_dropped = dropped > 0x7fffffffu ? 0x7fffffff : OSCAR__CAST(int32_t, dropped);
    return OSCAR_OK;
}

OSCAR_API const char *oscar_trace_kernel_name(int32_t kernel) {
    static const char *const names[OSCAR__TRACE_KERNEL_COUNT] = {
        "?", "decode_prep", "decode_int2", "decode_window", "decode_merge", "decode_merge_head", "quantize"};
    return kernel > 0 && kernel < OSCAR__TRACE_KERNEL_COUNT ? names[kernel] : "?";
}

OSCAR_API const char *oscar_trace_mark_name(int32_t mark) {
    static const char *const names[OSCAR__TRACE_MARK_COUNT] = {"entry", "waited", "loop_end", "done"};
    return mark >= 0 && mark < OSCAR__TRACE_MARK_COUNT ? names[mark] : "?";
}

#endif /* OSCAR_TRACE_H_INCLUDED */
