/* jit/oscar_registry.h -- part of the oscar.h implementation.
   The list of every kernel instantiation the dispatcher can produce, built
   once from each family's template parameter space. Tests compile all of them
   for sm_80, sm_89 and sm_90 (oscar_jit_check_program); oscar_jit_prepare and
   the dispatchers look them up by name expression. */
#ifndef OSCAR_REGISTRY_H_INCLUDED
#define OSCAR_REGISTRY_H_INCLUDED

/* Page sizes with a specialised instantiation; any other page size runs the
   PAGE_SIZE = 0 instantiation, which reads the page size at run time. */
static const int oscar__page_sizes[] = {1, 8, 16, 32, 64, 0};
#define OSCAR__NUM_PAGE_SIZES 6
static const int oscar__head_dims[] = {64, 128, 256};
static const int oscar__group_sizes[] = {32, 64, 128, 256};

OSCAR__PRIVATE int oscar__page_template(int32_t page_size) {
    int i;
    for (i = 0; i < OSCAR__NUM_PAGE_SIZES - 1; i++)
        if (oscar__page_sizes[i] == page_size) return page_size;
    return 0;
}

typedef struct oscar__instantiation {
    const char *program;
    char name[192];
} oscar__instantiation;

#define OSCAR__MAX_INSTANTIATIONS 4096
static oscar__instantiation oscar__instances[OSCAR__MAX_INSTANTIATIONS];
static int oscar__num_instances;
static pthread_once_t oscar__registry_once = PTHREAD_ONCE_INIT;

OSCAR__PRIVATE void oscar__registry_add(const char *program, const char *fmt, ...) OSCAR__PRINTF(2, 3);
OSCAR__PRIVATE void oscar__registry_add(const char *program, const char *fmt, ...) {
    va_list ap;
    oscar__instantiation *in;
    if (oscar__num_instances >= OSCAR__MAX_INSTANTIATIONS) return;
    in = &oscar__instances[oscar__num_instances++];
    in->program = program;
    va_start(ap, fmt);
    vsnprintf(in->name, sizeof in->name, fmt, ap);
    va_end(ap);
}

/* Name expressions, one function per family so dispatch and registry agree. */
OSCAR__PRIVATE void oscar__name_dequant(char *out, size_t cap, int head_dim, int group_size, int page_size) {
    snprintf(out, cap, "oscar::dequant_kernel<%d, %d, %d>", head_dim, group_size, oscar__page_template(page_size));
}

/* Families registered by other parts of the implementation (defined later). */
OSCAR__PRIVATE void oscar__registry_build_calib(void);

/* Quantize tile parameters (the autotuner's candidates): rows per warp step
   (16: two lanes per row; 32: one lane per row, not for head dim 256) and
   warps per CTA (4 or 8; head dim 256: 2 or 8, since its R alone fills
   128 KB of shared memory). oscar__quant_tile_valid adds the device's
   shared-memory limit. */
static const int oscar__quant_rows_candidates[] = {16, 32};
static const int oscar__quant_warps_candidates[] = {2, 4, 8};
#define OSCAR__NUM_QUANT_ROWS 2
#define OSCAR__NUM_QUANT_WARPS 3
OSCAR__PRIVATE int oscar__quant_tile_registered(int head_dim, int rows, int warps) {
    if (rows != 16 && rows != 32) return 0;
    if (head_dim == 256) return rows == 16 && (warps == 2 || warps == 8);
    return warps == 4 || warps == 8;
}
OSCAR__PRIVATE void oscar__name_rotation_prepare(char *out, size_t cap, int head_dim, oscar_dtype src) {
    snprintf(out, cap, "oscar::rotation_prepare_kernel<%d, %d>", head_dim, oscar__k_dtype16(src));
}
OSCAR__PRIVATE void oscar__name_quantize(char *out, size_t cap, int head_dim, int group_size, oscar_dtype src, int rows,
                                         int warps) {
    snprintf(out, cap, "oscar::quantize_kernel<%d, %d, %d, %d, %d>", head_dim, group_size,
             oscar__k_dtype16(src), rows, warps);
}

