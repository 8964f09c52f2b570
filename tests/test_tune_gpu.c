/* tests/test_tune_gpu.c -- tuning runs on the device (skipped without one):
   a decode tuning run with a deliberately wrong candidate (test hook: its
   output is corrupted) and a deliberately slow one (test hook: it runs four
   times per timed run) rejects the first, never keeps the second, never keeps
   anything slower than the default, stores its result so the next plan takes
   it, and writes a table the device context loads back; a merge_states run
   finds every tile bit-identical to the default; quantize runs (a prefill
   with a test hook corrupting the 8-warp tiles, a gathered multi-layer
   demotion) reject exactly the corrupted tiles, and oscar_quantize_kv then
   takes the table's tile (a forced tile still wins) with codes and scales
   bit-identical to the default tile's. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

#include <unistd.h>

static char tmp_table[64];

static oscar_ctx *gpu_ctx_with_table(void) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_status st;
    int fd;
    /* a fresh table path: the user's own table must not steer the test */
    snprintf(tmp_table, sizeof tmp_table, "/tmp/oscar_tune_gpu_XXXXXX");
    fd = mkstemp(tmp_table);
    cr_assert(fd >= 0);
    close(fd);
    unlink(tmp_table);
    desc.tune_table_path = tmp_table;
    desc.logger.func = oscar_log_stderr;
    st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_STATUS_NO_DRIVER || st == OSCAR_STATUS_NO_DEVICE)
        cr_skip_test("no CUDA device: %s: %s", oscar_status_string(st), oscar_last_error(NULL));
    cr_assert(st == OSCAR_OK, "oscar_setup: %s", oscar_last_error(NULL));
    return ctx;
}

static void print_report(const char *what, const oscar_tune_report *r) {
    printf("%s %s\n  default %s: %.2f us (IQR %.2f)\n  kept    %s: %.2f us (IQR %.2f)\n  %d candidates, %d rejected%s%s; "
           "%.2f s\n",
           what, r->key, r->default_params, r->default_us, r->default_spread_us, r->params, r->tuned_us, r->tuned_spread_us,
           r->num_candidates, r->num_rejected, r->rejected[0] ? ": " : "", r->rejected, r->seconds);
}

/* The table file as written, for the log. */
static void print_table(const char *path) {
    FILE *f = fopen(path, "r");
    char line[1024];
    cr_assert(f != NULL, "cannot read %s", path);
    while (fgets(line, sizeof line, f)) printf("  %s", line);
    fclose(f);
}

