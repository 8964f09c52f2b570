/* tests/test_jit_cache.c -- the JIT's memory and disk caches, in compile-only
   contexts (no GPU needed): key stability, atomic publish, corrupted and torn
   entries recompiled, two processes into one empty cache, the miss-is-error
   switch, and the compile-error path with its log. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

#include <dirent.h>
#include <sys/wait.h>

static oscar_ctx *ctx_for(const char *dir, int sm, oscar_jit_cache_mode mode) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    desc.compile_only_sm = sm;
    desc.cache_dir = dir;
    desc.cache_mode = mode;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    return ctx;
}

/* index of an instantiation by its exact name expression */
static int32_t instantiation_index(const char *name_expr) {
    int32_t i, n = oscar_jit_instantiation_count();
    for (i = 0; i < n; i++) {
        const char *prog = NULL, *name = NULL;
        oscar_jit_instantiation(i, &prog, &name);
        if (strcmp(name, name_expr) == 0) return i;
    }
    cr_assert_fail("instantiation %s not registered", name_expr);
    return -1;
}

/* index of the instantiation "oscar::dequant_kernel<128, 128, 16>" */
static int32_t dequant_index(void) { return instantiation_index("oscar::dequant_kernel<128, 128, 16>"); }

/* Counts files in dir whose name contains `part`; returns the last match. */
static int count_files(const char *dir, const char *part, char *last, size_t cap) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    cr_assert(d != NULL);
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, part)) {
            n++;
            if (last) snprintf(last, cap, "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    return n;
}

static int file_contains(const char *path, const char *s);

/* Counts cache entries (names ending in ".cubin") -- those holding the bytes
   of `holding` when it is set; returns the last one counted. */
static int count_entries_holding(const char *dir, const char *holding, char *last, size_t cap) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[1024];
    int n = 0;
    cr_assert(d != NULL);
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 6 && strcmp(e->d_name + len - 6, ".cubin") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (holding && !file_contains(path, holding)) continue;
            n++;
            if (last) snprintf(last, cap, "%s", path);
        }
    }
    closedir(d);
    return n;
}
static int count_entries(const char *dir, char *last, size_t cap) { return count_entries_holding(dir, NULL, last, cap); }

static oscar_jit_stats stats_of(oscar_ctx *ctx) {
    oscar_jit_stats s;
    TU_OK(ctx, oscar_query_jit_stats(ctx, &s));
    return s;
}

Test(jit_cache, key_is_stable_and_covers_its_inputs) {
    oscar_ctx *a = ctx_for(NULL, 90, OSCAR_JIT_CACHE_MEMORY_ONLY), *b = ctx_for(NULL, 90, OSCAR_JIT_CACHE_MEMORY_ONLY);
    oscar_ctx *c = ctx_for(NULL, 80, OSCAR_JIT_CACHE_MEMORY_ONLY);
    uint8_t k1[32], k2[32], k3[32], k4[32];
    oscar__jit_key(a, "dequant.cuh", "oscar::dequant_kernel<128, 128, 16>", k1);
    oscar__jit_key(b, "dequant.cuh", "oscar::dequant_kernel<128, 128, 16>", k2);
    oscar__jit_key(a, "dequant.cuh", "oscar::dequant_kernel<128, 64, 16>", k3);
    oscar__jit_key(c, "dequant.cuh", "oscar::dequant_kernel<128, 128, 16>", k4);
    cr_assert(memcmp(k1, k2, 32) == 0, "same inputs, same key");
    cr_assert(memcmp(k1, k3, 32) != 0, "name expression is in the key");
    cr_assert(memcmp(k1, k4, 32) != 0, "target arch is in the key");
    oscar_shutdown(a);
    oscar_shutdown(b);
    oscar_shutdown(c);
}

