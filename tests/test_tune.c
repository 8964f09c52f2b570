/* tests/test_tune.c -- the autotuner without a GPU: candidate enumeration and
   validity rules, bucket keys, the table file (round trip, malformed files,
   foreign provenance, stale kernel sources, atomic writes), where a context
   finds its table, plans taking the table's splits (compile-only sm_90
   context; the decode kernels are compiled, or loaded from the disk cache),
   and the quantize tile taken from the table or the heuristic. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- logger capture --------------------------------------------------------- */
static char log_text[16384];
static void capture(const char *tag, uint32_t level, uint32_t item, const char *msg, uint32_t line, const char *file,
                    void *user) {
    size_t n = strlen(log_text);
    (void)tag, (void)item, (void)line, (void)file, (void)user;
    snprintf(log_text + n, sizeof log_text - n, "[%u] %s\n", level, msg ? msg : "");
}

static char tmp_dir[256];
static void make_tmp_dir(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/oscar_test_tune_XXXXXX");
    cr_assert(mkdtemp(tmp_dir) != NULL, "mkdtemp");
}
static void remove_tmp_dir(void) {
    DIR *d = opendir(tmp_dir);
    struct dirent *e;
    char p[600];
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmp_dir);
}
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    cr_assert(d != NULL);
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}
static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}
static char *read_text(const char *path) {
    static char buf[65536];
    FILE *f = fopen(path, "rb");
    size_t n;
    cr_assert(f != NULL, "cannot read %s", path);
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* A compile-only sm_90 context whose table file is `table` (NULL: none). */
static oscar_ctx *compile_only_ctx(const char *table) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_status st;
    desc.compile_only_sm = 90;
    desc.tune_table_path = table;
    desc.logger.func = capture;
    st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_STATUS_NO_NVRTC) cr_skip_test("NVRTC not found: %s", oscar_last_error(NULL));
    cr_assert(st == OSCAR_OK, "oscar_setup: %s", oscar_last_error(NULL));
    return ctx;
}

/* The provenance line a compile-only sm_90 context accepts (its NVRTC). */
static void provenance_line(oscar_ctx *ctx, char *out, size_t cap, int cc, const char *version) {
    oscar_ctx_info info;
    TU_OK(ctx, oscar_query_ctx_info(ctx, &info));
    snprintf(out, cap,
             "provenance gpu=\"NVIDIA H200\" sms=132 cc=%d nvrtc=%d oscar=\"%s\" date=\"2026-05-20T10:00:00Z\" tuning_s=12.5\n",
             cc, info.nvrtc_version, version);
}

/* ---- families, candidates, buckets ---------------------------------------- */
Test(tune, candidates_follow_the_validity_rules) {
    int32_t key[OSCAR__TUNE_MAX_KEYS], c[OSCAR__TUNE_MAX_CANDIDATES];
    int n, i;
    /* bench shape 1 x 8K: 7872 INT2 tokens (bucket 8192), 320 window tokens (bucket 512) */
    oscar__tune_decode_key(key, 128, 128, 16, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 320, 1, 7872);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, c);
    cr_assert_eq(n, 8, "8192 tokens allow 1..128 INT2 splits, got %d", n);
    for (i = 0; i < n; i++) cr_assert_eq(c[i], 1 << i);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_WINDOW_SPLITS, c);
    cr_assert_eq(n, 5, "a 512 window bucket allows 1..16 window splits (16 tokens each), got %d", n);
    cr_assert_eq(c[4], 16);
    /* 50 INT2 tokens (bucket 64): at least 32 tokens per split -> 1, 2 */
    oscar__tune_decode_key(key, 128, 128, 16, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 20, 1, 50);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, c);
    cr_assert(n == 2 && c[0] == 1 && c[1] == 2, "64-token bucket: {1, 2}, got %d candidates", n);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_WINDOW_SPLITS, c);
    cr_assert(n == 2 && c[1] == 2, "32-token window bucket: {1, 2}, got %d", n);
    /* tiers that do not exist have nothing to tune */
    oscar__tune_decode_key(key, 128, 128, 16, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 0, 8, 0);
    cr_assert_eq(oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, c), 0);
    cr_assert_eq(oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_WINDOW_SPLITS, c), 0);
    /* split counts: any count from 1 to the list's largest is valid (a table
       may pin one between the grid's powers of two), nothing beyond */
    oscar__tune_decode_key(key, 128, 128, 16, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 320, 1, 1 << 20);
    cr_assert(oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, 3));
    cr_assert(oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, 25));
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, 0));
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, 129));
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, 256));
    cr_assert(oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, 128));
    cr_assert(oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_WINDOW_SPLITS, 3));
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_WINDOW_SPLITS, 17));
    /* ... and the grid still enumerates the powers of two only */
    cr_assert_eq(oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, c), 8);
    /* unlisted values of the other parameters are never valid */
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_REQUESTS_PER_CTA, 3));
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_DECODE, key, 7, 1), "no parameter 7");
    /* requests per prep / merge CTA: requests x heads per KV head <= 16 rows, at most the bucket's batch */
    oscar__tune_decode_key(key, 128, 128, 16, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 320, 32, 32448);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_REQUESTS_PER_CTA, c);
    cr_assert(n == 3 && c[0] == 1 && c[1] == 2 && c[2] == 4, "ratio 4: {1, 2, 4}, got %d", n);
    oscar__tune_decode_key(key, 128, 128, 16, 1, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 320, 32, 32448);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_REQUESTS_PER_CTA, c);
    cr_assert(n == 5 && c[4] == 16, "ratio 1: {1 .. 16}, got %d", n);
    oscar__tune_decode_key(key, 128, 128, 16, 16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 320, 32, 32448);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_REQUESTS_PER_CTA, c);
    cr_assert(n == 1 && c[0] == 1, "ratio 16: {1}, got %d", n);
    oscar__tune_decode_key(key, 128, 128, 16, 1, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 320, 2, 32448);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_REQUESTS_PER_CTA, c);
    cr_assert(n == 2 && c[1] == 2, "batch 2: {1, 2}, got %d", n);
    /* merge_states: three tiles, all valid */
    oscar__tune_merge_key(key, 128, 2, OSCAR_DTYPE_BF16, 1000);
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_MERGE_STATES, key, OSCAR__TP_MRG_ROWS_PER_CTA, c);
    cr_assert(n == 3 && c[0] == 4 && c[1] == 8 && c[2] == 16, "merge rows_per_cta {4, 8, 16}, got %d", n);
}

Test(tune, quantize_candidates_per_class) {
    static const struct {
        int head_dim, group, n;
        int32_t rows[4], warps[4];
    } want[] = {
        {64, 32, 4, {16, 16, 32, 32}, {4, 8, 4, 8}},
        {128, 128, 4, {16, 16, 32, 32}, {4, 8, 4, 8}},
        {128, 32, 4, {16, 16, 32, 32}, {4, 8, 4, 8}},
        {256, 256, 2, {16, 16}, {2, 8}}, /* one lane holds half a row of 256: 16 rows; R fills 128 KB: 2 or 8 warps */
    };
    const oscar__tune_family_def *f = &oscar__tune_families[OSCAR_TUNE_FAMILY_QUANTIZE];
    int32_t key[OSCAR__TUNE_MAX_KEYS], c[OSCAR__TUNE_MAX_CANDIDATES], r[OSCAR__TUNE_MAX_CANDIDATES], w[OSCAR__TUNE_MAX_CANDIDATES];
    size_t i;
    int j, n, rot, clip;
    cr_assert_str_eq(f->name, "quantize");
    cr_assert_eq(f->num_params, 2);
    cr_assert_str_eq(f->params[OSCAR__TP_QNT_ROWS_PER_WARP].name, "rows_per_warp");
    cr_assert_str_eq(f->params[OSCAR__TP_QNT_WARPS_PER_CTA].name, "warps_per_cta");
    /* the family's lists are the registry's (jit/oscar_registry.h) */
    cr_assert_eq(f->params[0].num_candidates, OSCAR__NUM_QUANT_ROWS);
    cr_assert_eq(f->params[1].num_candidates, OSCAR__NUM_QUANT_WARPS);
    for (j = 0; j < OSCAR__NUM_QUANT_ROWS; j++) cr_assert_eq(f->params[0].candidates[j], oscar__quant_rows_candidates[j]);
    for (j = 0; j < OSCAR__NUM_QUANT_WARPS; j++) cr_assert_eq(f->params[1].candidates[j], oscar__quant_warps_candidates[j]);
    for (i = 0; i < sizeof want / sizeof want[0]; i++)
        for (rot = 0; rot <= 2; rot++)
            for (clip = 0; clip <= 2; clip += 2) {
                /* the classes differ in the work per row, not in which tiles exist */
                oscar__tune_quant_key(key, want[i].head_dim, want[i].group, rot ? OSCAR_DTYPE_BF16 : OSCAR_DTYPE_F16,
                                      OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, rot, clip, 5000);
                n = oscar__tune_quant_tiles(key, r, w);
                cr_assert_eq(n, want[i].n, "head_dim %d: %d tiles", want[i].head_dim, n);
                for (j = 0; j < n; j++) {
                    cr_assert(r[j] == want[i].rows[j] && w[j] == want[i].warps[j], "head_dim %d tile %d: %d x %d",
                              want[i].head_dim, j, r[j], w[j]);
                    cr_assert(oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_QUANTIZE, key, OSCAR__TP_QNT_ROWS_PER_WARP, r[j]));
                    cr_assert(oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_QUANTIZE, key, OSCAR__TP_QNT_WARPS_PER_CTA, w[j]));
                }
            }
    /* per parameter: head dim 256 has no 32-row step and no 4-warp CTA; the others no 2-warp CTA */
    oscar__tune_quant_key(key, 256, 256, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2, 1 << 20);
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_QUANTIZE, key, OSCAR__TP_QNT_ROWS_PER_WARP, 32));
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_QUANTIZE, key, OSCAR__TP_QNT_WARPS_PER_CTA, 4));
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_QUANTIZE, key, OSCAR__TP_QNT_WARPS_PER_CTA, c);
    cr_assert(n == 2 && c[0] == 2 && c[1] == 8, "head dim 256 warps {2, 8}, got %d", n);
    oscar__tune_quant_key(key, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2, 1 << 20);
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_QUANTIZE, key, OSCAR__TP_QNT_WARPS_PER_CTA, 2));
    cr_assert(!oscar__tune_candidate_valid(OSCAR_TUNE_FAMILY_QUANTIZE, key, OSCAR__TP_QNT_ROWS_PER_WARP, 64), "unlisted");
    n = oscar__tune_candidates(OSCAR_TUNE_FAMILY_QUANTIZE, key, OSCAR__TP_QNT_ROWS_PER_WARP, c);
    cr_assert(n == 2 && c[0] == 16 && c[1] == 32);
    /* every candidate tile is an instantiation the registry compiles (test_nvrtc_compile compiles them all) */
    for (i = 0; i < sizeof want / sizeof want[0]; i++)
        for (j = 0; j < want[i].n; j++) {
            char name[128];
            int k, found = 0;
            oscar__name_quantize(name, sizeof name, want[i].head_dim, want[i].group, OSCAR_DTYPE_F16, want[i].rows[j],
                                 want[i].warps[j]);
            for (k = 0; k < oscar_jit_instantiation_count() && !found; k++) {
                const char *prog = NULL, *nm = NULL;
                TU_OK(NULL, oscar_jit_instantiation(k, &prog, &nm));
                found = strcmp(nm, name) == 0 && strcmp(prog, "quantize.cuh") == 0;
            }
            cr_assert(found, "%s is not in the registry", name);
        }
}