Test(tune_gpu, decode_rejects_wrong_and_never_keeps_slower_candidates, .timeout = 900) {
    oscar_ctx *ctx = gpu_ctx_with_table();
    oscar_tune_decode_desc d = {0};
    oscar_tune_shape shape = {2, 4096 + 320}; /* default split heuristic: 16 INT2 splits for 2 x 8 KV heads */
    oscar_tune_report rep;
    oscar_tune_info info;
    oscar_int2_pool_desc pool = {0};
    oscar_window_pool_desc win = {0};
    oscar_decode_plan_desc pd = {0};
    oscar_decode_plan_info plan;
    int def_int2 = 0;
    char want[96];

    d.num_q_heads = 32, d.num_kv_heads = 8, d.head_dim = 128, d.num_shapes = 1, d.shapes = &shape;
    d.repeats = 10;
    oscar__tune_hooks.corrupt_int2_splits = 2;
    oscar__tune_hooks.slow_int2_splits = 4;
    TU_OK(ctx, oscar_tune_decode(ctx, &d, &rep));
    oscar__tune_hooks.corrupt_int2_splits = 0;
    oscar__tune_hooks.slow_int2_splits = 0;
    print_report("decode", &rep);
    sscanf(rep.default_params, "int2_splits=%d", &def_int2);
    cr_assert(def_int2 != 2 && def_int2 != 4, "the hooks need non-default candidates; the default is %s", rep.default_params);

    /* the corrupted candidates (int2_splits=2 with every window split count) are rejected and reported */
    cr_assert(rep.num_candidates >= 10, "only %d candidates", rep.num_candidates);
    cr_assert(rep.num_rejected >= 1, "the corrupted candidate was not rejected");
    cr_assert(strstr(rep.rejected, "int2_splits=2 ") != NULL, "rejected: %s", rep.rejected);
    cr_assert(strstr(rep.rejected, "o rel. err") != NULL, "rejected: %s", rep.rejected);
    cr_assert(strncmp(rep.params, "int2_splits=2 ", 14) != 0, "a rejected candidate was kept: %s", rep.params);
    /* every other candidate passes the output check (split counts change only the summation order) */
    /* 5 window split counts x 2 requests per CTA (1, 2: at most the batch of 2, 2 x 4 heads per KV head <= 16 rows)
       x 2 warps per INT2 CTA (4, and 16: 2 splits x 16 groups fit one wave of 132 16-warp CTAs) */
    cr_assert_eq(rep.num_rejected, 20, "expected the 20 int2_splits=2 candidates rejected, got %d: %s", rep.num_rejected,
                 rep.rejected);
    /* the slowed candidate is never kept, and nothing slower than the default is */
    cr_assert(strncmp(rep.params, "int2_splits=4 ", 14) != 0, "the slowed candidate was kept: %s", rep.params);
    cr_assert(rep.default_us > 0 && rep.tuned_us > 0);
    /* a CUDA 12+ driver has the graph calls and a decode step is capturable: timed as graph replays */
    cr_assert(rep.graph_timed, "the tuner fell back to timing direct launches");
    cr_assert(rep.tuned_us <= rep.default_us, "kept %s at %.2f us, slower than the default's %.2f us", rep.params,
              rep.tuned_us, rep.default_us);
    if (rep.improved)
        cr_assert(rep.default_us - rep.tuned_us > fmax(rep.default_spread_us, rep.tuned_spread_us),
                  "kept without beating the spread");
    else
        cr_assert_str_eq(rep.params, rep.default_params);

    /* the result is in the context's table: the next plan of this shape takes it */
    pool.head_dim = 128, pool.num_kv_heads = 8, pool.num_pages = 1024, pool.page_size = 16, pool.layout = OSCAR_KV_LAYOUT_HND;
    win.num_pages = 64, win.page_size = 16;
    pd.num_q_heads = 32, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = 2;
    pd.max_int2_tokens = 4096, pd.max_window_tokens = 320;
    TU_OK(ctx, oscar_decode_plan(ctx, &pd, &plan));
    snprintf(want, sizeof want, "int2_splits=%d window_splits=%d requests_per_cta=%d int2_warps=%d", plan.int2_splits,
             plan.window_splits, plan.requests_per_cta, plan.int2_warps);
    cr_assert_str_eq(want, rep.params, "the plan after tuning took %s", want);

    /* the table file: written atomically, loaded back on this device */
    TU_OK(ctx, oscar_tune_table_save(ctx, NULL));
    TU_OK(ctx, oscar_tune_table_clear(ctx));
    TU_OK(ctx, oscar_tune_table_load(ctx, tmp_table));
    TU_OK(ctx, oscar_query_tune_info(ctx, &info));
    cr_assert_eq(info.num_entries, 1);
    cr_assert(info.provenance.num_sms > 0 && info.provenance.tuning_seconds > 0 && info.provenance.date[0]);
    printf("table (%s, %d SMs, sm_%d, %.1f s):\n", info.provenance.gpu_name, info.provenance.num_sms, info.provenance.sm,
           info.provenance.tuning_seconds);
    print_table(tmp_table);
    unlink(tmp_table);
    oscar_shutdown(ctx);
}

Test(tune_gpu, merge_tiles_are_bit_identical, .timeout = 600) {
    oscar_ctx *ctx = gpu_ctx_with_table();
    oscar_tune_merge_desc m = {0};
    oscar_tune_shape shapes[2] = {{0, 256}, {0, 32 * 1024}};
    oscar_tune_report rep[2];
    int i;
    m.head_dim = 128, m.num_states = 2, m.num_shapes = 2, m.shapes = shapes, m.repeats = 10;
    TU_OK(ctx, oscar_tune_merge(ctx, &m, rep));
    for (i = 0; i < 2; i++) {
        print_report("merge_states", &rep[i]);
        cr_assert_eq(rep[i].num_candidates, 3);
        cr_assert_eq(rep[i].num_rejected, 0, "a tile changed the output: %s", rep[i].rejected);
        cr_assert(rep[i].tuned_us <= rep[i].default_us);
    }
    oscar_shutdown(ctx);
}