/* Decode specialises the INT2 page size for 1 (SGLang) and 16 (FlashInfer,
   vLLM); any other page size runs PAGE_SIZE = 0 (one division per token). */
OSCAR__PRIVATE int oscar__decode_page_template(int32_t page_size) {
    return page_size == 1 || page_size == 16 ? page_size : 0;
}
OSCAR__PRIVATE int oscar__head_tiles(int32_t group_ratio) { return group_ratio > 8 ? 2 : 1; }
/* The INT2 kernel's HEADS: 4 (q' and p as hi | lo halves of one n-tile), 8 or 16. */
OSCAR__PRIVATE int oscar__int2_heads(int32_t group_ratio) { return group_ratio <= 4 ? 4 : group_ratio <= 8 ? 8 : 16; }
/* The INT2 decode kernel's CTA: warps (4, or OSCAR__DECODE_INT2_WIDE for
   small batches with long contexts), each streaming 32-token tiles through
   4 shared-memory stages; the end-of-CTA combine of its warps' states
   reuses that memory. */
#define OSCAR__DECODE_INT2_TOK 32
#define OSCAR__DECODE_INT2_STAGES 4
#define OSCAR__DECODE_WARPS 4
#define OSCAR__DECODE_INT2_WIDE 16
#define OSCAR__DECODE_INT2_WIDE8 12
/* Warps of the INT2 kernel's one-CTA-per-SM form for a group ratio: 16 at 4
   heads per lane group (4 CTAs of 4 warps fit an SM: 128 registers a thread
   at D 128), 12 at 8 heads (3 CTAs of 4: 149 registers at D 128 since v20,
   164 before; 16 warps at 128 registers were 4-5% slower, session 28),
   none at 16. */
OSCAR__PRIVATE int oscar__decode_int2_wide(int group_ratio) {
    const int h = oscar__int2_heads(group_ratio);
    return h == 4 ? OSCAR__DECODE_INT2_WIDE : h == 8 ? OSCAR__DECODE_INT2_WIDE8 : 0;
}
/* sm_90's shared memory per block (opt-in): the registry's 16-warp set */
#define OSCAR__SM90_MAX_SMEM_OPTIN 232448
/* Shared memory per block (opt-in) a context's kernels may use: the
   device's, else (compile-only contexts) the arch's: 227 KB on sm_90, 163 KB
   on sm_80 / sm_87, 99 KB on sm_86 / sm_89 (CUDA programming guide, compute
   capabilities table). */
OSCAR__PRIVATE int64_t oscar__ctx_smem_limit(const oscar_ctx *ctx) {
    if (ctx->max_smem_optin > 0) return ctx->max_smem_optin;
    return ctx->sm >= 90 ? OSCAR__SM90_MAX_SMEM_OPTIN : ctx->sm == 80 || ctx->sm == 87 ? 166912 : 101376;
}
/* Shared memory of the two attention kernels: the cp.async pipelines, or the
   end-of-CTA combine of the CTA's warps, whichever is larger. */
OSCAR__PRIVATE uint32_t oscar__decode_combine_bytes(int warps, int head_dim, int group_ratio) {
    int nh = oscar__head_tiles(group_ratio);
    return OSCAR__CAST(uint32_t, warps * nh * 8 * (2 + head_dim) * 4);
}
OSCAR__PRIVATE uint32_t oscar__decode_int2_smem(int head_dim, int group_size, int group_ratio, int warps) {
    int q4 = head_dim / 4, sc = 8 * (head_dim / group_size);
    uint32_t pipe = OSCAR__CAST(uint32_t, warps * OSCAR__DECODE_INT2_STAGES * OSCAR__DECODE_INT2_TOK * (2 * q4 + 2 * sc));
    return OSCAR__MAX(pipe, oscar__decode_combine_bytes(warps, head_dim, group_ratio));
}
/* Whether the INT2 kernel exists with `warps` per CTA for this geometry and
   fits smem_limit bytes of shared memory: 4 always; the one-CTA-per-SM form
   (decode_int2_kernel's static_assert) at head dim 64 or 128: 16 warps with
   4 heads per lane group (ratio <= 4), 12 with 8 (ratio 5-8; at D 128 with
   groups of 64 or 128: groups of 32 take the registers past 168), within the
   limit (16 warps at D 128 group 32 need 256 KB: never on sm_90). */