Test(tune, the_merge_tiles_are_registered) {
    /* every candidate must be an instantiation (test_nvrtc_compile compiles them all) */
    int i, j, found;
    for (j = 0; j < oscar__tune_families[OSCAR_TUNE_FAMILY_MERGE_STATES].params[0].num_candidates; j++) {
        char want[96];
        snprintf(want, sizeof want, "oscar::merge_states_kernel<128, %d>",
                 oscar__tune_families[OSCAR_TUNE_FAMILY_MERGE_STATES].params[0].candidates[j]);
        found = 0;
        for (i = 0; i < oscar_jit_instantiation_count(); i++) {
            const char *prog = NULL, *name = NULL;
            TU_OK(NULL, oscar_jit_instantiation(i, &prog, &name));
            found |= strcmp(name, want) == 0 && strcmp(prog, "merge.cuh") == 0;
        }
        cr_assert(found, "%s is not in the registry", want);
    }
}

Test(tune, bucket_keys) {
    int32_t key[OSCAR__TUNE_MAX_KEYS];
    char text[256];
    cr_assert_eq(oscar__tune_pow2_bucket(0), 0);
    cr_assert_eq(oscar__tune_pow2_bucket(1), 1);
    cr_assert_eq(oscar__tune_pow2_bucket(3), 4);
    cr_assert_eq(oscar__tune_pow2_bucket(4), 4);
    cr_assert_eq(oscar__tune_pow2_bucket(7872), 8192);
    cr_assert_eq(oscar__tune_pow2_bucket(32448), 32768);
    cr_assert_eq(oscar__tune_pow2_bucket(130752), 131072);
    /* bench_decode's 8 x 32K: 32448 INT2 + 320 window tokens per request */
    oscar__tune_decode_key(key, 128, 128, 16, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 320, 8, 32448);
    oscar__tune_key_text(OSCAR_TUNE_FAMILY_DECODE, key, text, sizeof text);
    cr_assert_str_eq(text, "head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=8 context=32768");
    /* batch 5 and 8 share a bucket; 9 does not; the page size is exact */
    {
        int32_t k5[OSCAR__TUNE_MAX_KEYS], k9[OSCAR__TUNE_MAX_KEYS], kp[OSCAR__TUNE_MAX_KEYS];
        oscar__tune_decode_key(k5, 128, 128, 16, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 300, 5, 20000);
        oscar__tune_decode_key(k9, 128, 128, 16, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 300, 9, 20000);
        oscar__tune_decode_key(kp, 128, 128, 15, 4, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 300, 8, 20000);
        cr_assert(memcmp(k5, key, sizeof key) == 0);
        cr_assert(memcmp(k9, key, sizeof key) != 0);
        cr_assert(memcmp(kp, key, sizeof key) != 0);
    }
    oscar__tune_merge_key(key, 64, 3, OSCAR_DTYPE_F16, 1000);
    oscar__tune_key_text(OSCAR_TUNE_FAMILY_MERGE_STATES, key, text, sizeof text);
    cr_assert_str_eq(text, "head_dim=64 states=3 dtype=f16 rows=1024");
    /* quantize: rows of the launch = tokens x KV heads x 2 (K, V) x layers, next power of two, capped at 2^20.
       bench_quantize's prefill (128K tokens x 8 heads, K+V rotated and clipped): 2^21 rows -> the cap */
    oscar__tune_quant_key(key, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2,
                          131072LL * 8 * 2);
    oscar__tune_key_text(OSCAR_TUNE_FAMILY_QUANTIZE, key, text, sizeof text);
    cr_assert_str_eq(text, "head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=uniform rotated=2 clipped=2 rows=1048576");
    /* its demotions (8 tokens per request x 8 heads x 2 x 36 layers; K rotated, V absorbed) */
    {
        static const int64_t req[3] = {1, 32, 256}, bucket[3] = {8192, 262144, 1048576};
        int i;
        for (i = 0; i < 3; i++) {
            char want[256];
            oscar__tune_quant_key(key, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 1,
                                  2, req[i] * 8 * 8 * 2 * 36);
            oscar__tune_key_text(OSCAR_TUNE_FAMILY_QUANTIZE, key, text, sizeof text);
            snprintf(want, sizeof want,
                     "head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=uniform rotated=1 clipped=2 rows=%lld",
                     (long long)bucket[i]);
            cr_assert_str_eq(text, want);
        }
    }
    oscar__tune_quant_key(key, 64, 32, OSCAR_DTYPE_F16, OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO, OSCAR_QUANT_MODE_LLOYD_MAX, 0, 0, 1);
    oscar__tune_key_text(OSCAR_TUNE_FAMILY_QUANTIZE, key, text, sizeof text);
    cr_assert_str_eq(text, "head_dim=64 group=32 dtype=f16 scale=f32_scale_zero mode=lloyd_max rotated=0 clipped=0 rows=1");
    {
        /* 5000 and 8192 rows share a bucket, 8193 does not; every field is part of the key */
        int32_t a[OSCAR__TUNE_MAX_KEYS], b[OSCAR__TUNE_MAX_KEYS];
        oscar__tune_quant_key(a, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2, 5000);
        oscar__tune_quant_key(b, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2, 8192);
        cr_assert(memcmp(a, b, sizeof a) == 0);
        oscar__tune_quant_key(b, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2, 8193);
        cr_assert(memcmp(a, b, sizeof a) != 0);
        oscar__tune_quant_key(b, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 0, 5000);
        cr_assert(memcmp(a, b, sizeof a) != 0, "clipped is part of the key");
        oscar__tune_quant_key(b, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 1, 2, 5000);
        cr_assert(memcmp(a, b, sizeof a) != 0, "rotated is part of the key");
        oscar__tune_quant_key(b, 128, 128, OSCAR_DTYPE_F16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2, 5000);
        cr_assert(memcmp(a, b, sizeof a) != 0, "src is part of the key");
        oscar__tune_quant_key(b, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2, 1LL << 40);
        cr_assert_eq(b[OSCAR__TK_QNT_ROWS], 1 << 20, "capped");
        cr_assert(oscar__tune_key_value_ok(OSCAR_TUNE_FAMILY_QUANTIZE, OSCAR__TK_QNT_ROWS, 1 << 20));
        cr_assert(!oscar__tune_key_value_ok(OSCAR_TUNE_FAMILY_QUANTIZE, OSCAR__TK_QNT_ROWS, 1 << 21));
    }
}

/* ---- the file -------------------------------------------------------------------- */
/* A valid table for ctx (compile-only sm_90): two decode entries, one merge
   entry, two quantize entries (a tuned tile; the heuristic won). */
#define QNT_PREFILL_BUCKET "head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=uniform rotated=2 clipped=2 rows=1048576"
#define QNT_DEMOTE_BUCKET "head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=uniform rotated=1 clipped=2 rows=8192"
static void valid_table(oscar_ctx *ctx, char *out, size_t cap) {
    char prov[512], dsrc[17], msrc[17], qsrc[17];
    provenance_line(ctx, prov, sizeof prov, 90, OSCAR_VERSION_STRING);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_DECODE, dsrc);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_MERGE_STATES, msrc);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_QUANTIZE, qsrc);
    snprintf(out, cap,
             "# a comment\n"
             "oscar-tune-table format=1\n"
             "%s"
             "\n"
             "decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=1 context=8192 src=%s "
             "int2_splits=9 window_splits=3 default_us=71.100 tuned_us=60.250\n"
             "  decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=8 context=32768 "
             "src=%s default_us=476.000 tuned_us=476.000\r\n"
             "merge_states head_dim=128 states=2 dtype=bf16 rows=256 src=%s rows_per_cta=16\n"
             "quantize " QNT_PREFILL_BUCKET " src=%s rows_per_warp=16 warps_per_cta=4 default_us=615.000 tuned_us=600.500\n"
             "quantize " QNT_DEMOTE_BUCKET " src=%s default_us=20.000 tuned_us=20.000\n",
             prov, dsrc, dsrc, msrc, qsrc, qsrc);
}

Test(tune, table_round_trip) {
    char text[4096], path[600], path2[600], *first;
    oscar_ctx *ctx, *ctx2;
    oscar_tune_info info;
    oscar__tune_table *a, *b;
    int i;
    make_tmp_dir();
    snprintf(path, sizeof path, "%s/table.txt", tmp_dir);
    snprintf(path2, sizeof path2, "%s/table2.txt", tmp_dir);
    ctx = compile_only_ctx(NULL);
    valid_table(ctx, text, sizeof text);
    write_text(path, text);
    oscar_shutdown(ctx);
    log_text[0] = 0;
    ctx = compile_only_ctx(path);
    TU_OK(ctx, oscar_query_tune_info(ctx, &info));
    cr_assert_str_eq(info.path, path);
    cr_assert(info.has_table && info.num_entries == 5, "has %d, %d entries; log:\n%s", info.has_table, info.num_entries,
              log_text);
    cr_assert_str_eq(info.provenance.gpu_name, "NVIDIA H200");
    cr_assert_eq(info.provenance.num_sms, 132);
    cr_assert_eq(info.provenance.sm, 90);
    cr_assert_str_eq(info.provenance.date, "2026-05-20T10:00:00Z");
    cr_assert_float_eq(info.provenance.tuning_seconds, 12.5, 1e-9);
    /* write, read, equal: the tables, and the bytes of a second write */
    TU_OK(ctx, oscar_tune_table_save(ctx, path2));
    ctx2 = compile_only_ctx(path2);
    a = ctx->tune->user, b = ctx2->tune->user;
    cr_assert(a && b && a->num_entries == b->num_entries);
    cr_assert(memcmp(&a->prov, &b->prov, sizeof a->prov) == 0, "provenance differs after a round trip");
    for (i = 0; i < a->num_entries; i++) {
        cr_assert_eq(a->entries[i].family, b->entries[i].family);
        cr_assert(memcmp(a->entries[i].key, b->entries[i].key, sizeof a->entries[i].key) == 0);
        cr_assert_eq(a->entries[i].params_set, b->entries[i].params_set);
        cr_assert(memcmp(a->entries[i].params, b->entries[i].params, sizeof a->entries[i].params) == 0);
        cr_assert_float_eq(a->entries[i].default_us, b->entries[i].default_us, 1e-9);
        cr_assert_float_eq(a->entries[i].tuned_us, b->entries[i].tuned_us, 1e-9);
        cr_assert_str_eq(a->entries[i].src, b->entries[i].src);
    }
    cr_assert_eq(a->entries[0].params[OSCAR__TP_DEC_INT2_SPLITS], 9);
    cr_assert_eq(a->entries[0].params[OSCAR__TP_DEC_WINDOW_SPLITS], 3);
    cr_assert_eq(a->entries[1].params_set, 0u, "an entry without parameters keeps the heuristic");
    cr_assert_eq(a->entries[2].params[OSCAR__TP_MRG_ROWS_PER_CTA], 16);
    cr_assert_eq(a->entries[3].family, OSCAR_TUNE_FAMILY_QUANTIZE);
    cr_assert_eq(a->entries[3].key[OSCAR__TK_QNT_ROWS], 1 << 20);
    cr_assert_eq(a->entries[3].key[OSCAR__TK_QNT_ROTATED], 2);
    cr_assert_eq(a->entries[3].key[OSCAR__TK_QNT_MODE], OSCAR_QUANT_MODE_UNIFORM);
    cr_assert_eq(a->entries[3].params[OSCAR__TP_QNT_ROWS_PER_WARP], 16);
    cr_assert_eq(a->entries[3].params[OSCAR__TP_QNT_WARPS_PER_CTA], 4);
    cr_assert_float_eq(a->entries[3].tuned_us, 600.5, 1e-9);
    cr_assert_eq(a->entries[4].params_set, 0u);
    first = strdup(read_text(path2));
    TU_OK(ctx2, oscar_tune_table_save(ctx2, NULL)); /* NULL: its own path */
    cr_assert_str_eq(read_text(path2), first, "a second write differs");
    cr_assert(strstr(first, "int2_splits=9 window_splits=3") && strstr(first, "gpu=\"NVIDIA H200\""), "%s", first);
    cr_assert(strstr(first, "quantize " QNT_PREFILL_BUCKET " src=") && strstr(first, "rows_per_warp=16 warps_per_cta=4"), "%s",
              first);
    free(first);
    oscar_shutdown(ctx2);
    oscar_shutdown(ctx);
    remove_tmp_dir();
}

