/* tests/test_setup.c -- context set-up on every path (no driver, stub driver,
   compile-only, CPU), descriptor validation, pool defaults and logging. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

Test(setup, no_driver_gives_status_and_sentence) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_status st;
    unsetenv("OSCAR_CUDA_PATH");
    st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_OK) {
        oscar_shutdown(ctx);
        cr_skip_test("a CUDA driver and device are present here; the no-driver path runs on GPU-less CI");
    }
    cr_assert(ctx == NULL);
    cr_assert(st == OSCAR_STATUS_NO_DRIVER || st == OSCAR_STATUS_NO_DEVICE, "status %s: %s", oscar_status_string(st),
              oscar_last_error(NULL));
    if (st == OSCAR_STATUS_NO_DRIVER)
        cr_assert(strstr(oscar_last_error(NULL), "libcuda") != NULL, "message: %s", oscar_last_error(NULL));
    cr_assert(strlen(oscar_last_error(NULL)) > 20);
}

Test(setup, missing_driver_path_is_named) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_status st;
    desc.cuda_library_path = "/nonexistent/oscar/libcuda.so.1";
    st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_OK) {
        oscar_shutdown(ctx);
        cr_skip_test("a system libcuda was found after the missing path; covered on GPU-less CI");
    }
    cr_assert_eq(st, OSCAR_STATUS_NO_DRIVER, "%s", oscar_last_error(NULL));
    cr_assert(strstr(oscar_last_error(NULL), "/nonexistent/oscar/libcuda.so.1") != NULL, "message: %s",
              oscar_last_error(NULL));
}

Test(setup, stub_driver_is_reported_not_crashed) {
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_status st;
    if (access(stub, R_OK) != 0) cr_skip_test("no toolkit stub libcuda at %s", stub);
    desc.cuda_library_path = stub;
    st = oscar_setup(&desc, &ctx);
    cr_assert_eq(st, OSCAR_STATUS_NO_DRIVER, "%s: %s", oscar_status_string(st), oscar_last_error(NULL));
    cr_assert(strstr(oscar_last_error(NULL), "stub") != NULL, "message: %s", oscar_last_error(NULL));
    cr_assert(ctx == NULL);
}

Test(setup, compile_only_needs_no_driver) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_ctx_info info;
    desc.compile_only_sm = 89;
    desc.cache_mode = OSCAR_JIT_CACHE_MEMORY_ONLY;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    TU_OK(ctx, oscar_query_ctx_info(ctx, &info));
    cr_assert_eq(info.compile_only, 1);
    cr_assert_eq(info.sm, 89);
    cr_assert_eq(info.device_ordinal, -1);
    cr_assert(info.nvrtc_version >= 12000, "nvrtc version %d", info.nvrtc_version);
    cr_assert_str_empty(info.cache_dir);
    oscar_shutdown(ctx);
}

Test(setup, cpu_backend) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_ctx_info info;
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    TU_OK(ctx, oscar_query_ctx_info(ctx, &info));
    cr_assert_eq(info.backend, OSCAR_BACKEND_CPU);
    cr_assert_eq(info.sm, 0);
    cr_assert_eq(oscar_jit_prepare(ctx, 0), OSCAR_STATUS_UNSUPPORTED);
    oscar_shutdown(ctx);
}

Test(setup, validation_names_every_bad_field) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_status st;
    desc.backend = (oscar_backend)99;
    desc.compile_only_sm = 70;
    st = oscar_setup(&desc, &ctx);
    cr_assert_eq(st, OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(NULL), "desc.backend = 99") != NULL, "%s", oscar_last_error(NULL));
    cr_assert(strstr(oscar_last_error(NULL), "desc.compile_only_sm = 70") != NULL, "%s", oscar_last_error(NULL));
    cr_assert(ctx == NULL);
}

/* desc.trace_records: 0, or a count in OSCAR_TRACE_MIN_RECORDS..
   OSCAR_TRACE_MAX_RECORDS, and only with the CUDA backend; a context without
   a trace (CPU here) reads none. */