OSCAR__PRIVATE int oscar__decode_int2_warps_exist(int head_dim, int group_size, int group_ratio, int warps,
                                                  int64_t smem_limit) {
    if (warps == OSCAR__DECODE_WARPS) return 1;
    if (warps == 0 || warps != oscar__decode_int2_wide(group_ratio) || head_dim > 128) return 0;
    if (warps == OSCAR__DECODE_INT2_WIDE8 && head_dim == 128 && group_size < 64) return 0;
    return oscar__decode_int2_smem(head_dim, group_size, group_ratio, warps) <= smem_limit;
}
/* The window kernel: head tiles from the group ratio, the cache's dtype, warps per CTA (2 or 4) */
OSCAR__PRIVATE void oscar__name_decode_window(char *out, size_t cap, int head_dim, int group_ratio, int kv_dtype,
                                              int warps) {
    snprintf(out, cap, "oscar::decode_window_kernel<%d, %d, %d, %d>", head_dim, oscar__head_tiles(group_ratio),
             oscar__k_dtype16(OSCAR__CAST(oscar_dtype, kv_dtype)), warps);
}
/* which: 0 prep, 2 INT2, else the per-head merge (the window kernel and the
   per-KV-head merge have their own functions) */
OSCAR__PRIVATE void oscar__name_decode(char *out, size_t cap, int which, int head_dim, int group_size, int page_size,
                                       int group_ratio, int scale_layout) {
    switch (which) {
    case 0:
        snprintf(out, cap, "oscar::decode_prep_kernel<%d, %d, %d>", head_dim, group_size, oscar__int2_heads(group_ratio));
        break;
    case 2:
        snprintf(out, cap, "oscar::decode_int2_kernel<%d, %d, %d, %d, %d>", head_dim, group_size,
                 oscar__decode_page_template(page_size), oscar__int2_heads(group_ratio), scale_layout);
        break;
    default: snprintf(out, cap, "oscar::decode_merge_head_kernel<%d>", head_dim); break;
    }
}
/* The INT2 kernel with `warps` per CTA (the 4-warp one by its usual name) */
OSCAR__PRIVATE void oscar__name_decode_int2(char *out, size_t cap, int head_dim, int group_size, int page_size,
                                            int group_ratio, int scale_layout, int warps) {
    if (warps == OSCAR__DECODE_WARPS)
        oscar__name_decode(out, cap, 2, head_dim, group_size, page_size, group_ratio, scale_layout);
    else
        snprintf(out, cap, "oscar::decode_int2_kernel<%d, %d, %d, %d, %d, %d>", head_dim, group_size,
                 oscar__decode_page_template(page_size), oscar__int2_heads(group_ratio), scale_layout, warps);
}
/* The per-KV-head merge: rows (request, head) per CTA (4, 8 or 16) and CTAs
   per group, each finishing head_dim / dim_split output dims (1, or 4 at 256). */
OSCAR__PRIVATE void oscar__name_decode_merge(char *out, size_t cap, int head_dim, int rows, int dim_split) {
    snprintf(out, cap, "oscar::decode_merge_kernel<%d, %d, %d>", head_dim, rows, dim_split);
}
/* merge_states: one warp per row, rows_per_cta warps per CTA (the tunable
   tile of the merge_states family, tune/oscar_tune.h). */
static const int oscar__merge_rows_per_cta[] = {4, 8, 16};
OSCAR__PRIVATE void oscar__name_merge(char *out, size_t cap, int head_dim, int rows_per_cta) {
    snprintf(out, cap, "oscar::merge_states_kernel<%d, %d>", head_dim, rows_per_cta);
}