Test(tune, malformed_files_are_rejected_with_the_line) {
    static const char *const bad[][2] = {
        {"decode head_dim=128\n", ":1: the first record"},
        {"oscar-tune-table format=2\n", "format=1"},
        {"oscar-tune-table format=1\ndecode head_dim=128\n", "before the provenance"},
        {"oscar-tune-table format=1\n@PROV@bogus x=1\n", ":3: unknown record"},
        /* 300 splits: more than 128, and than the 8K bucket's 256 steps of 32 tokens */
        {"oscar-tune-table format=1\n@PROV@@DEC@ int2_splits=300\n", "int2_splits = 300 is not a valid candidate"},
        /* 8 requests: above the bucket's batch of 1 (and 8 x 4 heads per KV head = 32 rows > 16) */
        {"oscar-tune-table format=1\n@PROV@@DEC@ requests_per_cta=8\n", "requests_per_cta = 8 is not a valid candidate"},
        {"oscar-tune-table format=1\n@PROV@@DEC@ int2_splits=x\n", "expected an integer"},
        {"oscar-tune-table format=1\n@PROV@@DEC@ int2_splits=8 int2_splits=8\n", "appears twice"},
        {"oscar-tune-table format=1\n@PROV@@DEC@ tile=3\n", "no field \"tile\""},
        {"oscar-tune-table format=1\n@PROV@@DEC@ int2_splits\n", "not key=value"},
        {"oscar-tune-table format=1\n@PROV@@DEC@ default_us=-5\n", "default_us"},
        {"oscar-tune-table format=1\n@PROV@decode head_dim=128 src=0123456789abcdef\n", "lacks its bucket field group"},
        {"oscar-tune-table format=1\n@PROV@@DEC@\n@DEC@\n", ":4: a second decode entry"},
        {"oscar-tune-table format=1\n@PROV@decode head_dim=96 group=32 page=16 ratio=4 scale=f16_scale_min window=512 batch=1 "
         "context=8192 src=0123456789abcdef\n", "head_dim = \"96\" is not a bucket value"},
        {"oscar-tune-table format=1\n@PROV@decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=3 "
         "context=8192 src=0123456789abcdef\n", "batch = \"3\" is not a bucket value"},
        {"oscar-tune-table format=1\n@PROV@decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=1 "
         "context=8192\n", "lacks src"},
        {"oscar-tune-table format=1\nprovenance gpu=\"H200 sms=1\n", "no closing quote"},
        {"oscar-tune-table format=1\nprovenance gpu=H200\n", "provenance lacks sms"},
        {"oscar-tune-table format=1\n@PROV@@PROV@", "a second provenance"},
        {"oscar-tune-table format=1\n", "no provenance record"},
        {"", "no \"oscar-tune-table\" header"},
        {"oscar-tune-table format=1\n\x01\x02\n", ":2: control character"},
        /* quantize: head dim 256 has no 32-row tile and no 4-warp CTA */
        {"oscar-tune-table format=1\n@PROV@@QNT@ rows_per_warp=32\n", "rows_per_warp = 32 is not a valid candidate"},
        {"oscar-tune-table format=1\n@PROV@@QNT@ warps_per_cta=4\n", "warps_per_cta = 4 is not a valid candidate"},
        {"oscar-tune-table format=1\n@PROV@@QNT@ rows_per_warp=16 warps_per_cta=8 warps_per_cta=8\n", "appears twice"},
        {"oscar-tune-table format=1\n@PROV@quantize head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=uniform "
         "rotated=2 clipped=2 rows=3000 src=0123456789abcdef\n", "rows = \"3000\" is not a bucket value"},
        {"oscar-tune-table format=1\n@PROV@quantize head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=uniform "
         "rotated=2 clipped=2 rows=2097152 src=0123456789abcdef\n", "rows = \"2097152\" is not a bucket value"},
        {"oscar-tune-table format=1\n@PROV@quantize head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=fast "
         "rotated=2 clipped=2 rows=4096 src=0123456789abcdef\n", "mode = \"fast\" is not a bucket value"},
        {"oscar-tune-table format=1\n@PROV@quantize head_dim=128 group=128 dtype=f32 scale=f16_scale_min mode=uniform "
         "rotated=2 clipped=2 rows=4096 src=0123456789abcdef\n", "dtype = \"f32\" is not a bucket value"},
        {"oscar-tune-table format=1\n@PROV@quantize head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=uniform "
         "rotated=3 clipped=2 rows=4096 src=0123456789abcdef\n", "rotated = \"3\" is not a bucket value"},
        {"oscar-tune-table format=1\n@PROV@quantize head_dim=128 group=128 dtype=bf16 scale=f16_scale_min mode=uniform "
         "rotated=2 rows=4096 src=0123456789abcdef\n", "quantize entry lacks its bucket field clipped"},
        {"oscar-tune-table format=1\n@PROV@quantize head_dim=128 group=128 tokens=1024 src=0123456789abcdef\n",
         "quantize has no field \"tokens\""},
    };
    char dec[512], qnt[512], prov[512], text[4096], dsrc[17], qsrc[17];
    oscar_ctx *ctx = compile_only_ctx(NULL);
    size_t i;
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_DECODE, dsrc);
    provenance_line(ctx, prov, sizeof prov, 90, OSCAR_VERSION_STRING);
    snprintf(dec, sizeof dec,
             "decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=1 context=8192 src=%s", dsrc);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_QUANTIZE, qsrc);
    snprintf(qnt, sizeof qnt,
             "quantize head_dim=256 group=256 dtype=bf16 scale=f16_scale_min mode=uniform rotated=2 clipped=2 rows=1048576 src=%s",
             qsrc);
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        oscar__tune_table *t = (oscar__tune_table *)0x1;
        const char *s = bad[i][0];
        size_t n = 0;
        oscar_status st;
        /* expand @PROV@ and @DEC@ */
        while (*s && n + 600 < sizeof text) {
            if (!strncmp(s, "@PROV@", 6)) n += (size_t)snprintf(text + n, sizeof text - n, "%s", prov), s += 6;
            else if (!strncmp(s, "@DEC@", 5)) n += (size_t)snprintf(text + n, sizeof text - n, "%s", dec), s += 5;
            else if (!strncmp(s, "@QNT@", 5)) n += (size_t)snprintf(text + n, sizeof text - n, "%s", qnt), s += 5;
            else text[n++] = *s++;
        }
        text[n] = 0;
        st = oscar__tune_parse(ctx, "test", "t.txt", text, n, &t);
        cr_assert_eq(st, OSCAR_STATUS_FORMAT_ERROR, "case %zu accepted:\n%s", i, text);
        cr_assert_null(t);
        cr_assert(strstr(oscar_last_error(ctx), bad[i][1]) != NULL, "case %zu: \"%s\" lacks \"%s\"", i,
                  oscar_last_error(ctx), bad[i][1]);
    }
    /* a line longer than 4096 characters */
    {
        char *big = malloc(10000);
        oscar__tune_table *t = NULL;
        memset(big, 'a', 9999);
        big[9999] = 0;
        cr_assert_eq(oscar__tune_parse(ctx, "test", "t.txt", big, 9999, &t), OSCAR_STATUS_FORMAT_ERROR);
        cr_assert(strstr(oscar_last_error(ctx), "longer than") != NULL, "%s", oscar_last_error(ctx));
        free(big);
    }
    /* every prefix and random corruption of a valid file: parsed or rejected, never a crash */
    {
        tu_rng r = tu_seed();
        size_t len, k;
        valid_table(ctx, text, sizeof text);
        len = strlen(text);
        for (k = 0; k <= len; k++) {
            oscar__tune_table *t = NULL;
            oscar_status st = oscar__tune_parse(ctx, "test", "t.txt", text, k, &t);
            cr_assert(st == OSCAR_OK || st == OSCAR_STATUS_FORMAT_ERROR);
            cr_assert((st == OSCAR_OK) == (t != NULL));
            oscar__tune_table_free(ctx, t);
        }
        for (k = 0; k < 2000; k++) {
            char copy[4096];
            oscar__tune_table *t = NULL;
            int j, flips = 1 + (int)tu_int(&r, 4);
            oscar_status st;
            memcpy(copy, text, len);
            for (j = 0; j < flips; j++) copy[tu_int(&r, (int64_t)len)] = (char)tu_int(&r, 256);
            st = oscar__tune_parse(ctx, "test", "t.txt", copy, len, &t);
            cr_assert(st == OSCAR_OK || st == OSCAR_STATUS_FORMAT_ERROR);
            oscar__tune_table_free(ctx, t);
        }
    }
    oscar_shutdown(ctx);
}

Test(tune, a_malformed_file_at_setup_is_ignored_with_a_sentence) {
    char path[600];
    oscar_ctx *ctx;
    oscar_tune_info info;
    make_tmp_dir();
    snprintf(path, sizeof path, "%s/bad.txt", tmp_dir);
    write_text(path, "oscar-tune-table format=1\nprovenance gpu=\"x\n");
    log_text[0] = 0;
    ctx = compile_only_ctx(path);
    TU_OK(ctx, oscar_query_tune_info(ctx, &info));
    cr_assert_eq(info.has_table, 0);
    cr_assert(strstr(log_text, "bad.txt:2: the quoted value of gpu has no closing quote; the table is ignored") != NULL,
              "log:\n%s", log_text);
    cr_assert_eq(oscar_tune_table_load(ctx, path), OSCAR_STATUS_FORMAT_ERROR);
    cr_assert(strstr(oscar_last_error(ctx), "bad.txt:2:") != NULL, "%s", oscar_last_error(ctx));
    cr_assert_eq(oscar_tune_table_load(ctx, "/nonexistent/t.txt"), OSCAR_STATUS_IO_ERROR);
    cr_assert(strstr(oscar_last_error(ctx), "no such file") != NULL, "%s", oscar_last_error(ctx));
    oscar_shutdown(ctx);
    remove_tmp_dir();
}

