/* tests/test_nvrtc_compile.c -- every kernel instantiation the dispatcher can
   produce compiles with NVRTC for sm_80, sm_89 and sm_90, with no GPU and no
   include path (the kernels include only each other, handed to NVRTC from
   the embedded table). */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

static int programs(const char **out, int cap) {
    int32_t i, n = oscar_jit_instantiation_count();
    int np = 0, j;
    for (i = 0; i < n; i++) {
        const char *prog = NULL, *name = NULL;
        int seen = 0;
        oscar_jit_instantiation(i, &prog, &name);
        for (j = 0; j < np; j++) seen |= strcmp(out[j], prog) == 0;
        if (!seen && np < cap) out[np++] = prog;
    }
    return np;
}

static void compile_everything_for(int sm) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    const char *progs[64];
    int np = programs(progs, 64), i;
    int32_t total = 0;
    desc.compile_only_sm = sm;
    desc.cache_mode = OSCAR_JIT_CACHE_MEMORY_ONLY;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    cr_assert(np >= 1);
    for (i = 0; i < np; i++) {
        int32_t n = 0;
        double t0 = oscar__now_ms();
        oscar_status st = oscar_jit_check_program(ctx, progs[i], &n);
        cr_assert_eq(st, OSCAR_OK, "sm_%d %s: %s", sm, progs[i], oscar_last_error(ctx));
        cr_log_info("sm_%d %s: %d instantiations compiled in %.0f ms", sm, progs[i], n, oscar__now_ms() - t0);
        total += n;
    }
    cr_assert_eq(total, oscar_jit_instantiation_count(), "every registered instantiation was compiled");
    oscar_shutdown(ctx);
}

Test(nvrtc, every_instantiation_sm80, .timeout = 900) { compile_everything_for(80); }
Test(nvrtc, every_instantiation_sm89, .timeout = 900) { compile_everything_for(89); }
Test(nvrtc, every_instantiation_sm90, .timeout = 900) { compile_everything_for(90); }

/* Kernel sources include nothing but each other: no toolkit header, no
   system header, so NVRTC needs no include path on a deployment host. */
Test(nvrtc, sources_are_self_contained) {
    int i;
    for (i = 0; i < OSCAR__NUM_EMBEDDED_SOURCES; i++) {
        const char *p = oscar__embedded_sources[i].text;
        while ((p = strstr(p, "#include")) != NULL) {
            char target[128];
            const char *q = strchr(p, '"');
            const char *line_end = strchr(p, '\n');
            cr_assert(q && (!line_end || q < line_end), "%s: only quoted includes of embedded files are allowed",
                      oscar__embedded_sources[i].name);
            {
                const char *e = strchr(q + 1, '"');
                size_t n = (size_t)(e - q - 1);
                cr_assert(e && n < sizeof target);
                memcpy(target, q + 1, n);
                target[n] = 0;
            }
            cr_assert(oscar__find_source(target) != NULL, "%s includes %s, which is not embedded",
                      oscar__embedded_sources[i].name, target);
            p += 8;
        }
    }
}

Test(nvrtc, options_carry_no_include_path) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    const char *opts[8];
    char arch[32];
    int i, n;
    desc.compile_only_sm = 90;
    desc.cache_mode = OSCAR_JIT_CACHE_MEMORY_ONLY;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    n = oscar__nvrtc_options(ctx, "decode.cuh", arch, opts);
    for (i = 0; i < n; i++) {
        cr_assert(strncmp(opts[i], "-I", 2) != 0 && strncmp(opts[i], "--include-path", 14) != 0, "%s", opts[i]);
        cr_assert(strstr(opts[i], "fast-math") == NULL, "codes need IEEE division: %s", opts[i]);
    }
    oscar_shutdown(ctx);
}

/* quantize.cuh on sm_90 compiles for sm_90a (wgmma rotation); every other
   program, and quantize.cuh on other architectures, for the plain target */
Test(nvrtc, quantize_is_arch_specific_on_sm90_only) {
    static const int sms[] = {80, 89, 90};
    static const char *programs[] = {"quantize.cuh", "decode.cuh", "merge.cuh", "dequant.cuh"};
    int s, k;
    for (s = 0; s < 3; s++) {
        oscar_desc desc = {0};
        oscar_ctx *ctx = NULL;
        const char *opts[8];
        char arch[32], want[32];
        desc.compile_only_sm = sms[s];
        desc.cache_mode = OSCAR_JIT_CACHE_MEMORY_ONLY;
        TU_OK(NULL, oscar_setup(&desc, &ctx));
        for (k = 0; k < 4; k++) {
            oscar__nvrtc_options(ctx, programs[k], arch, opts);
            snprintf(want, sizeof want, "--gpu-architecture=sm_%d%s", sms[s], sms[s] == 90 && k == 0 ? "a" : "");
            cr_assert_str_eq(opts[0], want, "%s on sm_%d", programs[k], sms[s]);
        }
        oscar_shutdown(ctx);
    }
}