Test(jit_cache, cold_then_warm_and_atomic_publish) {
    char dir[256], entry[1024];
    oscar_ctx *a, *b;
    oscar_jit_stats s;
    oscar_jit_kernel_info info[4];
    int32_t n = 0;
    FILE *f;
    char magic[8];
    tu_tempdir(dir, sizeof dir, "jit");
    a = ctx_for(dir, 90, OSCAR_JIT_CACHE_DEFAULT);
    TU_OK(a, oscar_jit_prepare(a, dequant_index()));
    TU_OK(a, oscar_jit_prepare(a, dequant_index()));
    s = stats_of(a);
    cr_assert_eq(s.compiles, 1);
    cr_assert_eq(s.memory_hits, 1);
    cr_assert_eq(s.disk_hits, 0);
    /* published: exactly one entry named with arch and NVRTC version, no temp file left */
    cr_assert_eq(count_files(dir, ".sm90.nvrtc", entry, sizeof entry), 2, "entry + its lock file");
    cr_assert_eq(count_entries(dir, entry, sizeof entry), 1);
    cr_assert_eq(count_files(dir, ".tmp.", NULL, 0), 0);
    f = fopen(entry, "rb");
    cr_assert(f && fread(magic, 1, 8, f) == 8 && memcmp(magic, "OSCARJIT", 8) == 0);
    fclose(f);
    b = ctx_for(dir, 90, OSCAR_JIT_CACHE_DEFAULT);
    TU_OK(b, oscar_jit_prepare(b, dequant_index()));
    s = stats_of(b);
    cr_assert_eq(s.compiles, 0);
    cr_assert_eq(s.disk_hits, 1);
    TU_OK(b, oscar_query_jit_kernels(b, info, 4, &n));
    cr_assert_eq(n, 1);
    cr_assert_eq(info[0].origin, 2);
    cr_log_info("dequant_kernel<128,128,16> sm_90: cold %.1f ms (NVRTC), warm %.2f ms (disk)", stats_of(a).compile_ms,
                s.disk_load_ms);
    oscar_shutdown(a);
    oscar_shutdown(b);
    tu_rmtree(dir);
}

static void damage(const char *path, int truncate_half) {
    FILE *f = fopen(path, "r+b");
    long size;
    cr_assert(f != NULL);
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    if (truncate_half) {
        fclose(f);
        cr_assert(truncate(path, size / 2) == 0);
        return;
    }
    fseek(f, size - 100, SEEK_SET);
    fputc(0x5a ^ fgetc(f), f); /* not necessarily the same byte: still a change */
    fseek(f, size - 101, SEEK_SET);
    {
        int c = fgetc(f);
        fseek(f, size - 101, SEEK_SET);
        fputc(c ^ 0xff, f);
    }
    fclose(f);
}

static void corrupted_entry_is_recompiled(int truncate_half) {
    char dir[256], entry[1024];
    oscar_ctx *a, *b, *c;
    oscar_jit_stats s;
    tu_tempdir(dir, sizeof dir, "corrupt");
    a = ctx_for(dir, 90, OSCAR_JIT_CACHE_DEFAULT);
    TU_OK(a, oscar_jit_prepare(a, dequant_index()));
    oscar_shutdown(a);
    cr_assert_eq(count_entries(dir, entry, sizeof entry), 1);
    damage(entry, truncate_half);
    b = ctx_for(dir, 90, OSCAR_JIT_CACHE_DEFAULT);
    TU_OK(b, oscar_jit_prepare(b, dequant_index()));
    s = stats_of(b);
    cr_assert_eq(s.disk_rejects, 1, "the bad entry was detected");
    cr_assert_eq(s.disk_hits, 0, "and never loaded");
    cr_assert_eq(s.compiles, 1, "but recompiled");
    oscar_shutdown(b);
    c = ctx_for(dir, 90, OSCAR_JIT_CACHE_DEFAULT);
    TU_OK(c, oscar_jit_prepare(c, dequant_index()));
    s = stats_of(c);
    cr_assert_eq(s.disk_hits, 1, "the rewritten entry is good");
    cr_assert_eq(s.disk_rejects, 0);
    oscar_shutdown(c);
    tu_rmtree(dir);
}

Test(jit_cache, corrupted_entry_is_recompiled) { corrupted_entry_is_recompiled(0); }
Test(jit_cache, torn_entry_is_recompiled) { corrupted_entry_is_recompiled(1); }