Test(tune, foreign_tables_are_ignored_with_a_log_line) {
    char path[600], prov[512], text[4096], why[1024], dsrc[17];
    oscar_ctx *ctx = compile_only_ctx(NULL);
    oscar_ctx_info ci;
    oscar_tune_info info;
    oscar_tune_provenance h200, t;
    char qsrc[17];
    static const struct {
        int cc, nvrtc_delta;
        const char *version, *what;
    } cases[] = {{80, 0, OSCAR_VERSION_STRING, "another compute capability"},
                 {90, 10, OSCAR_VERSION_STRING, "another NVRTC version"},
                 {90, 0, "0.0.9", "another oscar version"}};
    size_t i;
    make_tmp_dir();
    TU_OK(ctx, oscar_query_ctx_info(ctx, &ci));
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_DECODE, dsrc);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_QUANTIZE, qsrc);
    oscar_shutdown(ctx);
    snprintf(path, sizeof path, "%s/foreign.txt", tmp_dir);
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(prov, sizeof prov,
                 "provenance gpu=\"NVIDIA H200\" sms=132 cc=%d nvrtc=%d oscar=\"%s\" date=\"d\" tuning_s=1\n", cases[i].cc,
                 ci.nvrtc_version + cases[i].nvrtc_delta, cases[i].version);
        snprintf(text, sizeof text,
                 "oscar-tune-table format=1\n%sdecode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min "
                 "window=512 batch=1 context=8192 src=%s int2_splits=8\n"
                 "quantize " QNT_PREFILL_BUCKET " src=%s rows_per_warp=16 warps_per_cta=4\n",
                 prov, dsrc, qsrc);
        write_text(path, text);
        log_text[0] = 0;
        ctx = compile_only_ctx(path);
        TU_OK(ctx, oscar_query_tune_info(ctx, &info));
        cr_assert_eq(info.has_table, 0, "case %zu: a foreign table was loaded", i);
        {
            /* its quantize entry too: the heuristic's tile stays */
            int32_t key[OSCAR__TUNE_MAX_KEYS], r = 32, w = 8;
            oscar__tune_quant_key(key, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2,
                                  2, 131072LL * 16);
            oscar__tune_quant_apply(ctx, key, 1, &r, &w);
            cr_assert(r == 32 && w == 8, "case %zu: a foreign quantize entry was applied (%d x %d)", i, r, w);
        }
        cr_assert(strstr(log_text, "[2] tuning table") && strstr(log_text, "ignored: tuned on") &&
                      strstr(log_text, cases[i].what),
                  "case %zu: log lacks \"%s\":\n%s", i, cases[i].what, log_text);
        /* the explicit load reports it and keeps the context's table */
        cr_assert_eq(oscar_tune_table_load(ctx, path), OSCAR_STATUS_UNSUPPORTED);
        cr_assert(strstr(oscar_last_error(ctx), cases[i].what) != NULL, "%s", oscar_last_error(ctx));
        oscar_shutdown(ctx);
    }
    /* GPU name and SM count (a device context's identity; none here, so made up) */
    memset(&h200, 0, sizeof h200);
    snprintf(h200.gpu_name, sizeof h200.gpu_name, "NVIDIA H200");
    h200.num_sms = 132, h200.sm = 90, h200.nvrtc_version = 13000;
    snprintf(h200.oscar_version, sizeof h200.oscar_version, "%s", OSCAR_VERSION_STRING);
    t = h200;
    cr_assert_eq(oscar__tune_foreign(&h200, &t, why, sizeof why), 0);
    snprintf(t.gpu_name, sizeof t.gpu_name, "NVIDIA H100 80GB HBM3");
    cr_assert_eq(oscar__tune_foreign(&h200, &t, why, sizeof why), 1);
    cr_assert(strstr(why, "another GPU: \"NVIDIA H100 80GB HBM3\"") && strstr(why, "this context is \"NVIDIA H200\""), "%s", why);
    t = h200;
    t.num_sms = 114;
    cr_assert_eq(oscar__tune_foreign(&h200, &t, why, sizeof why), 1);
    cr_assert(strstr(why, "another SM count") != NULL, "%s", why);
    /* ... and through the logger, as at setup */
    ctx = compile_only_ctx(NULL);
    log_text[0] = 0;
    {
        oscar__tune_table *tab = oscar__tune_table_new(ctx);
        tab->prov = t;
        cr_assert_eq(oscar__tune_adopt(ctx, &h200, tab, "x.txt", why, sizeof why), 1);
        cr_assert(strstr(log_text, "[2] tuning table x.txt ignored: tuned on another SM count") != NULL, "%s", log_text);
        oscar__tune_table_free(ctx, tab);
    }
    /* a compile-only context knows no GPU name or SM count: not compared */
    {
        oscar_tune_provenance co = h200;
        co.gpu_name[0] = 0, co.num_sms = 0;
        cr_assert_eq(oscar__tune_foreign(&co, &t, why, sizeof why), 0);
    }
    oscar_shutdown(ctx);
    remove_tmp_dir();
}

Test(tune, entries_for_other_kernel_sources_are_dropped) {
    char path[600], prov[512], text[4096], dsrc[17], qsrc[17];
    oscar_ctx *ctx = compile_only_ctx(NULL);
    oscar_tune_info info;
    make_tmp_dir();
    snprintf(path, sizeof path, "%s/stale.txt", tmp_dir);
    provenance_line(ctx, prov, sizeof prov, 90, OSCAR_VERSION_STRING);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_DECODE, dsrc);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_QUANTIZE, qsrc);
    oscar_shutdown(ctx);
    /* a quantize entry of the decode family's digest is stale too: src is per family */
    snprintf(text, sizeof text,
             "oscar-tune-table format=1\n%s"
             "decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=1 context=8192 "
             "src=0000000000000000 int2_splits=8\n"
             "decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=2 context=8192 "
             "src=%s int2_splits=4\n"
             "quantize " QNT_PREFILL_BUCKET " src=0000000000000000 rows_per_warp=16 warps_per_cta=4\n"
             "quantize " QNT_DEMOTE_BUCKET " src=%s rows_per_warp=32 warps_per_cta=8\n"
             "quantize head_dim=64 group=64 dtype=bf16 scale=f16_scale_min mode=uniform rotated=2 clipped=2 rows=8192 src=%s "
             "rows_per_warp=32 warps_per_cta=4\n",
             prov, dsrc, dsrc, qsrc);
    write_text(path, text);
    log_text[0] = 0;
    ctx = compile_only_ctx(path);
    TU_OK(ctx, oscar_query_tune_info(ctx, &info));
    cr_assert(info.has_table && info.num_entries == 2, "expected the two current entries, got %d", info.num_entries);
    cr_assert(strstr(log_text, "1 decode entries ignored: tuned for other kernel sources") != NULL, "log:\n%s", log_text);
    cr_assert(strstr(log_text, "2 quantize entries ignored: tuned for other kernel sources") != NULL, "log:\n%s", log_text);
    {
        int32_t key[OSCAR__TUNE_MAX_KEYS], r = 32, w = 8;
        oscar__tune_quant_key(key, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2,
                              131072LL * 16);
        oscar__tune_quant_apply(ctx, key, 1, &r, &w);
        cr_assert(r == 32 && w == 8, "a stale quantize entry was applied (%d x %d)", r, w);
    }
    oscar_shutdown(ctx);
    remove_tmp_dir();
}

/* Every shipped table (tune/default_sm*.txt, embedded) is current: each entry
   was tuned for the kernel sources this build embeds. A kernel edit changes
   its family's digest and the shipped entries would be ignored at run time
   (heuristic splits and tiles: up to 25% slower on some shapes); this test
   says so at once. Fix: re-tune on the GPU (oscar_tune --fresh, docs/tuning.md),
   or, where the change leaves every instantiation's SASS identical, re-key. */
Test(tune, the_shipped_tables_are_current) {
    oscar_ctx *ctx = compile_only_ctx(NULL);
    char digest[OSCAR__TUNE_FAMILY_COUNT][17];
    int f, i, tables = 0;
    for (f = 1; f < OSCAR__TUNE_FAMILY_COUNT; f++) oscar__tune_family_digest(f, digest[f]);
    for (i = 0; oscar__tune_defaults[i].name[0]; i++) {
        oscar__tune_table *t = NULL;
        int32_t e, per_family[OSCAR__TUNE_FAMILY_COUNT] = {0}, lines = 0;
        const char *l;
        /* entry lines in the text: the parser drops stale ones (with a log line), so count them here */
        for (l = oscar__tune_defaults[i].text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
            if (*l != '#' && *l != '\n' && strncmp(l, "oscar-tune-table", 16) && strncmp(l, "provenance", 10)) lines++;
        TU_OK(ctx, oscar__tune_parse(ctx, "test", oscar__tune_defaults[i].name, oscar__tune_defaults[i].text,
                                     strlen(oscar__tune_defaults[i].text), &t));
        cr_assert(t->num_entries == lines,
                  "%s: %d entry lines, %d kept -- the others were tuned for other kernel sources: re-tune "
                  "(oscar_tune --fresh) or re-key after checking the SASS is unchanged",
                  oscar__tune_defaults[i].name, lines, t->num_entries);
        for (e = 0; e < t->num_entries; e++) {
            const oscar__tune_entry *x = &t->entries[e];
            cr_assert(x->family >= 1 && x->family < OSCAR__TUNE_FAMILY_COUNT);
            cr_assert(strcmp(x->src, digest[x->family]) == 0,
                      "%s: entry %d (family %d) was tuned for kernel source %s; this build's is %s -- re-tune "
                      "(oscar_tune --fresh) or re-key after checking the SASS is unchanged",
                      oscar__tune_defaults[i].name, e, x->family, x->src, digest[x->family]);
            per_family[x->family]++;
        }
        for (f = 1; f < OSCAR__TUNE_FAMILY_COUNT; f++)
            cr_assert(per_family[f] > 0, "%s has no entry of family %d", oscar__tune_defaults[i].name, f);
        oscar__tune_table_free(ctx, t);
        tables++;
    }
    cr_assert(tables >= 1, "no shipped table embedded");
    oscar_shutdown(ctx);
}

Test(tune, where_the_context_finds_its_table) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_tune_info info;
    char want[600];
    make_tmp_dir();
    setenv("OSCAR_TUNE_TABLE", "/tmp/from_env_table.txt", 1);
    ctx = compile_only_ctx(NULL);
    TU_OK(ctx, oscar_query_tune_info(ctx, &info));
    cr_assert_str_eq(info.path, "/tmp/from_env_table.txt");
    cr_assert_eq(info.has_table, 0, "a missing file is no table, not an error");
    oscar_shutdown(ctx);
    ctx = compile_only_ctx("/tmp/from_desc.txt");
    TU_OK(ctx, oscar_query_tune_info(ctx, &info));
    cr_assert_str_eq(info.path, "/tmp/from_desc.txt", "desc.tune_table_path wins over the environment");
    oscar_shutdown(ctx);
    unsetenv("OSCAR_TUNE_TABLE");
    desc.compile_only_sm = 90;
    desc.cache_dir = tmp_dir;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    TU_OK(ctx, oscar_query_tune_info(ctx, &info));
    snprintf(want, sizeof want, "%s/tune_table.txt", tmp_dir);
    cr_assert_str_eq(info.path, want, "the default is next to the JIT cache");
    /* no table to save yet */
    cr_assert_eq(oscar_tune_table_save(ctx, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    oscar_shutdown(ctx);
    /* the CPU backend has no tables, and says so */
    memset(&desc, 0, sizeof desc);
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    cr_assert_eq(oscar_query_tune_info(ctx, &info), OSCAR_STATUS_UNSUPPORTED);
    cr_assert(strstr(oscar_last_error(ctx), "CPU backend") != NULL);
    oscar_shutdown(ctx);
    remove_tmp_dir();
}

Test(tune, writes_are_atomic) {
    char path[600], text[4096], old[4096], sub[600];
    oscar_ctx *ctx;
    make_tmp_dir();
    snprintf(path, sizeof path, "%s/table.txt", tmp_dir);
    ctx = compile_only_ctx(NULL);
    valid_table(ctx, text, sizeof text);
    write_text(path, text);
    oscar_shutdown(ctx);
    ctx = compile_only_ctx(path);
    /* change the table in memory, so a completed write would change the file */
    TU_OK(ctx, oscar__tune_store(ctx, "test", NULL, 3.0));
    snprintf(old, sizeof old, "%s", read_text(path));
    /* a write that fails half way: the old file, and no temporary file, stay */
    oscar__tune_hooks.fail_write_after = 100;
    cr_assert_eq(oscar_tune_table_save(ctx, path), OSCAR_STATUS_IO_ERROR);
    oscar__tune_hooks.fail_write_after = 0;
    cr_assert(strstr(oscar_last_error(ctx), "is unchanged") != NULL, "%s", oscar_last_error(ctx));
    cr_assert_str_eq(read_text(path), old, "a failed write changed the table");
    cr_assert_eq(count_files(tmp_dir), 1, "a temporary file was left behind");
    /* a folder that cannot hold it (a path under a regular file) */
    snprintf(sub, sizeof sub, "%s/table.txt/inner.txt", tmp_dir);
    cr_assert_eq(oscar_tune_table_save(ctx, sub), OSCAR_STATUS_IO_ERROR);
    cr_assert(strstr(oscar_last_error(ctx), "cannot create") != NULL, "%s", oscar_last_error(ctx));
    /* a read-only folder (only meaningful when not root: root writes anyway) */
    if (geteuid() != 0) {
        cr_assert_eq(chmod(tmp_dir, 0555), 0);
        cr_assert_eq(oscar_tune_table_save(ctx, path), OSCAR_STATUS_IO_ERROR);
        cr_assert_eq(chmod(tmp_dir, 0755), 0);
        cr_assert_str_eq(read_text(path), old);
    }
    /* and a complete write replaces it */
    TU_OK(ctx, oscar_tune_table_save(ctx, path));
    cr_assert(strcmp(read_text(path), old) != 0, "the write did not land");
    cr_assert(strstr(read_text(path), "tuning_s=15.500") != NULL, "%s", read_text(path));
    cr_assert_eq(count_files(tmp_dir), 1);
    oscar_shutdown(ctx);
    remove_tmp_dir();
}

/* ---- plans and lookups ------------------------------------------------------ */
/* requests per prep / merge CTA: the table's for its bucket, the desc's when
   forced, the heuristic elsewhere; a value that would exceed a CTA's 16 rows
   is not a valid entry */
Test(tune, requests_per_cta_from_the_table_the_desc_or_the_heuristic, .timeout = 600) {
    char path[600], text[2048], prov[512], dsrc[17];
    oscar_ctx *ctx, *bare;
    oscar_int2_pool_desc pool = {0};
    oscar_window_pool_desc win = {0};
    oscar_decode_plan_desc pd = {0};
    oscar_decode_plan_info h, t, f;
    make_tmp_dir();
    snprintf(path, sizeof path, "%s/table.txt", tmp_dir);
    bare = compile_only_ctx(NULL);
    provenance_line(bare, prov, sizeof prov, 90, OSCAR_VERSION_STRING);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_DECODE, dsrc);
    pool.head_dim = 128, pool.num_kv_heads = 8, pool.num_pages = 1024, pool.page_size = 16;
    win.num_pages = 64, win.page_size = 16;
    pd.num_q_heads = 32, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = 32;
    pd.max_int2_tokens = 32448, pd.max_window_tokens = 320;
    TU_OK(bare, oscar_decode_plan(bare, &pd, &h));
    cr_assert_eq(h.requests_per_cta, oscar__decode_requests_heuristic(bare, &h), "no table: the heuristic");
    cr_assert_eq(h.requests_per_cta, 2, "32 x 8 groups on 132 SMs: the heuristic takes 2 (one CTA per SM)");
    snprintf(text, sizeof text,
             "oscar-tune-table format=1\n%s"
             "decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=32 context=32768 src=%s "
             "int2_splits=2 window_splits=1 requests_per_cta=2 default_us=72.100 tuned_us=68.800\n",
             prov, dsrc);
    write_text(path, text);
    ctx = compile_only_ctx(path);
    TU_OK(ctx, oscar_decode_plan(ctx, &pd, &t));
    cr_assert(t.requests_per_cta == 2 && t.int2_splits == 2 && t.window_splits == 1, "the table's 2 + 1, 2 requests: %d + %d, %d",
              t.int2_splits, t.window_splits, t.requests_per_cta);
    cr_assert_eq(oscar__decode_requests_per_cta(ctx, &t), 2);
    cr_assert_eq(oscar__decode_merge_rows(ctx, &t), 8, "2 requests x 4 heads: the 8-row merge");
    pd.requests_per_cta = 4;
    TU_OK(ctx, oscar_decode_plan(ctx, &pd, &f));
    cr_assert_eq(f.requests_per_cta, 4, "a forced value wins over the table");
    cr_assert_eq(oscar__decode_merge_rows(ctx, &f), 16);
    pd.requests_per_cta = 5; /* 20 rows */
    cr_assert_eq(oscar_decode_plan(ctx, &pd, &f), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "desc.requests_per_cta = 5"), "%s", oscar_last_error(ctx));
    oscar_shutdown(ctx);
    /* a table value above 16 rows is refused at load: see tables_with_errors_are_refused */
    oscar_shutdown(bare);
    remove_tmp_dir();
}

