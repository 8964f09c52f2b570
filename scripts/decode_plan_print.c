/* scripts/decode_plan_print.c: the decode plan heuristic's choices (the shipped table off) for shapes on stdin,
   "Hq Hkv D G batch int2_tokens window_tokens [page_size [f16|f32]]" -> "I:W:R:V" per line, with the device's real occupancy
   (PLAN_SM=90 in the environment: a compile-only sm_90 context instead, no GPU). Built against one build's
   oscar.h: cc -std=c11 -D_GNU_SOURCE -I<tree> -I/usr/local/cuda/include decode_plan_print.c -ldl -lm -lpthread.
   scripts/ab_decode_plans.sh compares two builds' choices with it (session 36). */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    char line[256];
    if (getenv("PLAN_SM")) desc.compile_only_sm = atoi(getenv("PLAN_SM"));
    if (oscar_setup(&desc, &ctx) != OSCAR_OK) { fprintf(stderr, "setup: %s\n", oscar_last_error(NULL)); return 1; }
    oscar__tune_suppress = 1;
    while (fgets(line, sizeof line, stdin)) {
        int hq, hkv, D, G, batch, wt, ps = 16, n; long long tok; char scale[8] = "f16";
        oscar_int2_pool_desc pool = {0}; oscar_window_pool_desc win = {0}; oscar_decode_plan_desc pd = {0}; oscar_decode_plan_info p;
        n = sscanf(line, "%d %d %d %d %d %lld %d %d %7s", &hq, &hkv, &D, &G, &batch, &tok, &wt, &ps, scale);
        if (n < 7) continue;
        pool.head_dim = D, pool.group_size = G, pool.num_kv_heads = hkv, pool.num_pages = 1 << 20, pool.page_size = ps;
        pool.scale_layout = scale[1] == '3' ? OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO : OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
        win.num_pages = 1 << 16, win.page_size = 16;
        pd.num_q_heads = hq, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = batch;
        pd.max_int2_tokens = tok, pd.max_window_tokens = wt;
        if (oscar_decode_plan(ctx, &pd, &p) != OSCAR_OK) { printf("ERR %s\n", oscar_last_error(ctx)); continue; }
        printf("%d:%d:%d:%d\n", p.int2_splits, p.window_splits, p.requests_per_cta, p.int2_warps);
        fflush(stdout);
    }
    oscar_shutdown(ctx);
    return 0;
}