/* ---- quantize ---------------------------------------------------------------- */
typedef struct qnt_problem {
    oscar_int2_pool_desc pool;
    oscar_quantize_desc d;
    size_t code_bytes, scale_bytes;
    void *src_k, *src_v, *rot, *slots;
} qnt_problem;

/* T tokens x 8 KV heads x D 128 of random bf16 rows, K and V rotated by a
   normalised Hadamard matrix, clip .96/.92, dense, into a pool of 16-token pages. */
static void qnt_problem_make(oscar_ctx *ctx, qnt_problem *p, int64_t T) {
    const int D = 128, H = 8;
    size_t n = (size_t)T * H * D, i;
    uint16_t *h = tu_xmalloc(n * 2);
    float *R = tu_xmalloc(sizeof(float) * D * D);
    int32_t *sl = tu_xmalloc(sizeof(int32_t) * (size_t)T);
    tu_rng r = tu_seed();
    int x, y;
    memset(p, 0, sizeof *p);
    p->pool.head_dim = D, p->pool.num_kv_heads = H, p->pool.page_size = 16, p->pool.num_pages = (int32_t)((T + 15) / 16);
    TU_OK(ctx, oscar_int2_pool_bytes(ctx, &p->pool, &p->code_bytes, &p->scale_bytes));
    for (i = 0; i < n; i++) h[i] = oscar__f32_to_bf16((float)(tu_normal(&r) * ((i % 128) % 17 == 3 ? 20 : 1)));
    p->src_k = tu_dev_upload(h, n * 2);
    for (i = 0; i < n; i++) h[i] = oscar__f32_to_bf16((float)tu_normal(&r));
    p->src_v = tu_dev_upload(h, n * 2);
    for (x = 0; x < D; x++)
        for (y = 0; y < D; y++) R[x * D + y] = (__builtin_popcount((unsigned)(x & y)) & 1 ? -1.0f : 1.0f) / sqrtf((float)D);
    p->rot = tu_dev_upload(R, sizeof(float) * D * D);
    for (i = 0; i < (size_t)T; i++) sl[i] = (int32_t)i;
    p->slots = tu_dev_upload(sl, sizeof(int32_t) * (size_t)T);
    p->pool.k_codes = tu_dev_alloc(p->code_bytes), p->pool.v_codes = tu_dev_alloc(p->code_bytes);
    p->pool.k_scales = tu_dev_alloc(p->scale_bytes), p->pool.v_scales = tu_dev_alloc(p->scale_bytes);
    p->d.pool = &p->pool, p->d.src_k = p->src_k, p->d.src_v = p->src_v;
    p->d.k_rotation = p->rot, p->d.v_rotation = p->rot;
    p->d.num_tokens = T, p->d.dst_slots = p->slots;
    p->d.k_clip_ratio = 0.96f, p->d.v_clip_ratio = 0.92f;
    free(h), free(R), free(sl);
}
static void qnt_problem_free(qnt_problem *p) {
    cudaFree(p->src_k), cudaFree(p->src_v), cudaFree(p->rot), cudaFree(p->slots);
    cudaFree(p->pool.k_codes), cudaFree(p->pool.v_codes), cudaFree(p->pool.k_scales), cudaFree(p->pool.v_scales);
}
/* Runs the quantize (force NULL: the table or the heuristic decides) on
   poisoned pools; returns K codes, V codes, K scales, V scales in one host
   buffer and the tile the launch took. */