/* A decode plan of 8 KV heads, pages of 16 and 320 window tokens (head dim,
   group, query heads, forced INT2 warps and scale layout as given); returns
   oscar_decode_plan's status, the plan in *plan. plan_geometry: the default
   scale layout. */
static oscar_status plan_geometry_scaled(oscar_ctx *ctx, int batch, int64_t int2_tokens, int forced_int2, int head_dim,
                                         int group, int q_heads, int forced_warps, oscar_scale_layout scale,
                                         oscar_decode_plan_info *plan) {
    oscar_int2_pool_desc pool = {0};
    oscar_window_pool_desc win = {0};
    oscar_decode_plan_desc pd = {0};
    pool.head_dim = head_dim, pool.group_size = group, pool.num_kv_heads = 8, pool.num_pages = 1024, pool.page_size = 16;
    pool.scale_layout = scale;
    win.num_pages = 64, win.page_size = 16;
    pd.num_q_heads = q_heads, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = batch;
    pd.max_int2_tokens = int2_tokens, pd.max_window_tokens = 320, pd.int2_splits = forced_int2;
    pd.int2_warps = forced_warps;
    return oscar_decode_plan(ctx, &pd, plan);
}
static oscar_status plan_geometry(oscar_ctx *ctx, int batch, int64_t int2_tokens, int forced_int2, int head_dim,
                                  int group, int q_heads, int forced_warps, oscar_decode_plan_info *plan) {
    return plan_geometry_scaled(ctx, batch, int2_tokens, forced_int2, head_dim, group, q_heads, forced_warps,
                                OSCAR_SCALE_LAYOUT_DEFAULT, plan);
}
static oscar_decode_plan_info plan_of(oscar_ctx *ctx, int batch, int64_t int2_tokens, int forced_int2) {
    oscar_decode_plan_info plan;
    TU_OK(ctx, plan_geometry(ctx, batch, int2_tokens, forced_int2, 128, 128, 32, 0, &plan));
    return plan;
}

/* The heuristic's INT2 split counts (measured on the H200): at small batch,
   where one wave of the INT2 kernel holds them, 1.565 (L / 1024)^0.8 splits
   (session 24); otherwise the bandwidth model's least cost (session 34). A
   compile-only sm_90 context (4 CTAs per SM on 132 SMs: 528 slots), shapes
   the shipped table lacks. */
Test(tune, int2_splits_heuristic_small_batch_rule_and_bandwidth_model, .timeout = 600) {
    static const struct {
        int batch;
        int64_t tokens;
        int splits, warps; /* warps: 0 automatic (the plan must take 4), or 4 forced */
    } cases[] = {
        {1, 16064, 14, 4},  /* 1 x 16K: the rule (automatic warps: 16-warp CTAs on 96 SMs, session 36) */
        {1, 65216, 43, 4},  /* 1 x 64K: the rule (45 measured 26.5 us, 34 27.7, 43 25.5) */
        {4, 7872, 8, 0},    /* 4 x 8K: the rule (the old 16 measured 30.3 us against 24.2) */
        {4, 32448, 11, 0},  /* 4 x 32K: the bandwidth model (the wave model's 16 filled 512 of 528 slots) */
        {16, 32448, 7, 0},  /* 16 x 32K: the bandwidth model (the wave model's 4: one full wave) */
        {64, 3776, 1, 0},   /* 512 groups: one split */
    };
    oscar_ctx *bare = compile_only_ctx(NULL);
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        oscar_decode_plan_info p;
        TU_OK(bare, plan_geometry(bare, cases[i].batch, cases[i].tokens, 0, 128, 128, 32, cases[i].warps, &p));
        cr_assert_eq(p.int2_splits, cases[i].splits, "%d x %lld INT2 tokens: %d splits, expected %d", cases[i].batch,
                     (long long)cases[i].tokens, p.int2_splits, cases[i].splits);
        cr_assert_eq(p.int2_warps, 4, "%d x %lld INT2 tokens: %d warps per INT2 CTA, expected 4", cases[i].batch,
                     (long long)cases[i].tokens, p.int2_warps);
    }
    /* the 4-warp rule where the plan would take 16-warp CTAs: 2 x 128K and
       4 x 64K, where the rule's 76 and 43 splits would take more than one
       wave, so the bandwidth model */
    {
        oscar_decode_plan_info p;
        TU_OK(bare, plan_geometry(bare, 2, 130752, 0, 128, 128, 32, 4, &p));
        cr_assert(p.int2_warps == 4 && p.int2_splits == 31, "2 x 128K with 4 warps forced: %d warps, %d splits",
                  p.int2_warps, p.int2_splits);
        TU_OK(bare, plan_geometry(bare, 4, 65216, 0, 128, 128, 32, 4, &p));
        cr_assert(p.int2_warps == 4 && p.int2_splits == 15, "4 x 64K with 4 warps forced: %d warps, %d splits",
                  p.int2_warps, p.int2_splits);
    }
    oscar_shutdown(bare);
}

/* Warps per INT2 CTA and the window splits that go with them (sessions 25
   and 27, measured on the H200): the one-CTA-per-SM form (16 warps at ratio
   <= 4, 12 at ratio 5-8) where one wave of it (132 CTAs on the compile-only
   sm_90 context) fills >= 90% of the SMs, gives each split >= 5120 tokens
   and at least the window tier's tokens (batch x 8 KV heads x 320 here);
   only where that kernel exists (head dim <= 128, its shared memory within
   sm_90's 227 KB; 12 warps at D 128 only with group 128); then one window
   split per group. Forced values, their validation, and tables with and
   without int2_warps. Times: graph replay, old plan -> this one. */