Test(setup, trace_records_validated) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_trace_record rec[1];
    int32_t count = 0;
    desc.compile_only_sm = 90;
    desc.trace_records = -1;
    cr_assert_eq(oscar_setup(&desc, &ctx), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(NULL), "desc.trace_records = -1") != NULL, "%s", oscar_last_error(NULL));
    desc.trace_records = OSCAR_TRACE_MIN_RECORDS - 1;
    cr_assert_eq(oscar_setup(&desc, &ctx), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(NULL), "desc.trace_records = 23") != NULL, "%s", oscar_last_error(NULL));
    desc.trace_records = OSCAR_TRACE_MAX_RECORDS + 1;
    cr_assert_eq(oscar_setup(&desc, &ctx), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(NULL), "desc.trace_records = 16777217") != NULL, "%s", oscar_last_error(NULL));
    desc.compile_only_sm = 0;
    desc.backend = OSCAR_BACKEND_CPU;
    desc.trace_records = 64;
    cr_assert_eq(oscar_setup(&desc, &ctx), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(NULL), "CPU backend") != NULL, "%s", oscar_last_error(NULL));
    cr_assert(ctx == NULL);
    desc.trace_records = 0;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    cr_assert_eq(oscar_trace_read(ctx, rec, 1, &count, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "desc.trace_records = 0") != NULL, "%s", oscar_last_error(ctx));
    cr_assert_eq(oscar_trace_reset(NULL, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(oscar_trace_kernel_name(OSCAR_TRACE_DECODE_INT2), "decode_int2");
    cr_assert_str_eq(oscar_trace_mark_name(OSCAR_TRACE_LOOP_END), "loop_end");
    cr_assert_str_eq(oscar_trace_kernel_name(99), "?");
    cr_assert_str_eq(oscar_trace_mark_name(-1), "?");
    oscar_shutdown(ctx);
}

Test(setup, canary_catches_uninitialised_desc) {
    oscar_desc desc;
    oscar_ctx *ctx = NULL;
    memset(&desc, 0, sizeof desc);
    desc.backend = OSCAR_BACKEND_CPU;
    desc._end_canary = 0xdeadbeef;
    cr_assert_eq(oscar_setup(&desc, &ctx), OSCAR_STATUS_INVALID_DESC);
    cr_assert(strstr(oscar_last_error(NULL), "_end_canary") != NULL, "%s", oscar_last_error(NULL));
    cr_assert_eq(oscar_setup(NULL, &ctx), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(oscar_setup(&desc, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
}

static int tu_log_calls;
static char tu_log_last[512];
static void tu_logger(const char *tag, uint32_t level, uint32_t item, const char *msg, uint32_t line, const char *file,
                      void *user) {
    (void)tag, (void)line, (void)file, (void)user;
    if (level == 1 && item != 0) {
        tu_log_calls++;
        snprintf(tu_log_last, sizeof tu_log_last, "%s", msg ? msg : "");
    }
}

Test(setup, logger_receives_errors) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_int2_pool_desc pool = {0};
    oscar_dequant_desc dq = {0};
    desc.backend = OSCAR_BACKEND_CPU;
    desc.logger.func = tu_logger;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    pool.head_dim = 96;
    pool.num_kv_heads = 8;
    pool.num_pages = 4;
    cr_assert_eq(oscar_dequantize_kv(ctx, &pool, &dq, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_log_calls, 1);
    cr_assert(strstr(tu_log_last, "pool.head_dim = 96; expected 64, 128 or 256") != NULL, "%s", tu_log_last);
    cr_assert_str_eq(oscar_last_error(ctx), tu_log_last);
    oscar_shutdown(ctx);
}

Test(pool, defaults_fill_contiguous_strides) {
    oscar_int2_pool_desc in = {0}, out;
    size_t code_bytes = 0, scale_bytes = 0;
    in.head_dim = 128;
    in.num_kv_heads = 8;
    in.num_pages = 10;
    in.page_size = 16;
    TU_OK(NULL, oscar_query_int2_pool_defaults(NULL, &in, &out));
    cr_assert_eq(out.group_size, 128);
    cr_assert_eq(out.scale_layout, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN);
    cr_assert_eq(out.layout, OSCAR_KV_LAYOUT_NHD);
    cr_assert_eq(out.codes_head_stride_bytes, 32);
    cr_assert_eq(out.codes_token_stride_bytes, 32 * 8);
    cr_assert_eq(out.codes_page_stride_bytes, 32 * 8 * 16);
    cr_assert_eq(out.scales_head_stride_bytes, 4);
    in.layout = OSCAR_KV_LAYOUT_HND;
    in.group_size = 32;
    in.scale_layout = OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO;
    TU_OK(NULL, oscar_query_int2_pool_defaults(NULL, &in, &out));
    cr_assert_eq(out.codes_token_stride_bytes, 32);
    cr_assert_eq(out.codes_head_stride_bytes, 32 * 16);
    cr_assert_eq(out.scales_token_stride_bytes, 4 * 8);
    cr_assert_eq(out.scales_head_stride_bytes, 4 * 8 * 16);
    TU_OK(NULL, oscar_int2_pool_bytes(NULL, &in, &code_bytes, &scale_bytes));
    cr_assert_eq(code_bytes, (size_t)10 * 16 * 8 * 32);
    cr_assert_eq(scale_bytes, (size_t)10 * 16 * 8 * 32);
}
