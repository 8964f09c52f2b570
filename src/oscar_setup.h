/* src/oscar_setup.h -- part of the oscar.h implementation: context creation
   (device, compile-only or CPU), shutdown, context and JIT queries. */
#ifndef OSCAR_SETUP_H_INCLUDED
#define OSCAR_SETUP_H_INCLUDED

/* Lowest arch the kernels are written for (mma.sync bf16, cp.async, ldmatrix). */
#define OSCAR__MIN_SM 80

OSCAR__PRIVATE void oscar__resolve_cache_dir(oscar_ctx *ctx) {
    const char *env_dir = getenv("OSCAR_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    const char *no_disk = getenv("OSCAR_JIT_NO_DISK");
    ctx->cache_dir[0] = 0;
    if (ctx->desc.cache_mode == OSCAR_JIT_CACHE_MEMORY_ONLY || (no_disk && no_disk[0] && no_disk[0] != '0')) return;
    if (ctx->desc.cache_dir && ctx->desc.cache_dir[0])
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", ctx->desc.cache_dir);
    else if (env_dir && env_dir[0])
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", env_dir);
    else if (xdg && xdg[0])
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s/oscar/%s", xdg, OSCAR_VERSION_STRING);
    else if (home && home[0])
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s/.cache/oscar/%s", home, OSCAR_VERSION_STRING);
    if (ctx->cache_dir[0] && oscar__mkdirs(ctx->cache_dir) != 0) {
        oscar__info(ctx, "jit cache: cannot create %s (%s); caching in memory only", ctx->cache_dir, strerror(errno));
        ctx->cache_dir[0] = 0;
    }
}

OSCAR__PRIVATE void oscar__destroy(oscar_ctx *ctx) {
    int i;
    if (!ctx) return;
    if (ctx->cuctx && ctx->cu.cuCtxPushCurrent) {
        if (ctx->cu.cuCtxPushCurrent(ctx->cuctx) == 0) {
            oscar__trace_destroy(ctx);
            for (i = 0; i < ctx->num_kernels; i++)
                if (ctx->kernels[i]->module) ctx->cu.cuModuleUnload(ctx->kernels[i]->module);
            oscar__pop(ctx);
        }
        ctx->cu.cuDevicePrimaryCtxRelease(ctx->device);
    }
    for (i = 0; i < ctx->num_kernels; i++) {
        oscar__free(ctx, ctx->kernels[i]->name_expression);
        oscar__free(ctx, ctx->kernels[i]->program);
        oscar__free(ctx, ctx->kernels[i]->lowered_name);
        oscar__free(ctx, ctx->kernels[i]);
    }
    oscar__free(ctx, ctx->kernels);
    oscar__free(ctx, ctx->jit_log);
    oscar__tune_destroy(ctx);
    if (ctx->nvrtc.lib) dlclose(ctx->nvrtc.lib);
    if (ctx->cu.lib) dlclose(ctx->cu.lib);
    pthread_mutex_destroy(&ctx->lock);
    {
        oscar_allocator a = ctx->desc.allocator;
        if (a.free_fn)
            a.free_fn(ctx, a.user_data);
        else
            OSCAR_FREE(ctx);
    }
}

OSCAR__PRIVATE oscar_status oscar__setup_device(oscar_ctx *ctx) {
    oscar__CUresult r;
    int count = 0, major = 0, minor = 0, v = 0;
    oscar_status st = oscar__load_cuda(ctx);
    if (st != OSCAR_OK) return st;
    r = ctx->cu.cuInit(0);
    if (r != 0) {
        const char *name = NULL;
        ctx->cu.cuGetErrorName(r, &name);
        if (r == OSCAR__CUDA_ERROR_NO_DEVICE)
            return oscar__fail(NULL, OSCAR_STATUS_NO_DEVICE, "oscar_setup: cuInit found no CUDA device (%s)",
                               name ? name : "?");
        return oscar__fail(NULL, OSCAR_STATUS_NO_DRIVER,
                           "oscar_setup: cuInit failed with %s (%d)%s; use desc.compile_only_sm or OSCAR_BACKEND_CPU "
                           "on a machine without a usable driver",
                           name ? name : "?", r,
                           r == OSCAR__CUDA_ERROR_STUB_LIBRARY ? " -- the loaded libcuda is the toolkit's stub" : "");
    }
    ctx->cu.cuDriverGetVersion(&ctx->driver_version);
    r = ctx->cu.cuDeviceGetCount(&count);
    if (r != 0 || count == 0)
        return oscar__fail(NULL, OSCAR_STATUS_NO_DEVICE, "oscar_setup: the driver reports no CUDA device");
    if (ctx->desc.device_ordinal < 0 || ctx->desc.device_ordinal >= count)
        return oscar__fail(NULL, OSCAR_STATUS_NO_DEVICE, "oscar_setup: desc.device_ordinal = %d; expected 0..%d",
                           ctx->desc.device_ordinal, count - 1);
    ctx->device_ordinal = ctx->desc.device_ordinal;
    r = ctx->cu.cuDeviceGet(&ctx->device, ctx->device_ordinal);
    if (r != 0) return oscar__cu_fail_as(&ctx->cu, NULL, r, "oscar_setup: cuDeviceGet");
    ctx->cu.cuDeviceGetAttribute(&major, OSCAR__CU_ATTR_CC_MAJOR, ctx->device);
    ctx->cu.cuDeviceGetAttribute(&minor, OSCAR__CU_ATTR_CC_MINOR, ctx->device);
    ctx->cu.cuDeviceGetAttribute(&v, OSCAR__CU_ATTR_MULTIPROCESSOR_COUNT, ctx->device);
    ctx->num_sms = v;
    ctx->cu.cuDeviceGetAttribute(&v, OSCAR__CU_ATTR_L2_CACHE_SIZE, ctx->device);
    ctx->l2_bytes = v;
    ctx->cu.cuDeviceGetAttribute(&v, OSCAR__CU_ATTR_MAX_SMEM_OPTIN, ctx->device);
    ctx->max_smem_optin = v;
    ctx->cu.cuDeviceGetName(ctx->device_name, sizeof ctx->device_name, ctx->device);
    ctx->sm = major * 10 + minor;
    if (ctx->sm < OSCAR__MIN_SM)
        return oscar__fail(NULL, OSCAR_STATUS_UNSUPPORTED,
                           "oscar_setup: device %d (%s) is sm_%d; oscar needs sm_%d or newer (Ampere+)",
                           ctx->device_ordinal, ctx->device_name, ctx->sm, OSCAR__MIN_SM);
    r = ctx->cu.cuDevicePrimaryCtxRetain(&ctx->cuctx, ctx->device);
    if (r != 0) {
        ctx->cuctx = NULL;
        return oscar__cu_fail_as(&ctx->cu, NULL, r, "oscar_setup: cuDevicePrimaryCtxRetain");
    }
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_setup(const oscar_desc *desc, oscar_ctx **out_ctx) {
    oscar__validator v;
    oscar_ctx *ctx;
    oscar_status st;
    const char *jit_disable = getenv("OSCAR_JIT_DISABLE");

    oscar__clear_error(NULL);
    if (!out_ctx) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_setup: out_ctx = NULL");
    *out_ctx = NULL;
    if (!desc) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_setup: desc = NULL");
    oscar__validate_begin(&v, NULL, "oscar_setup");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, desc->backend >= 0 && desc->backend < OSCAR__BACKEND_COUNT,
                    "desc.backend = %d; expected OSCAR_BACKEND_CUDA or OSCAR_BACKEND_CPU", OSCAR__CAST(int, desc->backend));
    OSCAR__VALIDATE(&v, desc->device_ordinal >= 0, "desc.device_ordinal = %d; expected >= 0", desc->device_ordinal);
    OSCAR__VALIDATE(&v, desc->compile_only_sm == 0 || desc->compile_only_sm >= OSCAR__MIN_SM,
                    "desc.compile_only_sm = %d; expected 0 (use the device) or an arch >= %d such as 80, 89, 90",
                    desc->compile_only_sm, OSCAR__MIN_SM);
    OSCAR__VALIDATE(&v, desc->cache_mode >= 0 && desc->cache_mode < OSCAR__JIT_CACHE_COUNT,
                    "desc.cache_mode = %d; expected an oscar_jit_cache_mode", OSCAR__CAST(int, desc->cache_mode));
    OSCAR__VALIDATE(&v, (desc->allocator.alloc_fn == NULL) == (desc->allocator.free_fn == NULL),
                    "desc.allocator: alloc_fn and free_fn must be set together");
    OSCAR__VALIDATE(&v,
                    desc->trace_records == 0 ||
                        (desc->trace_records >= OSCAR_TRACE_MIN_RECORDS && desc->trace_records <= OSCAR_TRACE_MAX_RECORDS),
                    "desc.trace_records = %d; expected 0 (no kernel trace) or %d (a slot per kind of kernel and mark) "
                    "to %d",
                    desc->trace_records, OSCAR_TRACE_MIN_RECORDS, OSCAR_TRACE_MAX_RECORDS);
    OSCAR__VALIDATE(&v, desc->trace_records == 0 || desc->backend != OSCAR_BACKEND_CPU,
                    "desc.trace_records = %d with the CPU backend; the kernel trace needs OSCAR_BACKEND_CUDA (the CPU "
                    "backend runs no kernels)",
                    desc->trace_records);
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;

    if (desc->allocator.alloc_fn)
        ctx = OSCAR__CAST(oscar_ctx *, desc->allocator.alloc_fn(sizeof(oscar_ctx), desc->allocator.user_data));
    else
        ctx = OSCAR__CAST(oscar_ctx *, OSCAR_MALLOC(sizeof(oscar_ctx)));
    if (!ctx) return oscar__fail(NULL, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_setup: out of memory for the context");
    memset(ctx, 0, sizeof *ctx);
    ctx->desc = *desc;
    ctx->desc.backend = oscar__def(desc->backend, OSCAR_BACKEND_CUDA);
    if (jit_disable && jit_disable[0] && jit_disable[0] != '0') ctx->desc.cache_mode = OSCAR_JIT_CACHE_CACHED_ONLY;
    /* the strings are not kept: read now, copied where needed */
    ctx->desc.cuda_library_path = NULL;
    ctx->desc.nvrtc_library_path = NULL;
    ctx->desc.cache_dir = NULL;
    ctx->desc.tune_table_path = NULL; /* read from desc by oscar__tune_setup */
    ctx->backend = ctx->desc.backend;
    ctx->device_ordinal = -1;
    pthread_mutex_init(&ctx->lock, NULL);

    if (ctx->backend == OSCAR_BACKEND_CPU) {
        snprintf(ctx->device_name, sizeof ctx->device_name, "cpu");
        *out_ctx = ctx;
        return OSCAR_OK;
    }
    ctx->desc.cuda_library_path = desc->cuda_library_path;
    ctx->desc.nvrtc_library_path = desc->nvrtc_library_path;
    ctx->desc.cache_dir = desc->cache_dir;
    if (desc->compile_only_sm) {
        ctx->compile_only = 1;
        ctx->sm = desc->compile_only_sm;
        snprintf(ctx->device_name, sizeof ctx->device_name, "compile-only sm_%d", ctx->sm);
        st = OSCAR_OK;
    } else {
        st = oscar__setup_device(ctx);
    }
    if (st == OSCAR_OK) st = oscar__load_nvrtc(ctx);
    if (st == OSCAR_OK) st = oscar__trace_setup(ctx);
    if (st == OSCAR_OK) oscar__resolve_cache_dir(ctx);
    if (st == OSCAR_OK) oscar__tune_setup(ctx, desc->tune_table_path); /* never fails setup */
    ctx->desc.cuda_library_path = NULL;
    ctx->desc.nvrtc_library_path = NULL;
    ctx->desc.cache_dir = NULL;
    if (st != OSCAR_OK) {
        oscar__destroy(ctx);
        return st;
    }
    *out_ctx = ctx;
    return OSCAR_OK;
}

OSCAR_API void oscar_shutdown(oscar_ctx *ctx) { oscar__destroy(ctx); }

OSCAR_API oscar_status oscar_query_ctx_info(const oscar_ctx *ctx, oscar_ctx_info *out) {
    if (!ctx || !out)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_query_ctx_info: ctx and out must be non-NULL");
    memset(out, 0, sizeof *out);
    out->backend = ctx->backend;
    out->device_ordinal = ctx->device_ordinal;
    out->sm = ctx->sm;
    out->num_sms = ctx->num_sms;
    out->compile_only = ctx->compile_only;
    out->nvrtc_version = ctx->nvrtc_major * 1000 + ctx->nvrtc_minor * 10;
    out->driver_version = ctx->driver_version;
    snprintf(out->device_name, sizeof out->device_name, "%s", ctx->device_name);
    snprintf(out->cache_dir, sizeof out->cache_dir, "%s", ctx->cache_dir);
    return OSCAR_OK;
}

OSCAR_API const char *oscar_jit_log(const oscar_ctx *ctx) {
    if (!ctx || !ctx->jit_log) return "";
    return ctx->jit_log;
}

OSCAR_API oscar_status oscar_query_jit_stats(const oscar_ctx *ctx, oscar_jit_stats *out) {
    if (!ctx || !out)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_query_jit_stats: ctx and out must be non-NULL");
    pthread_mutex_lock(&OSCAR__UNCONST(oscar_ctx *, ctx)->lock);
    *out = ctx->stats;
    pthread_mutex_unlock(&OSCAR__UNCONST(oscar_ctx *, ctx)->lock);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_query_jit_kernels(const oscar_ctx *ctx, oscar_jit_kernel_info *out, int32_t cap,
                                               int32_t *out_count) {
    int i;
    if (!ctx || !out_count || (cap > 0 && !out))
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                           "oscar_query_jit_kernels: ctx, out_count (and out when cap > 0) must be non-NULL");
    pthread_mutex_lock(&OSCAR__UNCONST(oscar_ctx *, ctx)->lock);
    for (i = 0; i < ctx->num_kernels && i < cap; i++) out[i] = ctx->kernels[i]->info;
    *out_count = ctx->num_kernels;
    pthread_mutex_unlock(&OSCAR__UNCONST(oscar_ctx *, ctx)->lock);
    return OSCAR_OK;
}

#endif /* OSCAR_SETUP_H_INCLUDED */