Test(tune, int2_warps_heuristic_forced_and_tabled, .timeout = 600) {
    static const struct {
        int batch;
        int64_t tokens;
        int head_dim, group, q_heads;
        int warps, splits, window_splits;
    } cases[] = {
        {1, 130752, 128, 128, 32, 16, 16, 1}, /* 1 x 128K: 36.1-36.5 (4 warps) -> 34.9-35.4 us */
        {1, 261824, 128, 128, 32, 16, 16, 1}, /* 1 x 256K: 58.8-60.3 -> 52.8-53.2 */
        {2, 130752, 128, 128, 32, 16, 8, 1},  /* 2 x 128K: 59.0 -> 53.3-53.5 */
        {2, 65216, 128, 128, 32, 16, 8, 1},   /* 2 x 64K: 43.5 (4 warps), 42.4-42.8 (16, 2 window splits) -> 37.5-38.0 */
        {3, 65216, 128, 128, 32, 16, 5, 1},   /* 3 x 64K: 51.4-51.7 -> 46.2-46.4 */
        {4, 65216, 128, 128, 32, 16, 4, 1},   /* 4 x 64K: 58.9 -> 55.7-55.9 (62.9-63.2 with 2 window splits) */
        {8, 65216, 128, 128, 32, 16, 2, 1},   /* 8 x 64K: 97.7-98.9 -> 95.3-96.0 */
        {16, 130752, 128, 128, 32, 16, 1, 1}, /* 16 x 128K: 347.2-348.2 -> 321.1-321.4 */
        {3, 130752, 128, 128, 32, 16, 5, 1},  /* 3 x 128K: 120 of 132 SMs; 77.9-78.2 -> 75.1-75.5 */
        {4, 65216, 64, 64, 32, 16, 4, 1},     /* D 64, 4 x 64K: 44.7-45.9 -> 38.4-38.5 */
        {1, 130752, 64, 64, 32, 16, 16, 1},   /* D 64: 30.7-31.4 -> 25.2-25.7 */
        {1, 130752, 128, 64, 32, 16, 16, 1},  /* group 64: 192 KB of stages */
        {1, 97984, 128, 128, 32, 16, 16, 1},  /* 1 x 96K: 6124 tokens per split (34.8-35.2 -> 30.4-30.8) */
        {1, 65216, 128, 128, 32, 16, 12, 2},  /* 1 x 64K: 16 x 4K tokens per split lost (25.8 against 25.2), so 12 splits
                                                 on 96 SMs (oscar__decode_int2_wide_partial; 25.8 against 25.4: a tie) */
        {6, 65216, 128, 128, 32, 4, 11, 1},   /* 6 x 64K: 96 of 132 SMs (16 warps: 88.3 against 80.1) */
        {12, 130752, 128, 128, 32, 4, 14, 1}, /* 12 x 128K: 96 of 132 SMs */
        {32, 32448, 128, 128, 32, 4, 4, 1},   /* 256 groups: more than one wave of 16-warp CTAs */
        {8, 32448, 128, 128, 32, 4, 8, 1},    /* 8 x 32K: window 20480 tokens > 16224 per split (65.6 against 60.4) */
        {4, 32448, 128, 128, 32, 4, 11, 1},   /* 4 x 32K: 10240 > 8112 (45.4 against 43.4) */
        {1, 32448, 128, 128, 32, 16, 12, 2},  /* 1 x 32K: 12 splits on 96 SMs (20.9 against 25 4-warp splits' 20.5) */
        {1, 130752, 256, 256, 32, 4, 43, 1},  /* no 16-warp kernel at D 256 */
        {1, 130752, 128, 32, 32, 4, 43, 1},   /* group 32 at D 128: 256 KB of stages */
        {1, 130752, 128, 128, 64, 12, 16, 1}, /* ratio 8: 12 warps (47.3 -> 44.9 us, session 27) */
        {4, 130752, 128, 128, 64, 12, 4, 1},  /* ratio 8, 4 x 128K: 133.2 -> 128.5 */
        {16, 130752, 128, 128, 64, 12, 2, 1}, /* ratio 8, 16 x 128K: 461.2 -> 446.0 with 1 split; 2 since the
                                                 8K-token cap per warp (session 41; 2 not timed) */
        {1, 130752, 64, 32, 64, 12, 16, 1},   /* ratio 8, D 64 group 32 */
        {1, 130752, 128, 64, 64, 12, 16, 1},  /* ratio 8, D 128 group 64: 12 warps (session 33: 49.9 -> 47.3 us) */
        {1, 130752, 128, 128, 128, 4, 37, 1}, /* ratio 16: no one-CTA-per-SM kernel */
        /* D 64 at small batch (session 36): 16-warp CTAs on at most 99 of 132 SMs, 1536-12288 tokens per split,
           window splits by the general rule (2 at 320 tokens); session 35's curves, best 4-warp plan -> wide */
        {4, 7872, 64, 64, 32, 16, 3, 2},   /* 4 x 8K: 3 x 32 = 96 CTAs (best 4-warp 19.7 us; wide 2 + 1 17.6, 3 not timed) */
        {8, 3776, 64, 64, 32, 16, 1, 2},   /* 8 x 4K: one split (best 4-warp 22.2 -> 20.4) */
        {6, 23936, 64, 64, 32, 16, 2, 2},  /* 6 x 24K: 11968 tokens per split (best 4-warp 34.7 -> 31.2-31.9) */
        {12, 23936, 64, 64, 32, 4, 5, 1},  /* 12 x 24K: 23936 > 12288 per split (wide +5%) */
        {1, 7872, 64, 64, 32, 16, 5, 2},   /* batch 1, 5 splits of 1574 tokens (D 64 1 x 5K-48K: -1 to -36%) */
        {1, 7872, 128, 128, 32, 16, 5, 2}, /* D 128 batch 1 too (1 x 6K 19.4 -> 18.5, 1 x 12K 19.0 -> 17.1) */
        {2, 7872, 128, 128, 32, 4, 8, 2},  /* but not from 16 groups at D 128 (2 x 5K-20K: +3-6% wide) */
        {4, 7872, 128, 128, 32, 4, 8, 2},  /* D 128: 4 warps */
        /* ratio 8, 4-warp INT2 CTAs: one window split (oscar__decode_window_balance) */
        {4, 7872, 128, 128, 64, 4, 8, 1},  /* 4 x 8K, 8 splits: 2 window splits 35.3 -> 1 29.5 us */
        {8, 3776, 128, 128, 64, 4, 4, 1},  /* 8 x 4K, 4 splits: 37.2 -> 31.0 */
        /* ratio 16: the small-batch rule's 5 splits capped at one CTA per SM (132 / 40 groups) */
        {5, 4800, 128, 128, 128, 4, 3, 1}, /* 5 x 5K: 5 + 2 45.3 -> 3 + 1 40.3 us */
        /* ratio 5-8 at D 128, group 128, f16 scales: capped at two CTAs per SM where they fill >= 90% of them
           (session 37, held out; the compile-only context's 528 slots keep these in the small-batch rule) */
        {4, 13680, 128, 128, 64, 4, 8, 1}, /* 4 x 14K: 12 splits (384 CTAs) 38.3 -> 8 (256) 33.9 us */
        {1, 55680, 128, 128, 64, 4, 33, 1}, /* 1 x 56K: 38 -> 33 (264 CTAs): 31.1 -> 30.5 */
        {12, 2680, 128, 128, 64, 4, 3, 1}, /* 12 x 3K: 2 splits would be 192 CTAs, 73% (+2.9%): 3 kept */
        {4, 13680, 128, 64, 64, 4, 12, 1}, /* group 64: not capped (1 x 56K 33.2 -> 35.6 us capped) */
        /* ratio <= 4 (4-head CTAs) likewise, from 20 groups where the rule gives >= 2.5 CTAs per SM (session 37) */
        {6, 10180, 128, 128, 32, 4, 5, 1},  /* 6 x 10.5K: 10 + 2 (480 CTAs) 32.3 -> 5 + 1 (240) 29.5 us */
        {4, 15680, 128, 128, 32, 4, 8, 1},  /* 4 x 16K: 14 + 2 31.5 -> 8 + 1 28.9 */
        {2, 39680, 128, 128, 32, 4, 29, 2}, /* 2 x 40K: 16 groups, not capped (16 + 1 +9% with pages of 1) */
        /* ... but not where it removes one split of three or four (session 38; capped -> uncapped) */
        {11, 3280, 128, 128, 32, 4, 4, 2},  /* 11 x 3.6K: 4 kept (3 + 2 ran 31.5 us, 4 + 2 29.3) */
        {16, 2680, 128, 128, 32, 4, 3, 2},  /* 16 x 3K: 3 kept (2 + 2 33.1, 3 + 2 32.8; 15 x 3K 32.4 / 31.2) */
        {32, 1680, 128, 128, 32, 4, 1, 1},  /* 32 x 2K: 2 -> 1 is taken (2 + 2 43.5 us, 1 + 1 40.5) */
        /* groups of 64 and 32 too (session 38, held out 0.918 over 22 shapes; on the H200 these geometries reach
           the small-batch rule with few KV heads, the compile-only context's 528 slots already with 8) */
        {4, 15680, 128, 64, 32, 4, 8, 1},   /* group 64, 4 x 16K: 14 + 2 -> 8 + 1 (16 / 4 heads 7 x 16K 31.5 -> 26.8 us) */
        /* group 64 at 4 heads: one window split from 1.8 INT2 CTAs per SM (session 38, held out 0.948 over 38) */
        {4, 11180, 128, 64, 32, 4, 8, 1},   /* 4 x 11.5K: 8 + 2 32.4 -> 8 + 1 27.5 us */
        {16, 2680, 128, 64, 32, 4, 3, 1},   /* 16 x 3K: 384 INT2 CTAs, 1 window split */
        {16, 2680, 128, 128, 32, 4, 3, 2},  /* group 128 keeps 2 (one split measured 0.995 held out) */
        {2, 5680, 128, 64, 32, 4, 6, 2},    /* 96 INT2 CTAs: 2 */
    };
    char path[600], text[4096], prov[512], dsrc[17];
    oscar_ctx *bare = compile_only_ctx(NULL), *ctx;
    oscar_decode_plan_info p;
    oscar_status st;
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TU_OK(bare, plan_geometry(bare, cases[i].batch, cases[i].tokens, 0, cases[i].head_dim, cases[i].group,
                                  cases[i].q_heads, 0, &p));
        cr_assert(p.int2_warps == cases[i].warps && p.int2_splits == cases[i].splits &&
                      p.window_splits == cases[i].window_splits,
                  "%d x %lld, D %d, group %d, %d q heads: %d warps x %d + %d splits, expected %d x %d + %d",
                  cases[i].batch, (long long)cases[i].tokens, cases[i].head_dim, cases[i].group, cases[i].q_heads,
                  p.int2_warps, p.int2_splits, p.window_splits, cases[i].warps, cases[i].splits,
                  cases[i].window_splits);
        cr_assert_eq(p.smem_int2, oscar__decode_int2_smem(cases[i].head_dim, cases[i].group, cases[i].q_heads / 8, p.int2_warps));
    }
    /* the two-per-SM cap of 8-head CTAs is for f16 scale + min only: with the
       reference's f32 scale + zero 4 x 14K keeps 12 splits (capped, 1 x 56K
       ran 30.8 -> 32.7 us and 2 x 28K 31.0 -> 34.7 in session 37's A/B) */
    TU_OK(bare, plan_geometry_scaled(bare, 4, 13680, 0, 128, 128, 64, 0, OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO, &p));
    cr_assert(p.int2_warps == 4 && p.int2_splits == 12, "f32 scales, ratio 8, 4 x 14K: %d warps x %d splits, expected 4 x 12",
              p.int2_warps, p.int2_splits);
    /* ... and at 4 heads per CTA (ratio 4) it applies with f32 scales too:
       5 x 11.5K 11 + 2 32.3 -> 6 + 1 28.2 us */
    TU_OK(bare, plan_geometry_scaled(bare, 5, 11180, 0, 128, 128, 32, 0, OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO, &p));
    cr_assert(p.int2_warps == 4 && p.int2_splits == 6, "f32 scales, ratio 4, 5 x 11.5K: %d warps x %d splits, expected 4 x 6",
              p.int2_warps, p.int2_splits);
    /* ... and with groups of 32 (16 / 4 heads 12 x 8K, f32: 35.2 -> 32.4 us, session 38) */
    TU_OK(bare, plan_geometry_scaled(bare, 5, 11680, 0, 128, 32, 32, 0, OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO, &p));
    cr_assert(p.int2_warps == 4 && p.int2_splits == 6, "f32 scales, group 32, ratio 4, 5 x 12K: %d warps x %d splits, expected 4 x 6",
              p.int2_warps, p.int2_splits);
    /* forced: 16 with automatic splits (one wave; the window splits stay the
       4-warp rule's 2: at 8 x 32K one measured 65.6 against 63.6 us), 16 with
       forced splits, 4 */
    TU_OK(bare, plan_geometry(bare, 8, 32448, 0, 128, 128, 32, 16, &p));
    cr_assert(p.int2_warps == 16 && p.int2_splits == 2 && p.window_splits == 2,
              "8 x 32K, 16 forced: %d x %d + %d (one wave: 132 / 64)", p.int2_warps, p.int2_splits, p.window_splits);
    TU_OK(bare, plan_geometry(bare, 1, 32448, 5, 128, 128, 32, 16, &p));
    cr_assert(p.int2_warps == 16 && p.int2_splits == 5);
    TU_OK(bare, plan_geometry(bare, 1, 130752, 0, 128, 128, 32, 4, &p));
    cr_assert(p.int2_warps == 4 && p.int2_splits == 43);
    /* forced splits with automatic warps: 4 warps (the splits' meaning stays) */
    TU_OK(bare, plan_geometry(bare, 1, 130752, 16, 128, 128, 32, 0, &p));
    cr_assert(p.int2_warps == 4 && p.int2_splits == 16);
    /* the window tier's size: without max_window_tokens the plan assumes 512,
       so at 4 x 64K the window (32 x 512 = 16384 tokens) outweighs a 16-warp
       split (16304) and 4 warps stay; window splits given with automatic
       16-warp CTAs are taken as given */
    {
        oscar_int2_pool_desc pool = {0};
        oscar_window_pool_desc win = {0};
        oscar_decode_plan_desc pd = {0};
        pool.head_dim = 128, pool.group_size = 128, pool.num_kv_heads = 8, pool.num_pages = 1024, pool.page_size = 16;
        win.num_pages = 64, win.page_size = 16;
        pd.num_q_heads = 32, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = 4, pd.max_int2_tokens = 65216;
        TU_OK(bare, oscar_decode_plan(bare, &pd, &p));
        cr_assert(p.int2_warps == 4 && p.int2_splits == 15 && p.window_splits == 1, "4 x 64K, window 512: %d x %d + %d",
                  p.int2_warps, p.int2_splits, p.window_splits);
        pd.max_window_tokens = 320;
        TU_OK(bare, oscar_decode_plan(bare, &pd, &p));
        cr_assert(p.int2_warps == 16 && p.int2_splits == 4 && p.window_splits == 1, "4 x 64K, window 320: %d x %d + %d",
                  p.int2_warps, p.int2_splits, p.window_splits);
        pd.window_splits = 3;
        TU_OK(bare, oscar_decode_plan(bare, &pd, &p));
        cr_assert(p.int2_warps == 16 && p.window_splits == 3, "window splits given: %d x %d + %d", p.int2_warps,
                  p.int2_splits, p.window_splits);
        /* no window pool: the window tier does not count */
        pd.window_pool = NULL, pd.window_splits = 0, pd.max_window_tokens = 0;
        TU_OK(bare, oscar_decode_plan(bare, &pd, &p));
        cr_assert(p.int2_warps == 16 && p.int2_splits == 4 && p.window_splits == 0, "no window: %d x %d + %d",
                  p.int2_warps, p.int2_splits, p.window_splits);
    }
    /* bad values: a status and a sentence naming the field */
    st = plan_geometry(bare, 1, 130752, 0, 128, 128, 32, 8, &p);
    cr_assert(st == OSCAR_STATUS_INVALID_ARGUMENT && strstr(oscar_last_error(bare), "desc.int2_warps = 8"), "%s",
              oscar_last_error(bare));
    st = plan_geometry(bare, 1, 130752, 0, 256, 256, 32, 16, &p);
    cr_assert(st == OSCAR_STATUS_UNSUPPORTED && strstr(oscar_last_error(bare), "desc.int2_warps = 16") &&
                  strstr(oscar_last_error(bare), "head_dim <= 128 (have 256)"),
              "%s", oscar_last_error(bare));
    st = plan_geometry(bare, 1, 130752, 0, 128, 128, 64, 16, &p);
    cr_assert(st == OSCAR_STATUS_UNSUPPORTED && strstr(oscar_last_error(bare), "(have 8)"), "%s", oscar_last_error(bare));
    /* 12 warps: ratio 5-8 only, at D 128 with groups of 64 or 128; forced with
       automatic splits: one wave (132 / 8 groups) */
    st = plan_geometry(bare, 1, 130752, 0, 128, 128, 32, 12, &p);
    cr_assert(st == OSCAR_STATUS_UNSUPPORTED && strstr(oscar_last_error(bare), "desc.int2_warps = 12 needs 5 to 8") &&
                  strstr(oscar_last_error(bare), "(have 4)"),
              "%s", oscar_last_error(bare));
    st = plan_geometry(bare, 1, 130752, 0, 128, 32, 64, 12, &p);
    cr_assert(st == OSCAR_STATUS_UNSUPPORTED && strstr(oscar_last_error(bare), "group_size >= 64 at head_dim 128"), "%s",
              oscar_last_error(bare));
    TU_OK(bare, plan_geometry(bare, 1, 32448, 0, 128, 128, 48, 12, &p));
    cr_assert(p.int2_warps == 12 && p.int2_splits == 16 && p.window_splits == 2, "ratio 6, 12 forced: %d x %d + %d",
              p.int2_warps, p.int2_splits, p.window_splits);
    cr_assert_eq(p.smem_int2, oscar__decode_int2_smem(128, 128, 6, 12));
    /* a compile-only sm_89 context: 99 KB of shared memory per block, so no
       16-warp CTAs at D 128 (160 KB of stages), but at D 64 group 64 (96 KB) */
    {
        oscar_desc d89 = {0};
        oscar_ctx *c89 = NULL;
        d89.compile_only_sm = 89;
        cr_assert(oscar_setup(&d89, &c89) == OSCAR_OK, "%s", oscar_last_error(NULL));
        TU_OK(c89, plan_geometry(c89, 1, 130752, 0, 128, 128, 32, 0, &p));
        cr_assert(p.int2_warps == 4 && p.int2_splits == 43, "sm_89, D 128: %d x %d", p.int2_warps, p.int2_splits);
        TU_OK(c89, plan_geometry(c89, 1, 130752, 0, 64, 64, 32, 0, &p));
        cr_assert(p.int2_warps == 16, "sm_89, D 64: %d warps", p.int2_warps);
        st = plan_geometry(c89, 1, 130752, 0, 128, 128, 32, 16, &p);
        cr_assert(st == OSCAR_STATUS_UNSUPPORTED && strstr(oscar_last_error(c89), "this device allows 101376"), "%s",
                  oscar_last_error(c89));
        oscar_shutdown(c89);
    }
    /* a table: an entry with int2_warps takes them with its splits; one
       without (tuned before int2_warps) means 4 warps with its splits */
    make_tmp_dir();
    snprintf(path, sizeof path, "%s/warps_table.txt", tmp_dir);
    provenance_line(bare, prov, sizeof prov, 90, OSCAR_VERSION_STRING);
    oscar__tune_family_digest(OSCAR_TUNE_FAMILY_DECODE, dsrc);
    snprintf(text, sizeof text,
             "oscar-tune-table format=1\n%s"
             "decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=1 context=131072 src=%s "
             "int2_splits=8 window_splits=2 int2_warps=16\n"
             "decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=2 context=131072 src=%s "
             "int2_splits=32 window_splits=2\n",
             prov, dsrc, dsrc);
    write_text(path, text);
    ctx = compile_only_ctx(path);
    TU_OK(ctx, plan_geometry(ctx, 1, 130752, 0, 128, 128, 32, 0, &p));
    cr_assert(p.int2_warps == 16 && p.int2_splits == 8, "table 16 x 8: %d x %d", p.int2_warps, p.int2_splits);
    TU_OK(ctx, plan_geometry(ctx, 2, 130752, 0, 128, 128, 32, 0, &p));
    cr_assert(p.int2_warps == 4 && p.int2_splits == 32, "table 32 splits, no warps: %d x %d", p.int2_warps, p.int2_splits);
    /* a forced warps count wins over the table (and its splits) */
    TU_OK(ctx, plan_geometry(ctx, 1, 130752, 0, 128, 128, 32, 4, &p));
    cr_assert(p.int2_warps == 4 && p.int2_splits == 43);
    oscar_shutdown(ctx);
    oscar_shutdown(bare);
}

