/* tests/test_tune_gpu.c -- tuning runs on the device (skipped without one):
   a decode tuning run with a deliberately wrong candidate (test hook: its
   output is corrupted) and a deliberately slow one (test hook: it runs four
   times per timed run) rejects the first, never keeps the second, never keeps
   anything slower than the default, stores its result so the next plan takes
   it, and writes a table the device context loads back; a merge_states run
   finds every tile bit-identical to the default. */
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
    char want[64];

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
    cr_assert_eq(rep.num_rejected, 5, "expected the 5 int2_splits=2 candidates rejected, got %d: %s", rep.num_rejected,
                 rep.rejected);
    /* the slowed candidate is never kept, and nothing slower than the default is */
    cr_assert(strncmp(rep.params, "int2_splits=4 ", 14) != 0, "the slowed candidate was kept: %s", rep.params);
    cr_assert(rep.default_us > 0 && rep.tuned_us > 0);
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
    snprintf(want, sizeof want, "int2_splits=%d window_splits=%d", plan.int2_splits, plan.window_splits);
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
    {
        FILE *f = fopen(tmp_table, "r");
        char line[1024];
        cr_assert(f != NULL);
        while (fgets(line, sizeof line, f)) printf("  %s", line);
        fclose(f);
    }
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