static uint8_t *qnt_run(oscar_ctx *ctx, qnt_problem *p, const oscar__quant_tile *force, int32_t tile[2]) {
    uint8_t *h = tu_xmalloc(2 * (p->code_bytes + p->scale_bytes));
    TU_CUDA(cudaMemset(p->pool.k_codes, 0xFF, p->code_bytes));
    TU_CUDA(cudaMemset(p->pool.v_codes, 0xFF, p->code_bytes));
    TU_CUDA(cudaMemset(p->pool.k_scales, 0xFF, p->scale_bytes));
    TU_CUDA(cudaMemset(p->pool.v_scales, 0xFF, p->scale_bytes));
    oscar__tune_last_quant[0] = oscar__tune_last_quant[1] = 0;
    TU_OK(ctx, oscar__quantize_kv_tiled(ctx, &p->d, NULL, force));
    TU_CUDA(cudaDeviceSynchronize());
    tile[0] = oscar__tune_last_quant[0], tile[1] = oscar__tune_last_quant[1];
    tu_dev_download(h, p->pool.k_codes, p->code_bytes);
    tu_dev_download(h + p->code_bytes, p->pool.v_codes, p->code_bytes);
    tu_dev_download(h + 2 * p->code_bytes, p->pool.k_scales, p->scale_bytes);
    tu_dev_download(h + 2 * p->code_bytes + p->scale_bytes, p->pool.v_scales, p->scale_bytes);
    return h;
}