Test(tune, plans_take_the_table_and_fall_back_to_the_heuristic, .timeout = 600) {
    char path[600], text[4096];
    oscar_ctx *ctx, *bare;
    oscar_decode_plan_info h1, h8, t1, t8, f1, h3;
    make_tmp_dir();
    snprintf(path, sizeof path, "%s/table.txt", tmp_dir);
    bare = compile_only_ctx(NULL);
    valid_table(bare, text, sizeof text);
    write_text(path, text);
    /* no table: the heuristic (1 x 8K, 8 x 32K as bench_decode: 7872 / 32448 INT2 tokens) */
    h1 = plan_of(bare, 1, 7872, 0);
    h8 = plan_of(bare, 8, 32448, 0);
    h3 = plan_of(bare, 3, 7872, 0);
    cr_assert(h1.int2_splits != 9 || h1.window_splits != 3, "the test needs a table entry unlike the heuristic");
    ctx = compile_only_ctx(path);
    t1 = plan_of(ctx, 1, 7872, 0);
    /* non-power-of-two counts (session 37): a table may pin any count */
    cr_assert(t1.int2_splits == 9 && t1.window_splits == 3, "the plan took %d + %d splits, the table says 9 + 3",
              t1.int2_splits, t1.window_splits);
    cr_assert(t1.workspace_bytes != h1.workspace_bytes || h1.int2_splits + h1.window_splits == 12,
              "the workspace follows the table's splits");
    /* an entry without parameters: the heuristic's choice */
    t8 = plan_of(ctx, 8, 32448, 0);
    cr_assert(t8.int2_splits == h8.int2_splits && t8.window_splits == h8.window_splits);
    /* a bucket the table does not hold (batch 4): the heuristic */
    cr_assert_eq(plan_of(ctx, 3, 7872, 0).int2_splits, h3.int2_splits);
    /* a forced split count wins over the table */
    f1 = plan_of(ctx, 1, 7872, 2);
    cr_assert(f1.int2_splits == 2 && f1.window_splits == 3, "forced 2 -> %d, window %d", f1.int2_splits, f1.window_splits);
    /* a cleared table: the heuristic again */
    TU_OK(ctx, oscar_tune_table_clear(ctx));
    t1 = plan_of(ctx, 1, 7872, 0);
    cr_assert(t1.int2_splits == h1.int2_splits && t1.window_splits == h1.window_splits);
    TU_OK(ctx, oscar_tune_table_load(ctx, path));
    cr_assert_eq(plan_of(ctx, 1, 7872, 0).int2_splits, 9);
    /* merge_states: the table's tile for its bucket, 4 elsewhere */
    cr_assert_eq(oscar__tune_merge_rows(ctx, 128, 2, OSCAR_DTYPE_BF16, 200), 16);
    cr_assert_eq(oscar__tune_merge_rows(ctx, 128, 2, OSCAR_DTYPE_BF16, 1000), OSCAR__MERGE_DEFAULT_ROWS);
    cr_assert_eq(oscar__tune_merge_rows(bare, 128, 2, OSCAR_DTYPE_BF16, 200), OSCAR__MERGE_DEFAULT_ROWS);
    oscar_shutdown(ctx);
    oscar_shutdown(bare);
    remove_tmp_dir();
}

/* The tile oscar_quantize_kv takes for a bucket, from the heuristic's (r, w). */
static void quant_tile(oscar_ctx *ctx, int64_t rows, int rotated, int32_t r, int32_t w,
                       int32_t *out_r, int32_t *out_w) {
    int32_t key[OSCAR__TUNE_MAX_KEYS];
    oscar__tune_quant_key(key, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, rotated, 2,
                          rows);
    *out_r = r, *out_w = w;
    oscar__tune_quant_apply(ctx, key, rotated > 0, out_r, out_w);
}

/* The heuristic's tiers on a 132-SM device, at the demotions session 10 tuned
   on the H200 (8 tokens x 36 layers x 8 heads x K and V): 1 and 4 requests
   16 x 4, 8 requests 32 x 4, 14 and more 32 x 8; head dim 256 16 x 8. */
Test(tune, quantize_heuristic_tiers) {
    static const struct { int req; int32_t rows, warps; } want[] = {{1, 16, 4}, {4, 16, 4}, {8, 32, 4}, {14, 32, 8}, {32, 32, 8}};
    oscar_ctx *ctx = compile_only_ctx(NULL);
    int32_t sms = ctx->num_sms;
    size_t i;
    oscar__quant_tile t;
    ctx->num_sms = 132;
    for (i = 0; i < sizeof want / sizeof want[0]; i++) {
        t = oscar__quant_choose(ctx, 128, 8LL * 8 * want[i].req, 72, 1);
        cr_assert(t.rows_per_warp == want[i].rows && t.warps_per_cta == want[i].warps, "%d requests: %d x %d, want %d x %d",
                  want[i].req, t.rows_per_warp, t.warps_per_cta, want[i].rows, want[i].warps);
    }
    t = oscar__quant_choose(ctx, 256, 8LL * 8 * 32, 72, 1);
    cr_assert(t.rows_per_warp == 16 && t.warps_per_cta == 8, "head dim 256: %d x %d", t.rows_per_warp, t.warps_per_cta);
    ctx->num_sms = sms;
    oscar_shutdown(ctx);
}

/* The quantize grid (oscar__quant_ctas) on a 132-SM device with the H200's
   shared memory: all the resident CTAs shared by the layers, a layer's share
   split between K and V by cost (oscar__quant_side_cost: without a clip
   rotated 4 : unrotated 3, with one 33 : 23), never more CTAs than the steps
   need, and a forced count taken as it is. */