OSCAR__PRIVATE void oscar__registry_build(void) {
    int d, g, ps;
    char name[192];
    for (d = 0; d < 3; d++)
        for (g = 0; g < 4; g++) {
            int hd = oscar__head_dims[d], gs = oscar__group_sizes[g];
            if (gs > hd) continue;
            for (ps = 0; ps < OSCAR__NUM_PAGE_SIZES; ps++) {
                oscar__name_dequant(name, sizeof name, hd, gs, oscar__page_sizes[ps]);
                oscar__registry_add("dequant.cuh", "%s", name);
            }
        }
    for (d = 0; d < 3; d++) {
        oscar__name_rotation_prepare(name, sizeof name, oscar__head_dims[d], OSCAR_DTYPE_BF16);
        oscar__registry_add("quantize.cuh", "%s", name);
        oscar__name_rotation_prepare(name, sizeof name, oscar__head_dims[d], OSCAR_DTYPE_F16);
        oscar__registry_add("quantize.cuh", "%s", name);
    }
    for (d = 0; d < 3; d++)
        for (g = 0; g < 4; g++) {
            int hd = oscar__head_dims[d], gs = oscar__group_sizes[g];
            if (gs > hd) continue;
            int ri, wi;
            for (ri = 0; ri < OSCAR__NUM_QUANT_ROWS; ri++)
                for (wi = 0; wi < OSCAR__NUM_QUANT_WARPS; wi++) {
                    int rows = oscar__quant_rows_candidates[ri], warps = oscar__quant_warps_candidates[wi];
                    if (!oscar__quant_tile_registered(hd, rows, warps)) continue;
                    oscar__name_quantize(name, sizeof name, hd, gs, OSCAR_DTYPE_BF16, rows, warps);
                    oscar__registry_add("quantize.cuh", "%s", name);
                    oscar__name_quantize(name, sizeof name, hd, gs, OSCAR_DTYPE_F16, rows, warps);
                    oscar__registry_add("quantize.cuh", "%s", name);
                }
        }
    for (d = 0; d < 3; d++) {
        int hd = oscar__head_dims[d], nh, dt;
        for (nh = 4; nh <= 16; nh *= 2) {
            oscar__name_decode_merge(name, sizeof name, hd, nh, 1);
            oscar__registry_add("decode.cuh", "%s", name);
            if (hd == 256) {
                oscar__name_decode_merge(name, sizeof name, hd, nh, 4);
                oscar__registry_add("decode.cuh", "%s", name);
            }
        }
        oscar__name_decode(name, sizeof name, 4, hd, hd, 1, 1, 0);
        oscar__registry_add("decode.cuh", "%s", name);
        for (nh = 1; nh <= 2; nh++)
            for (dt = 0; dt < 2; dt++) {
                const int kv = dt ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16;
                oscar__name_decode_window(name, sizeof name, hd, nh * 8, kv, 4);
                oscar__registry_add("decode.cuh", "%s", name);
                if (hd == 256 && nh == 1) { /* oscar__decode_window_warps */
                    oscar__name_decode_window(name, sizeof name, hd, nh * 8, kv, 2);
                    oscar__registry_add("decode.cuh", "%s", name);
                }
            }
        for (g = 0; g < 4; g++) {
            static const int pss[3] = {1, 16, 0};
            int gs = oscar__group_sizes[g], pi;
            if (gs > hd) continue;
            for (nh = 4; nh <= 16; nh *= 2) { /* HEADS of the INT2 tier: group ratios <= 4, <= 8, <= 16 */
                oscar__name_decode(name, sizeof name, 0, hd, gs, 1, nh, 0);
                oscar__registry_add("decode.cuh", "%s", name);
                for (pi = 0; pi < 3; pi++) {
                    int sl;
                    for (sl = OSCAR_K_SCALE_F16_SCALE_MIN; sl <= OSCAR_K_SCALE_F32_SCALE_ZERO; sl++) {
                        oscar__name_decode(name, sizeof name, 2, hd, gs, pss[pi], nh, sl);
                        oscar__registry_add("decode.cuh", "%s", name);
                        /* the one-CTA-per-SM form where sm_90 can run it (oscar__decode_int2_warps) */
                        if (oscar__decode_int2_warps_exist(hd, gs, nh, oscar__decode_int2_wide(nh), OSCAR__SM90_MAX_SMEM_OPTIN)) {
                            oscar__name_decode_int2(name, sizeof name, hd, gs, pss[pi], nh, sl, oscar__decode_int2_wide(nh));
                            oscar__registry_add("decode.cuh", "%s", name);
                        }
                    }
                }
            }
        }
        for (g = 0; g < 3; g++) {
            oscar__name_merge(name, sizeof name, hd, oscar__merge_rows_per_cta[g]);
            oscar__registry_add("merge.cuh", "%s", name);
        }
    }
    oscar__registry_add("probe.cuh", "oscar::probe_read_kernel<4>");
    oscar__registry_build_calib();
}