Test(jit_cache, two_processes_into_one_empty_cache) {
    char dir[256];
    pid_t kids[2];
    int i, status;
    oscar_ctx *c;
    tu_tempdir(dir, sizeof dir, "race");
    for (i = 0; i < 2; i++) {
        kids[i] = fork();
        cr_assert(kids[i] >= 0);
        if (kids[i] == 0) {
            oscar_desc desc = {0};
            oscar_ctx *ctx = NULL;
            desc.compile_only_sm = 90;
            desc.cache_dir = dir;
            if (oscar_setup(&desc, &ctx) != OSCAR_OK) _exit(10);
            if (oscar_jit_prepare(ctx, dequant_index()) != OSCAR_OK) _exit(11);
            oscar_shutdown(ctx);
            _exit(0);
        }
    }
    for (i = 0; i < 2; i++) {
        cr_assert(waitpid(kids[i], &status, 0) == kids[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d exit %d", i, WEXITSTATUS(status));
    }
    cr_assert_eq(count_entries(dir, NULL, 0), 1);
    cr_assert_eq(count_files(dir, ".tmp.", NULL, 0), 0);
    c = ctx_for(dir, 90, OSCAR_JIT_CACHE_CACHED_ONLY);
    TU_OK(c, oscar_jit_prepare(c, dequant_index()));
    cr_assert_eq(stats_of(c).disk_hits, 1);
    oscar_shutdown(c);
    tu_rmtree(dir);
}

Test(jit_cache, miss_is_an_error_when_asked) {
    char dir[256];
    oscar_ctx *a, *b, *c;
    oscar_status st;
    tu_tempdir(dir, sizeof dir, "cachedonly");
    a = ctx_for(dir, 90, OSCAR_JIT_CACHE_CACHED_ONLY);
    st = oscar_jit_prepare(a, dequant_index());
    cr_assert_eq(st, OSCAR_STATUS_JIT_CACHE_MISS, "%s", oscar_last_error(a));
    cr_assert(strstr(oscar_last_error(a), "oscar::dequant_kernel<128, 128, 16>") != NULL, "%s", oscar_last_error(a));
    cr_assert_eq(stats_of(a).compiles, 0);
    oscar_shutdown(a);
    /* the environment switch does the same */
    setenv("OSCAR_JIT_DISABLE", "1", 1);
    b = ctx_for(dir, 90, OSCAR_JIT_CACHE_DEFAULT);
    cr_assert_eq(oscar_jit_prepare(b, dequant_index()), OSCAR_STATUS_JIT_CACHE_MISS);
    oscar_shutdown(b);
    unsetenv("OSCAR_JIT_DISABLE");
    /* once the cache holds it, the strict mode succeeds */
    c = ctx_for(dir, 90, OSCAR_JIT_CACHE_DEFAULT);
    TU_OK(c, oscar_jit_prepare(c, dequant_index()));
    oscar_shutdown(c);
    a = ctx_for(dir, 90, OSCAR_JIT_CACHE_CACHED_ONLY);
    TU_OK(a, oscar_jit_prepare(a, dequant_index()));
    cr_assert_eq(stats_of(a).disk_hits, 1);
    oscar_shutdown(a);
    tu_rmtree(dir);
}

Test(jit_cache, compile_error_returns_the_log) {
    oscar_ctx *ctx = ctx_for(NULL, 90, OSCAR_JIT_CACHE_MEMORY_ONLY);
    oscar__kernel *k = NULL;
    /* head dim 96 trips the kernel's static_assert */
    oscar_status st = oscar__jit_get(ctx, "dequant.cuh", "oscar::dequant_kernel<96, 32, 1>", &k);
    const char *msg = oscar_last_error(ctx);
    cr_assert_eq(st, OSCAR_STATUS_JIT_COMPILE_FAILED, "%s", msg);
    cr_assert(k == NULL);
    cr_assert(strstr(msg, "dequant.cuh") != NULL, "program named: %s", msg);
    cr_assert(strstr(msg, "oscar::dequant_kernel<96, 32, 1>") != NULL, "name expression named: %s", msg);
    cr_assert(strstr(msg, "--gpu-architecture=sm_90") != NULL, "options named: %s", msg);
    cr_assert(strstr(oscar_jit_log(ctx), "head dim") != NULL, "full log kept: %s", oscar_jit_log(ctx));
    cr_assert(strstr(msg, "head dim") != NULL, "log in the sentence: %s", msg);
    oscar_shutdown(ctx);
}

/* 1 when the file holds the bytes of s (a symbol name in a cached cubin) */
static int file_contains(const char *path, const char *s) {
    FILE *f = fopen(path, "rb");
    long size;
    char *buf;
    int found;
    cr_assert(f != NULL, "open %s", path);
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = tu_xmalloc((size_t)size);
    cr_assert(fread(buf, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    found = memmem(buf, (size_t)size, s, strlen(s)) != NULL;
    free(buf);
    return found;
}

/* The kernel trace (desc.trace_records > 0): its builds are their own cache
   entries (-DOSCAR_TRACE=1 is in the key), every traced kernel family compiles
   for sm_90 and sm_80 and its cubin carries the oscar_trace constant the host
   points at the trace buffer, while a plain build of the same
   instantiation has none of it; a compile-only context has no buffer to
   reset or read. */
Test(jit_cache, trace_builds_are_their_own_entries, .timeout = 600) {
    static const char *const traced_kernels[] = {
        "oscar::decode_prep_kernel<128, 128, 4>",    "oscar::decode_int2_kernel<128, 128, 16, 4, 1>",
        "oscar::decode_window_kernel<128, 1, 1, 4>", "oscar::decode_merge_kernel<128, 4, 1>",
        "oscar::decode_merge_head_kernel<128>",      "oscar::quantize_kernel<128, 128, 1, 32, 4>"};
    enum { NK = sizeof traced_kernels / sizeof traced_kernels[0] };
    static const int sms[2] = {90, 80};
    char dir_plain[256], entry[1024];
    uint8_t k_plain[32], k_traced[32];
    oscar_trace_record rec[1];
    int32_t count = 0;
    int a, i;
    oscar_ctx *plain;
    tu_tempdir(dir_plain, sizeof dir_plain, "jit-plain");
    plain = ctx_for(dir_plain, 90, OSCAR_JIT_CACHE_DEFAULT);
    TU_OK(plain, oscar_jit_prepare(plain, instantiation_index(traced_kernels[1])));
    cr_assert_eq(count_entries(dir_plain, entry, sizeof entry), 1);
    cr_assert(!file_contains(entry, "oscar_trace"), "a plain build carries the trace");
    for (a = 0; a < 2; a++) {
        oscar_desc desc = {0};
        oscar_ctx *traced = NULL;
        char dir[256];
        tu_tempdir(dir, sizeof dir, "jit-trace");
        desc.compile_only_sm = sms[a];
        desc.cache_dir = dir;
        desc.trace_records = 1024;
        TU_OK(NULL, oscar_setup(&desc, &traced));
        if (sms[a] == 90) {
            oscar__jit_key(plain, "decode.cuh", traced_kernels[1], k_plain);
            oscar__jit_key(traced, "decode.cuh", traced_kernels[1], k_traced);
            cr_assert(memcmp(k_plain, k_traced, 32) != 0, "the trace is in the key");
        }
        for (i = 0; i < NK; i++) {
            int before = count_entries(dir, NULL, 0);
            TU_OK(traced, oscar_jit_prepare(traced, instantiation_index(traced_kernels[i])));
            cr_assert_eq(count_entries(dir, NULL, 0), before + 1, "%s: one new entry", traced_kernels[i]);
        }
        cr_assert_eq(count_entries_holding(dir, "oscar_trace", NULL, 0), NK, "sm_%d: every traced entry has the trace",
                     sms[a]);
        cr_assert_eq(oscar_trace_reset(traced, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(oscar_trace_read(traced, rec, 1, &count, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(oscar_last_error(traced), "compile-only") != NULL, "%s", oscar_last_error(traced));
        oscar_shutdown(traced);
        tu_rmtree(dir);
    }
    oscar_shutdown(plain);
    tu_rmtree(dir_plain);
}