Test(tune, quantize_grid_shares_the_resident_ctas_by_cost) {
    static const struct {
        int64_t rows; /* per side and layer */
        int32_t layers, rows_per_warp, warps, rot_k, rot_v, clip, ck, cv;
    } want[] = {
        /* 32 requests x 8 tokens x 8 heads, 36 layers, V absorbed: 4 + 3 (K 2 steps per warp, V 3); was 3 + 3 (3 and 3) */
        {2048, 36, 32, 8, 1, 0, 0, 4, 3},
        /* both rotated: 7 slots per layer; 3 + 4 and 4 + 3 tie (one side takes 3 steps either way): the first */
        {2048, 36, 32, 8, 1, 1, 0, 3, 4},
        /* 256 requests, V absorbed: K 16 steps (x 4), V 22 (x 3) */
        {16384, 36, 32, 8, 1, 0, 0, 4, 3},
        /* the 128K-token prefill, one layer, V absorbed: 152 + 112 of the 264 slots; both rotated 132 + 132 */
        {1048576, 1, 32, 8, 1, 0, 0, 152, 112},
        {1048576, 1, 32, 8, 1, 1, 0, 132, 132},
        {1048576, 1, 32, 8, 0, 0, 0, 132, 132},
        /* 1 request: one CTA each holds all of a side's 4 steps */
        {64, 36, 16, 4, 1, 0, 0, 1, 1},
        /* clipped (K .96, V .92), V absorbed: the 128K-token prefill 156 + 108 (33 : 23); both rotated 132 + 132 */
        {1048576, 1, 32, 8, 1, 0, 1, 156, 108},
        {1048576, 1, 32, 8, 1, 1, 1, 132, 132},
        /* the demotions, clipped: as unclipped (the steps' granularity decides) */
        {2048, 36, 32, 8, 1, 0, 1, 4, 3},
        {16384, 36, 32, 8, 1, 0, 1, 4, 3},
        {64, 36, 16, 4, 1, 0, 1, 1, 1},
    };
    oscar_ctx *ctx = compile_only_ctx(NULL);
    int32_t sms = ctx->num_sms, smem = ctx->max_smem_optin, c[2];
    size_t i;
    oscar__quant_tile t;
    ctx->num_sms = 132, ctx->max_smem_optin = 227 * 1024;
    for (i = 0; i < sizeof want / sizeof want[0]; i++) {
        t.rows_per_warp = want[i].rows_per_warp, t.warps_per_cta = want[i].warps, t.ctas = 0;
        oscar__quant_ctas(ctx, 128, &t, want[i].rows, want[i].layers, want[i].rot_k, want[i].rot_v, want[i].clip, want[i].clip, c);
        cr_assert(c[0] == want[i].ck && c[1] == want[i].cv, "case %zu: %d + %d CTAs, want %d + %d", i, c[0], c[1], want[i].ck,
                  want[i].cv);
    }
    /* never more than the resident CTAs (264 two-CTA slots), never more than a side's steps need */
    {
        int64_t rows;
        int32_t layers;
        for (layers = 1; layers <= 48; layers += 7)
            for (rows = 8; rows <= (1 << 22); rows *= 3) {
                const int64_t steps = (rows + 31) / 32, need = (steps + 7) / 8;
                t.rows_per_warp = 32, t.warps_per_cta = 8, t.ctas = 0;
                oscar__quant_ctas(ctx, 128, &t, rows, layers, 1, 0, 1, 1, c);
                cr_assert(c[0] >= 1 && c[1] >= 1 && c[0] <= need && c[1] <= need, "%lld rows: %d + %d, need %lld",
                          (long long)rows, c[0], c[1], (long long)need);
                cr_assert((int64_t)(c[0] + c[1]) * layers <= (layers <= 132 ? 264 : 2 * layers), "%d layers: %d + %d", layers, c[0],
                          c[1]);
            }
    }
    /* the split's time (steps per warp x cost of its slower side) is the least of every split of the layer's CTAs,
       against an exhaustive scan, over layers, rows, rotations and both tile widths */
    {
        static const int32_t tiles[2][2] = {{32, 8}, {16, 4}};
        int64_t rows;
        int32_t layers, ti, rk, rv, cl, cases = 0;
        for (ti = 0; ti < 2; ti++)
            for (layers = 1; layers <= 60; layers += 3)
                for (rows = 1; rows <= (1 << 22); rows = rows * 3 / 2 + 1)
                    for (rk = 0; rk <= 1; rk++)
                        for (rv = 0; rv <= 1; rv++)
                            for (cl = 0; cl <= 3; cl++) {
                            const int64_t R = tiles[ti][0], W = tiles[ti][1];
                            const int64_t cost[2] = {oscar__quant_side_cost(rk, cl & 1), oscar__quant_side_cost(rv, cl >> 1)};
                            const int64_t steps = (rows + R - 1) / R, need = (steps + W - 1) / W;
                            const int64_t smem = oscar__quant_smem_bytes(128, (int)R, (int)W, rk || rv) + 1024;
                            const int64_t per_sm = OSCAR__MIN(16 / W, (int64_t)(ctx->max_smem_optin + 1024) / smem);
                            const int64_t P = OSCAR__MAX(2, per_sm * 132 / layers);
                            int64_t best = -1, got, a;
                            t.rows_per_warp = (int32_t)R, t.warps_per_cta = (int32_t)W, t.ctas = 0;
                            oscar__quant_ctas(ctx, 128, &t, rows, layers, rk, rv, cl & 1, cl >> 1, c);
                            for (a = 1; a < P; a++) {
                                const int64_t x = OSCAR__MIN(a, need), y = OSCAR__MIN(P - a, need);
                                const int64_t tm = OSCAR__MAX((steps + W * x - 1) / (W * x) * cost[0], (steps + W * y - 1) / (W * y) * cost[1]);
                                if (best < 0 || tm < best) best = tm;
                            }
                            got = OSCAR__MAX((steps + W * c[0] - 1) / (W * c[0]) * cost[0], (steps + W * c[1] - 1) / (W * c[1]) * cost[1]);
                            cr_assert(got == best && c[0] + c[1] <= P, "%lld rows, %d layers, tile %lld x %lld, rotated %d/%d, clipped %d/%d: %d + %d CTAs take %lld, the best split %lld (%lld CTAs)",
                                      (long long)rows, layers, (long long)R, (long long)W, rk, rv, cl & 1, cl >> 1, c[0], c[1], (long long)got, (long long)best,
                                      (long long)P);
                            cases++;
                        }
        cr_assert(cases > 16000);
    }
    /* a forced count (the tests' t.ctas = 1) is taken for both sides */
    t.rows_per_warp = 32, t.warps_per_cta = 8, t.ctas = 1;
    oscar__quant_ctas(ctx, 128, &t, 1048576, 1, 1, 0, 1, 1, c);
    cr_assert(c[0] == 1 && c[1] == 1);
    ctx->num_sms = sms, ctx->max_smem_optin = smem;
    oscar_shutdown(ctx);
}

Test(tune, quantize_takes_the_table_and_falls_back_to_the_heuristic) {
    char path[600], text[4096];
    oscar_ctx *ctx, *bare;
    int32_t r, w;
    make_tmp_dir();
    snprintf(path, sizeof path, "%s/table.txt", tmp_dir);
    bare = compile_only_ctx(NULL);
    valid_table(bare, text, sizeof text);
    write_text(path, text);
    ctx = compile_only_ctx(path);
    /* the table's tile for its bucket (prefill: K+V rotated, 2^20+ rows): 16 x 4 over the heuristic's 32 x 8 */
    quant_tile(ctx, 131072LL * 8 * 2, 2, 32, 8, &r, &w);
    cr_assert(r == 16 && w == 4, "prefill bucket: %d x %d, the table says 16 x 4", r, w);
    quant_tile(ctx, 600000, 2, 32, 8, &r, &w); /* 2^20 bucket as well */
    cr_assert(r == 16 && w == 4);
    /* an entry without parameters (the heuristic won): the heuristic's */
    quant_tile(ctx, 4608, 1, 16, 4, &r, &w);
    cr_assert(r == 16 && w == 4, "demotion bucket: %d x %d", r, w);
    quant_tile(ctx, 4608, 1, 32, 8, &r, &w);
    cr_assert(r == 32 && w == 8, "demotion bucket keeps whatever the heuristic chose: %d x %d", r, w);
    /* buckets the table does not hold: another row count, another rotation: the heuristic */
    quant_tile(ctx, 300000, 2, 32, 8, &r, &w);
    cr_assert(r == 32 && w == 8, "2^19 rows: %d x %d", r, w);
    quant_tile(ctx, 131072LL * 8 * 2, 1, 32, 8, &r, &w);
    cr_assert(r == 32 && w == 8, "K-only rotation: %d x %d", r, w);
    /* no table: the heuristic */
    quant_tile(bare, 131072LL * 8 * 2, 2, 32, 8, &r, &w);
    cr_assert(r == 32 && w == 8);
    /* a tuning run's default (lookups off) sees the heuristic; its candidates force their tile */
    oscar__tune_suppress = 1;
    quant_tile(ctx, 131072LL * 8 * 2, 2, 32, 8, &r, &w);
    oscar__tune_suppress = 0;
    cr_assert(r == 32 && w == 8);
    oscar__tune_force_quant[0] = 32, oscar__tune_force_quant[1] = 4;
    quant_tile(ctx, 131072LL * 8 * 2, 2, 32, 8, &r, &w);
    oscar__tune_force_quant[0] = oscar__tune_force_quant[1] = 0;
    cr_assert(r == 32 && w == 4);
    /* a table tile that does not fit this device's shared memory is not applied (a made-up device with 48 KB) */
    {
        int32_t co = ctx->compile_only, smem = ctx->max_smem_optin;
        ctx->compile_only = 0, ctx->max_smem_optin = 48 * 1024;
        quant_tile(ctx, 131072LL * 8 * 2, 2, 32, 8, &r, &w);
        ctx->compile_only = co, ctx->max_smem_optin = smem;
        cr_assert(r == 32 && w == 8, "16 x 4 with R needs %lld bytes: %d x %d", (long long)oscar__quant_smem_bytes(128, 16, 4, 1),
                  r, w);
    }
    /* a cleared table: the heuristic; loaded again: the table */
    TU_OK(ctx, oscar_tune_table_clear(ctx));
    quant_tile(ctx, 131072LL * 8 * 2, 2, 32, 8, &r, &w);
    cr_assert(r == 32 && w == 8);
    TU_OK(ctx, oscar_tune_table_load(ctx, path));
    quant_tile(ctx, 131072LL * 8 * 2, 2, 32, 8, &r, &w);
    cr_assert(r == 16 && w == 4);
    oscar_shutdown(ctx);
    oscar_shutdown(bare);
    remove_tmp_dir();
}

Test(tune, tuning_needs_a_device) {
    oscar_ctx *ctx = compile_only_ctx(NULL);
    oscar_tune_decode_desc d = {0};
    oscar_tune_merge_desc m = {0};
    oscar_tune_shape s = {1, 8192};
    d.num_q_heads = 32, d.num_kv_heads = 8, d.head_dim = 128, d.num_shapes = 1, d.shapes = &s;
    cr_assert_eq(oscar_tune_decode(ctx, &d, NULL), OSCAR_STATUS_NEEDS_DEVICE);
    cr_assert(strstr(oscar_last_error(ctx), "compile-only") != NULL, "%s", oscar_last_error(ctx));
    m.head_dim = 128, m.num_shapes = 1, m.shapes = &s;
    cr_assert_eq(oscar_tune_merge(ctx, &m, NULL), OSCAR_STATUS_NEEDS_DEVICE);
    {
        oscar_tune_quantize_desc q = {0};
        q.num_kv_heads = 8, q.head_dim = 128, q.num_shapes = 1, q.shapes = &s;
        cr_assert_eq(oscar_tune_quantize(ctx, &q, NULL), OSCAR_STATUS_NEEDS_DEVICE);
        cr_assert(strstr(oscar_last_error(ctx), "oscar_tune_quantize") != NULL, "%s", oscar_last_error(ctx));
    }
    cr_assert_eq(oscar_tune_decode(NULL, &d, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    oscar_shutdown(ctx);
}