Test(tune_gpu, quantize_rejects_wrong_tiles_and_the_table_tile_is_applied, .timeout = 900) {
    oscar_ctx *ctx = gpu_ctx_with_table();
    oscar_tune_quantize_desc pq = {0}, dq = {0};
    /* 2048 tokens x 8 heads x 2 = 32768 rows: a 4-warp default on an H200 (32 x 4 since session 10's middle tier) */
    oscar_tune_shape prefill = {1, 2048}, demote[2] = {{36, 8 * 4}, {36, 8 * 64}};
    oscar_tune_report rep, drep[2];
    oscar_tune_info info;
    oscar__tune_entry e;
    oscar__quant_tile def, forced, heur;
    int32_t key[OSCAR__TUNE_MAX_KEYS], tile[2], want[2];
    qnt_problem p;
    uint8_t *ref, *out;
    size_t bytes;
    int i;

    /* a prefill with every 8-warp tile corrupted by the test hook */
    pq.num_kv_heads = 8, pq.head_dim = 128, pq.k_clip_ratio = 0.96f, pq.v_clip_ratio = 0.92f;
    pq.num_shapes = 1, pq.shapes = &prefill, pq.repeats = 10;
    oscar__tune_hooks.corrupt_quant_warps = 8;
    TU_OK(ctx, oscar_tune_quantize(ctx, &pq, &rep));
    oscar__tune_hooks.corrupt_quant_warps = 0;
    print_report("quantize", &rep);
    cr_assert(strstr(rep.key, "rotated=2 clipped=2 rows=32768") != NULL, "%s", rep.key);
    cr_assert_eq(sscanf(rep.default_params, "rows_per_warp=%d warps_per_cta=%d", &def.rows_per_warp, &def.warps_per_cta), 2);
    def.ctas = 0;
    cr_assert(def.warps_per_cta != 8, "the hook needs a default of 4 warps; it is %s", rep.default_params);
    cr_assert_eq(rep.num_candidates, 4, "head dim 128 has 4 tiles, got %d", rep.num_candidates);
    cr_assert_eq(rep.num_rejected, 2, "expected the 2 eight-warp tiles rejected: %s", rep.rejected);
    cr_assert(strstr(rep.rejected, "warps_per_cta=8 (codes differ") != NULL, "rejected: %s", rep.rejected);
    cr_assert(strstr(rep.params, "warps_per_cta=8") == NULL, "a rejected tile was kept: %s", rep.params);
    cr_assert(rep.default_us > 0 && rep.tuned_us > 0 && rep.tuned_us <= rep.default_us);
    if (!rep.improved) cr_assert_str_eq(rep.params, rep.default_params);

    /* demotion: 36 layers in one launch, rows gathered from a paged cache; every tile bit-identical */
    dq.num_kv_heads = 8, dq.head_dim = 128, dq.rotation = 1, dq.k_clip_ratio = 0.96f, dq.v_clip_ratio = 0.92f;
    dq.src_page_size = 16, dq.page_size = 1, dq.num_shapes = 2, dq.shapes = demote, dq.repeats = 10;
    TU_OK(ctx, oscar_tune_quantize(ctx, &dq, drep));
    for (i = 0; i < 2; i++) {
        print_report("quantize", &drep[i]);
        cr_assert(strstr(drep[i].key, "rotated=1 clipped=2") != NULL, "%s", drep[i].key);
        cr_assert_eq(drep[i].num_candidates, 4);
        cr_assert_eq(drep[i].num_rejected, 0, "a tile changed the codes: %s", drep[i].rejected);
        cr_assert(drep[i].tuned_us <= drep[i].default_us);
    }

    /* a quantize call of the prefill's bucket (1500 tokens: 24000 rows, bucket 32768) takes the table's tile */
    qnt_problem_make(ctx, &p, 1500);
    bytes = 2 * (p.code_bytes + p.scale_bytes);
    oscar__tune_quant_key(key, 128, 128, OSCAR_DTYPE_BF16, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, OSCAR_QUANT_MODE_UNIFORM, 2, 2,
                          1500 * 8 * 2);
    cr_assert(oscar__tune_lookup(ctx, OSCAR_TUNE_FAMILY_QUANTIZE, key, &e), "the tuning run stored no entry for its bucket");
    /* a parameter the entry leaves unset is the heuristic's for this call's rows, which may differ from the
       bucket's tuned shape (1500 tokens: 16 x 4 on an H200, 2048: 32 x 4) */
    heur = oscar__quant_choose(ctx, 128, 1500 * 8, 2, 1);
    want[0] = (e.params_set & 1u) ? e.params[OSCAR__TP_QNT_ROWS_PER_WARP] : heur.rows_per_warp;
    want[1] = (e.params_set & 2u) ? e.params[OSCAR__TP_QNT_WARPS_PER_CTA] : heur.warps_per_cta;
    ref = qnt_run(ctx, &p, &def, tile);
    cr_assert(tile[0] == def.rows_per_warp && tile[1] == def.warps_per_cta);
    out = qnt_run(ctx, &p, NULL, tile);
    cr_assert(tile[0] == want[0] && tile[1] == want[1], "took %d x %d; the table says %d x %d", tile[0], tile[1], want[0],
              want[1]);
    cr_assert(memcmp(out, ref, bytes) == 0, "the tuned tile's codes differ from the default's");
    free(out);
    /* a table entry with another tile: taken, same bits */
    e.params[OSCAR__TP_QNT_ROWS_PER_WARP] = def.rows_per_warp == 32 ? 16 : 32;
    e.params[OSCAR__TP_QNT_WARPS_PER_CTA] = 8;
    e.params_set = 3u;
    TU_OK(ctx, oscar__tune_store(ctx, "test", &e, 0.0));
    out = qnt_run(ctx, &p, NULL, tile);
    cr_assert(tile[0] == e.params[0] && tile[1] == 8, "took %d x %d; the table says %d x 8", tile[0], tile[1], e.params[0]);
    cr_assert(memcmp(out, ref, bytes) == 0, "the table tile's codes differ from the default's");
    free(out);
    /* a forced tile wins over the table */
    forced.rows_per_warp = e.params[0] == 32 ? 16 : 32, forced.warps_per_cta = 4, forced.ctas = 0;
    out = qnt_run(ctx, &p, &forced, tile);
    cr_assert(tile[0] == forced.rows_per_warp && tile[1] == 4, "forced %d x 4, took %d x %d", forced.rows_per_warp, tile[0],
              tile[1]);
    cr_assert(memcmp(out, ref, bytes) == 0);
    free(out);
    /* through the public call, too */
    oscar__tune_last_quant[0] = 0;
    TU_OK(ctx, oscar_quantize_kv(ctx, &p.d, NULL));
    cr_assert_eq(oscar__tune_last_quant[0], e.params[0]);
    free(ref);
    qnt_problem_free(&p);

    /* the table file holds the three quantize entries and loads back */
    TU_OK(ctx, oscar_tune_table_save(ctx, NULL));
    TU_OK(ctx, oscar_tune_table_clear(ctx));
    TU_OK(ctx, oscar_tune_table_load(ctx, tmp_table));
    TU_OK(ctx, oscar_query_tune_info(ctx, &info));
    cr_assert_eq(info.num_entries, 3);
    print_table(tmp_table);
    unlink(tmp_table);
    oscar_shutdown(ctx);
}