OSCAR__PRIVATE void oscar__registry_init(void) { pthread_once(&oscar__registry_once, oscar__registry_build); }

OSCAR_API int32_t oscar_jit_instantiation_count(void) {
    oscar__registry_init();
    return oscar__num_instances;
}

OSCAR_API oscar_status oscar_jit_instantiation(int32_t index, const char **out_program,
                                               const char **out_name_expression) {
    oscar__registry_init();
    if (index < 0 || index >= oscar__num_instances || !out_program || !out_name_expression)
        return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT,
                           "oscar_jit_instantiation: index = %d; expected 0 <= index < %d and non-NULL outputs",
                           OSCAR__CAST(int, index), oscar__num_instances);
    *out_program = oscar__instances[index].program;
    *out_name_expression = oscar__instances[index].name;
    return OSCAR_OK;
}

OSCAR__PRIVATE oscar_status oscar__require_jit(const oscar_ctx *ctx, const char *func) {
    if (!ctx) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "%s: ctx = NULL", func);
    if (ctx->backend == OSCAR_BACKEND_CPU)
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED, "%s: the CPU backend has no JIT", func);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_jit_prepare(oscar_ctx *ctx, int32_t index) {
    oscar__kernel *k;
    oscar_status st = oscar__require_jit(ctx, "oscar_jit_prepare");
    if (st != OSCAR_OK) return st;
    oscar__registry_init();
    if (index < 0 || index >= oscar__num_instances)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_jit_prepare: index = %d; expected 0 <= index < %d",
                           OSCAR__CAST(int, index), oscar__num_instances);
    return oscar__jit_get(ctx, oscar__instances[index].program, oscar__instances[index].name, &k);
}

OSCAR_API oscar_status oscar_jit_check_program(oscar_ctx *ctx, const char *program, int32_t *out_num_checked) {
    const char **names;
    char **lowered, *cubin = NULL;
    size_t size = 0;
    int i, n = 0;
    oscar_status st = oscar__require_jit(ctx, "oscar_jit_check_program");
    if (st != OSCAR_OK) return st;
    if (!program) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_jit_check_program: program = NULL");
    oscar__registry_init();
    names = OSCAR__CAST(const char **, oscar__calloc(ctx, sizeof(char *) * OSCAR__CAST(size_t, oscar__num_instances)));
    lowered = OSCAR__CAST(char **, oscar__calloc(ctx, sizeof(char *) * OSCAR__CAST(size_t, oscar__num_instances)));
    if (!names || !lowered) {
        oscar__free(ctx, OSCAR__CAST(void *, names));
        oscar__free(ctx, lowered);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_jit_check_program: out of memory");
    }
    for (i = 0; i < oscar__num_instances; i++)
        if (strcmp(oscar__instances[i].program, program) == 0) names[n++] = oscar__instances[i].name;
    if (n == 0) {
        st = oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                         "oscar_jit_check_program: program = \"%s\"; no instantiation uses it", program);
    } else {
        pthread_mutex_lock(&ctx->lock);
        st = oscar__nvrtc_compile(ctx, program, names, n, &cubin, &size, lowered);
        pthread_mutex_unlock(&ctx->lock);
    }
    for (i = 0; i < n; i++) oscar__free(ctx, lowered[i]);
    oscar__free(ctx, cubin);
    oscar__free(ctx, OSCAR__CAST(void *, names));
    oscar__free(ctx, lowered);
    if (out_num_checked) *out_num_checked = n;
    return st;
}

#endif /* OSCAR_REGISTRY_H_INCLUDED */
